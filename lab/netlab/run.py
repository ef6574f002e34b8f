"""One lab run: build the network, start traffic and the product, inject the fault on schedule,
record everything, tear it all down (always: normal end, exception, Ctrl-C, SIGTERM, SIGHUP).

Run directory::

    plan.json          the drawn scenario (skewd.lab.netlab.scenario.Plan)
    truth.json         fault kind, node, expected IDs, onset (wall clock), what was done,
                       measured step periods, kernel TCP counters per node over the run
    messages.jsonl     every skewd message on the lab's NATS (findings, incidents, remaps,
                       summaries, health), as the recorder received it
    steps/rank<i>.log  each rank's per-step (start, comm start, end) timestamps: ground truth
    config/            the agents' and the controller's YAML (what a user writes)
    logs/              every process's output; qdisc stats at the end
    score.json         the run scored against truth.json (skewd.lab.netlab.score)

Times in truth.json are wall-clock seconds (time.time()): every namespace shares the host's clock,
and findings carry the agents' wall-clock times.
"""
from __future__ import annotations

import json
import os
import secrets
import signal
import sys
import threading
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Callable

from . import faults as faults_mod
from . import product, score
from . import steps as steps_mod
from .cgroups import cleanup_cgroups
from .procs import Proc, Procs
from .scenario import Plan
from .topology import DEFAULT_PREFIX, DEFAULT_SUBNET, Topology, list_namespaces
from .torchenv import RankRuntime, resolve

RANK_PORT = 29500
TOKEN_PORT = 8080
#: kernel counters worth reading per node (TcpExt loss classes; Tcp RetransSegs counts them all)
KERNEL_KEYS = ("RetransSegs", "TCPLossProbes", "TCPLossProbeRecovery", "TCPDSACKRecv", "TCPDSACKOfoRecv",
               "TCPSpuriousRTOs", "TCPTimeouts", "TCPLostRetransmit", "TCPFastRetrans", "TCPSlowStartRetrans",
               "TCPSpuriousRtxHostQueues")


class Interrupted(BaseException):
    """A signal asked the run to stop: teardown runs, the run is marked interrupted."""


@dataclass
class LabOptions:
    prefix: str = DEFAULT_PREFIX
    subnet: str = DEFAULT_SUBNET
    backend: str = "auto"  # "auto" | "torch" | "ring"
    torch_python: str | None = None
    cluster: str = "reallab"
    agent_ready_timeout: float = 120.0
    record: bool = False  # every agent records what it sees into <run>/record/<node> (skewd replay)


@dataclass
class RunInfo:
    run_dir: Path
    t0: float = 0.0  # every agent reported (health or summary): the run's clock starts
    onset: float | None = None
    cleared: float | None = None  # when a fault with a duration was removed
    end: float = 0.0
    runtime: RankRuntime | None = None
    fault_info: dict[str, Any] = field(default_factory=dict)
    kernel_start: dict[str, dict] = field(default_factory=dict)
    error: str = ""
    interrupted: bool = False


def node_name(i: int) -> str:
    return f"n{i}"


