"""Real-network lab: five serving hosts and a client in network namespaces behind a bridge,
real TCP token streams and UDP request uploads, real faults made with the kernel's qdiscs and
the senders' schedules - detected end to end by one skewd agent per host (the real netdev and
pkt collectors inside the host's namespace), a real nats-server, and the controller service.

Faults, one per host, at the same time (the fifth host is the healthy control):

- h0 shaped link: a tbf shaper slower than the host's token streams, which fill it (NS-9 against
  the shaping rate: a port sending at its shaper's rate with a queue is a full link, not NS-5);
- h1 egress drops: an htb shaper whose pfifo leaf holds 5 packets (NS-7);
- h2 egress jitter: the server's send schedule stalls and then releases tokens in clumps (NS-6);
- h3 ingress starvation: the client stops sending it requests, a trickle remains (NS-2, a
  cluster-scope rule the controller evaluates over the agents' summaries).

The shipped rule packs are used as they are. Every address lives in the namespaces this test
creates (10.77.0.0/24); namespaces are named ``skwlab-<pid>-*`` and always removed
(``SKEWD_TEST_NETNS_PREFIX`` and ``SKEWD_TEST_NET``, three octets, move them on a shared host).
"""
from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from skewd import wire
from skewd.agent.config import load_config
from skewd.agent.runner import Agent
from skewd.agent.scheduler import build_slots, collector_config_keys
from skewd.model import Finding, State
from skewd.natsutil import NatsConfig, connect
from skewd.rules.cli import PACKS

pyroute2 = pytest.importorskip("pyroute2")
from pyroute2 import IPRoute, netns  # noqa: E402

pytestmark = [
    pytest.mark.root,
    pytest.mark.timeout(420),
    pytest.mark.skipif(os.geteuid() != 0, reason="creating network namespaces and qdiscs needs root"),
    pytest.mark.skipif(not Path("/usr/sbin/ip").exists() and not Path("/sbin/ip").exists(),
                       reason="needs iproute2's ip to run the traffic processes inside the namespaces"),
]

HOSTS = 5
NET = os.environ.get("SKEWD_TEST_NET", "10.77.0")
NS_PREFIX = os.environ.get("SKEWD_TEST_NETNS_PREFIX", "skwlab-")
CLIENT_IP = f"{NET}.2"
HOST_IP = [f"{NET}.{10 + i}" for i in range(HOSTS)]
CLUSTER = "netlab"

# ---- traffic processes (run with `ip netns exec`, so each is a real separate process) ----------
SERVER = r'''
import json, os, random, socket, sys, threading, time
ctl, port = sys.argv[1], int(sys.argv[2])
def mode():
    try:
        return json.load(open(ctl)).get("mode", "steady")
    except (OSError, ValueError):
        return "steady"
def serve(c):
    c.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    c.settimeout(30)
    tok = b"data: " + b"x" * 480 + b"\n\n"
    try:
        while True:
            req = c.recv(256)
            if not req:
                return
            n = int(req.split()[1]) if req.startswith(b"GEN ") else 100
            next_t = time.monotonic()
            held = 0
            for i in range(n):
                m = mode()
                if m == "jitter" and random.random() < 0.05:
                    # the send path stalls (scheduler, IRQs; ~2.5 times a second, 30-100 ms, the
                    # fault lab's NS-6 range) while the engine keeps producing tokens on schedule:
                    # afterwards the tokens that piled up leave back to back until it has caught up
                    time.sleep(random.uniform(0.03, 0.1))
                next_t += 0.02
                d = next_t - time.monotonic()
                if d > 0:
                    time.sleep(d)
                elif m != "jitter":
                    # a healthy server paces each token from the previous one: when this loaded
                    # lab box (a dozen processes on 2 cores) wakes the thread late, it must not
                    # fake a send-path stall on every host by catching up back to back
                    next_t = time.monotonic()
                c.sendall(tok)
            c.sendall(b"data: [DONE]\n\n")
    except OSError:
        return
    finally:
        c.close()
s = socket.socket()
s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind(("0.0.0.0", port))
s.listen(64)
while True:
    c, _ = s.accept()
    threading.Thread(target=serve, args=(c,), daemon=True).start()
'''

