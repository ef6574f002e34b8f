"""Controller ingest: simulated agents' summaries through a real nats-server into the controller.

    python bench/controller_ingest.py [--warmup 40] [--seconds 20] [--nodes 1000] [--encoding binary|json] [--settle 1] [--json]
    python bench/controller_ingest.py --offline 4000 [--warm 40] [--seconds 10] [--encoding ...] [--settle 1] [--profile FILE]

The processes on this machine, as in production: ``nats-server`` (started here, JetStream in
a temporary directory), publisher processes playing ``--nodes`` agents (``--publishers``, 2
by default: one process is one thread, and it held back the peer; at ``--publisher-nice``,
+10 by default: it stands for agents on other hosts, so it takes the CPU the consumer leaves
rather than half of it, most of which the consumer would then shed) (each summary is what
a real agent publishes: the 22 summary signals of a GPU node, 20 collective burst starts,
topology labels; stamped with the wall clock when it is sent), and the consumer process(es).
``--encoding`` is the agents' ``publish.summary_encoding``: ``binary`` by default, what the
agents of a large cluster send (the shipped agent's default is ``json``, which every controller
version reads; docs/wire.md recommends ``binary`` for large clusters and deploy/kubernetes sets
it), the layout riding along every 10 s as the agent's default ``summary_layout_every`` has it;
``json`` measures the JSON path, the agents' default. The consumers:

* **skewd**: the real :class:`skewd.controller.service.Controller` (default config, shipped
  rule packs) subscribed as in production; every summary goes through its own callback
  (decode, schema check, topology, aligner, timelines, window store) and the group rules
  evaluate every second of the summaries' clock while summaries keep arriving;
* **peer**: a bare nats-py subscriber whose callback only counts (decoding excluded: it reads
  the sent time only), fed the same payloads in the same way: the transport's own ceiling.

Each consumer is measured twice: *saturation* (the publisher sends as fast as it can for
``--warmup`` + ``--seconds``; sustained rate = summaries handled / time from the first to the
last) and *latency* at a fixed offered rate (``--latency-rate``, default half the controller's
steady rate; percentiles of handled-time minus sent-time). A consumer that handled all it was
offered in the saturation run (less than 1 % lost or still queued) was held back by the
publishers, not its own speed: the report says so, its rate is a lower bound on its own, and a
ratio against a peer held back so may be overstated. Summaries handled in the consumer's
first ``--warmup`` seconds (nodes joining, the 30 s alignment window filling, the rules'
warm-up, so no group rule evaluates yet) are counted apart from the rest (steady state); each
phase reports its rate, the consumer process's own CPU time per summary and the cores it used.
Goal: >= 50,000 summaries/s on 2 cores. Exits non-zero only if it could not run.

``--offline RATE``: no NATS and no other process; the controller's own CPU per summary at RATE
summaries per second of the summaries' clock, warm-up and steady state apart (the ceiling on
one core, independent of how busy the machine is).
"""
from __future__ import annotations

import argparse
import asyncio
import functools
import json
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

CLUSTER = "bench"
SIGNALS = {  # plausible values for a busy 8-GPU node (invented for the benchmark)
    "summary_gpu_util_mean_ratio": 0.82, "summary_gpu_util_min_ratio": 0.74, "summary_gpu_power_watts": 5200.0,
    "summary_gpu_throttled": 0.0, "summary_pcie_rx_bytes_per_second": 1.2e10,
    "summary_rdma_xmit_bytes_per_second": 6.4e9, "summary_rdma_rcv_bytes_per_second": 6.3e9,
    "summary_rdma_xmit_wait_per_second": 120.0, "summary_rdma_ecn_marked_per_second": 3.0,
    "summary_rdma_cnp_sent_per_second": 2.0, "summary_rdma_retrans_per_second": 0.0,
    "summary_net_rx_bytes_per_second": 1.1e9, "summary_net_tx_bytes_per_second": 9.0e8,
    "summary_kv_cache_usage_ratio": 0.61, "summary_requests_waiting": 4.0, "summary_requests_running": 96.0,
    "summary_cpu_busy_cores": 11.5, "summary_engine_phase": 1.0, "summary_burst_start_seconds": 0.0,
    "summary_burst_bytes": 6.4e7, "summary_ingress_bytes_per_second": 1.0e9, "summary_ingress_gap_p99_seconds": 2e-4,
}
BURSTS = 20  # collective burst starts per summary (a 50 ms decode step)
TP = 8  # nodes per TP group (topology labels)


# ---------------------------------------------------------------------------------------------
# payloads
# ---------------------------------------------------------------------------------------------

#: seconds of summary time between the binary summaries that carry their layout (the agent's
#: default publish.summary_layout_every)
LAYOUT_EVERY = 10.0


class BinaryTemplate:
    """What a node's binary summaries share (what the agent's SummaryEncoder would write for the
    same signals, labels and bursts, without building a Summary per message), and when its
    layout last rode along."""

    def __init__(self, node: str, labels: dict[str, str]) -> None:
        import numpy as np

        from skewd import __version__, wire

        self.node, self.labels, self.version = node, labels, __version__
        self.layout = wire.make_layout({k: [""] for k in SIGNALS})
        self.values = np.array([SIGNALS[k] for k in self.layout.names], dtype="<f8").tobytes()
        self.sent = -float("inf")


def templates(nodes: int, encoding: str = "json") -> list[tuple[str, Any]]:
    """(subject, JSON pieces or a :class:`BinaryTemplate`) per node; the publisher splices in
    the time and burst starts."""
    import re

    from skewd import __version__, wire

    out: list[tuple[str, Any]] = []
    for i in range(nodes):
        node = f"node{i:05d}"
        sig = {k: {"": v} for k, v in SIGNALS.items()}
        msg = wire.Summary(node=node, cluster=CLUSTER, t=1.0e9, interval=1.0, signals=sig,
                           clock_sync=wire.ClockSync(True, 0.0005), agent_version=__version__)
        d = wire.to_dict(msg)
        d["labels"] = {"tp_group": f"tp{i // TP}", "tp_rank": str(i % TP), "model": "m1"}
        d["signals"]["collective_burst_starts"] = "@B@"
        d["t"] = "@T@"
        d["interval"] = "@I@"
        text = json.dumps(d, sort_keys=True, separators=(",", ":"))
        parts: list[bytes | str] = [p.encode() if k % 2 == 0 else p.strip('"@')
                                    for k, p in enumerate(re.split(r'("@[TBI]@")', text))]
        # published as an agent with a tp_group label does: the group is the placement token
        subject = wire.summary_subject(CLUSTER, node, d["labels"]["tp_group"])
        out.append((subject, parts if encoding == "json" else BinaryTemplate(node, d["labels"])))
    return out


