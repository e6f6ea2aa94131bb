"""What another local user could learn from a running deployment's neighbours: doctor,
asked about a front, never carries its key across a redirect."""

from __future__ import annotations

import http.server
import threading
import time

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
