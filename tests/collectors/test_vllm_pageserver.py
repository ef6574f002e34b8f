"""Shared by the vllm and exporter tests: fixture paths and a real HTTP server on loopback.

``PageServer`` is a genuine ``http.server`` on 127.0.0.1 (free port) whose ``/metrics`` answers
with whatever page the test set last, so the collectors go through urllib, sockets and HTTP
exactly as in production.
"""
from __future__ import annotations

import socket
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

FIX = Path(__file__).resolve().parents[1] / "fixtures"
VLLM = FIX / "vllm"
EXPORTER = FIX / "exporter"


def page(path: Path) -> str:
    return path.read_text()


class PageServer:
    """Serve one settable Prometheus text page at ``/metrics``; ``status`` other than 200
    answers with that HTTP error; ``delay`` sleeps before answering (timeouts). ``port``: listen
    on that port (an endpoint that starts answering later, as vLLM does once its model loaded)."""

    def __init__(self, port: int = 0) -> None:
        self.body = ""
        self.status = 200
        self.delay = 0.0
        self.requests = 0
        self.accept: list[str] = []
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:  # noqa: N802 (http.server API)
                outer.requests += 1
                outer.accept.append(self.headers.get("Accept", ""))
                if outer.delay:
                    threading.Event().wait(outer.delay)
                if self.path != "/metrics":
                    self.send_error(404)
                    return
                if outer.status != 200:
                    self.send_error(outer.status)
                    return
                data = outer.body.encode()
                try:
                    self.send_response(200)
                    self.send_header("Content-Type", "text/plain; version=0.0.4; charset=utf-8")
                    self.send_header("Content-Length", str(len(data)))
                    self.end_headers()
                    self.wfile.write(data)
                except (BrokenPipeError, ConnectionResetError):
                    pass  # the client timed out first (timeout tests)

            def log_message(self, *args: object) -> None:
                pass

        self.httpd = ThreadingHTTPServer(("127.0.0.1", port), Handler)
        self.httpd.daemon_threads = True
        self.port = self.httpd.server_address[1]
        self.url = f"http://127.0.0.1:{self.port}/metrics"
        self._thread = threading.Thread(target=self.httpd.serve_forever,
                                        kwargs={"poll_interval": 0.05}, daemon=True)
        self._thread.start()

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()
        self._thread.join(5)


def free_port() -> int:
    """A loopback port nothing listens on (bound then released)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def port_in_use(port: int) -> bool:
    with socket.socket() as s:
        s.settimeout(0.5)
        return s.connect_ex(("127.0.0.1", port)) == 0


def test_page_server_serves_the_page_it_was_given():
    import urllib.request
    srv = PageServer()
    try:
        srv.body = "# TYPE x gauge\nx 1.0\n"
        with urllib.request.urlopen(srv.url, timeout=5) as r:
            assert r.read().decode() == srv.body
    finally:
        srv.close()