CLIENT = r'''
import json, random, socket, sys, threading, time
ctl, hosts = sys.argv[1], sys.argv[2].split(",")
def weight(h):
    try:
        return float(json.load(open(ctl)).get(h, 1.0))
    except (OSError, ValueError):
        return 1.0
def streams(h, k):
    # token streams: ask for a generation, read it to the end, ask again
    while True:
        try:
            c = socket.create_connection((h, 8000), timeout=10)
            while True:
                if weight(h) < 0.5 and k > 0:
                    time.sleep(1.0)
                    continue
                c.sendall(b"GEN %d\n" % random.randint(80, 160))
                buf = b""
                while not buf.endswith(b"[DONE]\n\n"):
                    d = c.recv(65536)
                    if not d:
                        raise OSError("closed")
                    buf = buf[-64:] + d
        except OSError:
            time.sleep(0.5)
def uploads(h, k):
    # prompt uploads over UDP (the ingress volume): ~1.5 MB/s per host, 8 sessions
    u = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    u.bind(("0.0.0.0", 0))
    chunk = b"p" * 1200
    while True:
        w = weight(h)
        n = 20 if w >= 0.5 else 1
        for _ in range(n):
            try:
                u.sendto(chunk, (h, 9000 + k))
            except OSError:
                pass
        time.sleep(0.02 if w >= 0.5 else 0.5)
for h in hosts:
    for k in range(6):
        threading.Thread(target=streams, args=(h, k), daemon=True).start()
    for k in range(8):
        threading.Thread(target=uploads, args=(h, k), daemon=True).start()
while True:
    time.sleep(3600)
'''

SINK = r'''
import socket, sys, threading
def sink(p):
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    s.bind(("0.0.0.0", p))
    while True:
        s.recv(65536)
for k in range(8):
    threading.Thread(target=sink, args=(9000 + k,), daemon=True).start()
threading.Event().wait()
'''


