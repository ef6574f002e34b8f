"""Window kernels give the same bits over a time-major view as over a row-major array.

The window store keeps blocks of many rows (an agent's flows) time-major, so a window reaches
the kernels as a view whose rows are not contiguous. numpy reduces such a view along the rows
in another order (each row's values added one after the other instead of pairwise), and
compares another order for max/min; the kernels must still return exactly what they return
for the same values in a C array - the values a rule compares and the evidence it reports.
The data is made to expose order: magnitudes from 1e-5 to 1e16 (a sum's last bits depend on
the grouping), 0.0 and -0.0 in the same row, infinities, NaN, counters with resets and wraps.
"""
from __future__ import annotations

import numpy as np
import pytest

from skewd.rules import functions as F

KERNELS = {
    "avg": F.avg, "min": F.wmin, "max": F.wmax, "sum": F.wsum, "count": F.count, "stddev": F.stddev,
    "cov": F.cov, "burstiness": F.burstiness, "changes": F.changes, "absent": F.absent,
    "present": F.present, "last": F.last, "delta": F.delta, "resets": F.resets,
    "p50": lambda t, W: F.quantile(t, W, 0.5), "p97": lambda t, W: F.quantile(t, W, 0.97),
    "increase": F.increase, "increase32": lambda t, W: F.increase(t, W, 32),
    "rate": F.rate, "rate32": lambda t, W: F.rate(t, W, 32),
    "gaps": lambda t, W: F.gaps(t, (W > 0.5).astype(float)),
    "longest_gap": lambda t, W: F.longest_gap(t, np.where(np.isnan(W), np.nan, (W > 0.5).astype(float)),
                                              t[0] - 1.0 if len(t) else 0.0, t[-1] if len(t) else 0.0),
    "age": lambda t, W: F.age(t, W, 1e6),
}
COLUMNS = [0, 1, 2, 7, 8, 9, 15, 16, 17, 60, 127, 128, 129, 200, 257, 600]


def _values(rng: np.random.Generator, rows: int, k: int, kind: str) -> np.ndarray:
    if kind == "counter":  # increasing, with resets and 32-bit wraps, some rows dense
        W = np.cumsum(rng.random((rows, k)) * 10.0 ** rng.integers(0, 9, size=(rows, 1)), axis=1)
        W[rng.random((rows, k)) < 0.02] = 0.0
        wrap = rng.random(rows) < 0.2
        W[wrap] = np.mod(W[wrap] + 2.0 ** 32 - 5e5, 2.0 ** 32)
    else:
        W = rng.standard_normal((rows, k)) * 10.0 ** rng.integers(-5, 17, size=(rows, k))
        odd = rng.random((rows, k))
        W[odd < 0.05] = 0.0
        W[(odd >= 0.05) & (odd < 0.10)] = -0.0
        W[(odd >= 0.10) & (odd < 0.11)] = rng.choice([np.inf, -np.inf], size=int(((odd >= 0.10) & (odd < 0.11)).sum()))
        W[::5] = -np.abs(W[::5])  # rows of negatives and zeros: a max whose sign of zero matters
        W[::7] = np.where(rng.random((len(W[::7]), k)) < 0.5, 0.0, -0.0)
    if kind != "dense":
        W[rng.random((rows, k)) < 0.03] = np.nan
        W[3::11] = np.nan  # rows with no sample at all
    return W


def _time_major(W: np.ndarray) -> np.ndarray:
    """W as the store hands a wide block's window out: a [rows, k] view of [cap, rows_cap]."""
    rows, k = W.shape
    store = np.full((k + 9, rows + 13), 7.0)
    store[4: 4 + k, 2: 2 + rows] = W.T
    V = store[4: 4 + k, 2: 2 + rows].T
    assert k < 2 or (not V.flags.c_contiguous and V.strides[0] == V.itemsize)
    return V


@pytest.mark.parametrize("kind", ["gauge", "dense", "counter"])
@pytest.mark.parametrize("rows", [64, 150])
def test_kernels_on_time_major_views_equal_row_major_bit_for_bit(kind, rows) -> None:
    rng = np.random.default_rng(rows * 7 + len(kind))
    with F.quiet():
        for k in COLUMNS:
            t = 1000.0 + np.cumsum(rng.random(k) + 0.5)
            W = _values(rng, rows, k, kind)
            C = np.ascontiguousarray(W)
            V = _time_major(W)
            for name, fn in KERNELS.items():
                want, got = fn(t, C), fn(t, V)
                assert np.asarray(want).tobytes() == np.asarray(got).tobytes(), (name, kind, rows, k)
            fl = [np.asarray(x).tobytes() for x in F.first_last(t, C)]
            assert fl == [np.asarray(x).tobytes() for x in F.first_last(t, V)], (kind, rows, k)


