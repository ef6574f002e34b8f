"""netdev collector: link counters and root-qdisc stats over rtnetlink, link speed from sysfs.

rtnetlink is read over a plain ``AF_NETLINK`` socket and only the attributes netdev reports
are decoded (:mod:`.rtnl`): a full pyroute2 decode of every link and qdisc each second was a
quarter of the agent's CPU, and importing pyroute2 about 12 MiB of its RSS. Inside a network
namespace the socket is created on a thread that joined it (:mod:`.netns`), which is all
pyroute2's ``netns=`` did for us. Between collections a thread samples the root queues
(:mod:`.sampler`, :mod:`.backlog`): lock-step traffic fills and drains them within a step.
"""
from __future__ import annotations

import ctypes
import fcntl
import json
import os
import socket
import struct
import threading
import time
from pathlib import Path
from typing import Any, Mapping, Protocol, Sequence

import numpy as np

from skewd.collectors.base import Availability, Collector, CollectorError, Status
from skewd.model import SampleBatch

from . import parse, rtnl
from .backlog import QueueBook, queue_samples
from .catalogue import CATALOGUE
from .netns import netns_exists, netns_path, socket_in_netns
from .sampler import QdiscSampler, open_rtnl

NETLINK_ROUTE = 0
SIOCETHTOOL = 0x8946
ETHTOOL_GSET = 0x00000001
_ETHTOOL_CMD_SIZE = 44  # struct ethtool_cmd


class NetlinkSource(Protocol):
    """What the collector needs from rtnetlink: messages in pyroute2's ``dump()`` dict form
    (the live socket decodes only the attributes :mod:`.parse` reads, in that shape)."""

    def links(self) -> list[dict[str, Any]]: ...

    def qdiscs(self) -> list[dict[str, Any]]: ...

    def classes(self, ifindex: int) -> list[dict[str, Any]]: ...

    def close(self) -> None: ...


class RtnlSocket:
    """Live rtnetlink over a plain ``AF_NETLINK`` socket, optionally opened inside a network
    namespace (a socket keeps the namespace it was created in). Each call is one dump; only
    the attributes netdev reads are decoded (:mod:`.rtnl`). Safe to call from any thread."""

    RECV_SIZE = 1 << 16  # the kernel fills dump replies up to 32 KiB

    def __init__(self, netns: str | None = None, timeout: float = 5.0) -> None:
        family, kind = socket.AF_NETLINK, socket.SOCK_RAW
        self._sock = (socket_in_netns(netns, family, kind, NETLINK_ROUTE) if netns
                      else socket.socket(family, kind, NETLINK_ROUTE))
        try:
            self._sock.settimeout(timeout)
            self._sock.bind((0, 0))
        except BaseException:
            self._sock.close()
            raise
        self._seq = 0
        self._lock = threading.Lock()

    def _dump(self, msg_type: int, ifindex: int = 0) -> list[tuple[int, memoryview]]:
        with self._lock:
            self._seq = (self._seq + 1) & 0xFFFFFFFF
            seq = self._seq
            self._sock.sendall(rtnl.dump_request(msg_type, seq, ifindex))
            out: list[tuple[int, memoryview]] = []
            while True:
                msgs, done = rtnl.messages(self._sock.recv(self.RECV_SIZE), seq)
                out += msgs
                if done:
                    return out

    def links(self) -> list[dict[str, Any]]:
        return rtnl.decode_links(self._dump(rtnl.RTM_GETLINK))

    def qdiscs(self) -> list[dict[str, Any]]:
        return rtnl.decode_qdiscs(self._dump(rtnl.RTM_GETQDISC), roots_only=True)

    def classes(self, ifindex: int) -> list[dict[str, Any]]:
        return rtnl.decode_classes(self._dump(rtnl.RTM_GETTCLASS, ifindex))

    def close(self) -> None:
        self._sock.close()


class RecordedNetlink:
    """Replays ``links.json`` / ``qdiscs.json`` (and ``classes.json`` when recorded) written
    from ``msg.dump()`` (fixtures, bundles)."""

    def __init__(self, directory: str | Path) -> None:
        d = Path(directory)
        self._links = json.loads((d / "links.json").read_text())
        self._qdiscs = json.loads((d / "qdiscs.json").read_text())
        cls = d / "classes.json"
        self._classes = json.loads(cls.read_text()) if cls.exists() else []

    def links(self) -> list[dict[str, Any]]:
        return self._links

    def qdiscs(self) -> list[dict[str, Any]]:
        return self._qdiscs

    def classes(self, ifindex: int) -> list[dict[str, Any]]:
        return [c for c in self._classes if int(c.get("index", -1)) == ifindex]

    def close(self) -> None:
        pass


