"""Per-engine timelines of vLLM phase, KV usage, queue and latency, for phase correlation.

Two sources feed it: the stat-logger plugin's :class:`~skewd.controller.messages.PhaseRecord`
(per step: prefill/decode split, KV, queue; per request: TTFT, inter-token latency), keyed
``<node>/<engine>``; and the agents' summaries, for engines without the plugin: each engine's
own keys (``engine_phase``, ``engine_kv_cache_usage_ratio``, ``engine_requests_waiting``,
``engine_requests_running``, ``engine_ttft_p50_seconds``, ``engine_itl_p50_seconds``, keyed by
the collector's engine entity: agent/engines.py) as ``<node>/<entity>``, and the node's
reductions (``summary_engine_phase``, ``summary_kv_cache_usage_ratio``,
``summary_requests_waiting``) keyed by the node name, for what names no engine. Correlated findings quote :meth:`Timelines.context` (what phase the
engine was in when the trouble started) and :meth:`Timelines.effect` (what its users saw:
TTFT, ITL, queue growth, against the baseline before).
"""
from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from typing import Iterable

import numpy as np

from .messages import Effect, Phase, PhaseContext, PhaseRecord


#: a timeline point is a plain tuple (t, phase value or None, kv, waiting, running): a tuple of
#: floats, strings and None is untracked by CPython's collector at its first young collection, so
#: the points (up to the horizon at every node's summary rate: millions at 1,000 nodes) are never
#: walked by a full collection. As objects of their own they were the one thing a settled
#: controller's full collections walked (controller/gcpolicy.py): 118 ms each at 1.4 M points.
_T, _PHASE, _KV, _WAITING, _RUNNING = range(5)


def _phase_value(phase: Phase | None) -> str | None:
    return None if phase is None else phase.value


_PHASE_VALUES = {c: _phase_value(Phase.from_code(float(c))) for c in (0, 1, 2)}


@dataclass
class EngineTimeline:
    key: str
    source: str  # "plugin" | "summary"
    points: deque = field(default_factory=deque)  # point tuples (_T, _PHASE, ...), time-ordered
    ttft: deque = field(default_factory=deque)  # (t, seconds)
    itl: deque = field(default_factory=deque)  # (t, sum seconds, count)

    def prune(self, before: float) -> None:
        d = self.points
        while d and d[0][0] < before:
            d.popleft()
        for d in (self.ttft, self.itl):
            while d and d[0][0] < before:
                d.popleft()


_NONE: dict = {}  # an absent signal (never modified)

#: the summary's per-engine keys (agent/engines.py writes them; a test keeps the two in step)
ENGINE_PHASE, ENGINE_KV, ENGINE_WAITING, ENGINE_RUNNING, ENGINE_TTFT, ENGINE_ITL = (
    "engine_phase", "engine_kv_cache_usage_ratio", "engine_requests_waiting", "engine_requests_running",
    "engine_ttft_p50_seconds", "engine_itl_p50_seconds")
ENGINE_KEYS = frozenset({ENGINE_PHASE, ENGINE_KV, ENGINE_WAITING, ENGINE_RUNNING, ENGINE_TTFT, ENGINE_ITL})


#: the node's reductions a summary timeline reads (entity "")
NODE_KEYS = ("summary_engine_phase", "summary_kv_cache_usage_ratio", "summary_requests_waiting")
_ENGINE_ORDER = (ENGINE_PHASE, ENGINE_KV, ENGINE_WAITING, ENGINE_RUNNING, ENGINE_TTFT, ENGINE_ITL)


@dataclass(frozen=True)
class SummaryPlan:
    """Where :meth:`Timelines.add_summary` finds its inputs among a binary summary's values
    (positions, -1: absent): per engine entity the positions of its ENGINE_* keys (in the
    order phase, kv, waiting, running, ttft, itl), and those of :data:`NODE_KEYS` (None when
    the layout has none of them)."""

    engines: tuple[tuple[str, tuple[int, ...]], ...]
    node: tuple[int, ...] | None


