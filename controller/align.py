"""Cross-node alignment of collective bursts: the measurement behind TP stragglers (EW-1),
early-stop skew (EW-9), cross-node load skew (EW-3) and pipeline bubbles (EW-2).

Agents report the start time (their own clock, epoch seconds) and optionally the bytes of each
collective burst that started during their summary interval. Every TP peer takes part in every
collective, so the bursts of one step start close together on all peers; a straggler's start
late. Alignment groups the peers' bursts into steps and measures, per step, the arrival spread
(latest − earliest start) and who came last.

Clocks differ: a node whose clock is 5 ms ahead looks 5 ms late. Each node reports its clock
uncertainty (``Summary.clock_sync.max_error_s``); a lag only counts beyond the summed
uncertainty of the two nodes compared, so a badly synced node is never blamed for its clock.
Where two members' clocks may disagree by more than the step matching window (unsynced hosts:
``alignment.unsynced_clock_error``), steps are not matched at all and the group's report says
why: the agents' own step timing (``summary_collective_*``, agent/steps.py) needs no clocks.

Pure functions over numpy arrays; the controller calls :meth:`Aligner.derive` at each
evaluation with its evaluation time. Nothing here reads the clock.
"""
from __future__ import annotations

from bisect import insort
from dataclasses import dataclass, field
from typing import Generator, Iterable, Mapping, Sequence

import numpy as np

_NAN = float("nan")


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
    #: why the group's steps were not matched across its nodes ("" = they were)
    unaligned: str = ""


