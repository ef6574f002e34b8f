"""Ground truth from the ranks' own step logs: what the collective actually did.

Each rank writes ``step t_start t_comm_start t_end extra_s`` per step (wall clock: every lab
namespace shares the host's clock, so the ranks' times compare directly, which no production
cluster allows). From them:

- the **step period** and compute / all-reduce time per rank, before and after onset;
- the **slowdown**: how much longer the group's step got after onset;
- the **straggler lag**: how late the faulty rank enters each all-reduce behind the median of
  its peers, step by step (steps are numbered alike on every rank) - "one rank N ms late per
  step", the quantity EW-1 is about. A rank 15 ms late does not always lengthen the step by
  15 ms: on this loaded 2-core machine its peers' all-reduce, no longer contending with it for
  the CPU, gets shorter.
"""
from __future__ import annotations

import statistics
from pathlib import Path
from typing import Any

Step = tuple[int, float, float, float, float]


def read_steps(path: Path) -> list[Step]:
    """A rank's step log: (step, t_start, t_comm_start, t_end, extra_s) per line."""
    out: list[Step] = []
    try:
        text = path.read_text()
    except OSError:
        return out
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        p = line.split()
        if len(p) == 5:
            try:
                out.append((int(p[0]), float(p[1]), float(p[2]), float(p[3]), float(p[4])))
            except ValueError:
                continue  # a line cut by a kill
    return out


def measured_period(path: Path, since: float, until: float) -> float | None:
    st = [s for s in read_steps(path) if since <= s[1] < until]
    if len(st) < 5:
        return None
    return (st[-1][1] - st[0][1]) / (len(st) - 1)


def _segment(st: list[Step]) -> dict[str, Any] | None:
    if len(st) < 3:
        return None
    periods = [b[1] - a[1] for a, b in zip(st, st[1:])]
    return {"period_s": statistics.median(periods), "compute_s": statistics.median(s[2] - s[1] for s in st),
            "comm_s": statistics.median(s[3] - s[2] for s in st), "steps": len(st)}


def step_stats(logs: list[Path], t0: float, onset: float | None, end: float,
               faulty: int | None) -> dict[str, Any]:
    """Per rank ``n<i>``: before/after onset (the whole run when healthy); for a fault run also
    ``slowdown_s`` and ``straggler_lag_s`` (before/after) of the faulty rank. After onset starts
    5 s late, past the fault's set-up."""
    cut = onset or end
    ranks = [read_steps(p) for p in logs]
    out: dict[str, Any] = {}
    for i, st in enumerate(ranks):
        res: dict[str, Any] = {"steps": len(st)}
        for label, lo, hi in (("before", t0, cut), ("after", cut + 5, end)):
            seg = _segment([s for s in st if lo <= s[1] < hi])
            if seg:
                res[label] = seg
        out[f"n{i}"] = res
    if faulty is None or onset is None:
        return out
    b = out[f"n{faulty}"]
    if "before" in b and "after" in b:
        out["slowdown_s"] = b["after"]["period_s"] - b["before"]["period_s"]
    by_step = [{s[0]: s[2] for s in st} for st in ranks]
    lag: dict[str, float] = {}
    for label, lo, hi in (("before", t0, cut), ("after", cut + 5, end)):
        xs = []
        for k, t in by_step[faulty].items():
            if not lo <= t < hi:
                continue
            peers = [m[k] for j, m in enumerate(by_step) if j != faulty and k in m]
            if len(peers) == len(ranks) - 1:
                xs.append(t - statistics.median(peers))
        if xs:
            lag[label] = statistics.median(xs)
    out["straggler_lag_s"] = lag
    return out
