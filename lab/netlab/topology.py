"""The lab's network: namespaces, veth pairs and bridges, built and always removed.

One switch namespace holds the bridges (``br0`` front end + NATS, ``br1`` collectives when
they get their own port); every node namespace has ``eth0`` on ``br0`` and, with a dedicated
collective port, ``eth1`` on ``br1``; the client namespace (front-end load) and the control
namespace (nats-server, controller, the lab's recorder) sit on ``br0``. Nothing is routed to
the host: each run is its own layer-2 island, so two runs (or the lead's lab beside a
helper's) never see each other even when their subnets overlap.

Names: every namespace is ``<prefix><tag>-<role>`` (the prefix is a parameter so labs of
several people can share a machine, and :func:`cleanup` removes leftovers by prefix only);
addresses come from one IPv4 subnet: its first /24 for ``eth0``, its second /24 for ``eth1``.
"""
from __future__ import annotations

import ipaddress
import os
import signal
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path

from .cgroups import cleanup_cgroups

DEFAULT_PREFIX = os.environ.get("SKEWD_LAB_NETNS_PREFIX", "skwr-")
DEFAULT_SUBNET = os.environ.get("SKEWD_LAB_SUBNET", "10.79.0.0/16")
#: host numbers inside each /24
CLIENT_HOST, CONTROL_HOST, NODE_HOST0 = 2, 3, 10
MAX_NODES = 8


class TopologyError(RuntimeError):
    """The lab's network could not be built (not root, no iproute2, a bad subnet or prefix)."""


def _run(*argv: str, check: bool = True, timeout: float = 15) -> subprocess.CompletedProcess:
    return subprocess.run(list(argv), capture_output=True, text=True, check=check, timeout=timeout)


def ns_exec(ns: str, *argv: str, check: bool = True, timeout: float = 15) -> subprocess.CompletedProcess:
    """Run a short command inside a namespace and return its output."""
    return _run("ip", "netns", "exec", ns, *argv, check=check, timeout=timeout)


def validate_prefix(prefix: str) -> str:
    """A prefix must be specific enough that cleanup by prefix never touches anyone else's
    namespaces: letters/digits and a trailing '-', at least 3 characters."""
    if len(prefix) < 3 or not prefix.endswith("-") or not prefix[:-1].replace("-", "").isalnum():
        raise TopologyError(f"netns prefix {prefix!r}: use letters/digits ending in '-', at least 3 characters "
                            "(e.g. 'skwr-'), so cleanup by prefix touches only this lab's namespaces")
    return prefix


def subnets(subnet: str) -> tuple[ipaddress.IPv4Network, ipaddress.IPv4Network]:
    """(front /24, collective /24) carved from ``subnet`` (which must hold at least two /24s)."""
    try:
        net = ipaddress.IPv4Network(subnet, strict=True)
    except ValueError as e:
        raise TopologyError(f"subnet {subnet!r}: {e}; give an IPv4 network such as 10.79.0.0/16") from None
    if net.prefixlen > 23:
        raise TopologyError(f"subnet {subnet}: needs at least a /23 (one /24 for eth0, one for eth1)")
    it = net.subnets(new_prefix=24)
    return next(it), next(it)


