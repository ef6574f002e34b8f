"""Faults made by real means, and the pathology IDs each one should raise.

- ``straggler``: the rank's control file asks for extra compute every step (a sleep: the rank is
  late, its peers wait inside the all-reduce).
- ``straggler_cpu``: the rank's process gets a CPU quota (cgroup v2 ``cpu.max`` where the
  unified hierarchy has the cpu controller, else cgroup v1 ``cpu.cfs_quota_us``; this machine
  has only v1's). The quota is first sized from the rank's measured CPU use, then steered for up
  to ~20 s until the rank's step is the drawn lag longer: much of a rank's network work runs in
  softirq context that no quota charges, and the step time is steeply non-linear in the quota.
- ``slow_link``, ``deep_queue``: a tbf qdisc on the node's collective port, its rate a fraction
  of what the node's all-reduce needs (measured from the ranks' step logs just before onset),
  with a NIC-ring-sized (100 frames) or a deep (1-2 s) queue.
- ``drops``: htb at a little more than the need over a pfifo of 10-35 % of one step's burst in
  GSO super-packets (2-16; :func:`~.scenario.drops_queue_packets`): the average fits, each
  step's burst does not. Not tbf with a tiny byte limit: tbf splits a GSO super-packet
  that exceeds its bucket into segments and drops most of them, and TCP then made no progress
  at all for 15 s and more on this kernel (6.18; no retransmit counted) - a dead link, not a
  lossy one. A pfifo drops whole super-packets, as a NIC's ring does.
- ``ingress_drops``: the same htb and pfifo on the switch's port into the node's collective
  port (its egress is the node's ingress): what the node's ring predecessor (and, on a shared
  port, the front end) sends it is tail-dropped on the way in, a lossy switch port or cable in
  front of the node. Its peers resend; the node receives the resends (NS-4). The peers are
  healthy: a product that names the sender for the loss into its neighbour is wrong.

:data:`FAULTS` maps each kind to the IDs a correct product raises on the faulty node. Slow link:
NS-9 is the runbook's ID (utilisation against the link's rate), NS-5 where the rules split a
saturated port's queue off; drops: NS-7, and EW-6 (the east-west loss storm), which needs a
TCP path in the rules to fire on TCP collectives.
"""
from __future__ import annotations

import json
import os
import re
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .cgroups import CGROUP_ROOT, cgroup_cpu_mode
from .scenario import Plan, rank_wire_bytes_per_step
from .steps import measured_period
from .topology import ns_exec


@dataclass(frozen=True)
class FaultSpec:
    kind: str
    expected: tuple[str, ...]  # every pathology ID a correct product raises on the faulty node
    desc: str


FAULTS: dict[str, FaultSpec] = {f.kind: f for f in (
    FaultSpec("straggler", ("EW-1",), "rank computes longer every step (sleep)"),
    FaultSpec("straggler_cpu", ("EW-1",), "rank's CPU quota cut (cgroup)"),
    FaultSpec("slow_link", ("NS-9", "NS-5"), "collective port shaped below the collective's need"),
    FaultSpec("deep_queue", ("NS-5",), "collective port shaped, deep egress queue"),
    FaultSpec("drops", ("NS-7", "EW-6"), "collective port with a tiny queue: bursts tail-dropped"),
    FaultSpec("ingress_drops", ("NS-4",), "switch port into the collective port with a tiny queue: bursts "
                                          "tail-dropped on their way in"),
)}


class FaultError(RuntimeError):
    """A fault could not be applied (no cgroup cpu controller, tc refused)."""


# -- what the collective needs ------------------------------------------------------------------
def need_bits_per_s(plan: Plan, period_s: float) -> float:
    """The rate the node's port carries for its collective at the healthy step period."""
    return 8 * rank_wire_bytes_per_step(plan.nodes, plan.message_bytes) / period_s


# -- CPU quota -------------------------------------------------------------------------------
def _cpu_seconds(pid: int) -> float:
    f = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(f[11]) + int(f[12])) / os.sysconf("SC_CLK_TCK")


#: CFS bandwidth period for the quota: short enough that a throttled rank loses a few ms per
#: step rather than whole steps in lumps, long enough that the 1 ms minimum quota is 2 % of a CPU
CPU_PERIOD_US = 50_000


