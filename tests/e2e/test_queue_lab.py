"""Egress queues under real lock-step traffic, detected by real agents (issue 19, item 5).

Namespaces on a bridge; two rings of three ranks each run a plain-Python lock-step all-reduce
over TCP (35 ms of "compute", then a ring all-reduce of 1.5 MB: 2(N-1) phases of sending a
chunk to the next rank while receiving one from the previous; every rank waits for the slowest,
as gloo and NCCL do), and one host pushes a bulk TCP flow to a sink. One skewd agent per host,
its real netdev collector inside the host's namespace (sampler thread included), the shipped
rule packs, a real nats-server; findings are read from NATS.

Every ring port starts behind a 3 Gbit/s tbf: a fast link with a real queue that fills a little
in each step and drains within a millisecond or two (the healthy near miss). Then:

- (a) healthy first: no NS-5 / NS-9 / NS-7 finding on any ring host during the warm-up;
- (b) a1's shaper drops to 300 Mbit/s with a deep queue, below what its ring needs in a step's
  burst: the queue fills in every step and drains while the ranks compute, the ring's steps
  slow, the port stays under NS-9's 85 % of the shaping rate: NS-5 on a1 only;
- (c) b1's shaper keeps a 3000-byte limit (two frames): NS-7-egress-drops on b1 only;
- (d) c0 (no lock-step) sends a bulk flow through a 100 Mbit/s tbf on a 10 Gb/s veth: NS-9
  against the shaping rate (1 % of the PHY speed), on c0 only, and no NS-5 there.

Namespaces are named ``SKEWD_TEST_NETNS_PREFIX`` (default ``skwq-``) + pid + host and always
removed; addresses live in ``SKEWD_TEST_NET`` (three octets, default 10.78.0) inside them.
"""
from __future__ import annotations

import asyncio
import os
import signal
import statistics
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

pytestmark = [
    pytest.mark.root,
    pytest.mark.timeout(170),
    pytest.mark.skipif(os.geteuid() != 0, reason="creating network namespaces and qdiscs needs root"),
    pytest.mark.skipif(not Path("/usr/sbin/ip").exists() and not Path("/sbin/ip").exists(),
                       reason="needs iproute2's ip and tc to build the lab and shape its ports"),
]

PREFIX = os.environ.get("SKEWD_TEST_NETNS_PREFIX", "skwq-")
NET = os.environ.get("SKEWD_TEST_NET", "10.78.0")
CLUSTER = "queuelab"
RINGS = {"a": ["a0", "a1", "a2"], "b": ["b0", "b1", "b2"]}
HOSTS = [*RINGS["a"], *RINGS["b"], "c0", "c1"]
IP = {h: f"{NET}.{10 + i}" for i, h in enumerate(HOSTS)}
AGENTS = [*RINGS["a"], *RINGS["b"], "c0"]
MESSAGE, COMPUTE = 1_500_000, 0.035
RULES = ("NS-5-egress-backlog", "NS-9-link-saturation", "NS-7-egress-drops")

RING = r'''
import socket, sys, threading, time, queue
rank, ips, size, compute, log, port = int(sys.argv[1]), sys.argv[2].split(","), int(sys.argv[3]), float(sys.argv[4]), sys.argv[5], int(sys.argv[6])
world = len(ips); chunk = size // world
srv = socket.socket(); srv.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
srv.bind((ips[rank], port)); srv.listen(1)
nxt = None
while nxt is None:
    try:
        nxt = socket.create_connection((ips[(rank + 1) % world], port), timeout=2)
    except OSError:
        time.sleep(0.1)
prev, _ = srv.accept()
for s in (nxt, prev):
    s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    s.settimeout(60)
payload, buf = b"\x01" * chunk, bytearray(chunk)
jobs, done = queue.Queue(), queue.Queue()
def sender():
    while True:
        jobs.get(); nxt.sendall(payload); done.put(1)
threading.Thread(target=sender, daemon=True).start()
f = open(log, "w", buffering=1)
k = 0
while True:
    t0 = time.monotonic()
    time.sleep(compute)
    for _ in range(2 * (world - 1)):
        jobs.put(1)
        mv, got = memoryview(buf), 0
        while got < chunk:
            n = prev.recv_into(mv[got:])
            if not n:
                sys.exit(0)
            got += n
        done.get()
    f.write(f"{k} {time.time():.3f} {time.monotonic() - t0:.4f}\n")
    k += 1
'''

