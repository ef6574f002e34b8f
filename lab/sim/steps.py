"""What the pkt collector lists of a node's collective steps: the silences of its collective
traffic (``collectors/pkt/collective.py``), generated from the simulator's step timeline.

Per step and TP member the simulator knows when the member joined the collective (``entry``:
the step start plus its lateness), when the last member joined (``latest``) and when the
group's all-reduces ended (``end``: together, once the last member's data went round). A real
rank, measured in the real-traffic lab (gloo all_reduce over TCP, ``lab/netlab``), shows:

- a **compute silence** before its entry, from its last collective packet of the previous step,
  ended by its own send;
- a **wait** when it joined before the latest member: it sends its first chunk, then hears
  nothing until the latest member's data arrives - a silence ended by received data;
- **pauses** inside the collective: per step a few silences of a millisecond or two (socket
  buffers draining, the runtime's poll loop), most ended by data. Real lab (the recordings in
  tests/fixtures/pkt/reallab-gloo): 4 ranks, 3.2-3.5 pauses under 5 ms per step besides the
  waits, a pair 1.1-1.2 - about 0.57 per chunk exchange of the ring (2 (k - 1) of them) - median
  2.0 ms, 90th percentile ~3.9 ms, 30 % ended by a send (a pair: 41 %). RoCE collectives (NCCL's proxy, 400G)
  pause for microseconds: a tenth of a millisecond-scale pause per step.

Bytes a node sends in a step are spread over its active stretches in proportion to their
length; what it sends after its last pause goes with the next step's compute silence, as the
collector counts it (bytes sent before each silence).
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

#: the pkt collector's min_silence (its burst_gap default)
MIN_SILENCE = 0.001
#: pauses inside a collective, by transport (see the module docstring): per chunk exchange of a
#: ring all-reduce for TCP, per step for RoCE
PAUSES_PER_EXCHANGE = {"tcp": 0.57}
PAUSES_PER_STEP = {"roce": 0.1}
PAUSE_MEDIAN = 0.002
PAUSE_SIGMA = 0.45  # lognormal: q90 / median = exp(1.28 sigma) = 1.8 (real lab: ~3.9 / 2.0 ms)
PAUSE_BY_SEND = 0.30
PAUSE_BY_SEND_PAIR = 0.41
#: the first chunk a member sends on entry before it waits (a ring step: its own shard)
FIRST_CHUNK = 0.0005
#: one hop: the latest member's data reaches a waiting peer
HOP = 0.0002


@dataclass
class StepSilences:
    """Silences of one node, time order: end, length (s), ended by a send, bytes sent before."""

    end: np.ndarray
    length: np.ndarray
    by_send: np.ndarray
    sent: np.ndarray


def step_silences(rng: np.random.Generator, prev_last: float, entry: np.ndarray, latest: np.ndarray,
                  end: np.ndarray, nbytes: np.ndarray, transport: str = "roce",
                  members: int = 2) -> tuple[StepSilences, float]:
    """Silences of one member of a ``members``-rank group over consecutive steps, and its last
    collective packet (the ``prev_last`` of the next call). ``prev_last`` is NaN before the
    first step."""
    out_e, out_l, out_k, out_b = [], [], [], []
    if transport in PAUSES_PER_EXCHANGE:
        lam = PAUSES_PER_EXCHANGE[transport] * 2 * max(1, members - 1)
    else:
        lam = PAUSES_PER_STEP.get(transport, PAUSES_PER_STEP["roce"])
    carry = 0.0  # bytes sent after the previous step's last pause
    last = prev_last
    for k in range(len(entry)):
        e, j, fin, B = float(entry[k]), float(latest[k]), float(end[k]), float(nbytes[k])
        if fin <= e:
            continue
        if last == last and e - last >= MIN_SILENCE:
            out_e.append(e), out_l.append(e - last), out_k.append(1), out_b.append(carry)
            carry = 0.0
        # the stretches of this step: [entry, entry + chunk] then (after a wait) to the end
        segs: list[tuple[float, float]] = []
        resume = e
        if j + HOP - (e + FIRST_CHUNK) >= MIN_SILENCE:
            segs.append((e, e + FIRST_CHUNK))
            resume = j + HOP
        span = fin - resume
        n = int(rng.poisson(lam)) if span > 4 * MIN_SILENCE else 0
        pauses = np.maximum(rng.lognormal(np.log(PAUSE_MEDIAN), PAUSE_SIGMA, n), MIN_SILENCE) if n else np.zeros(0)
        if n and pauses.sum() > 0.5 * span:
            pauses = pauses[np.cumsum(pauses) <= 0.5 * span]
            n = len(pauses)
        busy = span - float(pauses.sum())
        cuts = np.sort(rng.uniform(0.0, busy, n)) if n else np.zeros(0)
        t = resume
        prev_cut = 0.0
        for c, p in zip(cuts.tolist(), pauses.tolist()):
            segs.append((t, t + (c - prev_cut)))
            t += c - prev_cut + p
            prev_cut = c
        segs.append((t, fin))
        total = sum(b - a for a, b in segs) or 1.0
        # silences between consecutive stretches; each carries the bytes of the stretch before it
        for i in range(1, len(segs)):
            gap = segs[i][0] - segs[i - 1][1]
            if gap < MIN_SILENCE:
                continue
            waited = i == 1 and resume > e
            by_send = 0 if waited else int(rng.random() < (PAUSE_BY_SEND_PAIR if members == 2 else PAUSE_BY_SEND))
            share = B * (segs[i - 1][1] - segs[i - 1][0]) / total
            out_e.append(segs[i][0]), out_l.append(gap), out_k.append(by_send), out_b.append(carry + share)
            carry = 0.0
        carry += B * (segs[-1][1] - segs[-1][0]) / total
        last = fin
    sil = StepSilences(np.asarray(out_e, float), np.asarray(out_l, float), np.asarray(out_k, np.int8),
                       np.asarray(out_b, float))
    return sil, last


# -- pipeline hand-offs ------------------------------------------------------------------------
#
# A pipeline stage hands its activations to the next one with a point-to-point send (NCCL
# send/recv in vLLM's PP group). The transfer is receiver-driven: NCCL's network transport moves
# data only into buffers the receiving side posted, and it posts them (a small clear-to-send
# write into the sender's FIFO) when the receiving rank calls recv - in vLLM at the start of its
# next forward, after the last stage synchronised on its sampled tokens. So:
#
# - the **receiver** sends a clear-to-send when it is ready for the next input - on its own,
#   after computing - and then hears nothing until the activations arrive: a stage that waits
#   for a slower upstream stage shows its compute gap (its data in to its next clear-to-send)
#   and a wait ended by received data;
# - the **sender** sends its activations once it has them *and* the receiver has asked: a
#   sender faster than its receiver sends right after the receiver's clear-to-send (a
#   reaction: its compute end is invisible on the wire, it only ever answers), a slower one
#   sends on its own, its compute gap reaching from its previous hand-off to this one.
#
# The pipeline is a cycle: the last stage's sampled tokens go back every step. The engine core
# gets the step's output over the executor's channel, and with vLLM's V2 model runner (the
# default; vllm 0.33 vllm/v1/worker/gpu/pp_utils.py, PPHandler) the last stage also broadcasts
# the sampled ids to every earlier stage - int64 [requests, 1] plus int32 [2, requests], 16 B per
# request - on a dedicated NCCL communicator "so it does not serialize on the wire with the
# inter-stage hidden-state p2p send/recv ops": other queue pairs, another connection. An earlier
# stage's receive runs after its own forward (the broadcast stream waits for the main stream) and
# is consumed pp_size steps later, so a first stage that waits for a slower last stage could show
# its compute gap and a wait ended by data on that connection (if its clear-to-send leaves when
# the GPU reaches the receive, not when the host enqueues it: NCCL proxy timing, not measured
# here). The pkt collector never counts it: a connection is collective at 10 % of
# the port's heaviest (collectors/pkt/collective.py ``share``), and 16 B per request is under
# 1 % of a TP rank's activation slice (hidden x 2 B / tp: 2 kB per request at hidden 8192, TP8).
# So it is not among the stage connections here (the simulator's flow tables carry its bytes,
# lab/sim/simulator.py). The clear-to-send is a small RDMA write (payload bytes > 0, not a RoCE
# ACK), a send for the collector.

#: bytes of a clear-to-send (an NCCL FIFO entry: addresses, size, tag). NOTE: order of magnitude,
#: not measured
CTS_BYTES = 64.0
#: the sender's proxy thread acts on a clear-to-send within tens of microseconds (it polls)
PROXY_REACT = 3e-5
#: the collector's reaction window (collectors/pkt/collective.py ``react``) and data floor
REACT = 0.002
MIN_DATA = 256
#: per-step jitter of a stage's compute end (kernel timing, host launch): NOTE simulator
#: choice, a few hundred microseconds on a 20-60 ms decode step
STAGE_JITTER = 2e-4

EV_SEND, EV_DATA, EV_MSG = 0, 1, 2  # an own send, received data, a received control message


@dataclass
class Events:
    """One node's packets on its stage connections, as stretches: start, end, kind, bytes."""

    start: np.ndarray
    end: np.ndarray
    kind: np.ndarray
    nbytes: np.ndarray


