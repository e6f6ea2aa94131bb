"""What a hostile name, local user or stale pid file could do, closed (the security
issue): each test fails on the code before it."""

from __future__ import annotations

import json
import os
import shutil
import stat
from pathlib import Path

import pytest
from helpers import package_for

from neuronserve import cores
from neuronserve.artifact import ArtifactError, read_manifest
from neuronserve.spec import SpecError, load_spec

HOSTILE = ["../..", "../victim", "/srv", "a/b", ".hidden", "", "x" * 200, "a\nb"]


@pytest.mark.parametrize("name", HOSTILE)
def test_a_name_that_is_not_a_plain_file_name_is_refused_by_the_spec(name):
    with pytest.raises(SpecError, match="not a plain name"):
        load_spec(None, {"name": name})


def test_plain_names_pass():
    for name in ("minilm", "all-MiniLM-L6-v2", "bert_base.v2", "7b"):
        assert load_spec(None, {"name": name}).name == name


def _with_manifest_name(artifact: Path, dst: Path, name: str) -> Path:
    shutil.copytree(artifact, dst)
    path = dst / "manifest.json"
    data = json.loads(path.read_text())
    data["name"] = name
    path.write_text(json.dumps(data))
    return dst


@pytest.mark.parametrize("server", ["torchserve", "triton"])
def test_packaging_never_removes_outside_the_store(tmp_path, tiny_artifact, server):
    """A manifest naming `../victim` used to make packaging rmtree <store>/../victim."""
    victim = tmp_path / "victim"
    victim.mkdir()
    (victim / "precious.txt").write_text("keep me")
    art = _with_manifest_name(tiny_artifact, tmp_path / "art", "../victim")
    with pytest.raises(ArtifactError, match="not a plain name"):
        read_manifest(art)
    store = tmp_path / "store"
    spec = load_spec(
        None,
        {
            "model_store": store,
            "triton_repository": store,
            "workers": 1,
            "artifact": art,
        },
    )
    with pytest.raises(ArtifactError, match="not a plain name"):
        package_for(server, spec)
    assert (victim / "precious.txt").read_text() == "keep me"


def test_an_artifact_folder_with_an_odd_name_needs_a_name(tmp_path):
    odd = tmp_path / "my model"
    with pytest.raises(SpecError, match=r"artifact folder's name.*or set `name`"):
        load_spec(None, {"artifact": odd}).model_name()


def test_packaging_replaces_in_place_and_leaves_nothing_behind(tmp_path, tiny_artifact):
    store, repo = tmp_path / "store", tmp_path / "repo"
    base = {
        "model_store": store,
        "triton_repository": repo,
        "workers": 1,
        "name": "m",
        "artifact": tiny_artifact,
    }
    package_for("torchserve", load_spec(None, base))
    out = package_for("torchserve", load_spec(None, {**base, "archive_format": "no-archive"}))
    # the .mar of the first packaging is gone: the same model would load twice
    assert out == store.resolve() / "m" and out.is_dir()
    assert sorted(p.name for p in store.iterdir()) == sorted(
        ["m", "config.properties", "metrics.yaml"]
    ), list(store.iterdir())
    package_for("triton", load_spec(None, base))
    model = package_for("triton", load_spec(None, base))
    assert [p.name for p in repo.iterdir()] == ["m"] and (model / "config.pbtxt").is_file()


def _groups():
    return cores.plan_groups([0, 1], 1, contiguous=False)


def test_a_lease_directory_of_another_user_is_refused(tmp_path, monkeypatch):
    """Another local user who made the folder first could read and hold every lease."""
    if os.getuid() != 0:
        pytest.skip("chown to another uid needs root")
    monkeypatch.delenv(cores.LEASE_DIR_ENV, raising=False)
    monkeypatch.delenv("XDG_RUNTIME_DIR", raising=False)
    monkeypatch.setattr(cores.tempfile, "gettempdir", lambda: str(tmp_path))
    planted = tmp_path / f"neuronserve-{os.getuid()}"
    planted.mkdir()
    os.chown(planted, 4242, 4242)
    with pytest.raises(cores.LeaseDirError, match=f"{planted} is owned by uid 4242"):
        cores.acquire(_groups(), "cpu")


