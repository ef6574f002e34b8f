"""Node summaries: NS-1's request-burst signals. The largest one-collection step of requests
joining the engines' queues is the same whatever the summary interval, counts every engine of
the node, is not fooled by an engine that appears or disappears between two collections, by a
move between the waiting and running queues, by a burst admitted at once, or by the stats of a
hung engine core jumping when it resumes; the node's arrivals per second are what that step is
measured against."""
from __future__ import annotations

import math

from skewd.agent import summary as summary_mod
from skewd.collectors.vllm.catalogue import CATALOGUE as VLLM
from skewd.model import BatchBuilder, Catalogue
from skewd.rules.store import WindowStore

T0 = 1_700_000_000.0  # synthetic epoch start (invented)
STEP = "summary_requests_queued_step_max"
ARRIVED = "summary_requests_arrived_per_second"


def store_with(waiting: dict[str, list[float | None]], running: dict[str, list[float | None]] | None = None,
               tokens: dict[str, list[float | None]] | None = None,
               finished: dict[str, list[float | None]] | None = None) -> WindowStore:
    """vLLM gauges and counters per engine, one collection a second from T0 + 1 (None: not
    scraped). Running defaults to a steady 10 and the token counter to a steady 500 a second
    (an engine that makes progress); finished requests to none."""
    st = WindowStore(Catalogue(VLLM).merge(summary_mod.CATALOGUE))
    n = max(len(v) for v in waiting.values())
    series = {"vllm_requests_waiting": waiting,
              "vllm_requests_running": running or {e: [10.0] * n for e in waiting},
              "vllm_generation_tokens_total": tokens or {e: [500.0 * i for i in range(n)] for e in waiting},
              "vllm_request_success_total": finished or {e: [0.0] * n for e in waiting}}
    for i in range(n):
        b = BatchBuilder("n1")
        for sig, per_engine in series.items():
            for eng, vals in per_engine.items():
                if i < len(vals) and vals[i] is not None and waiting[eng][i] is not None:
                    b.add(T0 + 1 + i, eng, sig, float(vals[i]))
        st.ingest(b.build())
    return st


def values(st: WindowStore, interval: float, until: float, name: str = STEP) -> list[float]:
    out = []
    t = T0 + interval
    while t <= T0 + until:
        out.append(summary_mod.compute(st, "n1", t, interval).get(name, math.nan))
        t += interval
    return out


def test_burst_landing_on_two_engines_is_summed_per_collection():
    # a burst of 16 requests at t=4 (12 + 4 across the two engines), then the queue drains;
    # before it both queues grow by one a second (Poisson-like trickle)
    st = store_with({"engine0": [1, 2, 3, 15, 10, 5, 2, 1, 1, 1],
                     "engine1": [0, 1, 2, 6, 3, 1, 1, 1, 1, 1]})
    assert values(st, 5.0, 10.0)[0] == 16
    assert max(r for r in values(st, 1.0, 10.0) if r == r) == 16  # the agent's default 1 s summaries see the same burst


def test_trickle_and_drain_read_small():
    st = store_with({"engine0": [float(i) for i in range(10)], "engine1": [float(i) for i in range(10)]})
    assert values(st, 5.0, 10.0) == [2.0, 2.0]
    drain = store_with({"engine0": [float(40 - 3 * i) for i in range(10)]})
    assert max(values(drain, 5.0, 10.0)) < 0


def test_step_into_the_interval_counts_once():
    # the burst lands in the first collection of the second interval (t=6): the step from t=5 is
    # that interval's, and the first interval (t<=5) does not see it
    st = store_with({"engine0": [0, 0, 0, 0, 0, 20, 20, 20, 20, 20]})
    assert values(st, 5.0, 10.0) == [0.0, 20.0]


def test_engine_appearing_or_missing_is_not_a_rise():
    # engine1 is scraped for the first time at t=4 with 30 waiting, and engine0 misses t=7:
    # neither its whole level nor a gap reads as arrivals
    st = store_with({"engine0": [1, 1, 1, 2, 2, 2, None, 2, 3, 3],
                     "engine1": [None, None, None, 30, 30, 31, 31, 31, 31, 31]})
    assert values(st, 5.0, 10.0) == [1.0, 1.0]


def test_no_step_without_two_collections():
    st = store_with({"engine0": [5]})
    assert STEP not in summary_mod.compute(st, "n1", T0 + 5, 5.0)


