"""Controller ingest: simulated agents' summaries through a real nats-server into the controller.

    python bench/controller_ingest.py [--seconds 10] [--nodes 10000] [--rate 0]

Three processes on this machine, as in production: ``nats-server`` (started here, JetStream in
a temporary directory), one publisher process playing ``--nodes`` agents (each summary is the
JSON a real agent publishes: the 22 summary signals of a GPU node, 20 collective burst starts,
topology labels; stamped with the wall clock when it is sent), and one consumer process:

* **skewd**: the real :class:`skewd.controller.service.Controller` (default config, shipped
  rule packs) subscribed as in production; every summary goes through its own callback
  (JSON decode, schema check, topology, aligner, timelines, window store) and the group rules
  evaluate every second of the summaries' clock while summaries keep arriving;
* **peer**: a bare nats-py subscriber whose callback only counts (``json.loads`` excluded),
  fed the same payloads in the same way: the transport's own ceiling.

Each consumer is measured twice: *saturation* (the publisher sends as fast as it can for
``--seconds``; sustained rate = summaries handled / time from the first to the last) and
*latency* at a fixed offered rate (``--latency-rate``, default half the controller's measured
rate; percentiles of handled-time minus sent-time). Goal: >= 50,000 summaries/s on 2 cores.
Exits non-zero only if it could not run.
"""
from __future__ import annotations

import argparse
import asyncio
import json
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

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

def templates(nodes: int) -> list[tuple[str, list[bytes | str]]]:
    """(subject, JSON pieces) per node; the publisher splices in the time and burst starts."""
    import re

    from skewd import __version__, wire

    out = []
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
        out.append((wire.summary_subject(CLUSTER, node), parts))
    return out


def payload(tpl: tuple, t: float, interval: float) -> bytes:
    """The summary a node sends at ``t`` covering ``interval`` seconds: the decode steps (on a
    50 ms grid of absolute time) whose collective bursts started in that interval."""
    step = 1.0 / BURSTS
    k0 = int((t - interval) / step) + 1
    k1 = int(t / step)
    bursts = ",".join(f'"{j}":{k * step + 0.0003:.6f}' for j, k in enumerate(range(k0, k1 + 1)))
    fill = {"T": repr(t).encode(), "I": repr(interval).encode(), "B": ("{" + bursts + "}").encode()}
    return b"".join(fill[p] if isinstance(p, str) else p for p in tpl[1])


# ---------------------------------------------------------------------------------------------
# roles (child processes)
# ---------------------------------------------------------------------------------------------

def _cpu() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


async def role_publisher(url: str, nodes: int, seconds: float, rate: float) -> dict:
    import nats

    tpls = templates(nodes)
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
            data = payload(tpl, t, min(10.0, max(1e-3, t - last[i])))
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
    """Counts handled summaries and their latency (handled wall time minus sent time)."""

    def __init__(self) -> None:
        self.n = 0
        self.first = None
        self.last = 0.0
        self.lat: list[float] = []

    def hit(self, t_sent: float) -> None:
        now = time.time()
        if self.first is None:
            self.first = now
        self.last = now
        self.n += 1
        self.lat.append(now - t_sent)

    def result(self) -> dict:
        import numpy as np

        lat = np.array(self.lat) if self.lat else np.array([np.nan])
        span = (self.last - self.first) if self.first is not None else 0.0
        return {"handled": self.n, "span_s": span, "rate": self.n / span if span > 0 else 0.0,
                "lat_p50_ms": float(np.percentile(lat, 50) * 1e3), "lat_p99_ms": float(np.percentile(lat, 99) * 1e3),
                "lat_max_ms": float(np.max(lat) * 1e3)}


async def role_controller(url: str) -> dict:
    from skewd.controller.config import load_config
    from skewd.controller.service import Controller

    cfg = load_config(None, env={}, overrides={"cluster": CLUSTER, "nats": {"servers": url},
                                              "log": {"level": "error"}})
    ctl = Controller(cfg)
    rec = Recorder()
    orig = ctl.ingest_summary

    def ingest(s, labels=None):  # the controller's own ingest, timed from outside
        orig(s, labels)
        rec.hit(s.t)

    ctl.ingest_summary = ingest  # type: ignore[method-assign]
    ticks: list[float] = []
    orig_tick = ctl.tick

    async def tick(t: float) -> None:  # evaluation time per grid second, while summaries arrive
        a = time.perf_counter()
        await orig_tick(t)
        ticks.append(time.perf_counter() - a)

    ctl.tick = tick  # type: ignore[method-assign]
    await ctl.start()
    return await _serve(rec, extra=lambda: {
        "ticks": len(ticks), "tick_mean_s": sum(ticks) / len(ticks) if ticks else 0.0,
        "tick_max_s": max(ticks, default=0.0), "evaluations": ctl.stats.evaluations,
        "rejected": ctl.stats.summaries_rejected, "tp_groups": len(ctl.topology.tp_groups()),
        "errors": ctl.stats.errors})


async def role_raw(url: str) -> dict:
    import nats
    from skewd import wire

    rec = Recorder()
    nc = await nats.connect(url)
    import re

    tpos = re.compile(rb'"t":([0-9.e+-]+)')

    async def cb(msg) -> None:  # count, and read the sent time without decoding the JSON
        rec.hit(float(tpos.search(msg.data).group(1)))

    await nc.subscribe(wire.subject_filter("summary", cluster=CLUSTER), cb=cb)
    await nc.flush()
    return await _serve(rec, extra=lambda: {})