class RecordedWire:
    """Replays raw rtnetlink replies (``links.nl`` / ``qdiscs.nl`` / ``classes.nl`` when
    recorded) through the live decoder."""

    def __init__(self, directory: str | Path) -> None:
        d = Path(directory)
        self._links = (d / "links.nl").read_bytes()
        self._qdiscs = (d / "qdiscs.nl").read_bytes()
        cls = d / "classes.nl"
        self._classes = cls.read_bytes() if cls.exists() else b""

    def links(self) -> list[dict[str, Any]]:
        return rtnl.decode_links(rtnl.messages(self._links, None)[0])

    def qdiscs(self) -> list[dict[str, Any]]:
        return rtnl.decode_qdiscs(rtnl.messages(self._qdiscs, None)[0], roots_only=True)

    def classes(self, ifindex: int) -> list[dict[str, Any]]:
        return [c for c in rtnl.decode_classes(rtnl.messages(self._classes, None)[0]) if c["index"] == ifindex]

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


def _batch(node: str, t: float, samples: list[parse.Sample]) -> SampleBatch:
    """Samples → one batch, column by column (~100 samples a second per host)."""
    n = len(samples)
    ent, sig = np.empty(n, dtype=object), np.empty(n, dtype=object)
    nodes = np.empty(n, dtype=object)
    nodes[:] = node
    if n:
        e, g, v = zip(*samples)
        ent[:], sig[:] = e, g
    else:
        v = ()
    return SampleBatch(np.full(n, t, dtype=np.float64), nodes, ent, sig, np.array(v, dtype=np.float64))


#: root-qdisc samples per second between collections (see :mod:`.sampler` for the cost)
DEFAULT_QDISC_SAMPLE_HZ = 20.0
MAX_QDISC_SAMPLE_HZ = 200.0


