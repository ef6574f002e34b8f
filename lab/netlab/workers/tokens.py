"""Front-end traffic of the lab: an SSE-like token-streaming server on every node and one client
driving them all, so the nodes' ports carry what a serving node's do besides its collectives.

    tokens.py server --port 8080 --seed S
    tokens.py client --hosts IP,IP,... --port 8080 --streams 4 --seed S

Server: HTTP/1.1 keep-alive; a ``POST /v1/completions`` with a prompt body (1-16 KiB) and a
``max_tokens`` header is answered with ``data: {...}`` lines, one token every 20-50 ms (the
pace is drawn per stream, with ±20 % jitter per token), then ``data: [DONE]``. A healthy
server paces each token from the previous one: when the loaded lab box wakes its thread late
it does not catch up back to back (that would be a send-path stall, NS-6's pathology).

Client: ``--streams`` concurrent streams per node, each a loop of requests with random lengths
(16-256 tokens) and short think times, a fresh connection every 5-30 requests (HTTP clients
recycle connections). The default port is not 8000 on purpose: that is where the agent's vLLM
collector looks for an engine's ``/metrics`` by default, and these servers are not engines.

Imports nothing from skewd (runs with any Python 3).
"""
from __future__ import annotations

import argparse
import json
import random
import signal
import socket
import sys
import threading
import time


def serve_conn(c: socket.socket, rnd: random.Random) -> None:
    c.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    c.settimeout(120)
    f = c.makefile("rb")
    try:
        while True:
            line = f.readline()
            if not line:
                return
            headers = {}
            while True:
                h = f.readline()
                if not h or h in (b"\r\n", b"\n"):
                    break
                k, _, v = h.decode("latin-1").partition(":")
                headers[k.strip().lower()] = v.strip()
            body = int(headers.get("content-length", "0"))
            if body:
                f.read(body)
            n = int(headers.get("x-max-tokens", "64"))
            c.sendall(b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: identity\r\n"
                      b"Connection: keep-alive\r\n\r\n")
            pace = rnd.uniform(0.02, 0.05)
            for i in range(n):
                time.sleep(pace * rnd.uniform(0.8, 1.2))
                tok = json.dumps({"choices": [{"index": 0, "text": " tok%d" % rnd.randrange(50000)}], "i": i})
                c.sendall(b"data: " + tok.encode() + b"\n\n")
            c.sendall(b"data: [DONE]\n\n")
    except OSError:
        return
    finally:
        try:
            c.close()
        except OSError:
            pass


def server(a: argparse.Namespace) -> None:
    s = socket.socket()
    s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    s.bind(("0.0.0.0", a.port))
    s.listen(256)
    rnd = random.Random(a.seed)
    while True:
        c, _ = s.accept()
        threading.Thread(target=serve_conn, args=(c, random.Random(rnd.random())), daemon=True).start()


def stream_loop(host: str, port: int, rnd: random.Random, stats: dict) -> None:
    while True:
        try:
            c = socket.create_connection((host, port), timeout=10)
            c.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            c.settimeout(60)
            f = c.makefile("rb")
            for _ in range(rnd.randint(5, 30)):
                prompt = b"p" * rnd.randint(1024, 16384)
                n = rnd.randint(16, 256)
                c.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: %s\r\nContent-Type: text/plain\r\n"
                          b"X-Max-Tokens: %d\r\nContent-Length: %d\r\n\r\n" % (host.encode(), n, len(prompt)) + prompt)
                while True:
                    line = f.readline()
                    if not line:
                        raise OSError("server closed the stream")
                    if line.startswith(b"data: [DONE]"):
                        break
                stats["requests"] += 1
                time.sleep(rnd.uniform(0.05, 0.5))
            c.close()
        except OSError:
            stats["errors"] += 1
            time.sleep(0.5)


def client(a: argparse.Namespace) -> None:
    rnd = random.Random(a.seed)
    stats = {"requests": 0, "errors": 0}
    for h in a.hosts.split(","):
        for _ in range(a.streams):
            threading.Thread(target=stream_loop, args=(h, a.port, random.Random(rnd.random()), stats),
                             daemon=True).start()
    while True:
        time.sleep(10)
        print(json.dumps({"t": time.time(), **stats}), flush=True)


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    sub = p.add_subparsers(dest="role", required=True)
    ps = sub.add_parser("server")
    ps.add_argument("--port", type=int, default=8080)
    ps.add_argument("--seed", type=int, default=0)
    pc = sub.add_parser("client")
    pc.add_argument("--hosts", required=True)
    pc.add_argument("--port", type=int, default=8080)
    pc.add_argument("--streams", type=int, default=4)
    pc.add_argument("--seed", type=int, default=0)
    a = p.parse_args(argv)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    (server if a.role == "server" else client)(a)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
