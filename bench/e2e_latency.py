"""End-to-end latency: fault onset → controller finding → remap suggestion published, p50/p99.

    python bench/e2e_latency.py [--groups 12] [--nodes-per-group 4] [--late-ms 8]

``skewd controller`` runs as its own process (the real command: default settings, shipped
rule packs) against a real ``nats-server`` started here. This process plays the agents of
``--groups`` TP groups in real time: every node publishes the summary a real agent sends once a
second (its step timing on its own clock - compute gap, wait, period, as agent/steps.py reports
it - its collective step starts on a 50 ms decode step, +-0.3 ms jitter, clock error 0.5 ms,
topology labels), and from a staggered onset one node of each group computes ``--late-ms``
longer every step while its peers wait for it: a TP straggler (EW-1), one independent fault per
group.

Measured per group, on this machine's wall clock: onset (the first late summary is sent) →
the controller's firing EW-1 finding arrives on the findings subject → the remap suggestion
naming the straggler arrives on the remap subject. Most of the delay is the rule's design
(a 30 s averaging window, ``for: 15s``, the correlator's ``group_wait``); the last line
separates the processing part (suggestion after the finding, minus ``group_wait``).
There is no peer: no other tool in this space correlates stragglers across nodes; the figure
is compared with the delay the rule design sets. Exits non-zero only if it could not run.
"""
from __future__ import annotations

import argparse
import asyncio
import json
import math
import os
import random
import shutil
import subprocess
import sys
import tempfile
import time
import zlib
from pathlib import Path

import numpy as np
import yaml

CLUSTER = "e2e"
PERIOD = 0.05  # decode step: one collective burst per step on every TP peer
JITTER = 0.0003
CLOCK_ERR = 0.0005
COMPUTE = 0.035  # compute gap per step (the rest of the step is the all-reduce)


def summary(node: str, rank: int, group: str, t: float, late: float, waits: float) -> bytes:
    """One agent summary at ``t`` covering the last second (values invented for the benchmark):
    ``late`` the node's extra compute per step, ``waits`` how long it waits for a late peer."""
    from skewd import __version__, wire

    k0 = int((t - 1.0) / PERIOD) + 1
    starts = []
    for k in range(k0, int(t / PERIOD) + 1):
        r = random.Random(zlib.crc32(f"{node}:{k}".encode()))
        s = k * PERIOD + late + r.uniform(-JITTER, JITTER)
        if t - 1.0 < s <= t:
            starts.append(s)
    sig = {"collective_burst_starts": {str(j): v for j, v in enumerate(starts)},
           "summary_gpu_util_mean_ratio": {"": 0.8}, "summary_pcie_rx_bytes_per_second": {"": 1.0e10},
           "summary_rdma_xmit_bytes_per_second": {"": 6.4e9}, "summary_requests_running": {"": 64.0},
           "summary_requests_waiting": {"": 2.0}, "summary_kv_cache_usage_ratio": {"": 0.6},
           "summary_engine_phase": {"": 1.0},
           # the node's own step timing (agent/steps.py): the group's period stretches by the lag
           "summary_collective_period_seconds": {"": PERIOD + max(late, waits)},
           "summary_collective_compute_seconds": {"": COMPUTE + late},
           "summary_collective_wait_seconds": {"": 0.0005 + waits},
           "summary_collective_step_bytes": {"": 6.4e9 * PERIOD},
           "summary_collective_steps": {"": 10.0 / (PERIOD + max(late, waits))},
           "summary_collective_regularity_ratio": {"": 0.95}}
    msg = wire.Summary(node=node, cluster=CLUSTER, t=t, interval=1.0, signals=sig,
                       clock_sync=wire.ClockSync(True, CLOCK_ERR), agent_version=__version__)
    d = wire.to_dict(msg)
    d["labels"] = {"tp_group": group, "tp_rank": str(rank), "model": "m1"}
    return json.dumps(d, separators=(",", ":")).encode()