def test_running_requests_handed_back_to_the_queue_did_not_arrive():
    # a deadlocked scheduler returns its 39 running requests to the waiting queue at t=5 while
    # two new ones arrive (gpu3-engine-stall seed 2: waiting +41, running -39)
    st = store_with({"engine0": [3, 3, 4, 4, 45, 46, 47, 48, 49, 50]},
                    running={"engine0": [39, 39, 39, 39, 0, 0, 0, 0, 0, 0]},
                    tokens={"engine0": [0, 500, 1000, 1500, 1500, 1500, 1500, 1500, 1500, 1500]})
    assert values(st, 5.0, 10.0) == [2.0, 1.0]


def test_a_burst_admitted_at_once_did_not_queue():
    # 20 requests arrive at t=4 and the engine, with free KV cache, runs them all at once
    st = store_with({"engine0": [0] * 10}, running={"engine0": [5, 5, 5, 25, 25, 24, 23, 22, 21, 20]})
    assert max(values(st, 5.0, 10.0)) <= 0


def test_a_frozen_front_end_jumping_when_the_engine_resumes_is_spread_over_the_stall():
    # an engine core hung inside a step from t=6 to t=36: the front end repeats its last stats
    # (running 30, waiting 2, no new token), then reports the 90 requests that arrived meanwhile
    n = 45
    waiting = [2.0] * 36 + [92.0] * (n - 36)
    running = [30.0] * n
    tokens = [500.0 * min(i, 5) for i in range(36)] + [2500.0 + 500 * (i - 35) for i in range(36, n)]
    st = store_with({"engine0": waiting}, running={"engine0": running}, tokens={"engine0": tokens})
    step = summary_mod.compute(st, "n1", T0 + 40, 5.0)[STEP]
    assert 2.5 <= step <= 3.5  # 90 over the 31 s since its last progress, not 90 in one second
    # an idle engine (nothing running, so no token either) that receives a burst counts it whole
    idle = store_with({"engine0": [0.0] * 36 + [20.0] * (n - 36)}, running={"engine0": [0.0] * n},
                      tokens={"engine0": [0.0] * n})
    assert summary_mod.compute(idle, "n1", T0 + 40, 5.0)[STEP] == 20


def test_arrivals_per_second_count_admitted_and_finished_requests():
    # per second: 3 arrive; the engine admits them and finishes 3 (waiting and running steady),
    # and at t=6 a burst of 12 lands in the queue
    n = 11
    st = store_with({"engine0": [0.0] * 5 + [12.0] * (n - 5)}, running={"engine0": [10.0] * n},
                    finished={"engine0": [3.0 * i for i in range(n)]})
    assert values(st, 5.0, 10.0, ARRIVED) == [3.0, 3.0 + 12 / 5]
    assert values(st, 1.0, 4.0, ARRIVED)[1:] == [3.0, 3.0, 3.0]


def test_engine_steps_per_second_sum_the_node_engines_and_survive_a_restart():
    # vllm_iterations_total per engine, one collection a second: engine0 steps 30 times a second,
    # engine1 20 times and restarts at t=7 (its counter starts over from 0)
    STEPS = "summary_engine_steps_per_second"
    st = WindowStore(Catalogue(VLLM).merge(summary_mod.CATALOGUE))
    e1 = [200.0 + 20 * i for i in range(6)] + [20.0 * (i - 5) for i in range(6, 12)]
    for i in range(12):
        b = BatchBuilder("n1")
        b.add(T0 + 1 + i, "engine0", "vllm_iterations_total", 1000.0 + 30 * i)
        b.add(T0 + 1 + i, "engine1", "vllm_iterations_total", e1[i])
        st.ingest(b.build())
    assert summary_mod.compute(st, "n1", T0 + 5, 5.0)[STEPS] == 50
    assert summary_mod.compute(st, "n1", T0 + 10, 5.0)[STEPS] == 50  # the restart counts from zero
    # a node without a vLLM engine reports no step rate at all (not zero)
    bare = WindowStore(Catalogue(VLLM).merge(summary_mod.CATALOGUE))
    assert STEPS not in summary_mod.compute(bare, "n1", T0 + 5, 5.0)


def test_the_benchmark_keeps_every_input_of_the_engine_queue_summaries():
    # the fault lab keeps only the signals a rule or a summary spec's source reads: the queue
    # step also reads running, tokens and finished requests, which must stay among them
    from pathlib import Path

    from skewd.catalogue import full_catalogue
    from skewd.lab.harness import needed_signals
    from skewd.rules.loader import load_rules_or_raise

    packs = Path(__file__).resolve().parents[2] / "rules" / "packs"
    keep = needed_signals(load_rules_or_raise([packs], full_catalogue()))
    assert set(summary_mod.ENGINE_INPUTS) <= keep
    assert {s.source for s in summary_mod.SPECS} <= keep  # engine steps (PCIE-3) included
    assert "vllm_iterations_total" in keep
