"""Mutational fuzzing of every parser skewd runs on input it does not control.

    python bench/fuzz.py                                  # every target, 20 s each, 2 processes
    python bench/fuzz.py --inputs 1000000 --procs 2 --out /tmp/fuzz   # the long run (docs/reliability.md)
    python bench/fuzz.py --targets pcap,wire --seconds 60
    python bench/fuzz.py --target pcap --reproduce /tmp/fuzz/crashes/pcap/<file>.bin

Each target starts from real samples (the shipped rule packs and rule tests, the recorded
/proc, sysfs and NVML fixtures, the vLLM and exporter pages in tests/fixtures and
../shared/vllm-metrics, the public captures in ../shared/pcaps and tests/fixtures/pkt, a
capture bundle and wire messages written by skewd itself) and feeds the parser mutants: byte
flips and splices, interesting numbers (2**64, 1e309, NaN, 400-digit integers), a dictionary of
the format's own tokens, and structure-aware edits (JSON values of the wrong type or nested
thousands deep, YAML aliases and anchors, pcapng options, bundle files re-sealed with valid
CRCs so the content, not the checksum, is what is wrong).

Every input is derived from (target, --seed, its index) alone, so a finding reproduces from its
index. A long run stops cleanly on SIGTERM or Ctrl-C: each worker writes its figures and the
table says where each target got to (``next index``); ``--start N --inputs M`` into a new
``--out`` continues with inputs N..N+M-1. Per target the harness counts inputs, exceptions of the parser's *documented* error
type (handled), anything else (unhandled: a bug; the input is saved under ``--out/crashes``),
hangs (an input using more than ``--timeout`` seconds of CPU: interrupted by SIGPROF, or killed
by the watchdog when stuck in C code), and the worker's peak RSS. Hangs are measured in CPU
time, not wall time, so a worker starved by a busy machine is not mistaken for one. Workers run under an address-space
cap (``--memory``) so a memory bomb shows up as a MemoryError instead of taking the machine.

The fuzzer is split by idea: this module is the harness (workers under CPU-time and memory
limits, counting, crash files, merging shards, the command line); :mod:`fuzz_mutate` is the
mutation engine, :mod:`fuzz_targets` the per-parser targets (with :mod:`fuzz_nvml`,
:mod:`fuzz_bundle`) and :mod:`fuzz_seeds` where their inputs start.

Exit status: 0 when no target had an unhandled exception or a hang, 1 otherwise.
"""
from __future__ import annotations

import argparse
import hashlib
import json
import multiprocessing as mp
import os
import random
import resource
import shutil
import signal
import sys
import tempfile
import time
import traceback
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from fuzz_seeds import ROOT
from fuzz_targets import TARGETS, Target, _expected  # noqa: F401 (Target: for callers of fuzz.Target)

SETUP_FAILED = 3
#: inputs kept per bug (by index): enough to re-check after a fix that none of them still fails
MAX_INDICES = 1000


class Hang(BaseException):
    """Raised by SIGPROF inside an input that used more CPU time than the per-input timeout."""


#: the CPU-time timer ticks this many times per timeout (see :class:`_Watch`)
TICKS_PER_TIMEOUT = 5


class _Watch:
    """The per-input CPU-time limit, armed once per worker rather than once per input.

    A periodic ITIMER_PROF ticks every ``timeout / TICKS_PER_TIMEOUT`` seconds of the worker's
    CPU time. The loop only writes the index of the input it is running into ``current``
    (-1 between inputs); a tick that finds the same input as the previous
    ``TICKS_PER_TIMEOUT`` ticks raises :class:`Hang` in it. That input has then used at least
    ``timeout`` of CPU (the ticks span TICKS_PER_TIMEOUT intervals) and less than
    ``timeout * (1 + 1/TICKS_PER_TIMEOUT)``. Two ``setitimer`` calls per input cost more than
    a /proc or sysfs parse does."""

    def __init__(self) -> None:
        self.current = -1
        self._seen = -1
        self._ticks = 0

    def on_tick(self, signum: int, frame: Any) -> None:
        cur = self.current
        if cur < 0 or cur != self._seen:
            self._seen, self._ticks = cur, 0
            return
        self._ticks += 1
        if self._ticks >= TICKS_PER_TIMEOUT:
            self._seen, self._ticks = -1, 0
            raise Hang()


