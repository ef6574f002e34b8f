"""Real TCP loss vs spurious resends, end to end: three nodes in network namespaces on a bridge
run a lock-step ring all-reduce over TCP (2 MB per step, 40 ms compute, as gloo does) and
request/response streams with idle gaps; one skewd agent per node watches it with its real
collectors (pkt capture, netdev and the host collector's TcpExt counters, each inside the node's
namespace) and the shipped rule packs.

- Healthy: the kernels resend segments (checked in each namespace's /proc/net/netstat) - tail-loss
  probes after a late ACK, fast retransmits after the veth reordering, which the receivers D-SACK,
  and on a loaded host resends of segments the veth backlog dropped. No loss rule may fire.
- Fault: a tbf with a 3000-byte limit on one node's egress (the issue's drop storm). NS-7 and
  EW-6-tcp-loss-storm must fire on that node, and neither on the two healthy ones.

Namespaces are ``skt-<pid>-*`` in 10.81.<k>.0/24 and always removed; the test takes about 80 s.
"""
from __future__ import annotations

import asyncio
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from skewd.agent.config import load_config
from skewd.agent.runner import Agent
from skewd.agent.scheduler import build_slots, collector_config_keys
from skewd.model import Finding, State
from skewd.rules.cli import PACKS

pytestmark = [
    pytest.mark.root,
    pytest.mark.timeout(240),
    pytest.mark.skipif(os.geteuid() != 0, reason="creating network namespaces and qdiscs needs root"),
    pytest.mark.skipif(shutil.which("ip") is None or shutil.which("tc") is None,
                       reason="needs iproute2's ip and tc to build the namespaces and the fault"),
]

NODES = 3
HEALTHY_S = 40.0  # the issue saw NS-7 fire on healthy nodes 20-70 s after start
FAULT_WAIT_S = 60.0
LOSS_RULES = ("NS-4-ingress-retransmits", "NS-7-egress-retransmits", "NS-7-egress-drops", "EW-6-tcp-loss-storm")

RING = r'''
import socket, sys, threading, time
rank, ips = int(sys.argv[1]), sys.argv[2].split(",")
n = len(ips)
ls = socket.socket()
ls.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
ls.bind((ips[rank], 7000))
ls.listen(4)
nxt = []
def dial():
    while True:
        try:
            nxt.append(socket.create_connection((ips[(rank + 1) % n], 7000)))
            return
        except OSError:
            time.sleep(0.1)
th = threading.Thread(target=dial)
th.start()
prv, _ = ls.accept()
th.join()
nxt = nxt[0]
for s in (nxt, prv):
    s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
chunk = b"x" * (2_000_000 // n)
def recv_exact(k):
    got = 0
    while got < k:
        d = prv.recv(min(1 << 20, k - got))
        if not d:
            raise SystemExit
        got += len(d)
while True:  # ring all-reduce: 2(n-1) chunk exchanges with the neighbours, then compute
    for _ in range(2 * (n - 1)):
        t = threading.Thread(target=nxt.sendall, args=(chunk,))
        t.start()
        recv_exact(len(chunk))
        t.join()
    time.sleep(0.04)
'''

RR_SERVER = r'''
import socket, threading
ls = socket.socket()
ls.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
ls.bind(("0.0.0.0", 8000))
ls.listen(16)
def serve(c):
    while True:
        r = c.recv(64)
        if not r:
            return
        c.sendall(b"y" * int(r.split()[0]))
while True:
    c, _ = ls.accept()
    threading.Thread(target=serve, args=(c,), daemon=True).start()
'''

RR_CLIENT = r'''
import random, socket, sys, threading, time
def client():
    while True:
        try:
            c = socket.create_connection((sys.argv[1], 8000))
            while True:  # a request, its response (200 B - 100 kB), an idle gap
                k = random.choice([200, 1500, 5000, 30000, 100000])
                c.sendall(b"%d\n" % k)
                got = 0
                while got < k:
                    d = c.recv(65536)
                    if not d:
                        raise OSError("closed")
                    got += len(d)
                time.sleep(random.uniform(0, 0.1))
        except OSError:
            time.sleep(0.5)
for _ in range(4):
    threading.Thread(target=client, daemon=True).start()
threading.Event().wait()
'''


