"""netdev collector: link counters and root-qdisc stats over rtnetlink, link speed from sysfs.

Netlink I/O runs on one private worker thread: pyroute2's synchronous ``IPRoute`` drives its
own asyncio loop and refuses to run on a thread whose loop is already running (the agent's),
so every pyroute2 call is handed to that worker and ``collect()`` works from any thread.
"""
from __future__ import annotations

import ctypes
import fcntl
import json
import socket
import struct
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, Callable, Mapping, Protocol, Sequence, TypeVar

from skewd.collectors.base import Availability, Collector, CollectorError, Status
from skewd.collectors.sysfs import read_str
from skewd.model import BatchBuilder, SampleBatch

from . import parse
from .catalogue import CATALOGUE
from .netns import netns_exists, netns_path, socket_in_netns

T = TypeVar("T")

SIOCETHTOOL = 0x8946
ETHTOOL_GSET = 0x00000001
_ETHTOOL_CMD_SIZE = 44  # struct ethtool_cmd


class NetlinkSource(Protocol):
    """What the collector needs from rtnetlink: messages in pyroute2's ``dump()`` dict form."""

    def links(self) -> list[dict[str, Any]]: ...

    def qdiscs(self) -> list[dict[str, Any]]: ...

    def close(self) -> None: ...


def _slim_link(msg: Any) -> dict[str, Any]:
    """The few attributes the parser reads, in ``dump()`` shape (a full dump costs ~2x)."""
    attrs = []
    for name in ("IFLA_IFNAME", "IFLA_OPERSTATE", "IFLA_CARRIER_CHANGES"):
        v = msg.get_attr(name)
        if v is not None:
            attrs.append([name, v])
    st = msg.get_attr("IFLA_STATS64")
    if st is not None:
        attrs.append(["IFLA_STATS64", {k: st.get(k) for k in parse.LINK_COUNTERS}])
    return {"index": msg["index"], "attrs": attrs}


def _slim_qdisc(msg: Any) -> dict[str, Any]:
    attrs: list[list[Any]] = [["TCA_KIND", msg.get_attr("TCA_KIND")]]
    st2 = msg.get_attr("TCA_STATS2")
    if st2 is not None:
        attrs.append(["TCA_STATS2", st2.dump()])
    st = msg.get_attr("TCA_STATS")
    if st is not None:
        attrs.append(["TCA_STATS", {k: st.get(k) for k in parse.QDISC_LEGACY}])
    return {"index": msg["index"], "parent": msg["parent"], "handle": msg["handle"], "attrs": attrs}


class PyrouteNetlink:
    """Live rtnetlink through pyroute2, optionally inside a named network namespace."""

    def __init__(self, netns: str | None = None) -> None:
        from pyroute2 import IPRoute  # imported here so a missing pyroute2 is a probe() finding

        # flags=0: never create the namespace (pyroute2's default is O_CREAT).
        self._ipr = IPRoute(netns=netns, flags=0) if netns else IPRoute()

    def links(self) -> list[dict[str, Any]]:
        return [_slim_link(m) for m in self._ipr.get_links()]

    def qdiscs(self) -> list[dict[str, Any]]:
        return [_slim_qdisc(m) for m in self._ipr.get_qdiscs()]

    def close(self) -> None:
        self._ipr.close()


class RecordedNetlink:
    """Replays ``links.json`` / ``qdiscs.json`` written from ``msg.dump()`` (fixtures, bundles)."""

    def __init__(self, directory: str | Path) -> None:
        d = Path(directory)
        self._links = json.loads((d / "links.json").read_text())
        self._qdiscs = json.loads((d / "qdiscs.json").read_text())

    def links(self) -> list[dict[str, Any]]:
        return self._links

    def qdiscs(self) -> list[dict[str, Any]]:
        return self._qdiscs

    def close(self) -> None:
        pass


def ethtool_speed(sock: socket.socket, ifname: str) -> int | None:
    """Link speed in Mb/s via SIOCETHTOOL/ETHTOOL_GSET on ``sock`` (its namespace decides)."""
    buf = ctypes.create_string_buffer(struct.pack("I", ETHTOOL_GSET), _ETHTOOL_CMD_SIZE)
    ifr = struct.pack("16sP", ifname.encode()[:15], ctypes.addressof(buf)).ljust(40, b"\0")
    try:
        fcntl.ioctl(sock.fileno(), SIOCETHTOOL, ifr)
    except OSError:
        return None
    lo, = struct.unpack_from("H", buf.raw, 12)
    hi, = struct.unpack_from("H", buf.raw, 28)
    return (hi << 16) | lo


