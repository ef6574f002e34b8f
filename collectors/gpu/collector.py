"""The ``gpu`` collector: per-GPU NVML state each tick, plus XID events from a waiter thread.

XID events are only delivered to event sets that exist when they happen, so a daemon thread
blocks in ``nvmlEventSetWait`` (short timeout, so ``stop()`` returns promptly) and counts them;
``collect()`` reads the counts. Everything else is polled per tick through a :class:`Querier`
that skips what a GPU cannot answer after asking once.
"""
from __future__ import annotations

import logging
import threading
from pathlib import Path
from typing import Any, Mapping

import pynvml

from skewd.collectors.base import Availability, Collector, CollectorError, Status
from skewd.collectors.nvml_backend import (PERMANENT_ERRORS, GpuLost, NvmlBackend, NvmlUnavailable,
                                           Querier, config_bool, error_code, shared_backend,
                                           to_status)
from skewd.model import BatchBuilder, SampleBatch

from . import parse
from .catalogue import CATALOGUE

log = logging.getLogger(__name__)

_FI_NVLINK_COUNT = pynvml.NVML_FI_DEV_NVLINK_LINK_COUNT


class GpuCollector(Collector):
    name = "gpu"
    catalogue = CATALOGUE
    default_interval = 1.0
    config_keys = frozenset({"required", "xid_events"})
    config_docs = {
        "xid_events": ("`true`", "watch NVML XID events on a thread (`gpu_xid_errors_total`)"),
    }
    #: nvmlEventSetWait timeout: bounds how long stop() waits for the XID thread
    xid_wait_ms = 250

    def __init__(self, node: str, config: Mapping[str, Any] | None = None,
                 sys_root: str | Path = "/sys", proc_root: str | Path = "/proc",
                 backend: NvmlBackend | None = None) -> None:
        super().__init__(node, config, sys_root, proc_root)
        self.required = config_bool(self.config, "required", False, self.name)
        self.xid_events = config_bool(self.config, "xid_events", True, self.name)
        self.backend = backend if backend is not None else shared_backend()
        self.query = Querier(self.backend, self.stats, self.name)
        self._session = False
        self._nvlink_count: dict[int, int] = {}
        # XID state lives on the collector so the counter stays monotonic across restarts
        self._xid_lock = threading.Lock()
        self._xid_counts: dict[int, int] = {}
        self._xid_last: dict[int, int] = {}
        self._xid_watched: set[int] = set()
        self._xid_thread: threading.Thread | None = None
        self._xid_stop = threading.Event()
        self._evset: Any = None

    # -- lifecycle ------------------------------------------------------------------------------
    def probe(self) -> Status:
        try:
            return to_status(self.backend.check(), self.required, "collectors.gpu.required")
        except Exception as e:  # probe never raises
            return Status(Availability.UNAVAILABLE, f"NVML probe failed unexpectedly: {e!r}")

    def start(self) -> None:
        super().start()
        try:
            self._open()
        except CollectorError as e:
            log.info("gpu collector started without NVML (%s); collect() will retry", e)
            return
        if self.xid_events and self._xid_thread is None:
            self._start_xid()

    def stop(self) -> None:
        self._stop_xid()
        if self._session:
            self._session = False
            self.backend.release()
        super().stop()

    def _open(self) -> None:
        if self._session:
            return
        try:
            self.backend.acquire()
        except NvmlUnavailable as e:
            raise CollectorError(f"NVML unavailable: {e.status.reason}", stage="init") from e
        self._session = True

    # -- polling --------------------------------------------------------------------------------
    def collect(self, t: float) -> SampleBatch:
        self._open()
        try:
            handles = self.backend.handles()
        except pynvml.NVMLError as e:
            raise CollectorError(f"NVML cannot list GPUs: {e}", stage="read") from e
        b = BatchBuilder(self.node)
        for index, handle in handles:
            entity = f"gpu{index}"
            responding = handle is not None
            if handle is not None:
                try:
                    reading = self._read(index, handle)
                except GpuLost:
                    responding = False
                else:
                    for name, value in parse.gpu_samples(reading):
                        b.add(t, entity, name, value)
            b.add(t, entity, "gpu_responding", 1.0 if responding else 0.0)
        with self._xid_lock:
            for index in sorted(self._xid_watched):
                b.add(t, f"gpu{index}", "gpu_xid_errors_total", float(self._xid_counts.get(index, 0)))
                b.add(t, f"gpu{index}", "gpu_xid_last_code", float(self._xid_last.get(index, 0)))
        return b.build()

    def _read(self, i: int, h: Any) -> parse.GpuReading:
        q = self.query
        r = parse.GpuReading()
        r.utilization = q.call(i, "utilization", "nvmlDeviceGetUtilizationRates", h)
        r.memory = q.call(i, "memory", "nvmlDeviceGetMemoryInfo", h)
        r.power_mw = q.call(i, "power", "nvmlDeviceGetPowerUsage", h)
        r.power_limit_mw = q.call(i, "power_limit", "nvmlDeviceGetEnforcedPowerLimit", h)
        r.sm_clock_mhz = q.call(i, "sm_clock", "nvmlDeviceGetClockInfo", h, pynvml.NVML_CLOCK_SM)
        r.sm_clock_max_mhz = q.call(i, "sm_clock_max", "nvmlDeviceGetMaxClockInfo", h, pynvml.NVML_CLOCK_SM)
        r.temperature_c = q.call(i, "temperature", "nvmlDeviceGetTemperature", h, pynvml.NVML_TEMPERATURE_GPU)
        r.clocks_event_reasons = q.call(i, "clocks_event_reasons", "nvmlDeviceGetCurrentClocksEventReasons", h)
        if r.clocks_event_reasons is None and q.skipped(i, "clocks_event_reasons"):
            # drivers before the 535 branch only have the old name of the same bitmask
            r.clocks_event_reasons = q.call(i, "clocks_throttle_reasons",
                                            "nvmlDeviceGetCurrentClocksThrottleReasons", h)
        r.nvlink_links, r.nvlink_active = self._nvlink(i, h)
        return r

    def _nvlink_state(self, i: int, h: Any, link: int) -> int | None:
        """State of one link; None = NVML says the link is not there/usable. Raises on anything
        transient (as _Transient) so the caller can skip the round."""
        try:
            return int(self.backend.lib.nvmlDeviceGetNvLinkState(h, link))
        except pynvml.NVMLError as e:
            code = error_code(e)
            if code == pynvml.NVML_ERROR_GPU_IS_LOST:
                raise GpuLost(i) from e
            if code in PERMANENT_ERRORS or code == pynvml.NVML_ERROR_INVALID_ARGUMENT:
                return None
            self.stats.error("read")
            raise _Transient from e

    def _nvlink(self, i: int, h: Any) -> tuple[int | None, int | None]:
        if self.query.skipped(i, "nvlink"):
            return None, None
        try:
            count = self._nvlink_count.get(i)
            if count is None:
                fields = self.query.fields(i, h, [_FI_NVLINK_COUNT])
                if _FI_NVLINK_COUNT in fields:
                    raw = fields[_FI_NVLINK_COUNT]
                    if not 0 <= raw <= pynvml.NVML_NVLINK_MAX_LINKS:  # also NaN: the driver answered nonsense
                        # (a u32 of 4 billion links would be walked one NVML call at a time)
                        self.stats.error("read")
                        return None, None
                    count = int(raw)
                elif self.query.skipped(i, f"field {_FI_NVLINK_COUNT}"):
                    # older drivers: walk the links until NVML says there is no such link
                    count = 0
                    while count < pynvml.NVML_NVLINK_MAX_LINKS and self._nvlink_state(i, h, count) is not None:
                        count += 1
                else:
                    return None, None  # transient failure: try again next tick
                self._nvlink_count[i] = count
                if count == 0:
                    self.query.mark_unsupported(i, "nvlink", "no NVLink links")
                    return None, None
            active = 0
            for link in range(count):
                if self._nvlink_state(i, h, link) == pynvml.NVML_FEATURE_ENABLED:
                    active += 1
            return count, active
        except _Transient:
            return self._nvlink_count.get(i), None

    # -- XID waiter -----------------------------------------------------------------------------
    def _start_xid(self) -> None:
        lib = self.backend.lib
        try:
            evset = lib.nvmlEventSetCreate()
        except pynvml.NVMLError as e:
            self.stats.error("xid")
            log.warning("gpu: cannot create an NVML event set, XID events not watched: %s", e)
            return
        watched: set[int] = set()
        for index, h in self.backend.handles():
            if h is None or self.query.skipped(index, "xid_events"):
                continue
            try:
                lib.nvmlDeviceRegisterEvents(h, pynvml.nvmlEventTypeXidCriticalError, evset)
            except pynvml.NVMLError as e:
                try:
                    self.query.handle_error(index, "xid_events", e)
                except GpuLost:
                    pass
                continue
            watched.add(index)
        if not watched:
            self._free(evset)
            return
        self._evset = evset
        self._xid_stop = threading.Event()
        with self._xid_lock:
            self._xid_watched = watched
        self._xid_thread = threading.Thread(target=self._xid_loop, args=(evset, self._xid_stop),
                                            name="skewd-gpu-xid", daemon=True)
        self._xid_thread.start()

    def _xid_loop(self, evset: Any, stop: threading.Event) -> None:
        lib = self.backend.lib
        while not stop.is_set():
            try:
                data = lib.nvmlEventSetWait(evset, self.xid_wait_ms)
            except pynvml.NVMLError as e:
                if error_code(e) == pynvml.NVML_ERROR_TIMEOUT:
                    continue
                self.stats.error("xid")
                log.debug("gpu: nvmlEventSetWait failed: %s", e)
                stop.wait(1.0)  # do not spin on a persistent error
                continue
            if not int(data.eventType) & pynvml.nvmlEventTypeXidCriticalError:
                continue
            index = self.backend.index_of(data.device)
            if index is None:
                self.stats.error("xid")
                continue
            with self._xid_lock:
                self._xid_counts[index] = self._xid_counts.get(index, 0) + 1
                self._xid_last[index] = int(data.eventData)
            log.warning("gpu%d: XID %d", index, int(data.eventData))

    def _stop_xid(self) -> None:
        thread, self._xid_thread = self._xid_thread, None
        if thread is None:
            return
        self._xid_stop.set()
        thread.join(timeout=4 * self.xid_wait_ms / 1000.0 + 1.0)
        if thread.is_alive():  # never free a set a thread may still be waiting on
            log.warning("gpu: XID waiter did not stop in time; leaving its event set allocated")
        else:
            self._free(self._evset)
        self._evset = None
        with self._xid_lock:
            self._xid_watched = set()

    def _free(self, evset: Any) -> None:
        try:
            self.backend.lib.nvmlEventSetFree(evset)
        except pynvml.NVMLError as e:
            log.debug("gpu: nvmlEventSetFree failed: %s", e)


class _Transient(Exception):
    """An NVLink query failed in a way worth retrying next tick."""