def payload(tpl: tuple, t: float, interval: float, settle: float = 0.0) -> bytes:
    """The summary a node sends at ``t`` covering ``interval`` seconds: the decode steps (on a
    50 ms grid of absolute time) whose collective bursts started in that interval, or in the
    interval ``settle`` seconds earlier (an agent reports a step once it has settled, a second
    or more after it started: agent/steps.py ``settled_steps``)."""
    step = 1.0 / BURSTS
    k0 = int((t - settle - interval) / step) + 1
    k1 = int((t - settle) / step)
    if isinstance(tpl[1], BinaryTemplate):
        from skewd import wire

        b = tpl[1]
        carry = not t - b.sent < LAYOUT_EVERY
        if carry:
            b.sent = t
        return wire.pack(wire.BinarySummary(CLUSTER, b.node, t, interval, True, 0.0005, b.version, b.labels,
                                            b.layout.id, b.layout.raw if carry else b"", b.values,
                                            _steps(k0, k1, True), b""))
    fill = {"T": repr(t).encode(), "I": repr(interval).encode(), "B": _steps(k0, k1, False)}
    return b"".join(fill[p] if isinstance(p, str) else p for p in tpl[1])


@functools.lru_cache(maxsize=64)
def _steps(k0: int, k1: int, binary: bool) -> bytes:
    """The burst starts of steps k0..k1 (float64 run, or JSON object). Every node's summary
    covers the same seconds, so the publisher builds each run once, not once per summary: the
    1,000 simulated agents share the machine with the consumer they measure, and a load
    generator spending the CPU of the consumer under test understates the consumer."""
    step = 1.0 / BURSTS
    if binary:
        import numpy as np

        return np.round(np.arange(k0, k1 + 1) * step + 0.0003, 6).astype("<f8").tobytes()
    return ("{" + ",".join(f'"{j}":{k * step + 0.0003:.6f}' for j, k in enumerate(range(k0, k1 + 1))) + "}").encode()


# ---------------------------------------------------------------------------------------------
# roles (child processes)
# ---------------------------------------------------------------------------------------------

def _cpu() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


async def role_publisher(url: str, nodes: int, seconds: float, rate: float, encoding: str = "json",
                         settle: float = 0.0, part: int = 0, parts: int = 1) -> dict:
    import nats

    tpls = templates(nodes, encoding)[part::parts]  # this process's share of the agents
    nodes = len(tpls)
    nc = await nats.connect(url, pending_size=64 * 1024 * 1024)
    print("ready", flush=True)
    await asyncio.get_running_loop().run_in_executor(None, sys.stdin.readline)  # go
    sent = 0
    nbytes = 0
    t0 = time.time()
    end = t0 + seconds
    pub = nc.publish
    last = [t0 - 1.0] * nodes  # each node's previous summary: the next one covers the time since
    i = 0
    while True:
        now = time.time()
        if now >= end:
            break
        if rate > 0:
            due = int((now - t0) * rate) - sent
            if due <= 0:
                await asyncio.sleep(0.0005)
                continue
        else:
            due = 500
        for _ in range(due):
            tpl = tpls[i]
            t = time.time()
            data = payload(tpl, t, min(10.0, max(1e-3, t - last[i])), settle)
            last[i] = t
            i = (i + 1) % nodes
            await pub(tpl[0], data)
            nbytes += len(data)
        sent += due
        if rate <= 0:
            await asyncio.sleep(0)  # let the flusher run
    await nc.flush(timeout=30)
    el = time.time() - t0
    await nc.close()
    return {"sent": sent, "seconds": el, "bytes": nbytes}


class Recorder:
    """Counts handled summaries and their latency (handled wall time minus sent time), in two
    phases of the consumer's own time: the first ``warm`` seconds after it handled its first
    summary (nodes join, the alignment window fills, the rules' warm-up passes, the store's
    blocks and layouts are made) and the rest (steady state). By handling time, not sending
    time: a saturated consumer's client drops the newest summaries, so it may never handle one
    sent after the warm-up. The process's CPU time is read where the phases meet."""

    def __init__(self, warm: float = 0.0, on_steady=None) -> None:
        self.warm = warm
        self.on_steady = on_steady
        self.until = None  # sent time where the steady phase begins
        self.ph = {"warm": self._phase(), "steady": self._phase()}
        self.cpu0 = _cpu()

    @staticmethod
    def _phase() -> dict:
        return {"n": 0, "first": None, "last": 0.0, "lat": [], "cpu0": None, "extra0": None}

    def hit(self, t_sent: float) -> None:
        now = time.time()
        if self.until is None:
            self.until = now + self.warm
            self.ph["warm"]["cpu0"] = self.cpu0
        ph = self.ph["warm" if now < self.until else "steady"]
        if ph["first"] is None:
            ph["first"] = now
            if ph["cpu0"] is None:
                ph["cpu0"] = _cpu()
                self.ph["warm"]["cpu1"] = ph["cpu0"]
                self.ph["warm"]["end"] = now
                if self.on_steady is not None:
                    ph["extra0"] = self.on_steady()
        ph["last"] = now
        ph["n"] += 1
        ph["lat"].append(now - t_sent)

    def result(self, extra=None) -> dict:
        import numpy as np

        # the run ends here: the CPU and the counters are read before the latencies are summed
        # up. That takes the interpreter for a while (millions of latencies), so a tick that is
        # still running meanwhile waits for it: read after, a 1-worker tick of 17 ms of CPU
        # counted as 164 ms (docs/benchmarks.md, run H)
        cpu_end = _cpu()
        now_extra = extra() if extra is not None else None
        out: dict = {}
        for name, ph in self.ph.items():
            lat = np.array(ph["lat"]) if ph["lat"] else np.array([np.nan])
            span = (ph["last"] - ph["first"]) if ph["first"] is not None else 0.0
            cpu = (ph.get("cpu1", cpu_end) - ph["cpu0"]) if ph["cpu0"] is not None else 0.0
            wall = (ph.get("end", ph["last"]) - ph["first"]) if ph["first"] is not None else 0.0
            out[name] = {"handled": ph["n"], "span_s": span, "rate": ph["n"] / span if span > 0 else 0.0,
                         "lat_p50_ms": float(np.percentile(lat, 50) * 1e3),
                         "lat_p99_ms": float(np.percentile(lat, 99) * 1e3), "lat_max_ms": float(np.max(lat) * 1e3),
                         "cpu_s": cpu, "cpu_us_per_summary": cpu / ph["n"] * 1e6 if ph["n"] else 0.0,
                         "cores": cpu / wall if wall > 0 else 0.0}
        if now_extra is not None:  # counters: the warm phase up to the steady phase's first summary, then the rest
            snap = self.ph["steady"]["extra0"]
            out["warm"].update(snap if snap is not None else now_extra)
            out["steady"].update({k: (v - snap[k] if snap is not None and k in ("ticks", "tick_total_s", "evaluations", "leader_ticks")
                                      else v) for k, v in now_extra.items()})
        # the whole run, as before: everything handled from the first to the last
        allp = [p for p in self.ph.values() if p["first"] is not None]
        n = sum(p["n"] for p in allp)
        first = min((p["first"] for p in allp), default=None)
        last = max((p["last"] for p in allp), default=0.0)
        out["handled"] = n
        out["rate"] = n / (last - first) if first is not None and last > first else 0.0
        out["cpu_s"] = cpu_end - self.cpu0
        return out



