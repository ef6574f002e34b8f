"""Window functions evaluated over the window store for a rule's entities.

A compiled expression asks for ``kernel(signal over the last dur)`` for its entities; this module
finds each block's window columns, runs the kernel (``functions``) over all of a block's rows at
once, memoises the result for every rule of the tick, computes the common counter rates of many
signals together, and gathers the rows for the rule's entities. Range evaluation (replay) gets
the same values for every tick of a range at once: counting and picking kernels over the whole
range, the others tick by tick. ``EvalContext`` is the per-rule, per-tick state all of it reads.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Iterable

import numpy as np

from skewd.model import Scope

from . import functions
from .slabwindows import quantile_dense


@dataclass
class EvalContext:
    """Per-rule, per-tick evaluation state handed to compiled closures."""

    store: Any  # rules.store.WindowStore
    now: float
    eids: np.ndarray  # entity ids, one per evaluated entity
    node_eids: np.ndarray  # the node-scope entity id of each evaluated entity
    groups: np.ndarray  # peer-group code per entity
    names: np.ndarray  # entity names (object array)
    nodes: np.ndarray  # node names (object array)
    lookback: float
    memo: dict  # per-tick results shared by every rule of one evaluation (see window_vec)
    evidence: list = field(default_factory=list)
    # signal → where each evaluated entity's value sits among the signal's block rows; the
    # engine keeps one per entity frame, valid as long as the frame (store shape unchanged)
    align: dict | None = None
    # Range evaluation (Engine.evaluate_range): ``ticks`` holds the tick times and every value
    # is [ticks x entities]; ``now`` is the tick a per-tick kernel is being run for. ``exist``
    # [ticks x entities] says which entities were in the rule's frame at each tick (None: all),
    # ``born`` maps id(block) → the first tick index of each of its rows (None: all rows old).
    ticks: np.ndarray | None = None
    exist: np.ndarray | None = None
    born: dict | None = None
    ends: np.ndarray | None = None  # per tick, the latest sample time the store held (<= tick)
    # memo key → the group of window functions computed with it (Engine: _batch_plan); None: alone
    batches: dict | None = None
    # the engine's reader of slab windows (slabwindows.py): a store of many nodes' slabs (None: none)
    slabs: Any = None


def identity(W: np.ndarray) -> np.ndarray:
    """The shared no-op transform: window results over a bare signal are memoised across rules
    (a transformed series gets its own closure, so params never leak between rules)."""
    return W


def window_vec(ctx: EvalContext, sig: str, dur: float, key: tuple, kernel: Callable) -> np.ndarray:
    """Evaluate a window kernel over every block of ``sig`` and align to the rule's entities.

    Per tick (``ctx.memo`` lives for one evaluation) each kernel result is computed once for
    all rules that use it (common: many rules read the same rate), and each signal's window
    slices are found once for all kernels over them. Results are kept in block row order and
    gathered for the rule's entities with an alignment that depends only on the store's shape."""
    if ctx.ticks is not None:
        return _window_range(ctx, sig, dur, key, kernel)
    memo = ctx.memo
    vals = memo.get(key)
    if vals is None and ctx.batches:
        group = ctx.batches.get(key)
        if group is not None:
            _batched(ctx, group)
            vals = memo.get(key)
    if vals is None and key[0] in _COUNTER_KINDS:
        vals = _wide_counter(ctx, sig, dur, key[0])
        if vals is not None:
            memo[key] = vals
    if vals is None and ctx.slabs is not None and (len(key) == 2 or key[2] is identity):
        dense = _DENSE.get(key[0])
        if dense is None and key[0] == "quantile":
            dense = quantile_dense(kernel)
        if dense is not None:
            vals = ctx.slabs.stacked(ctx.store, sig, ctx.now - dur, ctx.now, memo, dense, kernel)
            if vals is not None:
                memo[key] = vals
    if vals is None:
        parts = _slices(ctx, sig, dur)
        if len(parts) == 1:
            vals = kernel(*parts[0])
        elif len(parts) >= STACK_MIN_BLOCKS and key[0] in _DENSE and (len(key) == 2 or key[2] is identity):
            vals = _stacked(parts, _DENSE[key[0]], kernel)
        else:
            vals = np.concatenate([np.asarray(kernel(t, W), dtype=float) for t, W in parts]) if parts \
                else np.empty(0)
        memo[key] = vals
    return _gather(ctx, sig, vals)


# -- counter rates computed together ------------------------------------------------------------
# rate() and increase() are the packs' most common window functions (~30 a tick) and on an
# agent's small blocks (a few ports, engines, GPUs) they cost their ~10 numpy calls, not their
# arithmetic. Those of one window length and wrap width are computed in one pass over their
# windows stacked row-wise: the dense fast path of functions.increase/rate is a per-row
# reduction (a row's result does not depend on the rows stacked with it), and a signal's value
# is taken from the stack only when it has no NaN, exactly when the kernel itself returns its
# dense value. A signal with a missing sample, an empty window or a large block (an agent's
# flows gain nothing from stacking) is left to its own kernel call, which takes the path it
# always took. The same memo keys hold the same values; a group is computed when the first of
# its members is needed. (Stacking the cheaper kernels - avg, max, last... - costs more
# bookkeeping than the calls it saves.)
_BATCH_ELEMS = 4096


def _b_increase(W: np.ndarray, wrap_bits: int | None, span: Any) -> np.ndarray:
    return functions.rowsum(functions.counter_steps(W, wrap_bits))  # = functions._increase_dense


def _b_rate(W: np.ndarray, wrap_bits: int | None, span: Any) -> np.ndarray:
    return _b_increase(W, wrap_bits, span) / span  # = functions.rate's dense path (span > 0)


_BATCH: dict[str, Callable] = {"increase": _b_increase, "rate": _b_rate}
BATCHED_KINDS = set(_BATCH)


def batch_plan(windows: Iterable[tuple]) -> dict:
    """memo key → its group: the window functions (``Compiled.windows``) of one kind, window
    length and wrap width, as ((kind, window, wrap bits), {signal: [memo keys]}). Groups of one
    signal are left out (nothing to share)."""
    groups: dict[tuple, dict[str, list]] = {}
    for key, sig, kind, dur, wrap_bits in windows:
        keys = groups.setdefault((kind, float(dur), wrap_bits), {}).setdefault(sig, [])
        if key not in keys:
            keys.append(key)
    plan = {}
    for gk, members in groups.items():
        if len(members) > 1:
            group = (gk, members)
            for keys in members.values():
                for key in keys:
                    plan[key] = group
    return plan


def _batched(ctx: EvalContext, group: tuple) -> None:
    """Compute ``group`` (see ``batch_plan``) at this tick and memoise the value of every member
    whose windows all took the dense path; the others are left to their own kernel call. Done
    once per tick and group."""
    memo = ctx.memo
    done = ("batched", id(group))
    if done in memo:
        return
    memo[done] = True
    (kind, dur, wrap_bits), members = group
    fn = _BATCH[kind]
    buckets: dict[tuple, list] = {}  # (columns, span) → [(signal, block index, rows, W)]
    todo: dict[str, list] = {}  # signal → its blocks' values
    for sig, keys in members.items():
        if keys[0] in memo:
            continue
        parts = _slices(ctx, sig, dur)
        if not parts:
            continue
        segs = []
        for i, (t, W) in enumerate(parts):
            k = W.shape[1]
            if k < 2 or W.size > _BATCH_ELEMS:
                break
            span = None
            if kind == "rate":
                span = t[-1] - t[0]
                if not span > 0:
                    break
            segs.append(((k, span), (sig, i, W)))
        else:
            todo[sig] = [None] * len(parts)
            for bk, seg in segs:
                buckets.setdefault(bk, []).append(seg)
    for (_, span), segs in buckets.items():
        Ws = [W for _, _, W in segs]
        vals = fn(np.concatenate(Ws) if len(Ws) > 1 else Ws[0], wrap_bits, span)
        bad = np.isnan(vals) if functions.has_nan(vals) else None
        a = 0
        for sig, i, W in segs:
            b = a + W.shape[0]
            got = todo.get(sig)
            if got is not None:
                if bad is not None and functions.count_nonzero(bad[a:b]):
                    del todo[sig]  # a NaN: the kernel's own exact path
                else:
                    got[i] = vals[a:b]
            a = b
    for sig, got in todo.items():
        v = got[0] if len(got) == 1 else np.concatenate(got)
        for key in members[sig]:
            memo[key] = v


# -- one window function over many blocks ----------------------------------------------------------
# The controller's store holds one block per node and signal (1,000 blocks of one row for a
# summary signal at 1,000 nodes): a window function over such a signal was one kernel call per
# block, ~1,000 calls for each avg() of a group rule. The kernels whose dense value is a per-row
# reduction (functions.avg_dense & co) are computed instead over the windows of all blocks with
# the same column count, stacked into one matrix, as the counter rates above are across signals.
# A block's value is taken from the stack only when it holds no NaN, exactly when the kernel
# itself returns its dense value; the others, time-major blocks (reduced along their rows) and
# empty windows are left to their own kernel call.
STACK_MIN_BLOCKS = 8  # fewer blocks (an agent's store): the calls cost less than the stacking
_DENSE: dict[str, Callable] = {"avg": functions.avg_dense, "min": functions.min_dense,
                               "max": functions.max_dense, "sum": functions.rowsum, "last": functions.last_dense}


def _stacked(parts: list, dense: Callable, kernel: Callable) -> np.ndarray:
    """The kernel's values over every block's window (``parts``), in block row order."""
    sizes = [W.shape[0] for _, W in parts]
    starts = np.cumsum(sizes) - sizes
    out = np.empty(int(sum(sizes)))
    buckets: dict[int, list[int]] = {}
    alone: list[int] = []
    for i, (_, W) in enumerate(parts):
        k = W.shape[1]
        if k and W.shape[0] and functions._row_major(W):
            buckets.setdefault(k, []).append(i)
        else:
            alone.append(i)
    for idx in buckets.values():
        if len(idx) == 1:
            alone += idx
            continue
        v = dense(np.concatenate([parts[i][1] for i in idx]))
        n = np.array([sizes[i] for i in idx])
        first = np.cumsum(n) - n  # each block's first row in the stack
        if all(x == 1 for x in n):
            dest = starts[idx]
        else:
            dest = np.arange(len(v)) + np.repeat(starts[idx] - first, n)
        out[dest] = v
        if functions.has_nan(v):  # those blocks: their own kernel's exact path
            bad = np.unique(np.searchsorted(first, np.flatnonzero(np.isnan(v)), side="right") - 1)
            alone += [idx[j] for j in bad.tolist()]
    for i in alone:
        out[starts[i]: starts[i] + sizes[i]] = np.asarray(kernel(*parts[i]), dtype=float)
    return out


# -- counter rates over many rows ----------------------------------------------------------------
# An agent's flows (~1,000 rows) are stored time-major in a block whose row capacity runs ahead of
# its rows (984 flows in 1,024 slots), so a window of them is a strided view, and numpy's
# elementwise loops over such a 2-D view cost 1.5-3x those over contiguous memory: the counter
# difference of a 60-s flow window is ~60 of increase()'s ~75 µs. Over every row of the capacity
# the same window is contiguous. Differences, resets and the per-row sums are computed per row
# (nothing crosses rows), so the used rows' values are those of functions.increase/rate's dense
# path, bit for bit, whatever the unused rows hold; they are dropped before the dense path's NaN
# test, and a NaN in a used row leaves the window to the kernel's own exact path.
_COUNTER_KINDS = {"increase", "rate"}


def _wide_counter(ctx: EvalContext, sig: str, dur: float, kind: str) -> np.ndarray | None:
    """increase/rate of ``sig`` over ``dur`` for a single time-major block of at least
    ``functions.WIDE`` used rows and spare capacity, when every row is dense (None otherwise)."""
    blocks = ctx.store.signal_blocks(sig)
    if len(blocks) != 1:
        return None
    blk = next(iter(blocks))
    nr = blk.nrows
    if not blk.time_major or nr < functions.WIDE or nr == blk.data.shape[1]:
        return None
    t, F = blk.window(ctx.now - dur, ctx.now, all_rows=True)
    if F.shape[1] < 2:
        return None
    r = functions.rowsum(functions.counter_steps(F, ctx.store.catalogue[sig].wrap_bits))[:nr]
    if functions.has_nan(r):
        return None
    if kind == "rate":
        span = t[-1] - t[0]
        if not span > 0:
            return None
        r = r / span
    return r


def _gather(ctx: EvalContext, sig: str, vals: np.ndarray) -> np.ndarray:
    """Kernel results in block row order (last axis) → the rule's entities (NaN: no row)."""
    align = ctx.align
    al = align.get(sig) if align is not None else None  # (a signal's scope never changes)
    if al is None:
        rows, ok = _alignment(ctx, sig, ctx.store.catalogue[sig].scope == Scope.NODE)
        n_rows = sum(b.nrows for b in ctx.store.signal_blocks(sig))
        if ok is None and len(rows) == n_rows and bool((rows == np.arange(n_rows)).all()):
            al = (None, None, None)  # the rule's entities are the blocks' rows, in order
        else:
            al = (rows, ok, None if ok is None else rows[ok])
        if align is not None:
            align[sig] = al
    rows, ok, rows_ok = al
    if rows is None:
        # the kernel's own array (shared through the memo by every rule that reads it):
        # nothing downstream writes into a value, and read-only makes sure of it
        if vals.flags.writeable:  # (reading the flag costs a tenth of setting it, ~35 vs ~320 ns)
            vals.flags.writeable = False
        return vals
    if ok is None:
        return vals[rows] if vals.ndim == 1 else vals[..., rows]
    out = np.full(vals.shape[:-1] + (len(rows),), np.nan)
    out[..., ok] = vals[..., rows_ok]
    return out


