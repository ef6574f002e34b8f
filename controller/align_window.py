"""Incremental alignment of one TP group's window: each tick measures only what moved.

The controller measures every TP group over the last ``alignment.window`` (30 s) at every
evaluation (1 s): aligning ~600 steps x 8 members again each tick cost ~0.6 ms a group, 80 ms of
a 140 ms tick at 1,000 nodes. Between two ticks the window drops about a second of bursts at its
start and adds about a second at its end; everything between is the same bursts, aligned the
same way. :class:`GroupWindow` keeps the previous tick's bursts in walk order, where the walk
opened steps, and the steps' rows (:class:`~skewd.controller.align.StepRows`), and re-walks only

* the head, when the window's new start cuts through a step: from the first kept burst to the
  first gap longer than the matching window (the walk always opens a step there, and from an
  opening on it continues as it did before: :func:`~skewd.controller.align.walk_opens`), and
* the tail: from the opening of the last step it held, over the new bursts.

The medians over the window (:func:`~skewd.controller.align.rows_metrics`) are taken over all
the rows as before. Anything it cannot prove unchanged takes the full alignment
(:func:`~skewd.controller.align.align_arrays`): another live set or clock error, a matching
window (it follows the estimated step period) that would walk the held bursts differently; a burst log that was reordered (a late or re-sent summary inserted bursts before its
newest) or holds a NaN start; a window that moved back; a kept count that differs from the log
(pruned or added below the old end); ties of one node or non-finite starts among the new bursts.
tests/controller/test_align_incremental.py holds it equal to the full alignment, bit for bit.

The aligner now measures a group of two members or more in a step table across groups
(:mod:`skewd.controller.align_batch`), which also takes bursts that start before the held
window's end (agents report a step once it has settled); a GroupWindow still measures a group
of one this way, aligns any group from scratch (:meth:`GroupWindow.align_full`), and keeps
every group's key, counters and table slot.
"""
from __future__ import annotations

from typing import Sequence

import numpy as np

from .align_steps import Aligned, StepRows, align_arrays, walk_opens


