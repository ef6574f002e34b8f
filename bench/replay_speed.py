"""Replay speed: a simulated capture of an 8-GPU node at 10 Hz, every collector's signals, replayed with all packs.

    python bench/replay_speed.py [--hours 1] [--hz 10] [--cpus 16] [--flows 16] [--keep DIR]

Generates the samples with numpy (the fault-lab simulator runs at 1 Hz and takes ~10 ms per
node-second, too slow for a day at 10 Hz): every catalogued signal of every node-local collector
(gpu, pcie, netdev, rdma, host, vllm, pkt, exporter) for an 8-GPU node: 8 GPUs, 12 PCI devices
(8 GPUs, 4 NICs), 4 RDMA ports, 2 NIC ports, 1 vLLM engine, ``--cpus`` CPUs, ``--flows`` flows.
Counters grow, gauges wander around their own level; values are invented (this measures speed,
not detection). Each collector collects at ``--hz``: one SampleBatch per collector per
collection, exactly what the live agent's pipeline ingests. The agent's own
:class:`skewd.agent.record.Recorder` writes them (with an evaluation tick every second and a
node summary every second) into a capture bundle of one-hour segments, as a recording agent does.

The replay is ``skewd replay``'s code path: ``open_segments`` → ``replay_catalogue`` →
``Replayer(..., rules=[the shipped packs]).events()`` (what ``_drive`` iterates at ``--speed
max``), timed from opening the bundle to the last evaluation, with ``--jobs`` time slices
(default 2: both cores; a slice must span two warm-ups, 12 minutes each with the shipped packs, so
two jobs engage from 0.8 h of recording: ``--hours 0.5`` runs serially whatever ``--jobs`` says).
Goal (issue 23): 24 h replayed in <= 90 s, 1,000x real time.
A full day at 10 Hz is ~1.3 billion samples and ~45 GB on disk; by default one hour is
generated and replayed, and the 24 h time is extrapolated from the steady state (after the
first 10 minutes, when the windows are full, the cost per recorded second is constant).
Peer: real time (the recording's own duration) → speed-up; and, on the same samples, the naive
ingest path (every sample its own batch) against the recorded batches. ``--serial-peer``
replays the bundle serially too, in the same run. On a shared machine wall time lies, so the
figures to compare are CPU: per recorded second serial and sliced (all processes), their ratio,
each process's CPU per second of its slice, and from the slowest of them a day on two free
cores (a 12-hour slice and the worker's warm-up at that rate).
Exits non-zero only if it could not run.
"""
from __future__ import annotations

import argparse
import json
import re
import shutil
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

NODE = "gpu-node-0"
CLUSTER = "bench"
COLLECTORS = ("gpu", "pcie", "netdev", "rdma", "host", "vllm", "pkt", "exporter")
START = 1_767_225_600.0  # 2026-01-01T00:00:00Z


def layout(cpus: int, flows: int) -> dict[str, list[str]]:
    """Entities per scope of the simulated node."""
    return {
        "gpu": [f"gpu{i}" for i in range(8)],
        "pci_device": [f"0000:{b:02x}:00.0" for b in (0x18, 0x2a, 0x3a, 0x5d, 0x9a, 0xab, 0xba, 0xdb, 0x19, 0x3b, 0x9b, 0xbb)],
        "rdma_port": [f"mlx5_{i}/1" for i in range(4)],
        "nic_port": ["eth0", "eth1"],
        "engine": ["engine0"],
        "cpu": [f"cpu{i}" for i in range(cpus)],
        "flow": [f"udp 10.0.{i // 250}.{i % 250 + 1}:{49152 + i}>10.1.0.1:4791" for i in range(flows)],
        "node": [""],
    }


