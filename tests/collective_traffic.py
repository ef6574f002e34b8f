"""Lock-step collective traffic as one node's capture sees it, for pkt-collector and step tests.

Shaped after what the real-traffic lab records (gloo all_reduce over TCP in namespaces, see
collectors/pkt/collective.py): per step every rank enters when its compute is done and sends a
small notification to the peer it receives from and a first chunk of data; it hears nothing more
until the latest rank has joined; then data flows both ways until the group finishes together.
Peers' notifications reach a rank when they enter, whether it is computing or not. Around it
the port carries what production ports carry: pure ACKs of the data, a token stream to a client
and the agent's NATS connection. All timing is invented from those observations (NOTE: not a
recording); the real recording is in tests/fixtures/pkt/reallab-gloo/.
"""
from __future__ import annotations

import numpy as np

from skewd.collectors.pkt.features import NS
from skewd.collectors.pkt.frames import DIR_IN, DIR_OUT
from skewd.collectors.pkt.parse import Packets
from tests.pkt_packets import udp_packets

T0 = 1_700_000_000  # synthetic epoch start (invented)


def entries(rng: np.random.Generator, nodes: int, steps: int, compute: float = 0.045,
            lag: dict[int, float | np.ndarray] | None = None,
            active: float = 0.012, jitter: float = 0.002, start: float = 0.5) -> tuple[np.ndarray, np.ndarray]:
    """Step entries (s, shape (steps, nodes)) and the group's finish time per step, for ranks that
    compute ``compute`` seconds (+ ``lag[node]``: seconds, or one value per step for a rank late
    in bursts, + exponential jitter) after the previous step finished, then all-reduce for
    ``active`` seconds once the latest has joined."""
    lag = {n: np.broadcast_to(np.asarray(v, float), (steps,)) for n, v in (lag or {}).items()}
    e = np.zeros((steps, nodes))
    fin = np.zeros(steps)
    t = T0 + start
    for k in range(steps):
        for n in range(nodes):
            e[k, n] = t + compute + (lag[n][k] if n in lag else 0.0) + rng.exponential(jitter)
        fin[k] = e[k].max() + active
        t = fin[k]
    return e, fin


def node_packets(rng: np.random.Generator, e: np.ndarray, fin: np.ndarray, node: int, *,
                 extra: bool = True, chunk: int = 65160) -> Packets:
    """One node's capture (UDP columns; direction known) of the traffic ``entries`` describes.
    ``extra``: add pure ACKs, a token stream and a NATS connection on the same port."""
    ts, pay, dire, peer = [], [], [], []
    nodes = e.shape[1]
    right, left = (node + 1) % nodes, (node - 1) % nodes  # sends data to right, receives from left

    def add(t, p, d, q):
        ts.append(np.atleast_1d(np.asarray(t, float)))
        n = len(ts[-1])
        pay.append(np.full(n, p))
        dire.append(np.full(n, d))
        peer.append(np.full(n, q))

    for k in range(e.shape[0]):
        me = e[k, node]
        latest = e[k].max()
        add(me, 48, DIR_OUT, left)  # "ready to receive" to the peer it receives from
        add(me + 0.0001 + np.arange(2) * 0.0002, chunk, DIR_OUT, right)  # its first chunk
        for q in range(nodes):  # peers' notifications whenever they enter
            if q != node:
                add(e[k, q] + 0.00005, 48, DIR_IN, q)
        # data both ways from the latest entry to the finish, every 0.3 ms: what arrives is
        # forwarded (a waiting rank hears its peer's data first, then sends)
        t = np.arange(latest + 0.0003, fin[k] - 0.0001, 0.0003)
        add(t, chunk, DIR_IN, left)
        add(t + 0.00012, chunk, DIR_OUT, right)
        if extra:
            add(t[::2] + 0.0001, 0, DIR_IN, right)  # pure ACKs of what it sent
            add(t[::2] + 0.0002, 0, DIR_OUT, left)  # and of what it received
    if extra:
        span = (e[0, node] - 1.0, fin[-1] + 0.5)
        tok = np.arange(span[0], span[1], 0.03)
        tok = tok + rng.uniform(0, 0.003, len(tok))
        add(tok, 520, DIR_OUT, 90)  # SSE token lines to a client
        add(tok + 0.004, 0, DIR_IN, 90)
        nats = np.arange(span[0], span[1], 1.0)
        add(nats, 900, DIR_OUT, 91)  # the agent's summary publishes
        add(nats + 0.0005, 60, DIR_IN, 91)
    T = np.concatenate(ts)
    P = np.concatenate(pay)
    D = np.concatenate(dire)
    Q = np.concatenate(peer)
    o = np.argsort(T, kind="stable")
    T, P, D, Q = T[o], P[o], D[o], Q[o]
    ns = np.round(T * NS).astype(np.int64)
    # a connection per peer pair: this node's address 1, the peer's 10 + peer; ports by peer
    out = D == DIR_OUT
    me_addr, q_addr = 1, 10 + Q
    p = udp_packets(ns, P + 66, dst=np.where(out, q_addr, me_addr), sport=np.where(out, 40000 + Q, 50000 + Q),
                    dport=np.where(out, 50000 + Q, 40000 + Q), direction=D, payload=P)
    p.src_lo[:] = np.where(out, me_addr, q_addr)
    return p


def collect(pk: Packets, every: float = 1.0, phase: float = 0.3):
    """Feed a node's packets to a FlowTracker one collection per ``every`` seconds; yields
    (collection time, IntervalFeatures)."""
    from skewd.collectors.pkt.features import FlowTracker

    tr = FlowTracker(0.001)
    lo = pk.ts_ns.min() / NS
    hi = pk.ts_ns.max() / NS
    prev = np.floor(lo) - 1 + phase
    t = prev + every
    while prev <= hi + every:
        sel = np.flatnonzero((pk.ts_ns > prev * NS) & (pk.ts_ns <= t * NS))
        yield t, tr.update(pk.take(sel), prev, t, ["eth0"])
        prev, t = t, t + every
