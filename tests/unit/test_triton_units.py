"""triton_backend/model.py's pure parts, imported with Triton's real utils module (the
nvidia-pytriton wheel's), and the ports handed to the servers tests start."""

import importlib.util
import sys

import pytest
from helpers import REPO
from plugin_servers import pytriton_dir


@pytest.fixture(scope="module")
def model_py():
    utils_dir = pytriton_dir() / "tritonserver" / "backends" / "python"
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
    # config holds now (a config edited to leave a group out)
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
        assert http[code] // 100 == status // 100 or status == 413


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