def _count_ingests(ctl: Any, rec: "Recorder") -> None:
    """Count every summary the controller takes in, JSON or binary (timed from outside)."""
    json_ingest, binary_ingest = ctl.ingest_summary, ctl.ingest_binary

    def ingest(s, labels=None):
        json_ingest(s, labels)
        rec.hit(s.t)

    def ingest_binary(h, *a):
        binary_ingest(h, *a)
        rec.hit(h.t)

    ctl.ingest_summary = ingest
    ctl.ingest_binary = ingest_binary


def _time_compute(ctl: Any) -> list[float]:
    """Wrap the controller's tick computation (on the tick thread, evaluation.py) so its wall
    time adds up in the returned cell: a tick through NATS is its steps on the event loop plus
    this (awaiting the thread would otherwise read as a near-zero tick)."""
    orig = ctl._compute
    cell = [0.0, 0.0]  # wall, and the tick thread's own CPU time (what it took less what it waited for the GIL)

    def compute(*a: Any, **k: Any) -> Any:
        c, u = time.perf_counter(), time.thread_time()  # (the CPU reading nested in the wall one)
        try:
            return orig(*a, **k)
        finally:
            cell[1] += time.thread_time() - u
            cell[0] += time.perf_counter() - c

    ctl._compute = compute
    return cell

def _time_worker_parts(ctl: Any) -> dict[str, float]:
    """Wall seconds of a scaled-out controller's tick parts, summed until cleared (at each
    tick): on the tick thread the digests' intake (leader), the store flush, alignment, the
    ctl_* ingest and the rules; on the event loop the digest's publication (partition), the
    engine's save and correlation and planning (leader): those three (``*_await``) include
    the time they await (a KV write's round trip), which blocks nothing."""
    import collections
    import functools

    parts: dict[str, float] = collections.Counter()
    clock = time.perf_counter

    def timed(name, fn):
        if asyncio.iscoroutinefunction(fn):
            @functools.wraps(fn)
            async def arun(*a, **k):
                c = clock()
                try:
                    return await fn(*a, **k)
                finally:
                    parts[name] += clock() - c
            return arun

        @functools.wraps(fn)
        def run(*a, **k):
            c = clock()
            try:
                return fn(*a, **k)
            finally:
                parts[name] += clock() - c
        return run

    ctl._take_digests = timed("take_digests", ctl._take_digests)
    ctl.feed.flush = timed("flush", ctl.feed.flush)
    ctl.aligner.derive = timed("align", ctl.aligner.derive)
    ctl.feed.ingest_derived = timed("ctl_ingest", ctl.feed.ingest_derived)
    ctl.engine.evaluate = timed("rules", ctl.engine.evaluate)
    ctl._publish_digest = timed("publish_digest_await", ctl._publish_digest)
    ctl._save_engine = timed("save_engine_await", ctl._save_engine)
    ctl._correlate_and_plan = timed("correlate_await", ctl._correlate_and_plan)
    return parts


async def role_controller(url: str, warm: float) -> dict:
    from skewd.controller.config import load_config
    from skewd.controller.service import Controller

    cfg = load_config(None, env={}, overrides={"cluster": CLUSTER, "nats": {"servers": url},
                                              "log": {"level": "error"}})
    ctl = Controller(cfg)
    ticks: list[float] = []

    mark: list[int] = []

    def steady_start() -> dict:
        snap = extra()
        mark[:] = [len(ticks)]
        return snap

    def extra() -> dict:
        return {"ticks": len(ticks), "tick_total_s": sum(ticks), "tick_max_s": max(ticks[(mark or [0])[0]:], default=0.0),
                "evaluations": ctl.stats.evaluations, "rejected": ctl.stats.summaries_rejected,
                "tp_groups": len(ctl.topology.tp_groups()), "errors": ctl.stats.errors, "nodes": len(ctl.aligner.clocks)}

    rec = Recorder(warm, on_steady=steady_start)
    _count_ingests(ctl, rec)
    orig_tick = ctl.tick
    computed = _time_compute(ctl)

    async def tick(t: float) -> None:  # evaluation time per grid second, while summaries arrive
        computed[0] = 0.0
        b = Busy(orig_tick(t))
        await b
        ticks.append(b.total + computed[0])  # on the loop plus on the tick thread

    ctl.tick = tick  # type: ignore[method-assign]
    await ctl.start()
    return await _serve(rec, extra=extra)