#: counters that stay flat on a healthy node (errors, drops, retransmits, congestion marks,
#: preemptions): a node whose every error counter grows fires dozens of rules for the whole
#: recording, which no production node does for a day (and which no replay can split in time:
#: an alert firing since the first second carries that start in every later transition)
_FAULT_COUNTER = re.compile(r"err|drop|discard|missed|collision|retrans|retries|replay|rollover|timeout|fatal|"
                            r"poison|malformed|bad_|surprise|wait|out_of|duplicate|nak|cnp|ecn|ce_packets|xid|"
                            r"downed|recover|preempt|carrier|rsts|loss|dsack|spurious|reneging|fail|overlimits|"
                            r"requeues|silences|symbol|overrun|vl15|restart|rcvbuf|sndbuf|aborted|heartbeat|"
                            r"fifo|frame|crc|length|over_")
#: gauges that hold still on a healthy node (counts, link state, limits): one value, 8, for all
#: of them, so that active equals present and current equals max
_STEADY_GAUGE = re.compile(r"links|mrs|qps|cpus_online|link_gen|link_width|transfers_per_second|numa|state|_up$|"
                           r"active$|responding|speed|limit|total_bytes|max_|flows$|connections|egress|phase|rate_bytes")
#: gauges that read 0 on a healthy node (flags, event reasons, backlogs, queue delays)
_ZERO_GAUGE = re.compile(r"clocks_event|downtrained|closed|xid_last|backlog|qlen|delay|silence|waiting|"
                         r"kv_cache|spread|busy_ratio|gini|share_max")


class NodeGen:
    """Per collector: fixed entity/signal columns, and values for a run of collections.

    A healthy node (values invented, NOTE): error-like counters flat, flag-like gauges 0, every
    other gauge at one level per signal shared by all its entities (peers alike), with 1 %
    noise (``healthy=False``: every counter grows and every gauge wanders, 5 % noise, around its
    own level per entity: most rules fire). ``fault``: (signal, entity, start s, end s), or a list of them - that counter grows
    in that span (an AER error burst, say): a recording with a fault that fires and resolves."""

    def __init__(self, catalogue, ents: dict[str, list[str]], hz: float, seed: int = 1,
                 fault: tuple[str, str, float, float] | list | None = None, healthy: bool = True) -> None:
        from skewd.model import Kind

        self.hz = hz
        self.rng = np.random.default_rng(seed)
        self.faults = [fault] if isinstance(fault, tuple) else list(fault or [])
        self.collections: dict[str, int] = {}
        self.steady: dict[str, np.ndarray] = {}
        self.noise = 0.01 if healthy else 0.05
        self.cols: dict[str, tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]] = {}
        for c in COLLECTORS:
            specs = sorted((s for s in catalogue.values() if s.collector == c), key=lambda s: s.name)
            ent, sig, is_ctr, level, steady = [], [], [], [], []
            for s in specs:
                ctr = s.kind is Kind.COUNTER
                lv = 0.0 if (_FAULT_COUNTER.search(s.name) if ctr else _ZERO_GAUGE.search(s.name)) \
                    else float(self.rng.random() * 100 + 1)
                still = not ctr and (lv == 0.0 or bool(_STEADY_GAUGE.search(s.name)))
                if not healthy:  # every counter grows, every gauge wanders: dozens of rules fire
                    lv, still = -1.0, False
                if still and lv:
                    lv = 8.0
                for e in ents.get(s.scope.value, []):
                    ent.append(e)
                    sig.append(s.name)
                    is_ctr.append(ctr)
                    level.append(lv)
                    steady.append(still)
            if not ent:
                continue
            n = len(ent)
            lev = np.array(level)
            wild = lev < 0
            lev[wild] = self.rng.random(int(wild.sum())) * 100 + 1
            # error counters start at 0 (a healthy device), the others anywhere
            state = np.where(is_ctr, np.where(lev > 0, np.floor(self.rng.random(n) * 1e9), 0.0), lev)
            self.cols[c] = (np.array(ent, dtype=object), np.array(sig, dtype=object), np.array(is_ctr), lev, state)
            self.steady[c] = np.array(steady)
            self.collections[c] = 0
        self.phase = {c: 0.003 * k for k, c in enumerate(self.cols)}  # collectors tick apart

    @property
    def series(self) -> int:
        return sum(len(v[0]) for v in self.cols.values())

    def values(self, c: str, k: int) -> np.ndarray:
        """(k, n) values of ``k`` successive collections of collector ``c``."""
        ent, sig, is_ctr, level, state = self.cols[c]
        n = len(ent)
        noise = np.where(self.steady[c], 1.0, 1.0 + self.noise * self.rng.standard_normal((k, n)))
        step = level * noise / self.hz
        for f_sig, f_ent, f_a, f_b in self.faults:
            at = (sig == f_sig) & (ent == f_ent)
            if at.any():
                secs = (self.collections[c] + np.arange(k)) / self.hz
                live = (secs >= f_a) & (secs < f_b)
                step[np.ix_(live, at)] = 50.0 / self.hz  # 50 errors a second
        self.collections[c] += k
        inc = np.cumsum(step, axis=0) + state  # counters
        out = np.where(is_ctr, inc, level * noise)
        state[:] = np.where(is_ctr, inc[-1], state)
        return out