def limit_cpu(name: str, pid: int, fraction: float, period_us: int = CPU_PERIOD_US) -> dict[str, Any]:
    """Put ``pid`` in the cgroup ``name`` (made if missing) limited to ``fraction`` of one CPU."""
    mode = cgroup_cpu_mode()
    if mode is None:
        raise FaultError(f"no cgroup cpu controller under {CGROUP_ROOT} (v2 cgroup.controllers without 'cpu', no v1 "
                         "cpu hierarchy): run the 'straggler' scenario instead")
    kind, base = mode
    d = base / name
    d.mkdir(exist_ok=True)
    quota = max(1000, int(fraction * period_us))
    if kind == "v2":
        (base / "cgroup.subtree_control").write_text("+cpu")
        (d / "cpu.max").write_text(f"{quota} {period_us}")
    else:
        (d / "cpu.cfs_period_us").write_text(str(period_us))
        (d / "cpu.cfs_quota_us").write_text(str(quota))
    (d / "cgroup.procs").write_text(str(pid))
    return {"cgroup": str(d), "version": kind, "quota_us": quota, "period_us": period_us}


def steer_cpu(name: str, pid: int, step_log: Path, healthy_period: float, lag: float,
              rounds: int = 7, settle: float = 3.0) -> dict[str, Any]:
    """Throttle ``pid`` until its step period is ``healthy_period + lag`` (within -20/+50 %).

    A bisection between 2 % of a CPU and the rank's own use (a quota at or above it throttles
    nothing): the step time is steeply non-linear in the quota (a rank using 4 % took 83 ms at
    4 %, 157-191 ms at 2 %). Ends on the quota whose measured slow-down came closest to ``lag``,
    never one that did not slow the rank at all."""
    c0, t0 = _cpu_seconds(pid), time.monotonic()
    time.sleep(2)
    use = (_cpu_seconds(pid) - c0) / (time.monotonic() - t0)
    lo, hi = 0.02, max(0.021, use)
    fraction = min(hi * 0.95, max(lo, use * healthy_period / (healthy_period + lag)))
    onset = time.time()
    tried: list[dict[str, float]] = []
    info: dict[str, Any] = {}
    for _ in range(rounds):
        info = limit_cpu(name, pid, fraction)
        time.sleep(settle)
        now = time.time()
        p = measured_period(step_log, now - settle + 0.5, now) or healthy_period
        extra = p - healthy_period
        tried.append({"fraction": round(fraction, 4), "period_s": round(p, 4), "extra_s": round(extra, 4)})
        if 0.8 * lag <= extra <= 1.5 * lag:
            break
        if extra < 0.8 * lag:
            hi = fraction  # not slow enough: less CPU
        else:
            lo = fraction  # too slow: more CPU
        fraction = (lo + hi) / 2
    else:
        slowed = [t for t in tried if t["extra_s"] > 0.002] or tried
        best = min(slowed, key=lambda t: abs(t["extra_s"] - lag))
        fraction = best["fraction"]
        info = limit_cpu(name, pid, fraction)
    return {"means": f"cpu quota {fraction:.3f} of a core (rank used {use:.3f}); tried {tried}",
            "cpu_use": use, "onset": onset, "steering": tried, "healthy_period_s": healthy_period, **info}


# -- applying ------------------------------------------------------------------------------------
def tc(ns: str, *args: str) -> str:
    cmd = ["tc", *args]
    r = ns_exec(ns, *cmd, check=False)
    if r.returncode != 0:
        raise FaultError(f"{' '.join(cmd)} in {ns}: {r.stderr.strip()}")
    return " ".join(cmd)


