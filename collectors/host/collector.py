"""host collector: CPU time per core and per node, NET_RX/NET_TX softirqs, TCP/UDP counters.

Reads ``<proc_root>/stat``, ``softirqs``, ``net/snmp``, ``net/netstat`` and ``loadavg``.
``net/snmp`` and ``net/netstat`` belong to the reading process's network namespace: in a
container, mount the host's /proc and point ``proc_root`` at it (``/host/proc``) to see the
node's TCP counters. With ``netns`` set (a name under /run/netns or a path such as
/proc/<pid>/ns/net) the two net files are read in that namespace instead: a short-lived thread
joins it and reads ``<proc_root>/thread-self/net/...`` (which follows the reading thread's
namespace, where ``/proc/net`` follows the process's); everything else stays per machine.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any, Callable, Mapping

from skewd.collectors.base import Availability, Collector, CollectorError, Status
from skewd.collectors.netdev.netns import netns_exists, netns_path, run_in_netns
from skewd.collectors.sysfs import read_str
from skewd.model import BatchBuilder, SampleBatch

from . import parse
from .catalogue import CATALOGUE

_OPTIONAL: dict[str, Callable[[str], list[parse.Sample]]] = {
    "softirqs": parse.parse_softirqs,
    "net/snmp": parse.parse_snmp,
    "net/netstat": parse.parse_netstat,
    "loadavg": parse.parse_loadavg,
}


class HostCollector(Collector):
    """Config: ``user_hz`` (default 100, the Linux ABI value), ``loadavg`` (default true) and
    ``netns`` (read the per-namespace net/snmp and net/netstat of that network namespace)."""

    name = "host"
    catalogue = CATALOGUE
    default_interval = 1.0
    config_keys = frozenset({"user_hz", "loadavg", "netns"})
    config_docs = {
        "user_hz": ("`100`", "ticks per second of `/proc/stat` CPU times (100 on every Linux GPU platform)"),
        "loadavg": ("`true`", "read `/proc/loadavg`"),
        "netns": ("the agent's", "network namespace whose `net/snmp` and `net/netstat` to read: a name under "
                                 "`/run/netns` or `/proc/<pid>/ns/net`"),
    }

    def __init__(self, node: str, config: Mapping[str, Any] | None = None,
                 sys_root: str | Path = "/sys", proc_root: str | Path = "/proc") -> None:
        super().__init__(node, config, sys_root, proc_root)
        hz = self.config.get("user_hz", parse.USER_HZ)
        if isinstance(hz, bool) or not isinstance(hz, int) or hz <= 0:
            raise ValueError("host: 'user_hz' must be a positive integer (Linux uses 100)")
        self.user_hz = hz
        self.loadavg = bool(self.config.get("loadavg", True))
        netns = self.config.get("netns")
        if netns is not None and not isinstance(netns, str):
            raise ValueError("host: 'netns' must be a network namespace name or path")
        self.netns: str | None = netns or None
        # last value per (entity, signal) of the /proc/stat CPU times, see _monotonic()
        self._last: dict[tuple[str, str], float] = {}
        self._paths: dict[str, str] = {}  # file under proc_root → path string (read every second)

    def _path(self, rel: str) -> str:
        p = self._paths.get(rel)
        if p is None:
            p = self._paths[rel] = str(self.proc_root / rel)
        return p

    def _net_files(self) -> dict[str, str | None]:
        """Text of the per-namespace files (None: unreadable), from ``netns`` when set."""
        rels = [r for r in _OPTIONAL if r.startswith("net/")]
        if not self.netns:
            return {r: read_str(self._path(r)) for r in rels}
        base = self.proc_root / "thread-self"
        return run_in_netns(self.netns, lambda: {r: read_str(base / r) for r in rels})

    def _optional_texts(self) -> dict[str, str | None]:
        try:
            net = self._net_files()
        except OSError:  # the namespace went away: its files are unreadable, as probe() says
            net = {r: None for r in _OPTIONAL if r.startswith("net/")}
        return {rel: net[rel] if rel in net else read_str(self._path(rel)) for rel in _OPTIONAL
                if rel != "loadavg" or self.loadavg}

    def probe(self) -> Status:
        stat = self.proc_root / "stat"
        if read_str(stat) is None:
            return Status(Availability.NEEDS_OPERATOR,
                          f"cannot read {stat}: mount the host's /proc and set proc_root to it")
        if self.netns and not netns_exists(self.netns):
            return Status(Availability.NEEDS_OPERATOR,
                          f"network namespace {self.netns!r} not found at {netns_path(self.netns)}: "
                          "fix 'netns' in the host config or create the namespace")
        texts = self._optional_texts()
        missing = [f for f, text in texts.items() if text is None]
        if missing:
            return Status(Availability.ACTIVE,
                          f"reading {stat}; not readable: {', '.join(str(self.proc_root / m) for m in missing)}")
        where = f" (net/* of network namespace {self.netns})" if self.netns else ""
        return Status(Availability.ACTIVE, f"reading {self.proc_root}/stat, softirqs, net/snmp, net/netstat{where}")

    def stop(self) -> None:
        self._last.clear()
        super().stop()

    def _monotonic(self, samples: list[parse.Sample]) -> list[parse.Sample]:
        """Hold CPU times at their previous value when the kernel reports a smaller one.

        Per-CPU idle and iowait can step backwards on tickless kernels (documented in
        proc(5)); the window store would read a decrease as a counter reset and produce a huge
        false increase. /proc/stat CPU times never reset while the machine is up.
        """
        out = []
        for s in samples:
            if s.signal.endswith("_seconds_total"):
                key = (s.entity, s.signal)
                prev = self._last.get(key)
                if prev is not None and s.value < prev:
                    s = parse.Sample(s.entity, s.signal, prev)
                self._last[key] = s.value
            out.append(s)
        return out

    def collect(self, t: float) -> SampleBatch:
        text = read_str(self._path("stat"))
        if text is None:
            raise CollectorError(f"cannot read {self.proc_root / 'stat'}", stage="read")
        try:
            samples = self._monotonic(parse.parse_stat(text, self.user_hz))
        except ValueError as e:
            raise CollectorError(f"{self.proc_root / 'stat'}: {e}", stage="parse") from e
        for rel, body in self._optional_texts().items():
            fn = _OPTIONAL[rel]
            if body is None:
                continue  # absent on this kernel/namespace; probe() said so
            try:
                samples += fn(body)
            except ValueError:
                self.stats.error("parse")
        b = BatchBuilder(self.node)
        for s in samples:
            b.add(t, s.entity, s.signal, s.value)
        return b.build()
