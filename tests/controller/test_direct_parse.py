"""The intake connection frames routed messages itself (skewd.natsutil._parse_routed, ahead of
nats-py's protocol parser): fed the same byte stream, cut into reads at every place, the routed
subscriptions' backlogs get exactly the bodies nats-py's parser would have delivered to them, in
order, and everything else (other subscriptions' messages with their reply and headers, PING,
PONG, INFO, +OK, -ERR) reaches nats-py's client exactly as nats-py's parser alone hands it
over; a malformed frame is nats-py's protocol error, as before. No server: the stream is what
nats-server sends."""
from __future__ import annotations

import asyncio
import random

import pytest
from nats.aio.client import Client
from nats.errors import ProtocolError

from skewd.natsutil import Backlog, direct_delivery, hold_reads

ROUTED, OTHER = 7, 9


def _stream() -> bytes:
    """Frames of every shape the server sends a client, routed and not, interleaved."""
    parts = [b"INFO {\"server_id\":\"x\",\"max_payload\":1048576}\r\n", b"+OK\r\n"]
    for i in range(12):
        body = bytes([i]) * (i * 7) + b"\r\nMSG not a frame\r\n"[: i % 19]  # bodies may hold CRLF and ops
        subj = b"skewd.v1.summary.c1.n%d.tp0" % i
        if i % 4 == 0:
            parts.append(b"MSG %s %d %d\r\n%s\r\n" % (subj, ROUTED, len(body), body))
        elif i % 4 == 1:  # as agents publish: kind and schema headers
            hdr = b"NATS/1.0\r\nSkewd-Kind: summary\r\n\r\n"
            parts.append(b"HMSG %s %d %d %d\r\n%s%s\r\n" % (subj, ROUTED, len(hdr), len(hdr) + len(body), hdr, body))
        elif i % 4 == 2:  # another subscription, with a reply subject
            parts.append(b"MSG %s %d _INBOX.r%d %d\r\n%s\r\n" % (subj, OTHER, i, len(body), body))
        else:  # another subscription's headers and reply
            hdr = b"NATS/1.0\r\nX: %d\r\n\r\n" % i
            parts.append(b"HMSG %s %d _INBOX.h %d %d\r\n%s%s\r\n" % (subj, OTHER, len(hdr), len(hdr) + len(body), hdr, body))
        if i == 5:
            parts.append(b"PING\r\n")
        if i == 8:
            parts.append(b"PONG\r\n-ERR 'Permissions Violation for Subscription'\r\n")
        if i == 10:  # a routed subscription gone: nats-py's way (it drops it)
            parts.append(b"MSG %s 11 3\r\nabc\r\n" % subj)
    parts.append(b"MSG skewd.v1.summary.c1.last.tp0 %d 0\r\n\r\n" % ROUTED)  # an empty body
    return b"".join(parts)


def _client(routed: bool) -> tuple[Client, list, Backlog | None]:
    nc = Client()
    events: list = []

    async def process_msg(sid, subject, reply, data, headers) -> None:
        events.append(("msg", sid, bytes(subject), bytes(reply), bytes(data), None if headers is None else bytes(headers)))

    async def ping() -> None:
        events.append(("ping",))

    async def pong() -> None:
        events.append(("pong",))

    async def info(srv_info, *a) -> None:
        events.append(("info", srv_info))

    async def err(e) -> None:
        events.append(("err", e))

    nc._process_msg, nc._process_ping, nc._process_pong = process_msg, ping, pong
    nc._process_info, nc._process_err = info, err

    class Sub:
        def __init__(self, sid: int) -> None:
            self._id = sid

    nc._subs[ROUTED], nc._subs[OTHER] = Sub(ROUTED), Sub(OTHER)
    b = None
    if routed:
        tap = direct_delivery(nc)
        assert tap is not None
        b = Backlog()
        assert tap.route(nc._subs[ROUTED], b)
        tap.route(Sub(11), Backlog())  # routed, but not (any more) a subscription of the client
    return nc, events, b


async def _feed(nc: Client, reads: list[bytes]) -> None:
    for r in reads:
        await nc._ps.parse(r)


def _reference(data: bytes) -> list:
    nc, events, _ = _client(routed=False)
    asyncio.run(_feed(nc, [data]))
    return events


def _reads(data: bytes, cuts: list[int]) -> list[bytes]:
    edges = [0, *sorted(cuts), len(data)]
    return [data[a:b] for a, b in zip(edges, edges[1:])]