def record(directory: Path, hours: float, hz: float, cpus: int, flows: int,
           fault: tuple[str, str, float, float] | list | None = None, healthy: bool = True) -> dict:
    """Write the bundle with the agent's Recorder; returns counts. ``fault``, ``healthy``: see
    NodeGen (``healthy=False``: the invented node of earlier runs, on which most rules fire)."""
    from skewd import __version__, wire
    from skewd.agent.record import Recorder
    from skewd.catalogue import full_catalogue
    from skewd.model import SampleBatch
    from skewd.rules.cli import PACKS
    from skewd.rules.loader import load_rules

    cat = full_catalogue()
    res = load_rules([PACKS], cat)
    if not res.ok:
        raise RuntimeError("shipped packs do not load: " + "; ".join(map(str, res.issues)))
    gen = NodeGen(cat, layout(cpus, flows), hz, fault=fault, healthy=healthy)
    rec = Recorder(directory, node=NODE, cluster=CLUSTER, labels={"tp_group": "tp0", "tp_rank": "0"},
                   ruleset=res.ruleset, catalogue=cat, max_bytes=1 << 50, max_duration=hours * 3600 + 3600,
                   rotate=max(1, int(np.ceil(hours + 1))),
                   settings={"evaluation_interval": 1.0, "lookback": 60.0, "horizon": 600.0, "summary_interval": 1.0},
                   flush_interval=1.0, flush_rows=50_000, threaded=False)
    seconds = int(round(hours * 3600))
    per = int(round(hz))
    block = 60  # seconds generated at a time
    nodes = {c: np.full(len(v[0]), NODE, dtype=object) for c, v in gen.cols.items()}
    samples = batches = 0
    for s0 in range(0, seconds, block):
        ns = min(block, seconds - s0)
        vals = {c: gen.values(c, ns * per) for c in gen.cols}
        for s in range(ns):
            sec = START + s0 + s
            for j in range(per):
                for c, (ent, sig, *_rest) in gen.cols.items():
                    t = sec + j / hz + gen.phase[c]
                    v = vals[c][s * per + j]
                    rec.on_batch(SampleBatch(np.full(len(v), t), nodes[c], ent, sig, v))
                    samples += len(v)
                    batches += 1
            tick = sec + 1.0
            rec.on_summary(wire.Summary(node=NODE, cluster=CLUSTER, t=tick, interval=1.0,
                                        signals={"summary_gpu_util_mean_ratio": {"": 0.8},
                                                 "summary_gpu_power_watts": {"": 5200.0}},
                                        clock_sync=wire.ClockSync(True, 0.0005), agent_version=__version__))
            rec.on_tick(tick, [])
    rec.stop()
    if rec.errors or rec.dropped_rows:
        raise RuntimeError(f"recorder lost data: {rec.errors} errors ({rec.last_error}), {rec.dropped_rows} rows")
    size = sum(f.stat().st_size for f in directory.rglob("*") if f.is_file())
    return {"samples": samples, "batches": batches, "series": gen.series, "bytes": size, "seconds": seconds,
            "gen": gen}