def test_a_planted_symlink_is_refused_for_the_folder_and_for_a_lock_file(tmp_path, monkeypatch):
    monkeypatch.delenv(cores.LEASE_DIR_ENV, raising=False)
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(tmp_path / "run"))
    (tmp_path / "run").mkdir(mode=0o700)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (tmp_path / "run" / "neuronserve").symlink_to(elsewhere, target_is_directory=True)
    with pytest.raises(cores.LeaseDirError, match="is a symbolic link"):
        cores.acquire(_groups(), "cpu")
    # a lock file planted as a link to a file the worker (root, in a container) may write
    (tmp_path / "run" / "neuronserve").unlink()
    leases = cores.default_lease_dir()
    assert leases == tmp_path / "run" / "neuronserve" / "leases"
    cores.secure_dir(leases)
    target = tmp_path / "root-owned.conf"
    target.write_text("do not overwrite")
    (leases / "cpu-core-0.lock").symlink_to(target)
    with pytest.raises(cores.LeaseDirError, match="symbolic link there is refused"):
        cores.acquire(_groups()[:1], "cpu")
    assert target.read_text() == "do not overwrite"


def test_a_folder_others_can_write_is_refused_and_lock_files_are_private(tmp_path):
    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o777)
    with pytest.raises(cores.LeaseDirError, match="writable by other users"):
        cores.acquire(_groups(), "cpu", directory=shared)
    private = tmp_path / "private"
    with cores.acquire(_groups(), "cpu", directory=private) as lease:
        assert stat.S_IMODE(os.stat(private).st_mode) == 0o700
        lock = private / f"cpu-core-{lease.cores[0]}.lock"
        assert stat.S_IMODE(os.stat(lock).st_mode) == 0o600


def test_torchserve_loads_from_its_store_only_and_holds_the_body_limit(tmp_path):
    from neuronserve.packaging.model import PackagingError
    from neuronserve.packaging.torchserve import (
        read_properties,
        store_properties,
        write_properties,
    )

    store = tmp_path / "my-store.v1"
    spec = load_spec(None, {"max_body_bytes": 123456})
    own = spec.torchserve
    properties = store_properties(own, spec.worker, spec.limits, store)
    write_properties(tmp_path / "config.properties", properties)
    props = read_properties(tmp_path / "config.properties")
    assert props["max_request_size"] == "123456"
    import re

    allowed = re.compile(props["allowed_urls"])
    assert allowed.fullmatch(f"file://{store}/m.mar")
    for url in ("https://evil.example/m.mar", f"file://{tmp_path}/other/m.mar", "file:///etc"):
        assert not allowed.fullmatch(url), url
    assert props["workflow_store"] == str(store)
    # what Java reads back: a doubled backslash is one (the regex keeps its escapes)
    raw = (tmp_path / "config.properties").read_text()
    assert "my\\\\-store\\\\.v1" in raw
    with pytest.raises(PackagingError, match="line break"):
        write_properties(tmp_path / "x.properties", {"inference_address": "a\nload_models=x"})


def _edit_manifest(art: Path, **changes) -> None:
    path = art / "manifest.json"
    data = json.loads(path.read_text())
    for k, v in changes.items():
        data[k] = v(data[k]) if callable(v) else v
    path.write_text(json.dumps(data))


@pytest.mark.parametrize("bad", ["/etc/passwd", "../outside.pt", "a/../../b", "a\\b"])
def test_manifest_paths_stay_inside_the_artifact(tmp_path, tiny_artifact, bad):
    art = tmp_path / "art"
    shutil.copytree(tiny_artifact, art)
    _edit_manifest(art, files=lambda f: {**f, bad: "0" * 64})
    with pytest.raises(ArtifactError, match="not a path inside the artifact"):
        read_manifest(art)
    shutil.rmtree(art)
    shutil.copytree(tiny_artifact, art)
    _edit_manifest(art, modules={"dynamic": bad})
    with pytest.raises(ArtifactError, match="not a path inside the artifact"):
        read_manifest(art)


def test_symlinks_and_unlisted_loader_files_are_refused(tmp_path, tiny_artifact):
    art = tmp_path / "art"
    shutil.copytree(tiny_artifact, art)
    # the same bytes through a link: the check used to follow it
    real = tmp_path / "tokenizer.json"
    shutil.move(art / "tokenizer.json", real)
    (art / "tokenizer.json").symlink_to(real)
    with pytest.raises(ArtifactError, match=r"tokenizer\.json is a symbolic link"):
        read_manifest(art)
    (art / "tokenizer.json").unlink()
    shutil.move(real, art / "tokenizer.json")
    # a linked folder was skipped by the walk, and packaging copied what it points to
    (tmp_path / "elsewhere").mkdir()
    (art / "extra").symlink_to(tmp_path / "elsewhere", target_is_directory=True)
    with pytest.raises(ArtifactError, match="extra is a symbolic link"):
        read_manifest(art)
    (art / "extra").unlink()
    # a file the loaders open must be hashed
    _edit_manifest(art, tokenizer=lambda t: {**t, "file": "tok2.json"})
    with pytest.raises(ArtifactError, match=r"tok2\.json is opened by the loaders but not listed"):
        read_manifest(art)