class Lab:
    """Owns one run's network and processes; a context manager whose exit always tears down."""

    def __init__(self, plan: Plan, run_dir: Path, opts: LabOptions,
                 log: Callable[[str], None] = print) -> None:
        self.plan, self.opts, self.log = plan, opts, log
        self.run_dir = run_dir
        tag = secrets.token_hex(2)
        while list_namespaces(f"{opts.prefix}{tag}-"):
            tag = secrets.token_hex(2)
        self.topo = Topology(opts.prefix, tag, plan.nodes, plan.dedicated_port, opts.subnet)
        self.procs = Procs(run_dir / "logs")
        self.info = RunInfo(run_dir)
        self.ranks: list[Proc] = []
        self.agents: list[Proc] = []
        self.nats_url = ""
        self.owner = os.getpid()

    # -- paths -------------------------------------------------------------------------------
    def step_log(self, i: int) -> Path:
        return self.run_dir / "steps" / f"rank{i}.log"

    def ctl_file(self, i: int) -> Path:
        return self.run_dir / "ctl" / f"rank{i}.json"

    @property
    def messages(self) -> Path:
        return self.run_dir / "messages.jsonl"

    # -- lifecycle ---------------------------------------------------------------------------
    def __enter__(self) -> "Lab":
        try:
            self._start()
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def _start(self) -> None:
        p, t = self.plan, self.topo
        for d in ("steps", "ctl", "config", "logs"):
            (self.run_dir / d).mkdir(parents=True, exist_ok=True)
        self.info.runtime = resolve(self.opts.backend, self.opts.torch_python)
        self.log(f"ranks: {self.info.runtime.detail}; namespaces {t.base}*; {p.nodes} nodes, "
                 f"collectives on {'eth1 (dedicated)' if p.dedicated_port else 'eth0 (shared)'}")
        t.build()
        self.nats_url = product.start_nats(self.procs, t.control, t.control_ip, self.run_dir / "nats")
        product.start_recorder(self.procs, t.control, self.nats_url, self.messages)
        ccfg = product.write_yaml(self.run_dir / "config" / "controller.yaml",
                                  product.controller_config(self.opts.cluster, self.nats_url))
        product.start_controller(self.procs, t.control, ccfg)
        # front end: a token server per node, one client driving all of them
        for i in range(p.nodes):
            self.procs.start(f"tokens-{node_name(i)}", t.node(i),
                             [sys.executable, str(product.WORKERS / "tokens.py"), "server",
                              "--port", str(TOKEN_PORT), "--seed", str(p.seed * 100 + i)])
        # collectives
        rt = self.info.runtime
        addrs = ",".join(t.coll_ip(i) for i in range(p.nodes))
        for i in range(p.nodes):
            self.ctl_file(i).write_text("{}")
            self.ranks.append(self.procs.start(
                f"rank{i}", t.node(i),
                [rt.python, str(product.WORKERS / "rank.py"), "--backend", rt.backend, "--rank", str(i),
                 "--world", str(p.nodes), "--addrs", addrs, "--port", str(RANK_PORT), "--iface", t.coll_iface,
                 "--bytes", str(p.message_bytes), "--period", f"{p.period_s:.4f}", "--ctl", str(self.ctl_file(i)),
                 "--log", str(self.step_log(i))],
                env={"OMP_NUM_THREADS": "1"}))
        time.sleep(0.5)
        self.procs.start("tokens-client", t.client,
                         [sys.executable, str(product.WORKERS / "tokens.py"), "client",
                          "--hosts", ",".join(t.node_ip(i) for i in range(p.nodes)), "--port", str(TOKEN_PORT),
                          "--streams", str(p.streams_per_node), "--seed", str(p.seed)])
        self._wait_ranks_stepping()
        # the product's agents, one per node
        for i in range(p.nodes):
            cfg = product.write_yaml(self.run_dir / "config" / f"agent-{node_name(i)}.yaml",
                                     product.agent_config(self.opts.cluster, node_name(i), i, self.nats_url,
                                                          t.coll_iface, self.run_dir / "spool",
                                                          self.run_dir / "record" / node_name(i)
                                                          if self.opts.record else None))
            self.agents.append(product.start_agent(self.procs, t.node(i), node_name(i), cfg))
        self._wait_agents()
        self.info.t0 = time.time()
        self.info.kernel_start = {node_name(i): faults_mod.kernel_counters(t.node(i)) for i in range(p.nodes)}

    def _wait_ranks_stepping(self, timeout: float = 180) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            self.check_alive()
            if all(len(steps_mod.read_steps(self.step_log(i))) > 40 for i in range(self.plan.nodes)):
                return
            time.sleep(0.5)
        raise TimeoutError(f"the ranks did not start stepping within {timeout:.0f}s:\n{self.ranks[0].tail()}")

    def _wait_agents(self) -> None:
        want = {node_name(i) for i in range(self.plan.nodes)}
        deadline = time.monotonic() + self.opts.agent_ready_timeout
        while time.monotonic() < deadline:
            self.check_alive()
            seen = {m["msg"].get("node") for m in score.read_messages(self.messages)
                    if m["msg"].get("kind") in ("summary", "health")}
            if want <= seen:
                return
            time.sleep(1.0)
        raise TimeoutError(f"agents {sorted(want - seen)} published nothing within {self.opts.agent_ready_timeout:.0f}s")

    def check_alive(self) -> None:
        dead = self.procs.dead()
        if dead:
            d = dead[0]
            raise RuntimeError(f"{d.name} (in {d.ns}) exited with {d.popen.returncode}:\n{d.tail()}")

    def inject(self) -> None:
        p = self.plan
        assert p.fault is not None and p.faulty_node is not None
        i = p.faulty_node
        self.info.fault_info = faults_mod.apply(
            p, ns=self.topo.node(i), iface=self.topo.coll_iface, ctl_file=self.ctl_file(i),
            step_log=self.step_log(i), rank_pid=self.ranks[i].pid, cgroup_name=f"{self.topo.base}n{i}",
            switch_ns=self.topo.switch, switch_port=self.topo.switch_port(i, self.topo.coll_iface))
        # a fault that takes a while to set up says when it began to bite
        self.info.onset = float(self.info.fault_info.pop("onset", time.time()))
        self.log(f"fault {p.fault} on {node_name(i)} at +{self.info.onset - self.info.t0:.0f}s: "
                 f"{self.info.fault_info.get('means')}")

    def clear_fault(self) -> None:
        p = self.plan
        assert p.fault is not None and p.faulty_node is not None
        i = p.faulty_node
        means = faults_mod.clear(p, ns=self.topo.node(i), iface=self.topo.coll_iface, ctl_file=self.ctl_file(i),
                                 cgroup_name=f"{self.topo.base}n{i}", switch_ns=self.topo.switch,
                                 switch_port=self.topo.switch_port(i, self.topo.coll_iface))
        self.info.cleared = time.time()
        self.info.fault_info["cleared_means"] = means
        self.log(f"fault {p.fault} on {node_name(i)} cleared at +{self.info.cleared - self.info.t0:.0f}s: {means}")

    def collect(self) -> dict[str, Any]:
        """What the kernel saw, read before teardown: TCP loss classes per node, qdisc stats."""
        out: dict[str, Any] = {}
        for i in range(self.plan.nodes):
            ns = self.topo.node(i)
            end = faults_mod.kernel_counters(ns)
            start = self.info.kernel_start.get(node_name(i), {})
            delta = {}
            for sec in ("Tcp", "TcpExt"):
                for k in KERNEL_KEYS:
                    if k in end.get(sec, {}):
                        delta[k] = end[sec][k] - start.get(sec, {}).get(k, 0)
            out[node_name(i)] = delta
            for ifc in sorted({"eth0", self.topo.coll_iface}):
                stats = faults_mod.qdisc_stats(ns, ifc)
                (self.run_dir / "logs" / f"qdisc-{node_name(i)}-{ifc}.txt").write_text(stats)
                # what a drops fault did: a run whose queue dropped next to nothing had no fault to find
                delta["QdiscDropped"] = delta.get("QdiscDropped", 0) + faults_mod.qdisc_dropped(stats)
            # the switch's queue into the node (an ingress_drops fault's): what the node never received
            port = self.topo.switch_port(i, self.topo.coll_iface)
            stats = faults_mod.qdisc_stats(self.topo.switch, port)
            (self.run_dir / "logs" / f"qdisc-sw-{port}-{node_name(i)}.txt").write_text(stats)
            delta["SwitchQdiscDropped"] = faults_mod.qdisc_dropped(stats)
        return out

    def close(self) -> None:
        if os.getpid() != self.owner:
            return  # a forked helper's copy of this object: the runner tears down, once
        try:
            self.procs.stop()
        finally:
            self.topo.teardown()
            cleanup_cgroups(self.topo.base)


