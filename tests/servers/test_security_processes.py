"""What another local user could learn from a running deployment's neighbours: doctor,
asked about a front, never carries its key across a redirect."""

from __future__ import annotations

import http.server
import threading
import time
from pathlib import Path

import pytest
from helpers import ports_for

pytestmark = pytest.mark.server


def test_doctor_never_follows_a_redirect_with_the_key():
    """A front address that redirects elsewhere: doctor says so and sends the key to no
    one but the address it was given."""
    from neuronserve.host_load import front_pace

    heard: list[str | None] = []
    ports = ports_for("redirect", "elsewhere")

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            heard.append(self.headers.get("Authorization"))
            if self.server.server_port == ports["redirect"]:
                self.send_response(302)
                self.send_header("Location", f"http://127.0.0.1:{ports['elsewhere']}/metrics")
                self.end_headers()
            else:
                self.send_response(200)
                self.end_headers()
                self.wfile.write(b"neuronserve_front_requests_total 1\n")

        def log_message(self, *args):
            pass

    servers = [http.server.HTTPServer(("127.0.0.1", p), Handler) for p in ports.values()]
    threads = [threading.Thread(target=s.serve_forever, daemon=True) for s in servers]
    for t in threads:
        t.start()
    try:
        with pytest.raises(OSError, match=r"a redirect to .*not followed"):
            front_pace(f"http://127.0.0.1:{ports['redirect']}", 0, "the-key")
        deadline = time.monotonic() + 5
        while not heard and time.monotonic() < deadline:
            time.sleep(0.01)
        assert heard == ["Bearer the-key"]  # the redirecting address only
    finally:
        for s in servers:
            s.shutdown()


# in a user namespace of its own (as a pod's with hostUsers: false, or a rootless
# container), `/` and /tmp belong to an owner it does not map: they show as the overflow uid
_IN_A_NAMESPACE = r"""
import shutil, sys, tempfile
from pathlib import Path
exec(sys.stdin.read())  # private_folders.py, which imports the standard library only
base = Path(tempfile.mkdtemp())
print(private_folder(base / "leases" / "run", own=2))
shutil.rmtree(base)
"""


def test_a_lease_folder_is_made_inside_a_user_namespace(tmp_path):
    """As `nobody` in a user namespace mapping only itself to root: `/` and /tmp are
    owned by the overflow uid there, which no user inside can be; the folder is made, as
    it would be under root's `/`. On the host the same uid is `nobody`, refused above."""
    import subprocess

    from helpers import as_nobody

    from neuronserve import private_folders

    prefix = as_nobody()
    if (
        prefix is None
        or subprocess.run(
            [*prefix[:4], "unshare", "-U", "-r", "true"], capture_output=True
        ).returncode
    ):
        pytest.skip("needs root, runuser and unprivileged user namespaces")
    inside = [*prefix[:4], "unshare", "-U", "-r", *prefix[4:], "-c", _IN_A_NAMESPACE]
    source = Path(private_folders.__file__).read_text()
    done = subprocess.run(inside, input=source, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip().endswith("leases/run")
