"""triton_backend/model.py's pure parts, imported with Triton's real utils module, and
the numpy guard of `serve triton`."""

import importlib.util
import sys

import pytest
from helpers import REPO

from neuronserve.engines.triton import process as triton
from neuronserve.processes import ServeError


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
    import re

    from neuronserve.engines.triton.section import glibc_refusal

    assert re.search(r"glibc 2.35 or newer.*Ubuntu 22.04", glibc_refusal("glibc 2.31") or "")
    assert glibc_refusal("glibc 2.35") is None
    assert glibc_refusal() is None  # this machine


def test_the_healer_replaces_one_instance_only_where_each_group_is_one_core_group():
    from neuronserve.engines.triton.healer import instance_names, partitioned

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


def test_a_stalled_start_is_tried_once_more_with_its_log_kept(tmp_path, monkeypatch):
    repo, run_dir = tmp_path / "repo", tmp_path / "run"
    (repo / "m" / "1").mkdir(parents=True)
    (repo / "m" / "config.pbtxt").write_text('name: "m"\nbackend: "python"\n')
    tries: list[list[str]] = []

    def launch(cmd, inst, timeout_s, log):
        tries.append(cmd)
        inst.log.write_text(f"try {len(tries)}\n")
        if len(tries) == 1:
            raise triton.StartStalled("stalled")
        return inst

    monkeypatch.setattr(triton, "_launch", launch)
    said: list[str] = []
    inst = triton.start(repo, run_dir, log=said.append)
    assert len(tries) == 2 and tries[0] == tries[1] and inst.expected == {"m": 1}
    assert (run_dir / triton.STALLED_LOG).read_text() == "try 1\n"
    assert inst.log.read_text() == "try 2\n"
    assert any("stalled" in s and "once more" in s for s in said)

    def stalls(cmd, inst, timeout_s, log):
        tries.append(cmd)
        raise triton.StartStalled("stalled again")

    monkeypatch.setattr(triton, "_launch", stalls)
    with pytest.raises(triton.StartStalled, match="stalled again"):
        triton.start(repo, tmp_path / "run2", log=said.append)
    assert len(tries) == 4  # once more, not again and again


def test_ports_handed_to_servers_are_below_the_ephemeral_range():
    """A port from the range the kernel takes outgoing connections' source ports from can
    be taken before the server given it binds it (tritonserver's metrics port was):
    free_ports picks distinct ports below that range, each free to bind."""
    import socket

    from neuronserve.processes import EPHEMERAL_RANGE, free_ports

    ephemeral = int(EPHEMERAL_RANGE.read_text().split()[0])
    ports = free_ports(8)
    assert len(set(ports)) == 8 and all(p < ephemeral for p in ports), (ports, ephemeral)
    for port in ports:
        with socket.socket() as s:
            s.bind(("127.0.0.1", port))