class Lab:
    def __init__(self, tag: str) -> None:
        self.sw = f"skt-{tag}-sw"
        self.nodes = [f"skt-{tag}-n{i + 1}" for i in range(NODES)]
        k = 100 + int(tag) % 100
        self.ips = [f"10.81.{k}.{i + 1}" for i in range(NODES)]
        self.procs: list[subprocess.Popen] = []

    def sh(self, *args: str) -> None:
        subprocess.run(list(args), check=True, capture_output=True, timeout=15)

    def build(self) -> None:
        self.sh("ip", "netns", "add", self.sw)
        self.sh("ip", "-n", self.sw, "link", "add", "br0", "type", "bridge")
        self.sh("ip", "-n", self.sw, "link", "set", "br0", "up")
        for i, (ns, ip) in enumerate(zip(self.nodes, self.ips)):
            self.sh("ip", "netns", "add", ns)
            self.sh("ip", "-n", ns, "link", "add", "eth0", "type", "veth", "peer", "name", f"p{i}", "netns", self.sw)
            self.sh("ip", "-n", ns, "addr", "add", f"{ip}/24", "dev", "eth0")
            self.sh("ip", "-n", ns, "link", "set", "eth0", "up")
            self.sh("ip", "-n", ns, "link", "set", "lo", "up")
            self.sh("ip", "-n", self.sw, "link", "set", f"p{i}", "master", "br0", "up")

    def run(self, ns: str, script: str, *args: str) -> None:
        self.procs.append(subprocess.Popen(["ip", "netns", "exec", ns, sys.executable, "-c", script, *args],
                                           stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                                           start_new_session=True))

    def start_traffic(self) -> None:
        for rank, ns in enumerate(self.nodes):
            self.run(ns, RING, str(rank), ",".join(self.ips))
        self.run(self.nodes[2], RR_SERVER)
        time.sleep(0.3)
        self.run(self.nodes[0], RR_CLIENT, self.ips[2])

    def netstat(self, i: int) -> dict[str, int]:
        """TcpExt and Tcp counters of node i, read by a process inside its namespace."""
        out = subprocess.run(["ip", "netns", "exec", self.nodes[i], "cat", "/proc/net/netstat", "/proc/net/snmp"],
                             capture_output=True, text=True, check=True, timeout=10).stdout.splitlines()
        vals: dict[str, int] = {}
        for head, v in zip(out[::2], out[1::2]):
            sec = head.split(":")[0]
            if sec in ("TcpExt", "Tcp"):
                vals.update({(f"Tcp{k}" if sec == "Tcp" else k): int(x) for k, x in zip(head.split()[1:], v.split()[1:])})
        return vals

    def drop_storm(self, i: int) -> None:
        """The issue's fault: egress tbf whose 3000-byte limit drops most of what TCP sends."""
        self.sh("ip", "netns", "exec", self.nodes[i], "tc", "qdisc", "add", "dev", "eth0", "root", "tbf",
                "rate", "300mbit", "burst", "32kb", "limit", "3000")

    def close(self) -> None:
        for p in self.procs:
            try:
                os.killpg(p.pid, signal.SIGKILL)
            except OSError:
                pass
        for p in self.procs:
            try:
                p.wait(5)
            except subprocess.TimeoutExpired:
                pass
        for ns in [*self.nodes, self.sw]:
            subprocess.run(["ip", "netns", "del", ns], capture_output=True, timeout=15)


@pytest.fixture
def lab():
    lab = Lab(str(os.getpid() % 100000))
    try:
        lab.build()
        lab.start_traffic()
        yield lab
    finally:
        lab.close()


def agent_for(i: int, lab: Lab, tmp: Path) -> Agent:
    ns = lab.nodes[i]
    cfg = load_config(None, env={}, collector_keys=collector_config_keys(), overrides={
        "node": f"n{i + 1}", "cluster": "tcploss", "rules": [str(PACKS)],
        "evaluation_interval": "1s", "summary_interval": "1s", "labels": {},
        "spool": {"dir": str(tmp / f"spool-n{i + 1}")}, "metrics": {"listen": "127.0.0.1:0"},
        "collectors": {"netdev": {"netns": ns, "interfaces": ["eth0"]},
                       "pkt": {"netns": ns, "interface": "eth0"},
                       "host": {"netns": ns}},
    })
    return Agent(cfg, slots=build_slots(cfg, ["netdev", "pkt", "host"]))


class Watch:
    """Every finding transition and the per-flow spurious counts the agents produced."""

    def __init__(self) -> None:
        self.findings: list[Finding] = []
        self.spurious: dict[tuple[str, str], float] = {}
        self.packets: dict[str, float] = {}  # per node: frames its capture took (pkt_packets_total)

    def attach(self, agent: Agent) -> None:
        node = agent.cfg.node
        agent.findings.listeners.append(self.findings.append)
        watch = self

        class Flows:
            def on_batch(self, batch) -> None:
                for e, s, v in zip(batch.entity, batch.signal, batch.value):
                    if s == "pkt_flow_tcp_spurious_retransmits_total":
                        watch.spurious[(node, str(e))] = float(v)
                    elif s == "pkt_packets_total":
                        watch.packets[node] = max(watch.packets.get(node, 0.0), float(v))

            def on_tick(self, t, findings) -> None:
                pass

        agent.pipeline.add_sink(Flows())

    def firing(self, since: float = 0.0) -> list[Finding]:
        return [f for f in self.findings if f.state is State.FIRING and f.rule_id in LOSS_RULES
                and (f.fired_at or f.evaluated_at) >= since]


