"""Collective steps from the silences of a node's collective traffic: each node's own rhythm,
measured on its own clock, for straggler detection that needs no synchronised clocks.

The pkt collector lists every silence of a port's collective traffic with how it ended
(``collectors/pkt/collective.py``): by the node's own send (it entered a collective after
computing) or by a peer's data arriving (it was waiting). From the silences of the last
``lookback`` seconds this module finds, per node:

- the **steps**: a step begins where the node ends a compute gap by sending. Silences ended by
  a send split into two classes by length (Otsu's threshold on their logarithms): pauses inside
  a collective (pacing, buffers draining: about a millisecond) and compute gaps (tens of ms).
  The long class (all of them when they do not split: a transport that does not pause inside
  its collectives), at most one per half period (the longest first), gives the step entries;
- the **step period**: the median spacing of the entries, each spacing folded onto its multiple
  of the period (an entry missed leaves a double spacing). The collective's own structure, not
  the median gap between bursts (which mixes ACKs, control messages and pauses inside a
  collective);
- per step, the **compute gap** (that silence: from the node's last collective packet of the
  previous step to its first send of this one - the time it computed, as seen from the wire),
  the **wait** (the longest silence of either kind inside the step, between its entry and the
  next compute gap: time spent waiting for a peer) and the **bytes** it sent.

A straggler computes longest and does not wait; the peers it holds up compute as usual and then
wait for it. Both are local durations, which no clock offset between nodes touches; the
controller compares them across a TP group (rule EW-1-tp-straggler).

Pure functions over arrays; :func:`node_steps` reads the window store.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from skewd.rules.store import WindowStore

SILENCE = "pkt_collective_silence_seconds"
BY_SEND = "pkt_collective_silence_by_send"
SENT = "pkt_collective_sent_bytes"
#: seconds of listed silences a summary analyses
LOOKBACK = 10.0
#: fewest steps worth a median
MIN_STEPS = 5
#: the long class of send-ended silences holds at least this share of them when it is the
#: steps' compute gaps (one per step; real lab: 70 % on a waiting rank, 29-33 % on a straggler,
#: which never waits and ends most pauses itself); a handful of outliers above the rest (a
#: RoCE-like transport without pauses: 3 %) is no class of its own
MIN_LONG_SHARE = 0.1
#: pauses inside a collective are a small part of the time: real lab 3.2-3.5 pauses of ~2 ms per
#: 70 ms step, 30 % of them ended by a send - about 3 % of the time in send-ended pauses (RoCE far
#: less). Send-ended silences of the short class that add up to more than a quarter of the
#: lookback are compute gaps of shorter steps, not pauses
MAX_PAUSE_SHARE = 0.25
#: compute gaps at least this many times longer than the pauses inside a collective (geometric
#: means of the two classes): otherwise the traffic has no step structure to read
SEPARATION = 3.0


@dataclass(frozen=True)
class StepStats:
    """What a node's collective traffic says about its steps over the lookback."""

    period: float  # seconds
    periodicity: float  # share of step spacings within 25 % of a multiple of the period (0..1)
    compute: float  # median compute gap, seconds
    wait: float  # median longest in-step silence, seconds
    step_bytes: float  # median bytes sent per step
    steps: int  # steps found
    starts: np.ndarray  # step entries (the sends that ended the compute gaps), time order
    nbytes: np.ndarray  # bytes sent in each step (NaN for the last, still open)
    #: share of the time analysed spent in the steps' compute gaps (their sum over the time):
    #: the whole of a node's lateness, where the median compute gap sees only the typical step
    compute_share: float = float("nan")
    #: share of the time analysed in silences a peer ended (by_send 0): time spent waiting
    waited_share: float = float("nan")


def split_long(length: np.ndarray, min_ratio: float = SEPARATION) -> float:
    """The length that splits a node's send-ended silences into pauses (pacing inside a
    collective: socket buffers draining, a shaper's tokens) and compute gaps (one per step):
    Otsu's threshold on their logarithms (the split that maximises the between-class variance).
    NaN when the two classes' geometric means are less than ``min_ratio`` apart: nothing
    separates steps from pauses."""
    x = np.log(np.maximum(np.asarray(length, np.float64), 1e-6))
    if len(x) < 4:
        return float("nan")
    xs = np.sort(x)
    n = len(xs)
    cs = np.cumsum(xs)
    k = np.arange(1, n)  # the low class holds xs[:k]
    m_lo = cs[:-1] / k
    m_hi = (cs[-1] - cs[:-1]) / (n - k)
    between = k * (n - k) * (m_hi - m_lo) ** 2
    i = int(np.argmax(between))
    if m_hi[i] - m_lo[i] < np.log(min_ratio):
        return float("nan")
    return float(np.exp(0.5 * (xs[i] + xs[i + 1])))


