"""Incremental alignment of every TP group of one size at once: the aligner's tick (issue 23).

:class:`~skewd.controller.align_window.GroupWindow` measures one group's window from the
previous tick's steps, with ~150 small numpy calls a group and tick (the new bursts, the walk
of the last step, the new steps' rows, joining them to the kept ones, the window's sums and
medians); at 125 groups of 8 those calls' own cost was most of the ~45 ms the alignment took
a tick. A :class:`StepTable` holds the steps of every group of ``k`` members whose window was
walked (a slot per group, one set of arrays across the slots) and extends all of them with a
few dozen numpy calls over all their new bursts together:

* the steps that end at or before a group's new window start are dropped; a window start that
  cuts through a step leaves that group to the caller (it aligns it from scratch);
* the last step held and the new bursts are walked again, every group at once
  (:func:`~skewd.controller.align_steps.walk_opens` with a break where a group's rows begin);
* the new steps' rows (:meth:`~skewd.controller.align_steps.StepRows.of` with each step's own
  clock errors) take the last step's place at the end of the slot's rows;
* the window's counts (missing shares, last shares) are running sums, and its medians one
  partition of its [lag | excess | spread] rows per group (:meth:`StepTable.stats`).

It holds no bursts, only the last step's (walked again next tick), and the per-step first and
last start that tell which steps a new window start drops and whether a new matching window
walks the kept steps alike (see :meth:`GroupWindow._same_walk
<skewd.controller.align_window.GroupWindow._same_walk>`). Everything it gives equals
:func:`~skewd.controller.align_steps.align_arrays` and
:func:`~skewd.controller.align_steps.window_stats` over the whole window, bit for bit
(tests/controller/test_align_batch.py); the caller decides which groups may be extended (same
live members, clock errors and burst logs that only grew at their end).
"""
from __future__ import annotations

from bisect import bisect_right
from dataclasses import dataclass, field
from typing import Any, Sequence

import numpy as np

from .align_steps import StepRows, WindowStats, median0, walk_opens

#: per slot: (name, dtype, fill, trailing shape as a function of k)
_SLOT = [("lo", float, np.nan, ()), ("hi", float, np.nan, ()), ("w", float, np.nan, ()),
         ("s0", np.int64, 0, ()), ("s1", np.int64, 0, ()), ("c0", np.int64, 0, ()), ("c1", np.int64, 0, ()),
         ("npart", np.int64, 0, ()), ("nbok", np.int64, 0, ()),
         ("err", float, np.nan, (1,)), ("rank", np.int64, 0, (1,)), ("pps", np.int64, 0, (1,)),
         ("lcs", np.int64, 0, (1,))]
#: per slot and step row
_STEP = [("first", float, np.nan, ()), ("last", float, np.nan, ()), ("count", np.int64, 0, ()),
         ("complete", bool, False, ()), ("partial", bool, False, ()), ("present", bool, False, (1,))]
#: per slot and complete step row
_COMPLETE = [("B", float, np.nan, (1,)), ("lcl", bool, False, (1,))]


def _shape(k: int, tail: tuple) -> tuple:
    return (k,) * len(tail)


def _group_sums(values: np.ndarray, lens: np.ndarray) -> np.ndarray:
    """Sums of consecutive runs of rows of ``values`` (integers or booleans), ``lens[i]`` rows
    in run ``i`` (empty runs sum to 0): a cumulative sum's differences, exact for integers."""
    cs = np.zeros((len(values) + 1,) + values.shape[1:], dtype=np.int64)
    np.cumsum(values, axis=0, out=cs[1:])
    ends = np.cumsum(lens)
    return cs[ends] - cs[ends - lens]


def _ranges(starts: np.ndarray, lens: np.ndarray) -> np.ndarray:
    """The concatenated ranges ``starts[i] .. starts[i] + lens[i] - 1``."""
    total = int(lens.sum())
    if not total:
        return np.empty(0, dtype=np.int64)
    offs = np.cumsum(lens) - lens
    return np.repeat(starts - offs, lens) + np.arange(total)


