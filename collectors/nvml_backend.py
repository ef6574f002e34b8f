"""Shared, injectable NVML access for the ``gpu`` and ``pcie`` collectors.

Why a backend at all: both collectors talk to one driver library that must be initialised once
and shut down only when its last user is done (handles die with the final ``nvmlShutdown``),
and both need the same answers to "is NVML usable here, and if not, whose problem is it?".

The backend never re-implements NVML: ``lib`` is the ``pynvml`` module in production and, in
tests, a double implementing the same function names that returns pynvml's own ctypes structures
and raises pynvml's own error classes. Values are returned in NVML's units; the collectors'
``parse`` modules convert them to base units.
"""
from __future__ import annotations

import ctypes
import logging
import threading
from dataclasses import dataclass
from typing import Any, Iterable

import pynvml

from .base import Availability, CollectorStats, Status, config_bool  # noqa: F401 (gpu and pcie read it here)

log = logging.getLogger(__name__)

#: Errors that will not change while the driver stays loaded: ask once, then skip the query.
PERMANENT_ERRORS = frozenset({
    pynvml.NVML_ERROR_NOT_SUPPORTED,
    pynvml.NVML_ERROR_NO_PERMISSION,
    pynvml.NVML_ERROR_FUNCTION_NOT_FOUND,  # the installed driver predates this NVML call
})

_INSTALL_FIX = ("install the NVIDIA driver (it ships libnvidia-ml.so.1); in a container, run with the "
                "NVIDIA container runtime (e.g. --gpus all) so the library and /dev/nvidia* are mounted")

#: nvmlInit failure → (kind, reason, what an operator does about it).
#: kind "absent": nothing to do on a GPU-less host; "operator": GPUs are there but broken;
#: "transient": retry quietly.
_INIT_ERRORS: dict[int, tuple[str, str, str]] = {
    pynvml.NVML_ERROR_LIBRARY_NOT_FOUND: (
        "absent", "NVML library not found: no NVIDIA driver on this host", _INSTALL_FIX),
    pynvml.NVML_ERROR_DRIVER_NOT_LOADED: (
        "absent", "NVIDIA driver not loaded: libnvidia-ml is installed but the nvidia kernel module "
                  "is not loaded", "load it (modprobe nvidia) or check dmesg for why it failed"),
    pynvml.NVML_ERROR_NO_PERMISSION: (
        "operator", "NVML denied access to the GPUs (no permission on /dev/nvidia*)",
        "give the agent access to /dev/nvidiactl and /dev/nvidia* (video group or the NVIDIA "
        "container runtime)"),
    pynvml.NVML_ERROR_LIB_RM_VERSION_MISMATCH: (
        "operator", "NVML library and nvidia kernel module versions differ (driver upgraded "
                    "without a reload)", "reload the nvidia kernel modules or reboot"),
    pynvml.NVML_ERROR_GPU_IS_LOST: (
        "operator", "a GPU has fallen off the bus (NVML: GPU is lost)",
        "drain the node and check dmesg for XID 79; a reset or reboot is needed"),
}


@dataclass(frozen=True)
class NvmlStatus:
    """Outcome of trying NVML on this host."""

    kind: str  # "ok" | "absent" | "operator" | "transient"
    reason: str
    fix: str = ""
    device_count: int = 0
    driver_version: str = ""

    @property
    def ok(self) -> bool:
        return self.kind == "ok"


class NvmlUnavailable(Exception):
    """NVML cannot be used right now; ``status`` says why and what to do."""

    def __init__(self, status: NvmlStatus) -> None:
        super().__init__(status.reason)
        self.status = status


class GpuLost(Exception):
    """NVML answered NVML_ERROR_GPU_IS_LOST for this GPU: it has fallen off the bus."""

    def __init__(self, index: int) -> None:
        super().__init__(f"gpu{index} is lost")
        self.index = index


def error_code(err: BaseException) -> int | None:
    return getattr(err, "value", None)


def classify_init_error(err: pynvml.NVMLError) -> NvmlStatus:
    code = error_code(err)
    if code in _INIT_ERRORS:
        kind, reason, fix = _INIT_ERRORS[code]
        return NvmlStatus(kind, reason, fix)
    return NvmlStatus("transient", f"NVML initialisation failed: {err}",
                      "check the driver with nvidia-smi if this persists")


def normalise_bus_id(bus_id: str) -> str:
    """NVML's ``00000000:1B:00.0`` → sysfs's ``0000:1b:00.0`` (the pcie collector's entity)."""
    domain, bus, devfn = bus_id.strip().split(":")
    return f"{int(domain, 16):04x}:{bus.lower()}:{devfn.lower()}"


def _address(handle: Any) -> int | None:
    """Identity of an NVML device handle (a ctypes pointer): its target address."""
    try:
        return ctypes.cast(handle, ctypes.c_void_p).value
    except (TypeError, ctypes.ArgumentError):
        return None