def fold_period(d: np.ndarray, tol: float = 0.15, max_mult: int = 4) -> float:
    """The step period behind spacings ``d`` of step entries. Entries missed (a rank that
    entered within ``react`` of a peer's notification) leave spacings of 2, 3.. periods; an
    extra entry (a wait misread as a compute gap) splits one. Of the candidate periods (the
    spacings themselves), the one under which the spacings are most nearly single steps: each
    spacing within ``tol`` of a multiple m <= ``max_mult`` of it scores 1/m (a half of the
    period explains every spacing too, but as doubles); then the median of the explained
    spacings, each folded onto its multiple."""
    d = np.asarray(d, np.float64)
    d = d[d > 0]
    if not len(d):
        return float("nan")
    # candidates on a 2 % grid (the tolerance is 15 %): a few dozen, not one per spacing
    cand = np.exp(np.unique(np.round(np.log(d) / 0.02)) * 0.02)
    r = d[None, :] / cand[:, None]  # candidates x spacings
    m = np.clip(np.rint(r), 1, None)
    ok = (np.abs(r / m - 1.0) <= tol) & (m <= max_mult)
    score = np.where(ok, 1.0 / m, 0.0).sum(axis=1)
    i = int(np.flatnonzero(score >= score.max() - 1e-9)[-1])  # ties: the longest
    return float(np.median(d[ok[i]] / m[i, ok[i]]))


def analyse(end: np.ndarray, length: np.ndarray, by_send: np.ndarray, sent: np.ndarray,
            t0: float, t1: float) -> StepStats | None:
    """Steps of one node from its silences ending in [t0, t1] (time order); None when there is
    no stepped collective traffic to speak of."""
    cand = np.flatnonzero(by_send > 0)
    if len(cand) < MIN_STEPS:
        return None
    # no two classes (a transport that does not pause inside its collectives, RoCE), or a long
    # "class" of a few outliers rather than one per step: every send-ended silence is a
    # candidate entry
    theta = split_long(length[cand])
    long_ = cand[length[cand] >= theta] if theta == theta else cand
    if len(long_) < MIN_LONG_SHARE * len(cand):
        long_ = cand
    elif theta == theta and length[cand][length[cand] < theta].sum() > MAX_PAUSE_SHARE * (t1 - t0):
        # the short class fills most of the time: not pauses inside a collective but compute
        # gaps of shorter steps (a pipeline hand-off has no pauses; its decode steps are short,
        # its prefill steps long) - every send-ended silence is a candidate entry
        long_ = cand
    if len(long_) < MIN_STEPS:
        return None
    period = float(np.median(np.diff(end[long_])))
    # at most one entry per half period, the longest silence first (a step whose compute gap
    # was cut by a stray packet leaves two candidates close together)
    order = long_[np.argsort(-length[long_], kind="stable")]
    taken: list[int] = []
    times: list[float] = []
    half = 0.5 * period
    for i in order.tolist():
        e = float(end[i])
        j = int(np.searchsorted(times, e))
        if (j > 0 and e - times[j - 1] < half) or (j < len(times) and times[j] - e < half):
            continue
        times.insert(j, e)
        taken.insert(j, i)
    if len(taken) < MIN_STEPS:
        return None
    ti = np.asarray(taken, np.int64)
    starts = end[ti]
    d = np.diff(starts)
    # a step whose entry was not recognised (it came within the reaction window of a peer's
    # message) leaves a spacing of two or more periods: fold every spacing onto its multiple of
    # the period, the period being the longest spacing that explains (nearly) as many spacings
    # as any does - its halves explain them too, its doubles only every other one
    period = fold_period(d)
    mult = np.maximum(np.rint(d / period), 1.0)
    regular = float(np.mean(np.abs(d / mult - period) <= 0.25 * period))
    # per step k (entry ti[k] .. entry ti[k+1]): the longest silence strictly between the entry
    # and the start of the next compute gap, and the bytes sent from the entry to the next one.
    # Waits only of single steps: where an entry was missed the span holds the missed step's
    # compute gap too, which would read as a long wait
    waits = np.full(len(ti) - 1, np.nan)
    cs = np.cumsum(sent)
    nbytes = np.full(len(ti), np.nan)
    for k in range(len(ti) - 1):
        a, b = ti[k], ti[k + 1]
        inner = length[a + 1: b]
        if mult[k] == 1.0:
            waits[k] = float(inner.max()) if len(inner) else 0.0
        nbytes[k] = float(cs[b] - cs[a])  # sent[i] is what preceded silence i: entries a+1..b
    single = waits[~np.isnan(waits)]
    # shares of the time the silences cover (from the first one's start, within [t0, t1]): sums,
    # not medians. A rank held up in only some steps - a CPU quota spent until the next CFS
    # period, a GC pause, a page-fault storm - leaves the median step untouched, but every
    # millisecond it computed longer is one its peers waited (lock step), and the sum counts it.
    # Extra entries (a stall inside a collective read as a compute gap) still count as the
    # node's own time: the others waited for that too
    span = t1 - max(t0, float(end[0] - length[0]))
    compute_share = float(length[ti].sum() / span) if span > 0 else float("nan")
    waited_share = float(length[by_send == 0].sum() / span) if span > 0 else float("nan")
    return StepStats(period=period, periodicity=regular, compute=float(np.median(length[ti])),
                     wait=float(np.median(single)) if len(single) else float("nan"),
                     step_bytes=float(np.median(nbytes[:-1])),
                     steps=len(ti), starts=starts, nbytes=nbytes,
                     compute_share=compute_share, waited_share=waited_share)


