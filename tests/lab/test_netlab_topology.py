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