class Lab:
    def __init__(self, tag: str, tmp: Path) -> None:
        self.tag = tag
        self.sw = f"{NS_PREFIX}{tag}-sw"
        self.cl = f"{NS_PREFIX}{tag}-cl"
        self.hosts = [f"{NS_PREFIX}{tag}-h{i}" for i in range(HOSTS)]
        self.tmp = tmp
        self.procs: list[subprocess.Popen] = []
        self.ctl_client = tmp / "lb.json"
        self.ctl_server = [tmp / f"server{i}.json" for i in range(HOSTS)]

    # -- topology ------------------------------------------------------------------------------
    def build(self) -> None:
        for ns in [self.sw, self.cl, *self.hosts]:
            netns.create(ns)
        with IPRoute(netns=self.sw, flags=0) as sw:
            sw.link("add", ifname="br0", kind="bridge")
            br = sw.link_lookup(ifname="br0")[0]
            sw.link("set", index=br, state="up")
        for i, (ns, ip) in enumerate([(self.cl, CLIENT_IP)] + list(zip(self.hosts, HOST_IP))):
            port = f"p{i}"
            with IPRoute(netns=ns, flags=0) as h:
                h.link("add", ifname="eth0", kind="veth", peer={"ifname": port, "net_ns_fd": self.sw})
                idx = h.link_lookup(ifname="eth0")[0]
                h.addr("add", index=idx, address=ip, prefixlen=24)
                h.link("set", index=idx, state="up")
                lo = h.link_lookup(ifname="lo")[0]
                h.link("set", index=lo, state="up")
            with IPRoute(netns=self.sw, flags=0) as sw:
                pidx = sw.link_lookup(ifname=port)[0]
                br = sw.link_lookup(ifname="br0")[0]
                sw.link("set", index=pidx, master=br, state="up")

    def run(self, ns: str, script: str, *args: str) -> None:
        p = subprocess.Popen(["ip", "netns", "exec", ns, sys.executable, "-c", script, *args],
                             stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
        self.procs.append(p)

    def start_traffic(self) -> None:
        self.ctl_client.write_text(json.dumps({}))
        for i, ns in enumerate(self.hosts):
            self.ctl_server[i].write_text(json.dumps({"mode": "steady"}))
            self.run(ns, SERVER, str(self.ctl_server[i]), "8000")
            self.run(ns, SINK)
        time.sleep(0.5)
        self.run(self.cl, CLIENT, str(self.ctl_client), ",".join(HOST_IP))

    # -- faults --------------------------------------------------------------------------------
    def tc(self, i: int, *args: str) -> None:
        # the tc binary (pyroute2's synchronous IPRoute refuses to run inside the test's event loop)
        subprocess.run(["ip", "netns", "exec", self.hosts[i], "tc", *args], check=True, capture_output=True,
                       timeout=10)

    def tbf_backlog(self, i: int) -> None:
        """Egress shaper slower than the streams: the streams fill it, packets wait in the qdisc."""
        self.tc(i, "qdisc", "add", "dev", "eth0", "root", "handle", "1:", "tbf", "rate", "512kbit",
                "burst", "4000", "latency", "2s")

    def pfifo_drops(self, i: int) -> None:
        """An htb shaper whose pfifo leaf holds five packets: the rest is dropped."""
        self.tc(i, "qdisc", "add", "dev", "eth0", "root", "handle", "1:", "htb", "default", "10")
        self.tc(i, "class", "add", "dev", "eth0", "parent", "1:", "classid", "1:10", "htb", "rate", "1200kbit",
                "ceil", "1200kbit")
        self.tc(i, "qdisc", "add", "dev", "eth0", "parent", "1:10", "handle", "10:", "pfifo", "limit", "5")

    def kernel_retransmits(self, i: int) -> int:
        out = subprocess.run(["ip", "netns", "exec", self.hosts[i], "cat", "/proc/net/snmp"], capture_output=True,
                             text=True, timeout=10).stdout.splitlines()
        tcp = [ln.split() for ln in out if ln.startswith("Tcp:")]
        return int(tcp[1][tcp[0].index("RetransSegs")]) if len(tcp) == 2 else 0

    def jitter(self, i: int) -> None:
        self.ctl_server[i].write_text(json.dumps({"mode": "jitter"}))

    def starve(self, i: int) -> None:
        self.ctl_client.write_text(json.dumps({HOST_IP[i]: 0.0}))

    # -- teardown ------------------------------------------------------------------------------
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
        for ns in [self.cl, *self.hosts, self.sw]:
            try:
                netns.remove(ns)
            except OSError:
                pass


@pytest.fixture
def lab(tmp_path):
    lab = Lab(str(os.getpid() % 100000), tmp_path)
    try:
        lab.build()
        lab.start_traffic()
        yield lab
    finally:
        lab.close()


def agent_for(i: int, lab: Lab, nats_url: str, tmp: Path) -> Agent:
    ns = lab.hosts[i]
    cfg = load_config(None, env={}, collector_keys=collector_config_keys(), overrides={
        "node": f"h{i}", "cluster": CLUSTER, "rules": [str(PACKS)],
        "evaluation_interval": "1s", "summary_interval": "1s",
        "labels": {},
        "nats": {"url": nats_url}, "spool": {"dir": str(tmp / f"spool-h{i}")},
        "metrics": {"listen": "127.0.0.1:0"},
        "collectors": {"netdev": {"netns": ns, "interfaces": ["eth0"]},
                       "pkt": {"netns": ns, "interface": "eth0"},
                       **{n: {"enabled": False} for n in ("rdma", "pcie", "gpu", "host", "vllm", "exporter")}},
    })
    return Agent(cfg, slots=build_slots(cfg, ["netdev", "pkt"]))


async def wait_for(pred, timeout: float, step: float = 1.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        v = pred()
        if v:
            return v
        await asyncio.sleep(step)
    return pred()


async def test_real_faults_detected_end_to_end(lab, nats_server, tmp_path):
    from skewd.controller.config import load_config as ctl_config
    from skewd.controller.service import Controller

    received: list[Finding] = []
    nc = await connect(NatsConfig.from_dict({"url": nats_server.url}), initial_timeout=10)

    async def on_msg(msg):
        received.append(wire.decode_finding(msg.data))

    await nc.subscribe(wire.subject_filter(wire.MessageKind.FINDING, cluster=CLUSTER), cb=on_msg)
    ctl = Controller(ctl_config(None, env={}, overrides={"cluster": CLUSTER, "nats": {"url": nats_server.url},
                                                          "controller_id": "netlab"}))
    agents = [agent_for(i, lab, nats_server.url, tmp_path) for i in range(HOSTS)]
    stop = asyncio.Event()
    await asyncio.wait_for(ctl.start(), 30)
    tasks = [asyncio.create_task(a.run(stop)) for a in agents]
    try:
        for a in agents:
            await asyncio.wait_for(a.started.wait(), 20)
            active = sorted(s.name for s in a.slots if s.active)
            assert active == ["netdev", "pkt"], f"{a.cfg.node}: collectors active {active}: " + \
                "; ".join(f"{s.name}: {s.status.reason}" for s in a.slots if not s.active)
        # healthy warm-up: the rules' windows fill with normal traffic first
        await asyncio.sleep(40)
        healthy_before = [f for f in received if f.state is State.FIRING]
        lab.tbf_backlog(0)
        lab.pfifo_drops(1)
        lab.jitter(2)
        lab.starve(3)
        t_fault = time.time()

        def firing(pid: str, node: str):
            # raised after the fault began (a loaded 2-core box makes the odd spurious TCP
            # retransmission during the warm-up; those are not what this test is about)
            return [f for f in received if f.pathology == pid and f.node == node and f.state is State.FIRING
                    and f.active_at >= t_fault - 1]

        expect = {("NS-9", "h0"), ("NS-7", "h1"), ("NS-6", "h2"), ("NS-2", "h3")}
        await wait_for(lambda: all(firing(p, n) for p, n in expect)
                       and any(f.entity == "eth0" for f in firing("NS-7", "h1")), 300, 2.0)
        seen = sorted({(f.rule_id, f.node, f.entity, round(f.active_at - t_fault)) for f in received
                       if f.state is State.FIRING})
        for pid, node in sorted(expect):
            got = firing(pid, node)
            assert got, f"{pid} did not fire on {node} within 300s; firing (rule, node, entity, s after fault): {seen}"
        ns9 = firing("NS-9", "h0")[0]
        # measured against the 512 kbit/s shaper (64 kB/s), not the veth's 10 Gb/s
        assert ns9.entity == "eth0" and ns9.evidence.get("netdev_qdisc_rate_bytes") == 64000
        assert not firing("NS-5", "h0"), "a full shaped link is NS-9's, not NS-5's"
        # the pfifo drops show on the qdisc (eth0); the flows they hit may retransmit first
        assert any(f.entity == "eth0" for f in firing("NS-7", "h1")), [f.entity for f in firing("NS-7", "h1")]
        ns6 = firing("NS-6", "h2")[0]
        assert ns6.entity.startswith(f"tcp {HOST_IP[2]}:8000>"), ns6.entity  # an egress token stream of h2
        ns2 = firing("NS-2", "h3")[0]
        assert ns2.scope.value == "cluster" and ns2.rule_id == "NS-2-ingress-starvation"
        # localisation: none of these pathologies is blamed on a host that does not have it
        injected = {"NS-9": "h0", "NS-7": "h1", "NS-6": "h2", "NS-2": "h3"}
        # nothing blamed on a host that does not have the fault: the qdisc, jitter and starvation
        # findings stay on their hosts (tbf tail-drops make h0 drop packets too: NS-7 there is real;
        # h1's htb runs its streams at its 1200 kbit/s ceiling with a queue: NS-9 there is real too)
        wrong = [(f.rule_id, f.node, f.entity) for f in received if f.state is State.FIRING
                 and f.active_at >= t_fault - 1 and f.rule_id in ("NS-9-link-saturation", "NS-7-egress-drops",
                                                                  "NS-6-egress-jitter", "NS-2-ingress-starvation")
                 and f.node != injected[f.pathology] and (f.rule_id, f.node) not in (("NS-7-egress-drops", "h0"),
                                                                                     ("NS-9-link-saturation", "h1"))]
        assert not wrong, f"misplaced findings: {wrong}"
        control = [(f.rule_id, f.entity) for f in received if f.node == "h4" and f.state is State.FIRING
                   and f.pathology in injected]
        # the control host's only tolerated finding is a flow retransmission alarm, and only when
        # its kernel did retransmit (spurious RTOs on this loaded 2-core box): nothing invented
        rtx = lab.kernel_retransmits(4)
        unexplained = [c for c in control if not (c[0] == "NS-7-egress-retransmits" and rtx > 0)]
        assert not unexplained, f"the healthy control host raised findings: {control} (kernel RetransSegs {rtx})"
        warmup = [(f.rule_id, f.node) for f in healthy_before if f.rule_id != "NS-7-egress-retransmits"]
        assert not warmup, f"findings during the healthy warm-up: {warmup}"
    finally:
        stop.set()
        await asyncio.gather(*[asyncio.wait_for(t, 20) for t in tasks], return_exceptions=True)
        await ctl.stop()
        await nc.close()