def summary_plan(signals: Iterable[tuple[str, Iterable[str]]]) -> SummaryPlan:
    """The :class:`SummaryPlan` of a layout (signals with their entities, in value order):
    the engines are the entities of the first of engine_phase, engine_kv_cache_usage_ratio,
    engine_requests_waiting that has any, as :meth:`Timelines.add_summary` takes them."""
    pos: dict[tuple[str, str], int] = {}
    ents_of: dict[str, list[str]] = {}
    for name, ents in signals:
        ents_of[name] = list(ents)
        for e in ents_of[name]:
            pos[(name, e)] = len(pos)
    engines = ents_of.get(ENGINE_PHASE) or ents_of.get(ENGINE_KV) or ents_of.get(ENGINE_WAITING) or []
    node = tuple(pos.get((k, ""), -1) for k in NODE_KEYS)
    return SummaryPlan(tuple((e, tuple(pos.get((k, e), -1) for k in _ENGINE_ORDER)) for e in engines),
                       None if max(node) < 0 else node)


def _value(ents: dict[str, float | None] | None, ent: str) -> float | None:
    """An engine's value of one summary key (None: absent, null or NaN)."""
    v = (ents or _NONE).get(ent)
    return None if v is None or v != v else float(v)


def _fmt_s(v: float) -> str:
    return f"{v * 1000:.0f}ms" if v < 1 else f"{v:.2f}s"


def _change(now: float | None, base: float | None) -> str:
    if now is None:
        return "not observed"
    if base is None or base <= 0:
        return _fmt_s(now)
    return f"{_fmt_s(now)} vs {_fmt_s(base)} before ({(now / base - 1) * 100:+.0f}%)"