def handoff_events(f_send: np.ndarray, ready: np.ndarray, nbytes: np.ndarray,
                   link_rate: float) -> tuple[Events, Events]:
    """Packets of one hand-off per step between a sending stage that has its activations at
    ``f_send`` and a receiving stage ready for them at ``ready`` (both on true time): (the
    sender's events, the receiver's)."""
    arrive = ready + HOP
    send = np.maximum(f_send, arrive + PROXY_REACT)
    dur = nbytes / link_rate
    k = len(send)
    snd = Events(np.r_[arrive, send], np.r_[arrive, send + dur],
                 np.r_[np.full(k, EV_MSG), np.full(k, EV_SEND)], np.r_[np.full(k, CTS_BYTES), nbytes])
    rcv = Events(np.r_[ready, send + HOP], np.r_[ready, send + HOP + dur],
                 np.r_[np.full(k, EV_SEND), np.full(k, EV_DATA)], np.r_[np.full(k, CTS_BYTES), nbytes])
    return snd, rcv


@dataclass
class SilenceState:
    """What the collector carries across intervals for one node's stage connections."""

    last_evt: float = float("nan")  # end of the latest send or data stretch
    last_in: float = float("nan")  # latest received message of any size
    acc: float = 0.0  # bytes sent since the latest listed silence