def node_steps(store: WindowStore, node: str, t: float, lookback: float = LOOKBACK) -> StepStats | None:
    """:func:`analyse` over the silences of ``node``'s collective port listed in
    ``(t - lookback, t]``. The collective port is the one whose listed silences followed the
    most bytes sent (a multi-rail node's RDMA ports carry the same collectives at the same times:
    one of them gives every step)."""
    blk = store.blocks.get(SILENCE, {}).get(node)
    if blk is None or not blk.n:
        return None
    tt, L = blk.window(t - lookback, t)
    if len(tt) < 4:
        return None
    Bs = _aligned(store, BY_SEND, node, blk, tt)
    Sb = _aligned(store, SENT, node, blk, tt)
    has = ~np.isnan(L)
    score = np.where(has, np.nan_to_num(Sb), 0.0).sum(axis=1) + has.sum(axis=1) * 1e-9
    r = int(np.argmax(score))
    sel = has[r]
    return analyse(tt[sel], L[r, sel], np.nan_to_num(Bs[r, sel]), np.nan_to_num(Sb[r, sel]), t - lookback, t)


def _aligned(store: WindowStore, name: str, node: str, ref, tt: np.ndarray) -> np.ndarray:
    """Values of ``name`` at the times ``tt`` of the reference block's window, row by the
    reference block's entities (NaN where missing): the collector sends them together."""
    out = np.full((len(ref.rows), len(tt)), np.nan)
    blk = store.blocks.get(name, {}).get(node)
    if blk is None or not len(tt):
        return out
    bt, V = blk.window(float(tt[0]) - 1e-9, float(tt[-1]))
    if not len(bt):
        return out
    k = np.minimum(np.searchsorted(bt, tt), len(bt) - 1)
    ok = bt[k] == tt
    for ent, r in ref.rows.items():
        rb = blk.rows.get(ent)
        if rb is not None:
            out[r, ok] = V[rb, k[ok]]
    return out


#: what a node summary reports of its collective steps (node scope, catalogued with the summaries)
SUMMARY_SIGNALS: dict[str, tuple[str, str]] = {
    "summary_collective_period_seconds": (
        "seconds", "step period of the node's collective traffic (median spacing of its step entries, "
        f"over the last {LOOKBACK:g} s)"),
    "summary_collective_compute_seconds": (
        "seconds", "median compute gap per step: from the node's last collective packet of a step to its "
        "own first send of the next (the time it computed, on its own clock; EW-1)"),
    "summary_collective_wait_seconds": (
        "seconds", "median longest silence inside the node's collectives: time spent waiting for a peer "
        "(a straggler's peers wait, the straggler does not; EW-1)"),
    "summary_collective_compute_share_ratio": (
        "ratio", f"share of the last {LOOKBACK:g} s the node spent in its steps' compute gaps (their sum over "
        "the time): a rank late in only some steps (a CPU quota, GC or page-fault pauses) raises it by what "
        "its lateness costs the group, where the median compute gap does not move (EW-1)"),
    "summary_collective_waited_share_ratio": (
        "ratio", f"share of the last {LOOKBACK:g} s in silences of the node's collective traffic that a peer "
        "ended (its data arrived, or the node answered a peer's message at once): time spent waiting for "
        "the others (EW-1)"),
    "summary_collective_step_bytes": ("bytes", "median payload bytes the node sent per collective step"),
    "summary_collective_steps": ("steps", f"collective steps found in the last {LOOKBACK:g} s"),
    "summary_collective_regularity_ratio": (
        "ratio", "share of step spacings within 25 % of a multiple of the period: 1 for lock-step "
        "collectives, low for traffic without a step structure"),
}


def summary_values(s: StepStats) -> dict[str, float]:
    """The summary signals of :data:`SUMMARY_SIGNALS` for one analysis."""
    vals = {"summary_collective_period_seconds": s.period, "summary_collective_compute_seconds": s.compute,
            "summary_collective_wait_seconds": s.wait, "summary_collective_step_bytes": s.step_bytes,
            "summary_collective_steps": float(s.steps), "summary_collective_regularity_ratio": s.periodicity,
            "summary_collective_compute_share_ratio": s.compute_share,
            "summary_collective_waited_share_ratio": s.waited_share}
    return {k: v for k, v in vals.items() if v == v}


def settled_steps(s: StepStats, t: float, interval: float) -> tuple[np.ndarray, np.ndarray]:
    """(starts, bytes) of the steps a summary at ``t`` reports for cross-node alignment: those
    entered in ``(t - interval - settle, t - settle]``. An entry near the end of the lookback can
    still give way to a longer silence within half a period after it, so steps are reported once
    they are ``settle`` old: two periods, at least a second (then consecutive summaries tile time
    and each step is reported once), at most half the lookback."""
    settle = min(max(1.0, 2.0 * s.period), LOOKBACK / 2)
    sel = (s.starts > t - interval - settle) & (s.starts <= t - settle)
    return s.starts[sel], s.nbytes[sel]
