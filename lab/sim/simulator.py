"""The fault-lab simulator: a seeded cluster run, interval by interval.

Per collection interval (1 s, the collectors' default) it:

1. asks the active fault injectors how they change each replica's engine (rate, step time, stall);
2. advances every replica's engine (:mod:`.workload`) and gets its step timeline;
3. turns the timelines into RDMA traffic: one collective burst per decode step per TP group on
   every member node (all-reduce), stage hand-offs between pipeline stages, KV-cache transfers
   from prefill to decode nodes; injectors may delay, resize, drop or slow bursts;
4. derives each node's physical state (:mod:`.node`), lets injectors change it, and measures it
   the way the collectors do.

Same scenario + same seed → identical batches: every random draw comes from generators seeded
from (seed, purpose), and nothing reads the clock.
"""
from __future__ import annotations

import zlib
from pathlib import Path
from typing import Iterator

import numpy as np

from skewd.model import SampleBatch

from .faults import make_injectors
from .node import NodeSim
from .scenario import SCENARIO_DIR, Scenario, build_from, load_scenario
from .steps import STAGE_JITTER, Events, SilenceState, StepSilences, event_silences, handoff_events, step_silences
from .topology import Cluster
from .traffic import NodeTraffic, RepTraffic
from .truth import GroundTruth
from .workload import EngineSim, Effects, LoadSpec, TickOut

INTERVAL = 1.0  # collection interval of every simulated collector (their default)


