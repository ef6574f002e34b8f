"""Vectorised kernels behind the rule language's functions.

Window kernels take the column times ``t`` (shape [k]) and values ``W`` (shape [rows, k], NaN =
missing sample) of one block and return one value per row. ``W`` may be a row-major array or a
view of the window store's time-major storage (``W.T`` contiguous along the rows); a kernel's
result is the same, bit for bit, for either (see ``rowsum``). Peer kernels take a per-entity
vector and integer group codes and return one value per entity. All are pure numpy; the
per-entity reference implementations in tests/rules/test_functions_property.py check them.
"""
from __future__ import annotations

import math
import warnings

import numpy as np

_NAN = np.nan


class quiet:
    """NaN rows are normal (missing samples): silence numpy's all-NaN warnings and float errors.
    The engine enters this once per evaluation; the kernels stay free of per-call overhead."""

    def __enter__(self) -> "quiet":
        self._w = warnings.catch_warnings()
        self._w.__enter__()
        warnings.simplefilter("ignore", RuntimeWarning)
        self._e = np.errstate(all="ignore")
        self._e.__enter__()
        return self

    def __exit__(self, *exc: object) -> None:
        self._e.__exit__(*exc)
        self._w.__exit__(*exc)


def _quiet(fn):
    """Direct callers (tests, benchmarks) get the same silence; inside ``quiet()`` it is cheap."""

    def wrapper(*a, **kw):
        if _ACTIVE[0]:
            return fn(*a, **kw)
        with quiet():
            _ACTIVE[0] = True
            try:
                return fn(*a, **kw)
            finally:
                _ACTIVE[0] = False

    wrapper.__name__ = fn.__name__
    wrapper.__doc__ = fn.__doc__
    return wrapper


_ACTIVE = [False]

# the ufuncs themselves: ndarray.mean/max/sum/any go through Python wrappers that cost more
# than the arithmetic on a node's few entities (same ufunc reduction, same bits)
_add = np.add.reduce
_max = np.maximum.reduce
_min = np.minimum.reduce
try:  # the C function itself: np.count_nonzero is a Python wrapper around it (~0.4 µs a call
    # against ~0.25 µs here, and the engine counts a few hundred masks a tick)
    from numpy._core.multiarray import count_nonzero
except ImportError:  # numpy < 2 keeps it in numpy.core; a later numpy may move it again
    try:
        from numpy.core.multiarray import count_nonzero
    except ImportError:
        count_nonzero = np.count_nonzero


#: from this many rows on, reductions run along the rows of a time-major view; with fewer, a C
#: copy and numpy's own row reductions cost less (a few calls instead of up to ~50). The window
#: store keeps blocks of fewer rows row-major (store.WIDE_ROWS) anyway.
_WIDE = 64
WIDE = _WIDE  # (read by windows: rows from which a window is reduced along its rows)
_NEG_ZERO = np.float64(-0.0).view(np.int64)


def _row_major(W: np.ndarray) -> bool:
    """Whether numpy reduces ``W`` along its rows (axis 1) the way it does a C array: each
    row's values are adjacent (or there is only one row). A reduction over a time-major view
    instead runs along the entities, one column at a time: another order of additions."""
    return W.strides[1] == W.itemsize or W.shape[0] <= 1 or W.shape[1] <= 1


def _rows(W: np.ndarray) -> np.ndarray:
    """``W`` as numpy's row-major reductions see it: a C copy of a time-major view. The
    kernels' general (missing-sample) paths and the rarely used ones take it, so their results
    are those they always gave."""
    return W if _row_major(W) else np.ascontiguousarray(W)