def apply(plan: Plan, *, ns: str, iface: str, ctl_file: Path, step_log: Path, rank_pid: int,
          cgroup_name: str, switch_ns: str = "", switch_port: str = "") -> dict[str, Any]:
    """Start the plan's fault now; returns what was done (for truth.json). ``switch_ns`` and
    ``switch_port``: where the node's port ends on the switch (ingress faults)."""
    kind = plan.fault
    now = time.time()
    period = measured_period(step_log, now - 20, now)
    if kind == "straggler":
        assert plan.lag_s is not None
        ctl_file.write_text(json.dumps({"extra_sleep_s": plan.lag_s}))
        return {"means": f"extra compute {plan.lag_s * 1e3:.1f} ms per step (control file)",
                "healthy_period_s": period}
    if kind == "straggler_cpu":
        assert plan.lag_s is not None
        return steer_cpu(cgroup_name, rank_pid, step_log, period or plan.period_s, plan.lag_s)
    if kind in ("drops", "ingress_drops"):
        assert plan.rate_fraction is not None and plan.queue is not None
        if kind == "ingress_drops":
            if not (switch_ns and switch_port):
                raise FaultError("ingress_drops needs the switch namespace and the node's port on it")
            ns, iface = switch_ns, switch_port
        need = need_bits_per_s(plan, period or plan.period_s)
        rate = int(plan.rate_fraction * need)
        burst = max(32 * 1024, rate // 8 // 100)
        cmds = [tc(ns, "qdisc", "replace", "dev", iface, "root", "handle", "1:", "htb", "default", "10"),
                tc(ns, "class", "add", "dev", iface, "parent", "1:", "classid", "1:10", "htb", "rate", f"{rate}bit",
                   "ceil", f"{rate}bit", "burst", str(burst)),
                tc(ns, "qdisc", "add", "dev", iface, "parent", "1:10", "handle", "10:", "pfifo", *plan.queue.split())]
        return {"means": "; ".join(cmds), "need_bits_per_s": need, "rate_bits_per_s": rate, "healthy_period_s": period}
    if kind in ("slow_link", "deep_queue"):
        assert plan.rate_fraction is not None and plan.queue is not None
        need = need_bits_per_s(plan, period or plan.period_s)
        rate = int(plan.rate_fraction * need)
        # tbf needs a bucket of at least one timer tick's worth of bytes at the rate (HZ >= 100)
        burst = max(32 * 1024, rate // 8 // 100)
        cmd = tc(ns, "qdisc", "replace", "dev", iface, "root", "handle", "1:", "tbf", "rate", f"{rate}bit",
                 "burst", str(burst), *plan.queue.split())
        return {"means": cmd, "need_bits_per_s": need, "rate_bits_per_s": rate, "healthy_period_s": period}
    raise FaultError(f"unknown fault {kind!r}")


def clear(plan: Plan, *, ns: str, iface: str, ctl_file: Path, cgroup_name: str, switch_ns: str = "",
          switch_port: str = "") -> str:
    """End the plan's fault now (a fault with ``fault_duration_s``): what apply() did, undone.
    Returns what was done."""
    kind = plan.fault
    if kind == "straggler":
        ctl_file.write_text(json.dumps({"extra_sleep_s": 0.0}))
        return "extra compute 0 ms per step (control file)"
    if kind == "straggler_cpu":
        mode = cgroup_cpu_mode()
        if mode is None:
            raise FaultError("no cgroup cpu controller to lift the quota from")
        version, base = mode
        d = base / cgroup_name
        if version == "v2":
            (d / "cpu.max").write_text(f"max {CPU_PERIOD_US}")
        else:
            (d / "cpu.cfs_quota_us").write_text("-1")
        return f"cpu quota of {d} lifted"
    if kind in ("drops", "ingress_drops", "slow_link", "deep_queue"):
        if kind == "ingress_drops":
            ns, iface = switch_ns, switch_port
        return tc(ns, "qdisc", "del", "dev", iface, "root")
    raise FaultError(f"unknown fault {kind!r}")


def qdisc_stats(ns: str, iface: str) -> str:
    r = ns_exec(ns, "tc", "-s", "qdisc", "show", "dev", iface, check=False)
    return r.stdout


def qdisc_dropped(stats: str) -> int:
    """Packets the qdiscs of ``tc -s qdisc show`` output dropped: the largest ``dropped`` count
    (a classful root such as htb reports its leaves' drops again, so they are not added)."""
    return max((int(m.group(1)) for m in re.finditer(r"\(dropped (\d+),", stats)), default=0)


def kernel_counters(ns: str) -> dict[str, dict[str, int]]:
    """TcpExt (/proc/net/netstat) and Tcp (/proc/net/snmp) counters of a namespace."""
    out: dict[str, dict[str, int]] = {}
    for f in ("/proc/net/netstat", "/proc/net/snmp"):
        r = ns_exec(ns, "cat", f, check=False)
        lines = r.stdout.splitlines()
        for head, vals in zip(lines[::2], lines[1::2]):
            hk, vk = head.split(), vals.split()
            if hk and vk and hk[0] == vk[0] and hk[0] in ("TcpExt:", "Tcp:"):
                out[hk[0].rstrip(":")] = {k: int(v) for k, v in zip(hk[1:], vk[1:]) if v.lstrip("-").isdigit()}
    return out