def _check(data: bytes, reads: list[bytes], ref: list) -> None:
    nc, events, b = _client(routed=True)
    asyncio.run(_feed(nc, reads))
    want_routed = [(e[2], e[4]) for e in ref if e[0] == "msg" and e[1] == ROUTED]
    want_rest = [e for e in ref if not (e[0] == "msg" and e[1] == ROUTED)]
    assert list(b.items) == want_routed
    assert b.bytes == sum(len(d) for _, d in want_routed)
    assert events == want_rest
    assert nc._ps.buf == bytearray()  # nothing left over, nothing read twice
    assert nc.stats["in_msgs"] == len(want_routed)  # routed ones counted as nats-py counts its own


def test_every_cut_of_the_stream_into_two_reads_delivers_what_nats_py_delivers() -> None:
    data = _stream()
    ref = _reference(data)
    assert sum(1 for e in ref if e[0] == "msg" and e[1] == ROUTED) == 7  # the stream has what it should
    assert [e[0] for e in ref].count("ping") == 1 and any(e[0] == "err" for e in ref)
    for cut in range(len(data) + 1):
        _check(data, _reads(data, [cut]), ref)


@pytest.mark.parametrize("seed", range(40))
def test_random_reads_deliver_what_nats_py_delivers(seed: int) -> None:
    data = _stream()
    rng = random.Random(seed)
    cuts = rng.sample(range(1, len(data)), rng.randint(2, 60))
    _check(data, _reads(data, cuts), _reference(data))


def test_byte_by_byte_reads_deliver_what_nats_py_delivers() -> None:
    data = _stream()
    _check(data, [data[i:i + 1] for i in range(len(data))], _reference(data))


@pytest.mark.parametrize("frame", [b"MSG a.b 7\r\nxy\r\n", b"MSG a.b x 2\r\nxy\r\n", b"BOGUS\r\n",
                                   b"HMSG a.b 7 9 4\r\nxyzw\r\n", b"MSG a.b 7 -1\r\n\r\n"])
def test_a_malformed_frame_fares_as_in_nats_py(frame: bytes) -> None:
    """Whatever nats-py makes of it (a protocol error, or its own reading), the same."""
    good = b"MSG a.b %d 2\r\nok\r\n" % ROUTED

    def outcome(routed: bool) -> tuple:
        nc, events, b = _client(routed)
        try:
            asyncio.run(_feed(nc, [good + frame + good]))
            error = None
        except ProtocolError as e:
            error = type(e)
        got = [(e[2], e[4]) for e in events if e[0] == "msg" and e[1] == ROUTED] + (list(b.items) if b else [])
        return error, got, [e for e in events if not (e[0] == "msg" and e[1] == ROUTED)]

    ref = outcome(False)
    assert ref[1][:1] == [(b"a.b", b"ok")]  # what came before it is delivered either way
    assert outcome(True) == ref
    if frame.startswith((b"MSG a.b 7\r", b"BOGUS")):
        assert ref[0] is ProtocolError  # (nats-py refuses these)


def test_the_read_hold_stays_in_front_of_the_framing() -> None:
    class Gate:
        busy = True
        idle = asyncio.Event()

    nc = Client()
    held = []
    assert hold_reads(nc, Gate, max_hold=0.05)
    outer = nc._ps.parse
    nc._subs[ROUTED] = type("S", (), {"_id": ROUTED})()
    tap = direct_delivery(nc)
    b = Backlog()
    tap.route(nc._subs[ROUTED], b)
    assert nc._ps.parse is outer  # framing went in beneath the hold

    async def run() -> None:
        t = asyncio.get_running_loop().time()
        await nc._ps.parse(b"MSG a.b %d 2\r\nok\r\n" % ROUTED)
        held.append(asyncio.get_running_loop().time() - t)

    asyncio.run(run())
    assert list(b.items) == [(b"a.b", b"ok")] and held[0] >= 0.04  # waited for the gate first


def test_after_a_short_read_the_next_waits_and_after_a_full_one_it_does_not() -> None:
    """The intake gathers: a read of a few summaries is followed by a pause (what arrives
    meanwhile comes in one read), a read of a backlog is not."""
    from skewd.natsutil import GATHER_BELOW

    class Gate:
        busy = False
        idle = asyncio.Event()

    nc = Client()
    assert hold_reads(nc, Gate, gather=0.08)
    frame = b"MSG a.b 99 3\r\nabc\r\n"  # (no such subscription: nats-py counts and drops it)
    full = frame * (GATHER_BELOW // len(frame) + 1)

    async def took(data: bytes) -> float:
        t = asyncio.get_running_loop().time()
        await nc._ps.parse(data)
        return asyncio.get_running_loop().time() - t

    async def run() -> tuple[float, float]:
        return await took(frame), await took(full)

    short, long = asyncio.run(run())
    assert short >= 0.07 and long < 0.05
    assert nc.stats["in_msgs"] == 1 + full.count(b"MSG")  # both parsed
