"""Node summaries: the largest one-collection rise of the waiting queue (NS-1's request-burst
signal) is the same whatever the summary interval, counts every engine of the node, and is
not fooled by an engine that appears or disappears between two collections."""
from __future__ import annotations

import math

from skewd.agent import summary as summary_mod
from skewd.collectors.vllm.catalogue import CATALOGUE as VLLM
from skewd.model import BatchBuilder, Catalogue
from skewd.rules.store import WindowStore

T0 = 1_700_000_000.0  # synthetic epoch start (invented)
RISE = "summary_requests_waiting_rise_max"


def store_with(waiting: dict[str, list[float | None]]) -> WindowStore:
    """vllm_requests_waiting per engine, one collection a second from T0 + 1 (None: not scraped)."""
    st = WindowStore(Catalogue(VLLM).merge(summary_mod.CATALOGUE))
    n = max(len(v) for v in waiting.values())
    for i in range(n):
        b = BatchBuilder("n1")
        for eng, vals in waiting.items():
            if i < len(vals) and vals[i] is not None:
                b.add(T0 + 1 + i, eng, "vllm_requests_waiting", float(vals[i]))
        st.ingest(b.build())
    return st


def rises(st: WindowStore, interval: float, until: float) -> list[float]:
    out = []
    t = T0 + interval
    while t <= T0 + until:
        out.append(summary_mod.compute(st, "n1", t, interval).get(RISE, math.nan))
        t += interval
    return out


def test_burst_landing_on_two_engines_is_summed_per_collection():
    # a burst of 16 requests at t=4 (12 + 4 across the two engines), then the queue drains;
    # before it both queues grow by one a second (Poisson-like trickle)
    st = store_with({"engine0": [1, 2, 3, 15, 10, 5, 2, 1, 1, 1],
                     "engine1": [0, 1, 2, 6, 3, 1, 1, 1, 1, 1]})
    assert rises(st, 5.0, 10.0)[0] == 16
    assert max(r for r in rises(st, 1.0, 10.0) if r == r) == 16  # the agent's default 1 s summaries see the same burst


def test_trickle_and_drain_read_small():
    st = store_with({"engine0": [float(i) for i in range(10)], "engine1": [float(i) for i in range(10)]})
    assert rises(st, 5.0, 10.0) == [2.0, 2.0]
    drain = store_with({"engine0": [float(40 - 3 * i) for i in range(10)]})
    assert max(rises(drain, 5.0, 10.0)) < 0


def test_step_into_the_interval_counts_once():
    # the burst lands in the first collection of the second interval (t=6): the step from t=5 is
    # that interval's, and the first interval (t<=5) does not see it
    st = store_with({"engine0": [0, 0, 0, 0, 0, 20, 20, 20, 20, 20]})
    assert rises(st, 5.0, 10.0) == [0.0, 20.0]


def test_engine_appearing_or_missing_is_not_a_rise():
    # engine1 is scraped for the first time at t=4 with 30 waiting, and engine0 misses t=7:
    # neither its whole level nor a gap reads as arrivals
    st = store_with({"engine0": [1, 1, 1, 2, 2, 2, None, 2, 3, 3],
                     "engine1": [None, None, None, 30, 30, 31, 31, 31, 31, 31]})
    assert rises(st, 5.0, 10.0) == [1.0, 1.0]


def test_no_rise_without_two_collections():
    st = store_with({"engine0": [5]})
    assert RISE not in summary_mod.compute(st, "n1", T0 + 5, 5.0)
