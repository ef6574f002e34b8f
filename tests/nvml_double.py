"""A stand-in for the ``pynvml`` module, driven by a per-GPU-model dump (tests/fixtures/gpu/*.yaml).

No NVIDIA driver exists where the tests run, so this double implements the pynvml functions that
skewd's NVML backend and collectors call, with pynvml's signatures, and answers with pynvml's
REAL types (``c_nvmlUtilization_t``, ``c_nvmlMemory_t``, ``nvmlPciInfo_t``, arrays of
``c_nvmlFieldValue_t`` with ``nvmlReturn`` set per element, ``c_nvmlEventData_t``, handles that
are genuine ``c_nvmlDevice_t`` pointers) and raises pynvml's REAL errors: ``pynvml.NVMLError(code)``
becomes ``NVMLError_NotSupported``, ``NVMLError_Timeout`` ... exactly as the binding does.

It is strict where NVML is strict: calls outside ``nvmlInit``/``nvmlShutdown`` or with a handle
from an earlier session raise ``NVMLError_Uninitialized``; a query the dump does not describe
raises ``LookupError`` (a fixture gap must fail a test, not pass silently).

Dump format (values in NVML's own units: mW, MHz, %, KB/s, bytes)::

    driver_version: "550.54.15"
    defaults: {<pynvml function name>: <value>, ...}   # merged under every GPU
    gpus:
      - {<pynvml function name>: <value>, ...}
    events:                                              # delivered once, to registered sets
      - {gpu: 6, eventType: nvmlEventTypeXidCriticalError, eventData: 94}

A value is a literal, an error name (``NVML_ERROR_NOT_SUPPORTED``), ``{seq: [...]}`` (the n-th
call returns the n-th element, then the last one: counters that rise between ticks), or — for
functions taking a type argument — a mapping keyed by the pynvml constant's name.
"""
from __future__ import annotations

import copy
import ctypes
import threading
import time
from collections import Counter
from pathlib import Path
from typing import Any

import pynvml
import yaml

_UNSET = object()


def _copy(v: Any) -> Any:
    """A deep copy of dump data (what YAML or JSON yields: dicts, lists, scalars). The fuzzer
    builds a double per input, and copy.deepcopy's memo cost as much as the queries."""
    if isinstance(v, dict):
        return {k: _copy(x) for k, x in v.items()}
    if isinstance(v, list):
        return [_copy(x) for x in v]
    if isinstance(v, (str, int, float, bool, type(None), bytes)):
        return v
    return copy.deepcopy(v)


def _merge(base: dict, over: dict) -> dict:
    out = _copy(base)
    for k, v in over.items():
        if isinstance(v, dict) and isinstance(out.get(k), dict) and "seq" not in v:
            out[k] = _merge(out[k], v)
        else:
            out[k] = _copy(v)
    return out


def _const(name: Any) -> Any:
    """``"NVML_CLOCK_SM"`` → ``pynvml.NVML_CLOCK_SM``; ints pass through."""
    if isinstance(name, str):
        if not hasattr(pynvml, name):
            raise LookupError(f"dump names {name!r}, which pynvml does not define")
        return getattr(pynvml, name)
    return name


def _raise(code: int) -> None:
    raise pynvml.NVMLError(code)


def _error_code(value: Any) -> int | None:
    if isinstance(value, str) and value.startswith("NVML_ERROR_"):
        return int(_const(value))
    return None


class _Gpu:
    def __init__(self, index: int, spec: dict) -> None:
        self.index = index
        self.spec = spec
        self.struct = pynvml.struct_c_nvmlDevice_t()  # kept alive: handles point at it
        self.lost = bool(spec.get("lost", False))


class _EventSet:
    def __init__(self) -> None:
        self.struct = pynvml.struct_c_nvmlEventSet_t()
        self.masks: dict[int, int] = {}  # gpu index → registered event types
        self.queue: list[tuple[int, int, int]] = []  # (gpu index, type, data)
        self.cond = threading.Condition()
        self.freed = False


