"""Cost of sampling egress queues many times a second: netdev's sampler vs netlink dumps.

    python bench/qdisc_sampler.py [--seconds 10] [--rates 20,50,100] [--json]

Why: NS-5 needs the peak and busy share of a queue that fills and drains within a step of lock-step
traffic, so netdev samples the root qdiscs between its once-a-second collections
(collectors/netdev/sampler.py). This measures what that costs against the obvious ways of doing it.
A namespace (``SKEWD_BENCH_NETNS_PREFIX``, default ``skwbench-``, removed at the end) gets four
veths: tbf, htb, pfifo and noqueue roots. At each rate, for ``--seconds`` each, one thread does:

- ``sampler``: netdev's QdiscSampler round (one send of a root-qdisc GET per queue-capable
  interface, the lean decoder; noqueue skipped), at the full rate: 3 interfaces;
- ``own dump``: a full RTM_GETQDISC dump decoded by netdev's own decoder (what collect() does);
- ``pyroute2``: ``IPRoute.get_qdiscs()`` (the peer: what a collector written with pyroute2 does).

Each figure is that thread's CPU time (``time.thread_time``) over wall time: % of one core, and
per round. Then the real sampler thread runs ``--seconds`` (at least 3) on the idle ports: its
2 Hz watch, what a port that never queues costs. The load average is printed because on a shared machine CPU per wake-up moves with it.
Goal: the default (20 Hz) costs well under the agent's 1 % budget. Exits non-zero only if it cannot
run (not root, no pyroute2).
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import threading
import time
from typing import Callable

from skewd.collectors.netdev import parse
from skewd.collectors.netdev.backlog import QueueBook
from skewd.collectors.netdev.collector import RtnlSocket
from skewd.collectors.netdev.sampler import QdiscSampler, open_rtnl

PREFIX = os.environ.get("SKEWD_BENCH_NETNS_PREFIX", "skwbench-")


def sh(*argv: str) -> None:
    subprocess.run(argv, check=True, capture_output=True, timeout=15)


def build(ns: str, peer: str) -> None:
    sh("ip", "netns", "add", ns)
    sh("ip", "netns", "add", peer)
    for i in range(4):
        sh("ip", "link", "add", f"qb{i}", "netns", ns, "type", "veth", "peer", "name", f"qp{i}", "netns", peer)
        sh("ip", "-n", ns, "link", "set", f"qb{i}", "up")
    sh("tc", "-n", ns, "qdisc", "add", "dev", "qb0", "root", "handle", "1:", "tbf", "rate", "300mbit",
       "burst", "32k", "latency", "1s")
    sh("tc", "-n", ns, "qdisc", "add", "dev", "qb1", "root", "handle", "1:", "htb", "default", "10")
    sh("tc", "-n", ns, "class", "add", "dev", "qb1", "parent", "1:", "classid", "1:10", "htb", "rate", "200mbit")
    sh("tc", "-n", ns, "qdisc", "add", "dev", "qb2", "root", "pfifo", "limit", "100")


def paced(fn: Callable[[], object], hz: float, seconds: float) -> tuple[float, float, int]:
    """Run ``fn`` hz times a second on a thread; (thread CPU s, wall s, rounds)."""
    out: dict[str, float] = {}

    def body() -> None:
        c0, w0, n = time.thread_time(), time.monotonic(), 0
        nxt = w0
        while time.monotonic() - w0 < seconds:
            fn()
            n += 1
            nxt += 1.0 / hz
            d = nxt - time.monotonic()
            if d > 0:
                time.sleep(d)
        out.update(cpu=time.thread_time() - c0, wall=time.monotonic() - w0, n=n)

    t = threading.Thread(target=body)
    t.start()
    t.join()
    return out["cpu"], out["wall"], int(out["n"])


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seconds", type=float, default=10.0)
    ap.add_argument("--rates", default="20,50,100")
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args(argv)
    if os.geteuid() != 0:
        print("qdisc sampler bench: needs root (network namespaces)", file=sys.stderr)
        return 1
    try:
        from pyroute2 import IPRoute
    except ImportError:
        print("qdisc sampler bench: needs pyroute2 (the peer)", file=sys.stderr)
        return 1
    ns, peer = f"{PREFIX}{os.getpid()}", f"{PREFIX}{os.getpid()}p"
    results = []
    load0 = os.getloadavg()[0]
    try:
        build(ns, peer)
        own = RtnlSocket(ns)
        names = parse.interface_names(own.links())
        roots = parse.root_qdiscs(own.qdiscs(), names)
        targets = {i: names[i] for i, k in roots.items() if k not in parse.QUEUELESS_KINDS and names[i] != "lo"}
        sampler = QdiscSampler(QueueBook(0.05), 20, lambda: open_rtnl(ns))
        sampler.set_targets(targets)
        with IPRoute(netns=ns, flags=0) as ipr:
            for hz in (float(x) for x in a.rates.split(",")):
                row = {"hz": hz}
                for name, fn in (("sampler", sampler.sample_once), ("own dump", own.qdiscs),
                                 ("pyroute2", ipr.get_qdiscs)):
                    cpu, wall, n = paced(fn, hz, a.seconds)
                    row[name] = {"pct_core": 100 * cpu / wall, "us_per_round": 1e6 * cpu / max(n, 1)}
                results.append(row)
                print(f"{hz:5.0f} Hz: " + "; ".join(
                    f"{k} {v['pct_core']:.3f} % of a core ({v['us_per_round']:.0f} us/round)"
                    for k, v in row.items() if k != "hz")
                    + f"; pyroute2 / sampler = {row['pyroute2']['pct_core'] / row['sampler']['pct_core']:.1f}x")
        sampler.stop()
        watch = QdiscSampler(QueueBook(0.05), 20, lambda: open_rtnl(ns))
        watch.set_targets(targets)
        watch.start()
        w0 = time.monotonic()
        time.sleep(max(a.seconds, 3.0))  # a few of its 0.25-0.75 s waits at least
        watch.stop()
        wall = time.monotonic() - w0
        results.append({"watch": {"pct_core": 100 * watch.cpu_seconds / wall, "rounds_per_s": watch.rounds / wall}})
        print(f"watch (no queue seen, sampler thread): {100 * watch.cpu_seconds / wall:.3f} % of a core, "
              f"{watch.rounds / wall:.1f} rounds/s")
        own.close()
    finally:
        for n in (ns, peer):
            subprocess.run(["ip", "netns", "del", n], capture_output=True)
    print(f"load average {load0:.2f} -> {os.getloadavg()[0]:.2f}; sampler targets: {sorted(targets.values())} "
          f"(noqueue and lo skipped)")
    if a.json:
        print(json.dumps({"benchmark": "qdisc_sampler", "results": results, "load": [load0, os.getloadavg()[0]]}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