class Busy:
    """Awaits a coroutine and adds up the time it runs, not the time it waits: a tick that
    awaits (its computation on the tick thread, KV writes) lets summaries in meanwhile, and
    their handling is not the tick's (the roles add the tick thread's time to the tick). What blocks the loop is the longest single step
    (``longest``); the tick's own work is ``total``."""

    def __init__(self, coro) -> None:
        self.coro, self.total, self.longest, self.cpu = coro, 0.0, 0.0, 0.0

    def __await__(self):
        it = self.coro.__await__()
        send, exc = None, None
        while True:
            a, u = time.perf_counter(), time.thread_time()
            try:
                y = it.throw(exc) if exc is not None else it.send(send)
            except StopIteration as done:
                self.cpu += time.thread_time() - u  # (nested in the wall reading)
                self._add(time.perf_counter() - a)
                return done.value
            self.cpu += time.thread_time() - u
            self._add(time.perf_counter() - a)
            try:
                send, exc = (yield y), None
            except BaseException as e:  # noqa: BLE001 - handed to the coroutine, as await would
                send, exc = None, e

    def _add(self, d: float) -> None:
        self.total += d
        self.longest = max(self.longest, d)


async def role_worker(url: str, warm: float, workers: int, partitions: int) -> dict:
    """One worker of a scaled-out controller (controller/scaleout.py), as ``skewd controller``
    runs it with ``scaleout.partitions``: ready once it holds its even share of the partitions.
    Every partition controller's summaries and ticks are timed, and the leader's ticks."""
    from skewd.controller.config import load_config
    from skewd.controller.scaleout import Worker

    cfg = load_config(None, env={}, overrides={
        "cluster": CLUSTER, "nats": {"servers": url}, "log": {"level": "error"}, "metrics": {"listen": ""},
        "controller_id": f"bench-{os.getpid()}", "scaleout": {"partitions": partitions, "lease": "3s"}})
    w = Worker(cfg)
    ticks: list[float] = []
    leader_ticks: list[float] = []
    blocked: list[float] = []  # the longest stretch a tick kept the event loop to itself
    seen: set[int] = set()

    parts_of: dict[int, list[dict]] = {}  # id(tick list) → each tick's parts (ms), with its total
    cpu_of: dict[int, list[float]] = {}  # id(tick list) → each tick's CPU seconds

    def instrument(ctl, into: list[float]) -> None:
        if id(ctl) in seen:
            return
        seen.add(id(ctl))
        if into is ticks:
            _count_ingests(ctl, rec)
        orig_tick = ctl.tick
        computed = _time_compute(ctl)
        parts = _time_worker_parts(ctl)

        async def tick(t: float) -> None:
            computed[:] = [0.0, 0.0]
            parts.clear()
            b = Busy(orig_tick(t))
            await b
            # the tick: its steps on the event loop plus its computation on the tick thread
            # (which the loop does not wait for: that is what blocked measures); wall time, and
            # the CPU time its threads spent on it (wall less the waits for the GIL and the cores)
            into.append(b.total + computed[0])
            cpu_of.setdefault(id(into), []).append(b.cpu + computed[1])
            blocked.append(b.longest)
            parts_of.setdefault(id(into), []).append(
                {"total": (b.total + computed[0]) * 1e3, "cpu": (b.cpu + computed[1]) * 1e3, "loop_max": b.longest * 1e3,
                 **{k: v * 1e3 for k, v in parts.items()}})

        ctl.tick = tick

    mark: list[int] = []  # lengths of the tick lists when the steady phase began

    def steady_start() -> dict:
        snap = extra()
        mark[:] = [len(ticks), len(leader_ticks), len(blocked)]
        return snap

    def extra() -> dict:
        ctls = list(w.controllers())
        t0, l0, b0 = mark or (0, 0, 0)  # maxima of the current phase
        longest = {name: sorted(parts_of.get(id(lst), [])[start:], key=lambda p: -p["total"])[:3]
                   for name, lst, start in (("partition", ticks, t0), ("leader", leader_ticks, l0))}
        return {"ticks": len(ticks), "tick_total_s": sum(ticks), "tick_max_s": max(ticks[t0:], default=0.0),
                "leader_ticks": len(leader_ticks), "leader_tick_max_s": max(leader_ticks[l0:], default=0.0),
                "tick_cpu_max_s": max(cpu_of.get(id(ticks), [])[t0:], default=0.0),
                "leader_tick_cpu_max_s": max(cpu_of.get(id(leader_ticks), [])[l0:], default=0.0),
                "tick_block_max_s": max(blocked[b0:], default=0.0), "longest_ticks": longest,
                "evaluations": sum(c.stats.evaluations for c in ctls),
                "rejected": sum(c.stats.summaries_rejected for c in ctls), "errors": sum(c.stats.errors for c in ctls),
                "partitions": sorted(w.partitions), "leader": w.leader is not None,
                "nodes": sum(len(c.aligner.clocks) for c in w.partitions.values()),  # heard
                "tp_groups": sum(len({g.name for n in c.aligner.clocks if (g := c.topology.group_of(n))})
                                 for c in w.partitions.values())}

    rec = Recorder(warm, on_steady=steady_start)
    orig_rebalance = w.rebalance

    async def rebalance() -> None:  # controllers start inside lease rounds: time them from their start
        await orig_rebalance()
        for ctl in w.partitions.values():
            instrument(ctl, ticks)
        if w.leader is not None:
            instrument(w.leader, leader_ticks)

    w.rebalance = rebalance  # type: ignore[method-assign]
    await w.start()
    deadline = time.monotonic() + 60
    while len(w.partitions) < partitions // workers and time.monotonic() < deadline:
        await asyncio.sleep(0.2)
    return await _serve(rec, extra=extra)