class NvmlBackend:
    """Reference-counted NVML session shared by every collector in the process.

    ``acquire()`` runs ``nvmlInit`` for the first user, ``release()`` runs ``nvmlShutdown`` for
    the last one; device handles are cached per session and dropped with it.
    """

    def __init__(self, lib: Any = None) -> None:
        self.lib = pynvml if lib is None else lib
        self._lock = threading.RLock()
        self._refs = 0
        self._handles: list[tuple[int, Any]] | None = None
        self._index_by_addr: dict[int, int] = {}

    # -- session ----------------------------------------------------------------------------
    @property
    def refs(self) -> int:
        return self._refs

    def acquire(self) -> None:
        """Join (or open) the NVML session. Raises NvmlUnavailable with an actionable reason."""
        with self._lock:
            if self._refs == 0:
                try:
                    self.lib.nvmlInit()
                except pynvml.NVMLError as e:
                    raise NvmlUnavailable(classify_init_error(e)) from e
                self._handles = None
                self._index_by_addr = {}
            self._refs += 1

    def release(self) -> None:
        """Leave the session; the last user shuts NVML down. Safe to over-call."""
        with self._lock:
            if self._refs == 0:
                return
            self._refs -= 1
            if self._refs == 0:
                self._handles = None
                self._index_by_addr = {}
                try:
                    self.lib.nvmlShutdown()
                except pynvml.NVMLError as e:
                    log.warning("nvmlShutdown failed: %s", e)

    def check(self) -> NvmlStatus:
        """Probe NVML: initialise (or reuse the open session), count GPUs, release. Never raises."""
        try:
            self.acquire()
        except NvmlUnavailable as e:
            return e.status
        except Exception as e:  # a broken binding must not take the agent down
            return NvmlStatus("transient", f"NVML probe failed unexpectedly: {e!r}")
        try:
            count = int(self.lib.nvmlDeviceGetCount())
            try:
                driver = str(self.lib.nvmlSystemGetDriverVersion())
            except pynvml.NVMLError:
                driver = ""
        except pynvml.NVMLError as e:
            return classify_init_error(e)
        finally:
            self.release()
        if count == 0:
            return NvmlStatus("absent", "NVML works but reports no GPUs on this host",
                              "check that the GPUs are visible (nvidia-smi) and not hidden by "
                              "CUDA_VISIBLE_DEVICES/NVIDIA_VISIBLE_DEVICES", driver_version=driver)
        return NvmlStatus("ok", f"{count} GPU(s) visible through NVML"
                          + (f" (driver {driver})" if driver else ""),
                          device_count=count, driver_version=driver)

    # -- devices ----------------------------------------------------------------------------
    def handles(self) -> list[tuple[int, Any]]:
        """``(index, handle)`` for every GPU NVML counts; handle is None when NVML could not
        open that GPU (lost, no permission), so callers can still report it by index."""
        with self._lock:
            if self._refs == 0:
                raise RuntimeError("NvmlBackend.handles() called outside acquire()/release()")
            if self._handles is None:
                out: list[tuple[int, Any]] = []
                for i in range(int(self.lib.nvmlDeviceGetCount())):
                    try:
                        h = self.lib.nvmlDeviceGetHandleByIndex(i)
                    except pynvml.NVMLError as e:
                        log.warning("NVML cannot open gpu%d: %s", i, e)
                        out.append((i, None))
                        continue
                    out.append((i, h))
                    addr = _address(h)
                    if addr is not None:
                        self._index_by_addr[addr] = i
                self._handles = out
            return list(self._handles)

    def index_of(self, handle: Any) -> int | None:
        """GPU index for a handle NVML hands back (event data carries handles, not indices)."""
        addr = _address(handle)
        return None if addr is None else self._index_by_addr.get(addr)

    def pci_addresses(self) -> dict[int, str]:
        """GPU index → sysfs PCI address (``0000:1b:00.0``): joins the gpu-scope signals with the
        pci_device-scope ones of the same card. Requires an acquired session."""
        out: dict[int, str] = {}
        for i, h in self.handles():
            if h is None:
                continue
            try:
                out[i] = normalise_bus_id(self.lib.nvmlDeviceGetPciInfo(h).busId)
            except (pynvml.NVMLError, ValueError) as e:
                log.debug("no PCI bus id for gpu%d: %s", i, e)
        return out


