"""The rule language's functions: which names exist, what each needs and computes.

Window functions reduce a signal's samples over a duration per entity, peer functions compare an
entity with its peer group, elementwise functions combine values. The compiler checks calls
against these tables; ``skewd rules functions`` (schema) prints the docs, replay's ``--explain``
the window functions. The kernels themselves live in ``functions``.
"""
from __future__ import annotations

from typing import Callable

from . import functions

#: window functions: name → (kernel(times, values), the signal kind it needs: "counter", "gauge" or None)
WINDOW_FUNCTIONS: dict[str, tuple[Callable, str | None]] = {
    "rate": (functions.rate, "counter"),
    "increase": (functions.increase, "counter"),
    "resets": (functions.resets, "counter"),
    "delta": (functions.delta, "gauge"),
    "avg": (functions.avg, None),
    "min": (functions.wmin, None),
    "max": (functions.wmax, None),
    "sum": (functions.wsum, None),
    "count": (functions.count, None),
    "stddev": (functions.stddev, None),
    "cov": (functions.cov, None),
    "burstiness": (functions.burstiness, None),
    "changes": (functions.changes, None),
    "absent": (functions.absent, None),
    "present": (functions.present, None),
    "p50": (lambda t, W: functions.quantile(t, W, 0.5), None),
    "p90": (lambda t, W: functions.quantile(t, W, 0.9), None),
    "p95": (lambda t, W: functions.quantile(t, W, 0.95), None),
    "p99": (lambda t, W: functions.quantile(t, W, 0.99), None),
}
CONDITION_WINDOW_FUNCTIONS = {"gaps", "longest_gap"}
PEER_FUNCTIONS = {
    "peer_median": lambda x, g: functions.peer_reduce(x, g, "median"),
    "peer_mean": lambda x, g: functions.peer_reduce(x, g, "mean"),
    "peer_min": lambda x, g: functions.peer_reduce(x, g, "min"),
    "peer_max": lambda x, g: functions.peer_reduce(x, g, "max"),
    "peer_count": lambda x, g: functions.peer_reduce(x, g, "count"),
    "peer_zscore": functions.peer_zscore,
    "peer_dev": functions.peer_dev,
    "peer_others": functions.peer_others,
    "spread": functions.spread,
    "rank": functions.rank,
}
ELEMENTWISE_FUNCTIONS = {"abs", "greatest", "least", "default", "bitand"}
FUNCTIONS = sorted(set(WINDOW_FUNCTIONS) | CONDITION_WINDOW_FUNCTIONS | set(PEER_FUNCTIONS) | ELEMENTWISE_FUNCTIONS
                   | {"quantile", "age", "last"})

FUNCTION_DOCS = {
    "rate": "rate(counter, 1m): per-second increase over the window; survives resets and wraps",
    "increase": "increase(counter, 1m): total increase over the window",
    "resets": "resets(counter, 1h): number of counter resets in the window",
    "delta": "delta(gauge, 1m): last minus first value in the window",
    "avg": "avg(x, 1m)", "min": "min(x, 1m)", "max": "max(x, 1m)", "sum": "sum(x, 1m)",
    "count": "count(x, 1m): number of samples",
    "stddev": "stddev(x, 1m): population standard deviation",
    "cov": "cov(x, 1m): coefficient of variation, stddev / mean",
    "burstiness": "burstiness(x, 1m): peak / mean",
    "changes": "changes(x, 10m): how many times the value changed",
    "absent": "absent(x, 1m): 1 when the entity has no sample in the window",
    "present": "present(x, 1m): 1 when it has at least one",
    "p50": "p50(x, 1m)", "p90": "p90(x, 1m)", "p95": "p95(x, 1m)", "p99": "p99(x, 1m)",
    "quantile": "quantile(x, 0.9, 1m)",
    "gaps": "gaps(x > t, 1m): number of runs of samples where the condition is false",
    "longest_gap": "longest_gap(x > t, 1m): longest seconds between samples where the condition holds",
    "age": "age(x): seconds since the entity's latest sample",
    "last": "last(x, 5m): latest value within the window (a bare name uses the engine's lookback)",
    "peer_median": "peer_median(v): median of v across the entity's peer group",
    "peer_mean": "peer_mean(v)", "peer_min": "peer_min(v)", "peer_max": "peer_max(v)",
    "peer_count": "peer_count(v): members with a value",
    "peer_zscore": "peer_zscore(v): (v - group mean) / group stddev",
    "peer_dev": "peer_dev(v): (v - median of the other members) / that median",
    "peer_others": "peer_others(v): median of v over the other members of the group",
    "spread": "spread(v): group max - group min",
    "rank": "rank(v): 1 = largest in the group",
    "abs": "abs(v)", "greatest": "greatest(a, b, ...)", "least": "least(a, b, ...)",
    "default": "default(v, 0): v, or the number where v is missing",
    "bitand": "bitand(v, 0x8): bitwise and of integer values (clock event reason masks)",
}