def test_the_runner_loads_the_bytes_it_verified(tiny_artifact, monkeypatch):
    from neuronserve.artifact import read_verified
    from neuronserve.compile.cpu import CpuTarget
    from neuronserve.runtime import Runner

    seen = []
    original = CpuTarget.load

    def load(self, path, core=None, data=None):
        seen.append((path.name, data))
        return original(self, path, core, data)

    monkeypatch.setattr(CpuTarget, "load", load)
    runner = Runner(tiny_artifact, warmup=False)
    manifest = runner.manifest
    assert seen and all(data == read_verified(tiny_artifact, manifest, name) for name, data in seen)
    module = manifest.modules["dynamic"]
    with pytest.raises(ArtifactError, match="does not match its sha256"):
        read_verified(tiny_artifact, manifest.model_copy(update={"files": {}}), module)


def test_signed_artifacts_load_only_with_the_right_key(tmp_path, tiny_artifact, monkeypatch):
    from helpers import cli

    art = tmp_path / "art"
    shutil.copytree(tiny_artifact, art)
    cli("sign", "--new-key", tmp_path / "keys")
    cli("sign", "--new-key", tmp_path / "other")
    assert stat.S_IMODE((tmp_path / "keys" / "neuronserve.key").stat().st_mode) == 0o600
    monkeypatch.setenv("NEURONSERVE_PUBLIC_KEY", str(tmp_path / "keys" / "neuronserve.pub"))
    with pytest.raises(ArtifactError, match="is not signed"):
        read_manifest(art)
    cli("sign", art, "--key", tmp_path / "other" / "neuronserve.key")
    with pytest.raises(ArtifactError, match="not a signature of this manifest"):
        read_manifest(art)
    r = cli("sign", art, "--key", tmp_path / "keys" / "neuronserve.key")
    assert "manifest.sig" in r.stdout
    assert read_manifest(art).name == "tiny"  # signed by the configured key: loads
    # a changed manifest (say, a hash swapped for a module of one's own) breaks it
    _edit_manifest(art, tolerance=0.5)
    with pytest.raises(ArtifactError, match="not a signature of this manifest"):
        read_manifest(art)
    monkeypatch.delenv("NEURONSERVE_PUBLIC_KEY")
    assert read_manifest(art).tolerance == 0.5  # no key configured: not required


def test_pickle_only_weights_are_refused_unless_allowed(tmp_path, minilm_dir):
    from helpers import cli

    model = tmp_path / "model"
    shutil.copytree(minilm_dir, model)
    for f in model.glob("*.safetensors"):
        f.unlink()
    (model / "pytorch_model.bin").write_bytes(b"not even a pickle")
    r = cli("compile", "--model", model, "--out", tmp_path / "art", check=False)
    assert r.returncode != 0 and "pytorch_model.bin (Python pickle" in r.stderr
    assert "--allow-pickle-weights" in r.stderr
    assert not (tmp_path / "art").exists()
    # any *.safetensors is not the weights transformers would load in its place
    (model / "README.safetensors").write_bytes(b"junk")
    r = cli("compile", "--model", model, "--out", tmp_path / "art", check=False)
    assert r.returncode != 0 and "pytorch_model.bin (Python pickle" in r.stderr


def test_compiled_weights_are_not_world_readable(tiny_artifact):
    for p in [tiny_artifact, *tiny_artifact.rglob("*")]:
        assert stat.S_IMODE(p.stat().st_mode) & 0o007 == 0, p


def test_logs_are_private_and_never_written_through_a_link(tmp_path):
    from neuronserve.processes import private_file

    target = tmp_path / "victim.txt"
    target.write_text("keep")
    log = tmp_path / "server.log"
    log.symlink_to(target)
    with private_file(log) as f:
        f.write("log line\n")
    assert target.read_text() == "keep" and not log.is_symlink()
    assert stat.S_IMODE(log.stat().st_mode) == 0o600


