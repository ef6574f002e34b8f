"""GPU and engine injectors (GPU-1 … GPU-8): squatters, KV saturation, stalls, preemption, throttling,
hardware faults and the engine's throughput.
"""
from __future__ import annotations

from .base import GpuTarget, Injector, serving


class GPU1(Injector):
    """Squatter: GPUs hold their framebuffer (>95 %) but do no work for minutes - a dead engine's
    zombie process, an idle notebook, an engine drained of traffic but never released."""

    id = "GPU-1"
    target = "gpu"
    node_wide = True
    variants = ("zombie_process", "drained_engine", "idle_job")

    @classmethod
    def eligible_nodes(cls, c):
        return [c.nodes[r.engine_node].name for r in c.replicas if len(r.nodes) == 1 and r.role == "mixed"]

    def setup(self):
        self.mem = float(self.rng.uniform(0.955, 0.995))
        self.extra_w = self.lerp(20, 110)
        self.rids = [r.id for r in self.c.replicas if r.engine_node == self.ni and len(r.nodes) == 1]

    def on_engine(self, t0, t1, effs):
        for rid in self.rids:
            if self.variant == "drained_engine":
                effs[rid].rate_mult = 0.0
            else:
                effs[rid].serving = False

    def on_node(self, t0, t1, ni, st, sim):
        if ni != self.ni:
            return
        g = self.c.gpu
        gs = [k for rid in self.rids for (n, k) in self.c.replicas[rid].gpus]
        for k in gs:
            st.mem_used[k] = g.mem_total * self.mem
            st.util[k] = float(self.rng.choice([0.0, 0.0, 0.01, 0.02, 0.03]))
            st.power[k] = g.power_idle + self.extra_w * float(self.rng.uniform(0.9, 1.1))
            st.mem_util[k] = 0.0
        if self.variant == "idle_job":
            for rid in self.rids:
                st.vllm_up[self.c.replicas[rid].engine] = False


class GPU2(Injector):
    """KV saturation / queue instability: demand outgrows the KV cache (a traffic surge, long
    contexts, long generations): usage sits in the high nineties and the waiting queue grows."""

    id = "GPU-2"
    target = "engine"
    variants = ("traffic_surge", "long_context", "long_generations")

    @classmethod
    def eligible_nodes(cls, c):
        return serving(c)

    def on_engine(self, t0, t1, effs):
        rid = self.engine_replica()
        if rid is None:
            return
        e = effs[rid]
        if self.variant == "traffic_surge":
            e.rate_mult *= self.lerp(1.6, 3.5)
        elif self.variant == "long_context":
            e.prompt_scale *= self.lerp(2.5, 6.0)
            e.rate_mult *= 1.2
        else:
            e.output_scale *= self.lerp(3.0, 8.0)
            e.rate_mult *= 1.3


class GPU3(Injector):
    """Engine stall: the engine stops stepping. A scheduler deadlock typically strikes when the
    KV cache has run full (no block can be freed or allocated): running drops to 0, the cache
    stays held and requests keep queueing. A hung collective freezes the engine core inside a
    step: the GPUs spin, and the front end keeps reporting the last stats it received."""

    id = "GPU-3"
    target = "engine"
    variants = ("scheduler_deadlock", "hung_collective")
    severity = (1.0, 1.0)

    @classmethod
    def eligible_nodes(cls, c):
        return serving(c)

    def setup(self):
        self.stalled = False
        self.max_fill = float(self.rng.uniform(30, 120))  # a deadlock can also strike before it is full

    def on_engine(self, t0, t1, effs):
        rid = self.engine_replica()
        if rid is None:
            return
        e = effs[rid]
        if self.variant == "hung_collective":
            e.freeze = True
            return
        if not self.stalled:
            eng = self.sim.engines[rid]
            kv = eng._blocks(eng.run) / max(1, eng.capacity_blocks)
            if kv >= 0.97 or t0 - self.onset >= self.max_fill:
                self.stalled = True
            else:  # the surge that drives the cache full
                e.rate_mult *= 2.5
                e.prompt_scale *= 2.0
                return
        e.stall = True

    def on_node(self, t0, t1, ni, st, sim):
        rid = self.engine_replica()
        if rid is None or ni not in self.c.replicas[rid].nodes:
            return
        if self.variant == "scheduler_deadlock" and not self.stalled:
            return
        gs = [k for (n, k) in self.c.replicas[rid].gpus if n == ni]
        g = self.c.gpu
        for k in gs:
            if self.variant == "hung_collective":  # NCCL kernels spin: busy but no progress
                st.util[k] = 1.0
                st.power[k] = g.power_idle + 0.35 * (g.power_busy_decode - g.power_idle)
            else:
                st.util[k] = 0.0
                st.power[k] = g.power_idle * float(self.rng.uniform(1.0, 1.2))


