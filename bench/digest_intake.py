"""Leader digest intake, offline: the part of a scaled-out leader's tick that takes the
partitions' digests in, without NATS.

    python bench/digest_intake.py [--nodes 1000] [--partitions 8] [--seconds 30] [--warm 5] [--encoding binary|json] [--json]

``--partitions`` partition Controllers (offline, as tests/controller/helpers.py drives them)
take every node's summary each second of the summaries' clock (the payloads of
bench/controller_ingest.py: 22 summary signals, 20 burst starts, topology labels; nodes placed
by their TP group as the server's partition mapping places them); after each second each
partition publishes its digest (:meth:`_publish_digest`, into a list instead of NATS) and one
leader Controller takes those messages in (``_on_digest``: decoded on the event loop), then
runs its tick's digest intake (``_take_digests``) and the store flush that follows it. Each
of these is timed (wall, ``time.perf_counter``; the partitions' ``_publish_digest`` summed
over them) and reported for the seconds after the first ``--warm`` (new nodes, new layouts).
The digests' bytes per second are reported too (NATS max_payload is 1 MiB a message). What it does not include: NATS, the rules, correlation (bench/controller_ingest.py
``--workers`` measures those end to end).
"""
from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from controller_ingest import CLUSTER, _Msg, payload, templates  # noqa: E402


class _Sink:
    """A partition's NATS connection as far as its digest goes: the messages, kept."""

    def __init__(self) -> None:
        self.sent: list[tuple[str, bytes]] = []

    async def publish(self, subject: str, data: bytes) -> None:
        self.sent.append((subject, data))


def _controller(role: str, partition: int | None = None) -> Any:
    from skewd.controller.config import load_config
    from skewd.controller.offline import CaptureJetStream, MemoryState
    from skewd.controller.service import Controller

    cfg = load_config(None, env={}, overrides={"cluster": CLUSTER, "log": {"level": "error"},
                                              "ingest": {"max_clock_skew": "0s"}})
    ctl = Controller(cfg, wall_clock=lambda: 0.0, role=role, partition=partition)
    ctl.state = MemoryState(CLUSTER)
    ctl.js = CaptureJetStream()
    ctl.nc = _Sink()
    return ctl


def run(nodes: int, partitions: int, seconds: int, warm: int, encoding: str) -> dict:
    from skewd import wire
    from skewd.controller.roles import ROLE_LEADER, ROLE_PARTITION

    parts = [_controller(ROLE_PARTITION, k) for k in range(partitions)]
    leader = _controller(ROLE_LEADER)
    tpls = templates(nodes, encoding)
    where = [wire.partition_of(wire.parse_subject(s).tokens["placement"], partitions) for s, _ in tpls]
    publish, arrive, take, flush, nbytes, nmsgs, biggest = [], [], [], [], [], [], 0
    t0 = 1.7e9

    async def drive() -> None:
        nonlocal biggest
        for sec in range(seconds):
            t = t0 + sec
            for tpl, k in zip(tpls, where):
                await parts[k]._on_summary(_Msg(tpl[0], payload(tpl, t, 1.0)))
            sent = []
            pub = 0.0
            for p in parts:
                p.feed.flush()
                p.nc.sent.clear()
                y = time.perf_counter()
                await p._publish_digest(t, {})
                pub += time.perf_counter() - y
                sent += p.nc.sent
            z = time.perf_counter()
            for subject, data in sent:
                await leader._on_digest(_Msg(subject, data))
            a = time.perf_counter()
            leader._take_digests()
            b = time.perf_counter()
            leader.feed.flush()
            c = time.perf_counter()
            if sec >= warm:
                publish.append(pub * 1e3)
                arrive.append((a - z) * 1e3)
                take.append((b - a) * 1e3)
                flush.append((c - b) * 1e3)
                nbytes.append(sum(len(d) for _, d in sent))
                nmsgs.append(len(sent))
                biggest = max(biggest, max(len(d) for _, d in sent))

    asyncio.run(drive())
    assert leader.stats.errors == 0 and all(p.stats.errors == 0 for p in parts)
    assert len(leader.nodes.heard) == nodes, len(leader.nodes.heard)

    def stats(xs: list[float]) -> dict:
        return {"median": round(statistics.median(xs), 2), "max": round(max(xs), 2), "mean": round(statistics.mean(xs), 2)}

    return {"nodes": nodes, "partitions": partitions, "encoding": encoding, "seconds_measured": len(take),
            "publish_digest_ms": stats(publish), "on_digest_ms": stats(arrive), "take_digests_ms": stats(take), "flush_ms": stats(flush),
            "take_plus_flush_ms": stats([a + b for a, b in zip(take, flush)]),
            "digest_bytes_per_second": int(statistics.mean(nbytes)), "messages_per_second": statistics.mean(nmsgs),
            "largest_message_bytes": biggest}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--nodes", type=int, default=1000)
    ap.add_argument("--partitions", type=int, default=8)
    ap.add_argument("--seconds", type=int, default=30, help="seconds of summaries (each node one a second)")
    ap.add_argument("--warm", type=int, default=5, help="first seconds left out of the figures")
    ap.add_argument("--encoding", choices=("binary", "json"), default="binary")
    ap.add_argument("--json", action="store_true", help="also print the figures as one JSON line")
    args = ap.parse_args(argv)
    with open("/proc/loadavg") as f:
        load = " ".join(f.read().split()[:3])
    r = run(args.nodes, args.partitions, args.seconds, args.warm, args.encoding)
    r["loadavg_at_start"] = load

    def ms(k: str) -> str:
        return f"median {r[k]['median']:.1f} ms, max {r[k]['max']:.1f} ms"

    print(f"leader digest intake offline: {r['nodes']} nodes ({r['encoding']} summaries) on {r['partitions']} partitions, "
          f"{r['seconds_measured']} s measured (load average at start {load})")
    print(f"  partitions' _publish_digest (summed): {ms('publish_digest_ms')}")
    print(f"  leader _on_digest (event loop):       {ms('on_digest_ms')}")
    print(f"  leader _take_digests (tick):          {ms('take_digests_ms')}")
    print(f"  leader store flush after it (tick):   {ms('flush_ms')}")
    print(f"  digests: {r['digest_bytes_per_second']:,} bytes a second in {r['messages_per_second']:g} messages, "
          f"largest {r['largest_message_bytes']:,} bytes (NATS max_payload 1 MiB)")
    if args.json:
        print(json.dumps({"benchmark": "digest_intake", **r}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
