"""The ``pcie`` collector: link state + AER from sysfs for selected PCI devices, and per-GPU PCIe
throughput, replays and link state from NVML.

The two halves fail independently: sysfs works on any Linux host (this is what a GPU-less host
or a BlueField's Arm cores can still see), NVML only where an NVIDIA driver is loaded. Either one
being usable makes the collector active; the probe reason says what each half is doing.
"""
from __future__ import annotations

import logging
from pathlib import Path
from typing import Any, Mapping

import pynvml

from skewd.collectors.base import Availability, Collector, Status
from skewd.collectors.nvml_backend import (GpuLost, NvmlBackend, NvmlUnavailable, Querier,
                                           config_bool, shared_backend, to_status)
from skewd.collectors.sysfs import list_dir, read_str
from skewd.model import BatchBuilder, SampleBatch

from . import parse
from .catalogue import CATALOGUE

log = logging.getLogger(__name__)


class PcieCollector(Collector):
    name = "pcie"
    catalogue = CATALOGUE
    default_interval = 1.0
    config_keys = frozenset({"classes", "addresses", "nvml", "nvml_required"})
    config_docs = {
        "classes": ("VGA, 3D, Ethernet, InfiniBand", "PCI classes to watch: `\"0x0302\"` (class+subclass) or "
                    "`\"0x030200\"` (with prog-if)"),
        "addresses": ("`[]`", "PCI addresses watched whatever their class (`\"0000:3b:00.0\"`); a missing one "
                      "needs an operator"),
        "nvml": ("`true`", "read per-GPU PCIe throughput, replays and link state through NVML"),
        "nvml_required": ("`false`", "`true`: NVML missing is an operator error"),
    }
    #: how often (seconds of tick time) the device selection is re-scanned for hot-plug
    rescan_interval = 60.0
    #: how long to wait before trying NVML again after it failed (absent driver: longer)
    nvml_retry_s = {"absent": 300.0, "default": 30.0}

    def __init__(self, node: str, config: Mapping[str, Any] | None = None,
                 sys_root: str | Path = "/sys", proc_root: str | Path = "/proc",
                 backend: NvmlBackend | None = None) -> None:
        super().__init__(node, config, sys_root, proc_root)
        classes = self.config.get("classes", list(parse.DEFAULT_CLASSES))
        addresses = self.config.get("addresses", [])
        if not isinstance(classes, list) or not isinstance(addresses, list):
            raise ValueError("collectors.pcie.classes and collectors.pcie.addresses must be lists")
        errors: list[str] = []
        self.classes: list[parse.ClassFilter] = []
        for c in classes:
            try:
                self.classes.append(parse.parse_class_filter(c))
            except ValueError as e:
                errors.append(f"collectors.pcie.classes: {e}")
        self.addresses: list[str] = []
        for a in addresses:
            try:
                self.addresses.append(parse.normalise_address(a))
            except ValueError as e:
                errors.append(f"collectors.pcie.addresses: {e}")
        if errors:
            raise ValueError("; ".join(errors))
        self.nvml_enabled = config_bool(self.config, "nvml", True, self.name)
        self.nvml_required = config_bool(self.config, "nvml_required", False, self.name)
        self.backend = backend if backend is not None else shared_backend()
        self.query = Querier(self.backend, self.stats, self.name)
        self._selected: list[str] | None = None
        self._selected_at = float("-inf")
        # per selected device, its sysfs files as plain strings (read every second: a pathlib
        # join per file per collect cost more than the reads)
        self._files: dict[str, tuple[tuple[str, str], ...]] = {}
        self._nvml_session = False
        self._nvml_wait: float | None = None  # set after a failed attempt
        self._nvml_retry_at: float | None = None
        self.nvml_reason = "not tried yet"

    @property
    def devices_dir(self) -> Path:
        return self.sys_root / "bus" / "pci" / "devices"

    # -- device selection -----------------------------------------------------------------------
    def select_devices(self) -> list[str]:
        """PCI addresses to watch: configured classes (physical functions only: SR-IOV VFs share
        their PF's link) plus explicitly configured addresses that exist."""
        out = []
        for addr in list_dir(self.devices_dir):
            d = self.devices_dir / addr
            if addr not in self.addresses:
                if (d / "physfn").exists():
                    continue
                cls = parse.pci_class(read_str(d / "class"))
                if cls is None or not parse.class_matches(cls, self.classes):
                    continue
            out.append(addr)
        return out

    def _devices(self, t: float) -> list[str]:
        if self._selected is None or t - self._selected_at >= self.rescan_interval:
            self._selected = self.select_devices()
            self._selected_at = t
            self._files = {}
        return self._selected

    def _device_files(self, addr: str) -> tuple[tuple[str, str], ...]:
        files = self._files.get(addr)
        if files is None:
            d = self.devices_dir / addr
            files = self._files[addr] = tuple((name, str(d / name)) for name in parse.DEVICE_FILES)
        return files

    # -- lifecycle ------------------------------------------------------------------------------
    def probe(self) -> Status:
        try:
            return self._probe()
        except Exception as e:  # probe never raises
            return Status(Availability.UNAVAILABLE, f"pcie probe failed unexpectedly: {e!r}")

    def _probe(self) -> Status:
        parts: list[str] = []
        selected: list[str] = []
        missing: list[str] = []
        if self.devices_dir.is_dir():
            selected = self.select_devices()
            missing = [a for a in self.addresses if a not in selected]
            if selected:
                linked = [a for a in selected if (self.devices_dir / a / "current_link_speed").exists()]
                aer = [a for a in selected if (self.devices_dir / a / "aer_dev_correctable").exists()]
                shown = ", ".join(selected[:8]) + (", ..." if len(selected) > 8 else "")
                parts.append(f"sysfs: {len(selected)} PCI device(s) matched ({shown}); "
                             f"{len(linked)} report PCIe link state, {len(aer)} AER counters")
            else:
                wanted = ", ".join(f"0x{c.value:04x}" if not c.full else f"0x{c.value:06x}"
                                   for c in self.classes)
                parts.append(f"sysfs: no PCI device under {self.devices_dir} matched classes "
                             f"[{wanted}]" + (f" or addresses {self.addresses}" if self.addresses else ""))
        else:
            parts.append(f"sysfs: {self.devices_dir} not found")
        nvml: Status | None = None
        if self.nvml_enabled:
            nvml = to_status(self.backend.check(), self.nvml_required, "collectors.pcie.nvml_required")
            parts.append(f"NVML {'active' if nvml.active else 'inactive'}: {nvml.reason}")
        else:
            parts.append("NVML: disabled (collectors.pcie.nvml: false)")
        reason = "; ".join(parts)
        if missing:
            return Status(Availability.NEEDS_OPERATOR,
                          f"configured PCI address(es) {', '.join(missing)} not present under "
                          f"{self.devices_dir}: fix collectors.pcie.addresses; {reason}")
        self._sysfs_ok = bool(selected)
        self._nvml_ok = nvml is not None and nvml.active
        self._nvml_reason = nvml.reason if nvml is not None else "disabled (collectors.pcie.nvml: false)"
        if nvml is not None and nvml.availability is Availability.NEEDS_OPERATOR:
            return Status(Availability.NEEDS_OPERATOR, reason)
        if selected or (nvml is not None and nvml.active):
            return Status(Availability.ACTIVE, reason)
        if nvml is not None and nvml.availability is Availability.UNAVAILABLE:
            return Status(Availability.UNAVAILABLE, reason)
        return Status(Availability.ABSENT, reason)

    def provides(self) -> set[str]:
        """Only the half that works: a host with PCI devices but no NVML supplies the sysfs link
        and AER signals, not the per-GPU throughput (so rules needing it say why they are off)."""
        out = set()
        for spec in self.catalogue:
            nvml_part = spec.scope.value == "gpu"
            if (nvml_part and getattr(self, "_nvml_ok", False)) or (not nvml_part and getattr(self, "_sysfs_ok", False)):
                out.add(spec.name)
        return out

    def unavailable_reason(self, signal_name: str) -> str:
        spec = next((s for s in self.catalogue if s.name == signal_name), None)
        if spec is not None and spec.scope.value == "gpu":
            return f"pcie collector's NVML part inactive: {getattr(self, '_nvml_reason', 'not probed')}"
        return "pcie collector matched no PCI device"

    def start(self) -> None:
        super().start()
        self._nvml_open(None)

    def stop(self) -> None:
        if self._nvml_session:
            self._nvml_session = False
            self.backend.release()
        self._nvml_wait = None
        self._nvml_retry_at = None
        super().stop()

    def _nvml_open(self, t: float | None) -> bool:
        """Join the NVML session; after a failure, retry only every ``nvml_retry_s`` of tick time
        (``t`` is None from start(): the wait is then counted from the first tick)."""
        if self._nvml_session:
            return True
        if not self.nvml_enabled:
            return False
        if t is not None and self._nvml_wait is not None:
            if self._nvml_retry_at is None:
                self._nvml_retry_at = t + self._nvml_wait
            if t < self._nvml_retry_at:
                return False
        try:
            self.backend.acquire()
        except NvmlUnavailable as e:
            self.nvml_reason = e.status.reason
            self._nvml_wait = self.nvml_retry_s.get(e.status.kind, self.nvml_retry_s["default"])
            self._nvml_retry_at = None if t is None else t + self._nvml_wait
            return False
        self._nvml_session = True
        self._nvml_wait = None
        self._nvml_retry_at = None
        self.nvml_reason = "active"
        return True

    def gpu_pci_addresses(self) -> dict[int, str]:
        """GPU index → PCI address (``0000:5d:00.0``): joins ``pcie_gpu_*{gpu3}`` with
        ``pcie_*{0000:5d:00.0}`` and with the gpu collector's ``gpu3``. Empty without NVML."""
        if not self._nvml_session:
            return {}
        try:
            return self.backend.pci_addresses()
        except pynvml.NVMLError:
            return {}

    # -- collection -----------------------------------------------------------------------------
    def collect(self, t: float) -> SampleBatch:
        b = BatchBuilder(self.node)
        for addr in self._devices(t):
            files = {name: read_str(path) for name, path in self._device_files(addr)}
            for sig, value in parse.device_samples(files):
                b.add(t, addr, sig, value)
        if self._nvml_open(t):
            self._collect_nvml(t, b)
        return b.build()

    def _collect_nvml(self, t: float, b: BatchBuilder) -> None:
        q = self.query
        try:
            handles = self.backend.handles()
        except pynvml.NVMLError as e:  # the sysfs half still goes out
            self.stats.error("read")
            log.debug("pcie: NVML cannot list GPUs: %s", e)
            return
        for i, h in handles:
            if h is None:
                continue
            try:
                r = parse.PcieGpuReading(
                    tx_kbps=q.call(i, "pcie_tx", "nvmlDeviceGetPcieThroughput", h, pynvml.NVML_PCIE_UTIL_TX_BYTES),
                    rx_kbps=q.call(i, "pcie_rx", "nvmlDeviceGetPcieThroughput", h, pynvml.NVML_PCIE_UTIL_RX_BYTES),
                    replays=q.call(i, "pcie_replay", "nvmlDeviceGetPcieReplayCounter", h),
                    cur_gen=q.call(i, "pcie_cur_gen", "nvmlDeviceGetCurrPcieLinkGeneration", h),
                    max_gen=q.call(i, "pcie_max_gen", "nvmlDeviceGetMaxPcieLinkGeneration", h),
                    cur_width=q.call(i, "pcie_cur_width", "nvmlDeviceGetCurrPcieLinkWidth", h),
                    max_width=q.call(i, "pcie_max_width", "nvmlDeviceGetMaxPcieLinkWidth", h),
                    fields=q.fields(i, h, list(parse.NVML_ERROR_FIELDS)),
                )
            except GpuLost:
                continue  # the gpu collector reports it (gpu_responding 0)
            for sig, value in parse.nvml_samples(r):
                b.add(t, f"gpu{i}", sig, value)