class StepTable:
    """The walked windows of the TP groups of ``k`` members (k >= 2), a slot each: owned by the
    :class:`~skewd.controller.align.Aligner`, which loads a group's slot after aligning it from
    scratch and calls :meth:`extend` once a tick for all groups whose window only moved on."""

    def __init__(self, k: int, quorum: int) -> None:
        if k < 2:
            raise ValueError("a StepTable holds groups of two members or more")
        self.k = k
        self.quorum = quorum  # members a step needs to count towards the missing shares
        self.free: list[int] = []
        self.nslots = 0
        self.gcap = self.cap = self.ccap = 0
        self._resize(8, 64, 64)

    # -- storage -----------------------------------------------------------------------------
    def _resize(self, gcap: int, cap: int, ccap: int) -> None:
        for spec, lead in ((_SLOT, (gcap,)), (_STEP, (gcap, cap)), (_COMPLETE, (gcap, ccap)),
                           # per slot, complete step rows as columns: [lag (k) | excess (k) | spread],
                           # so that a slot's medians partition contiguous rows
                           ([("M", float, np.nan, ())], (gcap, 2 * self.k + 1, ccap))):
            for name, dtype, fill, tail in spec:
                new = np.full(lead + _shape(self.k, tail), fill, dtype=dtype)
                old = getattr(self, name, None)
                if old is not None:
                    new[tuple(slice(0, m) for m in old.shape)] = old
                setattr(self, name, new)
        self.gcap, self.cap, self.ccap = gcap, cap, ccap

    def alloc(self) -> int:
        """A free slot."""
        if self.free:
            return self.free.pop()
        if self.nslots == self.gcap:
            self._resize(2 * self.gcap, self.cap, self.ccap)
        self.nslots += 1
        return self.nslots - 1

    def release(self, slot: int) -> None:
        self.s0[slot] = self.s1[slot] = self.c0[slot] = self.c1[slot] = 0
        self.free.append(slot)

    def _room(self, slots: np.ndarray, steps: np.ndarray, complete: np.ndarray) -> None:
        """Make room for ``steps`` more step rows and ``complete`` more complete rows after each
        slot's rows: a slot's rows move to the front of its arrays, which double when that is
        not enough."""
        s0, s1, c0, c1 = self.s0[slots], self.s1[slots], self.c0[slots], self.c1[slots]
        need = (s1 + steps > self.cap) | (c1 + complete > self.ccap)
        if not need.any():
            return
        cap, ccap = self.cap, self.ccap
        while int((s1 - s0 + steps).max()) > cap:
            cap *= 2
        while int((c1 - c0 + complete).max()) > ccap:
            ccap *= 2
        if (cap, ccap) != (self.cap, self.ccap):
            self._resize(self.gcap, cap, ccap)
        for i in np.flatnonzero(need).tolist():
            g = int(slots[i])
            a, e, ca, ce = int(s0[i]), int(s1[i]), int(c0[i]), int(c1[i])
            for name, *_ in _STEP:
                arr = getattr(self, name)
                arr[g, : e - a] = arr[g, a:e]
            for name, *_ in _COMPLETE:
                arr = getattr(self, name)
                arr[g, : ce - ca] = arr[g, ca:ce]
            self.M[g, :, : ce - ca] = self.M[g, :, ca:ce]
            self.s0[g], self.s1[g], self.c0[g], self.c1[g] = 0, e - a, 0, ce - ca

    # -- a group aligned from scratch --------------------------------------------------------
    def load(self, slot: int, t: np.ndarray, step: np.ndarray, nsteps: int, rows: StepRows, lo: float,
             hi: float, window: float, err: np.ndarray, rank: np.ndarray) -> None:
        """Hold a group's window: its bursts' starts in walk order (``t``, the ``step`` each
        joined, at least one step), their rows, the window (lo, hi], the matching window
        walked with, the members' clock errors and name ranks."""
        k = self.k
        n = len(t)
        starts = np.flatnonzero(np.diff(step, prepend=-1))
        ends = np.append(starts[1:], n)
        C = len(rows.spread)
        self.s0[slot] = self.s1[slot] = self.c0[slot] = self.c1[slot] = 0
        self._room(np.array([slot]), np.array([nsteps]), np.array([C]))
        self.first[slot, :nsteps] = t[starts]
        self.last[slot, :nsteps] = t[ends - 1]
        count = ends - starts
        self.count[slot, :nsteps] = count
        partial = count >= self.quorum
        self.complete[slot, :nsteps] = rows.complete
        self.partial[slot, :nsteps] = partial
        self.present[slot, :nsteps] = rows.present
        M = self.M[slot]
        M[:k, :C] = rows.lag.T
        M[k: 2 * k, :C] = rows.excess.T
        M[2 * k, :C] = rows.spread
        self.B[slot, :C] = rows.B
        self.lcl[slot, :C] = rows.last_clear
        self.s1[slot], self.c1[slot] = nsteps, C
        self.pps[slot] = (rows.present & partial[:, None]).sum(axis=0)
        self.npart[slot] = int(partial.sum())
        self.lcs[slot] = rows.last_clear.sum(axis=0)
        self.nbok[slot] = int((~np.isnan(rows.B).any(axis=1)).sum())
        self.lo[slot], self.hi[slot], self.w[slot] = lo, hi, window
        self.err[slot] = err
        self.rank[slot] = rank

    # -- every group's tick at once ------------------------------------------------------------
    def plan(self, S: np.ndarray, LO: np.ndarray, W: np.ndarray, NEW: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Where the windows of slots ``S`` moved to (``LO``, new hi], with matching windows
        ``W`` and their earliest new bursts at ``NEW`` (inf: none), are walked again: per slot
        whether they can be moved on, the first step kept (the steps that end at or before the
        new start go) and the step from which the rest is walked again, the last one held that
        starts before every new burst and that the walk opens whatever comes first at its
        start: the step before it ends earlier and started more than the matching window
        before. A slot cannot be moved on when its new start cuts through a step, when every
        step kept would be walked again, or when the new matching window would walk the steps
        before the walk's restart otherwise (see :meth:`GroupWindow._same_walk
        <skewd.controller.align_window.GroupWindow._same_walk>`)."""
        m = len(S)
        ok = np.ones(m, dtype=bool)
        kf = np.zeros(m, dtype=np.int64)
        r = np.zeros(m, dtype=np.int64)
        s0, s1, wold = self.s0[S].tolist(), self.s1[S].tolist(), self.w[S].tolist()
        lo_l, w_l, new_l = LO.tolist(), W.tolist(), NEW.tolist()
        first, last = self.first, self.last
        for i in range(m):
            g = int(S[i])
            a, e, lo, w = s0[i], s1[i], lo_l[i], w_l[i]
            fi_all, la_all = first[g, a:e], last[g, a:e]
            f = int(la_all.searchsorted(lo, side="right"))  # steps ending by lo: dropped
            if f >= e - a or fi_all[f] <= lo:  # nothing kept, or the start cuts through a step
                ok[i] = False
                continue
            q = min(e - a, int(fi_all.searchsorted(new_l[i], side="left"))) - 1  # starts before the new bursts
            while q > f and not (fi_all[q] - fi_all[q - 1] > w and la_all[q - 1] < fi_all[q]):
                q -= 1
            if q <= f:
                ok[i] = False  # the whole window walked again: from scratch is as cheap
                continue
            wo = wold[i]
            if w != wo:
                # the steps kept as they are, f .. q - 1: each burst's distance from the start
                # of the step before it is at most the step's spread within it, the next step's
                # start from one to the next; none may lie between the two windows
                fi, la = fi_all[f:q], la_all[f:q]
                a_w, b_w = min(w, wo), max(w, wo)
                d1 = la - fi
                d2 = fi[1:] - fi[:-1]
                if ((d1 > a_w) & (d1 <= b_w)).any() or ((d2 > a_w) & (d2 <= b_w)).any():
                    ok[i] = False
                    continue
            kf[i], r[i] = a + f, a + q
        return ok, kf, r

    def extend(self, S: np.ndarray, LO: np.ndarray, HI: np.ndarray, W: np.ndarray, kf: np.ndarray,
               r: np.ndarray, T: np.ndarray, Bn: np.ndarray, C: np.ndarray, I: np.ndarray) -> np.ndarray:
        """Move the windows of slots ``S`` to (``LO``, ``HI``] walked with matching windows
        ``W`` as :meth:`plan` found (first step kept ``kf``, walk again from step ``r``), given
        their members' bursts from step ``r``'s start to ``HI`` (starts ``T``, bytes ``Bn``,
        member ``C``, of slot ``S[I]``, in any order). Returns which slots were moved on; the
        others (ties of one member or non-finite starts among those bursts) are left as they
        were, for the caller to align from scratch."""
        m = len(S)
        k = self.k
        ok = np.ones(m, dtype=bool)
        # the bursts in walk order (time, then member name), per slot
        order = np.lexsort((self.rank[S[I], C], T, I))
        T, Bn, C, I = T[order], Bn[order], C[order], I[order]
        bad = ~np.isfinite(T)
        if len(T) > 1:
            bad[1:] |= (T[1:] == T[:-1]) & (C[1:] == C[:-1]) & (I[1:] == I[:-1])
        if bad.any():
            ok[I[bad]] = False
            keep = ok[I]
            T, Bn, C, I = T[keep], Bn[keep], C[keep], I[keep]
        idx = np.flatnonzero(ok)
        if not len(idx):
            return ok
        Sk = S[idx]
        nb = len(T)
        breaks = np.ones(nb, dtype=bool)
        breaks[1:] = I[1:] != I[:-1]
        opens = walk_opens(T, C, k, W[I], breaks)
        step = np.cumsum(opens) - 1
        starts = np.flatnonzero(opens)
        nsteps = len(starts)
        ends = np.append(starts[1:], nb)
        step_of = I[starts]  # candidate of each new step
        rows = StepRows.of(T, Bn, C, step, nsteps, self.err[S[step_of]])
        count = ends - starts
        partial = count >= self.quorum
        # the steps before the new start go, and those walked again (from r on)
        a, f, e = self.s0[Sk], kf[idx], self.s1[Sk]
        rr = r[idx]
        ndrop, nback = f - a, e - rr
        rs = np.concatenate((np.repeat(Sk, ndrop), np.repeat(Sk, nback)))
        rp = np.concatenate((_ranges(a, ndrop), _ranges(rr, nback)))
        rpart = self.partial[rs, rp]
        rcomp = self.complete[rs, rp]
        nd = int(ndrop.sum())
        dc = _group_sums(rcomp[:nd], ndrop)
        bc = _group_sums(rcomp[nd:], nback)
        gone = self.present[rs, rp] & rpart[:, None]
        self.pps[Sk] -= _group_sums(gone[:nd], ndrop) + _group_sums(gone[nd:], nback)
        self.npart[Sk] -= _group_sums(rpart[:nd], ndrop) + _group_sums(rpart[nd:], nback)
        ca, ce = self.c0[Sk], self.c1[Sk]
        cs = np.concatenate((np.repeat(Sk, dc), np.repeat(Sk, bc)))
        cp = np.concatenate((_ranges(ca, dc), _ranges(ce - bc, bc)))
        lens = np.concatenate((dc, bc))
        lcl_gone = _group_sums(self.lcl[cs, cp], lens)
        bok_gone = _group_sums(~np.isnan(self.B[cs, cp]).any(axis=1), lens)
        n_ = len(Sk)
        self.lcs[Sk] -= lcl_gone[:n_] + lcl_gone[n_:]
        self.nbok[Sk] -= bok_gone[:n_] + bok_gone[n_:]
        self.s0[Sk], self.s1[Sk] = f, rr
        self.c0[Sk], self.c1[Sk] = ca + dc, ce - bc
        # the steps walked again after each slot's kept ones
        cand = np.searchsorted(idx, step_of)  # position in Sk of each new step's slot
        ns = np.bincount(cand, minlength=n_)
        ccand = cand[rows.complete]
        nc = np.bincount(ccand, minlength=n_)
        self._room(Sk, ns, nc)
        sl = Sk[cand]
        p = self.s1[Sk][cand] + np.arange(nsteps) - (np.cumsum(ns) - ns)[cand]
        self.first[sl, p] = T[starts]
        self.last[sl, p] = T[ends - 1]
        self.count[sl, p] = count
        self.complete[sl, p] = rows.complete
        self.partial[sl, p] = partial
        self.present[sl, p] = rows.present
        self.pps[Sk] += _group_sums(rows.present & partial[:, None], ns)
        self.npart[Sk] += _group_sums(partial, ns)
        csl = Sk[ccand]
        cp = self.c1[Sk][ccand] + np.arange(len(ccand)) - (np.cumsum(nc) - nc)[ccand]
        self.M[csl, :k, cp] = rows.lag  # (the advanced indices first: rows x members)
        self.M[csl, k: 2 * k, cp] = rows.excess
        self.M[csl, 2 * k, cp] = rows.spread
        self.B[csl, cp] = rows.B
        self.lcl[csl, cp] = rows.last_clear
        self.lcs[Sk] += _group_sums(rows.last_clear, nc)
        self.nbok[Sk] += _group_sums(~np.isnan(rows.B).any(axis=1), nc)
        self.s1[Sk] += ns
        self.c1[Sk] += nc
        self.lo[Sk], self.hi[Sk], self.w[Sk] = LO[idx], HI[idx], W[idx]
        return ok

    # -- reading a slot ----------------------------------------------------------------------
    def stats(self, slot: int) -> WindowStats:
        """:func:`~skewd.controller.align_steps.window_stats` of the slot's window."""
        k = self.k
        c0, c1 = int(self.c0[slot]), int(self.c1[slot])
        ncomplete = c1 - c0
        npartial = int(self.npart[slot])
        st = WindowStats(ncomplete, npartial, self.pps[slot].tolist() if npartial else [])
        if not ncomplete:
            return st
        M = self.M[slot, :, c0:c1]
        # median0 of lag, excess and spread in one partition: the same order statistics, and
        # (a + b) / 2 of the middle two as median0 takes them
        m, h = ncomplete, ncomplete // 2
        P = np.partition(M, (h - 1, h, m - 1) if m % 2 == 0 and m > 1 else (h, m - 1), axis=1)
        if np.isnan(P[:, m - 1]).any():
            med = np.concatenate((median0(M[:k].T), median0(M[k: 2 * k].T), [median0(M[2 * k])]))
        else:
            med = P[:, h] if m % 2 else (P[:, h - 1] + P[:, h]) / 2
        st.spread = float(med[2 * k])
        st.lag = med[:k].tolist()
        st.excess = med[k: 2 * k].tolist()
        st.last_share = (self.lcs[slot] / ncomplete).tolist()  # np.mean of the booleans
        if self.nbok[slot]:
            B = self.B[slot, c0:c1]
            st.bytes_median = median0(B[~np.isnan(B).any(axis=1)])
        return st

    def nsteps(self, slot: int) -> int:
        return int(self.s1[slot] - self.s0[slot])

    def firsts(self, slot: int, min_members: int) -> np.ndarray:
        """:meth:`~skewd.controller.align_steps.Aligned.firsts` of the slot's steps."""
        a, e = int(self.s0[slot]), int(self.s1[slot])
        return self.first[slot, a:e][self.count[slot, a:e] >= max(1, min_members)]


def log_ends(logs: Sequence[Any], hi: float) -> list[int]:
    """Each burst log's position just after ``hi`` (list index + the log's pruned count; 0 for
    a member without a log), what :func:`gather` compares with next tick."""
    return [bisect_right(lg.ts, hi) + lg.base if lg is not None else 0 for lg in logs]


@dataclass
class Extension:
    """One group's window to move on in its :class:`StepTable`: the new window (lo, hi] and
    matching window, where its members' logs stand (for :func:`gather` next tick), their
    earliest burst not held before; then (:func:`plan_all`) the steps kept and where the walk
    restarts, and the members' bursts from there (arrays, a member's in order); ``ok`` once
    :func:`extend_all` moved it."""

    table: StepTable
    slot: int
    lo: float
    hi: float
    w: float
    new: float  # the earliest start of a burst not held before (inf: none)
    ends: list
    kf: int = 0
    r: int = 0
    restart: float = float("nan")  # the start of step r
    starts: list = field(default_factory=list)  # per member with bursts from ``restart``: their starts ...
    nbytes: list = field(default_factory=list)  # ... and bytes
    counts: list = field(default_factory=list)  # ... and how many
    ok: bool = False


def gather(logs: Sequence[Any], old_ends: Sequence[int], lo: float, hi: float) -> tuple[float, list] | None:
    """The earliest start among the bursts each member's log took since it was held (up to
    ``hi``; inf: none) and each log's position after ``hi``; None when the held bursts are no
    longer the log's (pruned after ``lo``). Bursts a log took since may start before the held
    window's end: agents report a step once it has settled (agent/steps.py), a second or more
    after it started. The logs must be sorted (no NaN start) and stamped as when the window was
    held (nothing inserted before their newest)."""
    new = float("inf")
    ends = []
    for lg, end in zip(logs, old_ends):
        if lg is None:
            if end:
                return None
            ends.append(0)
            continue
        ts, base = lg.ts, lg.base
        held = end - base
        if held < 0 or held > len(ts) or lg.pruned_below > lo:
            return None
        f = bisect_right(ts, hi)
        if f < held:
            return None
        if f > held and ts[held] < new:
            new = ts[held]
        ends.append(f + base)
    return new, ends


def plan_all(exts: Sequence[Extension]) -> None:
    """:meth:`StepTable.plan` for every group waiting; the ones that cannot be moved on get ``ok``
    False at once."""
    for xs in _by_table(exts):
        table = xs[0].table
        S = np.array([x.slot for x in xs], dtype=np.int64)
        ok, kf, r = table.plan(S, np.array([x.lo for x in xs]), np.array([x.w for x in xs]),
                               np.array([x.new for x in xs]))
        restart = table.first[S, r].tolist()
        for x, good, a, b, t in zip(xs, ok.tolist(), kf.tolist(), r.tolist(), restart):
            x.ok, x.kf, x.r, x.restart = good, a, b, t


def extend_all(exts: Sequence[Extension]) -> None:
    """:meth:`StepTable.extend` for every group planned, one call per table."""
    for xs in _by_table([x for x in exts if x.ok]):
        table = xs[0].table
        k = table.k
        counts = [c for x in xs for c in x.counts]
        T = np.concatenate([a for x in xs for a in x.starts] or [np.empty(0)]).astype(float, copy=False)
        B = np.concatenate([a for x in xs for a in x.nbytes] or [np.empty(0)]).astype(float, copy=False)
        C = np.repeat(np.tile(np.arange(k), len(xs)), counts)
        I = np.repeat(np.arange(len(xs)), [sum(x.counts) for x in xs])
        ok = table.extend(np.array([x.slot for x in xs], dtype=np.int64), np.array([x.lo for x in xs]),
                          np.array([x.hi for x in xs]), np.array([x.w for x in xs]),
                          np.array([x.kf for x in xs], dtype=np.int64), np.array([x.r for x in xs], dtype=np.int64),
                          T, B, C, I)
        for x, good in zip(xs, ok.tolist()):
            x.ok = good


def _by_table(exts: Sequence[Extension]) -> list[list[Extension]]:
    by: dict[int, list[Extension]] = {}
    for x in exts:
        by.setdefault(id(x.table), []).append(x)
    return list(by.values())


class SlotSteps:
    """A slot's steps as the pipeline stage gaps read them (``nsteps``, ``firsts``)."""

    def __init__(self, table: StepTable, slot: int) -> None:
        self.table, self.slot = table, slot
        self.nsteps = table.nsteps(slot)

    def firsts(self, min_members: int) -> np.ndarray:
        return self.table.firsts(self.slot, min_members)
