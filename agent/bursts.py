"""Collective bursts for the node summary: every burst the pkt collector saw end, not one a
collection.

The controller aligns TP peers' bursts step by step (EW-1 stragglers, EW-9 early stops, EW-2
pipeline bubbles), so a summary carries *every* collective burst start of its interval with its
bytes (``collective_burst_starts`` / ``collective_burst_bytes``). The pkt collector lists each
burst of what a port sent once, when it ended (``pkt_burst_ended_start_seconds`` and
``pkt_burst_ended_bytes``, stamped with the time it ended: the first packet after it, or the
collection that found the port quiet since). Stamps fall between the collection that listed a
burst and the one before it (or just after, for packets the collection took after its tick),
so the bursts a summary reports are those stamped after the last pkt collection before its
interval and up to the last one inside it: each burst reaches exactly one summary, including
bursts that ended between a collection and the summary.

Which port: the one whose listed bursts carried the most bytes over the last minute. The collectives
of a TP group are the node's largest transfers - an all-reduce moves 2 x layers x tokens x
hidden x 2 bytes per step, megabytes per node - while a front-end port's "bursts" are the token
packets of response streams (hundreds of bytes each), and a multi-rail node's RDMA ports carry
the same collectives at the same times, so one of them gives every step. Mixing ports would put
token packets between the steps, which the aligner would take as extra steps; so would choosing
per interval (an interval without collectives would report the front end's packets). A node
whose capture sees only one port (the agent's usual single ``collectors.pkt.interface``)
reports that port's bursts.
"""
from __future__ import annotations

import numpy as np

from skewd.rules.store import WindowStore

ENDED_START = "pkt_burst_ended_start_seconds"
ENDED_BYTES = "pkt_burst_ended_bytes"
#: a per-port signal every pkt collection sends: its stamps are the collection times
COLLECTIONS = "pkt_bursts_total"
#: how far back the collective port is chosen (seconds of listed bursts)
LOOKBACK = 60.0


def collective_bursts(store: WindowStore, node: str, t: float, interval: float,
                      lookback: float = LOOKBACK) -> tuple[np.ndarray, np.ndarray]:
    """(starts, bytes) of the collective bursts ``node``'s pkt collections in ``(t - interval, t]``
    listed, in start order (both empty when there are none)."""
    none = np.empty(0), np.empty(0)
    ref = store.blocks.get(COLLECTIONS, {}).get(node)
    sb = store.blocks.get(ENDED_START, {}).get(node)
    if ref is None or sb is None or not sb.n:
        return none
    times = ref.times[: ref.n]
    i_hi = int(times.searchsorted(t, "right"))
    i_lo = int(times.searchsorted(t - interval, "right"))
    if i_hi == i_lo:  # no pkt collection in the interval: nothing new
        return none
    hi = float(times[i_hi - 1])
    lo = float(times[i_lo - 1]) if i_lo > 0 else -np.inf
    # the collective port: the most burst bytes over the lookback (with no bytes known: the
    # most bursts), so an interval without collectives reports none rather than token packets
    tt, S = sb.window(min(lo, hi - lookback), hi)
    if not len(tt):
        return none
    bb = store.blocks.get(ENDED_BYTES, {}).get(node)
    B = np.full(S.shape, np.nan)
    if bb is not None:  # the same stamps as the starts (sent together); matched by time and port
        bt, BW = bb.window(min(lo, hi - lookback), hi)
        if len(bt):
            k = np.minimum(np.searchsorted(bt, tt), len(bt) - 1)
            ok = bt[k] == tt
            for ent, r in sb.rows.items():
                rb = bb.rows.get(ent)
                if rb is not None:
                    B[r, ok] = BW[rb, k[ok]]
    has = ~np.isnan(S)
    score = np.where(has, np.nan_to_num(B), 0.0).sum(axis=1) + has.sum(axis=1) * 1e-9
    r = int(np.argmax(score))
    sel = has[r] & (tt > lo)
    starts, nbytes = S[r, sel], B[r, sel]
    o = np.argsort(starts, kind="stable")
    return starts[o], nbytes[o]
