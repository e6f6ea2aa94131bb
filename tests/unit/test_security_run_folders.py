"""Run folders, catalogs and stores another local user could write (the third security
review's high finding): every start path refuses them before anything is read from or
written to them. Each test fails on the code before the fix: `serve front --foreground`
and the SageMaker entrypoint never checked the folder they were given."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest
from helpers import package_for

from neuronserve import catalog
from neuronserve.private_folders import NotPrivate, private_folder
from neuronserve.processes import ServeError, private_dir
from neuronserve.worker import make_shared_memory_private

NOBODY = 65534
ROOT_ONLY = pytest.mark.skipif(os.getuid() != 0, reason="chown to another uid needs root")


def _open_folder(path: Path) -> Path:
    path.mkdir(parents=True)
    path.chmod(0o777)
    return path


def test_a_folder_others_can_write_is_refused(tmp_path):
    shared = _open_folder(tmp_path / "run")
    with pytest.raises(ServeError, match=r"run directory .*/run is writable by other users"):
        private_dir(shared)


@ROOT_ONLY
def test_a_folder_another_user_owns_is_refused(tmp_path):
    theirs = tmp_path / "run"
    theirs.mkdir(mode=0o700)
    os.chown(theirs, NOBODY, NOBODY)
    with pytest.raises(ServeError, match=f"is owned by uid {NOBODY}"):
        private_dir(theirs)


def test_a_folder_made_inside_one_others_can_write_is_refused(tmp_path):
    """Whoever can write the folder above can rename ours away and put theirs in place."""
    shared = _open_folder(tmp_path / "shared")
    with pytest.raises(ServeError, match=r"the folder .*/shared above it is writable"):
        private_dir(shared / "deep" / "run")
    assert not (shared / "deep").exists()


@ROOT_ONLY
def test_a_folder_above_owned_by_another_user_is_refused(tmp_path):
    theirs = tmp_path / "theirs"
    theirs.mkdir(mode=0o755)
    os.chown(theirs, NOBODY, NOBODY)
    with pytest.raises(NotPrivate, match=f"{theirs} above it is owned by uid {NOBODY}"):
        private_folder(theirs / "run")


def test_a_sticky_shared_folder_above_is_allowed_and_made_folders_are_private(tmp_path):
    tmp_like = tmp_path / "tmp"
    tmp_like.mkdir()
    tmp_like.chmod(0o1777)
    made = private_dir(tmp_like / "a" / "b")
    for folder in (tmp_like / "a", made):
        assert stat.S_IMODE(folder.stat().st_mode) == 0o700


def test_an_existing_folder_open_to_others_is_refused_and_its_mode_kept(tmp_path):
    """neuronserve changes the mode only of folders it makes: a shared 0755 folder (or
    /etc, given by a typo) keeps its mode, and the start says why it refused."""
    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o755)
    with pytest.raises(ServeError, match=r"shared is open to other users \(mode 755"):
        private_dir(shared)
    assert stat.S_IMODE(shared.stat().st_mode) == 0o755
    # an owned level above the run folder (the lease folder's two) is held to it too
    with pytest.raises(NotPrivate, match="open to other users"):
        private_folder(shared / "leases", own=2)
    assert stat.S_IMODE(shared.stat().st_mode) == 0o755 and not (shared / "leases").exists()
    mine = tmp_path / "mine"
    mine.mkdir(mode=0o700)
    assert private_dir(mine) == mine


def test_the_catalog_is_written_and_followed_only_from_a_private_folder(tmp_path):
    shared = _open_folder(tmp_path / "catalog")
    with pytest.raises(NotPrivate, match="writable by other users"):
        catalog.write_wanted(shared, {})
    (shared / catalog.WANTED).write_text('{"m": {"artifact": "/elsewhere"}}')
    loaded = []
    follower = catalog.Follower(shared, 0, lambda *a: loaded.append(a), dict, lambda _: None)
    with pytest.raises(NotPrivate):
        follower.start()
    assert loaded == []


def test_where_it_cannot_each_stub_makes_its_region_private(tmp_path):
    """What a Triton instance calls as it starts (worker.make_shared_memory_private): the
    shared memory it maps, made readable by its user only."""
    import mmap

    region = Path("/dev/shm") / f"triton_python_backend_shm_region_test-{os.getpid()}"
    region.write_bytes(b"a request's text".ljust(4096, b"\0"))
    region.chmod(0o644)
    try:
        with open(region, "r+b") as f, mmap.mmap(f.fileno(), 4096) as mapped:
            assert mapped[:1] == b"a"
            assert str(region) in make_shared_memory_private()
        assert stat.S_IMODE(region.stat().st_mode) == 0o600
    finally:
        region.unlink()


def test_a_store_is_unpacked_into_a_folder_of_this_users_own(tmp_path, tiny_artifact):
    """Reading a TorchServe store back (`serve front model_store`) unpacks its archive
    into the engine's work folder: made 0700 (it was made 0755 with its parents, which
    the deployment then refused), and one open to others is refused, never chmodded."""
    from neuronserve.serve.model_source import find_models
    from neuronserve.spec import load_spec

    store = tmp_path / "model_store"
    package_for("torchserve", load_spec(None, {"artifact": tiny_artifact, "model_store": store}))
    run = tmp_path / "front"
    run.mkdir(mode=0o700)
    found = find_models(store, run / "engine")
    assert [f.name for f in found] == ["tiny"]
    assert stat.S_IMODE((run / "engine").stat().st_mode) == 0o700
    open_one = tmp_path / "open"
    open_one.mkdir(mode=0o700)
    (open_one / "engine").mkdir()
    (open_one / "engine").chmod(0o755)
    with pytest.raises(ServeError, match="open to other users"):
        find_models(store, open_one / "engine")
    assert stat.S_IMODE((open_one / "engine").stat().st_mode) == 0o755