def _existing(bundle: Path, hz: float, cpus: int, flows: int) -> dict:
    """The counts ``record`` returns, for a bundle it wrote earlier (``--keep``)."""
    from skewd.agent import bundle as B
    from skewd.catalogue import full_catalogue

    segs = [B.Segment(p) for p in sorted(bundle.iterdir()) if p.is_dir()]
    t = np.concatenate([s.ticks()[0] for s in segs])
    gen = NodeGen(full_catalogue(), layout(cpus, flows), hz)
    size = sum(f.stat().st_size for f in bundle.rglob("*") if f.is_file())
    seconds = int(round(float(t[-1] - t[0]))) + 1 if len(t) else 0
    return {"samples": int(gen.series * hz * seconds), "batches": 0, "series": gen.series, "bytes": size,
            "seconds": seconds, "gen": gen}


class _Split:
    """Wall time inside the pipelines' ingest and evaluation and inside the bundle feed (reading
    and decoding chunks, cutting them into batches); the rest is the replay loop itself (tick
    heap, routing, summaries). Wraps the methods for the duration of the replay only."""

    def __init__(self) -> None:
        self.acc = {"ingest": 0.0, "evaluate": 0.0, "read": 0.0}
        self._undo: list = []

    def _wrap(self, cls, name: str, key: str, gen: bool = False) -> None:
        orig = getattr(cls, name)
        acc = self.acc
        clock = time.perf_counter

        if gen:
            def wrapped(*a, **k):
                it = orig(*a, **k)
                while True:
                    t0 = clock()
                    try:
                        x = next(it)
                    except StopIteration:
                        acc[key] += clock() - t0
                        return
                    acc[key] += clock() - t0
                    yield x
        else:
            def wrapped(*a, **k):
                t0 = clock()
                try:
                    return orig(*a, **k)
                finally:
                    acc[key] += clock() - t0
        setattr(cls, name, wrapped)
        self._undo.append((cls, name, orig))

    def __enter__(self) -> "_Split":
        from skewd.agent import replay as R
        from skewd.agent.pipeline import Pipeline

        self._wrap(Pipeline, "ingest", "ingest")
        if hasattr(Pipeline, "ingest_many"):
            self._wrap(Pipeline, "ingest_many", "ingest")
        self._wrap(Pipeline, "evaluate", "evaluate")
        from skewd.rules.engine import Engine

        if hasattr(Engine, "evaluate_range"):  # range evaluation (the default at --speed max)
            self._wrap(Engine, "evaluate_range", "evaluate")
        from skewd.agent.replay import ahead, feed

        self._wrap(feed.SegmentFeed, "until", "read")
        self._wrap(ahead.AheadIngest, "write", "ingest")
        return self

    def __exit__(self, *exc) -> None:
        for cls, name, orig in reversed(self._undo):
            setattr(cls, name, orig)

    def snap(self) -> dict[str, float]:
        return dict(self.acc)


