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

from bisect import bisect_left, bisect_right, insort
from dataclasses import dataclass
from dataclasses import field as dataclass_field
from typing import Any, Generator, Iterable, Mapping, Sequence

import numpy as np

from .align_steps import (  # noqa: F401 - the step pieces, importable from here as before
    Aligned,
    GroupReport,
    Step,
    StepRows,
    _NAN,
    align,
    align_arrays,
    aligned_metrics,
    bytes_rates,
    estimate_period,
    group_metrics,
    lower_median,
    median0,
    reference_ratios,
    quorum,
    rows_metrics,
    stage_gap,
    stats_metrics,
    walk_opens,
)
from .align_batch import Extension, SlotSteps, StepTable, extend_all, gather, log_ends, plan_all
from .align_window import GroupWindow


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
        #: a burst with bytes was taken: the bytes are mirrored too (else windows read NaN bytes)
        self._bytes = False
        self._reorders = 0  # bursts inserted before the newest (see stamp)
        #: bursts pruned so far: list index + base is a burst's position for the log's life
        #: (while the stamp stays: nothing inserted before the newest)
        self.base = 0
        self.pruned_below = float("-inf")  # the latest prune's cutoff: no burst at or after it was pruned

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
            if b == b and not self._bytes:
                self._bytes = True
                self._n = 0  # mirror the bytes from the start

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
        if not self._unordered:  # sorted (no NaN): the first start not before ``before``
            k = bisect_left(ts, before)
        else:
            k = 0
            while k < len(ts) and ts[k] < before:
                k += 1
        if before > self.pruned_below:
            self.pruned_below = before
        if not k:
            return
        del ts[:k]
        del self.bs[:k]
        self.base += k
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
            if self._bytes:
                self._b[lo + self._n: lo + m] = self.bs[self._n:]
            self._n = m
        if not self._bytes:
            return self._t[self._lo: self._lo + m], _nan_bytes(m)
        return self._t[self._lo: self._lo + m], self._b[self._lo: self._lo + m]

    def window(self, lo: float, hi: float) -> tuple[np.ndarray, np.ndarray]:
        """Bursts with lo < start <= hi: (starts, bytes), read-only views until the next add."""
        t, b = self._sync()
        if self._unordered:
            sel = (t > lo) & (t <= hi)
            return t[sel], b[sel]
        # the mirror's searchsorted(side="right"), on the sorted list itself (no numpy call)
        i = bisect_right(self.ts, lo)
        j = bisect_right(self.ts, hi, i)
        return t[i:j], b[i:j]


_NAN_BYTES = [np.full(0, np.nan)]  # read-only NaN, shared by every log without bytes


def _nan_bytes(n: int) -> np.ndarray:
    """``n`` unknown bytes (a read-only view: burst logs whose bursts carry no bytes)."""
    a = _NAN_BYTES[0]
    if len(a) < n:
        a = np.full(max(n, 2 * len(a), 4096), np.nan)
        a.flags.writeable = False
        _NAN_BYTES[0] = a
    return a[:n]


@dataclass
class NodeClock:
    last_summary_t: float = float("-inf")
    clock_error: float = 0.0