def peer_range(ctx: EvalContext, x: np.ndarray, kernel: Callable) -> np.ndarray:
    """A peer kernel at every tick of a range, over exactly the entities that were in the
    rule's frame at that tick (the per-tick call's members, in the same order)."""
    T = len(ctx.ticks)
    E = len(ctx.eids)
    x = np.broadcast_to(x, (T, E))
    out = np.empty((T, E))
    exist = ctx.exist
    for j in range(T):
        if exist is None or exist[j].all():
            out[j] = kernel(np.ascontiguousarray(x[j]), ctx.groups)
        else:
            m = exist[j]
            out[j] = np.nan
            if m.any():
                out[j, m] = kernel(np.ascontiguousarray(x[j][m]), ctx.groups[m])
    return out


# Range kernels: window functions whose value at every tick of a range can be computed from the
# block at once with results bit for bit those of the per-tick kernel. Only counting and picking
# samples qualify: sums, means and quantiles are computed per tick (a running sum adds in another
# order), and min/max too (their sign of zero depends on the reduction order). Each takes the
# block's times [n] and values [rows, n] and each tick's column range [lo, hi), returns [T, rows].
def _r_count_valid(W: np.ndarray, los: np.ndarray, his: np.ndarray) -> np.ndarray:
    c = np.zeros((W.shape[0], W.shape[1] + 1), dtype=np.int64)
    np.cumsum(~np.isnan(W), axis=1, out=c[:, 1:])
    return (c[:, his] - c[:, los]).T