async def play(url: str, groups: int, per: int, late_s: float, first_onset: float, spread: float,
               tail: float) -> dict:
    import nats

    from skewd import wire

    nc = await nats.connect(url)
    found: dict[str, float] = {}  # culprit node → wall time its EW-1 firing finding arrived
    suggested: dict[str, float] = {}

    async def on_finding(msg) -> None:
        try:
            d = json.loads(msg.data)
        except ValueError:
            return
        if d.get("pathology") == "EW-1" and d.get("state") == "firing":
            found.setdefault(d.get("node", ""), time.time())

    async def on_remap(msg) -> None:
        try:
            d = json.loads(msg.data)
        except ValueError:
            return
        node = ((d.get("culprit") or {}).get("node")) or ""
        if d.get("pathology") == "EW-1":
            suggested.setdefault(node, time.time())

    await nc.subscribe(wire.subject_filter("finding", cluster=CLUSTER), cb=on_finding)
    await nc.subscribe(wire.remap_subject(CLUSTER), cb=on_remap)
    await nc.flush()
    nodes = [(f"g{g}n{r}", r, f"tp{g}") for g in range(groups) for r in range(per)]
    culprit = {f"tp{g}": f"g{g}n{(g % (per - 1)) + 1}" for g in range(groups)}
    start = math.ceil(time.time()) + 1.0
    onset_at = {f"tp{g}": start + first_onset + spread * g / max(1, groups - 1) for g in range(groups)}
    onset_wall: dict[str, float] = {}
    end = max(onset_at.values()) + tail
    phase = {n: (i % 20) * 0.01 for i, (n, _, _) in enumerate(nodes)}  # agents tick at their own phase
    second = 0
    while True:
        base = start + second
        if base > end or (len(suggested) == groups and base > max(onset_at.values()) + 5):
            break
        for n, r, g in sorted(nodes, key=lambda x: phase[x[0]]):
            t = base + phase[n]
            delay = t - time.time()
            if delay > 0:
                await asyncio.sleep(delay)
            faulty = t >= onset_at[g]
            late = late_s if n == culprit[g] and faulty else 0.0
            waits = late_s if n != culprit[g] and faulty else 0.0
            if late and g not in onset_wall:
                onset_wall[g] = time.time()
            await nc.publish(wire.summary_subject(CLUSTER, n), summary(n, r, g, t, late, waits))
        second += 1
    await asyncio.sleep(2.0)
    await nc.close()
    out = []
    for g, c in culprit.items():
        o = onset_wall.get(g)
        out.append({"group": g, "culprit": c, "onset": o,
                    "finding_s": (found[c] - o) if o and c in found else None,
                    "suggestion_s": (suggested[c] - o) if o and c in suggested else None})
    return {"groups": out, "seconds": time.time() - start}