class GPU4(Injector):
    """Preemption storm: sequences grow past what the KV cache holds (long generations, too many
    concurrent sequences), so the scheduler keeps preempting and recomputing them."""

    id = "GPU-4"
    target = "engine"
    variants = ("long_generations", "too_many_sequences")

    @classmethod
    def eligible_nodes(cls, c):
        return serving(c)

    def on_engine(self, t0, t1, effs):
        rid = self.engine_replica()
        if rid is None:
            return
        e = effs[rid]
        if self.variant == "long_generations":
            e.output_scale *= self.lerp(6.0, 16.0)
            e.prompt_scale *= 1.5
            e.rate_mult *= 1.5
        else:
            e.prompt_scale *= self.lerp(3.0, 6.0)
            e.output_scale *= self.lerp(3.0, 6.0)
            e.rate_mult *= self.lerp(1.5, 3.0)


class GPU5(GpuTarget):
    """Throttle skew: one GPU of a group runs slow for power or thermal reasons (cooling,
    a power brake, a lowered power cap) and reports why; its whole TP group waits for it."""

    id = "GPU-5"
    variants = ("hw_thermal", "power_brake", "sw_thermal", "power_cap")

    def setup(self):
        self.clock = {"hw_thermal": self.lerp(0.8, 0.45), "power_brake": self.lerp(0.6, 0.3),
                      "sw_thermal": self.lerp(0.93, 0.75), "power_cap": self.lerp(0.9, 0.6)}[self.variant]
        self.cycle = float(self.rng.uniform(15, 60)) if self.variant in ("hw_thermal", "sw_thermal") else 0.0

    def _on(self, t: float) -> bool:
        if not self.cycle:
            return True
        return ((t - self.onset) % self.cycle) < self.cycle * self.lerp(0.5, 0.9)

    def on_engine(self, t0, t1, effs):
        if self._on(t0):
            self.step_slow(effs, (1 / self.clock) ** 0.8)

    def on_node(self, t0, t1, ni, st, sim):
        if ni != self.ni:
            return
        g = self.gi
        gp = self.c.gpu
        on = self._on(t0)
        if self.variant in ("hw_thermal", "sw_thermal"):
            st.temp_target[g] += self.lerp(25, 45) if self.variant == "hw_thermal" else self.lerp(18, 30)
        if not on:
            return
        st.clock[g] = gp.sm_clock_max * self.clock
        st.reasons[g] |= {"hw_thermal": 0x40 | 0x8, "power_brake": 0x80 | 0x8, "sw_thermal": 0x20,
                          "power_cap": 0x4}[self.variant]
        if self.variant == "power_cap":
            st.power_limit[g] = gp.power_limit * self.lerp(0.7, 0.45)
            st.power[g] = min(st.power[g], st.power_limit[g] * float(self.rng.uniform(0.97, 1.0)))
        else:
            st.power[g] *= self.clock ** 0.7


