"""The aligner as it was before it was vectorised (controller/align.py at 3c3fcc0), kept
verbatim as the oracle for test_align_equivalence.py: the fast aligner must give exactly these
ctl_* values and GroupReports for the same summaries. Do not optimise this file."""
from __future__ import annotations

from bisect import insort
from collections import deque
from dataclasses import dataclass, field
from typing import Iterable, Mapping, Sequence

import numpy as np


@dataclass
class Step:
    """One aligned collective: node → (start, bytes or NaN)."""

    members: dict[str, tuple[float, float]]

    @property
    def first(self) -> float:
        return min(t for t, _ in self.members.values())

    @property
    def last(self) -> float:
        return max(t for t, _ in self.members.values())


@dataclass
class GroupReport:
    """What alignment found for one TP group at one evaluation: evidence for incidents."""

    group: str
    watermark: float
    steps: int  # complete steps (every live peer present)
    spread_median_s: float
    lag_median_s: dict[str, float] = field(default_factory=dict)
    lag_excess_s: dict[str, float] = field(default_factory=dict)
    last_share: dict[str, float] = field(default_factory=dict)
    missing_share: dict[str, float] = field(default_factory=dict)
    period_s: float = float("nan")
    unaligned: str = ""


def estimate_period(events: Mapping[str, np.ndarray]) -> float:
    """Lower median of the per-node median gaps between consecutive bursts (NaN if unknown)."""
    gaps = sorted(float(np.median(np.diff(v))) for v in events.values() if len(v) >= 3)
    if not gaps or any(g != g for g in gaps):
        return float("nan")
    return gaps[(len(gaps) - 1) // 2]


def align(events: Mapping[str, np.ndarray], nbytes: Mapping[str, np.ndarray] | None, window: float) -> list[Step]:
    """Group bursts into steps: walking all starts in time order, a step collects at most one
    burst per node, all within ``window`` of the step's first burst. A node's second burst or a
    burst past the window opens the next step. Correct while a straggler's lag stays below
    ``window`` and ``window`` below the step period (the caller picks it from both)."""
    rows: list[tuple[float, str, float]] = []
    for node, starts in events.items():
        b = nbytes.get(node) if nbytes else None
        for i, t in enumerate(starts):
            rows.append((float(t), node, float(b[i]) if b is not None and i < len(b) else float("nan")))
    rows.sort()
    steps: list[Step] = []
    cur: dict[str, tuple[float, float]] = {}
    t0 = 0.0
    for t, node, by in rows:
        if cur and (t - t0 > window or node in cur):
            steps.append(Step(cur))
            cur = {}
        if not cur:
            t0 = t
        cur[node] = (t, by)
    if cur:
        steps.append(Step(cur))
    return steps


def group_metrics(steps: Sequence[Step], live: Sequence[str], clock_error: Mapping[str, float],
                  min_fraction: float) -> tuple[dict[str, dict[str, float]], GroupReport]:
    """Per-node ctl_* values for one TP group from its aligned steps (see controller/catalogue.py)."""
    live = list(live)
    n = len(live)
    complete = [s for s in steps if n >= 2 and all(m in s.members for m in live)]
    quorum = max(2, int(np.ceil(min_fraction * n))) if n > 2 else 1  # kept in step: pairs count one-burst steps
    partial = [s for s in steps if len([m for m in s.members if m in live]) >= quorum]
    out: dict[str, dict[str, float]] = {node: {} for node in live}
    rep = GroupReport(group="", watermark=float("nan"), steps=len(complete), spread_median_s=float("nan"))
    for node in live:
        out[node]["ctl_aligned_steps"] = float(len(complete))
        out[node]["ctl_clock_error_seconds"] = float(clock_error.get(node, 0.0))
    if partial:
        for node in live:
            miss = sum(1 for s in partial if node not in s.members) / len(partial)
            out[node]["ctl_step_missing_ratio"] = miss
            rep.missing_share[node] = miss
    if not complete:
        return out, rep
    err = np.array([clock_error.get(m, 0.0) for m in live])
    T = np.array([[s.members[m][0] for m in live] for s in complete])  # [steps, nodes]
    B = np.array([[s.members[m][1] for m in live] for s in complete])
    first_idx = np.argmin(T, axis=1)
    first = T[np.arange(len(T)), first_idx]
    lag = T - first[:, None]
    unc = err[None, :] + err[first_idx][:, None]
    excess = np.maximum(0.0, lag - unc)
    spread = T.max(axis=1) - first
    # last "by more than the clock uncertainty": separated from the runner-up by more than the
    # two clocks' combined error
    order = np.argsort(T, axis=1)
    last_idx, second_idx = order[:, -1], order[:, -2]
    rows = np.arange(len(T))
    margin = T[rows, last_idx] - T[rows, second_idx]
    clear_last = margin > (err[last_idx] + err[second_idx])
    rep.spread_median_s = float(np.median(spread))
    for j, node in enumerate(live):
        o = out[node]
        o["ctl_arrival_lag_seconds"] = float(np.median(lag[:, j]))
        o["ctl_arrival_lag_excess_seconds"] = float(np.median(excess[:, j]))
        o["ctl_arrival_last_share_ratio"] = float(np.mean((last_idx == j) & clear_last))
        o["ctl_step_spread_seconds"] = rep.spread_median_s
        rep.lag_median_s[node] = o["ctl_arrival_lag_seconds"]
        rep.lag_excess_s[node] = o["ctl_arrival_lag_excess_seconds"]
        rep.last_share[node] = o["ctl_arrival_last_share_ratio"]
    ok = ~np.isnan(B).any(axis=1)
    if ok.sum() >= 1:
        per_node = np.median(B[ok], axis=0)
        med = float(np.median(per_node))
        if med > 0:
            for j, node in enumerate(live):
                out[node]["ctl_collective_bytes_dev_ratio"] = float((per_node[j] - med) / med)
    return out, rep


def stage_gap(prev_steps: np.ndarray, next_steps: np.ndarray) -> float:
    """Median time from each step start of stage s-1 to the first step start of stage s at or
    after it and before stage s-1's next step (NaN without such pairs)."""
    if len(prev_steps) == 0 or len(next_steps) == 0:
        return float("nan")
    prev_steps = np.sort(prev_steps)
    next_steps = np.sort(next_steps)
    idx = np.searchsorted(next_steps, prev_steps, side="left")
    gaps = []
    for k, i in enumerate(idx):
        if i >= len(next_steps):
            continue
        b = next_steps[i]
        limit = prev_steps[k + 1] if k + 1 < len(prev_steps) else np.inf
        if b < limit:
            gaps.append(b - prev_steps[k])
    return float(np.median(gaps)) if gaps else float("nan")


class BurstLog:
    """One node's recent collective bursts (start, bytes), time-ordered, pruned by age."""

    def __init__(self) -> None:
        self.items: deque[tuple[float, float]] = deque()

    def add(self, bursts: Iterable[tuple[float, float]]) -> None:
        for t, b in bursts:
            if self.items and t < self.items[-1][0]:
                lst = list(self.items)  # rare: a re-sent or reordered summary
                if (t, b) not in lst:
                    insort(lst, (t, b))
                self.items = deque(lst)
            elif not self.items or (t, b) != self.items[-1]:
                self.items.append((t, b))

    def prune(self, before: float) -> None:
        while self.items and self.items[0][0] < before:
            self.items.popleft()

    def window(self, lo: float, hi: float) -> tuple[np.ndarray, np.ndarray]:
        sel = [(t, b) for t, b in self.items if lo < t <= hi]
        if not sel:
            return np.empty(0), np.empty(0)
        a = np.array(sel, dtype=float)
        return a[:, 0], a[:, 1]


@dataclass
class NodeClock:
    last_summary_t: float = float("-inf")
    clock_error: float = 0.0


class Aligner:
    """Keeps every node's bursts and clock state; derives ctl_* signals per evaluation."""

    def __init__(self, window: float, max_skew: float, unsynced_clock_error: float, min_fraction: float,
                 stale_after: float, horizon: float) -> None:
        self.window = window
        self.max_skew = max_skew
        self.unsynced_clock_error = unsynced_clock_error
        self.min_fraction = min_fraction
        self.stale_after = stale_after
        self.horizon = horizon
        self.bursts: dict[str, BurstLog] = {}
        self.clocks: dict[str, NodeClock] = {}
        self.reports: dict[str, GroupReport] = {}

    def observe(self, node: str, t: float, synced: bool, max_error: float | None,
                bursts: Sequence[tuple[float, float]]) -> None:
        c = self.clocks.setdefault(node, NodeClock())
        c.last_summary_t = max(c.last_summary_t, t)
        # unknown or unsynced: assume the configured worst case, so a node we cannot time is
        # never named culprit for its clock
        c.clock_error = float(max_error) if synced and max_error is not None else self.unsynced_clock_error
        if bursts:
            self.bursts.setdefault(node, BurstLog()).add(bursts)

    def live(self, nodes: Iterable[str], now: float) -> list[str]:
        return [n for n in nodes if n in self.clocks and now - self.clocks[n].last_summary_t <= self.stale_after]

    def derive(self, now: float, tp_groups: Mapping[str, Sequence[str]],
               pp_groups: Mapping[str, Sequence[Sequence[str]]]) -> dict[str, dict[str, float]]:
        """ctl_* values per node at ``now``. Each group is measured up to its *settled* time
        (the oldest latest-summary among its live nodes), so a peer whose summary for the
        newest interval has not arrived yet is not mistaken for a missing burst."""
        out: dict[str, dict[str, float]] = {}
        for node, c in self.clocks.items():
            out.setdefault(node, {})["ctl_summary_age_seconds"] = max(0.0, now - c.last_summary_t)
        stage_steps: dict[str, np.ndarray] = {}
        group_rates: dict[str, tuple[int, dict[str, float]]] = {}  # kept in step: EW-3 reference
        for name, nodes in tp_groups.items():
            live = self.live(nodes, now)
            if not live:
                continue
            settled = min(self.clocks[n].last_summary_t for n in live)
            ev: dict[str, np.ndarray] = {}
            by: dict[str, np.ndarray] = {}
            for n in live:
                log = self.bursts.get(n)
                ev[n], by[n] = log.window(settled - self.window, settled) if log else (np.empty(0), np.empty(0))
            period = estimate_period(ev)
            w = self.max_skew if period != period else min(self.max_skew, 0.5 * period)
            rates = {}
            for n in live:
                if not len(by[n]) or not np.isfinite(by[n]).any():
                    rates = {}
                    break
                rates[n] = float(np.nansum(by[n])) / self.window
            if rates:
                group_rates[name] = (len(nodes), rates)
            # two members' clocks may disagree by more than the matching window: no alignment
            errs = sorted((self.clocks[n].clock_error for n in live), reverse=True)
            pair_err = errs[0] + (errs[1] if len(errs) > 1 else 0.0)
            if len(live) >= 2 and pair_err >= w:
                self.reports[name] = GroupReport(
                    group=name, watermark=settled, steps=0, spread_median_s=float("nan"), period_s=period,
                    unaligned=(f"clock error up to {pair_err * 1e3:.1f} ms between two members is not "
                               f"below the step matching window {w * 1e3:.1f} ms"))
                for n in live:
                    out.setdefault(n, {}).update(ctl_aligned_steps=0.0, ctl_clock_error_seconds=self.clocks[n].clock_error)
                continue
            steps = align(ev, by, w)
            vals, rep = group_metrics(steps, live, {n: self.clocks[n].clock_error for n in live}, self.min_fraction)
            rep.group, rep.watermark, rep.period_s = name, settled, period
            self.reports[name] = rep
            for n, v in vals.items():
                out.setdefault(n, {}).update(v)
            if steps:
                stage_steps[name] = np.array([s.first for s in steps if len(s.members) >= max(1, len(live) // 2)])
        for name, (size, rates) in group_rates.items():
            others = [r for g, (sz, rs) in group_rates.items() if g != name and sz == size for r in rs.values()]
            ref = float(np.median(others)) if others else float("nan")
            if ref > 0:
                for n, r in rates.items():
                    out[n]["ctl_collective_bytes_ref_ratio"] = r / ref
        for name, stages in pp_groups.items():
            for members in stages:  # a pipeline's nodes say how many stages it has (EW-2's scope)
                for n in members:
                    out.setdefault(n, {})["ctl_pp_stages"] = float(len(stages))
            times = []
            for members in stages:
                key = next((g for g, nodes in tp_groups.items() if tuple(nodes) == tuple(members)), None)
                if key is not None and key in stage_steps:
                    times.append(stage_steps[key])
                elif len(members) == 1 and members[0] in self.bursts:
                    t, _ = self.bursts[members[0]].window(now - self.window, now)
                    times.append(t)
                else:
                    times.append(np.empty(0))
            gaps = [stage_gap(times[i - 1], times[i]) for i in range(1, len(times))]
            finite = [g for g in gaps if g == g]
            med = float(np.median(finite)) if finite else float("nan")
            for s_, members in enumerate(stages):  # kept in step: both sides of a hand-off
                near = [gaps[i] for i in (s_ - 1, s_) if 0 <= i < len(gaps) and gaps[i] == gaps[i]]
                if not near:
                    continue
                g = max(near)
                for n in members:
                    out.setdefault(n, {})["ctl_pp_gap_seconds"] = g
                    if med > 0:
                        out[n]["ctl_pp_gap_ratio"] = g / med
        for log in self.bursts.values():
            log.prune(now - self.horizon)
        return out
