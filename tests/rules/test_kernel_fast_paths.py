"""The window kernels' dense fast paths and the sort-based peer medians return, bit for bit,
what the general paths return (kept below as they were before the fast paths)."""
from __future__ import annotations

import math
import warnings

import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from skewd.rules import functions


# -- kernels: fast paths == general paths, bit for bit --------------------------------------------
def _old_dense(W):
    return not np.isnan(W).any()


def old_avg(t, W):
    if not W.shape[1]:
        return np.full(W.shape[0], np.nan)
    return W.mean(axis=1) if _old_dense(W) else np.nanmean(W, axis=1)


def old_wmin(t, W):
    if not W.shape[1]:
        return np.full(W.shape[0], np.nan)
    return W.min(axis=1) if _old_dense(W) else np.nanmin(W, axis=1)


def old_wmax(t, W):
    if not W.shape[1]:
        return np.full(W.shape[0], np.nan)
    return W.max(axis=1) if _old_dense(W) else np.nanmax(W, axis=1)


def old_stddev(t, W):
    if not W.shape[1]:
        return np.full(W.shape[0], np.nan)
    return W.std(axis=1) if _old_dense(W) else np.nanstd(W, axis=1)


def old_wsum(t, W):
    cnt = (~np.isnan(W)).sum(axis=1)
    return np.where(cnt > 0, np.nansum(W, axis=1), np.nan)


def old_last(t, W):
    return functions.first_last(t, W)[1]


def old_delta(t, W):
    fv, lv, _, _, cnt = functions.first_last(t, W)
    return np.where(cnt >= 2, lv - fv, np.nan)


def old_increase(t, W, wrap_bits=None):
    return functions._increase(t, W, wrap_bits)


def old_rate(t, W, wrap_bits=None):
    inc = functions._increase(t, W, wrap_bits)
    _, _, ft, lt, cnt = functions.first_last(t, W)
    span = lt - ft
    return np.where((cnt >= 2) & (span > 0), inc / span, np.nan)


def old_quantile(t, W, q):
    rows, k = W.shape
    if k == 0:
        return np.full(rows, np.nan)
    S = np.sort(W, axis=1)
    n = (~np.isnan(W)).sum(axis=1)
    pos = (n - 1) * q
    lo = np.floor(pos).astype(np.int64)
    hi = np.minimum(lo + 1, np.maximum(n - 1, 0))
    lo = np.clip(lo, 0, k - 1)
    r = np.arange(rows)
    a, b = S[r, lo], S[r, hi]
    frac = pos - np.floor(pos)
    out = a + (b - a) * frac
    return np.where(n > 0, np.where(frac == 0, a, out), np.nan)


def old_changes(t, W):
    if W.shape[1] == 0:
        return np.full(W.shape[0], np.nan)
    valid = ~np.isnan(W)
    Fw = functions._ffill(W, valid)
    d = (W[:, 1:] != Fw[:, :-1]) & valid[:, 1:] & ~np.isnan(Fw[:, :-1])
    cnt = valid.sum(axis=1)
    return np.where(cnt > 0, d.sum(axis=1).astype(float), np.nan)


def _q(fn, q):
    return lambda t, W: fn(t, W, q)


PAIRS = [(functions.avg, old_avg), (functions.wmin, old_wmin), (functions.wmax, old_wmax), (functions.stddev, old_stddev), (functions.wsum, old_wsum),
         (functions.last, old_last), (functions.changes, old_changes), (functions.delta, old_delta), (functions.increase, old_increase), (functions.rate, old_rate),
         (lambda t, W: functions.increase(t, W, 32), lambda t, W: old_increase(t, W, 32)),
         (lambda t, W: functions.rate(t, W, 32), lambda t, W: old_rate(t, W, 32))] + \
    [(_q(functions.quantile, q), _q(old_quantile, q)) for q in (0.0, 0.5, 0.9, 0.95, 0.99, 1.0, 0.3)]

special = st.sampled_from([0.0, -0.0, 1.0, -1.0, 2.0 ** 32 - 5, 3.0, math.inf, -math.inf, 1e300, math.nan])
fcell = st.one_of(st.floats(-1e6, 1e6, allow_nan=False), special)


def same(a, b):
    a, b = np.asarray(a, dtype=float), np.asarray(b, dtype=float)
    return a.shape == b.shape and np.array_equal(a, b, equal_nan=True) and np.array_equal(np.signbit(a), np.signbit(b))


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(rows=st.integers(0, 6), k=st.integers(0, 9), data=st.data(), dense=st.booleans())
def test_kernel_fast_paths_equal_general_paths(rows, k, data, dense):
    cells = st.floats(-1e6, 1e6, allow_nan=False) if dense else fcell
    flat = data.draw(st.lists(cells, min_size=rows * k, max_size=rows * k))
    wide = np.full((rows, k + 7), 42.0)  # a strided view, as the store hands out
    wide[:, 3: 3 + k] = np.array(flat, dtype=float).reshape(rows, k)
    W = wide[:, 3: 3 + k]
    t = np.cumsum(np.array(data.draw(st.lists(st.sampled_from([0.0, 0.5, 1.0]), min_size=k, max_size=k)),
                           dtype=float)) if k else np.empty(0)
    with warnings.catch_warnings(), np.errstate(all="ignore"):
        warnings.simplefilter("ignore")
        for new, old in PAIRS:
            assert same(new(t, W), old(t, W)), (new, W)


def test_kernel_fast_paths_on_store_sized_windows():
    """Large strided windows (984 flows x 60 columns): numpy's reduction order must match too."""
    rng = np.random.default_rng(3)
    wide = rng.standard_normal((984, 1024)) * 1e3
    wide[:, ::7] *= 1e9
    t = np.arange(60.0)
    for W in (wide[:, 100:160], np.cumsum(np.abs(wide[:, 100:160]), axis=1)):
        with warnings.catch_warnings(), np.errstate(all="ignore"):
            warnings.simplefilter("ignore")
            for new, old in PAIRS:
                assert same(new(t, W), old(t, W))
            Wn = W.copy()
            Wn[5, 7] = np.nan
            for new, old in PAIRS:
                assert same(new(t, Wn), old(t, Wn))


def old_peer_dev(x, groups):
    out = np.full(len(x), np.nan)
    for idx in functions._groups(groups):
        v = x[idx]
        if len(idx) < 2:
            continue
        for j in range(len(idx)):
            others = np.delete(v, j)
            med = np.nanmedian(others) if not np.all(np.isnan(others)) else np.nan
            if med == med and med != 0 and v[j] == v[j]:
                out[idx[j]] = (v[j] - med) / abs(med)
    return out


def old_peer_median(x, groups):
    out = np.full(len(x), np.nan)
    for idx in functions._groups(groups):
        if not np.all(np.isnan(x[idx])):
            out[idx] = np.nanmedian(x[idx])
    return out


@settings(max_examples=400, deadline=None)
@given(xs=st.lists(st.one_of(special, st.integers(-3, 3).map(float)), min_size=0, max_size=14),
       gs=st.lists(st.integers(0, 2), min_size=14, max_size=14))
def test_peer_medians_equal_numpy_nanmedian_bit_for_bit(xs, gs):
    x = np.array(xs, dtype=float)
    g = np.array(gs[: len(xs)], dtype=np.int64)
    with warnings.catch_warnings(), np.errstate(all="ignore"):
        warnings.simplefilter("ignore")
        assert same(functions.peer_dev(x, g), old_peer_dev(x, g))
        assert same(functions.peer_reduce(x, g, "median"), old_peer_median(x, g))