class NetdevCollector(Collector):
    """Per-interface link counters, root egress qdisc statistics, shaping rate, speed, state,
    and the egress queue's peak/mean/busy share/delay between collections.

    Config: ``interfaces`` (names or globs; default every interface but ``lo``),
    ``netns`` (a name under /run/netns or a path such as /proc/<pid>/ns/net) and
    ``qdisc_sample_hz`` (root-queue samples per second between collections, default 20;
    0 = only the collection's own dump). Inside a namespace the speed comes from the ethtool
    ioctl on a socket opened in that namespace, because sysfs shows the namespace of whoever
    mounted it, not the one we are reading.
    """

    name = "netdev"
    catalogue = CATALOGUE
    default_interval = 1.0
    config_keys = frozenset({"interfaces", "netns", "qdisc_sample_hz"})
    config_docs = {
        "interfaces": ("every interface but `lo`", "names or shell globs (`[\"eth*\", \"ens1f0np0\"]`)"),
        "netns": ("the agent's", "network namespace: a name under `/run/netns` or `/proc/<pid>/ns/net`"),
        "qdisc_sample_hz": ("`20`", "root-qdisc samples per second while a queue, drops or throttling were seen in "
                                    "the last 5 s (2 per second otherwise); 0 turns the sampler off"),
    }

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
        hz = self.config.get("qdisc_sample_hz", DEFAULT_QDISC_SAMPLE_HZ)
        if isinstance(hz, bool) or not isinstance(hz, (int, float)) or not 0 <= hz <= MAX_QDISC_SAMPLE_HZ:
            raise ValueError(f"netdev: 'qdisc_sample_hz' must be a number from 0 (off) to "
                             f"{MAX_QDISC_SAMPLE_HZ:g}, got {hz!r}")
        self.qdisc_sample_hz = float(hz)
        self._injected = source
        self._source: NetlinkSource | None = source
        self._ethtool_sock: socket.socket | None = None
        self._speed_paths: dict[str, str] = {}
        # one tracker per interface; the sampler thread (live only) adds samples between dumps.
        # A sample counts for the time since the previous one, at most one period of the full
        # rate: the sampler watches at 2 Hz while no queue is about, and the sample that finds
        # one must not stand for the half second before it (sampler.py)
        period = 1.0 / self.qdisc_sample_hz if self.qdisc_sample_hz else max(1.0, self.interval)
        self.queues = QueueBook(period, max_weight=period)
        self.sampler: QdiscSampler | None = None
        self._sampler_errors = 0

    def _open(self) -> NetlinkSource:
        if self._source is None:
            self._source = RtnlSocket(self.netns)
        return self._source

    # -- lifecycle ---------------------------------------------------------------------------
    def probe(self) -> Status:
        if self.netns and self._injected is None and not netns_exists(self.netns):
            return Status(Availability.NEEDS_OPERATOR,
                          f"network namespace {self.netns!r} not found at {netns_path(self.netns)}: "
                          "fix 'netns' in the netdev config or create the namespace")
        try:
            names = sorted(parse.interface_names(self._open().links()).values())
        except Exception as e:  # probe never raises
            self._drop_source()
            return Status(Availability.UNAVAILABLE, f"rtnetlink query failed: {e}")
        finally:
            if not self.started:  # probe holds nothing: start() opens the socket it collects with
                self._drop_source()
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
        if self.qdisc_sample_hz and self._injected is None and self.sampler is None:
            netns = self.netns
            self._sampler_errors = 0
            self.sampler = QdiscSampler(self.queues, self.qdisc_sample_hz, lambda: open_rtnl(netns))
            self.sampler.start()
        super().start()

    def stop(self) -> None:
        if self.sampler is not None:
            self.sampler.stop()
            self.sampler = None
        self._drop_source()
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
        path = self._speed_paths.get(ifname)
        if path is None:
            path = self._speed_paths[ifname] = str(self.sys_root / "class" / "net" / ifname / "speed")
            if len(self._speed_paths) > 4096:  # interfaces come and go (veths): stay bounded
                self._speed_paths = {ifname: path}
        try:
            fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
        except OSError:
            return None
        try:
            return os.read(fd, 64).decode("ascii", "replace").strip()
        except OSError:  # EINVAL while the link is down
            return None
        finally:
            os.close(fd)

    def collect(self, t: float) -> SampleBatch:
        try:
            src = self._open()
            links, qdiscs = src.links(), src.qdiscs()
        except Exception as e:
            self._drop_source()
            raise CollectorError(f"rtnetlink dump failed"
                                 f"{' in netns ' + repr(self.netns) if self.netns else ''}: {e}",
                                 stage="read") from e
        now = time.monotonic()
        names = {i: n for i, n in parse.interface_names(links).items() if self._want(n)}
        samples = parse.link_samples(links, self._want)
        samples += parse.qdisc_samples(qdiscs, names)
        roots = parse.root_qdiscs(qdiscs, names)
        if self.sampler is not None:
            self.sampler.set_targets({i: names[i] for i, kind in roots.items()
                                      if kind not in parse.QUEUELESS_KINDS})
            self._count_sampler_errors()
        shaped: dict[int, float | None] = {}
        for msg in qdiscs:  # the dump's own sample of each root queue, and the shapers' rates
            idx = int(msg.get("index", -1))
            if idx not in roots or idx in shaped or int(msg.get("parent", 0)) != parse.TC_H_ROOT:
                continue
            classes: list[dict[str, Any]] = []
            if roots[idx] == "htb":  # its rate is in its classes
                try:
                    classes = src.classes(idx)
                except Exception:  # counted; the rest of the collection stands
                    self.stats.error("read")
            shaped[idx] = parse.shaping_rate(msg, classes)
            st = parse.queue_state(msg)
            if st is not None:
                self.queues.add(names[idx], now, st[0], st[1])
                if st[0] > 0 and self.sampler is not None:
                    self.sampler.notice_queue()
        windows = self.queues.take(names[i] for i in roots)
        for idx, ifname in sorted(names.items(), key=lambda kv: kv[1]):
            speed = parse.speed_samples(ifname, self._speed_text(ifname))
            samples += speed
            if idx not in roots:
                continue
            samples += parse.rate_samples(ifname, shaped.get(idx))
            drain = min([r for r in (shaped.get(idx), speed[0].value if speed else None) if r], default=None)
            w = windows.get(ifname)
            if w is not None:
                samples += queue_samples(ifname, w, drain)
        return _batch(self.node, t, samples)

    def _count_sampler_errors(self) -> None:
        """Fold the sampler thread's failures into this collector's error counts (stage 'sample')."""
        s = self.sampler
        if s is not None and s.errors > self._sampler_errors:
            for _ in range(s.errors - self._sampler_errors):
                self.stats.error("sample")
            self._sampler_errors = s.errors

    def _drop_source(self) -> None:
        """Close the live socket so the next collect() reopens it (e.g. namespace re-created)."""
        if self._source is not None and self._source is not self._injected:
            src, self._source = self._source, None
            try:
                src.close()
            except Exception:
                pass
        if self._ethtool_sock is not None:
            self._ethtool_sock.close()
            self._ethtool_sock = None
