"""The shared NVML backend and the test double it is exercised with."""
from __future__ import annotations

import ctypes
import sys
from pathlib import Path

import pynvml
import pytest

from skewd.collectors.base import Availability, CollectorStats
from skewd.collectors.gpu import GpuCollector
from skewd.collectors.nvml_backend import (GpuLost, NvmlBackend, NvmlUnavailable, Querier,
                                           decode_field_value, normalise_bus_id)
from skewd.collectors.pcie import PcieCollector

try:
    from tests.nvml_double import NvmlDouble
except ImportError:  # tests/ is not a package on this sys.path
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    from nvml_double import NvmlDouble

FIX = Path(__file__).resolve().parents[1] / "fixtures"
H100 = FIX / "gpu" / "h100-sxm-8gpu.yaml"
L4 = FIX / "gpu" / "l4-pcie-2gpu-driver525.yaml"
PCIE_SYS = FIX / "pcie" / "hgx-h100-cx7" / "sys"


# -- the double behaves like pynvml ------------------------------------------------------------
def test_double_returns_pynvml_types_and_raises_pynvml_errors():
    d = NvmlDouble.from_file(H100)
    with pytest.raises(pynvml.NVMLError_Uninitialized):  # like NVML: nothing works before init
        d.nvmlDeviceGetCount()
    d.nvmlInit()
    h = d.nvmlDeviceGetHandleByIndex(0)
    assert isinstance(h, pynvml.c_nvmlDevice_t)
    assert isinstance(d.nvmlDeviceGetUtilizationRates(h), pynvml.c_nvmlUtilization_t)
    assert isinstance(d.nvmlDeviceGetMemoryInfo(h), pynvml.c_nvmlMemory_t)
    assert d.nvmlDeviceGetPciInfo(h).busId == "00000000:18:00.0"
    with pytest.raises(pynvml.NVMLError_InvalidArgument):  # past the last NVLink link
        d.nvmlDeviceGetNvLinkState(h, 18)
    d.nvmlShutdown()
    with pytest.raises(pynvml.NVMLError_Uninitialized):
        d.nvmlDeviceGetUtilizationRates(h)

    l4 = NvmlDouble.from_file(L4)
    l4.nvmlInit()
    h = l4.nvmlDeviceGetHandleByIndex(0)
    with pytest.raises(pynvml.NVMLError_NotSupported):
        l4.nvmlDeviceGetNvLinkState(h, 0)
    with pytest.raises(pynvml.NVMLError_FunctionNotFound):
        l4.nvmlDeviceGetCurrentClocksEventReasons(h)
    values = l4.nvmlDeviceGetFieldValues(h, [pynvml.NVML_FI_DEV_NVLINK_LINK_COUNT])
    assert isinstance(values[0], pynvml.c_nvmlFieldValue_t)
    assert values[0].nvmlReturn == pynvml.NVML_ERROR_NOT_SUPPORTED


def test_double_rejects_stale_handles_across_sessions():
    d = NvmlDouble.from_file(H100)
    d.nvmlInit()
    h = d.nvmlDeviceGetHandleByIndex(0)
    d.nvmlShutdown()
    d.nvmlInit()
    with pytest.raises(pynvml.NVMLError_Uninitialized):
        d.nvmlDeviceGetPowerUsage(h)


def test_field_values_decode_by_value_type():
    d = NvmlDouble.from_file(H100)
    d.nvmlInit()
    h = d.nvmlDeviceGetHandleByIndex(3)
    ids = [pynvml.NVML_FI_DEV_NVLINK_LINK_COUNT, pynvml.NVML_FI_DEV_PCIE_COUNT_CORRECTABLE_ERRORS]
    vals = d.nvmlDeviceGetFieldValues(h, ids)
    assert vals[0].valueType == pynvml.NVML_VALUE_TYPE_UNSIGNED_INT
    assert vals[1].valueType == pynvml.NVML_VALUE_TYPE_UNSIGNED_LONG_LONG
    assert [decode_field_value(v) for v in vals] == [18.0, 112.0]


# -- error classification ----------------------------------------------------------------------
@pytest.mark.parametrize("code, kind, words", [
    ("NVML_ERROR_LIBRARY_NOT_FOUND", "absent", "no NVIDIA driver on this host"),
    ("NVML_ERROR_DRIVER_NOT_LOADED", "absent", "driver not loaded"),
    ("NVML_ERROR_NO_PERMISSION", "operator", "/dev/nvidia"),
    ("NVML_ERROR_LIB_RM_VERSION_MISMATCH", "operator", "reload"),
    ("NVML_ERROR_UNKNOWN", "transient", "initialisation failed"),
])
def test_init_failures_are_classified(code, kind, words):
    b = NvmlBackend(NvmlDouble.from_file(H100, init_error=code))
    st = b.check()
    assert st.kind == kind
    assert words in (st.reason + " " + st.fix)
    with pytest.raises(NvmlUnavailable):
        b.acquire()
    assert b.refs == 0