async def _serve(rec: Recorder, extra) -> dict:
    """Run until told to stop; then report from a watchdog thread and exit at once, so a
    consumer stuck in a long evaluation (or with a deep backlog) still answers."""
    import logging
    import threading

    logging.getLogger("nats").setLevel(logging.CRITICAL)
    c0 = _cpu()

    def watchdog() -> None:
        sys.stdin.readline()
        res = rec.result()
        res.update(extra())
        res["cpu_s"] = _cpu() - c0
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


def _child(args: list[str]) -> subprocess.Popen:
    p = subprocess.Popen([sys.executable, str(Path(__file__).resolve()), *args], stdin=subprocess.PIPE,
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
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


def measure(url: str, consumer: str, nodes: int, seconds: float, rate: float) -> dict:
    cons = _child(["--role", consumer, "--url", url])
    try:
        pub = _child(["--role", "publisher", "--url", url, "--nodes", str(nodes), "--seconds", str(seconds),
                      "--rate", str(rate)])
        try:
            p = _finish(pub, seconds + 120)
        finally:
            if pub.poll() is None:
                pub.kill()
        time.sleep(2.0)  # what is still in flight arrives; a backlog beyond that is not counted
        c = _finish(cons, 60)
    finally:
        if cons.poll() is None:
            cons.kill()
    c["sent"] = p["sent"]
    c["offered_rate"] = p["sent"] / p["seconds"]
    c["bytes_per_msg"] = p["bytes"] / max(1, p["sent"])
    c["lost"] = p["sent"] - c["handled"]
    return c


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seconds", type=float, default=10.0, help="sending time per measurement")
    ap.add_argument("--nodes", type=int, default=1000, help="simulated agents (TP groups of 8)")
    ap.add_argument("--latency-rate", type=float, default=0.0,
                    help="offered summaries/s for the latency runs (0: half the controller's sustained rate)")
    ap.add_argument("--json", action="store_true", help="also print the figures as one JSON line")
    ap.add_argument("--role", choices=("publisher", "controller", "raw"), help=argparse.SUPPRESS)
    ap.add_argument("--url", help=argparse.SUPPRESS)
    ap.add_argument("--rate", type=float, default=0.0, help=argparse.SUPPRESS)
    a = ap.parse_args(argv)
    if a.role:
        if a.role == "publisher":
            r = asyncio.run(role_publisher(a.url, a.nodes, a.seconds, a.rate))
        elif a.role == "controller":
            r = asyncio.run(role_controller(a.url))
        else:
            r = asyncio.run(role_raw(a.url))
        print(json.dumps(r), flush=True)
        return 0
    from skewd.natsutil import EmbeddedNatsServer

    work = tempfile.mkdtemp(prefix="skewd-bench-ingest-")
    server = EmbeddedNatsServer(store_dir=os.path.join(work, "js"))
    try:
        server.start()
        ctl_sat = measure(server.url, "controller", a.nodes, a.seconds, 0.0)
        raw_sat = measure(server.url, "raw", a.nodes, a.seconds, 0.0)
        lrate = a.latency_rate or max(100.0, round(ctl_sat["rate"] / 2, -2))
        ctl_lat = measure(server.url, "controller", a.nodes, a.seconds, lrate)
        raw_lat = measure(server.url, "raw", a.nodes, a.seconds, lrate)
    except (CannotRun, RuntimeError, OSError, subprocess.TimeoutExpired) as e:
        print(f"controller ingest: could not run: {e}", file=sys.stderr)
        return 1
    finally:
        server.stop()
        shutil.rmtree(work, ignore_errors=True)
    print(f"controller ingest: {a.nodes} simulated agents ({a.nodes // TP} TP groups), "
          f"{ctl_sat['bytes_per_msg']:.0f}-byte summaries, real nats-server, {os.cpu_count()} cores, "
          f"{a.seconds:g} s per run")
    for name, s, l in (("skewd", ctl_sat, ctl_lat), ("peer", raw_sat, raw_lat)):
        extra = (f"; {s['ticks']} controller ticks, mean {s['tick_mean_s'] * 1e3:.0f} ms, max "
                 f"{s['tick_max_s'] * 1e3:.0f} ms; {s['tp_groups']} TP groups seen"
                 if "evaluations" in s else " (bare nats-py subscriber, counting only)")
        print(f"  {name:5}: sustained {s['rate']:,.0f} summaries/s (offered {s['offered_rate']:,.0f}/s, "
              f"{s['handled']:,} of {s['sent']:,} handled, {max(0, s['lost']):,} dropped by the client as a slow "
              f"consumer){extra}")
        print(f"         latency at {l['offered_rate']:,.0f}/s offered: p50 {l['lat_p50_ms']:.1f} ms, "
              f"p99 {l['lat_p99_ms']:.1f} ms, max {l['lat_max_ms']:.1f} ms ({l['handled']:,} of {l['sent']:,} handled)")
    ratio = ctl_sat["rate"] / raw_sat["rate"] if raw_sat["rate"] else float("nan")
    print(f"  goal >= 50,000 summaries/s; ratio to the bare transport in this run: {ratio:.3f}"
          + (f" ({1 / ratio:.0f}x slower)" if ratio > 0 else ""))
    if a.json:
        print(json.dumps({"benchmark": "controller_ingest", "skewd": ctl_sat, "peer": raw_sat,
                          "skewd_latency": ctl_lat, "peer_latency": raw_lat}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