class GroupWindow:
    """One TP group's aligned window from the previous tick (what :meth:`measure` may reuse);
    owned by :class:`~skewd.controller.align.Aligner`, one per group."""

    def __init__(self) -> None:
        self.key: tuple | None = None  # (live, clock errors, burst-log stamps)
        self.window = float("nan")  # the matching window the steps were walked with
        self.lo = self.hi = float("nan")
        self.t = np.empty(0)  # the window's bursts in walk order (time, then node name)
        self.b = np.empty(0)
        self.col = np.empty(0, dtype=np.int64)
        self.opens = np.empty(0, dtype=bool)
        self.nsteps = 0
        self.live: list[str] = []
        self.rows: StepRows | None = None
        self.reused = 0  # ticks measured incrementally (tests look)
        self.full = 0  # ticks aligned from scratch
        #: the group's slot in the aligner's StepTable of its size (align_batch.py), when its
        #: window is held there instead of here; then ``key``, ``lo``, ``hi`` and ``window``
        #: describe that window, and ``ends`` each member's burst-log position after ``hi``
        self.slot: int | None = None
        self.table = None
        self.ends: list[int] = []

    def measure(self, live: Sequence[str], starts: Sequence[np.ndarray], nbytes: Sequence[np.ndarray],
                window: float, err: np.ndarray, lo: float, hi: float, stamp: tuple
                ) -> tuple["Aligned | GroupWindow", StepRows]:
        """The aligned steps and their rows of the bursts ``starts[j]`` (with ``nbytes[j]``) of
        ``live[j]`` in (``lo``, ``hi``], as :func:`align_arrays` and :meth:`StepRows.of` give
        them; the steps as this window itself when measured incrementally (``nsteps`` and
        ``firsts`` as an :class:`Aligned` has them: built only when a pipeline asks). Only what
        the next tick needs is kept: a window's state is ~250 KB a group, and 125 groups of it
        rewritten every tick slowed the store's writes as much as it saved. ``stamp`` changes
        whenever a member's burst log changed other than by appending
        (see :meth:`~skewd.controller.align.BurstLog.stamp`)."""
        key = (tuple(live), tuple(err.tolist()), stamp)
        if self.key == key and lo >= self.lo and hi >= self.hi and self.rows is not None \
                and (window == self.window or self._same_walk(window)):
            got = self._extend(len(live), starts, nbytes, window, err, lo, hi, live)
            if got is not None:
                self.reused += 1
                return got
        al, rows, walked = self.align_full(live, starts, nbytes, window, err)
        if not walked:  # the reference walk's order (ties of a node, NaN): nothing to extend
            self.key, self.rows = None, None
            return al, rows
        opens = np.ones(len(al.t), dtype=bool)
        opens[1:] = al.step[1:] != al.step[:-1]
        self._keep(key, window, lo, hi, al.t, al.nbytes, al.col, opens, al.nsteps, rows)
        self.live = list(live)
        return al, rows

    def align_full(self, live: Sequence[str], starts: Sequence[np.ndarray], nbytes: Sequence[np.ndarray],
                   window: float, err: np.ndarray) -> tuple[Aligned, StepRows, bool]:
        """The window aligned from scratch, its rows, and whether its steps are the vectorised
        walk's (what an incremental measure may extend: finite starts in walk order, no member
        twice at one time); counted in ``full``."""
        self.full += 1
        al = align_arrays(live, starts, nbytes, window)
        rows = StepRows.of(al.t, al.nbytes, al.col, al.step, al.nsteps, err)
        t, col = al.t, al.col
        d = t[1:] - t[:-1]
        walked = bool(window == window and len(t) and bool(np.isfinite(t).all()) and bool((d >= 0).all())
                      and not bool(((d == 0) & (col[1:] == col[:-1])).any()))
        return al, rows, walked

    def firsts(self, min_members: int) -> np.ndarray:
        """:meth:`Aligned.firsts` of the window's steps."""
        step = np.cumsum(self.opens) - 1
        return Aligned(self.live, self.t, self.b, self.col, step, self.nsteps).firsts(min_members)

    def _old_step(self, i: int) -> int:
        """The step of held burst ``i`` (counted from the held window's first)."""
        return int(np.count_nonzero(self.opens[:i + 1])) - 1

    def _same_walk(self, window: float) -> bool:
        """Whether walking the held bursts with ``window`` instead of the one they were walked
        with opens the same steps. The matching window follows the step period estimated from
        the window's bursts, so it moves a little from tick to tick. The walk compares each
        burst's distance from the start of the step it meets (the step of the burst before it)
        with the matching window, and nothing else: when no such distance lies between the two
        windows, every comparison comes out the same."""
        t = self.t
        if len(t) < 2 or window != window:
            return False
        first = t[np.flatnonzero(self.opens)]  # each step's start
        dist = t[1:] - first[np.cumsum(self.opens[:-1]) - 1]
        lo, hi = min(window, self.window), max(window, self.window)
        return not bool(((dist > lo) & (dist <= hi)).any())

    def _keep(self, key, window, lo, hi, t, b, col, opens, nsteps, rows) -> None:
        self.key, self.window, self.lo, self.hi = key, window, lo, hi
        self.t, self.b, self.col, self.opens, self.nsteps, self.rows = t, b, col, opens, nsteps, rows

    def _extend(self, k: int, starts, nbytes, window: float, err: np.ndarray, lo: float, hi: float,
                live: Sequence[str]) -> "tuple[GroupWindow, StepRows] | None":
        """The previous window moved to (lo, hi]; None when that cannot be shown equal."""
        assert self.rows is not None
        p = int(self.t.searchsorted(lo, side="right"))  # first kept burst
        old_n = len(self.t)
        if p >= old_n:
            return None
        kept = np.bincount(self.col[p:], minlength=k).tolist()
        nt, nb, nc = [], [], []
        for j in range(k):
            s = starts[j]
            m = int(s.searchsorted(self.hi, side="right"))
            if m != kept[j]:  # the log lost or gained bursts below the old end
                return None
            if m < len(s):
                nt.append(s[m:])
                nb.append(np.asarray(nbytes[j], dtype=float)[m:])
                nc.append(np.full(len(s) - m, j, dtype=np.int64))
        L = old_n - p  # kept bursts: positions [0, L) of the new window
        if nt:
            t_new = np.concatenate(nt).astype(float, copy=False)
            b_new = np.concatenate(nb)
            c_new = np.concatenate(nc)
            rank = np.empty(k, dtype=np.int64)  # align() breaks time ties by node name
            rank[sorted(range(k), key=list(live).__getitem__)] = np.arange(k)
            order = np.lexsort((rank[c_new], t_new))
            t_new, b_new, c_new = t_new[order], b_new[order], c_new[order]
            if not np.isfinite(t_new).all() or bool(((t_new[1:] == t_new[:-1]) & (c_new[1:] == c_new[:-1])).any()):
                return None
            t = np.concatenate((self.t[p:], t_new))
            b = np.concatenate((self.b[p:], b_new))
            col = np.concatenate((self.col[p:], c_new))
            opens = np.concatenate((self.opens[p:], np.zeros(len(t_new), dtype=bool)))
        else:
            t, b, col, opens = self.t[p:], self.b[p:], self.col[p:], self.opens[p:].copy()
        n = len(t)
        head = 0  # positions [0, head) walked again
        if not opens[0]:  # the new start cuts through a step: walk to the first long gap
            gaps = np.flatnonzero(t[1:L] - t[:L - 1] > window)
            if not len(gaps):
                return None
            head = int(gaps[0]) + 1
            opens[:head] = walk_opens(t[:head], col[:head], k, window)
        tail = n  # positions [tail, n) walked again (from the last step held before)
        if n > L:
            tail = int(np.flatnonzero(opens[:L])[-1])
            opens[tail:] = walk_opens(t[tail:], col[tail:], k, window)
        a_end = min(head, tail)
        parts = []
        nsteps = 0
        if a_end > 0:  # steps of the head, walked again
            step = np.cumsum(opens[:a_end]) - 1
            nsteps = int(step[-1]) + 1
            parts.append(StepRows.of(t[:a_end], b[:a_end], col[:a_end], step, nsteps, err))
        if a_end < tail:  # steps unchanged: the rows measured before
            s0, s1 = self._old_step(p + a_end), self._old_step(p + tail - 1) + 1
            parts.append(self.rows.cut(s0, s1))
            nsteps += s1 - s0
        if tail < n:  # steps of the tail, walked again
            step = np.cumsum(opens[tail:]) - 1
            k_tail = int(step[-1]) + 1
            parts.append(StepRows.of(t[tail:], b[tail:], col[tail:], step, k_tail, err))
            nsteps += k_tail
        rows = StepRows.join(parts)
        self._keep(self.key, window, lo, hi, t, b, col, opens, nsteps, rows)
        return self, rows
