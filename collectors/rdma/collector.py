"""rdma collector: per-port counters, mlx5 hw_counters and port state from sysfs.

Each read of a ``counters/*`` file makes the driver issue a PMA MAD to the HCA, so only the
files the catalogue needs are read, once per interval.
"""
from __future__ import annotations

import fnmatch
from pathlib import Path
from typing import Any, Callable, Mapping

from skewd.collectors.base import Availability, Collector, CollectorError, Status
from skewd.collectors.sysfs import list_dir, read_str
from skewd.model import BatchBuilder, SampleBatch

from . import parse
from .catalogue import CATALOGUE


class RdmaCollector(Collector):
    """Config: ``devices`` (names or globs such as ``mlx5_*``; default every device)."""

    name = "rdma"
    catalogue = CATALOGUE
    default_interval = 1.0
    config_keys = frozenset({"devices", "resources"})
    config_docs = {
        "devices": ("every device", "names or globs (`[\"mlx5_*\"]`)"),
        "resources": ("`true`", "count MRs and QPs through iproute2's `rdma -j resource show`"),
    }

    def __init__(self, node: str, config: Mapping[str, Any] | None = None,
                 sys_root: str | Path = "/sys", proc_root: str | Path = "/proc") -> None:
        super().__init__(node, config, sys_root, proc_root)
        devs = self.config.get("devices")
        if devs is not None and (isinstance(devs, str) or not all(isinstance(d, str) for d in devs)):
            raise ValueError("rdma: 'devices' must be a list of device names or globs (mlx5_*)")
        self._patterns: list[str] | None = list(devs) if devs else None
        #: MR/QP counts from RDMA netlink through iproute2's ``rdma -j resource show``; injectable
        self.resources = bool(self.config.get("resources", True))
        self.resource_reader: Callable[[], str | None] = self._run_rdma_tool
        self._resource_error = ""

    @property
    def class_dir(self) -> Path:
        return self.sys_root / "class" / "infiniband"

    def _wanted(self, dev: str) -> bool:
        return self._patterns is None or any(fnmatch.fnmatchcase(dev, p) for p in self._patterns)

    def ports(self) -> list[tuple[str, str]]:
        """(device, port) pairs present under the class directory, filtered by config."""
        out = []
        for dev in list_dir(self.class_dir):
            if not self._wanted(dev):
                continue
            for port in list_dir(self.class_dir / dev / "ports"):
                if port.isdigit():
                    out.append((dev, port))
        return sorted(out, key=lambda dp: (dp[0], int(dp[1])))

    def probe(self) -> Status:
        devices = list_dir(self.class_dir)
        if not devices:
            return Status(Availability.ABSENT, f"no RDMA devices under {self.class_dir}")
        ports = self.ports()
        if not ports:
            if self._patterns:
                return Status(Availability.NEEDS_OPERATOR,
                              f"no RDMA device matches {self._patterns}; present: {', '.join(devices)}")
            return Status(Availability.UNAVAILABLE,
                          f"RDMA devices {', '.join(devices)} expose no ports under {self.class_dir}")
        return Status(Availability.ACTIVE, "reading " + ", ".join(f"{d}/{p}" for d, p in ports))

    def read_port(self, dev: str, port: str) -> dict[str, str]:
        base = self.class_dir / dev / "ports" / port
        files: dict[str, str] = {}
        for rel in parse.port_files():
            text = read_str(base / rel)
            if text is not None:
                files[rel] = text
        return files

    def collect(self, t: float) -> SampleBatch:
        if not self.class_dir.is_dir():
            raise CollectorError(f"{self.class_dir} is gone (driver unloaded?)", stage="read")
        b = BatchBuilder(self.node)
        for dev, port in self.ports():
            for s in parse.port_samples(f"{dev}/{port}", self.read_port(dev, port)):
                b.add(t, s.entity, s.signal, s.value)
        if self.resources:
            for s in parse.resource_samples(self.resource_reader()):
                if self._wanted(s.entity):
                    b.add(t, s.entity, s.signal, s.value)
        return b.build()

    def _run_rdma_tool(self) -> str | None:
        """One ``rdma -j resource show`` (a netlink dump, ~ms). None when the tool or RDMA
        netlink is missing; the reason is kept for ``skewd agent --check``-style reporting."""
        import shutil
        import subprocess

        exe = shutil.which("rdma")
        if exe is None:
            self._resource_error = "iproute2 'rdma' tool not installed: no MR registration counts"
            return None
        try:
            r = subprocess.run([exe, "-j", "resource", "show"], capture_output=True, text=True, timeout=1.0)
        except (OSError, subprocess.TimeoutExpired) as e:
            self._resource_error = f"rdma resource show failed: {e}"
            return None
        if r.returncode != 0:
            self._resource_error = f"rdma resource show: {r.stderr.strip() or r.returncode}"
            return None
        return r.stdout