def estimate_period(events: Mapping[str, np.ndarray]) -> float:
    """The lower median of the per-node median gaps between consecutive bursts (NaN if unknown).

    Lower, not the mean of the two middle ones: a member that sits out steps (EW-9) or whose
    capture misses them only lengthens its own spacing, never shortens it, and in a pair the
    mean of the two took the skipper's half in - a node skipping two steps in three made a 27 ms
    step a 72 ms "period", the matching window (half of it) outgrew a step, and the skipper's
    on-time bursts joined its partner's previous step a period late (ew9 seed 101: an EW-1
    straggler incident on the early-stopping node). Odd groups are unchanged.

    The per-node medians come from one sort of the group's gaps padded to a matrix (the middle
    one or two of each row, averaged as ``np.median`` does): one numpy call instead of one
    ``np.median`` per node, the slowest part of a group's alignment. A NaN gap takes the
    per-node way, whose NaN handling it is."""
    diffs = [v[1:] - v[:-1] for v in map(np.asarray, events.values()) if len(v) >= 3]  # np.diff, less its wrapper
    if not diffs:
        return float("nan")
    n = np.array([len(d) for d in diffs])
    m = np.full((len(diffs), int(n.max())), np.inf)
    for i, d in enumerate(diffs):
        m[i, :len(d)] = d
    if np.isnan(m).any():
        return lower_median([float(np.median(d)) for d in diffs])
    m.sort(axis=1)
    rows = np.arange(len(diffs))
    med = (m[rows, (n - 1) // 2] + m[rows, n // 2]) / 2
    return lower_median(med)


def lower_median(values) -> float:
    """The lower of the two middle values (the middle one of an odd count); NaN if any is NaN."""
    v = np.sort(np.asarray(values, np.float64))
    if not len(v) or np.isnan(v[-1]):
        return float("nan")
    return float(v[(len(v) - 1) // 2])


def align(events: Mapping[str, np.ndarray], nbytes: Mapping[str, np.ndarray] | None, window: float) -> list[Step]:
    """Group bursts into steps: walking all starts in time order, a step collects at most one
    burst per node, all within ``window`` of the step's first burst. A node's second burst or a
    burst past the window opens the next step. Correct while a straggler's lag stays below
    ``window`` and ``window`` below the step period (the caller picks it from both).

    The readable definition; :func:`align_arrays` computes the same steps without a Python loop
    per burst, and the controller uses that."""
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


@dataclass
class Aligned:
    """Steps as arrays, one entry per burst in the order :func:`align` walks them: ``col`` is
    the node's position in ``nodes``, ``step`` the step it joined (steps numbered in time
    order, each holding at most one burst per node)."""

    nodes: list[str]
    t: np.ndarray
    nbytes: np.ndarray
    col: np.ndarray
    step: np.ndarray
    nsteps: int

    def firsts(self, min_members: int) -> np.ndarray:
        """Start (earliest burst) of every step with at least ``min_members`` bursts."""
        head = np.ones(len(self.step), dtype=bool)  # rows are in time order within a step
        head[1:] = self.step[1:] != self.step[:-1]
        first = np.full(self.nsteps, np.nan)
        first[self.step[head]] = self.t[head]
        return first[np.bincount(self.step, minlength=self.nsteps) >= max(1, min_members)]

    def steps(self) -> list[Step]:
        """The same steps as :func:`align` returns."""
        out: list[Step] = [Step({}) for _ in range(self.nsteps)]
        for t, b, c, k in zip(self.t.tolist(), self.nbytes.tolist(), self.col.tolist(), self.step.tolist()):
            out[k].members[self.nodes[c]] = (t, b)
        return out


def _walk(t: Sequence[float], col: Sequence[int], window: float, opens: np.ndarray, offset: int) -> None:
    """:func:`align`'s walk over rows already in order, marking in ``opens`` where steps open."""
    cur: set[int] = set()
    t0 = 0.0
    for i, (ti, c) in enumerate(zip(t, col)):
        if cur and (ti - t0 > window or c in cur):
            opens[offset + i] = True
            cur = set()
        if not cur:
            t0 = ti
        cur.add(c)


def align_arrays(nodes: Sequence[str], starts: Sequence[np.ndarray], nbytes: Sequence[np.ndarray],
                 window: float) -> Aligned:
    """:func:`align` over per-node arrays (``starts[j]``, ``nbytes[j]`` for ``nodes[j]``), same
    steps, vectorised. Bursts more than ``window`` after the previous one always open a step
    (the step's first burst is at most that previous one), so those gaps cut the bursts into
    segments that align independently; a segment spanning at most ``window`` with no node twice
    is exactly one step, and only the others (rare: a lag near the window, a missed burst) are
    walked in Python. Ties and non-finite times fall back to the reference walk, so the result
    is always :func:`align`'s."""
    nodes = list(nodes)
    k = len(nodes)
    sizes = [len(s) for s in starts]
    n = sum(sizes)
    if n == 0:
        e = np.empty(0)
        return Aligned(nodes, e, e, np.empty(0, dtype=np.int64), np.empty(0, dtype=np.int64), 0)
    t = np.concatenate(starts).astype(float, copy=False)
    b = np.concatenate([np.asarray(nbytes[j], dtype=float)[:sizes[j]] if len(nbytes[j]) >= sizes[j]
                        else np.concatenate([np.asarray(nbytes[j], dtype=float),
                                             np.full(sizes[j] - len(nbytes[j]), np.nan)])
                        for j in range(k)])
    col = np.repeat(np.arange(k), sizes)
    rank = np.empty(k, dtype=np.int64)  # align() breaks time ties by node name
    rank[sorted(range(k), key=nodes.__getitem__)] = np.arange(k)
    order = np.lexsort((rank[col], t))
    t, b, col = t[order], b[order], col[order]
    d = t[1:] - t[:-1]
    same = (d == 0) & (col[1:] == col[:-1])
    if not np.isfinite(t).all() or same.any() or not (window == window):
        # one node twice at one time (a re-sent burst): align() orders those by bytes, NaN
        # included; rare enough to take the reference path
        ref = align({nodes[j]: starts[j] for j in range(k)}, {nodes[j]: nbytes[j] for j in range(k)}, window)
        return _from_steps(nodes, ref)
    opens = walk_opens(t, col, k, window)
    step = np.cumsum(opens) - 1
    return Aligned(nodes, t, b, col, step, int(step[-1]) + 1)


def walk_opens(t: np.ndarray, col: np.ndarray, k: int, window: float) -> np.ndarray:
    """Where :func:`align`'s walk opens a step, over rows already in its order (time, then node
    name), all finite and no node twice at one time: ``opens[i]`` is True when row ``i`` starts a
    step. The walk after an opening depends only on the rows from there on, so a walk started
    afresh at any row where it opened continues exactly as the whole walk does (the
    incremental aligner relies on this; :class:`~skewd.controller.align_window.GroupWindow`)."""
    n = len(t)
    opens = np.empty(n, dtype=bool)
    if not n:
        return opens
    opens[0] = True
    np.greater(t[1:] - t[:-1], window, out=opens[1:])
    seg_start = np.flatnonzero(opens)
    seg_end = np.append(seg_start[1:], n)
    seg = np.cumsum(opens) - 1
    bad = ~((t[seg_end - 1] - t[seg_start]) <= window)
    key = np.sort(seg * k + col)
    dup = key[1:][key[1:] == key[:-1]] // k
    bad[dup] = True
    if bad.any():
        tl, cl = t.tolist(), col.tolist()
        for s in np.flatnonzero(bad).tolist():
            a, e = int(seg_start[s]), int(seg_end[s])
            _walk(tl[a:e], cl[a:e], window, opens, a)
    return opens


def _from_steps(nodes: Sequence[str], steps: Sequence[Step]) -> Aligned:
    """Steps (whose members may include nodes not in ``nodes``, ignored) as an :class:`Aligned`."""
    nodes = list(nodes)
    pos = {m: j for j, m in enumerate(nodes)}
    t: list[float] = []
    b: list[float] = []
    col: list[int] = []
    step: list[int] = []
    for i, s in enumerate(steps):
        for m, (tm, bm) in s.members.items():
            j = pos.get(m)
            if j is not None:
                t.append(tm)
                b.append(bm)
                col.append(j)
                step.append(i)
    return Aligned(nodes, np.array(t, dtype=float), np.array(b, dtype=float), np.array(col, dtype=np.int64),
                   np.array(step, dtype=np.int64), len(steps))


def group_metrics(steps: Sequence[Step], live: Sequence[str], clock_error: Mapping[str, float],
                  min_fraction: float) -> tuple[dict[str, dict[str, float]], GroupReport]:
    """Per-node ctl_* values for one TP group from its aligned steps (see controller/catalogue.py)."""
    return aligned_metrics(_from_steps(live, steps), clock_error, min_fraction)


@dataclass
class StepRows:
    """Per-step measurements of a run of consecutive steps, each row depending on its step's
    bursts (and the members' clock errors) alone: so a tick can keep the rows of the steps it
    measured before and compute only new ones (:mod:`skewd.controller.align_window`). Rows of
    ``present``/``complete`` are steps; the other arrays hold the complete steps only."""

    present: np.ndarray  # [steps, nodes] bool: the node has a burst in the step
    complete: np.ndarray  # [steps] bool: every live member has one (2+ members)
    B: np.ndarray  # [complete, nodes] burst bytes
    lag: np.ndarray  # [complete, nodes] start minus the step's first start
    excess: np.ndarray  # [complete, nodes] lag beyond the two clocks' summed error
    spread: np.ndarray  # [complete] last minus first start
    last_clear: np.ndarray  # [complete, nodes] bool: last by more than the clock uncertainty

    @classmethod
    def of(cls, t: np.ndarray, nbytes: np.ndarray, col: np.ndarray, step: np.ndarray, nsteps: int,
           err: np.ndarray) -> "StepRows":
        """The rows of ``nsteps`` steps from their bursts (``step`` numbered from 0)."""
        n = len(err)
        present = np.zeros((nsteps, n), dtype=bool)
        present[step, col] = True
        counts = np.bincount(step, minlength=nsteps)  # live members per step
        is_complete = counts == n if n >= 2 else np.zeros(nsteps, dtype=bool)
        ncomplete = int(is_complete.sum())
        sel = is_complete[step]
        rank = np.cumsum(is_complete) - 1  # complete step → row of T
        r, c = rank[step[sel]], col[sel]
        T = np.empty((ncomplete, n))  # [steps, nodes]
        B = np.empty((ncomplete, n))
        T[r, c] = t[sel]
        B[r, c] = nbytes[sel]
        if not ncomplete:
            z = np.empty((0, n))
            return cls(present, is_complete, B, z, z, np.empty(0), np.zeros((0, n), dtype=bool))
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
        last_clear = (last_idx[:, None] == np.arange(n)[None, :]) & clear_last[:, None]
        return cls(present, is_complete, B, lag, excess, spread, last_clear)

    @property
    def nsteps(self) -> int:
        return len(self.complete)

    def cut(self, lo: int, hi: int) -> "StepRows":
        """Steps ``lo``..``hi - 1`` (views)."""
        a = int(np.count_nonzero(self.complete[:lo]))
        b = a + int(np.count_nonzero(self.complete[lo:hi]))
        return StepRows(self.present[lo:hi], self.complete[lo:hi], self.B[a:b], self.lag[a:b],
                        self.excess[a:b], self.spread[a:b], self.last_clear[a:b])

    @staticmethod
    def join(parts: Sequence["StepRows"]) -> "StepRows":
        """Consecutive runs of steps as one."""
        parts = [p for p in parts if p.nsteps] or list(parts[:1])
        if len(parts) == 1:
            return parts[0]
        return StepRows(*(np.concatenate([getattr(p, f) for p in parts])
                          for f in ("present", "complete", "B", "lag", "excess", "spread", "last_clear")))


def aligned_metrics(al: Aligned, clock_error: Mapping[str, float],
                    min_fraction: float) -> tuple[dict[str, dict[str, float]], GroupReport]:
    """:func:`group_metrics` of aligned steps whose nodes are the group's live nodes."""
    err = np.array([clock_error.get(m, 0.0) for m in al.nodes])
    return rows_metrics(al.nodes, StepRows.of(al.t, al.nbytes, al.col, al.step, al.nsteps, err), clock_error,
                        min_fraction)


def median0(M: np.ndarray) -> np.ndarray:
    """``np.median(M, axis=0)``, bit for bit, in one partition: the order statistics are the
    same values whatever the algorithm, and an even count averages the middle two as
    ``np.median`` does ((a + b) / 2). A NaN (sorted last) takes ``np.median`` itself. Four
    medians a group and tick were a fifth of the alignment's time in numpy's Python wrapper."""
    m = M.shape[0]
    h = m // 2
    P = np.partition(M, (h - 1, h, m - 1) if m % 2 == 0 and m > 1 else (h, m - 1), axis=0)
    if np.isnan(P[m - 1]).any():
        return np.median(M, axis=0)
    return P[h] if m % 2 else (P[h - 1] + P[h]) / 2


def rows_metrics(live: Sequence[str], rows: StepRows, clock_error: Mapping[str, float],
                 min_fraction: float) -> tuple[dict[str, dict[str, float]], GroupReport]:
    """:func:`aligned_metrics` from the group's step rows: the medians and shares over the
    window's steps."""
    n = len(live)
    # a step counts towards missing shares when at least ``min_fraction`` of the peers sent in
    # it, and (from three members on) at least two, so one node's stray burst is not a step. A
    # pair has no such second witness: its steps with one burst count, or a member that skips
    # steps could never be seen missing (quorum 2 = both present). In a pair a stray burst of
    # one member therefore counts against the other.
    quorum = max(2, int(np.ceil(min_fraction * n))) if n > 2 else 1
    counts = rows.present.sum(axis=1)
    is_partial = counts >= quorum
    ncomplete = len(rows.lag)
    npartial = int(is_partial.sum())
    out: dict[str, dict[str, float]] = {node: {} for node in live}
    rep = GroupReport(group="", watermark=float("nan"), steps=ncomplete, spread_median_s=float("nan"))
    for node in live:
        out[node]["ctl_aligned_steps"] = float(ncomplete)
        out[node]["ctl_clock_error_seconds"] = float(clock_error.get(node, 0.0))
    if npartial:
        present = rows.present[is_partial].sum(axis=0).tolist()
        for j, node in enumerate(live):
            miss = (npartial - present[j]) / npartial
            out[node]["ctl_step_missing_ratio"] = miss
            rep.missing_share[node] = miss
    if not ncomplete:
        return out, rep
    rep.spread_median_s = float(median0(rows.spread))
    lag_med = median0(rows.lag).tolist()
    excess_med = median0(rows.excess).tolist()
    last_share = np.mean(rows.last_clear, axis=0).tolist()
    for j, node in enumerate(live):
        o = out[node]
        o["ctl_arrival_lag_seconds"] = float(lag_med[j])
        o["ctl_arrival_lag_excess_seconds"] = float(excess_med[j])
        o["ctl_arrival_last_share_ratio"] = float(last_share[j])
        o["ctl_step_spread_seconds"] = rep.spread_median_s
        rep.lag_median_s[node] = o["ctl_arrival_lag_seconds"]
        rep.lag_excess_s[node] = o["ctl_arrival_lag_excess_seconds"]
        rep.last_share[node] = o["ctl_arrival_last_share_ratio"]
    B = rows.B
    ok = ~np.isnan(B).any(axis=1)
    if ok.sum() >= 1:
        per_node = median0(B[ok])
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


def bytes_rates(nbytes: Mapping[str, np.ndarray], window: float) -> dict[str, float]:
    """Per node of one TP group: bytes of its bursts in the window per second of window, or
    nothing when any member reported no burst bytes (then there is nothing to compare)."""
    out: dict[str, float] = {}
    for node, b in nbytes.items():
        if not len(b) or not np.isfinite(b).any():
            return {}
        out[node] = float(np.nansum(b)) / window
    return out


def reference_ratios(group_rates: Mapping[str, tuple[int, Mapping[str, float]]]) -> dict[str, float]:
    """Each node's collective bytes rate over the median rate of the members of the OTHER TP
    groups of the same size (``group_rates``: group → (configured size, node → rate)); nodes of
    a group without such other groups get nothing.

    Why: in a TP pair a node that sends too few bytes per collective and a partner that sends
    too many look the same from inside the pair (each one's sent bytes are the other's received
    bytes), so the pair alone cannot say whose shard is wrong. Replicas of one model behind one
    load balancer move about the same bytes per second; the member that matches the other
    groups is the healthy one. The caller's rule decides how close "matches" is and falls back
    to reporting the pair when neither member matches (another model, uneven load)."""
    out: dict[str, float] = {}
    for name, (size, rates) in group_rates.items():
        others = [r for g, (sz, rs) in group_rates.items() if g != name and sz == size for r in rs.values()]
        if not others:
            continue
        ref = float(np.median(others))
        if ref > 0:
            for node, r in rates.items():
                out[node] = r / ref
    return out


class BurstLog:
    """One node's recent collective bursts (start, bytes), time-ordered, pruned by age.

    Every summary appends a few bursts (to plain lists: cheap); every evaluation reads a window
    of them (from a numpy mirror of the lists, brought up to date by copying only what was
    appended since, so a window is two ``searchsorted`` and a slice)."""

    def __init__(self) -> None:
        self.ts: list[float] = []
        self.bs: list[float] = []
        self._t = np.empty(0)  # mirror buffers: ts[:_n] sits at [_lo, _lo + _n)
        self._b = np.empty(0)
        self._lo = 0
        self._n = 0
        self._unordered = False  # a NaN start: the lists are no longer sorted by time
        self._reorders = 0  # bursts inserted before the newest (see stamp)

    @property
    def items(self) -> list[tuple[float, float]]:
        return list(zip(self.ts, self.bs))

    def add(self, bursts: Iterable[tuple[float, float]]) -> None:
        ts, bs = self.ts, self.bs
        for t, b in bursts:
            if ts and t < ts[-1]:
                lst = list(zip(ts, bs))  # rare: a re-sent or reordered summary
                self._reorders += 1
                if (t, b) not in lst:
                    insort(lst, (t, b))
                self.ts = ts = [x for x, _ in lst]
                self.bs = bs = [y for _, y in lst]
                self._n = 0
            elif not ts or (t, b) != (ts[-1], bs[-1]):
                if t != t:
                    self._unordered = True
                ts.append(t)
                bs.append(b)

    def add_starts(self, starts: list[float]) -> None:
        """:meth:`add` of finite, sorted starts without bytes (what agents send): appended in
        bulk when none is older than the newest burst (what :meth:`add` does with them one
        by one: unknown bytes never equal, so a repeated start is kept), else one by one."""
        ts = self.ts
        if starts and (not ts or starts[0] >= ts[-1]):
            ts.extend(starts)
            self.bs.extend([_NAN] * len(starts))
            return
        self.add([(t, float("nan")) for t in starts])

    @property
    def stamp(self) -> tuple:
        """Changes whenever the log changed other than by appending at its end or pruning its
        start (an insertion, a NaN start): an incremental aligner may then not reuse what it
        measured before."""
        return (id(self), self._reorders, self._unordered)

    def prune(self, before: float) -> None:
        ts = self.ts
        k = 0
        while k < len(ts) and ts[k] < before:
            k += 1
        if not k:
            return
        del ts[:k]
        del self.bs[:k]
        if k <= self._n:
            self._lo += k
            self._n -= k
        else:
            self._n = 0

    def _sync(self) -> tuple[np.ndarray, np.ndarray]:
        m = len(self.ts)
        if self._n > m:  # lists replaced: mirror again
            self._n = 0
        if self._n == 0:
            self._lo = 0
        if self._lo + m > len(self._t):
            cap = max(64, 2 * m)
            t, b = np.empty(cap), np.empty(cap)
            t[: self._n] = self._t[self._lo: self._lo + self._n]
            b[: self._n] = self._b[self._lo: self._lo + self._n]
            self._t, self._b, self._lo = t, b, 0
        if self._n < m:
            lo = self._lo
            self._t[lo + self._n: lo + m] = self.ts[self._n:]
            self._b[lo + self._n: lo + m] = self.bs[self._n:]
            self._n = m
        return self._t[self._lo: self._lo + m], self._b[self._lo: self._lo + m]

    def window(self, lo: float, hi: float) -> tuple[np.ndarray, np.ndarray]:
        """Bursts with lo < start <= hi: (starts, bytes), read-only views until the next add."""
        t, b = self._sync()
        if self._unordered:
            sel = (t > lo) & (t <= hi)
            return t[sel], b[sel]
        i = int(t.searchsorted(lo, side="right"))
        j = int(t.searchsorted(hi, side="right"))
        return t[i:j], b[i:j]


@dataclass
class NodeClock:
    last_summary_t: float = float("-inf")
    clock_error: float = 0.0


class Aligner:
    """Keeps every node's bursts and clock state; derives ctl_* signals per evaluation.

    ``incremental``: each TP group's window is measured from the previous tick's steps where
    that gives the same result (:mod:`skewd.controller.align_window`); False aligns every
    window from scratch (the tests compare the two)."""

    def __init__(self, window: float, max_skew: float, unsynced_clock_error: float, min_fraction: float,
                 stale_after: float, horizon: float, incremental: bool = True) -> None:
        self.window = window
        self.max_skew = max_skew
        self.unsynced_clock_error = unsynced_clock_error
        self.min_fraction = min_fraction
        self.stale_after = stale_after
        self.horizon = horizon
        self.bursts: dict[str, BurstLog] = {}
        self.clocks: dict[str, NodeClock] = {}
        self.reports: dict[str, GroupReport] = {}
        self.incremental = incremental
        self.windows: dict = {}  # TP group → its GroupWindow (align_window.py) from the previous tick

    def observe(self, node: str, t: float, synced: bool, max_error: float | None,
                bursts: Sequence[tuple[float, float]]) -> None:
        c = self.clocks.setdefault(node, NodeClock())
        c.last_summary_t = max(c.last_summary_t, t)
        # unknown or unsynced: assume the configured worst case, so a node we cannot time is
        # never named culprit for its clock
        c.clock_error = float(max_error) if synced and max_error is not None else self.unsynced_clock_error
        if bursts:
            self.bursts.setdefault(node, BurstLog()).add(bursts)

    def observe_starts(self, node: str, t: float, synced: bool, max_error: float | None,
                       starts: list[float]) -> None:
        """:meth:`observe` of sorted, finite burst starts without bytes (the common summary)."""
        c = self.clocks.get(node)
        if c is None:
            c = self.clocks[node] = NodeClock()
        if t > c.last_summary_t:
            c.last_summary_t = t
        c.clock_error = float(max_error) if synced and max_error is not None else self.unsynced_clock_error
        if starts:
            log = self.bursts.get(node)
            if log is None:
                log = self.bursts[node] = BurstLog()
            log.add_starts(starts)

    def live(self, nodes: Iterable[str], now: float) -> list[str]:
        return [n for n in nodes if n in self.clocks and now - self.clocks[n].last_summary_t <= self.stale_after]

    def derive(self, now: float, tp_groups: Mapping[str, Sequence[str]],
               pp_groups: Mapping[str, Sequence[Sequence[str]]]) -> dict[str, dict[str, float]]:
        """ctl_* values per node at ``now``. Each group is measured up to its *settled* time
        (the oldest latest-summary among its live nodes), so a peer whose summary for the
        newest interval has not arrived yet is not mistaken for a missing burst."""
        steps = self.derive_steps(now, tp_groups, pp_groups)
        while True:
            try:
                next(steps)
            except StopIteration as done:
                return done.value

    def derive_steps(self, now: float, tp_groups: Mapping[str, Sequence[str]],
                     pp_groups: Mapping[str, Sequence[Sequence[str]]]
                     ) -> Generator[str, None, dict[str, dict[str, float]]]:
        """:meth:`derive`, pausing after each TP group (yielding its name) and returning the
        values at the end: a caller on an event loop lets other work run in the pauses (the
        controller keeps taking summaries), which may add to the state between groups but
        never while one is measured."""
        from .align_window import GroupWindow  # it builds on this module's pieces

        out: dict[str, dict[str, float]] = {}
        for node, c in self.clocks.items():
            out.setdefault(node, {})["ctl_summary_age_seconds"] = max(0.0, now - c.last_summary_t)
        stage_steps: dict[str, tuple[Aligned, int]] = {}
        group_rates: dict[str, tuple[int, dict[str, float]]] = {}
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
            rates = bytes_rates(by, self.window)
            if rates:
                group_rates[name] = (len(nodes), rates)
            errs = sorted((self.clocks[n].clock_error for n in live), reverse=True)
            pair_err = errs[0] + (errs[1] if len(errs) > 1 else 0.0)
            if len(live) >= 2 and pair_err >= w:
                # two members' clocks may disagree by more than the matching window: a step
                # lands in the wrong step on the other, every member looks as if it skipped
                # steps (EW-9) or moved odd bytes (EW-3), and no lag means anything. Say so
                # instead of measuring; the clock-free step timing (summary_collective_*) still
                # names stragglers (EW-1-tp-straggler).
                rep = GroupReport(group=name, watermark=settled, steps=0, spread_median_s=float("nan"),
                                  period_s=period, unaligned=(
                                      f"clock error up to {pair_err * 1e3:.1f} ms between two members is not "
                                      f"below the step matching window {w * 1e3:.1f} ms"))
                self.reports[name] = rep
                self.windows.pop(name, None)
                for n in live:
                    out.setdefault(n, {}).update(ctl_aligned_steps=0.0,
                                                 ctl_clock_error_seconds=self.clocks[n].clock_error)
                yield name
                continue
            errs_of = {n: self.clocks[n].clock_error for n in live}
            if self.incremental:
                gw = self.windows.get(name)
                if gw is None:
                    gw = self.windows[name] = GroupWindow()
                logs = [self.bursts.get(n) for n in live]
                al, rows = gw.measure(live, [ev[n] for n in live], [by[n] for n in live], w,  # type: ignore[assignment]
                                      np.array([errs_of[n] for n in live]), settled - self.window, settled,
                                      tuple(lg.stamp if lg is not None else None for lg in logs))
                vals, rep = rows_metrics(live, rows, errs_of, self.min_fraction)
            else:
                al = align_arrays(live, [ev[n] for n in live], [by[n] for n in live], w)
                vals, rep = aligned_metrics(al, errs_of, self.min_fraction)
            rep.group, rep.watermark, rep.period_s = name, settled, period
            self.reports[name] = rep
            for n, v in vals.items():
                out.setdefault(n, {}).update(v)
            if al.nsteps:  # each step's start, for pipeline stages: computed only when one asks
                stage_steps[name] = (al, max(1, len(live) // 2))
            yield name
        for name in [g for g in self.windows if g not in tp_groups]:
            del self.windows[name]
        for n, r in reference_ratios(group_rates).items():
            out.setdefault(n, {})["ctl_collective_bytes_ref_ratio"] = r
        for name, stages in pp_groups.items():
            for members in stages:
                for n in members:
                    out.setdefault(n, {})["ctl_pp_stages"] = float(len(stages))
            times = []
            for members in stages:
                key = next((g for g, nodes in tp_groups.items() if tuple(nodes) == tuple(members)), None)
                if key is not None and key in stage_steps:
                    al, quorum = stage_steps[key]
                    times.append(al.firsts(quorum))
                elif len(members) == 1 and members[0] in self.bursts:
                    t, _ = self.bursts[members[0]].window(now - self.window, now)
                    times.append(t)
                else:
                    times.append(np.empty(0))
            gaps = [stage_gap(times[i - 1], times[i]) for i in range(1, len(times))]
            finite = [g for g in gaps if g == g]
            med = float(np.median(finite)) if finite else float("nan")
            # the gap of a hand-off goes to the stages on BOTH sides of it (a middle stage: the
            # longer of its two): hand-off times alone cannot say which side is slow. In the lab a
            # slow first stage moved the 0->1 gap from 0.1 ms to 42-54 ms, 60-69 % of the step
            # period, which a second stage 2.7x slower would also give; published downstream only,
            # EW-2 named the healthy second stage.
            for s_, members in enumerate(stages):
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