def test_check_counts_gpus_and_reports_driver():
    st = NvmlBackend(NvmlDouble.from_file(H100)).check()
    assert st.ok and st.device_count == 8 and st.driver_version == "550.54.15"
    empty = NvmlBackend(NvmlDouble({"driver_version": "550.54.15", "gpus": []})).check()
    assert empty.kind == "absent" and "no GPUs" in empty.reason


def test_driver_not_loaded_is_absent_unless_required():
    lib = NvmlDouble.from_file(H100, init_error="NVML_ERROR_DRIVER_NOT_LOADED")
    assert GpuCollector("n", backend=NvmlBackend(lib)).probe().availability is Availability.ABSENT
    st = GpuCollector("n", {"required": True}, backend=NvmlBackend(lib)).probe()
    assert st.availability is Availability.NEEDS_OPERATOR
    assert "modprobe nvidia" in st.reason


# -- refcounted session shared by the two collectors ------------------------------------------
def test_gpu_and_pcie_share_one_nvml_session():
    lib = NvmlDouble.from_file(H100)
    backend = NvmlBackend(lib)
    gpu = GpuCollector("n", {"xid_events": False}, backend=backend)
    pcie = PcieCollector("n", sys_root=PCIE_SYS, backend=backend)
    gpu.start()
    pcie.start()
    assert lib.refcount == 1 and lib.calls["nvmlInit"] == 1 and backend.refs == 2
    gpu.stop()
    assert lib.refcount == 1  # pcie still holds the session: its handles must stay valid
    batch = pcie.collect(1.0)
    assert "pcie_gpu_rx_bytes_per_second" in batch.signals()
    pcie.stop()
    assert lib.refcount == 0 and lib.calls["nvmlShutdown"] == 1
    pcie.stop()
    gpu.stop()
    assert lib.calls["nvmlShutdown"] == 1  # stop() is idempotent: no unbalanced shutdown


def test_release_without_acquire_is_harmless():
    lib = NvmlDouble.from_file(H100)
    b = NvmlBackend(lib)
    b.release()
    assert lib.calls["nvmlShutdown"] == 0


# -- querier: ask once what a GPU cannot answer -----------------------------------------------
def test_querier_skips_unsupported_after_one_call_and_counts_once():
    lib = NvmlDouble.from_file(L4)
    b = NvmlBackend(lib)
    b.acquire()
    stats = CollectorStats()
    q = Querier(b, stats, "test")
    (_, h), _ = b.handles()
    for _ in range(5):
        assert q.call(0, "nvlink0", "nvmlDeviceGetNvLinkState", h, 0) is None
    assert lib.calls["nvmlDeviceGetNvLinkState"] == 1
    assert stats.errors == {"not_supported": 1}
    assert "Not Supported" in q.unsupported[0]["nvlink0"]
    b.release()


def test_querier_raises_gpu_lost():
    lib = NvmlDouble.from_file(H100)
    b = NvmlBackend(lib)
    b.acquire()
    q = Querier(b, CollectorStats(), "test")
    handles = b.handles()
    lib.lose_gpu(2)
    with pytest.raises(GpuLost) as e:
        q.call(2, "power", "nvmlDeviceGetPowerUsage", handles[2][1])
    assert e.value.index == 2
    assert q.call(1, "power", "nvmlDeviceGetPowerUsage", handles[1][1]) == 612408
    b.release()


def test_index_of_maps_event_handles_back_to_gpu_index():
    lib = NvmlDouble.from_file(H100)
    b = NvmlBackend(lib)
    b.acquire()
    b.handles()
    fresh = ctypes.cast(ctypes.pointer(lib.gpus[5].struct), pynvml.c_nvmlDevice_t)  # a new pointer object
    assert b.index_of(fresh) == 5
    b.release()


def test_bus_id_normalised_to_sysfs_address():
    assert normalise_bus_id("00000000:5D:00.0") == "0000:5d:00.0"
    assert normalise_bus_id("00000001:AB:1f.7") == "0001:ab:1f.7"
    lib = NvmlDouble.from_file(H100)
    b = NvmlBackend(lib)
    b.acquire()
    addrs = b.pci_addresses()
    b.release()
    assert addrs[0] == "0000:18:00.0" and addrs[3] == "0000:5d:00.0" and len(addrs) == 8
    # the sysfs fixture is the same machine: its two GPUs are NVML's gpu0 and gpu3
    in_sysfs = {a for a in addrs.values() if (PCIE_SYS / "bus/pci/devices" / a).exists()}
    assert in_sysfs == {"0000:18:00.0", "0000:5d:00.0"}
