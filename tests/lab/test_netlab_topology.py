"""The real-traffic lab's network: the switch port it names for a node's port is that port's
other end, so a fault put on the switch's queue (ingress drops) lands on the right node."""
from __future__ import annotations

import os
import re
import shutil
import subprocess

import pytest

from skewd.lab.netlab.topology import Topology, ns_exec

pytestmark = [
    pytest.mark.root,
    pytest.mark.skipif(os.geteuid() != 0, reason="building network namespaces needs root"),
    pytest.mark.skipif(shutil.which("ip") is None, reason="needs iproute2's ip command"),
]


def _peer_ifindex(ns: str, ifname: str) -> int:
    """The ifindex of a veth's other end, as ``ip -o link`` prints it (``name@ifN``)."""
    out = ns_exec(ns, "ip", "-o", "link", "show", "dev", ifname).stdout
    m = re.search(rf"\d+: {re.escape(ifname)}@if(\d+):", out)
    assert m, out
    return int(m.group(1))


def _ifindex(ns: str, ifname: str) -> int:
    return int(ns_exec(ns, "cat", f"/sys/class/net/{ifname}/ifindex").stdout)


@pytest.mark.parametrize("dedicated", [True, False])
def test_switch_port_is_the_other_end_of_the_nodes_port(dedicated: bool) -> None:
    prefix = os.environ.get("SKEWD_LAB_NETNS_PREFIX", "skwr-")
    topo = Topology(prefix, f"tp{int(dedicated)}", nodes=3, dedicated=dedicated)
    try:
        topo.build()
        for i in range(3):
            for iface in (["eth0", "eth1"] if dedicated else ["eth0"]):
                port = topo.switch_port(i, iface)
                assert _peer_ifindex(topo.switch, port) == _ifindex(topo.node(i), iface), (i, iface, port)
    finally:
        topo.teardown()
    left = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    assert topo.base not in left


@pytest.mark.parametrize("scenario", ["slow-link", "ingress-drops"])
def test_a_cleared_shaper_fault_leaves_the_port_as_it_was(scenario: str, tmp_path) -> None:
    """--fault-duration: clear() removes the qdisc apply() put on the node's port (or on the
    switch's end of it), and nothing else."""
    from skewd.lab.netlab import faults
    from skewd.lab.netlab.scenario import make_plan

    prefix = os.environ.get("SKEWD_LAB_NETNS_PREFIX", "skwr-")
    topo = Topology(prefix, f"fc{len(scenario)}", nodes=2, dedicated=False)
    plan = make_plan(scenario, 1, duration_s=300, nodes=2, overrides={"faulty_node": 1, "fault_duration_s": 60})
    ns, port = (topo.switch, topo.switch_port(1, "eth0")) if scenario == "ingress-drops" else (topo.node(1), "eth0")
    try:
        topo.build()
        before = faults.qdisc_stats(ns, port).split()[:2]
        faults.tc(ns, "qdisc", "replace", "dev", port, "root", "handle", "1:", "tbf", "rate", "100mbit",
                  "burst", "32k", "limit", "10000")
        assert "tbf" in faults.qdisc_stats(ns, port)
        faults.clear(plan, ns=topo.node(1), iface="eth0", ctl_file=tmp_path / "ctl", cgroup_name="unused",
                     switch_ns=topo.switch, switch_port=topo.switch_port(1, "eth0"))
        after = faults.qdisc_stats(ns, port)
        assert "tbf" not in after and after.split()[:2] == before
    finally:
        topo.teardown()