def event_silences(ev: Events, state: SilenceState) -> StepSilences:
    """The silences collectors/pkt/collective.py lists for a node whose stage-connection packets
    are ``ev`` (any order): gaps of at least MIN_SILENCE between sends and data stretches, ended
    by a send unless a peer's message (of any size) came during the silence within ``REACT``
    before it. Updates ``state``."""
    o = np.lexsort((ev.kind, ev.start))
    s, e, kd, b = ev.start[o], ev.end[o], ev.kind[o], ev.nbytes[o]
    out_e, out_l, out_k, out_b = [], [], [], []
    last, last_in, acc = state.last_evt, state.last_in, state.acc
    for si, ei, ki, bi in zip(s.tolist(), e.tolist(), kd.tolist(), b.tolist()):
        if ki == EV_MSG or (ki == EV_DATA and bi < MIN_DATA):
            last_in = si if last_in != last_in else max(last_in, si)
            continue
        if last == last and si - last >= MIN_SILENCE:
            reacted = ki == EV_SEND and last_in == last_in and si - REACT <= last_in < si and last_in > last
            out_e.append(si), out_l.append(si - last), out_k.append(int(ki == EV_SEND and not reacted))
            out_b.append(acc)
            acc = 0.0
        if ki == EV_SEND:
            acc += bi
        else:
            last_in = ei if last_in != last_in else max(last_in, ei)
        last = ei if last != last else max(last, ei)
    state.last_evt, state.last_in, state.acc = last, last_in, acc
    return StepSilences(np.asarray(out_e, float), np.asarray(out_l, float), np.asarray(out_k, np.int8),
                        np.asarray(out_b, float))