async def role_raw(url: str, warm: float) -> dict:
    import msgspec
    import nats
    from skewd import wire

    rec = Recorder(warm)
    nc = await nats.connect(url)
    import re

    tpos = re.compile(rb'"t":([0-9.e+-]+)')

    class Head(msgspec.Struct, array_like=True):  # a binary summary's first fields: the rest is skipped
        cluster: str
        node: str
        t: float

    head = msgspec.msgpack.Decoder(Head)

    async def cb(msg) -> None:  # count, and read the sent time without decoding the summary
        data = msg.data
        rec.hit(head.decode(data[4:]).t if data[:1] == b"\x93" else float(tpos.search(data).group(1)))

    for subject in wire.summary_filters(CLUSTER):
        await nc.subscribe(subject, cb=cb)
    await nc.flush()
    return await _serve(rec, extra=None)


async def _serve(rec: Recorder, extra) -> dict:
    """Run until told to stop; then report from a watchdog thread and exit at once, so a
    consumer stuck in a long evaluation (or with a deep backlog) still answers."""
    import logging
    import threading

    logging.getLogger("nats").setLevel(logging.CRITICAL)

    prof = None
    if os.environ.get("SKEWD_BENCH_PROFILE"):  # where a consumer's CPU goes: a cProfile dump per process
        import cProfile

        prof = cProfile.Profile()
        prof.enable()

    def watchdog() -> None:
        sys.stdin.readline()
        if prof is not None:
            prof.disable()
            prof.dump_stats(f"{os.environ['SKEWD_BENCH_PROFILE']}.{os.getpid()}")
        res = rec.result(extra)
        sys.stdout.write(json.dumps(res) + "\n")
        sys.stdout.flush()
        os._exit(0)

    threading.Thread(target=watchdog, daemon=True).start()
    print("ready", flush=True)
    await asyncio.Event().wait()
    return {}


# ---------------------------------------------------------------------------------------------
# orchestration
# ---------------------------------------------------------------------------------------------

class CannotRun(Exception):
    pass


def _child(args: list[str], nice: int = 0) -> subprocess.Popen:
    p = subprocess.Popen([sys.executable, str(Path(__file__).resolve()), *args], stdin=subprocess.PIPE,
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                         preexec_fn=(lambda: os.nice(nice)) if nice else None)
    line = p.stdout.readline().strip()
    if line != "ready":
        p.kill()
        raise CannotRun(f"{args[1]} did not start: {line}\n{p.stderr.read()[-3000:]}")
    return p


def _finish(p: subprocess.Popen, timeout: float) -> dict:
    out, err = p.communicate("stop\n", timeout=timeout)
    if p.returncode != 0:
        raise CannotRun(f"child failed:\n{err[-3000:]}")
    return json.loads(out.strip().splitlines()[-1])


#: the share of the sent summaries a saturated consumer leaves unhandled, at least (shed or
#: still queued at the end); one that handles more was held back by its load, not its own speed
SATURATED_LOSS = 0.01


def measure(url: str, consumer: str, nodes: int, seconds: float, rate: float, warm: float,
            workers: int = 0, partitions: int = 1, encoding: str = "binary", settle: float = 0.0,
            publisher_nice: int = 0, publishers: int = 1) -> dict:
    if workers:
        conss = [_child(["--role", "worker", "--url", url, "--warmup", str(warm), "--workers", str(workers),
                         "--partitions", str(partitions)]) for _ in range(workers)]
    else:
        conss = [_child(["--role", consumer, "--url", url, "--warmup", str(warm)])]
    pubs: list[subprocess.Popen] = []
    try:
        for j in range(publishers):
            pubs.append(_child(["--role", "publisher", "--url", url, "--nodes", str(nodes), "--seconds", str(seconds),
                                "--rate", str(rate / publishers), "--encoding", encoding, "--settle", str(settle),
                                "--publisher-part", f"{j}/{publishers}"], nice=publisher_nice))
        try:
            for pub in pubs:  # all start together
                pub.stdin.write("go\n")
                pub.stdin.flush()
            done = [_finish(pub, seconds + 120) for pub in pubs]
        finally:
            for pub in pubs:
                if pub.poll() is None:
                    pub.kill()
        p = {"sent": sum(d["sent"] for d in done), "seconds": max(d["seconds"] for d in done),
             "bytes": sum(d["bytes"] for d in done)}
        time.sleep(2.0)  # what is still in flight arrives; a backlog beyond that is not counted
        parts = [_finish(c, 60) for c in conss]
    finally:
        for c in conss:
            if c.poll() is None:
                c.kill()
    c = parts[0] if len(parts) == 1 else _combine(parts)
    c["workers"] = workers
    c["sent"] = p["sent"]
    c["offered_rate"] = p["sent"] / p["seconds"]
    c["bytes_per_msg"] = p["bytes"] / max(1, p["sent"])
    c["lost"] = p["sent"] - c["handled"]
    # a consumer that handled (nearly) all it was offered was not saturated: its rate is the
    # publishers' (a lower bound on its own). On 2 cores that happens when the consumer's
    # processes leave the niced publishers too little CPU to outrun them.
    c["saturated"] = c["lost"] > SATURATED_LOSS * p["sent"]
    return c


def _combine(parts: list[dict]) -> dict:
    """Workers measured side by side: rates and CPU add up, latency and ticks take the worst."""
    out: dict = {"handled": sum(p["handled"] for p in parts), "cpu_s": sum(p["cpu_s"] for p in parts),
                 "rate": sum(p["rate"] for p in parts), "per_worker": parts}
    for ph in ("warm", "steady"):
        q = [p[ph] for p in parts]
        n = sum(x["handled"] for x in q)
        cpu = sum(x["cpu_s"] for x in q)
        out[ph] = {"handled": n, "rate": sum(x["rate"] for x in q), "cpu_s": cpu,
                   "cpu_us_per_summary": cpu / n * 1e6 if n else 0.0, "cores": sum(x["cores"] for x in q),
                   "lat_p50_ms": max(x["lat_p50_ms"] for x in q), "lat_p99_ms": max(x["lat_p99_ms"] for x in q),
                   "lat_max_ms": max(x["lat_max_ms"] for x in q)}
        for k in ("ticks", "tick_total_s", "evaluations", "leader_ticks", "rejected", "errors", "tp_groups", "nodes"):
            if k in q[0]:
                out[ph][k] = sum(x.get(k, 0) for x in q)
        for k in ("tick_max_s", "leader_tick_max_s", "tick_block_max_s", "tick_cpu_max_s", "leader_tick_cpu_max_s"):
            if k in q[0]:
                out[ph][k] = max(x.get(k, 0.0) for x in q)
        if "longest_ticks" in q[0]:
            out[ph]["longest_ticks"] = {name: sorted((t for x in q for t in x["longest_ticks"].get(name, [])),
                                                     key=lambda t: -t["total"])[:3]
                                        for name in ("partition", "leader")}
    return out