def replay(directory: Path, warm_s: float, per_tick: bool = False, jobs: int = 1) -> dict:
    """skewd replay's path at --speed max (range evaluation; ``per_tick``: ``--per-tick``); wall
    time at each event (for the steady state). ``jobs`` > 1: time slices in parallel processes
    (``Replayer(jobs=)``); the split of the time is then this process's only, and the CPU time
    counts the workers too."""
    import resource
    from skewd.agent import replay as R
    from skewd.rules.cli import PACKS

    kids0 = resource.getrusage(resource.RUSAGE_CHILDREN)
    with _Split() as split:
        w0 = time.perf_counter()
        segments, damage = R.open_segments([directory])
        if not segments or damage:
            raise RuntimeError(f"bundle unreadable: {damage}")
        cat = R.replay_catalogue(segments)
        c0 = time.process_time()
        from skewd.agent.replay.slices import ParallelReplayer

        rep = ParallelReplayer(segments, cat, rules=[str(PACKS)], range_eval=not per_tick, jobs=jobs)
        first = None
        mark = None
        evals = 0
        transitions = 0
        t = 0.0
        for ev in rep.events():
            if first is None:
                first = ev.t
            if mark is None and ev.t - first >= warm_s:
                mark = (ev.t, time.perf_counter(), split.snap())
            transitions += len(ev.findings)
            evals += 1
            t = ev.t
        w1 = time.perf_counter()
        end = split.snap()
    cpu = time.process_time() - c0
    kids = resource.getrusage(resource.RUSAGE_CHILDREN)
    # the slice workers of this replay (joined by now)
    cpu_workers = kids.ru_utime + kids.ru_stime - kids0.ru_utime - kids0.ru_stime
    res = rep.result([])
    steady = None
    parts = None
    if mark is not None and t > mark[0]:
        steady = (w1 - mark[1]) / (t - mark[0])  # wall seconds per recorded second
        parts = {k: (end[k] - mark[2][k]) / (t - mark[0]) for k in end}
        parts["rest"] = steady - sum(parts.values())
    ingested = sum(p.store.samples_ingested for p in rep.pipelines.values()) + rep.samples_elsewhere
    st = getattr(rep, "slice_stats", None)
    bounds = list(st.boundaries) if st else []
    return {"cpu_s": cpu, "cpu_workers_s": cpu_workers, "jobs": jobs, "first": first, "last": t, "bounds": bounds,
            "handed_over": (sum(st.handed_over), len(st.boundaries)) if st else None, "warmup_s": rep.warmup(),
            "wall_s": w1 - w0, "evaluations": res.evaluations, "transitions": transitions,
            "recorded_s": (t - first) if first is not None else 0.0, "steady_per_s": steady, "ingested": ingested,
            "rules": len(res.ruleset.rules), "steady_parts": parts}


def _two_cores(r: dict) -> dict | None:
    """A day on ``jobs`` free cores from a sliced run's CPU (wall lies on a shared machine): each
    process's CPU per recorded second it replayed (the worker's slice plus its warm-up), and the
    slowest process replaying a day's slice and its warm-up at that rate. With one boundary only
    (two jobs); None otherwise. Start-up is counted per second, so a short bundle overstates it."""
    if r["jobs"] != 2 or len(r["bounds"]) != 1 or not r["handed_over"] or not r["handed_over"][0]:
        return None
    b = r["bounds"][0]
    parent_s = max(1.0, b - r["first"])
    worker_s = max(1.0, r["last"] - b + r["warmup_s"])
    pm, wm = r["cpu_s"] / parent_s, r["cpu_workers_s"] / worker_s
    day_s = max(pm * 43_200, wm * (43_200 + r["warmup_s"]))
    return {"parent_ms": pm * 1e3, "worker_ms": wm * 1e3, "day_s": day_s}