def run(plan: Plan, out: Path, opts: LabOptions | None = None, log: Callable[[str], None] = print) -> Path:
    """Run ``plan`` into the new directory ``out``; returns it (score.json included). A failure
    after the network was built still tears it down and writes truth.json with ``error``."""
    opts = opts or LabOptions()
    out.mkdir(parents=True, exist_ok=False)
    (out / "plan.json").write_text(json.dumps(plan.to_dict(), indent=1))
    restore = _trap_signals()
    lab: Lab | None = None
    kernel: dict[str, Any] = {}
    try:
        lab = Lab(plan, out, opts, log)
        with lab:
            info = lab.info
            log(f"agents up; run {plan.duration_s:.0f}s" + (
                f", fault {plan.fault} on {node_name(plan.faulty_node)} at +{plan.onset_s:.0f}s"
                if plan.fault else " (healthy)"))
            end = info.t0 + plan.duration_s
            onset = info.t0 + plan.onset_s if plan.onset_s is not None else None
            while time.time() < end:
                lab.check_alive()
                if onset is not None and info.onset is None and time.time() >= onset:
                    lab.inject()
                clear_at = (info.onset + plan.fault_duration_s
                            if info.onset is not None and plan.fault_duration_s is not None else None)
                if clear_at is not None and info.cleared is None and time.time() >= clear_at:
                    lab.clear_fault()
                nxt = onset if onset is not None and info.onset is None else (
                    clear_at if clear_at is not None and info.cleared is None else end)
                time.sleep(max(0.05, min(1.0, nxt - time.time())))
            info.end = time.time()
            kernel = lab.collect()
    except (Interrupted, KeyboardInterrupt):
        if lab is not None:
            lab.info.interrupted = True
            lab.info.error = "interrupted by a signal"
        log("interrupted: tore the lab down")
    except Exception as e:  # noqa: BLE001 - recorded in truth.json, re-raised below
        if lab is None:
            raise
        lab.info.error = f"{type(e).__name__}: {e}"
        raise
    finally:
        restore()
        if lab is not None:
            if not lab.info.end:
                lab.info.end = time.time()
            _write_truth(lab, kernel)
    if lab is None:
        raise RuntimeError("interrupted before the lab was built")
    if lab.info.error:
        raise RuntimeError(lab.info.error)
    result = score.score_run(out)
    (out / "score.json").write_text(json.dumps(result, indent=1))
    return out