class _Msg:
    __slots__ = ("subject", "data")

    def __init__(self, subject: str, data: bytes) -> None:
        self.subject, self.data = subject, data


def offline(nodes: int, rate: float, seconds: float, warm: float, profile: str | None = None,
            gc_freeze: bool = True, encoding: str = "binary", settle: float = 0.0) -> dict:
    """The controller's own CPU per summary, without NATS: the same payloads handed to its
    summary callback in one process, ``rate`` summaries per second of the summaries' clock
    (round-robin over the nodes, as the publisher sends them), the evaluation ticks run as the
    watermark passes them. The first ``warm`` seconds of summary time (new nodes, the alignment
    window filling, the rules' warm-up) are measured apart from the rest (steady state)."""
    import cProfile

    from skewd.controller.config import load_config
    from skewd.controller.service import Controller
    from skewd.controller.offline import CaptureJetStream, MemoryState

    # the summaries' clock runs from 1.7e9 at whatever rate is asked, not this machine's: the
    # clock check against the controller's (ingest.max_clock_skew) is off, as for a replay
    cfg = load_config(None, env={}, overrides={"cluster": CLUSTER, "log": {"level": "error"},
                                              "ingest": {"max_clock_skew": "0s"}})
    ctl = Controller(cfg, wall_clock=lambda: 0.0)
    ctl.gc_policy.enabled = gc_freeze  # as a started controller (`skewd controller`) does
    ctl.state = MemoryState(CLUSTER)
    ctl.js = CaptureJetStream()
    parts = _time_tick_parts(ctl)
    tpls = templates(nodes, encoding)
    loop = asyncio.new_event_loop()
    t0 = 1.7e9
    last = [t0 - 1.0] * nodes
    total = int(rate * (warm + seconds))
    phases = {"warm": [0.0, 0.0, 0, 0, 0.0], "steady": [0.0, 0.0, 0, 0, 0.0]}  # ingest s, tick s, n, ticks, tick max
    prof = cProfile.Profile() if profile else None
    cpu = time.process_time
    per_tick: list[dict] = []

    async def drive() -> None:
        # one coroutine awaiting the callback per summary, as nats-py's subscription task does
        # (a run_until_complete per summary added ~6 us of event-loop set-up to every figure)
        i = 0
        for k in range(total):
            t = t0 + k / rate
            ph = phases["warm" if t - t0 < warm else "steady"]
            if ph is phases["steady"] and k and (t - 1 / rate) - t0 < warm:
                parts.clear()  # the tick's parts: steady state only
            if prof is not None and ph is phases["steady"] and k and (t - 1 / rate) - t0 < warm:
                prof.enable()
            msg = _Msg(tpls[i][0], payload(tpls[i], t, min(10.0, max(1e-3, t - last[i])), settle))
            last[i] = t
            i = (i + 1) % nodes
            a = cpu()
            await ctl._on_summary(msg)
            b = cpu()
            ph[0] += b - a
            ph[2] += 1
            if ctl.next_eval is not None and ctl.watermark >= ctl.next_eval:
                before = dict(parts)
                await ctl.evaluate_due()
                c = cpu() - b
                ph[1] += c
                ph[3] += 1
                ph[4] = max(ph[4], c)
                if ph is phases["steady"]:  # this tick's parts: which of them make a long tick
                    per_tick.append({"t": round(t - t0, 2), "total": c * 1e3,
                                     **{k: (v - before.get(k, 0.0)) * 1e3 for k, v in parts.items()}})

    loop.run_until_complete(drive())
    if prof is not None:
        prof.disable()
        prof.dump_stats(profile)
    loop.close()
    out = {"nodes": nodes, "rate": rate, "encoding": encoding, "settle_s": settle, "warm_s": warm, "steady_s": seconds,
           "evaluations": ctl.stats.evaluations, "rejected": ctl.stats.summaries_rejected, "errors": ctl.stats.errors}
    nt = max(1, phases["steady"][3])
    out["steady_tick_parts_ms"] = {k: v / nt * 1e3 for k, v in parts.items()}
    out["steady_tick_parts_max_ms"] = {k: max((p.get(k, 0.0) for p in per_tick), default=0.0)
                                       for k in ("total", *parts)}
    out["steady_flush_max_ms"] = parts.longest_flush * 1e3
    out["steady_longest_ticks"] = sorted(per_tick, key=lambda p: -p["total"])[:3]
    for name, (ing, tk, n, nt, mx) in phases.items():
        out[name] = {"summaries": n, "ingest_us": ing / max(1, n) * 1e6, "ticks": nt,
                     "tick_mean_ms": tk / max(1, nt) * 1e3, "tick_max_ms": mx * 1e3,
                     "cpu_us_per_summary": (ing + tk) / max(1, n) * 1e6,
                     "one_core_rate": n / (ing + tk) if ing + tk > 0 else 0.0}
    return out