def _on_alarm(signum: int, frame: Any) -> None:
    raise Hang()


def _on_term(signum: int, frame: Any) -> None:
    """SIGTERM stops a worker like Ctrl-C: its figures are written and the run can go on with
    ``--start``."""
    raise KeyboardInterrupt()


def _cpu_seconds(pid: int) -> float:
    """User + system CPU seconds of process ``pid`` (0.0 when it is gone)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _where(tb: Any) -> str:
    """The innermost frame inside skewd's own code (not bench/), else the innermost frame."""
    frames = traceback.extract_tb(tb)
    mine = [f for f in frames if f.filename.startswith(str(ROOT)) and "/bench/" not in f.filename
            and "/tests/" not in f.filename]
    f = (mine or frames or [None])[-1]
    if f is None:
        return "?"
    return f"{os.path.relpath(f.filename, ROOT)}:{f.lineno} ({f.name})"


@dataclass
class Stats:
    target: str
    shard: int
    part: int = 0
    inputs: int = 0
    handled: int = 0
    unhandled: int = 0
    hangs: int = 0
    seconds: float = 0.0
    cpu_seconds: float = 0.0  # the worker's own CPU time: its rate on a machine shared with other work
    peak_rss_kb: int = 0
    baseline_rss_kb: int = 0
    slowest_s: float = 0.0
    first_index: int = 0
    next_index: int = 0
    bugs: dict[str, dict] = field(default_factory=dict)  # key → {count, type, message, where, index, file}


def _record(st: Stats, out: Path, key: str, info: dict, data: bytes | None) -> None:
    bug = st.bugs.get(key)
    if bug is None:
        fname = ""
        if data is not None:
            d = out / "crashes" / st.target
            d.mkdir(parents=True, exist_ok=True)
            stem = hashlib.sha1(key.encode()).hexdigest()[:12]
            (d / f"{stem}.bin").write_bytes(data)
            (d / f"{stem}.txt").write_text(f"{key}\nindex {info['index']}\n\n{info.get('traceback', '')}")
            fname = str(d / f"{stem}.bin")
        bug = st.bugs[key] = {**{k: v for k, v in info.items() if k != "traceback"}, "count": 0, "file": fname,
                              "indices": []}
    bug["count"] += 1
    if len(bug.setdefault("indices", [])) < MAX_INDICES:  # to re-run every one of them (--index) after a fix
        bug["indices"].append(info["index"])


def _stats_path(out: Path, target: str, shard: int, part: int, suffix: str = "") -> Path:
    return out / "stats" / f"{target}-{shard}-{part}{suffix}.json"


def _write_stats(st: Stats, out: Path, suffix: str = "") -> None:
    p = _stats_path(out, st.target, st.shard, st.part, suffix)
    p.parent.mkdir(parents=True, exist_ok=True)
    tmp = p.with_suffix(".tmp")
    tmp.write_text(json.dumps(st.__dict__))
    tmp.replace(p)