async def test_spurious_resends_stay_silent_and_a_drop_storm_fires_on_its_node(lab, tmp_path) -> None:
    agents = [agent_for(i, lab, tmp_path) for i in range(NODES)]
    watch = Watch()
    for a in agents:
        a.setup()
        watch.attach(a)
    stop = asyncio.Event()
    tasks = [asyncio.create_task(a.run(stop)) for a in agents]
    try:
        for a in agents:
            await asyncio.wait_for(a.started.wait(), 20)
            active = sorted(s.name for s in a.slots if s.active)
            assert active == ["host", "netdev", "pkt"], f"{a.cfg.node}: " + \
                "; ".join(f"{s.name}: {s.status.reason}" for s in a.slots)
        before = [lab.netstat(i) for i in range(NODES)]
        await asyncio.sleep(HEALTHY_S)
        after = [lab.netstat(i) for i in range(NODES)]
        delta = {k: sum(a[k] - b[k] for a, b in zip(after, before)) for k in
                 ("TCPLossProbes", "TCPDSACKRecv", "TcpRetransSegs", "TCPTimeouts", "TCPOrigDataSent")}
        # The healthy traffic really resent segments. What they were depends on the host, so the
        # failure messages show the kinds and nothing requires them: on an AMD EPYC VM most were
        # spurious (441 segments resent in 20 s on one node, 407 of them D-SACKed - TCPDSACKRecvSegs;
        # TLPs from none to hundreds), on an Intel Xeon VM most were real (225 resent in 40 s over
        # 3 nodes, 9 D-SACK events - TCPDSACKRecv, what this test reads - no TLP: the other resends
        # were veth backlog drops). Nor is an agent's D-SACK match required: on a connection set up
        # before the capture, a resend in mid-transfer within 3 ms of the flow's last progress is
        # reordering, as Wireshark says, unless two duplicate ACKs asked for it, and then neither it
        # nor its D-SACK counts (in CI the agents matched none of 22 D-SACK events in 90 s).
        # tests/collectors/test_pkt_dsack.py checks the matching on real captures of this lab.
        assert delta["TcpRetransSegs"] > 0, delta
        # silence means something only from agents that saw the traffic: every capture took the
        # ring's and the streams' packets (tens of thousands in 40 s)
        assert all(watch.packets.get(f"n{i + 1}", 0) >= 1000 for i in range(NODES)), watch.packets
        spurious = {k: v for k, v in watch.spurious.items() if v > 0}
        healthy = [(f.rule_id, f.node, f.entity) for f in watch.firing()]
        assert not healthy, f"loss rules fired on healthy traffic (kernel: {delta}; D-SACKed: {spurious}): {healthy}"

        t_fault = time.time()
        lab.drop_storm(0)
        want = {"NS-7-egress-retransmits", "EW-6-tcp-loss-storm"}

        def on_n1() -> set[str]:
            return {f.rule_id for f in watch.firing(t_fault) if f.node == "n1"
                    and (f.rule_id != "NS-7-egress-retransmits" or f.entity.startswith(f"tcp {lab.ips[0]}:"))}

        deadline = time.monotonic() + FAULT_WAIT_S
        while time.monotonic() < deadline and not want <= on_n1():
            await asyncio.sleep(1.0)
        got = sorted({(f.rule_id, f.node, f.entity, round((f.fired_at or 0) - t_fault)) for f in watch.firing(t_fault)})
        assert want <= on_n1(), f"{sorted(want - on_n1())} not firing on n1 {FAULT_WAIT_S:.0f} s after the fault: {got}"
        # nothing blamed on the healthy nodes, except that they saw n1's resends arrive (NS-4,
        # loss upstream of them, on a flow whose sender is n1)
        wrong = [(f.rule_id, f.node, f.entity) for f in watch.firing(t_fault) if f.node != "n1"
                 and not (f.rule_id == "NS-4-ingress-retransmits" and f.entity.startswith(f"tcp {lab.ips[0]}:"))]
        assert not wrong, f"loss findings on healthy nodes: {wrong} (all: {got})"
    finally:
        stop.set()
        await asyncio.gather(*[asyncio.wait_for(t, 20) for t in tasks], return_exceptions=True)
