"""Segmented numpy reductions: per-group statistics over arrays grouped contiguously.

The tracker computes every per-flow figure of an interval at once: packets are sorted so each
flow's packets are adjacent (``gs`` = the start of each group, ``first`` = a flag on each group's
first element), and these kernels reduce each segment without a Python loop: quantiles, the
unwrapping of modulo-2**n sequence numbers, a running maximum that excludes the current element,
and the overlap of byte ranges. They know nothing of packets or flows, which is why they are
apart: each can be checked against a plain per-group loop.
"""
from __future__ import annotations

import numpy as np

#: "no value" in int64 state arrays (below any real unwrapped sequence number or time)
NONE = np.int64(-(1 << 62))


def group_quantiles(gid: np.ndarray, val: np.ndarray, gs: np.ndarray, cnt: np.ndarray,
                     qs: tuple[float, ...], lim: int = (1 << 40) - 1) -> list[np.ndarray]:
    """Per-group quantiles (numpy's linear interpolation) of non-negative int64 values.

    Elements are grouped contiguously (``gs`` = group starts); negative values are missing
    and ``cnt`` counts the others per group. One sort of (group << 40 | value): missing
    values sort last in their group, values above ``lim`` (18 minutes of ns) clamp.
    """
    ng = len(gs)
    out = [np.full(ng, np.nan) for _ in qs]
    if len(gid) == 0:
        return out
    if ng < (1 << 22):
        key = np.minimum(val, lim)
        np.putmask(key, val < 0, lim)
        key |= np.left_shift(gid, 40, dtype=np.int64)
        key.sort()
        srt, low = key, lim  # only the few elements the quantiles read are converted
    else:
        srt, low = np.where(val < 0, lim, val)[np.lexsort((np.where(val < 0, lim, val), gid))], -1
    has = cnt > 0
    for o, q in zip(out, qs):
        pos = gs[has] + q * (cnt[has] - 1)
        lo = np.floor(pos).astype(np.int64)
        hi = np.minimum(lo + 1, gs[has] + cnt[has] - 1)
        vlo = (srt[lo] & low).astype(np.float64)
        vhi = (srt[hi] & low).astype(np.float64)
        o[has] = vlo + (vhi - vlo) * (pos - lo)
    return out


def seg_first(first: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(group index per element, index of each group's first element) from a first-flag array."""
    starts = np.flatnonzero(first)
    return np.cumsum(first) - 1, starts


def unwrap(raw: np.ndarray, first: np.ndarray, prev_raw: np.ndarray, prev_u: np.ndarray,
            bits: int) -> np.ndarray:
    """Unwrap a modulo-2**bits sequence per group. ``prev_raw``/``prev_u`` (per group, -1 = none)
    carry the last raw and unwrapped value from before this batch."""
    gi, gs = seg_first(first)
    mod, half = 1 << bits, 1 << (bits - 1)
    prev = np.empty_like(raw)
    prev[1:] = raw[:-1]
    prev[gs] = prev_raw
    have = prev >= 0
    d = np.where(have, ((raw - prev + half) & (mod - 1)) - half, 0)
    base = np.where(prev_raw >= 0, prev_u, raw[gs])
    cs = np.cumsum(d)
    off = cs[gs] - d[gs]
    return base[gi] + cs - off[gi]


def excl_cummax(val: np.ndarray, first: np.ndarray, init: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Per element, the max of ``val`` over earlier elements of its group and the group's
    ``init`` (``NONE`` = nothing); plus each group's inclusive max at its end.

    Segmented cummax as one ``maximum.accumulate``: each element's key is
    (group << 42) + value, so a later group always dominates an earlier one."""
    gi, gs = seg_first(first)
    ng = len(gs)
    n = len(val)
    valid = val != NONE
    vmax = int(val.max()) if n else 0
    vmin = int(np.min(val, where=valid, initial=1 << 62)) if n else 0
    if ng < (1 << 21) and vmax < (1 << 41) - 1 and vmin >= -(1 << 41):
        key = (gi.astype(np.int64) << 42) + np.where(valid, val + (1 << 41) + 1, 0)
        low = np.maximum.accumulate(key) & ((1 << 42) - 1)
        incl = np.where(low == 0, NONE, low - (1 << 41) - 1)
    else:  # huge value ranges: normalise each group by its minimum first
        lo = np.minimum.reduceat(np.where(valid, val, np.iinfo(np.int64).max), gs) if n else val
        lo = np.where(lo == np.iinfo(np.int64).max, 0, lo)
        rel = np.where(valid, val - lo[gi], -1)
        span = int(rel.max()) + 2 if n else 2
        if span * max(ng, 1) < (1 << 62):
            cm = np.maximum.accumulate(gi.astype(np.int64) * span + rel + 1) - gi.astype(np.int64) * span - 1
            incl = np.where(cm < 0, NONE, cm + lo[gi])
        else:  # absurd spans: exact per-group loop (never seen with real traffic)
            incl = np.empty_like(val)
            for a, b in zip(gs, np.r_[gs[1:], n]):
                incl[a:b] = np.maximum.accumulate(val[a:b])
    excl = np.empty_like(val)
    excl[1:] = incl[:-1]
    excl[gs] = NONE
    if (init != NONE).any():
        excl = np.maximum(excl, init[gi])
    last = np.r_[gs[1:], n] - 1
    return excl, np.maximum(incl[last], init)


def overlapping(c_slot: np.ndarray, c_lo: np.ndarray, c_hi: np.ndarray, d_slot: np.ndarray,
                 d_lo: np.ndarray, d_hi: np.ndarray) -> np.ndarray:
    """Per candidate range ``[c_lo, c_hi)`` of flow ``c_slot``: does any range ``[d_lo, d_hi)``
    of the same flow overlap it? One sort of the ``d`` ranges by (flow, start) and a running
    maximum of their ends: the candidate overlaps when the ranges of its flow starting before
    its end reach beyond its start. Byte offsets are taken relative to each flow's lowest
    value here so the (flow, offset) keys fit one int64."""
    out = np.zeros(len(c_slot), bool)
    if not len(c_slot) or not len(d_slot):
        return out
    flows, inv = np.unique(np.r_[c_slot, d_slot], return_inverse=True)
    inv = inv.ravel()
    cf, df = inv[:len(c_slot)], inv[len(c_slot):]
    base = np.full(len(flows), np.iinfo(np.int64).max)
    np.minimum.at(base, cf, c_lo)
    np.minimum.at(base, df, d_lo)
    off = 1 << 42  # offsets beyond 4 TB from the lowest byte of the flow in question are ignored
    cl, ch = c_lo - base[cf], c_hi - base[cf]
    dl, dh = d_lo - base[df], d_hi - base[df]
    fits = (np.maximum(ch, 0) < off) & (cl >= 0)
    dfit = (dh < off) & (dl >= 0)
    df, dl, dh = df[dfit], dl[dfit], dh[dfit]
    if not len(df):
        return out
    o = np.lexsort((dl, df))
    df, dl, dh = df[o], dl[o], dh[o]
    key = (df << 43) | dl
    reach = np.maximum.accumulate((df << 43) | dh)  # within a flow: the furthest end so far
    pos = np.searchsorted(key, (cf << 43) | np.minimum(np.maximum(ch, 0), off - 1), side="left") - 1
    ok = fits & (pos >= 0)
    p = np.maximum(pos, 0)
    out[ok] = (df[p[ok]] == cf[ok]) & ((reach[p[ok]] & ((1 << 43) - 1)) > cl[ok])
    return out