def worker(name: str, shard: int, part: int, seed: int, start: int, stop: int, deadline: float, timeout: float,
           out: str, memory: int, progress: Any) -> None:
    """Fuzz inputs ``start..stop-1`` of ``name`` (until ``deadline``, a time.time())."""
    outp = Path(out)
    if memory:
        resource.setrlimit(resource.RLIMIT_AS, (memory, memory))
    import warnings

    warnings.simplefilter("ignore")
    import logging

    logging.disable(logging.CRITICAL)  # parsers log what they reject; millions of lines help nobody
    t = TARGETS[name]
    try:
        ctx = t.load()
        expected = _expected(name)
        t.make(ctx, random.Random(0))
    except Exception:  # noqa: BLE001 - the harness itself is broken for this target: say so, stop
        traceback.print_exc()
        os._exit(SETUP_FAILED)
    st = Stats(name, shard, part, first_index=start, next_index=start,
               baseline_rss_kb=resource.getrusage(resource.RUSAGE_SELF).ru_maxrss)
    signal.signal(signal.SIGTERM, _on_term)
    # CPU time, not wall time: on a machine shared with other work a starved worker is not a hang
    signal.signal(signal.SIGPROF, _on_alarm)
    signal.setitimer(signal.ITIMER_PROF, 10 * timeout)
    try:  # first use: lazy imports and caches, not counted as an input
        t.run(ctx, t.make(ctx, random.Random(f"{name}:warm-up")))
    except BaseException:  # noqa: BLE001 - the input's outcome does not matter here
        pass
    finally:
        signal.setitimer(signal.ITIMER_PROF, 0)
    watch = _Watch()
    signal.signal(signal.SIGPROF, watch.on_tick)
    tick = timeout / TICKS_PER_TIMEOUT
    signal.setitimer(signal.ITIMER_PROF, tick, tick)
    t0 = time.monotonic()
    c0 = time.process_time()
    last_write = t0
    try:
        for i in range(start, stop):
            if time.time() >= deadline:
                break
            data = t.make(ctx, random.Random(f"{name}:{seed}:{i}"))
            progress.value = i
            began = time.perf_counter()
            try:
                watch.current = i
                t.run(ctx, data)
                watch.current = -1
            except expected:
                watch.current = -1
                st.handled += 1
            except Hang:
                watch.current = -1
                st.hangs += 1
                _record(st, outp, f"hang: > {timeout:g}s CPU", {"type": "Hang", "message": f"input used > {timeout:g}s of CPU",
                                                            "where": "", "index": i}, data)
            except (KeyboardInterrupt, SystemExit):
                raise
            except BaseException as e:  # noqa: BLE001 - every other exception is what we are looking for
                watch.current = -1
                where = _where(e.__traceback__)
                st.unhandled += 1
                _record(st, outp, f"{type(e).__name__} at {where}",
                        {"type": type(e).__name__, "message": str(e)[:300], "where": where, "index": i,
                         "traceback": "".join(traceback.format_exception(e))[-6000:]}, data)
            took = time.perf_counter() - began
            if took > st.slowest_s:
                st.slowest_s = took
            st.inputs += 1
            st.next_index = i + 1
            now = time.monotonic()
            if now - last_write >= 5.0:
                st.seconds = now - t0
                st.cpu_seconds = time.process_time() - c0
                st.peak_rss_kb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
                _write_stats(st, outp)
                last_write = now
    except KeyboardInterrupt:  # stopped (SIGTERM, Ctrl-C): the input it was on is not counted
        pass
    finally:
        signal.setitimer(signal.ITIMER_PROF, 0)
        st.seconds = time.monotonic() - t0
        st.cpu_seconds = time.process_time() - c0
        st.peak_rss_kb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        _write_stats(st, outp)
        cleanup = ctx.get("dir") if isinstance(ctx, dict) else None
        if isinstance(cleanup, Path):
            shutil.rmtree(cleanup.parent if cleanup.name == "in" else cleanup, ignore_errors=True)


@dataclass
class Job:
    target: str
    shard: int
    part: int
    start: int
    stop: int
    deadline: float


