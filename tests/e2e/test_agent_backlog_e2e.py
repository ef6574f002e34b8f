"""End to end on real parts: a tbf-shaped veth in a network namespace, the real netdev
collector, the shipped rule packs (tuned by a site override), the agent's evaluation loop and
a real nats-server. The egress-backlog rule (NS-5) must fire and reach a NATS subscriber with
its evidence; a broken rule file dropped in while running must be rejected with its position
while the previous rules keep firing.

The sender sends a burst every half second that the shaper drains in about 0.3 s: a queue that
fills and drains, on a port sending at ~60 % of its shaping rate (a port sending at its shaping
rate with a full queue is NS-9's). ``SKEWD_TEST_NETNS_PREFIX`` / ``SKEWD_TEST_NET`` (three
octets) move the namespaces' names and subnet on a shared host.
"""
from __future__ import annotations

import asyncio
import os
import shutil
import socket
import threading
import time

import pytest

from skewd import wire
from skewd.agent.config import load_config
from skewd.agent.runner import Agent
from skewd.agent.scheduler import build_slots, collector_config_keys
from skewd.collectors.netdev.netns import socket_in_netns
from skewd.model import Finding, State
from skewd.natsutil import NatsConfig, connect
from skewd.rules.cli import PACKS

pyroute2 = pytest.importorskip("pyroute2")
from pyroute2 import IPRoute, netns  # noqa: E402

pytestmark = [
    pytest.mark.root,
    pytest.mark.timeout(120),
    pytest.mark.skipif(os.geteuid() != 0, reason="creating network namespaces needs root"),
]

NS_PREFIX = os.environ.get("SKEWD_TEST_NETNS_PREFIX", "skwe2e-")
NET = os.environ.get("SKEWD_TEST_NET", "10.213.9")

SITE = """\
required_engine_version: 1
rules:
  - id: NS-5-egress-backlog
    override: {params: replace, for: replace}
    params: {window: 4s, backlog_bytes: 8000}
    for: 2s
"""
BAD = "required_engine_version: 1\nrules:\n  - id: BROKEN\n    pathology: NS-5\n    scope: nic_port\n" \
      "    layer: network\n    expr: avg(netdev_qdisc_backlog_bytes, 5s) > > 1\n"


@pytest.fixture
def veth():
    tag = f"{os.getpid() % 100000}"
    ns_a, ns_b = f"{NS_PREFIX}{tag}-a", f"{NS_PREFIX}{tag}-b"
    if_a, if_b = f"skwea{tag}", f"skweb{tag}"
    netns.create(ns_a)
    netns.create(ns_b)
    try:
        with IPRoute(netns=ns_a, flags=0) as ia, IPRoute(netns=ns_b, flags=0) as ib:
            ia.link("add", ifname=if_a, kind="veth", peer={"ifname": if_b, "net_ns_fd": ns_b})
            a = ia.link_lookup(ifname=if_a)[0]
            b = ib.link_lookup(ifname=if_b)[0]
            ia.addr("add", index=a, address=f"{NET}.1", prefixlen=24)
            ib.addr("add", index=b, address=f"{NET}.2", prefixlen=24)
            ia.link("set", index=a, state="up")
            ib.link("set", index=b, state="up")
            # 2 mbit/s (250 kB/s) with a second of queue
            ia.tc("add", "tbf", a, 0x10000, rate="2mbit", burst=3000, latency="1s")
        yield ns_a, ns_b, if_a
    finally:
        for ns in (ns_a, ns_b):
            try:
                netns.remove(ns)
            except OSError:
                pass


def blast(ns: str, stop: threading.Event) -> None:
    """75 datagrams of 1000 bytes at once every 0.5 s from inside ``ns`` until stopped: ~78 kB
    that the 250 kB/s shaper drains in ~0.3 s, ~60 % of its rate."""
    s = socket_in_netns(ns)
    s.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 1 << 20)  # the whole burst reaches the qdisc
    payload = b"x" * 1000
    try:
        while not stop.is_set():
            for _ in range(75):
                try:
                    s.sendto(payload, (f"{NET}.2", 9))
                except OSError:
                    pass  # ENOBUFS when the qdisc is full: that is the fault we want
            time.sleep(0.5)
    finally:
        s.close()