@dataclass
class Topology:
    """Owns the namespaces of one lab run: :meth:`build` makes them, :meth:`teardown` (idempotent,
    safe after a partial build) kills whatever still runs in them and deletes them."""

    prefix: str
    tag: str
    nodes: int
    dedicated: bool  # collectives on their own port (eth1) or on eth0 with everything else
    subnet: str = DEFAULT_SUBNET
    created: list[str] = field(default_factory=list)

    def __post_init__(self) -> None:
        validate_prefix(self.prefix)
        if not 2 <= self.nodes <= MAX_NODES:
            raise TopologyError(f"nodes {self.nodes}: the lab runs 2-{MAX_NODES} nodes")
        self.front, self.coll = subnets(self.subnet)

    # -- names and addresses ------------------------------------------------------------------
    @property
    def base(self) -> str:
        return f"{self.prefix}{self.tag}-"

    @property
    def switch(self) -> str:
        return self.base + "sw"

    @property
    def client(self) -> str:
        return self.base + "cl"

    @property
    def control(self) -> str:
        return self.base + "ctl"

    def node(self, i: int) -> str:
        return self.base + f"n{i}"

    @property
    def node_names(self) -> list[str]:
        return [self.node(i) for i in range(self.nodes)]

    def front_ip(self, host: int) -> str:
        return str(self.front.network_address + host)

    def node_ip(self, i: int) -> str:
        """The node's eth0 address (front end, NATS; collectives too on a shared port)."""
        return self.front_ip(NODE_HOST0 + i)

    def coll_ip(self, i: int) -> str:
        """Where the node's collectives go: eth1's address, or eth0's on a shared port."""
        return str(self.coll.network_address + NODE_HOST0 + i) if self.dedicated else self.node_ip(i)

    @property
    def coll_iface(self) -> str:
        return "eth1" if self.dedicated else "eth0"

    def switch_port(self, i: int, iface: str) -> str:
        """The switch namespace's end of node ``i``'s ``iface`` veth: its egress queue is what the
        node receives on that port (build() names the ports p0, p1, ... in this order)."""
        per_node = 2 if self.dedicated else 1
        return f"p{2 + i * per_node + (1 if iface == 'eth1' else 0)}"

    @property
    def client_ip(self) -> str:
        return self.front_ip(CLIENT_HOST)

    @property
    def control_ip(self) -> str:
        return self.front_ip(CONTROL_HOST)

    # -- build / teardown ---------------------------------------------------------------------
    def build(self) -> None:
        from pyroute2 import IPRoute, netns

        if os.geteuid() != 0:
            raise TopologyError("building network namespaces needs root")
        for ns in [self.switch, self.control, self.client, *self.node_names]:
            if ns in netns.listnetns():
                raise TopologyError(f"namespace {ns} exists already (a leftover run? "
                                    f"python -m skewd.lab.netlab cleanup --prefix {self.prefix})")
            netns.create(ns)
            self.created.append(ns)
            with IPRoute(netns=ns, flags=0) as ip:
                ip.link("set", index=ip.link_lookup(ifname="lo")[0], state="up")
        bridges = ["br0", "br1"] if self.dedicated else ["br0"]
        with IPRoute(netns=self.switch, flags=0) as sw:
            for br in bridges:
                sw.link("add", ifname=br, kind="bridge")
                sw.link("set", index=sw.link_lookup(ifname=br)[0], state="up")
        ports: list[tuple[str, str, str, str, int]] = [
            (self.control, "eth0", "br0", self.control_ip, 24),
            (self.client, "eth0", "br0", self.client_ip, 24),
        ]
        for i in range(self.nodes):
            ports.append((self.node(i), "eth0", "br0", self.node_ip(i), 24))
            if self.dedicated:
                ports.append((self.node(i), "eth1", "br1", self.coll_ip(i), 24))
        for k, (ns, ifname, br, addr, plen) in enumerate(ports):
            peer = f"p{k}"
            with IPRoute(netns=ns, flags=0) as ip:
                ip.link("add", ifname=ifname, kind="veth", peer={"ifname": peer, "net_ns_fd": self.switch})
                idx = ip.link_lookup(ifname=ifname)[0]
                ip.addr("add", index=idx, address=addr, prefixlen=plen)
                ip.link("set", index=idx, state="up")
            with IPRoute(netns=self.switch, flags=0) as sw:
                sw.link("set", index=sw.link_lookup(ifname=peer)[0],
                        master=sw.link_lookup(ifname=br)[0], state="up")

    def teardown(self) -> None:
        for ns in reversed(self.created):
            remove_namespace(ns)
        self.created.clear()


def namespace_pids(ns: str) -> list[int]:
    r = _run("ip", "netns", "pids", ns, check=False)
    return [int(p) for p in r.stdout.split() if p.isdigit()]


def remove_namespace(ns: str, grace: float = 3.0) -> None:
    """Kill what still runs in ``ns`` (TERM, then KILL after ``grace``) and delete it."""
    pids = namespace_pids(ns)
    for sig in (signal.SIGTERM, signal.SIGKILL):
        for p in pids:
            try:
                os.kill(p, sig)
            except ProcessLookupError:
                pass
        deadline = time.monotonic() + grace
        while pids and time.monotonic() < deadline:
            pids = [p for p in pids if Path(f"/proc/{p}").exists() and not _zombie(p)]
            if pids:
                time.sleep(0.1)
        if not pids:
            break
    _run("ip", "netns", "delete", ns, check=False)


def _zombie(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z"
    except (OSError, IndexError):
        return True


def list_namespaces(prefix: str) -> list[str]:
    r = _run("ip", "netns", "list", check=False)
    names = [line.split()[0] for line in r.stdout.splitlines() if line.strip()]
    return sorted(n for n in names if n.startswith(prefix))


def cleanup(prefix: str) -> list[str]:
    """Remove every namespace whose name starts with ``prefix`` (and what runs inside it), plus
    the lab's CPU cgroups of that prefix. Returns what was removed."""
    validate_prefix(prefix)
    gone = list_namespaces(prefix)
    # switches last: node namespaces hold the far ends of their veths
    for ns in sorted(gone, key=lambda n: n.endswith("-sw")):
        remove_namespace(ns)
    return gone + cleanup_cgroups(prefix)