def run_jobs(jobs: list[Job], procs: int, seed: int, timeout: float, out: Path, memory: int,
             log: Callable[[str], None]) -> None:
    """Run jobs ``procs`` at a time, each in its own process. A worker stuck on one input (in C
    code, where SIGPROF cannot interrupt) for 5x the timeout of CPU time, or 60x of wall time,
    is killed and its input recorded as a hang; a
    worker that dies (a crash in C, the kernel's OOM killer) has its input recorded as
    unhandled. Either way the job continues after that input in a new process."""
    ctx = mp.get_context("fork")
    pending = list(jobs)
    running: list[list[Any]] = []  # [job, proc, progress, last index, since]
    grace = max(5 * timeout, 10.0)
    try:
        _supervise(ctx, pending, running, procs, seed, timeout, out, memory, log, grace)
    except KeyboardInterrupt:  # stopped: every worker writes its figures before it exits
        for item in running:
            if item[1].is_alive():
                item[1].terminate()
        for item in running:
            item[1].join(30)
        raise


def _supervise(ctx: Any, pending: list[Job], running: list[list[Any]], procs: int, seed: int, timeout: float,
               out: Path, memory: int, log: Callable[[str], None], grace: float) -> None:
    """run_jobs' loop: start workers, restart a job after a killed or dead worker."""
    while pending or running:
        while pending and len(running) < procs:
            j = pending.pop(0)
            progress = ctx.Value("q", j.start, lock=False)  # one writer: no lock per input
            p = ctx.Process(target=worker, args=(j.target, j.shard, j.part, seed, j.start, j.stop, j.deadline,
                                                 timeout, str(out), memory, progress), daemon=True)
            p.start()
            running.append([j, p, progress, -1, (time.monotonic(), _cpu_seconds(p.pid))])
        time.sleep(0.2)
        still = []
        for item in running:
            j, p, progress, last, since = item
            cur = int(progress.value)
            if not p.is_alive():
                p.join()
                if p.exitcode == SETUP_FAILED:
                    raise SystemExit(f"fuzz target {j.target}: setting up its seeds failed (traceback above)")
                if p.exitcode != 0:
                    _killed(out, j, cur, f"worker died (exit {p.exitcode}): a crash in native code or a memory kill",
                            hang=False)
                    log(f"  {j.target}#{j.shard}: worker died (exit {p.exitcode}) at input {cur}")
                    if cur + 1 < j.stop and time.time() < j.deadline:
                        pending.insert(0, Job(j.target, j.shard, j.part + 1, cur + 1, j.stop, j.deadline))
                continue
            if cur != last:
                item[3], item[4] = cur, (time.monotonic(), _cpu_seconds(p.pid))
                still.append(item)
                continue
            cpu = _cpu_seconds(p.pid) - since[1]
            if cpu > grace or time.monotonic() - since[0] > 12 * grace:
                p.kill()
                p.join()
                _killed(out, j, cur, f"hang: stuck > {grace:g}s CPU in native code (killed by the watchdog)", hang=True)
                log(f"  {j.target}#{j.shard}: input {cur} stuck ({cpu:.0f}s CPU): killed, recorded as a hang")
                if cur + 1 < j.stop and time.time() < j.deadline:
                    pending.insert(0, Job(j.target, j.shard, j.part + 1, cur + 1, j.stop, j.deadline))
                continue
            still.append(item)
        running[:] = still


def _killed(out: Path, j: Job, index: int, key: str, hang: bool) -> None:
    """Count the input a killed worker was on (regenerate it with --index)."""
    st = Stats(j.target, j.shard, j.part, inputs=1, hangs=int(hang), unhandled=int(not hang),
               first_index=index, next_index=index + 1)
    _record(st, out, key, {"type": "Hang" if hang else "Died", "message": key, "where": "", "index": index}, None)
    _write_stats(st, out, ".killed")


