"""Per-flow, per-interval timing features of a whole capture (``skewd pkt FILE``), and the
import point of the feature path.

:func:`analyze` cuts a decoded capture into ``--interval`` buckets aligned to Unix time and runs
one :class:`~.tracker.FlowTracker` over them; :func:`burst_list` lists every burst of every
flow. The feature path itself is split by idea:

- :mod:`.flowkey`: what a flow is (5-word key, grouping packets by flow, entity name);
- :mod:`.segmented`: per-group numpy reductions (quantiles, unwrapping, running maxima);
- :mod:`.intervals`: the result types (:class:`IntervalFeatures`, :class:`PortFeatures`);
- :mod:`.tracker`: :class:`FlowTracker`, flow state across intervals, gaps and bursts;
- :mod:`.retransmits`: TCP and RoCE retransmission analysis;
- :mod:`.portstats`: per-capture-port aggregates.

The names users import from here (``FlowTracker``, ``IntervalFeatures``, ``NS``, ...) stay
importable from this module.
"""
from __future__ import annotations

import math

import numpy as np

from .flowkey import entity_of, flow_key_columns, group_flows
from .intervals import FLOW_COLUMNS, NS, IntervalFeatures, PortFeatures
from .parse import Packets
from .tracker import FlowTracker

__all__ = ["FLOW_COLUMNS", "NS", "FlowTracker", "IntervalFeatures", "PortFeatures", "analyze",
           "burst_list", "entity_of", "flow_key_columns", "group_flows"]


def analyze(pk: Packets, interval: float | None = None, burst_gap: float = 0.001,
            port_names: list[str] | None = None, drops: dict[int, int] | None = None,
            max_intervals: int = 100_000) -> list[IntervalFeatures]:
    """Offline: features per interval of a whole capture (one interval when ``interval`` is None).

    Intervals are aligned to multiples of ``interval`` in Unix time (so captures taken on
    different nodes line up); the first and last are clipped to the capture's span, which is
    what the rates are divided by.
    """
    tr = FlowTracker(burst_gap, flow_timeout=math.inf)
    if len(pk) == 0:
        return []
    lo_ns, hi_ns = int(pk.ts_ns.min()), int(pk.ts_ns.max())
    if not interval:
        return [tr.update(pk, lo_ns / NS, hi_ns / NS, port_names, drops)]
    iv = int(round(interval * NS))
    if iv <= 0:
        raise ValueError("interval must be > 0")
    b0 = (lo_ns // iv) * iv
    nb = (hi_ns - b0) // iv + 1
    if nb > max_intervals:
        raise ValueError(f"{nb} intervals of {interval:g}s: the capture spans {(hi_ns - lo_ns) / NS:.0f}s; "
                         f"use a longer --interval")
    bi = (pk.ts_ns - b0) // iv
    if np.any(bi[1:] < bi[:-1]):  # out-of-order timestamps: bucket, keeping capture order inside
        o = np.argsort(bi, kind="stable")
        pk, bi = pk.take(o), bi[o]
    bounds = np.searchsorted(bi, np.arange(nb + 1), side="left")
    out = []
    for k in range(nb):
        a, b = int(bounds[k]), int(bounds[k + 1])
        t0 = max(b0 + k * iv, lo_ns) / NS
        t1 = min(b0 + (k + 1) * iv, hi_ns) / NS
        out.append(tr.update(pk.take(np.arange(a, b)), t0, t1, port_names, drops))
    return out


def burst_list(pk: Packets, burst_gap: float) -> list[tuple[str, float, float, int, int]]:
    """Every burst of every flow in a capture: (entity, start s, end s, bytes, packets)."""
    tr = FlowTracker(burst_gap, flow_timeout=math.inf)
    idx = np.flatnonzero((pk.ipver > 0) & pk.decoded)
    if not len(idx):
        return []
    keys = flow_key_columns(pk, idx)
    vk = np.ascontiguousarray(keys).view(np.dtype((np.void, 40))).ravel()
    _, first_i, inv = np.unique(vk, return_index=True, return_inverse=True)
    inv = inv.ravel()
    order = np.argsort(inv, kind="stable")
    g = inv[order]
    ts = pk.ts_ns[idx[order]]
    wl = pk.wirelen[idx[order]]
    first = np.r_[True, g[1:] != g[:-1]]
    start = first | (np.r_[0, np.diff(ts)] >= tr.burst_gap_ns)
    ss = np.flatnonzero(start)
    se = np.r_[ss[1:], len(ts)] - 1
    byt = np.add.reduceat(wl, ss)
    ents = [entity_of(keys[first_i[k]]) for k in range(len(first_i))]
    return [(ents[g[a]], ts[a] / NS, ts[e] / NS, int(bb), int(e - a + 1))
            for a, e, bb in zip(ss.tolist(), se.tolist(), byt.tolist())]