class Simulation:
    """Iterate to get ``(t, node, SampleBatch)`` in time order; ``truth`` holds the faults."""

    def __init__(self, scenario: Scenario, seed: int = 0, only: set[str] | None = None) -> None:
        self.scenario = scenario
        self.seed = int(seed)
        self.only = frozenset(only) if only is not None else None
        self.cluster: Cluster = build_from(scenario.cluster, scenario.name)
        c = self.cluster
        self.start = float(scenario.start)
        self.end = self.start + scenario.duration
        L = scenario.load
        self.load = LoadSpec(rate=L["rate"], variation=L["variation"], prompt_median=L["prompt_tokens"]["median"],
                             prompt_sigma=L["prompt_tokens"]["sigma"], prompt_max=int(L["prompt_tokens"]["max"]),
                             output_median=L["output_tokens"]["median"], output_sigma=L["output_tokens"]["sigma"],
                             output_max=int(L["output_tokens"]["max"]), prefix_hit=L["prefix_hit"],
                             connections=int(L["connections"]))
        self.engines: list[EngineSim] = []
        for r in c.replicas:
            load = self.load
            if r.role == "decode":  # requests reach decode engines from the prefill side
                load = LoadSpec(**{**load.__dict__, "rate": 0.0})
            elif r.role == "prefill":
                load = LoadSpec(**{**load.__dict__, "rate": load.rate * 2, "output_median": 1.0, "output_sigma": 0.0,
                                   "output_max": 1})
            self.engines.append(EngineSim(r, c, load, self._rng("engine", r.id)))
        self.nodes = [NodeSim(c, n, self._rng("node", n.index), self.start, self._rng("qdisc", n.index))
                      for n in c.nodes]
        # each node's clock: an offset from true time (bursts are timestamped with it) and the
        # error bound its time daemon reports (what a summary's clock_sync.max_error_s carries)
        crng = self._rng("clock", 0)
        if c.clock == "ptp":
            self.clock_offset = {n.name: float(crng.normal(0, 2e-6)) for n in c.nodes}
            self.clock_error = {n.name: float(crng.uniform(5e-6, 2e-5)) for n in c.nodes}
        elif c.clock == "ntp":
            self.clock_offset = {n.name: float(crng.normal(0, 4e-4)) for n in c.nodes}
            self.clock_error = {n.name: float(crng.uniform(1e-3, 4e-3)) for n in c.nodes}
        else:
            # no time daemon: the kernel reports the clock unsynchronised and keeps no bound
            # (adjtimex STA_UNSYNC, as on the real-traffic lab's VM: maxerror 16 s). Without
            # discipline a clock set once at boot drifts by tens of ppm: tens of ms to seconds
            # between hosts after days; offsets here are drawn from +-2 s.
            self.clock_offset = {n.name: float(crng.uniform(-2.0, 2.0)) for n in c.nodes}
            self.clock_error = {n.name: None for n in c.nodes}
        for ns in self.nodes:  # its packet capture timestamps with the node's clock
            ns.clock_offset = self.clock_offset[ns.n.name]
        self.injectors = make_injectors(scenario, c, self._rng("faults", 0), self.start)
        for inj in self.injectors:
            inj.sim = self  # injectors that react to the cluster's state read it through this
        self.truth: list[GroundTruth] = [inj.truth for inj in self.injectors]
        self.traffic_rng = self._rng("traffic", 0)
        self.silence_rng = self._rng("silences", 0)  # its own stream: every other draw stays as it was
        self.bursts: dict[str, list[tuple[float, float]]] = {n.name: [] for n in c.nodes}
        #: per node index: the silences of its collective traffic not yet listed by its capture,
        #: and its last collective packet so far (lab/sim/steps.py)
        self.silences: dict[int, list[StepSilences]] = {n.index: [] for n in c.nodes}
        self._coll_last: dict[int, float] = {n.index: float("nan") for n in c.nodes}
        #: per node index: the collector's carried state on its pipeline-stage connections
        self._stage_state: dict[int, SilenceState] = {n.index: SilenceState() for n in c.nodes}
        self.stage_rng = self._rng("stage-handoffs", 0)  # its own stream, as silence_rng
        self.handoff: list[tuple[int, float, float, float]] = []  # (decode replica, t, prompt, out)
        self._rr = 0
        self.t = self.start

    def _rng(self, purpose: str, k: int) -> np.random.Generator:
        return np.random.default_rng([self.seed, zlib.crc32(f"{self.scenario.name}/{purpose}".encode()), k])

    # -- public ---------------------------------------------------------------------------------
    @property
    def node_names(self) -> list[str]:
        return self.cluster.node_names

    def node_labels(self) -> dict[str, dict[str, str]]:
        return {n.name: dict(n.labels) for n in self.cluster.nodes}

    def __iter__(self) -> Iterator[tuple[float, str, SampleBatch]]:
        return self.run()

    def run(self) -> Iterator[tuple[float, str, SampleBatch]]:
        while self.t + INTERVAL <= self.end + 1e-9:
            for item in self.step():
                yield item

    def collective_bursts(self, node: str, t0: float, t1: float) -> list[tuple[float, float]]:
        """(start, bytes) of the node's collective bursts that started in ``(t0, t1]`` - what a
        pkt collector reporting every burst would put in the node's summary (start times on the
        node's own clock)."""
        return [b for b in self.bursts.get(node, []) if t0 < b[0] <= t1]

    def prune_bursts(self, before: float) -> None:
        for k, v in self.bursts.items():
            self.bursts[k] = [b for b in v if b[0] >= before]

    def _take_silences(self, nd: int, t1: float) -> StepSilences | None:
        """The node's collective silences that ended by ``t1`` (the rest wait for the next
        interval, as a capture lists a silence only once a packet ends it)."""
        parts = self.silences[nd]
        if not parts:
            return None
        cat = StepSilences(*(np.concatenate([getattr(p, f) for p in parts]) for f in ("end", "length", "by_send", "sent")))
        now = cat.end <= t1
        rest = ~now
        self.silences[nd] = [StepSilences(cat.end[rest], cat.length[rest], cat.by_send[rest], cat.sent[rest])] \
            if rest.any() else []
        if not now.any():
            return None
        o = np.argsort(cat.end[now], kind="stable")
        return StepSilences(cat.end[now][o], cat.length[now][o], cat.by_send[now][o], cat.sent[now][o])

    # -- one interval ---------------------------------------------------------------------------
    def step(self) -> list[tuple[float, str, SampleBatch]]:
        """Advance one collection interval: every collector's batch of every node, as
        ``(collection time, node, batch)``, in node order."""
        c = self.cluster
        t0, t1 = self.t, self.t + INTERVAL
        self.t = t1
        active = [inj for inj in self.injectors if inj.active(t0)]
        effs = {r.id: Effects() for r in c.replicas}
        for inj in active:
            inj.on_engine(t0, t1, effs)
        outs: dict[int, TickOut] = {}
        for r, eng in zip(c.replicas, self.engines):
            if r.role == "decode":
                mine = [h for h in self.handoff if h[0] == r.id and h[1] < t1]
                self.handoff = [h for h in self.handoff if not (h[0] == r.id and h[1] < t1)]
                if mine:
                    arr = np.array([h[1] for h in mine])
                    eng.wait.push(arr=arr, prompt=np.array([h[2] for h in mine]), out=np.array([h[3] for h in mine]),
                                  gen=np.zeros(len(mine)), conn=eng._assign_conns(len(mine), effs[r.id]),
                                  hit=np.full(len(mine), 0.98))
            outs[r.id] = eng.tick(t0, t1, effs[r.id])
        rep_tr = {r.id: RepTraffic() for r in c.replicas}
        node_tr = {n.index: NodeTraffic() for n in c.nodes}
        for inj in active:
            inj.on_traffic(t0, t1, rep_tr, node_tr)
        roce: dict[int, dict[int, tuple[np.ndarray, np.ndarray, np.ndarray]]] = {n.index: {} for n in c.nodes}
        bursts: dict[int, list[tuple[float, float]]] = {n.index: [] for n in c.nodes}
        for r in c.replicas:
            self._replica_traffic(r, outs[r.id], rep_tr[r.id], node_tr, roce, bursts, t0, t1)
        out = []
        for n, ns in zip(c.nodes, self.nodes):
            engines = {rid: (outs[rid], self.engines[rid]) for rid in n.replicas}
            self._apply_node_traffic(ns, node_tr[n.index], roce[n.index])
            st = ns.baseline(t0, t1, engines, roce[n.index], bursts[n.index])
            st.silences = self._take_silences(n.index, t1)
            self._port_marks(ns, node_tr[n.index], st)
            for inj in active:
                inj.on_node(t0, t1, n.index, st, self)
            off = self.clock_offset[n.name]
            self.bursts[n.name].extend((b0 + off, b1) for b0, b1 in st.bursts)
            out += [(float(b.t[0]), n.name, b) for b in ns.emit(st, self.only)]
        if int(t1) % 60 == 0:
            self.prune_bursts(t1 - 120)
        return out

    # -- RDMA traffic ---------------------------------------------------------------------------
    def _replica_traffic(self, r, out: TickOut, tr: RepTraffic, node_tr: dict[int, NodeTraffic],
                         roce: dict, bursts: dict, t0: float, t1: float) -> None:
        c = self.cluster
        rng = self.traffic_rng
        m = c.model
        st = out.steps
        ns = len(st.starts)
        P = max(1, len(c.nodes[0].rdma_ports))
        if ns and len(c.nodes[0].rdma_ports):
            # TP all-reduce across the nodes of each stage: one burst per step on every member
            for s, members in enumerate(r.stages):
                k = len(members)
                if k < 2:
                    continue
                # the step's all-reduces run from the first layer to the last; after them the
                # LM head, sampling and the scheduler leave the links idle for a few ms
                tail = rng.lognormal(np.log(0.002), 0.4, ns)
                base = st.starts + 0.0002
                span = np.maximum(st.durs - 0.0002 - tail, 0.0002)
                delays = {}
                for nd in members:
                    d = tr.delay.get(nd, 0.0) + np.abs(rng.normal(0, 2e-5, ns))
                    j = tr.delay_jitter.get(nd, 0.0)
                    if j:
                        d = d + rng.exponential(j, ns)
                    delays[nd] = d
                latest = np.max(np.stack(list(delays.values())), axis=0)
                tokens = np.maximum(st.batch, 1) + st.prefill  # prefill chunks all-reduce every token
                per_node = 2 * m.layers * tokens * m.hidden * 2 * (k - 1) / k / max(1, c.pp)
                # the group's all-reduces end together, once the last member has joined: the
                # step's duration already holds a straggler's wait (its injector lengthens the
                # step), so they end with the step's span - or later when a member joined later
                # still (jitter beyond the wait the step holds). They never run into the next
                # step: it needs their result.
                end = np.maximum(span, latest + 0.0002)
                for nd in members:
                    start = base + delays[nd]
                    dur = end - delays[nd]
                    B = per_node * tr.bytes_mult.get(nd, 1.0)
                    send = np.ones(ns, bool)
                    if tr.skip.get(nd, 0.0) > 0:
                        send = rng.random(ns) >= tr.skip[nd]
                    bursts[nd].extend(zip(start[send].tolist(), B[send].tolist()))
                    sil, self._coll_last[nd] = step_silences(
                        self.silence_rng, self._coll_last[nd], start[send], (base + latest)[send], (base + end)[send],
                        B[send], c.collective_transport, len(members))
                    self.silences[nd].append(sil)
                    peers = [q for q in members if q != nd]
                    share = 1.0 / (P * len(peers) * 2)
                    # every flow of this node carries the same share of each burst: one array set
                    t_out = (start[send], dur[send], B[send] * share)
                    t_in = (start[send] + 2e-6, dur[send], B[send] * share)
                    for p in range(P):
                        for q in peers:
                            for ch in range(2):
                                fi = self.nodes[nd].roce_flow(p, q, "tp", True, ch, c.nodes[q].rdma_ips[p])
                                roce[nd][fi] = t_out
                                fo = self.nodes[q].roce_flow(p, nd, "tp", False, ch, c.nodes[nd].rdma_ips[p])
                                roce[q][fo] = t_in
            # pipeline hand-off: activations from stage s to s+1 at the end of its compute
            if len(r.stages) > 1 and len(r.nodes) > 1:
                w = np.array([tr.stage_weight.get(s, 1.0) for s in range(len(r.stages))])
                frac = w / w.max()
                act = np.maximum(st.batch, 1) * m.hidden * 2.0
                self._stage_silences(r, st, frac, act, P)
                for s in range(len(r.stages)):
                    src = r.stages[s]
                    dst = r.stages[(s + 1) % len(r.stages)]
                    last = s == len(r.stages) - 1
                    # the last stage's sampled ids go back to the first (lab/sim/steps.py, "pipeline
                    # hand-offs"). NOTE order of magnitude, not measured: vLLM's V2 runner broadcasts
                    # 16 B per request; either stays far under the pkt collector's collective share
                    nbytes = (np.maximum(st.batch, 1) * 8.0 + 4096) if last else act
                    start = st.starts + st.durs * frac[s] - (0.0002 if not last else 0.0)
                    start = np.minimum(start, st.starts + st.durs - 1e-4)
                    for i, a in enumerate(src):
                        b = dst[i % len(dst)]
                        if a == b:
                            continue
                        dur = nbytes / (c.rdma_speed * 0.8) / P + 2e-5
                        bursts[a].extend(zip(start.tolist(), nbytes.tolist()))
                        for p in range(P):
                            fi = self.nodes[a].roce_flow(p, b, "pp", True, 0, c.nodes[b].rdma_ips[p])
                            roce[a][fi] = (start, dur, nbytes / P)
                            fo = self.nodes[b].roce_flow(p, a, "pp", False, 0, c.nodes[a].rdma_ips[p])
                            roce[b][fo] = (start + 2e-6, dur, nbytes / P)
        # disaggregated serving: each finished prefill ships its KV blocks to a decode replica
        if r.role == "prefill" and len(out.fin_t):
            decs = [d for d in c.replicas if d.role == "decode"]
            src = r.engine_node
            kvb = m.kv_bytes_per_token * tr.kv_mult
            starts, durs, byts, dst_of = [], [], [], []
            free_at = t0
            for ft, L in zip(out.fin_t.tolist(), self._prefill_prompts(out)):
                d = decs[self._rr % len(decs)]
                self._rr += 1
                nbytes = L * kvb
                rate = c.rdma_speed * P * 0.8 * tr.kv_rate.get(src, 1.0)
                s0 = max(ft, free_at)
                du = nbytes / rate
                free_at = s0 + du
                starts.append(s0)
                durs.append(du)
                byts.append(nbytes)
                dst_of.append(d.engine_node)
                out_len = float(np.clip(np.round(np.exp(rng.normal(np.log(self.load.output_median),
                                                                   self.load.output_sigma))), 1, self.load.output_max))
                self.handoff.append((d.id, s0 + du, float(L), out_len))
            for dn in set(dst_of):
                sel = np.array([x == dn for x in dst_of])
                s_ = np.array(starts)[sel]
                du_ = np.array(durs)[sel]
                b_ = np.array(byts)[sel]
                bursts[src].extend(zip(s_.tolist(), b_.tolist()))
                for p in range(P):
                    fi = self.nodes[src].roce_flow(p, dn, "kv", True, 0, c.nodes[dn].rdma_ips[p])
                    prev = roce[src].get(fi)
                    roce[src][fi] = _cat(prev, (s_, du_, b_ / P))
                    fo = self.nodes[dn].roce_flow(p, src, "kv", False, 0, c.nodes[src].rdma_ips[p])
                    roce[dn][fo] = _cat(roce[dn].get(fo), (s_ + 2e-6, du_, b_ / P))

    def _stage_silences(self, r, st, frac: np.ndarray, act: np.ndarray, P: int) -> None:
        """The silences the pkt collector lists on the connections between a pipeline's stages
        (lab/sim/steps.py, "pipeline hand-offs"): per step and stage pair s -> s+1, the
        receiver's clear-to-send when it finished its part of the step, the activations once
        the sender has them and the receiver asked. Only for stages of one node each: a stage
        spanning nodes already lists its TP all-reduce's silences on the same ports."""
        c = self.cluster
        if any(len(stg) != 1 for stg in r.stages) or not len(st.starts):
            return
        rng = self.stage_rng
        ns = len(st.starts)
        fin = [st.starts + st.durs * frac[s] - rng.uniform(0.0, 2 * STAGE_JITTER, ns) for s in range(len(r.stages))]
        per: dict[int, list[Events]] = {}
        rate = c.rdma_speed * 0.8 * P
        for s in range(len(r.stages) - 1):
            a, b = r.stages[s][0], r.stages[s + 1][0]
            if a == b:
                continue
            snd, rcv = handoff_events(fin[s], fin[s + 1], act, rate)
            per.setdefault(a, []).append(snd)
            per.setdefault(b, []).append(rcv)
        for nd, evs in per.items():
            ev = Events(*(np.concatenate([getattr(e, f) for e in evs]) for f in ("start", "end", "kind", "nbytes")))
            self.silences[nd].append(event_silences(ev, self._stage_state[nd]))

    @staticmethod
    def _prefill_prompts(out: TickOut) -> list[float]:
        return out.fin_prompt.astype(float).tolist()

    def _port_marks(self, ns: NodeSim, tr: NodeTraffic, st) -> None:
        """Retransmitted and CE-marked packets of a port land on the flows that carried traffic."""
        for table, per_port in ((st.roce_rtx, tr.rtx), (st.roce_ecn, tr.ecn)):
            for p, total in per_port.items():
                flows = [fi for fi, tup in st.roce.items() if len(tup[0]) and ns.roce_flows[fi].port == p]
                for fi, k in zip(flows, _spread(total * (st.t1 - st.t0), len(flows), self.traffic_rng)):
                    table[fi] = table.get(fi, 0.0) + float(k)

    def _apply_node_traffic(self, ns: NodeSim, tr: NodeTraffic, roce: dict) -> None:
        """Per-port effects: stalled flows send nothing for a while; a throttled port stretches bursts."""
        if not (tr.stall or tr.rate):
            return
        for fi, (s, d, b) in list(roce.items()):
            f = ns.roce_flows[fi]
            share = tr.stall.get(f.port, 0.0)
            if share > 0 and (zlib.crc32(f"{f.name}/{int(self.t) // 10}".encode()) % 1000) / 1000.0 < share:
                # head-of-line blocked: the flow is silent for this interval, its data waits
                roce[fi] = (s[:0], d[:0], b[:0])
                continue
            rate = tr.rate.get(f.port, 1.0)
            if rate < 1.0:
                roce[fi] = (s, d / max(rate, 0.02), b)


def _spread(total: float, k: int, rng: np.random.Generator) -> np.ndarray:
    """``total`` events per second over ``k`` flows (Poisson, uneven)."""
    return rng.poisson(max(total, 0.0) * rng.dirichlet(np.ones(k))) if k else np.zeros(0)


def _cat(prev, new):
    if prev is None:
        return new
    return tuple(np.concatenate([a, b]) for a, b in zip(prev, new))


def simulate(scenario: Scenario | str, seed: int = 0) -> Simulation:
    """Run ``scenario`` (a :class:`Scenario` or a path/name) with ``seed``: iterate the result
    for ``(t, node, SampleBatch)``; ``.truth`` lists the injected faults."""
    if isinstance(scenario, str):
        p = Path(scenario)
        if not p.exists():
            p = SCENARIO_DIR / f"{scenario}.yaml"
        scenario = load_scenario(p)
    return Simulation(scenario, seed)
