"""Timelines fed by summaries (and plugin records, whose pruning shares the code) hold exactly
what the previous implementation, kept here, held."""
from __future__ import annotations

import gc
import math
import random

from skewd.controller import messages as M
from skewd.controller.timeline import EngineTimeline, Timelines


def _old_from_code(code):
    if code is None or code != code:
        return None
    return {0: M.Phase.IDLE, 1: M.Phase.DECODE, 2: M.Phase.PREFILL}.get(int(round(code)))


def _old_prune(tl: EngineTimeline, before: float) -> None:
    for d in (tl.points, tl.ttft, tl.itl):
        while d and d[0][0] < before:
            d.popleft()


class Reference(Timelines):
    """The implementation before the per-summary shortcuts."""

    def add_summary(self, node, t, signals):
        def val(name):
            return (signals.get(name) or {}).get("")

        phase, kv, waiting = val("summary_engine_phase"), val("summary_kv_cache_usage_ratio"), val("summary_requests_waiting")
        if phase is None and kv is None and waiting is None:
            return
        tl = self.engines.setdefault(node, EngineTimeline(node, "summary"))
        ph = _old_from_code(phase)
        tl.points.append((t, ph.value if ph else None, kv, waiting, None))
        _old_prune(tl, t - self.horizon)

    def add_record(self, rec):
        orig = EngineTimeline.prune
        EngineTimeline.prune = _old_prune  # type: ignore[method-assign]
        try:
            return super().add_record(rec)
        finally:
            EngineTimeline.prune = orig  # type: ignore[method-assign]


def _signals(rng: random.Random) -> dict:
    out: dict = {}
    for name in ("summary_engine_phase", "summary_kv_cache_usage_ratio", "summary_requests_waiting", "other"):
        r = rng.random()
        if r < 0.15:
            continue  # absent
        if r < 0.25:
            out[name] = {}
        elif r < 0.3:
            out[name] = None
        elif r < 0.4:
            out[name] = {"": None}
        elif r < 0.45:
            out[name] = {"gpu0": 1.0}
        else:
            v = rng.choice([0.0, 1.0, 2.0, 1.4, 2.6, 3.0, -0.2, math.nan, rng.uniform(0, 5)])
            out[name] = {"": v}
    return out


def _record(rng: random.Random, node: str, t: float) -> M.PhaseRecord:
    steps = [M.StepStat(t=t - rng.uniform(0, 2), index=i, ctx_reqs=1, ctx_tokens=10, gen_reqs=2, gen_tokens=2,
                        elapsed_s=0.01, running=rng.randrange(5), waiting=rng.randrange(5),
                        kv_usage_ratio=rng.random()) for i in range(rng.randrange(3))]
    return M.PhaseRecord(node=node, cluster="c1", engine="engine0", model="m", t_start=t - 2, t=t,
                         phase=rng.choice(list(M.Phase)), steps=steps, finished=[],
                         ttft_s=[rng.random() for _ in range(rng.randrange(3))], itl_count=rng.randrange(3),
                         itl_sum_s=rng.random(), itl_max_s=None, dropped={})


def _dump(tls: Timelines):
    return {k: (tl.source, list(tl.points), list(tl.ttft),
                list(tl.itl)) for k, tl in tls.engines.items()}


def test_summaries_and_records_give_the_same_timelines_as_before() -> None:
    rng = random.Random(4)
    new, ref = Timelines(horizon=20.0), Reference(horizon=20.0)
    t = 1000.0
    for i in range(4000):
        t += rng.uniform(0, 0.5)
        node = f"n{rng.randrange(5)}"
        if rng.random() < 0.1:
            rec = _record(rng, node, t)
            assert new.add_record(rec) == ref.add_record(rec)
        else:
            sig = _signals(rng)
            new.add_summary(node, t, sig)
            ref.add_summary(node, t, sig)
        if i % 97 == 0:
            assert _dump(new) == _dump(ref)
    assert _dump(new) == _dump(ref)
    assert any(len(tl.points) > 10 for tl in new.engines.values())
    for code in (None, math.nan, 0.0, 0.4, 0.5, 1.5, 2.0, 2.5, 3.0, -1.0):
        assert M.Phase.from_code(code) is _old_from_code(code)


def test_timeline_points_are_left_out_of_the_collectors_walks() -> None:
    """A warm controller holds a point per summary for the horizon (millions at 1,000 nodes);
    as GC-tracked objects every full collection walked them all (118 ms at 1.4 M points, on
    whatever thread allocated: often the tick's). Points of summaries and of plugin records
    must be untracked once a young collection has seen them."""
    rng = random.Random(5)
    tls = Timelines(horizon=1e6)
    t = 1000.0
    for i in range(300):
        t += 0.5
        if i % 10 == 0:
            tls.add_record(_record(rng, "n1", t))
        tls.add_summary("n2", t, {"summary_engine_phase": {"": 1.0}, "summary_kv_cache_usage_ratio": {"": 0.5},
                                  "summary_requests_waiting": {"": 3.0}})
        tls.add_summary("n3", t, {"engine_phase": {"e0": 2.0}, "engine_kv_cache_usage_ratio": {"e0": 0.1}})
    gc.collect()
    points = [p for tl in tls.engines.values() for p in tl.points]
    assert len(points) > 600 and {tl.source for tl in tls.engines.values()} == {"plugin", "summary"}
    assert not [p for p in points if gc.is_tracked(p)]
    assert tls.context("n2", t).phase == "decode_heavy" and tls.context("n1/engine0", t).source == "plugin"
