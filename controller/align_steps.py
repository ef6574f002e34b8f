"""Collective steps from burst start times: matching the peers' bursts of one step (walk,
align), their per-step measurements (arrival spread, who came last, bytes), the period, stage
gaps and bytes rates. Pure functions over numpy arrays, shared by the aligner
(:mod:`skewd.controller.align`) and its incremental window (:mod:`skewd.controller.align_window`);
the module doc of :mod:`skewd.controller.align` says what they measure and why."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Mapping, Sequence

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
    per-node way, whose NaN handling it is. When every node has as many bursts (a steady
    group), the matrix is their windows stacked, and its gaps one subtraction."""
    vals = list(events.values())
    c = len(vals[0]) if vals else 0
    if c >= 3 and all(len(v) == c for v in vals):
        X = np.concatenate(vals).reshape(len(vals), c)
        G = X[:, 1:] - X[:, :-1]
        if not np.isnan(G).any():
            n = c - 1
            G.partition(((n - 1) // 2, n // 2), axis=1)
            return lower_median((G[:, (n - 1) // 2] + G[:, n // 2]) / 2)
    diffs = [v[1:] - v[:-1] for v in map(np.asarray, vals) if len(v) >= 3]  # np.diff, less its wrapper
    if not diffs:
        return float("nan")
    n = np.array([len(d) for d in diffs])
    m = np.full((len(diffs), int(n.max())), np.inf)
    for i, d in enumerate(diffs):
        m[i, :len(d)] = d
    if np.isnan(m).any():
        return lower_median([float(np.median(d)) for d in diffs])
    lo, hi = int(n.min()), int(n.max())
    if lo == hi:  # every row as long (the common case): only the middle one or two put in place
        m.partition(((lo - 1) // 2, lo // 2), axis=1)
    else:
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


def walk_opens(t: np.ndarray, col: np.ndarray, k: int, window, breaks: np.ndarray | None = None) -> np.ndarray:
    """Where :func:`align`'s walk opens a step, over rows already in its order (time, then node
    name), all finite and no node twice at one time: ``opens[i]`` is True when row ``i`` starts a
    step. The walk after an opening depends only on the rows from there on, so a walk started
    afresh at any row where it opened continues exactly as the whole walk does (the
    incremental aligner relies on this; :class:`~skewd.controller.align_window.GroupWindow`).

    Several groups' walks at once (:mod:`skewd.controller.align_batch`): ``breaks`` marks the
    rows where a group's rows begin (a walk starts afresh there), ``window`` is then each row's
    group's matching window (an array), ``col`` below ``k`` within each group."""
    n = len(t)
    opens = np.empty(n, dtype=bool)
    if not n:
        return opens
    opens[0] = True
    per_row = breaks is not None
    np.greater(t[1:] - t[:-1], window[1:] if per_row else window, out=opens[1:])
    if per_row:
        opens |= breaks
    seg_start = np.flatnonzero(opens)
    seg_end = np.append(seg_start[1:], n)
    seg = np.cumsum(opens) - 1
    bad = ~((t[seg_end - 1] - t[seg_start]) <= (window[seg_start] if per_row else window))
    key = np.sort(seg * k + col)
    dup = key[1:][key[1:] == key[:-1]] // k
    bad[dup] = True
    if bad.any():
        tl, cl = t.tolist(), col.tolist()
        for s in np.flatnonzero(bad).tolist():
            a, e = int(seg_start[s]), int(seg_end[s])
            _walk(tl[a:e], cl[a:e], float(window[a]) if per_row else window, opens, a)
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
        """The rows of ``nsteps`` steps from their bursts (``step`` numbered from 0); ``err`` the
        members' clock errors, or each step's ([nsteps, members]: steps of several groups of
        one size at once, :mod:`skewd.controller.align_batch`)."""
        n = err.shape[-1]
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
        rows = np.arange(len(T))
        first = T[rows, first_idx]
        lag = T - first[:, None]
        if err.ndim == 1:
            unc = err[None, :] + err[first_idx][:, None]
        else:  # each complete step's own members' errors (the same sums, element by element)
            err = err[is_complete]
            unc = err + err[rows, first_idx][:, None]
        excess = np.maximum(0.0, lag - unc)
        spread = T.max(axis=1) - first
        # last "by more than the clock uncertainty": separated from the runner-up by more than the
        # two clocks' combined error
        order = np.argsort(T, axis=1)
        last_idx, second_idx = order[:, -1], order[:, -2]
        margin = T[rows, last_idx] - T[rows, second_idx]
        clear_last = margin > ((err[last_idx] + err[second_idx]) if err.ndim == 1
                               else (err[rows, last_idx] + err[rows, second_idx]))
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


def quorum(n: int, min_fraction: float) -> int:
    """Members a step needs to count towards the missing shares of a group of ``n``: at least
    ``min_fraction`` of the peers, and (from three members on) at least two, so one node's
    stray burst is not a step. A pair has no such second witness: its steps with one burst
    count, or a member that skips steps could never be seen missing (quorum 2 = both present).
    In a pair a stray burst of one member therefore counts against the other."""
    return max(2, int(np.ceil(min_fraction * n))) if n > 2 else 1


@dataclass
class WindowStats:
    """What the ctl_* values of a group's window are made of: counts over its steps and the
    medians over its complete ones (from :class:`StepRows`, or kept across ticks by
    :mod:`skewd.controller.align_batch`)."""

    ncomplete: int
    npartial: int  # steps with at least the quorum of members
    present: list  # per member, the partial steps it has a burst in (ints)
    spread: float = _NAN  # median arrival spread (complete steps)
    lag: list = field(default_factory=list)  # per member, median lag (floats)
    excess: list = field(default_factory=list)
    last_share: list = field(default_factory=list)
    bytes_median: np.ndarray | None = None  # per member, median burst bytes (complete steps with all bytes)


def window_stats(rows: StepRows, min_fraction: float) -> WindowStats:
    """The :class:`WindowStats` of a window's step rows."""
    n = rows.present.shape[1]
    counts = rows.present.sum(axis=1)
    is_partial = counts >= quorum(n, min_fraction)
    npartial = int(is_partial.sum())
    st = WindowStats(len(rows.lag), npartial,
                     rows.present[is_partial].sum(axis=0).tolist() if npartial else [])
    if not st.ncomplete:
        return st
    st.spread = float(median0(rows.spread))
    st.lag = median0(rows.lag).tolist()
    st.excess = median0(rows.excess).tolist()
    st.last_share = np.mean(rows.last_clear, axis=0).tolist()
    B = rows.B
    ok = ~np.isnan(B).any(axis=1)
    if ok.sum() >= 1:
        st.bytes_median = median0(B[ok])
    return st


def stats_metrics(live: Sequence[str], st: WindowStats, clock_error: Mapping[str, float]
                  ) -> tuple[dict[str, dict[str, float]], GroupReport]:
    """Per-node ctl_* values and the group's report from its window's :class:`WindowStats`."""
    ncomplete, npartial = st.ncomplete, st.npartial
    steps = float(ncomplete)
    out: dict[str, dict[str, float]] = {
        node: {"ctl_aligned_steps": steps, "ctl_clock_error_seconds": float(clock_error.get(node, 0.0))} for node in live}
    rep = GroupReport(group="", watermark=float("nan"), steps=ncomplete, spread_median_s=float("nan"))
    if npartial:
        miss = [(npartial - p) / npartial for p in st.present]
        for node, m in zip(live, miss):
            out[node]["ctl_step_missing_ratio"] = m
        rep.missing_share = dict(zip(live, miss))
    if not ncomplete:
        return out, rep
    spread = rep.spread_median_s = st.spread
    lag, excess, share = list(map(float, st.lag)), list(map(float, st.excess)), list(map(float, st.last_share))
    for node, a, b, c in zip(live, lag, excess, share):
        o = out[node]
        o["ctl_arrival_lag_seconds"] = a
        o["ctl_arrival_lag_excess_seconds"] = b
        o["ctl_arrival_last_share_ratio"] = c
        o["ctl_step_spread_seconds"] = spread
    rep.lag_median_s = dict(zip(live, lag))
    rep.lag_excess_s = dict(zip(live, excess))
    rep.last_share = dict(zip(live, share))
    per_node = st.bytes_median
    if per_node is not None:
        med = float(np.median(per_node))
        if med > 0:
            for j, node in enumerate(live):
                out[node]["ctl_collective_bytes_dev_ratio"] = float((per_node[j] - med) / med)
    return out, rep


def rows_metrics(live: Sequence[str], rows: StepRows, clock_error: Mapping[str, float],
                 min_fraction: float) -> tuple[dict[str, dict[str, float]], GroupReport]:
    """:func:`aligned_metrics` from the group's step rows: the medians and shares over the
    window's steps."""
    return stats_metrics(live, window_stats(rows, min_fraction), clock_error)


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