def test_row_sums_follow_numpys_pairwise_order_on_any_layout() -> None:
    # the order numpy adds a row's values in (8 interleaved sums up to 128 values, halves above)
    # decides a sum's last bits: numpy's own sequential reduction over the time-major view
    # differs from it, rowsum does not
    rng = np.random.default_rng(5)
    plain_differs = 0
    with F.quiet():
        for k in list(range(0, 140)) + [255, 256, 257, 300, 600, 1000]:
            W = rng.standard_normal((70, k)) * 10.0 ** rng.integers(-5, 17, size=(70, k))
            W[rng.random((70, k)) < 0.05] = -0.0
            want = np.add.reduce(np.ascontiguousarray(W), axis=1)
            V = _time_major(W)
            assert F.rowsum(V).tobytes() == want.tobytes(), k
            plain_differs += np.add.reduce(V, axis=1).tobytes() != want.tobytes()
    assert plain_differs > 100  # the reason rowsum exists


@pytest.mark.parametrize("seed", range(6))
def test_peer_kernels_of_a_few_entities_equal_the_numpy_paths_bit_for_bit(seed, monkeypatch) -> None:
    # a node's GPUs, ports or engines take Python paths (functions._SMALL_PEERS); ties, 0.0
    # next to -0.0, infinities (a median of inf and -inf is NaN), NaN members, one-member and
    # empty groups
    rng = np.random.default_rng(seed)
    kernels = {"peer_others": F.peer_others, "peer_dev": F.peer_dev,
               "median": lambda x, g: F.peer_reduce(x, g, "median"),
               "count": lambda x, g: F.peer_reduce(x, g, "count")}
    cases = []
    for _ in range(400):
        n = int(rng.integers(0, F._SMALL_PEERS + 1))
        x = rng.choice([0.0, -0.0, 1.0, -1.0, 2.5, 1e300, -1e300, np.inf, -np.inf, np.nan, 3.0], size=n)
        x = np.where(rng.random(n) < 0.5, x, rng.standard_normal(n) * 10.0 ** rng.integers(-3, 6, size=n))
        g = rng.integers(0, int(rng.integers(1, 4)), size=n)
        cases.append((x, g))
    with F.quiet():
        small = [[k(x, g).tobytes() for k in kernels.values()] for x, g in cases]
        monkeypatch.setattr(F, "_SMALL_PEERS", -1)
        big = [[k(x, g).tobytes() for k in kernels.values()] for x, g in cases]
    for (x, g), a, b in zip(cases, small, big):
        assert a == b, (x, g)


@pytest.mark.parametrize("wrap_bits", [None, 32])
def test_counter_rates_over_a_wide_blocks_whole_capacity_equal_the_kernels(wrap_bits) -> None:
    """increase()/rate() of an agent's flows are computed over every row of the block's capacity
    (contiguous memory; windows._wide_counter): the used rows' values are the kernels' own, bit
    for bit, whatever the unused rows hold, and a missing sample leaves the window to the kernel."""
    from skewd.model import BatchBuilder, Catalogue, Scope, signal
    from skewd.rules import windows
    from skewd.rules.store import WindowStore

    cat = Catalogue([signal("f_total", "counter", "packets", "flow", "a flow counter", "t", wrap_bits=wrap_bits)])
    rng = np.random.default_rng(7 if wrap_bits else 8)
    rows, k = 100, 90
    W = _values(rng, rows, k, "counter")
    W[np.isnan(W)] = 5.0
    store = WindowStore(cat, horizon=1e6)
    for j in range(k):
        b = BatchBuilder("n1")
        for e in range(rows):
            b.add(float(j), f"f{e}", "f_total", float(W[e, j]))
        store.ingest(b.build())
    blk = next(iter(store.signal_blocks("f_total")))
    assert blk.time_major and blk.nrows == rows < blk.data.shape[1]
    # what unused rows may hold (rows of entities gone): decreases, NaN, infinities
    blk.data[:, rows:] = rng.choice([np.nan, np.inf, -1e300, 3.0], size=blk.data[:, rows:].shape)
    blk.data[::2, rows:] *= -1.0
    eids = blk.eids[:rows]
    ctx = windows.EvalContext(store, 0.0, eids, eids, eids, np.array([""] * rows, dtype=object),
                              np.array(["n1"] * rows, dtype=object), 60.0, {})
    kernels = {"increase": F.increase, "rate": F.rate}
    with F.quiet():
        for now in (1.0, 2.0, 9.0, 60.0, 89.0):
            for dur in (2.0, 8.0, 9.0, 30.0, 60.0, 200.0):
                ctx.now = now
                t, V = blk.window(now - dur, now)
                for kind, kernel in kernels.items():
                    want = kernel(t, V, wrap_bits)
                    got = windows._wide_counter(ctx, "f_total", dur, kind)
                    if V.shape[1] >= 2 and (kind == "increase" or t[-1] > t[0]):
                        assert got is not None, (kind, now, dur)
                    if got is not None:
                        assert got.tobytes() == want.tobytes(), (kind, now, dur)
        blk.data[blk.n - 3, 17] = np.nan  # a missing sample: the kernel's own path
        ctx.now = 89.0
        assert windows._wide_counter(ctx, "f_total", 30.0, "increase") is None
        ctx.memo.clear()
        got = windows.window_vec(ctx, "f_total", 30.0, ("increase", "f_total", windows.identity, 30.0),
                                 lambda t, W: F.increase(t, W, wrap_bits))
        t, V = blk.window(59.0, 89.0)
        assert got.tobytes() == F.increase(t, V, wrap_bits).tobytes()