def _r_count(t, W, los, his, ticks):
    return _r_count_valid(W, los, his).astype(float)


def _r_present(t, W, los, his, ticks):
    return (_r_count_valid(W, los, his) > 0).astype(float)


def _r_absent(t, W, los, his, ticks):
    return (_r_count_valid(W, los, his) == 0).astype(float)


def _r_last_index(W: np.ndarray, los: np.ndarray, his: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Per tick and row, the column of the latest valid sample in [lo, hi) and whether there is one."""
    idx = functions.ffill_index(~np.isnan(W)) if W.shape[1] else np.full((W.shape[0], 0), -1)
    li = idx[:, np.maximum(his - 1, 0)].T if W.shape[1] else np.full((len(his), W.shape[0]), -1)
    ok = (li >= los[:, None]) & (his > los)[:, None]
    return li, ok


def _r_last(t, W, los, his, ticks):
    li, ok = _r_last_index(W, los, his)
    rows = np.arange(W.shape[0])[None, :]
    v = W[rows, np.maximum(li, 0)] if W.shape[1] else np.full(li.shape, _NAN_)
    return np.where(ok, v, _NAN_)


def _r_delta(t, W, los, his, ticks):
    k = W.shape[1]
    if not k:
        return np.full((len(los), W.shape[0]), _NAN_)
    li, ok = _r_last_index(W, los, his)
    valid = ~np.isnan(W)
    # the earliest valid column at or after each column (k = none)
    nxt = np.where(valid, np.arange(k)[None, :], k)
    nxt = np.minimum.accumulate(nxt[:, ::-1], axis=1)[:, ::-1]
    fi = nxt[:, np.minimum(los, k - 1)].T
    cnt = _r_count_valid(W, los, his)
    rows = np.arange(W.shape[0])[None, :]
    lv = W[rows, np.maximum(li, 0)]
    fv = W[rows, np.minimum(fi, k - 1)]
    return np.where(cnt >= 2, lv - fv, _NAN_)


_NAN_ = np.nan
RANGE_KERNELS: dict[str, Callable] = {"count": _r_count, "present": _r_present, "absent": _r_absent,
                                      "last": _r_last, "delta": _r_delta}


def _range_kernel(key: tuple) -> Callable | None:
    """The range kernel for a memo key of a window function over the bare signal, if any."""
    rk = RANGE_KERNELS.get(key[0])
    if rk is None or (len(key) > 2 and key[2] is not identity):
        return None
    return rk


def _window_range(ctx: EvalContext, sig: str, dur: float, key: tuple, kernel: Callable) -> np.ndarray:
    """``window_vec`` for every tick of a range: [ticks x entities]. Each block's window bounds
    are found for all ticks with one ``searchsorted`` each (the same columns ``Block.window``
    gives per tick); values come from a range kernel or from the per-tick kernel at each tick.
    Rows the store created after a tick read NaN at that tick, as a missing row does per tick."""
    memo = ctx.memo
    ticks = ctx.ticks
    T = len(ticks)
    vals = memo.get(key)
    if vals is None:
        parts = []
        rk = _range_kernel(key)
        saved = ctx.now
        for blk in ctx.store.signal_blocks(sig):
            times = blk.times[: blk.n]
            nr = blk.nrows
            his = np.searchsorted(times, ctx.ends if ctx.ends is not None else ticks, side="right")
            los = np.minimum(np.searchsorted(times, ticks - dur, side="right"), his)
            W = blk.values[:nr, : blk.n]
            if rk is not None:
                v = rk(times, W, los, his, ticks)
            elif key[0] in _COUNTER_KINDS and key[2] is identity:
                v = _r_counter(ctx, key[0], sig, times, W, los, his, kernel)
            else:
                v = np.empty((T, nr))
                lo_l, hi_l = los.tolist(), his.tolist()
                try:
                    for j in range(T):
                        ctx.now = float(ticks[j])
                        lo, hi = lo_l[j], hi_l[j]
                        v[j] = kernel(times[lo:hi], W[:, lo:hi])
                finally:
                    ctx.now = saved
            born = ctx.born.get(id(blk)) if ctx.born else None
            if born is not None:
                late = born[:nr][None, :] > np.arange(T)[:, None]
                if late.any():
                    v = np.where(late, np.nan, v)
            parts.append(v)
        vals = np.concatenate(parts, axis=1) if len(parts) > 1 else (parts[0] if parts else np.empty((T, 0)))
        memo[key] = vals
    return _gather(ctx, sig, vals)


def _r_counter(ctx: EvalContext, kind: str, sig: str, times: np.ndarray, W: np.ndarray, los: np.ndarray,
               his: np.ndarray, kernel: Callable) -> np.ndarray:
    """increase/rate at every tick of a range, [ticks x rows]: the counter steps (the dense
    path's elementwise differences, ``functions.counter_steps``) computed once over the span of
    all the ticks' windows, each tick's window summed from its slice of them (``rowsum`` adds a
    row in numpy's row-major order whatever the layout, so the bits are the per-tick kernel's).
    A tick whose sum is NaN, or whose window has fewer than two columns, runs the per-tick kernel,
    whose exact path it would have taken. The steps were ~60 % of the packs' flow ``increase``."""
    T, nr = len(los), W.shape[0]
    out = np.empty((T, nr))
    a, b = int(los.min()), int(his.max())
    steps = functions.counter_steps(W[:, a:b], ctx.store.catalogue[sig].wrap_bits) if b - a >= 2 else None
    rate = kind == "rate"
    saved = ctx.now
    try:
        for j, (lo, hi) in enumerate(zip(los.tolist(), his.tolist())):
            if hi - lo >= 2 and steps is not None:
                r = functions.rowsum(steps[:, lo - a: hi - a - 1])
                if not functions.has_nan(r):
                    if rate:  # = functions.rate's dense path
                        span = times[hi - 1] - times[lo]
                        r = r / span if span > 0 else np.full(nr, _NAN_)
                    out[j] = r
                    continue
            ctx.now = float(ctx.ticks[j])
            out[j] = kernel(times[lo:hi], W[:, lo:hi])
    finally:
        ctx.now = saved
    return out


def _slices(ctx: EvalContext, sig: str, dur: float) -> list:
    """(times, values) of ``sig``'s window ending now, per block; found once per tick."""
    key = ("slices", sig, dur)
    parts = ctx.memo.get(key)
    if parts is None:
        start = ctx.now - dur
        if ctx.slabs is not None:
            parts = ctx.slabs.slices(ctx.store, sig, start, ctx.now, ctx.memo)
        if parts is None:
            parts = [blk.window(start, ctx.now) for blk in ctx.store.signal_blocks(sig)]
        ctx.memo[key] = parts
    return parts


def _alignment(ctx: EvalContext, sig: str, node_scope: bool) -> tuple[np.ndarray, np.ndarray | None]:
    """For each evaluated entity (its node for a node-scope signal), its row among ``sig``'s
    blocks taken in order, and which entities have a row at all (None: every one)."""
    want = ctx.node_eids if node_scope else ctx.eids
    blocks = list(ctx.store.signal_blocks(sig))
    have = np.concatenate([b.eids[: b.nrows] for b in blocks]) if blocks else np.empty(0, dtype=np.int64)
    if not len(have):
        return np.zeros(len(want), dtype=np.int64), np.zeros(len(want), dtype=bool)
    order = np.argsort(have, kind="stable")
    pos = np.minimum(np.searchsorted(have[order], want), len(have) - 1)
    rows = order[pos]
    ok = have[rows] == want
    return rows, (None if ok.all() else ok)