def decode_field_value(fv: Any) -> float:
    """Value of one ``c_nvmlFieldValue_t`` according to its ``valueType``."""
    vt = fv.valueType
    v = fv.value
    if vt == pynvml.NVML_VALUE_TYPE_DOUBLE:
        return float(v.dVal)
    if vt == pynvml.NVML_VALUE_TYPE_UNSIGNED_INT:
        return float(v.uiVal)
    if vt == pynvml.NVML_VALUE_TYPE_UNSIGNED_LONG:
        return float(v.ulVal)
    if vt == pynvml.NVML_VALUE_TYPE_UNSIGNED_LONG_LONG:
        return float(v.ullVal)
    if vt == pynvml.NVML_VALUE_TYPE_SIGNED_LONG_LONG:
        return float(v.sllVal)
    if vt == pynvml.NVML_VALUE_TYPE_SIGNED_INT:
        return float(v.siVal)
    if vt == pynvml.NVML_VALUE_TYPE_UNSIGNED_SHORT:
        return float(v.usVal)
    raise ValueError(f"unknown NVML value type {vt}")


class Querier:
    """One collector's way of asking NVML about one GPU.

    NotSupported (and NoPermission, FunctionNotFound) will not change while the driver is loaded,
    so such a query is tried once, logged once and counted once (stats stage ``not_supported``),
    then skipped: a GPU that lacks NVLink must not cost a failing call and a log line every tick.
    ``GPU_IS_LOST`` raises :class:`GpuLost`; any other error is counted (stage ``read``) and the
    query is retried next tick.
    """

    def __init__(self, backend: NvmlBackend, stats: CollectorStats, owner: str) -> None:
        self.backend = backend
        self.stats = stats
        self.owner = owner
        #: gpu index → query key → why it is skipped
        self.unsupported: dict[int, dict[str, str]] = {}

    def skipped(self, index: int, key: str) -> bool:
        return key in self.unsupported.get(index, {})

    def mark_unsupported(self, index: int, key: str, why: str) -> None:
        per_gpu = self.unsupported.setdefault(index, {})
        if key not in per_gpu:
            per_gpu[key] = why
            self.stats.error("not_supported")
            log.info("%s: gpu%d does not support %s (%s); skipping it", self.owner, index, key, why)

    def handle_error(self, index: int, key: str, err: pynvml.NVMLError) -> None:
        code = error_code(err)
        if code in PERMANENT_ERRORS:
            self.mark_unsupported(index, key, str(err))
        elif code == pynvml.NVML_ERROR_GPU_IS_LOST:
            raise GpuLost(index) from err
        else:
            self.stats.error("read")
            log.debug("%s: gpu%d %s failed: %s", self.owner, index, key, err)

    def call(self, index: int, key: str, fn: str, *args: Any) -> Any:
        """``lib.<fn>(*args)``, or None when unsupported or failed this time."""
        if self.skipped(index, key):
            return None
        try:
            return getattr(self.backend.lib, fn)(*args)
        except pynvml.NVMLError as e:
            self.handle_error(index, key, e)
            return None

    def fields(self, index: int, handle: Any, field_ids: Iterable[int]) -> dict[int, float]:
        """Field values that NVML answered, by id. Each element carries its own ``nvmlReturn``:
        an unsupported field is skipped from then on, exactly like an unsupported call."""
        wanted = [f for f in field_ids if not self.skipped(index, f"field {f}")]
        if not wanted:
            return {}
        values = self.call(index, "nvmlDeviceGetFieldValues", "nvmlDeviceGetFieldValues", handle, wanted)
        if values is None:
            return {}
        out: dict[int, float] = {}
        for fv in values:
            ret = fv.nvmlReturn
            if ret == pynvml.NVML_SUCCESS:
                out[int(fv.fieldId)] = decode_field_value(fv)
            elif ret == pynvml.NVML_ERROR_INVALID_ARGUMENT:
                # a field id this driver does not know: asking again will not help
                self.mark_unsupported(index, f"field {fv.fieldId}", str(pynvml.NVMLError(ret)))
            else:
                self.handle_error(index, f"field {fv.fieldId}", pynvml.NVMLError(ret))
        return out


def to_status(st: NvmlStatus, required: bool, required_key: str) -> Status:
    """Map an NVML probe outcome to a collector Status (Home Assistant's two failure kinds):
    no driver is nothing to do on a GPU-less host, unless the user said GPUs must be there."""
    if st.kind == "ok":
        return Status(Availability.ACTIVE, st.reason)
    if st.kind == "absent":
        if required:
            return Status(Availability.NEEDS_OPERATOR,
                          f"{st.reason}, but {required_key} is true: {st.fix} "
                          f"(or set {required_key}: false on hosts without NVIDIA GPUs)")
        return Status(Availability.ABSENT, st.reason)
    if st.kind == "operator":
        return Status(Availability.NEEDS_OPERATOR, f"{st.reason}: {st.fix}")
    return Status(Availability.UNAVAILABLE, f"{st.reason} (retrying)")


_shared: NvmlBackend | None = None
_shared_lock = threading.Lock()


def shared_backend() -> NvmlBackend:
    """The process-wide real backend: gpu and pcie collectors share one NVML session."""
    global _shared
    with _shared_lock:
        if _shared is None:
            _shared = NvmlBackend()
        return _shared