class NetdevCollector(Collector):
    """Per-interface link counters, root egress qdisc statistics, speed and state.

    Config: ``interfaces`` (names or globs; default every interface but ``lo``) and
    ``netns`` (a name under /run/netns or a path such as /proc/<pid>/ns/net). Inside a
    namespace the speed comes from the ethtool ioctl on a socket opened in that namespace,
    because sysfs shows the namespace of whoever mounted it, not the one we are reading.
    """

    name = "netdev"
    catalogue = CATALOGUE
    default_interval = 1.0
    config_keys = frozenset({"interfaces", "netns"})

    def __init__(self, node: str, config: Mapping[str, Any] | None = None,
                 sys_root: str | Path = "/sys", proc_root: str | Path = "/proc",
                 source: NetlinkSource | None = None) -> None:
        super().__init__(node, config, sys_root, proc_root)
        ifs = self.config.get("interfaces")
        if ifs is not None and (isinstance(ifs, str) or not all(isinstance(i, str) for i in ifs)):
            raise ValueError("netdev: 'interfaces' must be a list of interface names or globs")
        self._patterns: Sequence[str] | None = list(ifs) if ifs else None
        self._want = parse.interface_filter(self._patterns)
        netns = self.config.get("netns")
        if netns is not None and not isinstance(netns, str):
            raise ValueError("netdev: 'netns' must be a namespace name or path")
        self.netns: str | None = netns or None
        self._injected = source
        self._source: NetlinkSource | None = source
        self._worker: ThreadPoolExecutor | None = None
        self._ethtool_sock: socket.socket | None = None

    # -- worker thread -----------------------------------------------------------------------
    def _run(self, fn: Callable[[], T]) -> T:
        if self._injected is not None:
            return fn()
        if self._worker is None:
            self._worker = ThreadPoolExecutor(max_workers=1, thread_name_prefix="netdev-netlink")
        return self._worker.submit(fn).result()

    def _open(self) -> NetlinkSource:
        if self._source is None:
            self._source = self._run(lambda: PyrouteNetlink(self.netns))
        return self._source

    # -- lifecycle ---------------------------------------------------------------------------
    def probe(self) -> Status:
        try:
            import pyroute2  # noqa: F401
        except ImportError:
            return Status(Availability.NEEDS_OPERATOR,
                          "pyroute2 is not installed: pip install pyroute2 (skewd depends on it)")
        if self.netns and self._injected is None and not netns_exists(self.netns):
            return Status(Availability.NEEDS_OPERATOR,
                          f"network namespace {self.netns!r} not found at {netns_path(self.netns)}: "
                          "fix 'netns' in the netdev config or create the namespace")
        try:
            src = self._open()
            names = sorted(parse.interface_names(self._run(src.links)).values())
        except Exception as e:  # probe never raises
            return Status(Availability.UNAVAILABLE, f"rtnetlink query failed: {e}")
        chosen = [n for n in names if self._want(n)]
        if self._patterns:
            missing = [p for p in self._patterns
                       if not any(parse.interface_filter([p])(n) for n in names)]
            if not chosen:
                return Status(Availability.NEEDS_OPERATOR,
                              f"none of the configured interfaces {self._patterns} exist"
                              f"{' in netns ' + repr(self.netns) if self.netns else ''}; "
                              f"present: {', '.join(names) or 'none'}")
            if missing:
                return Status(Availability.ACTIVE,
                              f"reading {', '.join(chosen)}; not present: {', '.join(missing)}")
        if not chosen:
            return Status(Availability.ABSENT, "no network interfaces besides lo")
        return Status(Availability.ACTIVE, f"reading {', '.join(chosen)}")

    def start(self) -> None:
        if self.netns and self._injected is None:
            try:
                self._ethtool_sock = socket_in_netns(self.netns)
            except OSError:
                self._ethtool_sock = None  # collect() reports the namespace problem
        try:
            self._open()
        except Exception:
            pass  # retried by collect(), which counts the error
        super().start()

    def stop(self) -> None:
        src, self._source = self._source, None
        if src is not None and src is not self._injected:
            try:
                self._run(src.close)
            except Exception:
                pass
        if self._injected is not None:
            self._source = self._injected
        if self._worker is not None:
            self._worker.shutdown(wait=True)
            self._worker = None
        if self._ethtool_sock is not None:
            self._ethtool_sock.close()
            self._ethtool_sock = None
        super().stop()

    # -- collection --------------------------------------------------------------------------
    def _speed_text(self, ifname: str) -> str | int | None:
        if self.netns and self._injected is None:
            if self._ethtool_sock is None:
                try:
                    self._ethtool_sock = socket_in_netns(self.netns)
                except OSError:
                    return None
            v = ethtool_speed(self._ethtool_sock, ifname)
            return None if v is None else (-1 if v == 0xFFFFFFFF else v)
        return read_str(self.sys_root / "class" / "net" / ifname / "speed")

    def collect(self, t: float) -> SampleBatch:
        try:
            src = self._open()
            links, qdiscs = self._run(lambda: (src.links(), src.qdiscs()))
        except Exception as e:
            self._drop_source()
            raise CollectorError(f"rtnetlink dump failed"
                                 f"{' in netns ' + repr(self.netns) if self.netns else ''}: {e}",
                                 stage="read") from e
        names = {i: n for i, n in parse.interface_names(links).items() if self._want(n)}
        samples = parse.link_samples(links, self._want)
        samples += parse.qdisc_samples(qdiscs, names)
        for ifname in sorted(names.values()):
            samples += parse.speed_samples(ifname, self._speed_text(ifname))
        b = BatchBuilder(self.node)
        for s in samples:
            b.add(t, s.entity, s.signal, s.value)
        return b.build()

    def _drop_source(self) -> None:
        """Forget a failed live socket so the next collect() reopens it (namespace re-created)."""
        if self._source is not None and self._source is not self._injected:
            src, self._source = self._source, None
            try:
                self._run(src.close)
            except Exception:
                pass
        if self._ethtool_sock is not None:
            self._ethtool_sock.close()
            self._ethtool_sock = None