class Timelines:
    """Owns every engine's recent phase timeline, from the phase records and node summaries the
    controller hands it; the correlator reads it for a finding's phase and observed effect."""

    def __init__(self, horizon: float = 900.0, stale_after: float = 30.0) -> None:
        self.horizon = horizon
        self.stale_after = stale_after
        self.engines: dict[str, EngineTimeline] = {}
        self.records = 0

    # -- ingest -----------------------------------------------------------------------------
    def add_record(self, rec: PhaseRecord) -> str:
        key = f"{rec.node}/{rec.engine}"
        tl = self.engines.setdefault(key, EngineTimeline(key, "plugin"))
        steps = sorted(rec.steps, key=lambda s: s.t)
        if steps:
            # a phase per step would flicker between prefill and decode; the record's period is
            # the unit of phase, its last step the unit of KV and queue
            for s in steps:
                tl.points.append((s.t, _phase_value(rec.phase), s.kv_usage_ratio, float(s.waiting), float(s.running)))
        else:
            tl.points.append((rec.t, _phase_value(rec.phase), None, None, None))
        ttft = list(rec.ttft_s) or [f.queued_s + f.prefill_s for f in rec.finished]
        for v in ttft:
            tl.ttft.append((rec.t, float(v)))
        if rec.itl_count > 0:
            tl.itl.append((rec.t, float(rec.itl_sum_s), int(rec.itl_count)))
        else:
            for f in rec.finished:
                if f.gen_tokens > 1:
                    tl.itl.append((rec.t, float(f.decode_s), f.gen_tokens - 1))
        tl.prune(rec.t - self.horizon)
        self.records += 1
        return key

    def add_summary(self, node: str, t: float, signals: dict[str, dict[str, float | None]]) -> None:
        get = signals.get
        engines = get(ENGINE_PHASE) or get(ENGINE_KV) or get(ENGINE_WAITING) or _NONE
        for ent in engines:
            self._add_engine(node, ent, t, *[_value(get(k), ent) for k in _ENGINE_ORDER])
        self._add_node(node, t, (get("summary_engine_phase") or _NONE).get(""),
                       (get("summary_kv_cache_usage_ratio") or _NONE).get(""),
                       (get("summary_requests_waiting") or _NONE).get(""))

    def add_values(self, node: str, t: float, plan: "SummaryPlan", values: list[float]) -> None:
        """:meth:`add_summary` of a binary summary's values (NaN: missing), read at the
        positions ``plan`` found in its layout once (:func:`summary_plan`)."""
        for ent, idx in plan.engines:
            v = [None if i < 0 or values[i] != values[i] else values[i] for i in idx]
            self._add_engine(node, ent, t, *v)
        if plan.node is not None:  # (the hot path: every summary of a GPU node)
            i, j, k = plan.node
            p = values[i] if i >= 0 else None
            kv = values[j] if j >= 0 else None
            w = values[k] if k >= 0 else None
            self._add_node(node, t, None if p != p else p, None if kv != kv else kv, None if w != w else w)

    def _add_node(self, node: str, t: float, phase: float | None, kv: float | None, waiting: float | None) -> None:
        """The node's own reductions (for what names no engine), keyed by the node name."""
        if phase is None and kv is None and waiting is None:
            return
        tl = self.engines.get(node)
        if tl is None:  # (not setdefault: that would build a timeline per summary)
            tl = self.engines[node] = EngineTimeline(node, "summary")
        pts = tl.points
        # (Phase.from_code's value, inline: a finite code rounds to 0, 1, 2 or to no phase)
        pts.append((t, None if phase is None or phase != phase else _PHASE_VALUES.get(int(round(phase))), kv,
                    waiting, None))
        before = t - self.horizon
        if pts[0][0] < before or tl.ttft or tl.itl:  # (prune's own test, without the call per summary)
            tl.prune(before)

    def _add_engine(self, node: str, ent: str, t: float, phase: float | None, kv: float | None,
                    waiting: float | None, running: float | None, ttft: float | None, itl: float | None) -> None:
        """One engine's own summary values (a plugin timeline of the same key wins: it sees every step)."""
        key = f"{node}/{ent}"
        tl = self.engines.get(key)
        if tl is not None and tl.source == "plugin":
            return
        if tl is None:
            tl = self.engines[key] = EngineTimeline(key, "summary")
        tl.points.append((t, _phase_value(Phase.from_code(phase)), kv, waiting, running))
        if ttft is not None:
            tl.ttft.append((t, ttft))
        if itl is not None:
            tl.itl.append((t, itl, 1))  # one interval's median: a mean of medians over the window
        tl.prune(t - self.horizon)

    def node_engines(self, node: str) -> list[str]:
        """Keys of the node's engines that have timelines of their own (plugin or summary)."""
        return sorted(k for k in self.engines if k.startswith(node + "/"))

    # -- queries ----------------------------------------------------------------------------
    def resolve(self, candidates: Iterable[str]) -> str | None:
        """The first candidate key with data (engine keys, then node keys)."""
        for c in candidates:
            if c and c in self.engines and self.engines[c].points:
                return c
        return None

    def context(self, key: str | None, t: float) -> PhaseContext | None:
        """The engine's latest state at or before ``t`` (within ``stale_after``)."""
        tl = self.engines.get(key or "")
        if tl is None:
            return None
        best = None
        for p in reversed(tl.points):
            if p[_T] <= t:
                best = p
                break
        if best is None or t - best[_T] > self.stale_after:
            best = next((p for p in tl.points if p[_T] >= t), None)  # started before the engine reported
            if best is None:
                return None
        return PhaseContext(engine=tl.key, phase=best[_PHASE] or "unknown", kv_usage_ratio=best[_KV],
                            waiting=best[_WAITING], running=best[_RUNNING], t=best[_T], source=tl.source)

    def effect(self, key: str | None, start: float, end: float, baseline: float) -> Effect | None:
        """TTFT (median), ITL (mean) and waiting-queue slope over ``[start, end]`` against the
        ``baseline`` seconds before ``start``."""
        tl = self.engines.get(key or "")
        if tl is None:
            return None

        def ttft(lo: float, hi: float) -> float | None:
            v = [x for t, x in tl.ttft if lo <= t <= hi]
            return float(np.median(v)) if v else None

        def itl(lo: float, hi: float) -> float | None:
            s = sum(x for t, x, _ in tl.itl if lo <= t <= hi)
            n = sum(c for t, _, c in tl.itl if lo <= t <= hi)
            return s / n if n else None

        pts = [(p[_T], p[_WAITING]) for p in tl.points if start <= p[_T] <= end and p[_WAITING] is not None]
        growth = None
        if len(pts) >= 2 and pts[-1][0] > pts[0][0]:
            a = np.array(pts)
            growth = float(np.polyfit(a[:, 0] - a[0, 0], a[:, 1], 1)[0])
        e = Effect(ttft_s=ttft(start, end), ttft_baseline_s=ttft(start - baseline, start),
                   itl_s=itl(start, end), itl_baseline_s=itl(start - baseline, start), queue_growth_per_s=growth)
        parts = [f"TTFT {_change(e.ttft_s, e.ttft_baseline_s)}", f"ITL {_change(e.itl_s, e.itl_baseline_s)}"]
        parts.append("queue not observed" if growth is None else f"queue {growth:+.2f} req/s")
        return Effect(**{**e.__dict__, "description": "; ".join(parts)})