BULK = r'''
import socket, sys, time
mode, ip = sys.argv[1], sys.argv[2]
if mode == "sink":
    s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    s.bind((ip, 29700)); s.listen(1)
    c, _ = s.accept()
    while c.recv(1 << 20):
        pass
else:
    for _ in range(100):
        try:
            c = socket.create_connection((ip, 29700), timeout=2)
            break
        except OSError:
            time.sleep(0.1)
    buf = b"b" * (1 << 20)
    while True:
        c.sendall(buf)
'''


class QueueLab:
    def __init__(self, tmp: Path) -> None:
        tag = str(os.getpid() % 100000)
        self.ns = {h: f"{PREFIX}{tag}-{h}" for h in HOSTS}
        self.sw = f"{PREFIX}{tag}-sw"
        self.tmp = tmp
        self.procs: list[subprocess.Popen] = []

    def sh(self, *argv: str) -> None:
        subprocess.run(argv, check=True, capture_output=True, timeout=15)

    def tc(self, host: str, *args: str) -> None:
        self.sh("tc", "-n", self.ns[host], *args)

    def build(self) -> None:
        self.sh("ip", "netns", "add", self.sw)
        self.sh("ip", "-n", self.sw, "link", "add", "br0", "type", "bridge")
        self.sh("ip", "-n", self.sw, "link", "set", "br0", "up")
        for i, h in enumerate(HOSTS):
            ns = self.ns[h]
            self.sh("ip", "netns", "add", ns)
            self.sh("ip", "link", "add", "eth0", "netns", ns, "type", "veth", "peer", "name", f"p{i}",
                    "netns", self.sw)
            self.sh("ip", "-n", ns, "addr", "add", f"{IP[h]}/24", "dev", "eth0")
            self.sh("ip", "-n", ns, "link", "set", "eth0", "up")
            self.sh("ip", "-n", ns, "link", "set", "lo", "up")
            self.sh("ip", "-n", self.sw, "link", "set", f"p{i}", "master", "br0", "up")

    def run(self, host: str, script: str, *args: str) -> None:
        p = subprocess.Popen(["ip", "netns", "exec", self.ns[host], sys.executable, "-c", script, *args],
                             stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
        self.procs.append(p)

    def step_log(self, host: str) -> Path:
        return self.tmp / f"steps-{host}.log"

    def start(self) -> None:
        for ring, hosts in RINGS.items():
            for h in hosts:  # the healthy port: a fast link with a real queue
                self.tc(h, "qdisc", "add", "dev", "eth0", "root", "handle", "1:", "tbf", "rate", "3gbit",
                        "burst", "256k", "latency", "100ms")
            ips = ",".join(IP[h] for h in hosts)
            for rank, h in enumerate(hosts):
                self.run(h, RING, str(rank), ips, str(MESSAGE), str(COMPUTE), str(self.step_log(h)), "29611")
        self.tc("c0", "qdisc", "add", "dev", "eth0", "root", "handle", "1:", "tbf", "rate", "100mbit",
                "burst", "32k", "latency", "500ms")
        self.run("c1", BULK, "sink", IP["c1"])
        self.run("c0", BULK, "send", IP["c1"])

    def steps(self, host: str, since: float, until: float) -> list[float]:
        """Step durations (s) rank ``host`` logged between two wall-clock times."""
        out = []
        for line in self.step_log(host).read_text().splitlines():
            k, t, d = line.split()
            if since <= float(t) <= until:
                out.append(float(d))
        return out

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
        for ns in [*self.ns.values(), self.sw]:
            subprocess.run(["ip", "netns", "del", ns], capture_output=True)


@pytest.fixture
def lab(tmp_path):
    lab = QueueLab(tmp_path)
    try:
        lab.build()
        lab.start()
        yield lab
    finally:
        lab.close()


def agent_for(host: str, lab: QueueLab, nats_url: str, tmp: Path) -> Agent:
    cfg = load_config(None, env={}, collector_keys=collector_config_keys(), overrides={
        "node": host, "cluster": CLUSTER, "rules": [str(PACKS)],
        "evaluation_interval": "1s", "summary_interval": "1s", "labels": {},
        "nats": {"url": nats_url}, "spool": {"dir": str(tmp / f"spool-{host}")},
        "metrics": {"listen": "127.0.0.1:0"},
        "collectors": {"netdev": {"netns": lab.ns[host], "interfaces": ["eth0"]},
                       **{n: {"enabled": False} for n in ("pkt", "rdma", "pcie", "gpu", "host", "vllm", "exporter")}},
    })
    return Agent(cfg, slots=build_slots(cfg, ["netdev"]))


async def wait_for(pred, timeout: float, step: float = 1.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if pred():
            return True
        await asyncio.sleep(step)
    return bool(pred())


async def test_lock_step_queues_are_found_on_the_right_host(lab, nats_server, tmp_path):
    received: list[Finding] = []
    nc = await connect(NatsConfig.from_dict({"url": nats_server.url}), initial_timeout=10)

    async def on_msg(msg):
        received.append(wire.decode_finding(msg.data))

    await nc.subscribe(wire.subject_filter(wire.MessageKind.FINDING, cluster=CLUSTER), cb=on_msg)
    agents = [agent_for(h, lab, nats_server.url, tmp_path) for h in AGENTS]
    stop = asyncio.Event()
    tasks = [asyncio.create_task(a.run(stop)) for a in agents]

    def firing(rule: str | None = None, since: float = 0.0) -> set[tuple[str, str]]:
        return {(f.rule_id, f.node) for f in received if f.state is State.FIRING and f.rule_id in RULES
                and (rule is None or f.rule_id == rule) and f.active_at >= since}

    try:
        for a in agents:
            await asyncio.wait_for(a.started.wait(), 20)
            assert [s.name for s in a.slots if s.active] == ["netdev"], a.cfg.node
        # (a) healthy: every ring stepping behind its fast shaper, nothing fires on a ring host
        await asyncio.sleep(25)
        t_fault = time.time()
        healthy = {(r, n) for r, n in firing() if n != "c0"}
        assert not healthy, f"healthy ring hosts raised queue findings: {healthy}"
        before = lab.steps("a0", t_fault - 15, t_fault)
        assert len(before) > 50, "ring a did not step during the warm-up"
        # (b) a1: below what its ring needs in a burst, a deep queue; (c) b1: a two-frame queue.
        # A new qdisc, not `tc qdisc replace`: changing a tbf in place to a 32 kB bucket leaves the
        # 64 kB GSO packets already queued bigger than the bucket, and that queue never moves again
        # (seen here: 748 kB stuck, overlimits rising, nothing sent; NS-5 rightly fired on it)
        for host, shaper in (("a1", ("rate", "300mbit", "burst", "32k", "latency", "1s")),
                             ("b1", ("rate", "1gbit", "burst", "32k", "limit", "3000"))):
            lab.tc(host, "qdisc", "del", "dev", "eth0", "root")
            lab.tc(host, "qdisc", "add", "dev", "eth0", "root", "handle", "1:", "tbf", *shaper)
        want = {("NS-5-egress-backlog", "a1"), ("NS-7-egress-drops", "b1"), ("NS-9-link-saturation", "c0")}
        await wait_for(lambda: want <= firing(), 90, 2.0)
        got = firing()
        assert want <= got, f"missing {sorted(want - got)}; firing: {sorted(got)}"
        assert got == want, f"queue findings on hosts without that fault: {sorted(got - want)}"

        after = lab.steps("a0", t_fault + 10, time.time())
        slow, fast = statistics.median(after), statistics.median(before)
        assert slow > 1.5 * fast, f"a1's shaper did not slow ring a's steps ({fast:.3f} -> {slow:.3f} s)"
        ns5 = next(f for f in received if f.rule_id == "NS-5-egress-backlog" and f.state is State.FIRING)
        ev = ns5.evidence
        assert ns5.entity == "eth0"
        assert ev["p50(netdev_qdisc_delay_max_seconds, window)"] > 0.003
        assert ev["avg(netdev_qdisc_busy_ratio, window)"] >= 0.1
        # what made it NS-5 and not NS-9: the port idles while the ranks compute
        assert ev["netdev_qdisc_rate_bytes"] == 37.5e6  # 300 Mbit/s, read from the tbf
        util = ev["rate(netdev_tx_bytes_total, window)"] / ev["netdev_qdisc_rate_bytes"]
        assert 0.2 < util <= 0.85, util
        ns9 = next(f for f in received if f.rule_id == "NS-9-link-saturation" and f.state is State.FIRING)
        assert ns9.entity == "eth0"
        assert ns9.evidence["netdev_qdisc_rate_bytes"] == 12.5e6  # 100 Mbit/s on a 10 Gb/s veth
        assert ns9.evidence["netdev_link_speed_bytes"] == 1.25e9
    finally:
        stop.set()
        await asyncio.gather(*[asyncio.wait_for(t, 20) for t in tasks], return_exceptions=True)
        await nc.close()
