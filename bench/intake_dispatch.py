"""What a summary costs before the controller sees it: nats-py's per-message path against the
intake connection's direct delivery (skewd.natsutil.direct_delivery), same process, same bytes.

    python bench/intake_dispatch.py [--messages 200000] [--headers] [--json]

No server: nats-py's own protocol parser is fed the server's MSG (or, with ``--headers``, HMSG:
what agents send, with their kind and schema headers) frames of 284-byte binary summaries in
32 KB reads, as its read loop hands them over. *nats-py*: a subscription with a callback that
only counts (the parser, header parsing, a ``Msg``, the subscription's queue and task, a
coroutine call per message); *direct*: the same subscription routed to a Backlog that the
consumer drains in a loop, its frames cut out of the connection's parser buffer by skewd's own
framing ahead of nats-py's parser; *parse only*: nats-py's parser with a ``_process_msg`` that does
nothing, the floor under nats-py's way (the direct path goes under it: it does not run that
parser for routed frames). CPU time per message (process time), best of ``--repeat`` runs.
"""
from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

SUBJECT = b"skewd.v1.summary.bench.node-0042.tp5"
HEADERS = b"NATS/1.0\r\nSkewd-Kind: summary\r\nSkewd-Schema: 1\r\n\r\n"  # what agent/publisher.py sends
CHUNK = 32 * 1024  # nats-py's read size (DEFAULT_BUFFER_SIZE)


def frames(n: int, headers: bool) -> list[bytes]:
    body = b"\x93" + bytes(range(256))[:283]
    if headers:
        one = b"HMSG %s 1 %d %d\r\n%s%s\r\n" % (SUBJECT, len(HEADERS), len(HEADERS) + len(body), HEADERS, body)
    else:
        one = b"MSG %s 1 %d\r\n%s\r\n" % (SUBJECT, len(body), body)
    data = one * n
    return [data[i:i + CHUNK] for i in range(0, len(data), CHUNK)]


async def nats_py(chunks: list[bytes], n: int) -> float:
    from nats.aio.client import Client
    from nats.aio.subscription import Subscription
    from nats.protocol.parser import Parser

    nc = Client()
    count = [0]

    async def cb(msg) -> None:
        count[0] += 1

    sub = Subscription(nc, 1, SUBJECT.decode(), cb=cb, pending_msgs_limit=0, pending_bytes_limit=0)
    nc._subs[1] = sub
    sub._start(nc._error_cb)
    p = Parser(nc)
    t0 = time.process_time()
    for c in chunks:
        await p.parse(c)
        await asyncio.sleep(0)  # the read loop yields between reads: the subscription's task runs
    while count[0] < n:
        await asyncio.sleep(0)
    return time.process_time() - t0


async def direct(chunks: list[bytes], n: int) -> float:
    from nats.aio.client import Client
    from nats.aio.subscription import Subscription

    from skewd.natsutil import Backlog, direct_delivery

    nc = Client()
    count = [0]

    async def cb(msg) -> None:  # never called: the route takes every message
        raise AssertionError("routed message reached the callback")

    sub = Subscription(nc, 1, SUBJECT.decode(), cb=cb, pending_msgs_limit=0, pending_bytes_limit=0)
    nc._subs[1] = sub
    tap = direct_delivery(nc)
    assert tap is not None, "nats-py's internals moved: direct delivery is off"
    b = Backlog()
    tap.route(sub, b)
    items = b.items

    def take(subject: str, data: bytes) -> None:
        count[0] += 1

    p = nc._ps  # the connection's parser: direct_delivery frames routed messages ahead of it
    t0 = time.process_time()
    for c in chunks:
        await p.parse(c)
        while items:  # as the controller's intake loop (controller/intake.py) drains it
            subject, data = items.popleft()
            b.bytes -= len(data)
            take(subject.decode(), data)
        await asyncio.sleep(0)
    assert count[0] == n
    return time.process_time() - t0


async def parse_only(chunks: list[bytes], n: int) -> float:
    from nats.aio.client import Client
    from nats.protocol.parser import Parser

    nc = Client()

    async def nothing(sid, subject, reply, data, headers) -> None:
        return None

    nc._process_msg = nothing
    p = Parser(nc)
    t0 = time.process_time()
    for c in chunks:
        await p.parse(c)
    return time.process_time() - t0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--messages", type=int, default=200_000)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--headers", action="store_true", help="HMSG frames with the agents' headers")
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args(argv)
    chunks = frames(a.messages, a.headers)
    out = {}
    for name, fn in (("nats-py", nats_py), ("direct", direct), ("parse only", parse_only)):
        best = min(asyncio.run(fn(chunks, a.messages)) for _ in range(a.repeat))
        out[name] = best / a.messages * 1e6
    kind = "HMSG (agents' headers)" if a.headers else "MSG"
    print(f"intake dispatch, {a.messages:,} {kind} frames of 284-byte summaries, CPU per message (best of {a.repeat}):")
    for name, us in out.items():
        print(f"  {name:10}: {us:.2f} us" + ("" if name == "nats-py" else f"  ({out['nats-py'] / us:.2f}x nats-py)"))
    if a.json:
        print(json.dumps({"benchmark": "intake_dispatch", "messages": a.messages, "headers": a.headers,
                          "us_per_message": out}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