def _time_tick_parts(ctl) -> dict[str, float]:
    """CPU seconds of the tick's parts (alignment, the group rules, the ctl_* ingest, the
    store flush: in the tick or between ticks when FLUSH_ROWS pile up), summed until cleared."""
    import collections
    import functools

    class Parts(collections.Counter):
        longest_flush = 0.0  # the longest single flush (in a tick or between ticks) since cleared

        def clear(self) -> None:
            super().clear()
            self.longest_flush = 0.0

    parts = Parts()
    cpu = time.process_time

    def timed(name, fn):
        @functools.wraps(fn)
        def run(*a, **k):
            c = cpu()
            try:
                return fn(*a, **k)
            finally:
                parts[name] += cpu() - c
        return run

    derive_steps = ctl.aligner.derive_steps

    def steps(*a, **k):  # a generator: time each step of it
        g = derive_steps(*a, **k)
        while True:
            c = cpu()
            try:
                name = next(g)
            except StopIteration as done:
                parts["align"] += cpu() - c
                return done.value
            parts["align"] += cpu() - c
            yield name

    ctl.aligner.derive_steps = steps
    ctl.engine.evaluate = timed("rules", ctl.engine.evaluate)
    ctl.feed.ingest_derived = timed("ctl_ingest", ctl.feed.ingest_derived)
    flush = ctl.feed.flush

    def timed_flush(*a, **k):
        c = cpu()
        try:
            return flush(*a, **k)
        finally:
            d = cpu() - c
            parts["flush"] += d
            parts.longest_flush = max(parts.longest_flush, d)

    ctl.feed.flush = timed_flush
    return parts


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seconds", type=float, default=20.0, help="steady-state sending time per measurement")
    ap.add_argument("--warmup", type=float, default=40.0,
                    help="sending time before it; the consumer's first WARMUP s are measured apart "
                         "(alignment window 30 s + rule warm-up 10 s)")
    ap.add_argument("--nodes", type=int, default=1000, help="simulated agents (TP groups of 8)")
    ap.add_argument("--latency-rate", type=float, default=0.0,
                    help="offered summaries/s for the latency runs (0: half the controller's sustained rate)")
    ap.add_argument("--json", action="store_true", help="also print the figures as one JSON line")
    ap.add_argument("--workers", default="1,2,4",
                    help="comma-separated worker counts to measure (scaled-out controller, controller/scaleout.py); "
                         "0 = the single-process controller (scaleout.partitions 1)")
    ap.add_argument("--partitions", type=int, default=8, help="summary partitions of the server mapping")
    ap.add_argument("--role", choices=("publisher", "controller", "raw", "worker"), help=argparse.SUPPRESS)
    ap.add_argument("--url", help=argparse.SUPPRESS)
    ap.add_argument("--rate", type=float, default=0.0, help=argparse.SUPPRESS)
    ap.add_argument("--offline", type=float, default=0.0, metavar="RATE",
                    help="no NATS: the controller's own CPU per summary at RATE summaries/s of summary time "
                         "(warm-up and steady state apart)")
    ap.add_argument("--warm", type=float, default=40.0, help="--offline: seconds of summary time counted as warm-up")
    ap.add_argument("--profile", help="--offline: cProfile the steady state into this file")
    ap.add_argument("--encoding", choices=("json", "binary"), default="binary",
                    help="how the simulated agents publish summaries (publish.summary_encoding); default binary, "
                         "what docs/wire.md recommends and deploy/kubernetes sets for a large cluster")
    ap.add_argument("--settle", type=float, default=1.0, metavar="SECONDS",
                    help="the simulated agents report each step this long after it started, as agents do "
                         "(agent/steps.py: max(1 s, two step periods)); 0: in the summary of its interval "
                         "(figures before 2026-11-27 18:00 UTC)")
    ap.add_argument("--publisher-nice", type=int, default=10, metavar="N",
                    help="the simulated agents' process runs at this nice value (they stand for other hosts: "
                         "it uses the cores the consumer leaves instead of taking half of them and having the "
                         "excess shed); 0: equal priority (the figures before 2026-11-27 20:30 UTC)")
    ap.add_argument("--publishers", type=int, default=2, metavar="N",
                    help="the simulated agents spread over N publisher processes (node i in process i %% N), "
                         "each at --publisher-nice; 1: the figures before 2026-11-28 16:40 UTC, when one "
                         "process (one thread) held back the peer and the scaled-out workers: with 2 the "
                         "peer handled 22-32 %% more (docs/benchmarks.md)")
    ap.add_argument("--publisher-part", default="0/1", help=argparse.SUPPRESS)
    ap.add_argument("--no-gc-freeze", action="store_true",
                    help="--offline: leave CPython's collector as it is (a started controller freezes "
                         "its long-lived objects once warm: controller/gcpolicy.py)")
    a = ap.parse_args(argv)
    if a.offline:
        r = offline(a.nodes, a.offline, a.seconds, a.warm, a.profile, gc_freeze=not a.no_gc_freeze,
                    encoding=a.encoding, settle=a.settle)
        for name in ("warm", "steady"):
            p = r[name]
            print(f"controller ingest offline, {name:6}: {p['summaries']:,} summaries, {p['ingest_us']:.0f} us ingest "
                  f"+ {p['ticks']} ticks mean {p['tick_mean_ms']:.0f} ms (max {p['tick_max_ms']:.0f}) = "
                  f"{p['cpu_us_per_summary']:.0f} us CPU per summary: {p['one_core_rate']:,.0f}/s on one core")
        tp = r["steady_tick_parts_ms"]
        print("  steady state per tick: " + ", ".join(f"{k} {v:.0f} ms" for k, v in tp.items())
              + " (flush: also between ticks, see FLUSH_ROWS)")
        print("  steady state longest per part: " + ", ".join(
            f"{k} {v:.0f} ms" for k, v in r["steady_tick_parts_max_ms"].items())
              + f"; longest flush anywhere {r['steady_flush_max_ms']:.0f} ms")
        for p in r["steady_longest_ticks"]:
            print(f"  long tick at {p['t']:g} s: " + ", ".join(f"{k} {v:.0f}" for k, v in p.items() if k != "t"))
        print(f"  {r['nodes']} nodes, {r['encoding']} summaries, {r['rate']:g}/s of summary time, "
              f"evaluations {r['evaluations']}, "
              f"rejected {r['rejected']}, errors {r['errors']}")
        if a.json:
            print(json.dumps({"benchmark": "controller_ingest_offline", **r}))
        return 0
    if a.role:
        if a.role == "publisher":
            j, n = (int(x) for x in a.publisher_part.split("/"))
            r = asyncio.run(role_publisher(a.url, a.nodes, a.seconds, a.rate, a.encoding, a.settle, j, n))
        elif a.role == "controller":
            r = asyncio.run(role_controller(a.url, a.warmup))
        elif a.role == "worker":
            r = asyncio.run(role_worker(a.url, a.warmup, int(a.workers), a.partitions))
        else:
            r = asyncio.run(role_raw(a.url, a.warmup))
        print(json.dumps(r), flush=True)
        return 0
    from skewd import wire
    from skewd.natsutil import EmbeddedNatsServer

    counts = [int(x) for x in a.workers.split(",") if x.strip()]
    work = tempfile.mkdtemp(prefix="skewd-bench-ingest-")
    # the server partitions summaries as deploy/nats/ configures it (skewd nats-auth --partitions)
    server = EmbeddedNatsServer(store_dir=os.path.join(work, "js"),
                                config_text=wire.partition_mapping_conf(a.partitions) if a.partitions > 1 else None)
    run = a.warmup + a.seconds
    load0 = _loadavg()
    rows: list[tuple[int, dict, dict, str]] = []
    try:
        server.start()
        raw_sat = measure(server.url, "raw", a.nodes, run, 0.0, a.warmup, encoding=a.encoding, settle=a.settle,
                          publisher_nice=a.publisher_nice, publishers=a.publishers)
        for w in counts:
            la = _loadavg()
            sat = measure(server.url, "controller", a.nodes, run, 0.0, a.warmup, workers=w, partitions=a.partitions,
                          encoding=a.encoding, settle=a.settle,
                          publisher_nice=a.publisher_nice, publishers=a.publishers)
            lrate = a.latency_rate or max(100.0, round(sat["steady"]["rate"] / 2, -2))
            lat = measure(server.url, "controller", a.nodes, run, lrate, a.warmup, workers=w, partitions=a.partitions,
                          encoding=a.encoding, settle=a.settle,
                          publisher_nice=a.publisher_nice, publishers=a.publishers)
            rows.append((w, sat, lat, la))
        lrate_peer = a.latency_rate or max(100.0, round(max(r[1]["steady"]["rate"] for r in rows) / 2, -2))
        raw_lat = measure(server.url, "raw", a.nodes, run, lrate_peer, a.warmup, encoding=a.encoding, settle=a.settle,
                          publisher_nice=a.publisher_nice, publishers=a.publishers)
    except (CannotRun, RuntimeError, OSError, subprocess.TimeoutExpired) as e:
        print(f"controller ingest: could not run: {e}", file=sys.stderr)
        return 1
    finally:
        server.stop()
        shutil.rmtree(work, ignore_errors=True)
    load1 = _loadavg()
    print(f"controller ingest: {a.nodes} simulated agents ({a.nodes // TP} TP groups), "
          f"{raw_sat['bytes_per_msg']:.0f}-byte {a.encoding} summaries (steps reported {a.settle:g} s after they start), real nats-server ({a.partitions} partitions), "
          f"{a.publishers} publisher process{'es' if a.publishers > 1 else ''} at nice +{a.publisher_nice}, {os.cpu_count()} cores, {run:g} s per run: each consumer's first {a.warmup:g} s warm-up, the rest "
          f"steady state; load average {load0} -> {load1}")

    def line(name: str, s: dict, lat: dict) -> None:
        p = s["steady"]
        extra = (f"; {p['ticks']} ticks, max {p['tick_max_s'] * 1e3:.0f} ms" if "ticks" in p else "")
        if "leader_tick_max_s" in p:
            extra += (f", leader ticks max {p['leader_tick_max_s'] * 1e3:.0f} ms, longest loop block "
                      f"{p['tick_block_max_s'] * 1e3:.0f} ms (CPU: partition ticks max "
                      f"{p['tick_cpu_max_s'] * 1e3:.0f} ms, leader {p['leader_tick_cpu_max_s'] * 1e3:.0f} ms)")
        lp = lat["steady"]
        print(f"  {name:11}: {p['rate']:>8,.0f} summaries/s steady ({s['handled']:,} of {s['sent']:,} handled, "
              f"offered {s['offered_rate']:,.0f}/s), {p['cpu_us_per_summary']:.0f} us CPU per summary, "
              f"{p['cores']:.2f} cores{extra}")
        if not s["saturated"]:
            print(f"  {'':11}  not saturated: it handled all it was offered, so this rate is the publishers' "
                  f"and a lower bound on its own")
        print(f"  {'':11}  latency at {lat['offered_rate']:,.0f}/s offered: p50 {lp['lat_p50_ms']:.1f} ms, "
              f"p99 {lp['lat_p99_ms']:.1f} ms, max {lp['lat_max_ms']:.1f} ms")
        for run, ph in (("saturation", p), ("latency", lp)):
            for kind, longest in ph.get("longest_ticks", {}).items():
                for t in longest:
                    print(f"  {'':11}  longest {kind} ticks ({run}, ms wall; cpu: the tick's CPU time): "
                          + ", ".join(f"{k} {v:.0f}" for k, v in t.items()))

    line("peer", raw_sat, raw_lat)
    print("  (peer: a bare nats-py subscriber counting the same summaries, json.loads excluded)")
    peer = raw_sat["steady"]["rate"]
    for w, sat, lat, la in rows:
        line(f"skewd {w}w" if w else "skewd 1proc", sat, lat)
        r = sat["steady"]["rate"] / peer if peer else float("nan")
        bound = "" if sat["saturated"] or not raw_sat["saturated"] else ">= "
        note = ("" if raw_sat["saturated"] else
                "; the peer was not saturated, so the ratio may be overstated" if sat["saturated"] else
                "; neither was saturated: both rates are the publishers', what the CPU the consumer left them "
                "allowed, so the ratio bounds neither way")
        print(f"  {'':11}  ratio to the peer {bound}{r:.3f} (load average at start {la}{note})")
    print("  goal >= 50,000 summaries/s, ratio >= 0.5, p99 <= 250 ms at half that rate, no tick over 100 ms")
    if a.json:
        print(json.dumps({"benchmark": "controller_ingest", "load": [load0, load1], "partitions": a.partitions,
                          "publishers": a.publishers, "encoding": a.encoding, "settle_s": a.settle,
                          "peer": raw_sat, "peer_latency": raw_lat,
                          "skewd": {str(w): {"saturation": sat, "latency": lat, "load": la} for w, sat, lat, la in rows}}))
    return 0


def _loadavg() -> str:
    try:
        return open("/proc/loadavg").read().split()[0]
    except OSError:
        return "?"


if __name__ == "__main__":
    sys.exit(main())