def naive_peer(gen: NodeGen, hz: float, seconds: int = 5) -> dict:
    """The same samples ingested per collection batch (what replay does) and one sample per
    batch (a naive per-sample ingest loop), into the agent's pipeline store."""
    from skewd.agent.pipeline import Pipeline
    from skewd.catalogue import full_catalogue
    from skewd.model import SampleBatch
    from skewd.rules.engine import RuleSet

    cat = full_catalogue()
    per = int(round(hz))
    vals = {c: gen.values(c, seconds * per) for c in gen.cols}
    batches = []
    for k in range(seconds * per):
        for c, (ent, sig, *_rest) in gen.cols.items():
            t = START + k / hz + gen.phase[c]
            v = vals[c][k]
            batches.append(SampleBatch(np.full(len(v), t), np.full(len(v), NODE, dtype=object), ent, sig, v))
    n = sum(len(b) for b in batches)
    out = {}
    for name in ("batched", "per_sample"):
        p = Pipeline(cat, RuleSet([], [], ""), node=NODE, cluster=CLUSTER)
        a = time.perf_counter()
        if name == "batched":
            for b in batches:
                p.ingest(b)
        else:
            for b in batches:
                for i in range(len(b)):
                    p.ingest(b.select(slice(i, i + 1)))
        out[name] = (time.perf_counter() - a) / n
    out["samples"] = n
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--hours", type=float, default=1.0, help="recorded hours to generate and replay (24 for a full day)")
    ap.add_argument("--hz", type=float, default=10.0, help="collections per second of every collector")
    ap.add_argument("--cpus", type=int, default=16, help="CPUs of the simulated node (host collector entities)")
    ap.add_argument("--flows", type=int, default=16, help="flows the pkt collector reports")
    ap.add_argument("--keep", metavar="DIR", help="write the bundle here and keep it")
    ap.add_argument("--json", action="store_true", help="also print the figures as one JSON line")
    ap.add_argument("--per-tick", action="store_true",
                    help="evaluate at every tick (skewd replay --per-tick) instead of in ranges of ticks")
    ap.add_argument("--bundle", metavar="DIR", help="replay this bundle (written by --keep) instead of writing one")
    ap.add_argument("--jobs", type=int, default=2,
                    help="time slices replayed in parallel processes (skewd replay --jobs; 1: serial)")
    ap.add_argument("--serial-peer", action="store_true",
                    help="also replay the bundle serially (--jobs 1) in the same run, for the ratio")
    a = ap.parse_args(argv)
    work = Path(a.keep) if a.keep else Path(tempfile.mkdtemp(prefix="skewd-bench-replay-"))
    try:
        if a.bundle:
            bundle = Path(a.bundle)
            w = _existing(bundle, a.hz, a.cpus, a.flows)
        else:
            bundle = work / NODE
            if bundle.exists():
                raise RuntimeError(f"{bundle} exists; pick an empty --keep directory")
        t0 = time.perf_counter()
        if not a.bundle:
            w = record(bundle, a.hours, a.hz, a.cpus, a.flows)
        gen_s = time.perf_counter() - t0
        warm = min(600.0, w["seconds"] / 3)
        load0 = Path("/proc/loadavg").read_text().split()[0] if Path("/proc/loadavg").exists() else "?"
        r = replay(bundle, warm, a.per_tick, a.jobs)
        serial = replay(bundle, warm, a.per_tick, 1) if a.serial_peer and a.jobs > 1 else None
        load1 = Path("/proc/loadavg").read_text().split()[0] if Path("/proc/loadavg").exists() else "?"
        peer = naive_peer(w["gen"], a.hz)
    except (RuntimeError, OSError) as e:
        print(f"replay speed: could not run: {e}", file=sys.stderr)
        return 1
    finally:
        if not a.keep:
            shutil.rmtree(work, ignore_errors=True)
    day = 86_400.0
    # sliced: the slices run at once, so the whole run is the figure (the first slice's steady
    # state says nothing about the others); serial: the steady state after the warm-up
    per_s = (r["wall_s"] / max(1.0, r["recorded_s"]) if a.jobs > 1 else
             r["steady_per_s"] or (r["wall_s"] / max(1.0, r["recorded_s"])))
    day_s = per_s * day
    measured_day = w["seconds"] >= day
    print(f"replay speed: 8-GPU node, {w['series']} series from every node collector at {a.hz:g} Hz "
          f"({w['series'] * a.hz:,.0f} samples/s), {w['seconds'] / 3600:g} h recorded: {w['samples']:,} samples in "
          f"{w['batches']:,} batches, {w['bytes'] / 1e9:.2f} GB bundle (written in {gen_s:.0f} s)")
    print(f"  evaluation: {'per tick (--per-tick)' if a.per_tick else 'ranges of ticks'}; {a.jobs} job(s); "
          f"load average {load0} -> {load1}")
    if r["handed_over"] is not None:
        print(f"  time slices: {r['handed_over'][0]} of {r['handed_over'][1]} boundaries handed over "
              "(the others replayed on serially)")
        if not r["handed_over"][1] and a.jobs > 1:
            # slices.boundaries: a slice must span two warm-ups, or a process is not worth it
            print(f"    no boundary: {r['recorded_s'] / 3600:.2f} h cut in {a.jobs} is less than two warm-ups of "
                  f"{r['warmup_s']:.0f} s per slice (longest rule window + lookback + 2 gc periods), so this "
                  f"ran serially; {a.jobs * 2 * r['warmup_s'] / 3600:.1f} h or more engages {a.jobs} jobs")
    rec = max(1.0, r["recorded_s"])
    print(f"  CPU: {r['cpu_s']:.1f} s this process + {r['cpu_workers_s']:.1f} s slice workers = "
          f"{(r['cpu_s'] + r['cpu_workers_s']) / rec * 1e3:.2f} ms per recorded second; "
          f"wall {r['wall_s']:.1f} s")
    proj = _two_cores(r)
    if proj is not None:
        print(f"  sliced, per process: this one {proj['parent_ms']:.2f} ms CPU per second of its slice, the worker "
              f"{proj['worker_ms']:.2f} ms per second of its slice and warm-up ({r['warmup_s']:.0f} s); 24 h on "
              f"{a.jobs} free cores (the slowest process, {86400 / a.jobs / 3600:g} h + warm-up): "
              f"{proj['day_s']:.0f} s = {86400 / proj['day_s']:.0f}x real time (goal <= 90 s)")
    if serial is not None:
        s_ms = serial["cpu_s"] / max(1.0, serial["recorded_s"]) * 1e3
        x_ms = (r["cpu_s"] + r["cpu_workers_s"]) / rec * 1e3
        print(f"  same-run serial peer (--jobs 1): wall {serial['wall_s']:.1f} s, CPU {serial['cpu_s']:.1f} s = "
              f"{s_ms:.2f} ms per recorded second (24 h on one core: {s_ms * 86.4:.0f} s); sliced/serial CPU "
              f"{x_ms / s_ms:.2f}, wall {r['wall_s'] / serial['wall_s']:.2f}; same transitions: "
              f"{serial['transitions'] == r['transitions']}")
    print(f"  replay with all packs ({r['rules']} rules): {r['wall_s']:.1f} s for {r['recorded_s'] / 3600:.2f} h "
          f"({r['evaluations']:,} evaluations, {r['ingested']:,} samples ingested, {r['transitions']} transitions) = "
          f"{r['recorded_s'] / r['wall_s']:.0f}x real time")
    how = "measured" if measured_day else f"extrapolated ({per_s * 1e3:.2f} ms wall per recorded second)"
    print(f"  24 h: {day_s:.0f} s {how}   (goal <= 90 s); speed-up over real time {day / day_s:.0f}x "
          f"(goal {day / 90:.0f}x)")
    if r["steady_parts"] and a.jobs == 1:
        sp = r["steady_parts"]
        print("  steady state per recorded second: " + ", ".join(
            f"{k} {sp[k] * 1e3:.1f} ms" for k in ("ingest", "evaluate", "read", "rest")) +
            "   (read: bundle chunks to batches; rest: the replay loop, routing, summaries)")
    print(f"  ingest per sample: recorded batches {peer['batched'] * 1e9:.0f} ns, naive one-sample batches "
          f"{peer['per_sample'] * 1e9:.0f} ns: {peer['per_sample'] / peer['batched']:.0f}x faster than the naive path")
    if a.json:
        print(json.dumps({"benchmark": "replay_speed", "jobs": a.jobs, "cpu_s": r["cpu_s"],
                          "cpu_workers_s": r["cpu_workers_s"], "handed_over": r["handed_over"],
                          "serial_wall_s": serial["wall_s"] if serial else None,
                          "serial_cpu_s": serial["cpu_s"] if serial else None,
                          "cpu_ms_per_recorded_s": (r["cpu_s"] + r["cpu_workers_s"]) / rec * 1e3,
                          "serial_cpu_ms_per_recorded_s": serial["cpu_s"] / max(1.0, serial["recorded_s"]) * 1e3
                          if serial else None,
                          "day_s_two_free_cores": proj["day_s"] if proj else None, "hours": w["seconds"] / 3600, "series": w["series"],
                          "samples": w["samples"], "bundle_bytes": w["bytes"], "replay_wall_s": r["wall_s"],
                          "day_s": day_s, "day_measured": measured_day, "speedup_real_time": day / day_s,
                          "evaluations": r["evaluations"], "ingest_ns_batched": peer["batched"] * 1e9,
                          "ingest_ns_per_sample": peer["per_sample"] * 1e9,
                          "steady_ms_per_recorded_s": {k: v * 1e3 for k, v in (r["steady_parts"] or {}).items()}}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