@dataclass
class _GroupTick:
    """One TP group's part of a tick (Aligner.derive_steps): its window read, and how it is measured."""

    name: str
    live: list
    settled: float
    period: float
    w: float  # the matching window
    ev: dict
    by: dict
    errs_of: dict  # its members' clock errors
    pair_err: float  # the two largest clock errors of its members, summed
    gw: "GroupWindow | None" = None  # (incremental)
    key: tuple = ()
    ext: "Extension | None" = None  # its step table's move, when only that is needed
    ends: list = dataclass_field(default_factory=list)  # its members' burst-log positions after settled
    logs: list = dataclass_field(default_factory=list)  # its members' burst logs (a step table's group)


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
        self.tables: dict[int, StepTable] = {}  # group size → the windows held across groups (align_batch.py)

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

    def _hold(self, gw: GroupWindow, gt: "_GroupTick", al: Aligned, rows: StepRows, walked: bool,
              err: np.ndarray) -> None:
        """Hold a group's window aligned from scratch in the step table of its size (so the
        next tick moves it on with the others), or nowhere when its steps are not the walk's."""
        k = len(gt.live)
        if not walked or not al.nsteps:
            self._release(gw)
            gw.key = None
            return
        table = self.tables.get(k)
        if table is None:
            table = self.tables[k] = StepTable(k, quorum(k, self.min_fraction))
        if gw.table is not table:
            self._release(gw)
            gw.table, gw.slot = table, table.alloc()
        rank = np.empty(k, dtype=np.int64)  # align() breaks time ties by node name
        rank[sorted(range(k), key=gt.live.__getitem__)] = np.arange(k)
        table.load(gw.slot, al.t, al.step, al.nsteps, rows, gt.settled - self.window, gt.settled, gt.w, err, rank)
        gw.key, gw.lo, gw.hi, gw.window, gw.ends = gt.key, gt.settled - self.window, gt.settled, gt.w, gt.ends
        gw.rows = None  # (its own held window, for a group of one: not this one's)

    @staticmethod
    def _release(gw: GroupWindow) -> None:
        if gw.slot is not None:
            gw.table.release(gw.slot)
        gw.table, gw.slot = None, None

    def _forget_window(self, name: str) -> None:
        gw = self.windows.pop(name, None)
        if gw is not None:
            self._release(gw)

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
        never while one is measured. Every group's window, live members and clock errors are
        read before the first pause, and the groups held in step tables are measured then too
        (align_batch.py); the pauses come as each group's values are made."""

        out: dict[str, dict[str, float]] = {node: {"ctl_summary_age_seconds": max(0.0, now - c.last_summary_t)}
                                            for node, c in self.clocks.items()}
        stage_steps: dict[str, tuple[Any, int]] = {}
        group_rates: dict[str, tuple[int, dict[str, float]]] = {}
        # every group's window first (the groups held in step tables only gathered), then the
        # tables' groups moved on at once, then each group's values in order
        ticks: list[_GroupTick] = []
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
            errs_of = {n: self.clocks[n].clock_error for n in live}
            errs = sorted(errs_of.values(), reverse=True)
            gt = _GroupTick(name, live, settled, period, w, ev, by, errs_of, errs[0] + (errs[1] if len(errs) > 1 else 0.0))
            ticks.append(gt)
            if len(live) >= 2 and gt.pair_err >= w:
                continue  # unaligned (below)
            if self.incremental:
                gw = self.windows.get(name)
                if gw is None:
                    gw = self.windows[name] = GroupWindow()
                gt.gw = gw
                logs = [self.bursts.get(n) for n in live]
                stamps = tuple(lg.stamp if lg is not None else None for lg in logs)
                gt.key = (tuple(live), tuple(errs_of.values()), stamps)
                if len(live) >= 2:  # a step table's group: its window moved on with the others
                    gt.logs = logs
                    lo = settled - self.window
                    got = None
                    if (gw.slot is not None and gw.key == gt.key and lo >= gw.lo and settled >= gw.hi
                            and not any(st is not None and st[2] for st in stamps)):
                        got = gather(logs, gw.ends, lo, settled)
                    if got is None:
                        gt.ends = log_ends(logs, settled)
                    else:
                        gt.ext = Extension(gw.table, gw.slot, lo, settled, w, *got)
                        gt.ends = gt.ext.ends
        exts = [gt.ext for gt in ticks if gt.ext is not None]
        plan_all(exts)
        for gt in ticks:
            x = gt.ext
            if x is not None and x.ok:  # the members' bursts from the restart on: the end of their windows
                lo, restart = x.lo, x.restart
                for n, lg in zip(gt.live, gt.logs):
                    if lg is None:
                        x.counts.append(0)
                        continue
                    e, b = gt.ev[n], gt.by[n]
                    c = len(e) - (bisect_left(lg.ts, restart) - bisect_right(lg.ts, lo))
                    x.counts.append(c)
                    if c:
                        x.starts.append(e[len(e) - c:])
                        x.nbytes.append(b[len(b) - c:])
        extend_all(exts)
        for gt in ticks:
            name, live, settled = gt.name, gt.live, gt.settled
            if len(live) >= 2 and gt.pair_err >= gt.w:
                # two members' clocks may disagree by more than the matching window: a step
                # lands in the wrong step on the other, every member looks as if it skipped
                # steps (EW-9) or moved odd bytes (EW-3), and no lag means anything. Say so
                # instead of measuring; the clock-free step timing (summary_collective_*) still
                # names stragglers (EW-1-tp-straggler).
                rep = GroupReport(group=name, watermark=settled, steps=0, spread_median_s=float("nan"),
                                  period_s=gt.period, unaligned=(
                                      f"clock error up to {gt.pair_err * 1e3:.1f} ms between two members is not "
                                      f"below the step matching window {gt.w * 1e3:.1f} ms"))
                self.reports[name] = rep
                self._forget_window(name)
                for n in live:
                    out.setdefault(n, {}).update(ctl_aligned_steps=0.0, ctl_clock_error_seconds=gt.errs_of[n])
                yield name
                continue
            errs_of = gt.errs_of  # as the tables were moved on with (a pause may have changed a clock since)
            err = np.array([errs_of[n] for n in live])
            starts, nbytes = [gt.ev[n] for n in live], [gt.by[n] for n in live]
            al: Any
            gw = gt.gw
            if gw is None:
                al = align_arrays(live, starts, nbytes, gt.w)
                vals, rep = aligned_metrics(al, errs_of, self.min_fraction)
            elif gt.ext is not None and gt.ext.ok:
                gw.reused += 1
                gw.lo, gw.hi, gw.window, gw.ends = gt.ext.lo, settled, gt.w, gt.ext.ends
                vals, rep = stats_metrics(live, gw.table.stats(gw.slot), errs_of)
                al = SlotSteps(gw.table, gw.slot)
            elif len(live) >= 2:
                al, rows, walked = gw.align_full(live, starts, nbytes, gt.w, err)
                vals, rep = rows_metrics(live, rows, errs_of, self.min_fraction)
                self._hold(gw, gt, al, rows, walked, err)
            else:  # a group of one: its own incremental window (align_window.py)
                self._release(gw)
                al, rows = gw.measure(live, starts, nbytes, gt.w, err, settled - self.window, settled, gt.key[2])
                vals, rep = rows_metrics(live, rows, errs_of, self.min_fraction)
            rep.group, rep.watermark, rep.period_s = name, settled, gt.period
            self.reports[name] = rep
            for n, v in vals.items():
                out.setdefault(n, {}).update(v)
            if al.nsteps:  # each step's start, for pipeline stages: computed only when one asks
                stage_steps[name] = (al, max(1, len(live) // 2))
            yield name
        for name in [g for g in self.windows if g not in tp_groups]:
            self._forget_window(name)
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