def test_a_mar_too_big_for_the_disk_is_not_extracted(tmp_path, monkeypatch):
    import zipfile

    from neuronserve.serve import model_source

    src = tmp_path / "model"
    src.mkdir()
    with zipfile.ZipFile(src / "m.mar", "w", zipfile.ZIP_DEFLATED) as z:
        # 64 MiB of zeros compress to a few KB: what a small upload can expand to
        z.writestr("models/m/model.pt", b"\0" * (64 << 20))
        z.writestr("MAR-INF/model-config.yaml", "{}")
    free = 16 << 20
    monkeypatch.setattr(
        shutil, "disk_usage", lambda _: shutil._ntuple_diskusage(1 << 40, 0, free + (1 << 30))
    )
    too_big = r"unpacks to more than 16 MiB, the disk's free space"
    with pytest.raises(model_source.ModelSourceError, match=too_big):
        model_source.find_models(src, tmp_path / "work")
    assert not (tmp_path / "work" / "from-mar").exists()


def test_an_image_too_large_is_refused_from_its_header(tmp_path):
    """An 85 KB PNG of 9400x9400 pixels decodes to 1.2 GB: refused with 413 before it is
    decoded; a small one opens."""
    import io

    from PIL import Image

    from neuronserve.images import MAX_IMAGE_PIXELS, open_image
    from neuronserve.tasks import RequestError

    side = int(MAX_IMAGE_PIXELS**0.5) + 100
    bomb = io.BytesIO()
    Image.new("1", (side, side)).save(bomb, "PNG")
    assert len(bomb.getvalue()) < 200_000
    with pytest.raises(RequestError) as refused:
        open_image(bomb.getvalue(), 3)
    assert refused.value.status == 413 and f"{side}x{side}" in refused.value.message
    small = io.BytesIO()
    Image.new("RGB", (40, 30), "red").save(small, "PNG")
    assert open_image(small.getvalue()).size == (40, 30)


@pytest.mark.parametrize("plant", ["other-user", "writable", "symlink"])
def test_the_front_refuses_a_run_directory_that_is_not_its_users_own(
    tmp_path, tiny_artifact, plant
):
    """A run directory another local user made or can write (or a symlink to one) could
    hand the front its settings (listen on 0.0.0.0 without keys): refused before anything
    is read or written there."""
    from helpers import cli

    run_dir = tmp_path / "run"
    if plant == "symlink":
        # to a folder others can write (the path is resolved, then the folder checked)
        (tmp_path / "elsewhere").mkdir(mode=0o777)
        (tmp_path / "elsewhere").chmod(0o777)
        run_dir.symlink_to(tmp_path / "elsewhere")
    else:
        run_dir.mkdir()
        if plant == "other-user":
            if os.getuid() != 0:
                pytest.skip("giving a folder to another user needs root")
            os.chown(run_dir, 65534, 65534)
        else:
            run_dir.chmod(0o777)
    r = cli(
        "serve", "front", tiny_artifact, "--run-dir", run_dir, check=False,
    )  # fmt: skip
    assert r.returncode != 0, r.stdout
    assert f"run directory {run_dir.resolve()}" in r.stderr + r.stdout
    target = tmp_path / "elsewhere" if plant == "symlink" else run_dir
    assert list(target.iterdir()) == []  # no key, settings or pid file written


def test_the_front_tokenizes_with_the_bytes_it_verified(tmp_path, tiny_artifact):
    """The front's tokenizer comes from tokenizer.json's checked bytes: one altered after
    the manifest was written is refused, not loaded."""
    from neuronserve.artifact import read_manifest
    from neuronserve.served import ServedModel

    copy = tmp_path / "tiny"
    shutil.copytree(tiny_artifact, copy)
    manifest = read_manifest(copy, verify=False)
    assert ServedModel.tokenizer_of(manifest, copy).tokens(["hello"])[0]
    tok = copy / manifest.tokenizer.file
    tok.write_text(tok.read_text().replace('"hello"', '"hullo"', 1) + " ")
    with pytest.raises(ArtifactError, match="does not match its sha256"):
        ServedModel.tokenizer_of(manifest, copy)


def test_the_cache_key_follows_symlinked_module_folders(tmp_path, tiny_embedder_dir):
    """sentence-transformers' modules are often linked in: a weight changed in a linked
    folder makes another key (rglob did not follow the link: the stale artifact was used)."""
    from neuronserve.compile import cache as artifact_cache
    from neuronserve.compile.hub import ModelFolder
    from neuronserve.compile.job import CompileJob

    model = Path(shutil.copytree(tiny_embedder_dir, tmp_path / "model"))
    dense = tmp_path / "dense"
    dense.mkdir()
    (dense / "model.safetensors").write_bytes(b"a" * 64)
    (model / "2_Dense").symlink_to(dense)
    (model / "loop").symlink_to(model)  # a link back up is walked once
    job = CompileJob.of(load_spec(None, {"compile": {"model": str(model)}}))
    before = artifact_cache.cache_key(job, ModelFolder(model))
    (dense / "model.safetensors").write_bytes(b"b" * 64)
    assert artifact_cache.cache_key(job, ModelFolder(model)) != before