class NvmlDouble:
    """Module-like object: pass it as ``NvmlBackend(lib=NvmlDouble(...))``."""

    def __init__(self, dump: dict, *, init_error: str | int | None = None) -> None:
        self.dump = dump
        defaults = dump.get("defaults", {})
        self.gpus = [_Gpu(i, _merge(defaults, g)) for i, g in enumerate(dump.get("gpus", []))]
        self._by_address = {ctypes.addressof(g.struct): g for g in self.gpus}  # what a handle points at
        self.init_error = _const(init_error) if init_error is not None else None
        self.refcount = 0
        self.session = 0
        self.calls: Counter[str] = Counter()
        self._seq_pos: Counter[tuple] = Counter()
        self._sets: dict[int, _EventSet] = {}
        self._pending_events = [dict(e) for e in dump.get("events", [])]
        self._lock = threading.RLock()

    @classmethod
    def from_file(cls, path: str | Path, **kw: Any) -> "NvmlDouble":
        return cls(yaml.safe_load(Path(path).read_text()), **kw)

    # -- test controls ------------------------------------------------------------------------
    def lose_gpu(self, index: int) -> None:
        """From now on every query about this GPU raises NVMLError_GpuIsLost (XID 79)."""
        self.gpus[index].lost = True

    def inject_event(self, index: int, event_type: int, data: int) -> None:
        """Deliver an event to every set registered for it on this GPU (like the driver does)."""
        with self._lock:
            for es in self._sets.values():
                if es.masks.get(index, 0) & event_type:
                    with es.cond:
                        es.queue.append((index, event_type, data))
                        es.cond.notify_all()

    # -- internals ----------------------------------------------------------------------------
    def _enter(self, fn: str) -> None:
        self.calls[fn] += 1
        if self.refcount == 0:
            _raise(pynvml.NVML_ERROR_UNINITIALIZED)

    def _gpu(self, handle: Any) -> _Gpu:
        g = self._by_address.get(ctypes.cast(handle, ctypes.c_void_p).value)
        if g is None:
            _raise(pynvml.NVML_ERROR_INVALID_ARGUMENT)
            raise AssertionError  # unreachable
        if getattr(handle, "_skewd_session", self.session) != self.session:
            _raise(pynvml.NVML_ERROR_UNINITIALIZED)
        if g.lost:
            _raise(pynvml.NVML_ERROR_GPU_IS_LOST)
        return g

    def _value(self, g: _Gpu, fn: str, key: Any = _UNSET) -> Any:
        if fn not in g.spec:
            raise LookupError(f"dump for gpu{g.index} does not describe {fn}")
        v = g.spec[fn]
        code = _error_code(v)
        if code is not None:
            _raise(code)
        if key is not _UNSET:
            if not isinstance(v, dict):
                raise LookupError(f"dump for gpu{g.index}: {fn} must map argument names to values")
            by_const = {_const(k): val for k, val in v.items()}
            if key not in by_const:
                raise LookupError(f"dump for gpu{g.index}: {fn} has no entry for argument {key!r}")
            v = by_const[key]
            code = _error_code(v)
            if code is not None:
                _raise(code)
        if isinstance(v, dict) and "seq" in v:
            pos_key = (g.index, fn, key)
            seq = v["seq"]
            n = self._seq_pos[pos_key]
            self._seq_pos[pos_key] += 1
            v = seq[min(n, len(seq) - 1)]
            code = _error_code(v)
            if code is not None:
                _raise(code)
        return v

    def _get(self, fn: str, handle: Any, key: Any = _UNSET) -> Any:
        self._enter(fn)
        return self._value(self._gpu(handle), fn, key)

    # -- library lifecycle --------------------------------------------------------------------
    def nvmlInit(self) -> None:
        self.calls["nvmlInit"] += 1
        if self.init_error is not None:
            _raise(self.init_error)
        with self._lock:
            if self.refcount == 0:
                self.session += 1
            self.refcount += 1

    def nvmlShutdown(self) -> None:
        self.calls["nvmlShutdown"] += 1
        with self._lock:
            if self.refcount == 0:
                _raise(pynvml.NVML_ERROR_UNINITIALIZED)
            self.refcount -= 1

    def nvmlSystemGetDriverVersion(self) -> str:
        self._enter("nvmlSystemGetDriverVersion")
        return str(self.dump.get("driver_version", ""))

    def nvmlDeviceGetCount(self) -> int:
        self._enter("nvmlDeviceGetCount")
        return len(self.gpus)

    def nvmlDeviceGetHandleByIndex(self, index: int) -> Any:
        self._enter("nvmlDeviceGetHandleByIndex")
        if not 0 <= index < len(self.gpus):
            _raise(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        g = self.gpus[index]
        if g.lost:
            _raise(pynvml.NVML_ERROR_GPU_IS_LOST)
        h = ctypes.pointer(g.struct)
        h = ctypes.cast(h, pynvml.c_nvmlDevice_t)
        h._skewd_session = self.session  # lets the double spot stale handles
        return h

    # -- identity -----------------------------------------------------------------------------
    def nvmlDeviceGetName(self, handle: Any) -> str:
        return str(self._get("nvmlDeviceGetName", handle))

    def nvmlDeviceGetUUID(self, handle: Any) -> str:
        return str(self._get("nvmlDeviceGetUUID", handle))

    def nvmlDeviceGetPciInfo(self, handle: Any) -> Any:
        v = self._get("nvmlDeviceGetPciInfo", handle)
        info = pynvml.nvmlPciInfo_t()
        info.busIdLegacy = v["busId"][-12:]
        for k in ("domain", "bus", "device", "pciDeviceId", "pciSubSystemId"):
            setattr(info, k, int(v[k]))
        info.busId = v["busId"]
        return info

    # -- utilisation, memory, power, clocks, temperature -------------------------------------
    def nvmlDeviceGetUtilizationRates(self, handle: Any) -> Any:
        v = self._get("nvmlDeviceGetUtilizationRates", handle)
        u = pynvml.c_nvmlUtilization_t()
        u.gpu, u.memory = int(v["gpu"]), int(v["memory"])
        return u

    def nvmlDeviceGetMemoryInfo(self, handle: Any, version: Any = None) -> Any:
        if version:
            raise LookupError("the double only models nvmlDeviceGetMemoryInfo v1")
        v = self._get("nvmlDeviceGetMemoryInfo", handle)
        m = pynvml.c_nvmlMemory_t()
        m.total, m.free, m.used = int(v["total"]), int(v["free"]), int(v["used"])
        return m

    def nvmlDeviceGetPowerUsage(self, handle: Any) -> int:
        return int(self._get("nvmlDeviceGetPowerUsage", handle))

    def nvmlDeviceGetEnforcedPowerLimit(self, handle: Any) -> int:
        return int(self._get("nvmlDeviceGetEnforcedPowerLimit", handle))

    def nvmlDeviceGetClockInfo(self, handle: Any, type: int) -> int:
        return int(self._get("nvmlDeviceGetClockInfo", handle, type))

    def nvmlDeviceGetMaxClockInfo(self, handle: Any, type: int) -> int:
        return int(self._get("nvmlDeviceGetMaxClockInfo", handle, type))

    def nvmlDeviceGetTemperature(self, handle: Any, sensor: int) -> int:
        return int(self._get("nvmlDeviceGetTemperature", handle, sensor))

    def nvmlDeviceGetCurrentClocksEventReasons(self, handle: Any) -> int:
        return int(self._get("nvmlDeviceGetCurrentClocksEventReasons", handle))

    def nvmlDeviceGetCurrentClocksThrottleReasons(self, handle: Any) -> int:
        return int(self._get("nvmlDeviceGetCurrentClocksThrottleReasons", handle))

    # -- NVLink -------------------------------------------------------------------------------
    def nvmlDeviceGetNvLinkState(self, device: Any, link: int) -> int:
        v = self._get("nvmlDeviceGetNvLinkState", device)
        if not isinstance(v, list):
            raise LookupError("nvmlDeviceGetNvLinkState must be a list of per-link states or an error")
        if not 0 <= link < len(v):
            _raise(pynvml.NVML_ERROR_INVALID_ARGUMENT)  # what NVML says past the last link
        code = _error_code(v[link])
        if code is not None:
            _raise(code)
        return int(v[link])

    # -- field values -------------------------------------------------------------------------
    def nvmlDeviceGetFieldValues(self, handle: Any, fieldIds: list) -> Any:
        self._enter("nvmlDeviceGetFieldValues")
        g = self._gpu(handle)
        spec = g.spec.get("nvmlDeviceGetFieldValues")
        if not isinstance(spec, dict):
            raise LookupError(f"dump for gpu{g.index} does not describe nvmlDeviceGetFieldValues")
        by_id = {int(_const(k)): v for k, v in spec.items()}
        values = (pynvml.c_nvmlFieldValue_t * len(fieldIds))()
        now_us = int(time.time() * 1e6)
        for i, fid in enumerate(fieldIds):
            fv = values[i]
            fv.fieldId = int(fid)
            fv.scopeId = 0
            fv.timestamp = now_us
            fv.latencyUsec = 0
            if fid not in by_id:
                raise LookupError(f"dump for gpu{g.index} has no field {fid}")
            entry = by_id[fid]
            vtype = None
            if isinstance(entry, dict) and "value" in entry:
                vtype = entry.get("type")
                entry = entry["value"]
            if isinstance(entry, dict) and "seq" in entry:
                pos_key = (g.index, "field", fid)
                n = self._seq_pos[pos_key]
                self._seq_pos[pos_key] += 1
                entry = entry["seq"][min(n, len(entry["seq"]) - 1)]
            code = _error_code(entry)
            if code is not None:
                fv.nvmlReturn = code
                continue
            fv.nvmlReturn = pynvml.NVML_SUCCESS
            if vtype is None:
                vtype = "DOUBLE" if isinstance(entry, float) else "UNSIGNED_LONG_LONG"
            fv.valueType = int(_const(f"NVML_VALUE_TYPE_{vtype}"))
            attr = {"DOUBLE": "dVal", "UNSIGNED_INT": "uiVal", "UNSIGNED_LONG": "ulVal",
                    "UNSIGNED_LONG_LONG": "ullVal", "SIGNED_LONG_LONG": "sllVal",
                    "SIGNED_INT": "siVal", "UNSIGNED_SHORT": "usVal"}[vtype]
            setattr(fv.value, attr, float(entry) if vtype == "DOUBLE" else int(entry))
        return values

    # -- PCIe ---------------------------------------------------------------------------------
    def nvmlDeviceGetPcieThroughput(self, device: Any, counter: int) -> int:
        return int(self._get("nvmlDeviceGetPcieThroughput", device, counter))

    def nvmlDeviceGetPcieReplayCounter(self, handle: Any) -> int:
        return int(self._get("nvmlDeviceGetPcieReplayCounter", handle))

    def nvmlDeviceGetCurrPcieLinkGeneration(self, handle: Any) -> int:
        return int(self._get("nvmlDeviceGetCurrPcieLinkGeneration", handle))

    def nvmlDeviceGetMaxPcieLinkGeneration(self, handle: Any) -> int:
        return int(self._get("nvmlDeviceGetMaxPcieLinkGeneration", handle))

    def nvmlDeviceGetCurrPcieLinkWidth(self, handle: Any) -> int:
        return int(self._get("nvmlDeviceGetCurrPcieLinkWidth", handle))

    def nvmlDeviceGetMaxPcieLinkWidth(self, handle: Any) -> int:
        return int(self._get("nvmlDeviceGetMaxPcieLinkWidth", handle))

    # -- events -------------------------------------------------------------------------------
    def _set(self, eventSet: Any) -> _EventSet:
        addr = ctypes.cast(eventSet, ctypes.c_void_p).value
        es = self._sets.get(addr)
        if es is None or es.freed:
            _raise(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        return es  # type: ignore[return-value]

    def nvmlEventSetCreate(self) -> Any:
        self._enter("nvmlEventSetCreate")
        es = _EventSet()
        with self._lock:
            self._sets[ctypes.addressof(es.struct)] = es
        return ctypes.cast(ctypes.pointer(es.struct), pynvml.c_nvmlEventSet_t)

    def nvmlDeviceRegisterEvents(self, handle: Any, eventTypes: int, eventSet: Any) -> None:
        self._enter("nvmlDeviceRegisterEvents")
        g = self._gpu(handle)
        supported = self._value(g, "nvmlDeviceRegisterEvents")  # event-type mask or an error
        if isinstance(supported, str):
            supported = _const(supported)
        if int(eventTypes) & ~int(supported):
            _raise(pynvml.NVML_ERROR_NOT_SUPPORTED)
        es = self._set(eventSet)
        with self._lock:
            es.masks[g.index] = es.masks.get(g.index, 0) | int(eventTypes)
            keep = []
            for e in self._pending_events:  # dump events fire once the GPU is being watched
                etype = int(_const(e["eventType"]))
                if e["gpu"] == g.index and etype & int(eventTypes):
                    with es.cond:
                        es.queue.append((g.index, etype, int(e["eventData"])))
                        es.cond.notify_all()
                else:
                    keep.append(e)
            self._pending_events = keep

    def nvmlEventSetWait(self, eventSet: Any, timeoutms: int) -> Any:
        self._enter("nvmlEventSetWait")
        es = self._set(eventSet)
        with es.cond:
            if not es.queue:
                es.cond.wait(timeout=timeoutms / 1000.0)
            if not es.queue or es.freed:
                _raise(pynvml.NVML_ERROR_TIMEOUT)
            index, etype, data = es.queue.pop(0)
        ev = pynvml.c_nvmlEventData_t()
        ev.device = ctypes.cast(ctypes.pointer(self.gpus[index].struct), pynvml.c_nvmlDevice_t)
        ev.eventType = etype
        ev.eventData = data
        ev.gpuInstanceId = 0xFFFFFFFF  # not a MIG instance
        ev.computeInstanceId = 0xFFFFFFFF
        return ev

    def nvmlEventSetFree(self, eventSet: Any) -> None:
        self._enter("nvmlEventSetFree")
        es = self._set(eventSet)
        with es.cond:
            es.freed = True
            es.cond.notify_all()
        with self._lock:
            self._sets.pop(ctypes.addressof(es.struct), None)

    @property
    def open_event_sets(self) -> int:
        return len(self._sets)