def merge(out: Path) -> dict[str, dict]:
    """Per target: totals over every stats file (shards, and parts after a killed worker)."""
    by: dict[str, dict] = {}
    for p in sorted((out / "stats").glob("*.json")):
        try:
            s = Stats(**json.loads(p.read_text()))
        except (OSError, ValueError, TypeError):
            continue
        agg = by.setdefault(s.target, {"target": s.target, "inputs": 0, "handled": 0, "unhandled": 0, "hangs": 0,
                                       "cpu_seconds": 0.0, "worker_cpu_seconds": 0.0, "peak_rss_kb": 0, "baseline_rss_kb": 0,
                                       "slowest_s": 0.0, "bugs": {}, "next_index": {}})
        agg["inputs"] += s.inputs
        agg["handled"] += s.handled
        agg["unhandled"] += s.unhandled
        agg["hangs"] += s.hangs
        agg["cpu_seconds"] += s.seconds  # (wall seconds of the workers; the name is kept for old readers)
        agg["worker_cpu_seconds"] += s.cpu_seconds
        agg["peak_rss_kb"] = max(agg["peak_rss_kb"], s.peak_rss_kb)
        agg["baseline_rss_kb"] = max(agg["baseline_rss_kb"], s.baseline_rss_kb)
        agg["slowest_s"] = max(agg["slowest_s"], s.slowest_s)
        # where each shard goes on (--start) if the run was stopped: parts after a killed worker continue it
        agg["next_index"][s.shard] = max(agg["next_index"].get(s.shard, 0), s.next_index)
        for k, b in s.bugs.items():
            if k in agg["bugs"]:
                agg["bugs"][k]["count"] += b["count"]
                agg["bugs"][k].setdefault("indices", []).extend(b.get("indices", []))
            else:
                agg["bugs"][k] = dict(b)
    for agg in by.values():
        agg["what"] = TARGETS[agg["target"]].what
        agg["inputs_per_second"] = agg["inputs"] / agg["cpu_seconds"] if agg["cpu_seconds"] else 0.0
        agg["inputs_per_cpu_second"] = agg["inputs"] / agg["worker_cpu_seconds"] if agg["worker_cpu_seconds"] else 0.0
    return by


def fuzz(targets: list[str], *, inputs: int = 0, seconds: float = 0.0, procs: int = 2, seed: int = 1,
         timeout: float = 5.0, out: Path | None = None, memory: int = 3 << 30, start: int = 0,
         log: Callable[[str], None] = lambda s: None) -> dict[str, dict]:
    """Run the harness; returns per-target totals (see :func:`merge`). With ``inputs``, each
    target's inputs are split over ``procs`` shards; otherwise each target runs ``seconds``
    of wall time in one process (targets side by side, ``procs`` at a time)."""
    out = Path(out or tempfile.mkdtemp(prefix="skewd-fuzz-"))
    shutil.rmtree(out / "stats", ignore_errors=True)
    shutil.rmtree(out / "crashes", ignore_errors=True)
    for t in targets:
        if t not in TARGETS:
            raise SystemExit(f"unknown target {t!r}; known: {', '.join(TARGETS)}")
    jobs: list[Job] = []
    if inputs:
        per = (inputs + procs - 1) // procs
        jobs = [Job(t, k, 0, start + k * per, start + min(inputs, (k + 1) * per), float("inf"))
                for t in targets for k in range(procs)]
    else:
        jobs = [Job(t, 0, 0, 0, 1 << 62, 0.0) for t in targets]
    if not inputs:  # deadlines start when a job starts, not when it was queued
        for j in jobs:
            j.deadline = -seconds
    try:
        _run_timed(jobs, procs, seed, timeout, out, memory, log)
    except KeyboardInterrupt:
        log("stopped: the figures below are what ran; continue a target with --start <its next index>")
    return merge(out)


def _run_timed(jobs: list[Job], procs: int, seed: int, timeout: float, out: Path, memory: int,
               log: Callable[[str], None]) -> None:
    """run_jobs, with relative deadlines (negative: seconds from the job's start) made absolute
    as each batch of ``procs`` jobs starts."""
    for i in range(0, len(jobs), procs):
        batch = jobs[i:i + procs]
        for j in batch:
            if j.deadline < 0:
                j.deadline = time.time() + 3.0 - j.deadline  # + the worker's set-up time
        run_jobs(batch, procs, seed, timeout, out, memory, log)