def _pairwise_columns(A: np.ndarray, n: int) -> np.ndarray:
    """numpy's pairwise summation (``pairwise_sum`` in numpy's loops_utils.h) of each column of
    ``A[:n]`` ([n, rows]), vectorised along the rows, up to the sign of a zero result: under 8
    values one running sum; up to 128, eight interleaved running sums (value i goes to sum
    i % 8) combined as ((s0+s1)+(s2+s3))+((s4+s5)+(s6+s7)), then the remaining n % 8 values
    added in turn; above 128, the two halves (the first a multiple of 8 long) summed apart."""
    if n < 8:
        return _add(A[:n], axis=0)  # 0.0 + a0 + a1 ...: numpy starts a reduction from 0.0 too
    if n <= 128:
        n8 = n - n % 8
        r = _add(A[:n8].reshape(n8 // 8, 8, A.shape[1]), axis=0)  # r[j] = a[j] + a[j+8] + ...
        s = r[0::2] + r[1::2]
        s = s[0::2] + s[1::2]
        res = s[0] + s[1]
        if n8 < n:
            res = _add(np.concatenate((res[None, :], A[n8:n])), axis=0)
        return res
    n2 = n // 2
    n2 -= n2 % 8
    return _pairwise_columns(A[:n2], n2) + _pairwise_columns(A[n2:n], n - n2)


def rowsum(W: np.ndarray) -> np.ndarray:
    """``np.add.reduce(W, axis=1)`` as numpy computes it for a row-major ``W``, bit for bit,
    whatever ``W``'s layout. For a time-major view numpy would add each row's values one after
    the other; this reproduces the pairwise order with a few calls over all rows at once (984
    flows x 60 s: about a third of the time numpy's row-by-row reduction of a C array takes). Results differ from
    the pairwise ones only in the sign of a zero partial sum, and numpy's reduction starts from
    +0.0, so ``+ 0.0`` makes them equal (a sum starting from +0.0 is never -0.0)."""
    if _row_major(W):
        return _add(W, axis=1)
    if W.shape[0] < _WIDE:
        return _add(np.ascontiguousarray(W), axis=1)
    return _pairwise_columns(W.T, W.shape[1]) + 0.0


def _extreme(W: np.ndarray, red) -> np.ndarray:
    """``red`` (np.maximum.reduce or np.minimum.reduce) along the rows, bit for bit as for a
    row-major ``W``. Along a time-major view the values are compared in another order, which
    only matters for the sign of a zero result when a row holds both 0.0 and -0.0: those rows
    are reduced again row-major."""
    if _row_major(W):
        return red(W, axis=1)
    if W.shape[0] < _WIDE:
        return red(np.ascontiguousarray(W), axis=1)
    r = red(W, axis=1)
    zero = r == 0
    if count_nonzero(zero) and count_nonzero(W.view(np.int64) == _NEG_ZERO):
        z = np.flatnonzero(zero)
        r[z] = red(np.ascontiguousarray(W[z]), axis=1)
    return r


def has_nan(x: np.ndarray) -> bool:
    return count_nonzero(np.isnan(x)) > 0


def _valid(W: np.ndarray) -> np.ndarray:
    return ~np.isnan(W)


def ffill_index(valid: np.ndarray) -> np.ndarray:
    """For each cell, the column index of the latest valid cell at or before it (-1 = none)."""
    k = valid.shape[1]
    idx = np.where(valid, np.arange(k)[None, :], -1)
    return np.maximum.accumulate(idx, axis=1)


def _ffill(W: np.ndarray, valid: np.ndarray | None = None) -> np.ndarray:
    if valid is None:
        valid = _valid(W)
    idx = ffill_index(valid)
    rows = np.arange(W.shape[0])[:, None]
    out = W[rows, np.maximum(idx, 0)]
    out[idx < 0] = _NAN
    return out


def first_last(t: np.ndarray, W: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """(first value, last value, first time, last time, count) of valid samples per row."""
    k = W.shape[1]
    if k == 0:
        nan = np.full(W.shape[0], _NAN)
        return nan, nan.copy(), nan.copy(), nan.copy(), np.zeros(W.shape[0], dtype=np.int64)
    valid = _valid(W)
    if valid.all():  # the common case: every entity reported at every tick of the window
        n = W.shape[0]
        return W[:, 0].copy(), W[:, -1].copy(), np.full(n, t[0]), np.full(n, t[-1]), np.full(n, k)
    cnt = valid.sum(axis=1)
    has = cnt > 0
    fi = np.argmax(valid, axis=1)
    li = k - 1 - np.argmax(valid[:, ::-1], axis=1)
    rows = np.arange(W.shape[0])
    fv = np.where(has, W[rows, fi], _NAN)
    lv = np.where(has, W[rows, li], _NAN)
    ft = np.where(has, t[fi], _NAN)
    lt = np.where(has, t[li], _NAN)
    return fv, lv, ft, lt, cnt


# Fast paths. A window is usually dense (every entity reported at every tick). Rather than
# scanning the whole window for NaN first, the kernels compute the dense answer and look for
# NaN in the (much smaller) result: NaN propagates through these reductions, so a result
# without NaN proves the dense path was the right one, and any NaN sends the window down the
# exact path the kernel always took. Results are bit for bit those of the general path.

# -- instant -----------------------------------------------------------------------------------
def last(t: np.ndarray, W: np.ndarray) -> np.ndarray:
    if W.shape[1]:
        lv = last_dense(W)
        if not has_nan(lv):  # every row's latest valid sample is in the last column
            return lv
    return first_last(t, W)[1]


def age(t: np.ndarray, W: np.ndarray, now: float) -> np.ndarray:
    return now - first_last(t, W)[3]


# -- counters ------------------------------------------------------------------------------------
def _increase_dense(t: np.ndarray, W: np.ndarray, wrap_bits: int | None) -> np.ndarray | None:
    """The dense path of ``increase`` when it applies (None otherwise): any NaN in a row makes
    one of its differences, and so its sum, NaN."""
    if W.shape[1] < 2:
        return None
    r = rowsum(counter_steps(W, wrap_bits))
    return None if has_nan(r) else r


def counter_steps(W: np.ndarray, wrap_bits: int | None) -> np.ndarray:
    """The dense path's increase between each pair of adjacent columns of ``W`` (resets and
    wraps unwrapped): elementwise, so the steps of a window are a slice of those of any longer
    span holding it (range evaluation computes them once for all its ticks)."""
    prev = W[:, :-1]
    cur = W[:, 1:]
    return unwrap_counter(prev, cur, cur - prev, wrap_bits)


def unwrap_counter(prev: np.ndarray, cur: np.ndarray, d: np.ndarray, wrap_bits: int | None) -> np.ndarray:
    """Counter differences ``d = cur - prev`` with resets (a decrease counts from zero) and,
    when the counter wraps at 2**wrap_bits and ``prev`` was in the top quarter, the wrapped distance."""
    neg = d < 0
    if not count_nonzero(neg):
        return d
    if wrap_bits:
        mod = float(2 ** wrap_bits)
        wrapped = prev >= 0.75 * mod
        return np.where(neg & wrapped, cur + (mod - prev), np.where(neg, cur, d))
    return np.where(neg, cur, d)


@_quiet
def increase(t: np.ndarray, W: np.ndarray, wrap_bits: int | None = None) -> np.ndarray:
    """Sum of increases between consecutive valid samples; a decrease is a reset (the new
    value counts from zero) unless the counter wraps at 2**wrap_bits and the previous value
    was in the top quarter of its range, in which case the wrapped distance is counted."""
    r = _increase_dense(t, W, wrap_bits)
    if r is not None:
        return r
    return _increase(t, W, wrap_bits)


def _increase(t: np.ndarray, W: np.ndarray, wrap_bits: int | None = None) -> np.ndarray:
    if W.shape[1] == 0:
        return np.full(W.shape[0], _NAN)
    W = _rows(W)
    valid = _valid(W)
    dense = valid.all()
    F = W if dense else _ffill(W, valid)
    prev = F[:, :-1]
    cur = W[:, 1:]
    d = unwrap_counter(prev, cur, cur - prev, wrap_bits)
    if dense:
        return d.sum(axis=1) if W.shape[1] >= 2 else np.full(W.shape[0], _NAN)
    d = np.where(np.isnan(d), 0.0, d)
    cnt = valid.sum(axis=1)
    return np.where(cnt >= 2, d.sum(axis=1), _NAN)


@_quiet
def rate(t: np.ndarray, W: np.ndarray, wrap_bits: int | None = None) -> np.ndarray:
    """Per-second increase between the first and last valid sample of the window."""
    inc = _increase_dense(t, W, wrap_bits)
    if inc is not None:  # dense: every row spans the window's first to last column
        span = t[-1] - t[0]
        return inc / span if span > 0 else np.full(W.shape[0], _NAN)
    inc = _increase(t, W, wrap_bits)
    _, _, ft, lt, cnt = first_last(t, W)
    span = lt - ft
    return np.where((cnt >= 2) & (span > 0), inc / span, _NAN)


@_quiet
def resets(t: np.ndarray, W: np.ndarray) -> np.ndarray:
    if W.shape[1] == 0:
        return np.full(W.shape[0], _NAN)
    valid = _valid(W)
    F = _ffill(W, valid)
    d = W[:, 1:] - F[:, :-1]
    cnt = valid.sum(axis=1)
    return np.where(cnt >= 1, (d < 0).sum(axis=1).astype(float), _NAN)


# -- gauges ------------------------------------------------------------------------------------
@_quiet
def delta(t: np.ndarray, W: np.ndarray) -> np.ndarray:
    if W.shape[1] >= 2:
        d = W[:, -1] - W[:, 0]
        if not has_nan(d):  # first and last column valid in every row
            return d
    fv, lv, _, _, cnt = first_last(t, W)
    return np.where(cnt >= 2, lv - fv, _NAN)


def _dense(W: np.ndarray) -> bool:
    """No missing sample in the window: the plain (much cheaper) numpy reductions apply."""
    return not np.isnan(W).any()


def _reduce(W: np.ndarray, dense: np.ndarray, nan_fn) -> np.ndarray:
    """``dense`` (the plain reduction) unless the window has a missing sample."""
    if has_nan(dense) and not _dense(W):
        return nan_fn(_rows(W), axis=1)
    return dense


# Dense forms: the value a kernel returns for a window of at least one column whenever that
# value holds no NaN (a NaN sample makes the dense row NaN: the kernel then takes its exact path).
# Each is a per-row reduction, so a row's value does not depend on the rows stacked with it:
# windows.py computes them over many blocks' windows at once (the controller's 1,000 nodes).
def avg_dense(W: np.ndarray) -> np.ndarray:
    return rowsum(W) / W.shape[1]  # = W.mean(axis=1)


def min_dense(W: np.ndarray) -> np.ndarray:
    return _extreme(W, _min)


def max_dense(W: np.ndarray) -> np.ndarray:
    return _extreme(W, _max)


def last_dense(W: np.ndarray) -> np.ndarray:
    return W[:, -1].copy()


@_quiet
def avg(t: np.ndarray, W: np.ndarray) -> np.ndarray:
    if not W.shape[1]:
        return np.full(W.shape[0], _NAN)
    return _reduce(W, avg_dense(W), np.nanmean)


@_quiet
def wmin(t: np.ndarray, W: np.ndarray) -> np.ndarray:
    if not W.shape[1]:
        return np.full(W.shape[0], _NAN)
    return _reduce(W, min_dense(W), np.nanmin)


@_quiet
def wmax(t: np.ndarray, W: np.ndarray) -> np.ndarray:
    if not W.shape[1]:
        return np.full(W.shape[0], _NAN)
    return _reduce(W, max_dense(W), np.nanmax)


@_quiet
def wsum(t: np.ndarray, W: np.ndarray) -> np.ndarray:
    if W.shape[1]:
        r = rowsum(W)
        if not has_nan(r):  # no missing sample: nansum adds the very same values
            return r
    cnt = _valid(W).sum(axis=1)
    return np.where(cnt > 0, np.nansum(_rows(W), axis=1), _NAN)


def count(t: np.ndarray, W: np.ndarray) -> np.ndarray:
    return _valid(W).sum(axis=1).astype(float)


@_quiet
def stddev(t: np.ndarray, W: np.ndarray) -> np.ndarray:
    """Population standard deviation (as Prometheus' stddev_over_time)."""
    if not W.shape[1]:
        return np.full(W.shape[0], _NAN)
    return _reduce(W, _rows(W).std(axis=1), np.nanstd)


@_quiet
def cov(t: np.ndarray, W: np.ndarray) -> np.ndarray:
    """Coefficient of variation: stddev / mean (NaN when the mean is 0)."""
    m = avg(t, W)
    s = stddev(t, W)
    return np.where(m != 0, s / np.abs(m), _NAN)


@_quiet
def burstiness(t: np.ndarray, W: np.ndarray) -> np.ndarray:
    """Peak over mean (1 = perfectly smooth)."""
    m = avg(t, W)
    return np.where(m > 0, wmax(t, W) / m, _NAN)


@_quiet
def quantile(t: np.ndarray, W: np.ndarray, q: float) -> np.ndarray:
    """Per-row quantile ignoring NaN, with numpy's default linear interpolation. numpy's own
    nanquantile falls back to a Python loop over rows when any NaN is present; sorting puts
    NaN last, so the k-th valid value of a row is simply column k of the sorted rows."""
    rows, k = W.shape
    if k == 0:
        return np.full(rows, _NAN)
    S = np.array(W, order="C")  # = np.sort(W, axis=1), sorting a C copy in place: a time-major
    S.sort(axis=1)  # view's rows would each be gathered into a buffer and scattered back
    if rows and not has_nan(S[:, -1]):  # NaN sorts last: no row misses a sample
        pos = (k - 1) * q  # the general path below with n = k in every row
        lo = math.floor(pos)
        hi = min(lo + 1, k - 1)
        frac = pos - math.floor(pos)
        a = S[:, min(max(lo, 0), k - 1)]
        return a.copy() if frac == 0 else a + (S[:, hi] - a) * frac
    n = (~np.isnan(W)).sum(axis=1)
    pos = (n - 1) * q
    lo = np.floor(pos).astype(np.int64)
    hi = np.minimum(lo + 1, np.maximum(n - 1, 0))
    lo = np.clip(lo, 0, k - 1)
    r = np.arange(rows)
    a, b = S[r, lo], S[r, hi]
    frac = pos - np.floor(pos)
    out = a + (b - a) * frac
    return np.where(n > 0, np.where(frac == 0, a, out), _NAN)


@_quiet
def changes(t: np.ndarray, W: np.ndarray) -> np.ndarray:
    if W.shape[1] == 0:
        return np.full(W.shape[0], _NAN)
    if _dense(W):  # the general path below with every sample present
        return _add(W[:, 1:] != W[:, :-1], axis=1).astype(float)
    valid = _valid(W)
    F = _ffill(W, valid)
    d = (W[:, 1:] != F[:, :-1]) & valid[:, 1:] & ~np.isnan(F[:, :-1])
    cnt = valid.sum(axis=1)
    return np.where(cnt > 0, d.sum(axis=1).astype(float), _NAN)


def absent(t: np.ndarray, W: np.ndarray) -> np.ndarray:
    return (_valid(W).sum(axis=1) == 0).astype(float)


def present(t: np.ndarray, W: np.ndarray) -> np.ndarray:
    return (_valid(W).sum(axis=1) > 0).astype(float)


# -- conditions over a window -------------------------------------------------------------------
def gaps(t: np.ndarray, C: np.ndarray) -> np.ndarray:
    """Number of maximal runs of samples where the condition is false.

    ``C`` holds 1.0 (true), 0.0 (false) or NaN (no sample); missing samples neither start
    nor end a run."""
    if C.shape[1] == 0:
        return np.full(C.shape[0], _NAN)
    C = _rows(C)
    valid = _valid(C)
    F = _ffill(C, valid)
    false = F == 0.0
    starts = false.copy()
    starts[:, 1:] &= ~false[:, :-1]
    starts &= valid
    cnt = valid.sum(axis=1)
    return np.where(cnt > 0, starts.sum(axis=1).astype(float), _NAN)


def longest_gap(t: np.ndarray, C: np.ndarray, start: float, now: float) -> np.ndarray:
    """Longest time in seconds between consecutive true samples, counting the window's start
    and ``now`` as the outer edges (a row that was never true inside the window scores the
    whole window). NaN for a row with no sample at all."""
    rows, k = C.shape
    C = _rows(C)
    valid = _valid(C)
    cnt = valid.sum(axis=1)
    if k == 0:
        return np.full(rows, _NAN)
    true = C == 1.0
    tt = np.where(true, t[None, :], _NAN)
    # previous true time before each column (window start if none)
    prev = _ffill(tt)
    prev_shift = np.full_like(prev, start)
    prev_shift[:, 1:] = np.where(np.isnan(prev[:, :-1]), start, prev[:, :-1])
    inner = np.where(true, t[None, :] - prev_shift, -np.inf).max(axis=1)
    last_true = np.where(np.isnan(prev[:, -1]), start, prev[:, -1])
    tail = now - last_true
    return np.where(cnt > 0, np.maximum(inner, tail), _NAN)


# -- peers ---------------------------------------------------------------------------------------
def _groups(groups: np.ndarray):
    if len(groups) == 0:
        return []
    if groups.min() == groups.max():
        return [np.arange(len(groups))]
    order = np.argsort(groups, kind="stable")
    g = groups[order]
    cut = np.flatnonzero(g[1:] != g[:-1]) + 1
    return np.split(order, cut)


def _median_of_sorted(s: np.ndarray, m: int) -> float:
    """Median of the first ``m`` values of sorted ``s`` (NaN sorts last), bit for bit what
    ``np.nanmedian`` returns: numpy takes the mean of the middle one or two values, a sum
    that starts from 0.0 (so -0.0 comes out as 0.0). NaN when ``m`` is 0."""
    if m == 0:
        return _NAN
    if m % 2:
        return float(0.0 + s[(m - 1) // 2])
    return float(((0.0 + s[m // 2 - 1]) + s[m // 2]) / 2.0)


def _nanmedian(v: np.ndarray) -> float:
    """``np.nanmedian`` of one vector without its per-call machinery (~20 µs → ~3 µs)."""
    s = np.sort(v)
    return _median_of_sorted(s, int(len(v) - np.isnan(s).sum()))


# Peer groups of a node's GPUs, ports or engines hold a handful of members: there the peer
# kernels below run on Python floats, where ~20 numpy calls on 8 values cost more than the
# arithmetic. The values are those of the numpy paths, bit for bit: the middle values of a
# sorted group are the same numbers whichever sort finds them (Python's and numpy's order
# equal values differently, but only 0.0 and -0.0 are equal and distinct, and the medians
# add them to 0.0 first), and Python float arithmetic is the same IEEE double arithmetic.
_SMALL_PEERS = 32  # entities (all groups together) up to which the Python paths run


def _group_lists(groups: np.ndarray) -> list[list[int]]:
    """Members of each group in index order (as ``_groups``), as lists."""
    members: dict = {}
    for i, g in enumerate(groups.tolist()):
        members.setdefault(g, []).append(i)
    return list(members.values())


def _median_list(s: list, m: int) -> float:
    """``_median_of_sorted`` of a sorted list of ``m`` floats."""
    if m == 0:
        return _NAN
    if m % 2:
        return 0.0 + s[(m - 1) // 2]
    return ((0.0 + s[m // 2 - 1]) + s[m // 2]) / 2.0


def _peer_others_small(x: np.ndarray, groups: np.ndarray, dev: bool) -> np.ndarray:
    """``peer_others`` (or with ``dev`` ``peer_dev``) of a few entities."""
    xs = x.tolist()
    out = [_NAN] * len(xs)
    for idx in _group_lists(groups):
        ok = [i for i in idx if xs[i] == xs[i]]
        m = len(ok)
        if m < 2:
            continue
        s = sorted(xs[i] for i in ok)
        c = m - 1
        lo, hi = (c - 1) // 2, c // 2
        for i in ok:
            v = xs[i]
            # the others, sorted, are s without one slot holding v: their c-th value is
            # s[c] below that slot and s[c + 1] from it on (which of equal values is left
            # out does not change the values)
            r = s.index(v)
            a = s[lo + (lo >= r)]
            med = 0.0 + a if c % 2 else ((0.0 + a) + s[hi + (hi >= r)]) / 2.0
            out[i] = ((v - med) / abs(med) if med != 0 and med == med else _NAN) if dev else med
    return np.array(out, dtype=float)


@_quiet
def peer_reduce(x: np.ndarray, groups: np.ndarray, how: str) -> np.ndarray:
    """Broadcast a per-group reduction of ``x`` back to every member."""
    if how in ("median", "count") and len(x) <= _SMALL_PEERS:
        return _peer_reduce_small(x, groups, how)
    out = np.full(len(x), _NAN)
    red = {
        "median": _nanmedian, "mean": np.nanmean, "min": np.nanmin, "max": np.nanmax,
        "std": np.nanstd, "count": lambda v: float(np.sum(~np.isnan(v))),
    }[how]
    for idx in _groups(groups):
        v = x[idx]
        if how != "count" and np.all(np.isnan(v)):
            continue
        out[idx] = red(v)
    return out


def _peer_reduce_small(x: np.ndarray, groups: np.ndarray, how: str) -> np.ndarray:
    """``peer_reduce`` median or count of a few entities."""
    xs = x.tolist()
    out = [_NAN] * len(xs)
    for idx in _group_lists(groups):
        vals = [xs[i] for i in idx if xs[i] == xs[i]]
        if how == "count":
            r = float(len(vals))
        elif not vals:
            continue
        else:
            r = _median_list(sorted(vals), len(vals))
        for i in idx:
            out[i] = r
    return np.array(out, dtype=float)


@_quiet
def spread(x: np.ndarray, groups: np.ndarray) -> np.ndarray:
    return peer_reduce(x, groups, "max") - peer_reduce(x, groups, "min")


@_quiet
def peer_zscore(x: np.ndarray, groups: np.ndarray) -> np.ndarray:
    """(x − group mean) / group stddev; NaN where the group has no spread."""
    m = peer_reduce(x, groups, "mean")
    s = peer_reduce(x, groups, "std")
    return np.where(s > 0, (x - m) / s, _NAN)


@_quiet
def peer_others(x: np.ndarray, groups: np.ndarray) -> np.ndarray:
    """Median of x over the OTHER members of each member's group (NaN where no other member has
    a value): what a member is compared with when it may be the odd one out - in a pair, the
    partner; in a larger group, a median its own value cannot move."""
    if len(x) <= _SMALL_PEERS:
        return _peer_others_small(x, groups, False)
    out = np.full(len(x), _NAN)
    for idx in _groups(groups):
        v = x[idx]
        if len(idx) < 2:
            continue
        ok = np.flatnonzero(~np.isnan(v))
        m = len(ok)
        if m < 2:  # a member with a value has no other member with one
            continue
        # the others of member j, sorted, are the group's sorted values without j's slot:
        # their c-th value is s[c] below j's rank and s[c + 1] from it on. Their median needs
        # only the middle one or two of those m - 1 values.
        vals = v[ok]
        order = np.argsort(vals, kind="stable")
        s = vals[order]
        rank = np.empty(m, dtype=np.int64)
        rank[order] = np.arange(m)
        c = m - 1
        lo, hi = (c - 1) // 2, c // 2
        a = s[lo + (lo >= rank)]
        b = s[hi + (hi >= rank)]
        out[idx[ok]] = 0.0 + a if c % 2 else ((0.0 + a) + b) / 2.0  # as np.nanmedian (see _median_of_sorted)
    return out


@_quiet
def peer_dev(x: np.ndarray, groups: np.ndarray) -> np.ndarray:
    """Robust deviation from peers: (x − median of the OTHER members) / that median.
    0.5 means 50 % above the others; the natural "one GPU much lower/higher than its peers"
    measure, stable with small groups where a z-score saturates."""
    if len(x) <= _SMALL_PEERS:
        return _peer_others_small(x, groups, True)
    med = peer_others(x, groups)
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where((med != 0) & ~np.isnan(med), (x - med) / np.abs(med), _NAN)


def rank(x: np.ndarray, groups: np.ndarray) -> np.ndarray:
    """1 = largest in its group; ties share the better rank; NaN stays NaN."""
    out = np.full(len(x), _NAN)
    for idx in _groups(groups):
        v = x[idx]
        ok = ~np.isnan(v)
        vv = v[ok]
        # rank = 1 + number of strictly larger values
        r = 1.0 + (vv[None, :] > vv[:, None]).sum(axis=1)
        sub = np.full(len(v), _NAN)
        sub[ok] = r
        out[idx] = sub
    return out