class GPU6(GpuTarget):
    """Hardware fault signs: XID errors, PCIe replays and AER errors rising, a link trained to
    fewer lanes, or a GPU that falls off the bus."""

    id = "GPU-6"
    variants = ("xid_ecc", "replay_storm", "width_downtrain", "fell_off_bus")
    severity = (0.3, 1.0)

    def setup(self):
        self.width = int(self.rng.choice([4, 8]))
        n = max(1, int(round(self.lerp(1, 6))))
        span = max(2.0, self.end - self.onset)
        self.xid_at = sorted(self.onset + self.rng.uniform(0, span * 0.8, n)) if self.variant == "xid_ecc" else []
        self.codes = [int(self.rng.choice([48, 63, 64, 94, 95])) for _ in self.xid_at]

    def on_engine(self, t0, t1, effs):
        if self.variant == "fell_off_bus":
            rid = self.gpu_replica()
            if rid is not None:
                effs[rid].serving = False
        elif self.variant == "width_downtrain":
            self.step_slow(effs, 1.05)

    def on_node(self, t0, t1, ni, st, sim):
        if ni != self.ni:
            return
        g = self.gi
        pci = self.node.gpu_pci[g]
        if self.variant == "xid_ecc":
            for ta, code in zip(self.xid_at, self.codes):
                if t0 <= ta < t1:
                    st.xid.append((g, code))
        elif self.variant == "replay_storm":
            r = float(self.rng.poisson(self.lerp(2, 400)))
            st.replay_inc[g] += r
            st.nvml_err_inc[g, 0] += r * 0.5
            st.recov_inc[g] += float(self.rng.poisson(0.02 + 0.1 * self.s))
            st.aer_inc[pci] = {"correctable_errors": r * 0.5, "bad_tlp": r * 0.3, "receiver_errors": r * 0.2,
                               "replay_timeout": r * 0.05}
        elif self.variant == "width_downtrain":
            st.pcie_width[g] = self.width
            st.pci_width[pci] = self.width
            st.replay_inc[g] += float(self.rng.poisson(0.5))
        else:
            if t0 - self.onset < 1.0:
                st.xid.append((g, 79))
            else:
                st.responding[g] = False


class GPU7(Injector):
    """Resource imbalance: a node's replica is bound by one resource while the others idle -
    memory-bound (long contexts, few sequences: KV full, compute and power low) or compute-bound
    (prefill-heavy: power high, KV empty) - unlike its peers."""

    id = "GPU-7"
    target = "engine"
    variants = ("memory_bound", "compute_bound")

    @classmethod
    def unsupported(cls, c):
        if len(serving(c)) < 3:
            return "needs at least three serving nodes to compare with"
        return super().unsupported(c)

    @classmethod
    def eligible_nodes(cls, c):
        return serving(c)

    def on_engine(self, t0, t1, effs):
        rid = self.engine_replica()
        if rid is None:
            return
        e = effs[rid]
        if self.variant == "memory_bound":
            e.prompt_scale *= self.lerp(3.0, 8.0)
            e.output_scale *= self.lerp(2.0, 4.0)
            e.rate_mult *= self.lerp(0.5, 0.25)
        else:
            e.output_scale *= self.lerp(0.3, 0.05)
            e.prompt_scale *= self.lerp(1.5, 3.0)
            e.rate_mult *= self.lerp(1.5, 3.0)


class GPU8(Injector):
    """Throughput erosion: the engine generates fewer tokens per second while its running batch
    holds (creeping fragmentation, a noisy neighbour on the GPU, slow thermal creep)."""

    id = "GPU-8"
    target = "engine"
    variants = ("gradual_creep", "noisy_neighbour")

    @classmethod
    def eligible_nodes(cls, c):
        return serving(c)

    def setup(self):
        self.mult = self.lerp(1.4, 3.5)
        self.tau = float(self.rng.uniform(60, 180))

    def on_engine(self, t0, t1, effs):
        rid = self.engine_replica()
        if rid is None:
            return
        if self.variant == "gradual_creep":
            m = 1 + (self.mult - 1) * self.ramp(t0, self.tau)
        else:
            m = 1 + (self.mult - 1) * float(self.rng.uniform(0.5, 1.5))
        effs[rid].step_mult *= m
        effs[rid].prefill_mult *= m