def test_doctor_takes_the_key_from_the_environment(monkeypatch):
    """A key on doctor's command line is readable by every local user while it runs:
    NEURONSERVE_API_KEY is read instead (the option stays for scripts)."""
    from typer.testing import CliRunner

    from neuronserve import host_load
    from neuronserve.cli import app

    seen = []
    monkeypatch.setattr(host_load, "front_pace", lambda url, s, key: seen.append(key) or [])
    done = CliRunner().invoke(
        app, ["doctor", "--url", "http://127.0.0.1:1"], env={"NEURONSERVE_API_KEY": "k-env"}
    )
    assert done.exit_code == 0, done.output
    assert seen == ["k-env"]


@pytest.mark.parametrize("path", ["/etc", "../outside", "1_Pooling/../../x"])
def test_a_module_folder_outside_the_model_is_refused(tmp_path, path):
    """modules.json's paths are joined to the model folder: one that leaves it (absolute,
    or through ..) is refused before any file is read from there."""
    from neuronserve.tasks.sentence_transformers import read_modules

    (tmp_path / "modules.json").write_text(
        json.dumps(
            [{"idx": 0, "name": "0", "path": path, "type": "sentence_transformers.models.Pooling"}]
        )
    )
    with pytest.raises(ValueError, match="outside the model folder"):
        read_modules(tmp_path)
    (tmp_path / "modules.json").write_text(
        json.dumps(
            [{"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Normalize"}]
        )
    )
    assert read_modules(tmp_path).normalize


def _tarball(path: Path, members: list[tuple[str, bytes | None, str | None]]) -> Path:
    """A model.tar.gz of (name, file bytes or None for a link, the link's target)."""
    import io
    import tarfile

    with tarfile.open(path, "w:gz") as t:
        for name, data, link in members:
            info = tarfile.TarInfo(name)
            if link is not None:
                info.type, info.linkname = tarfile.SYMTYPE, link
                t.addfile(info)
            else:
                assert data is not None
                info.size, info.mode = len(data), 0o6777  # set-id and world-writable
                t.addfile(info, io.BytesIO(data))
    return path


@pytest.mark.parametrize("filters", [True, False], ids=["with-filters", "python-3.11.2"])
def test_a_model_archive_extracts_its_files_only_on_every_supported_python(
    tmp_path, monkeypatch, filters
):
    """Python 3.10 before 3.10.12 and 3.11 before 3.11.4 (Debian bookworm's 3.11.2) have
    no extraction filters: tarfile.extract takes no `filter`. Both ways, a plain archive
    extracts (without set-id or world-write bits) and a link or a path out of the
    folder is refused, with nothing left."""
    import tarfile

    from neuronserve.sources import ModelSourceError, unpack_tar

    if not filters:
        monkeypatch.delattr(tarfile, "data_filter")
        monkeypatch.delattr(tarfile, "FilterError")
        plain_extract = tarfile.TarFile.extract

        def extract(self, member, path="", **kw):
            if "filter" in kw:  # as 3.11.2 answers
                raise TypeError("TarFile.extract() got an unexpected keyword argument 'filter'")
            return plain_extract(self, member, path, **kw)

        monkeypatch.setattr(tarfile.TarFile, "extract", extract)
    good = _tarball(tmp_path / "good.tar.gz", [("manifest.json", b"{}", None)])
    unpack_tar([good], tmp_path / "out")
    written = tmp_path / "out" / "manifest.json"
    assert written.read_bytes() == b"{}"
    assert stat.S_IMODE(written.stat().st_mode) & 0o7022 == 0
    for bad in (
        [("manifest.json", b"{}", None), ("weights", None, "/etc/passwd")],
        [("../outside.json", b"{}", None)],
    ):
        dest = tmp_path / "refused"
        with pytest.raises(ModelSourceError, match="is a link, a device or outside the archive"):
            unpack_tar([_tarball(tmp_path / "bad.tar.gz", bad)], dest)
        assert not dest.exists() and not (tmp_path / "outside.json").exists()
