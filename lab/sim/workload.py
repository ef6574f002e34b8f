"""Requests and one vLLM-like engine per replica, advanced one collection interval at a time.

The engine is a small discrete model of vLLM V1's scheduler: FCFS admission while the KV cache
has blocks for the prompt (16-token blocks), chunked prefill mixed into decode steps, one token
per running sequence per step, recompute preemption of the latest admitted sequence when the
cache cannot hold the next steps' growth. A decode step costs
``base + per_seq * running + per_ctx * context_tokens`` (scaled by fault effects), so KV
pressure, batch size and context length all shape the step rate - and through it ITL, GPU
power, PCIe and collective traffic. Each interval it returns the step timeline (start times and
durations), which the node model turns into collective bursts, PCIe samples and token packets.

Lengths are heavy-tailed (lognormal), arrivals Poisson around a slowly wandering rate
(Ornstein-Uhlenbeck), prefix-cache hits Beta-distributed per request.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from .topology import Cluster, Replica

BLOCK = 16
CHUNK_TOKENS = 2048  # max_num_batched_tokens: prefill tokens that fit in one step

# vLLM 0.33 histogram buckets (read from genuine /metrics pages, ../shared/vllm-metrics/)
TTFT_BUCKETS = np.array([0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5,
                         10.0, 20.0, 40.0, 80.0, 160.0, 640.0, 2560.0, np.inf])
ITL_BUCKETS = np.array([0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0,
                        20.0, 40.0, 80.0, np.inf])
REQ_BUCKETS = np.array([0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0, 120.0,
                        240.0, 480.0, 960.0, 1920.0, 7680.0, np.inf])
HISTS = {"ttft": TTFT_BUCKETS, "itl": ITL_BUCKETS, "e2e_latency": REQ_BUCKETS, "queue_time": REQ_BUCKETS,
         "prefill_time": REQ_BUCKETS, "decode_time": REQ_BUCKETS}


@dataclass
class LoadSpec:
    rate: float  # requests/s per replica
    variation: float  # relative amplitude of the slow rate wander
    prompt_median: float
    prompt_sigma: float
    prompt_max: int
    output_median: float
    output_sigma: float
    output_max: int
    prefix_hit: float  # mean share of a prompt found in the prefix cache
    connections: int  # keep-alive pool of the gateway towards one engine


@dataclass
class Effects:
    """What faults do to one replica during an interval (neutral values = healthy)."""

    rate_mult: float = 1.0
    step_mult: float = 1.0  # decode step duration multiplier (slow GPU, throttling, straggler)
    step_add: float = 0.0  # seconds added to every step (collective wait on a late peer)
    prefill_mult: float = 1.0  # prefill duration multiplier
    idle_share: float = 0.0  # share of the interval the GPUs wait on the host (launch latency, CPU)
    stall: bool = False  # scheduler stuck: no steps at all
    freeze: bool = False  # engine core hung: no steps and no new stats (the gauges keep their last values)
    serving: bool = True  # False: the engine process is gone (no steps, endpoint down)
    burst: tuple[float, float] | None = None  # (period s, share of the period's arrivals in 1 s)
    prompt_scale: float = 1.0
    prompt_cap: int = 0  # longest prompt admitted when above the load's prompt_max (long-context serving)
    output_scale: float = 1.0
    output_sigma_add: float = 0.0
    lengths_bimodal: float = 0.0  # share of requests that stop almost at once (early stops)
    batch_client: tuple[float, int] | None = None  # (period s, batch size): batch submission
    sticky_conns: int = 0  # >0: the gateway pins all requests on this many connections (affinity)
    hot_share: float = 0.0  # share of requests the gateway puts on connection 0 (stream imbalance)
    conn_close: bool = False  # clients open a connection per request and close it when done


@dataclass
class StepTimeline:
    starts: np.ndarray  # absolute start time of each step
    durs: np.ndarray
    batch: np.ndarray  # sequences decoding in each step
    prefill: np.ndarray  # prefill tokens mixed into each step


@dataclass
class TickOut:
    t0: float
    t1: float
    steps: StepTimeline
    running: int
    waiting: int
    kv: float
    busy: float  # share of the interval the GPUs executed steps
    prefill_share: float  # share of busy time spent on prefill
    gen_tokens: int
    prompt_tokens: int
    finished: int
    # per request active in the interval: connection, first step index of its tokens, tokens
    tok_conn: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))
    tok_first: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))
    tok_n: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))
    # requests arriving in the interval: connection, arrival time, prompt tokens
    arr_conn: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))
    arr_t: np.ndarray = field(default_factory=lambda: np.zeros(0))
    arr_prompt: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))
    # requests finishing: connection, finish time, output tokens
    fin_conn: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))
    fin_t: np.ndarray = field(default_factory=lambda: np.zeros(0))
    fin_out: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))
    fin_prompt: np.ndarray = field(default_factory=lambda: np.zeros(0))
    serving: bool = True
    conn_close: bool = False


class _Queue:
    """Columnar FIFO of waiting requests (preempted ones are put back at the front)."""

    COLS = ("arr", "prompt", "out", "gen", "conn", "hit")

    def __init__(self) -> None:
        self.c = {k: np.zeros(0) for k in self.COLS}

    def __len__(self) -> int:
        return len(self.c["arr"])

    def push(self, front: bool = False, **cols: np.ndarray) -> None:
        for k in self.COLS:
            v = np.asarray(cols[k], dtype=float)
            self.c[k] = np.concatenate([v, self.c[k]] if front else [self.c[k], v])

    def pop(self, n: int) -> dict[str, np.ndarray]:
        out = {k: v[:n] for k, v in self.c.items()}
        self.c = {k: v[n:] for k, v in self.c.items()}
        return out


class EngineSim:
    """One replica's engine. ``tick`` advances it over ``[t0, t1)``."""

    def __init__(self, replica: Replica, cluster: Cluster, load: LoadSpec, rng: np.random.Generator) -> None:
        self.replica = replica
        self.cluster = cluster
        self.load = load
        self.rng = rng
        self.model = cluster.model
        self.capacity_blocks = cluster.kv_capacity_tokens // BLOCK
        self.max_seqs = cluster.max_num_seqs
        tp_nodes = max(len(st) for st in replica.stages)
        # a cross-node all-reduce per layer adds latency that a single NVLink domain does not pay
        self.comm_s = 0.0035 * (tp_nodes - 1) + 0.0015 * (cluster.pp - 1 if len(replica.nodes) > 1 else 0)
        tp_scale = max(0.35, (self.model.tp_ref / max(1, cluster.tp)) ** 0.6)
        g = cluster.gpu
        self.step_base = self.model.step_base_s * tp_scale / g.mem_speed
        self.per_seq = self.model.step_per_seq_s * tp_scale / g.compute_speed
        self.per_ctx = self.model.step_per_ctx_token_s * tp_scale / g.mem_speed
        self.prefill_rate = (self.model.prefill_tokens_per_s * g.compute_speed
                             * max(1.0, cluster.tp * cluster.pp / self.model.tp_ref) ** 0.8)
        self.wait = _Queue()
        self.run = {k: np.zeros(0) for k in ("arr", "prompt", "out", "gen", "conn", "hit", "sched", "first")}
        self.rate_state = 0.0
        self.busy_conn = np.zeros(max(16, load.connections), bool)
        # cumulative counters (what vLLM exposes)
        self.c_prompt = 0.0
        self.c_gen = 0.0
        self.c_preempt = 0.0
        self.c_success = 0.0
        self.c_prefix_q = 0.0
        self.c_prefix_h = 0.0
        self.c_steps = 0.0  # engine steps (vLLM: observations of vllm:iteration_tokens_total)
        self.hist_counts = {k: np.zeros(len(b)) for k, b in HISTS.items()}
        self.hist_sum = {k: 0.0 for k in HISTS}
        self.carry = 0.0
        self.next_batch_t: float | None = None
        self.next_burst_t: float | None = None
        self.started_at: float | None = None
        self.next_conn = 100_000
        self.last_gauges: tuple[int, int, float] = (0, 0, 0.0)

    # -- arrivals ----------------------------------------------------------------------------
    def _lengths(self, n: int, eff: Effects) -> tuple[np.ndarray, np.ndarray]:
        L = self.load
        p = np.exp(self.rng.normal(np.log(L.prompt_median * eff.prompt_scale), L.prompt_sigma, n))
        o = np.exp(self.rng.normal(np.log(L.output_median * eff.output_scale), L.output_sigma + eff.output_sigma_add, n))
        if eff.lengths_bimodal > 0:
            short = self.rng.random(n) < eff.lengths_bimodal
            o = np.where(short, self.rng.integers(1, 12, n), o * (1 + eff.lengths_bimodal))
        p = np.clip(np.round(p), 8, max(L.prompt_max, eff.prompt_cap))
        o = np.clip(np.round(o), 1, L.output_max)
        return p, o

    def arrivals(self, t0: float, t1: float, eff: Effects) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        L = self.load
        dt = t1 - t0
        # Ornstein-Uhlenbeck wander of the rate: minutes-scale correlation
        theta = dt / 120.0
        self.rate_state += -theta * self.rate_state + L.variation * np.sqrt(2 * theta) * self.rng.normal()
        lam = max(0.0, L.rate * eff.rate_mult * (1.0 + self.rate_state)) * dt
        times: list[np.ndarray] = []
        if eff.burst is not None:
            period, share = eff.burst
            if self.next_burst_t is None:
                self.next_burst_t = t0 + self.rng.uniform(0, period)
            base = lam * (1 - share)
            times.append(t0 + np.sort(self.rng.random(self.rng.poisson(base))) * dt)
            while self.next_burst_t < t1:
                k = self.rng.poisson(L.rate * eff.rate_mult * period * share)
                times.append(self.next_burst_t + np.sort(self.rng.random(k)) * 0.4)  # within ~0.4 s
                self.next_burst_t += period * self.rng.uniform(0.6, 1.4)
        else:
            times.append(t0 + np.sort(self.rng.random(self.rng.poisson(lam))) * dt)
        if eff.batch_client is not None:
            period, size = eff.batch_client
            if self.next_batch_t is None:
                self.next_batch_t = t0 + self.rng.uniform(0, period)
            while self.next_batch_t < t1:
                times.append(np.full(size, self.next_batch_t) + self.rng.random(size) * 0.05)
                self.next_batch_t += period
        t = np.sort(np.concatenate(times)) if times else np.zeros(0)
        t = t[t < t1 + 0.4]
        p, o = self._lengths(len(t), eff)
        return np.minimum(t, np.nextafter(t1, t0)), p, o

    def _assign_conns(self, n: int, eff: Effects) -> np.ndarray:
        if eff.sticky_conns > 0:
            k = min(eff.sticky_conns, len(self.busy_conn))
            return self.rng.integers(0, k, n)
        if eff.conn_close:  # a fresh connection (new client port) per request
            out = self.next_conn + np.arange(n, dtype=np.int64)
            self.next_conn += n
            return out
        out = np.empty(n, np.int64)
        hot = self.rng.random(n) < eff.hot_share if eff.hot_share > 0 else np.zeros(n, bool)
        for i in range(n):
            if hot[i]:
                out[i] = 0
                continue
            free = np.flatnonzero(~self.busy_conn)
            if not len(free):  # the gateway opens another connection
                self.busy_conn = np.r_[self.busy_conn, np.zeros(len(self.busy_conn) // 2 + 1, bool)]
                free = np.flatnonzero(~self.busy_conn)
            c = free[0]
            self.busy_conn[c] = True
            out[i] = c
        return out

    # -- one interval --------------------------------------------------------------------------
    def tick(self, t0: float, t1: float, eff: Effects) -> TickOut:
        if self.started_at is None:
            self.started_at = t0
        dt = t1 - t0
        at, ap, ao = self.arrivals(t0, t1, eff)
        conns = self._assign_conns(len(at), eff)
        hit = np.minimum(self.rng.beta(2.0, 2.0 * (1 - self.load.prefix_hit) / max(self.load.prefix_hit, 1e-3),
                                       len(at)) if self.load.prefix_hit > 0 else np.zeros(len(at)), 0.98)
        out = TickOut(t0, t1, StepTimeline(np.zeros(0), np.zeros(0), np.zeros(0), np.zeros(0)),
                      0, 0, 0.0, 0.0, 0.0, 0, 0, 0, arr_conn=conns, arr_t=at, arr_prompt=ap.astype(np.int64),
                      serving=eff.serving)
        if not eff.serving:
            # the engine is gone: clients get errors, nothing is queued or computed
            self.busy_conn[conns[(conns >= 0) & (conns < len(self.busy_conn))]] = False
            self.run = {k: np.zeros(0) for k in self.run}
            self.wait = _Queue()
            out.kv = 0.0
            return out
        self.wait.push(arr=at, prompt=ap, out=ao, gen=np.zeros(len(at)), conn=conns, hit=hit)
        R = self.run
        if eff.freeze:
            # the core is stuck inside a step: the front end keeps the last stats it got
            out.running, out.waiting, out.kv = self.last_gauges
            return out
        if eff.stall:
            out.running = 0  # the scheduler stopped stepping: nothing is reported running
            out.waiting = len(self.wait) + len(R["arr"])
            out.kv = min(1.0, self._blocks(R) / self.capacity_blocks)
            return out
        # ---- admission (FCFS while blocks and sequence slots last)
        used = self._blocks(R)
        budget_prefill = self.prefill_rate / (eff.prefill_mult * eff.step_mult) * dt * 0.7
        n_adm = 0
        tok = 0.0
        free_slots = self.max_seqs - len(R["arr"])
        W = self.wait.c
        for i in range(min(len(self.wait), max(0, free_slots))):
            if W["arr"][i] >= t1:
                break
            ctx = W["prompt"][i] + W["gen"][i]
            compute = ctx * (1 - W["hit"][i]) if W["gen"][i] == 0 else ctx
            # V1 allocates blocks for the tokens it schedules now (a prefill chunk), not for the
            # whole context: a long (re)computation starts as soon as one chunk fits, and the
            # sequences it grows into later are found by the preemption below
            need = np.ceil((ctx - compute + min(compute, CHUNK_TOKENS) + 1) / BLOCK)
            if used + need > self.capacity_blocks * 0.99:  # V1 keeps a small watermark
                break
            if n_adm and tok + compute > budget_prefill:
                break
            used += np.ceil((ctx + 1) / BLOCK)
            tok += compute
            n_adm += 1
        adm = self.wait.pop(n_adm)
        # ---- build the step timeline
        speed = eff.step_mult
        idle = min(0.95, max(0.0, eff.idle_share)) * dt
        prefill_time = tok / self.prefill_rate * eff.prefill_mult * speed
        n_run_old = len(R["arr"])
        n_new = n_adm
        ctx_tokens = float(np.sum(R["prompt"] + R["gen"])) + float(np.sum(adm["prompt"] + adm["gen"]))
        batch = n_run_old + n_new
        step = (self.step_base + self.per_seq * batch + self.per_ctx * ctx_tokens + self.comm_s) * speed + eff.step_add
        step *= 1.0 + 0.04 * self.rng.standard_normal()
        step = max(step, 0.002)
        avail = max(0.0, dt - prefill_time - idle)
        if batch == 0 and n_adm == 0:
            n_steps = 0
            self.carry = 0.0
        else:
            f = avail / step + self.carry
            n_steps = int(f)
            self.carry = f - n_steps
        n_chunks = int(np.ceil(tok / CHUNK_TOKENS)) if tok > 0 else 0
        n_steps = max(n_steps, n_chunks)
        durs = step * np.exp(0.03 * self.rng.standard_normal(n_steps)) if n_steps else np.zeros(0)
        pre = np.zeros(n_steps)
        if n_chunks:
            pos = np.sort(self.rng.choice(n_steps, n_chunks, replace=False)) if n_steps > n_chunks else np.arange(n_steps)
            pre[pos[: n_chunks]] = tok / n_chunks
            durs[pos[: n_chunks]] += (tok / n_chunks) / self.prefill_rate * eff.prefill_mult * speed
        # idle gaps (host not feeding the GPU) are spread between steps
        gaps = np.zeros(n_steps)
        if n_steps and idle > 0:
            gaps = self.rng.dirichlet(np.ones(n_steps)) * idle
        starts = t0 + np.concatenate(([0.0], np.cumsum((durs + gaps)[:-1]))) if n_steps else np.zeros(0)
        if n_steps:
            starts = starts + self.rng.uniform(0, max(0.0, dt - float(np.sum(durs + gaps))) * 0.1)
        ends = starts + durs
        # ---- who decodes in which step
        # admitted requests start decoding after the step holding the end of their prefill
        if n_adm:
            cum = np.cumsum(np.where(adm["gen"] == 0, (adm["prompt"]) * (1 - adm["hit"]), adm["prompt"] + adm["gen"]))
            pc = np.cumsum(pre)
            first_step = np.minimum(np.searchsorted(pc, cum - 1e-9), max(0, n_steps - 1))
        else:
            first_step = np.zeros(0, np.int64)
        fs = np.concatenate((np.zeros(n_run_old, np.int64), first_step)).astype(np.int64)
        remaining = np.concatenate((R["out"] - R["gen"], adm["out"] - adm["gen"]))
        avail_steps = np.maximum(0, n_steps - fs)
        ntok = np.minimum(remaining, avail_steps).astype(np.int64)
        # KV growth check: preempt the latest-admitted sequences when the cache cannot hold it
        allc = {k: np.concatenate((R[k], adm[k])) for k in ("arr", "prompt", "out", "gen", "conn", "hit")}
        sched_new = starts[np.minimum(first_step, n_steps - 1)] if n_steps else np.full(n_adm, t0)
        allc["sched"] = np.concatenate((R["sched"], sched_new))
        allc["first"] = np.concatenate((R["first"], np.full(n_adm, np.nan)))
        grow = np.ceil((allc["prompt"] + allc["gen"] + ntok) / BLOCK)
        keep = np.ones(len(grow), bool)
        preempted = 0
        order = np.argsort(-allc["sched"], kind="stable")
        total = float(np.sum(grow))
        for j in order:
            if total <= self.capacity_blocks:
                break
            keep[j] = False
            total -= grow[j]
            preempted += 1
        if preempted:
            pidx = np.flatnonzero(~keep)
            # preempted sequences keep their tokens so far and are recomputed later
            done = np.minimum(ntok[pidx], np.maximum(0, avail_steps[pidx] // 2))
            self.wait.push(front=True, arr=allc["arr"][pidx], prompt=allc["prompt"][pidx], out=allc["out"][pidx],
                           gen=allc["gen"][pidx] + done, conn=allc["conn"][pidx], hit=allc["hit"][pidx])
            ntok[pidx] = done
            self.c_preempt += preempted
        # ---- token accounting per request
        allc["gen"] = allc["gen"] + ntok
        new_first = np.isnan(allc["first"]) & (ntok > 0)
        if n_steps:
            allc["first"] = np.where(new_first, ends[np.minimum(fs, n_steps - 1)], allc["first"])
        finished = keep & (allc["gen"] >= allc["out"])
        fin_step = np.minimum(fs + ntok - 1, max(0, n_steps - 1))
        fin_t = ends[fin_step] if n_steps else np.full(len(fs), t1)
        # histograms
        if np.any(new_first):
            self._observe("ttft", allc["first"][new_first] - allc["arr"][new_first])
            self._observe("queue_time", np.maximum(0, allc["sched"][new_first] - allc["arr"][new_first]))
        if n_steps:
            per_step = np.zeros(n_steps)
            # non-first tokens of each request land in steps [fs + (first? 1 : 0), fs + ntok)
            lo = fs + new_first.astype(np.int64)
            hi = fs + ntok
            ok = hi > lo
            if np.any(ok):
                d = np.zeros(n_steps + 1)
                np.add.at(d, lo[ok], 1)
                np.add.at(d, hi[ok], -1)
                per_step = np.cumsum(d)[:n_steps]
            self.hist_counts["itl"] += _cum_counts(durs, ITL_BUCKETS, per_step)
            self.hist_sum["itl"] += float(np.sum(durs * per_step))
            batch_per_step = np.zeros(n_steps + 1)
            np.add.at(batch_per_step, np.minimum(fs, n_steps), 1)
            np.add.at(batch_per_step, np.minimum(fs + ntok, n_steps), -1)
            bps = np.cumsum(batch_per_step)[:n_steps]
        else:
            bps = np.zeros(0)
        if np.any(finished):
            e2e = fin_t[finished] - allc["arr"][finished]
            self._observe("e2e_latency", np.maximum(1e-3, e2e))
            # vLLM observes a request's prefill and decode time when it finishes (FinishedRequestStats)
            self._observe("prefill_time", np.maximum(1e-4, allc["first"][finished] - allc["sched"][finished]))
            self._observe("decode_time", np.maximum(1e-3, fin_t[finished] - allc["first"][finished]))
            fc = allc["conn"][finished].astype(np.int64)
            self.busy_conn[fc[fc < len(self.busy_conn)]] = False
        self.c_gen += float(np.sum(ntok))
        prompt_done = float(np.sum(allc["prompt"][new_first]))
        self.c_prompt += prompt_done
        self.c_prefix_q += float(np.sum(adm["prompt"][adm["gen"] == 0]))
        self.c_prefix_h += float(np.sum((adm["prompt"] * adm["hit"])[adm["gen"] == 0]))
        self.c_success += float(np.sum(finished))
        self.c_steps += n_steps
        stay = keep & ~finished
        self.run = {k: allc[k][stay] for k in self.run}
        out.steps = StepTimeline(starts, durs, bps, pre)
        out.running = int(np.sum(stay))
        out.waiting = len(self.wait)
        out.kv = min(1.0, self._kv_gauge_blocks(allc, finished, out.running, t1) / self.capacity_blocks)
        self.last_gauges = (out.running, out.waiting, out.kv)
        busy_t = float(np.sum(durs))
        out.busy = min(1.0, busy_t / dt)
        out.prefill_share = min(1.0, prefill_time / busy_t) if busy_t > 0 else 0.0
        out.gen_tokens = int(np.sum(ntok))
        out.prompt_tokens = int(prompt_done)
        out.finished = int(np.sum(finished))
        active = ntok > 0
        out.tok_conn = allc["conn"][active].astype(np.int64)
        out.tok_first = fs[active]
        out.tok_n = ntok[active]
        out.fin_conn = allc["conn"][finished].astype(np.int64)
        out.fin_t = fin_t[finished]
        out.fin_out = allc["out"][finished].astype(np.int64)
        out.fin_prompt = allc["prompt"][finished]
        out.conn_close = eff.conn_close
        return out

    def _kv_gauge_blocks(self, allc: dict[str, np.ndarray], finished: np.ndarray, running: int, t1: float) -> float:
        """Blocks in use as a scrape at the end of the interval reads them. vLLM frees a finished
        sequence's blocks and, with requests waiting, allocates them to the queue's head in the
        next step (tens of ms later), so a full cache with a queue stays full. This simulator
        admits once per interval, at its start: counted alone, every block freed during the
        second would read as free until the next interval - a sawtooth down to 0.7 under long
        contexts (gpu2 long_context), where vLLM shows the cache full. With a queue, the blocks
        freed this interval count as taken again by the first chunks of the requests waiting
        (as many as there are free sequence slots), up to the admission watermark."""
        used = self._blocks(self.run)
        if not len(self.wait) or not np.any(finished):
            return used
        freed = float(np.sum(np.ceil((allc["prompt"][finished] + allc["gen"][finished]) / BLOCK)))
        W = self.wait.c
        nq = min(len(self.wait), max(0, self.max_seqs - running))
        head = np.flatnonzero(W["arr"][:nq] < t1)
        if not len(head):
            return used
        ctx = W["prompt"][head] + W["gen"][head]
        compute = np.where(W["gen"][head] == 0, ctx * (1 - W["hit"][head]), ctx)
        need = float(np.sum(np.ceil((ctx - compute + np.minimum(compute, CHUNK_TOKENS) + 1) / BLOCK)))
        return max(used, min(used + min(freed, need), self.capacity_blocks * 0.99))

    def _blocks(self, R: dict[str, np.ndarray]) -> float:
        if not len(R["arr"]):
            return 0.0
        return float(np.sum(np.ceil((R["prompt"] + R["gen"]) / BLOCK)))

    def _observe(self, name: str, values: np.ndarray) -> None:
        self.hist_counts[name] += _cum_counts(values, HISTS[name])
        self.hist_sum[name] += float(np.sum(values))


def _cum_counts(values: np.ndarray, bounds: np.ndarray, weights: np.ndarray | None = None) -> np.ndarray:
    """Cumulative bucket counts the Prometheus way: an observation counts in every bucket whose
    upper bound ``le`` is >= the value."""
    idx = np.searchsorted(bounds, values, side="left")
    c = np.bincount(idx, weights=weights, minlength=len(bounds))[: len(bounds)]
    return np.cumsum(c)