def _table(res: dict[str, dict]) -> str:
    head = (f"{'target':14} {'inputs':>11} {'unhandled':>9} {'hangs':>5} {'inputs/s':>9} {'/CPU s':>7} "
            f"{'peak RSS':>9} {'slowest':>8}")
    lines = [head, "-" * len(head)]
    for name, a in res.items():
        lines.append(f"{name:14} {a['inputs']:>11,} {a['unhandled']:>9} {a['hangs']:>5} {a['inputs_per_second']:>9.0f} {a['inputs_per_cpu_second']:>7.0f} "
                     f"{a['peak_rss_kb'] / 1024:>7.0f}MB {a['slowest_s']:>7.2f}s")
    for name, a in res.items():
        if len(a["next_index"]) == 1:
            lines.append(f"  {name}: next index {next(iter(a['next_index'].values()))} (--start)")
    for name, a in res.items():
        for k, b in sorted(a["bugs"].items(), key=lambda kv: -kv[1]["count"]):
            lines.append(f"  {name}: {k} x{b['count']}: {b['message'][:160]!r} (input {b['file'] or b['index']})")
    return "\n".join(lines)


def reproduce(target: str, path: Path | None, index: int | None, seed: int) -> int:
    """Run one input (a saved file, or regenerated from its index) and show what happens."""
    t = TARGETS[target]
    ctx = t.load()
    data = path.read_bytes() if path else t.make(ctx, random.Random(f"{target}:{seed}:{index}"))
    try:
        t.run(ctx, data)
    except _expected(target) as e:
        print(f"handled: {type(e).__name__}: {e}")
        return 0
    print("no exception")
    return 0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--targets", default=",".join(TARGETS), help=f"comma-separated (default all: {', '.join(TARGETS)})")
    ap.add_argument("--target", help="one target (with --reproduce)")
    ap.add_argument("--inputs", type=int, default=0, help="inputs per target, split over the processes")
    ap.add_argument("--start", type=int, default=0,
                    help="first input index (continue an earlier run of --inputs N with --start N)")
    ap.add_argument("--seconds", type=float, default=20.0, help="wall seconds per target and shard when --inputs is 0")
    ap.add_argument("--procs", type=int, default=2)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--timeout", type=float, default=5.0, help="seconds one input may run before it counts as a hang")
    ap.add_argument("--memory", type=int, default=3 << 30, help="address-space cap of a worker, bytes (0: none)")
    ap.add_argument("--out", type=Path, default=None, help="where crashes and stats go (default: a temp dir)")
    ap.add_argument("--reproduce", type=Path, help="run one saved input of --target and show what happens")
    ap.add_argument("--index", type=int, help="run input number N of --target (regenerated from --seed)")
    ap.add_argument("--json", action="store_true", help="also print one JSON line with the figures")
    a = ap.parse_args(argv)
    if a.reproduce or a.index is not None:
        return reproduce(a.target, a.reproduce, a.index, a.seed)
    signal.signal(signal.SIGTERM, _on_term)  # `kill <pid>` stops the run with its figures written
    targets = [t for t in a.targets.split(",") if t]
    out = a.out or Path(tempfile.mkdtemp(prefix="skewd-fuzz-"))
    t0 = time.time()
    res = fuzz(targets, inputs=a.inputs, seconds=0.0 if a.inputs else a.seconds, procs=a.procs, seed=a.seed,
               timeout=a.timeout, out=out, memory=a.memory, start=a.start,
               log=lambda s: print(s, file=sys.stderr, flush=True))
    wall = time.time() - t0
    print(_table(res))
    print(f"wall {wall:.0f}s with {a.procs} process(es); crashes and stats in {out}")
    if a.json:
        print(json.dumps({"benchmark": "fuzz", "wall_seconds": wall, "procs": a.procs, "seed": a.seed,
                          "timeout": a.timeout, "targets": res}, default=str))
    bad = sum(r["unhandled"] + r["hangs"] for r in res.values())
    return 1 if bad else 0


if __name__ == "__main__":
    raise SystemExit(main())