PRODUCT_DIRS = ("agent", "collectors", "rules", "controller", "skewd")


def product_commit() -> str:
    """The last commit that changed the product (not the lab): what a run measured."""
    import subprocess

    root = Path(__file__).resolve().parents[2]
    try:
        r = subprocess.run(["git", "-C", str(root), "log", "-1", "--format=%h", "--", *PRODUCT_DIRS],
                           capture_output=True, text=True, timeout=10)
        dirty = subprocess.run(["git", "-C", str(root), "status", "--porcelain", "--", *PRODUCT_DIRS],
                               capture_output=True, text=True, timeout=10).stdout.strip()
    except (OSError, subprocess.TimeoutExpired):
        return "unknown"
    return (r.stdout.strip() or "unknown") + ("+local changes" if dirty else "")


def _write_truth(lab: Lab, kernel: dict[str, Any]) -> None:
    p, info = lab.plan, lab.info
    spec = faults_mod.FAULTS.get(p.fault) if p.fault else None
    truth = {
        "scenario": p.scenario, "seed": p.seed, "fault": p.fault,
        "node": node_name(p.faulty_node) if p.faulty_node is not None else None,
        "expected": list(spec.expected) if spec else [],
        "nodes": [node_name(i) for i in range(p.nodes)],
        "healthy_nodes": [node_name(i) for i in range(p.nodes) if i != p.faulty_node],
        "t0": info.t0, "onset": info.onset, "cleared": info.cleared, "end": info.end,
        "onset_after_t0_s": (info.onset - info.t0) if info.onset and info.t0 else None,
        "fault_means": info.fault_info,
        "ranks": {"backend": info.runtime.backend if info.runtime else None,
                  "detail": info.runtime.detail if info.runtime else None},
        "collective_port": lab.topo.coll_iface,
        "steps": steps_mod.step_stats([lab.step_log(i) for i in range(p.nodes)], info.t0, info.onset, info.end,
                                      p.faulty_node) if info.t0 else {},
        "kernel_tcp": kernel,
        "error": info.error, "interrupted": info.interrupted, "product_commit": product_commit(),
        "plan": asdict(p),
    }
    (lab.run_dir / "truth.json").write_text(json.dumps(truth, indent=1))


def _trap_signals() -> Callable[[], None]:
    """SIGTERM and SIGHUP raise :class:`Interrupted` in the main thread (SIGINT already raises
    KeyboardInterrupt, which the context manager's exit also survives); returns the undo."""
    if threading.current_thread() is not threading.main_thread():
        return lambda: None

    owner = os.getpid()

    def handler(signum, frame):  # noqa: ARG001
        if os.getpid() != owner:
            # a forked helper (pyroute2 enters namespaces from a fork and stops it with SIGTERM):
            # it must die as it would have, never unwind into the run and tear the lab down
            signal.signal(signum, signal.SIG_DFL)
            os.kill(os.getpid(), signum)
            return
        raise Interrupted(signal.Signals(signum).name)

    old = {s: signal.signal(s, handler) for s in (signal.SIGTERM, signal.SIGHUP)}

    def undo() -> None:
        for s, h in old.items():
            signal.signal(s, h)

    return undo