def pct(v: list[float], q: float) -> float:
    return float(np.percentile(v, q)) if v else float("nan")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--groups", type=int, default=12, help="TP groups, one straggler fault each")
    ap.add_argument("--nodes-per-group", type=int, default=4)
    ap.add_argument("--late-ms", type=float, default=8.0, help="how late the straggler starts every collective")
    ap.add_argument("--first-onset", type=float, default=25.0, help="seconds of healthy traffic before the first fault")
    ap.add_argument("--spread", type=float, default=30.0, help="onsets spread over this many seconds")
    ap.add_argument("--tail", type=float, default=120.0, help="longest wait for a suggestion after the last onset")
    ap.add_argument("--json", action="store_true", help="also print the figures as one JSON line")
    a = ap.parse_args(argv)
    if a.nodes_per_group < 2:
        print("e2e latency: --nodes-per-group must be at least 2", file=sys.stderr)
        return 2
    from skewd.natsutil import EmbeddedNatsServer

    work = Path(tempfile.mkdtemp(prefix="skewd-bench-e2e-"))
    server = EmbeddedNatsServer(store_dir=str(work / "js"))
    ctl = None
    try:
        server.start()
        cfg = work / "controller.yaml"
        cfg.write_text(yaml.safe_dump({"cluster": CLUSTER, "nats": {"servers": [server.url]},
                                       "log": {"level": "warning"}}))
        log = open(work / "controller.log", "wb")
        ctl = subprocess.Popen([sys.executable, "-m", "skewd.cli", "controller", "--config", str(cfg)],
                               stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
        time.sleep(3.0)  # connect, streams, KV bucket
        if ctl.poll() is not None:
            raise RuntimeError(f"skewd controller exited with {ctl.returncode}:\n"
                               f"{(work / 'controller.log').read_text()[-3000:]}")
        res = asyncio.run(play(server.url, a.groups, a.nodes_per_group, a.late_ms / 1e3, a.first_onset,
                               a.spread, a.tail))
        ctl_cpu = None
        try:
            with open(f"/proc/{ctl.pid}/stat") as f:
                fl = f.read().rsplit(")", 1)[1].split()
            ctl_cpu = (int(fl[11]) + int(fl[12])) / os.sysconf("SC_CLK_TCK")
        except OSError:
            pass
    except (RuntimeError, OSError) as e:
        print(f"e2e latency: could not run: {e}", file=sys.stderr)
        return 1
    finally:
        if ctl is not None and ctl.poll() is None:
            ctl.terminate()
            try:
                ctl.wait(15)
            except subprocess.TimeoutExpired:
                ctl.kill()
        server.stop()
        try:
            ctl_log = (work / "controller.log").read_text(errors="replace")
        except OSError:
            ctl_log = ""
        shutil.rmtree(work, ignore_errors=True)
    gs = res["groups"]
    if any(g["suggestion_s"] is None for g in gs) and ctl_log.strip():
        print(f"e2e latency: not every fault got a suggestion; controller log tail:\n{ctl_log[-3000:]}",
              file=sys.stderr)
    fnd = [g["finding_s"] for g in gs if g["finding_s"] is not None]
    sug = [g["suggestion_s"] for g in gs if g["suggestion_s"] is not None]
    from skewd.controller.config import load_config

    group_wait = load_config(None, env={}).group_wait  # what the controller ran with (defaults)
    proc = [g["suggestion_s"] - g["finding_s"] - group_wait for g in gs
            if g["suggestion_s"] is not None and g["finding_s"] is not None]
    print(f"end-to-end latency: {a.groups} TP groups x {a.nodes_per_group} nodes, one {a.late_ms:g} ms straggler "
          f"each, real time through nats-server into `skewd controller` (shipped packs, default settings); "
          f"{res['seconds']:.0f} s" + (f", controller CPU {ctl_cpu:.1f} s" if ctl_cpu is not None else ""))
    print(f"  onset -> EW-1 finding at the controller: p50 {pct(fnd, 50):.1f} s, p99 {pct(fnd, 99):.1f} s "
          f"({len(fnd)} of {a.groups} faults found)")
    print(f"  onset -> remap suggestion published:    p50 {pct(sug, 50):.1f} s, p99 {pct(sug, 99):.1f} s "
          f"({len(sug)} of {a.groups} suggested)")
    print(f"  by design: EW-1 averages over a 30 s window and holds for 15 s before firing; the correlator then "
          f"waits group_wait = {group_wait:g} s for a culprit to explain the incident. Finding -> suggestion beyond "
          f"group_wait: p50 {pct(proc, 50) * 1e3:.0f} ms, p99 {pct(proc, 99) * 1e3:.0f} ms (includes up to 1 s of "
          f"evaluation grid)")
    if a.json:
        print(json.dumps({"benchmark": "e2e_latency", "group_wait_s": group_wait, "finding_p50_s": pct(fnd, 50), "finding_p99_s": pct(fnd, 99),
                          "suggestion_p50_s": pct(sug, 50), "suggestion_p99_s": pct(sug, 99),
                          "found": len(fnd), "suggested": len(sug), "groups": gs}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
