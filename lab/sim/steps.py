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