async def wait_for(pred, timeout: float, step: float = 0.2):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        v = pred()
        if v:
            return v
        await asyncio.sleep(step)
    return None


async def test_tbf_backlog_fires_ns5_over_nats_and_bad_reload_keeps_old_rules(veth, nats_server, tmp_path):
    ns_a, ns_b, if_a = veth
    rules_dir = tmp_path / "rules"
    shutil.copytree(PACKS, rules_dir)
    (rules_dir / "zz-site.yaml").write_text(SITE)
    cfg = load_config(None, env={}, collector_keys=collector_config_keys(), overrides={
        "node": "e2e-node", "cluster": "e2e", "rules": [str(rules_dir)],
        "evaluation_interval": "500ms", "summary_interval": "1s", "reload": {"poll_interval": "500ms"},
        "nats": {"url": nats_server.url}, "spool": {"dir": str(tmp_path / "spool")},
        "metrics": {"listen": "127.0.0.1:0"},
        "collectors": {"netdev": {"netns": ns_a, "interfaces": [if_a], "interval": "500ms"},
                       **{n: {"enabled": False} for n in ("pkt", "rdma", "pcie", "gpu", "host", "vllm", "exporter")}},
    })
    received: list[Finding] = []
    nc = await connect(NatsConfig.from_dict({"url": nats_server.url}), initial_timeout=10)

    async def on_msg(msg):
        received.append(wire.decode_finding(msg.data))

    await nc.subscribe(wire.subject_filter(wire.MessageKind.FINDING, cluster="e2e"), cb=on_msg)
    agent = Agent(cfg, slots=build_slots(cfg, ["netdev"]))
    stop = asyncio.Event()
    task = asyncio.create_task(agent.run(stop))
    traffic_stop = threading.Event()
    sender = threading.Thread(target=blast, args=(ns_a, traffic_stop), daemon=True)
    try:
        await asyncio.wait_for(agent.started.wait(), 10)
        assert [s.name for s in agent.slots if s.active] == ["netdev"]
        sender.start()

        def firing():
            return [f for f in received if f.rule_id == "NS-5-egress-backlog" and f.state is State.FIRING]

        got = await wait_for(firing, 40)
        assert got, f"NS-5 never fired; received {[(f.rule_id, f.state.value) for f in received]}"
        f = got[0]
        assert f.node == "e2e-node" and f.entity == if_a and f.cluster == "e2e" and f.layer.value == "network"
        backlog = f.evidence["p50(netdev_qdisc_backlog_max_bytes, window)"]
        assert backlog is not None and backlog > 8000 and f.params["backlog_bytes"] == 8000
        assert "tc -s qdisc" in f.mitigation

        # a broken rule file is rejected with its position; the old rules keep evaluating
        (rules_dir / "bad.yaml").write_text(BAD)
        res = await wait_for(lambda: agent.last_reload if agent.last_reload and not agent.last_reload.ok else None, 10)
        assert res is not None, "the invalid rule file was not noticed"
        assert any(str(i).startswith(f"{rules_dir / 'bad.yaml'}:7:") and i.code.value == "E006" for i in res.issues)
        health = agent.health(time.time())
        assert not health.last_reload.ok and "bad.yaml:7:" in health.last_reload.error
        still = [a for a in agent.pipeline.engine.alerts() if a.rule_id == "NS-5-egress-backlog"]
        assert still and still[0].state is State.FIRING
        n_before = len(received)
        await asyncio.sleep(1.5)
        assert all(f.rule_id != "BROKEN" for f in received[n_before:])

        # the fault ends: the finding resolves and reaches the subscriber too
        traffic_stop.set()
        resolved = await wait_for(lambda: [x for x in received if x.rule_id == "NS-5-egress-backlog"
                                          and x.state is State.RESOLVED], 30)
        assert resolved and resolved[0].id == f.id
    finally:
        traffic_stop.set()
        stop.set()
        await asyncio.wait_for(task, 20)
        await nc.close()
