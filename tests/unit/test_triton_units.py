"""triton_backend/model.py's pure parts, imported with Triton's real utils module, and
the numpy guard of `serve triton`."""

import importlib.util
import sys

import pytest
from helpers import REPO, wait_for

from neuronserve.serve import triton
from neuronserve.serve.process import ServeError


@pytest.fixture(scope="module")
def model_py():
    utils_dir = triton._pytriton_root() / "backends" / "python"
    sys.path.insert(0, str(utils_dir))
    try:
        spec = importlib.util.spec_from_file_location(
            "ns_triton_model", REPO / "triton_backend" / "model.py"
        )
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        yield module
    finally:
        sys.path.remove(str(utils_dir))


def test_instance_index_counts_across_groups(model_py):
    config = {"instance_group": [{"count": 2}, {"count": 3}]}
    assert model_py.instance_index("minilm_0_0", config) == 0
    assert model_py.instance_index("minilm_0_1", config) == 1
    assert model_py.instance_index("minilm_1_0", config) == 2
    assert model_py.instance_index("my_model_x_1_2", config) == 4  # underscores in the name
    # the groups neuronserve writes, one per core group: the group's own, whatever the
    # config holds now (the healer reloads with a dead instance's group left out)
    ours = {"instance_group": [{"name": "cores0", "count": 1}, {"name": "cores3", "count": 1}]}
    assert model_py.instance_index("cores3_0", ours) == 3
    assert model_py.instance_index("cores12_0", ours) == 12


def test_errors_keep_the_runners_status_as_far_as_triton_can_say_it(model_py):
    from neuronserve.tasks import RequestError

    # the HTTP status Triton answers each code with (servers/test_triton.py sees them)
    http = {"INVALID_ARG": 400, "INTERNAL": 500, "UNAVAILABLE": 503, "NOT_FOUND": 404}
    cases = [
        (400, "INVALID_ARG", "bad field"),
        (500, "INTERNAL", "model execution failed"),
        (503, "UNAVAILABLE", "busy"),
        (413, "INVALID_ARG", "[413] too long"),
    ]
    for status, code, message in cases:
        sent = RequestError(message.removeprefix("[413] "), status)
        assert model_py.error_code(sent) == (code, message)
        # what neuronserve's front reads back from the engine's answer
        back = RequestError.from_engine(message, http[code])
        assert (back.status, back.message) == (status, sent.message)


def test_numpy_2_is_refused(monkeypatch):
    import numpy

    monkeypatch.setattr(numpy, "__version__", "2.1.0")
    with pytest.raises(ServeError, match="numpy<2"):
        triton.check_numpy()


def test_backend_directory_links_this_pythons_stub(tmp_path):
    root = triton._pytriton_root()
    backends = triton.backend_directory(root, tmp_path)
    stub = backends / "python" / "triton_python_backend_stub"
    version = f"{sys.version_info.major}.{sys.version_info.minor}"
    assert (
        stub.resolve()
        == (root / "python_backend_stubs" / version / "triton_python_backend_stub").resolve()
    )
    assert (backends / "python" / "libtriton_python.so").resolve().is_file()


def test_serve_without_models_is_a_clear_error(tmp_path):
    with pytest.raises(ServeError, match="package triton"):
        triton.start(tmp_path, tmp_path / "run")


def test_glibc_older_than_2_35_is_refused_for_triton():
    with pytest.raises(ServeError, match=r"glibc 2.35 or newer.*Ubuntu 22.04"):
        triton.check_glibc("glibc 2.31")
    triton.check_glibc("glibc 2.35")
    triton.check_glibc()  # this machine


def test_the_healer_replaces_one_instance_only_where_each_group_is_one_core_group():
    from neuronserve.serve.triton_healer import instance_names, partitioned

    ours = [
        {"name": "cores0", "count": 1, "host_policy": "cores0"},
        {"name": "cores1", "count": 1, "host_policy": "cores1.2"},  # replaced twice
    ]
    assert partitioned(ours) and instance_names(ours) == ["cores0_0", "cores1_0"]
    # Triton tells instances apart by their group's settings, not its name: groups that
    # differ only in name, or a group of several, are reloaded whole
    same_policy = [{**g, "host_policy": "cpu"} for g in ours]
    several = [{"name": "m_0", "count": 2, "host_policy": ""}]
    assert not partitioned(same_policy) and not partitioned(several)
    assert instance_names(several) == ["m_0_0", "m_0_1"]


def test_a_crashed_servers_stubs_are_stopped_before_the_next_start(tmp_path):
    """A tritonserver that died leaves its stubs running in its process group, holding
    their core leases; the next start (or stop) from its run directory kills them, and
    only them."""
    import os
    import signal
    import subprocess

    import psutil

    from neuronserve.serve.triton_stubs import STUB

    stub = tmp_path / STUB
    stub.symlink_to("/bin/sleep")
    # a "server" leading its own session, with a "stub" child, as tritonserver runs
    server = subprocess.Popen(
        ["/bin/bash", "-c", f"{stub} 300 & exec /bin/sleep 300"], start_new_session=True
    )
    bystander = subprocess.Popen([str(stub), "300"])  # a stub of another server
    try:
        wait_for(lambda: psutil.Process(server.pid).children(), timeout=10, what="the stub")
        orphan = psutil.Process(server.pid).children()[0]
        os.kill(server.pid, signal.SIGKILL)
        server.wait()
        assert orphan.is_running()  # orphaned, still holding what it held
        run_dir = tmp_path / "run"
        run_dir.mkdir(mode=0o700)
        (run_dir / triton.PID_FILE).write_text(f"{server.pid}\n")
        said: list[str] = []
        assert triton.stop(run_dir, log=said.append) is False
        assert not orphan.is_running() or orphan.status() == psutil.STATUS_ZOMBIE
        assert bystander.poll() is None, "a stub of another server was stopped"
        assert "stopped 1 stub process(es) it left" in said[0]
        assert not (run_dir / triton.PID_FILE).exists()
    finally:
        bystander.kill()
        server.kill()
