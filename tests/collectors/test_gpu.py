"""The gpu collector against NVML dumps (through the pynvml-faithful double) and on this host."""
from __future__ import annotations

import ctypes.util
import sys
import time
from pathlib import Path

import pynvml
import pytest

from skewd.collectors.base import Availability, CollectorError
from skewd.collectors.gpu import COLLECTOR, GpuCollector
from skewd.collectors.gpu import parse
from skewd.collectors.nvml_backend import NvmlBackend
from skewd.collectors.registry import collector_class
from skewd.model import Kind

try:
    from tests.nvml_double import NvmlDouble
except ImportError:  # tests/ is not a package on this sys.path
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    from nvml_double import NvmlDouble

FIX = Path(__file__).resolve().parents[1] / "fixtures" / "gpu"
H100 = FIX / "h100-sxm-8gpu.yaml"
L4 = FIX / "l4-pcie-2gpu-driver525.yaml"
XID = pynvml.nvmlEventTypeXidCriticalError


def values(batch) -> dict[tuple[str, str], float]:
    return {(e, s): v for _, _, e, s, v in batch.rows()}


def make(path: Path, config: dict | None = None) -> tuple[GpuCollector, NvmlDouble]:
    lib = NvmlDouble.from_file(path)
    return GpuCollector("node1", config or {}, backend=NvmlBackend(lib)), lib


def wait_for(pred, timeout: float = 5.0) -> bool:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if pred():
            return True
        time.sleep(0.02)
    return False


def nvml_library_present() -> bool:
    try:
        ctypes.CDLL("libnvidia-ml.so.1")
        return True
    except OSError:
        return ctypes.util.find_library("nvidia-ml") is not None


# -- pure parsing of pynvml structures ---------------------------------------------------------
def test_gpu_samples_convert_nvml_units_to_base_units():
    util = pynvml.c_nvmlUtilization_t()
    util.gpu, util.memory = 93, 48
    mem = pynvml.c_nvmlMemory_t()
    mem.total, mem.free, mem.used = 85520809984, 3614441472, 81906368512
    got = dict(parse.gpu_samples(parse.GpuReading(
        utilization=util, memory=mem, power_mw=612408, power_limit_mw=700000, sm_clock_mhz=1275,
        sm_clock_max_mhz=1980, temperature_c=88, clocks_event_reasons=0x28, nvlink_links=18,
        nvlink_active=17)))
    assert got["gpu_utilization_ratio"] == pytest.approx(0.93)
    assert got["gpu_memory_utilization_ratio"] == pytest.approx(0.48)
    assert got["gpu_memory_used_bytes"] == 81906368512
    assert got["gpu_memory_total_bytes"] == 85520809984
    assert got["gpu_power_watts"] == pytest.approx(612.408)
    assert got["gpu_power_limit_watts"] == 700.0
    assert got["gpu_sm_clock_hz"] == 1.275e9 and got["gpu_sm_clock_max_hz"] == 1.98e9
    assert got["gpu_temperature_celsius"] == 88
    assert got["gpu_clocks_event_reasons"] == 0x28
    assert got["gpu_nvlink_links"] == 18 and got["gpu_nvlink_links_active"] == 17


@pytest.mark.parametrize("mask, on", [
    (0x0, set()),
    (0x1, set()),  # GpuIdle is not a throttle
    (0x4, {"gpu_clocks_event_sw_power_cap"}),
    (0x28, {"gpu_clocks_event_hw_slowdown", "gpu_clocks_event_sw_thermal"}),
    (0xC8, {"gpu_clocks_event_hw_slowdown", "gpu_clocks_event_hw_thermal", "gpu_clocks_event_hw_power_brake"}),
])
def test_clock_event_flags_decode_the_bitmask(mask, on):
    flags = dict(parse.clock_event_flags(mask))
    assert set(flags) == set(parse.CLOCK_EVENT_FLAGS)
    assert {k for k, v in flags.items() if v == 1.0} == on


def test_missing_answers_emit_nothing_rather_than_zero():
    assert parse.gpu_samples(parse.GpuReading()) == []
    # a GPU without NVLink: neither count nor active
    assert not {s for s, _ in parse.gpu_samples(parse.GpuReading(nvlink_links=0, nvlink_active=0))}


# -- the collector on an 8x H100 dump -----------------------------------------------------------
def test_h100_node_values_and_scenario():
    c, lib = make(H100, {"xid_events": False})
    try:
        v = values(c.collect(10.0))
    finally:
        c.stop()
    assert {e for e, _ in v} == {f"gpu{i}" for i in range(8)}
    assert v[("gpu0", "gpu_power_limit_watts")] == 700.0
    assert v[("gpu0", "gpu_memory_total_bytes")] == 85520809984
    # gpu2 is throttled: HW slowdown + SW thermal, clocks pulled down, peers are not
    assert v[("gpu2", "gpu_clocks_event_reasons")] == 0x28
    assert v[("gpu2", "gpu_clocks_event_hw_slowdown")] == 1.0
    assert v[("gpu2", "gpu_clocks_event_sw_thermal")] == 1.0
    assert v[("gpu2", "gpu_clocks_event_hw_thermal")] == 0.0
    assert v[("gpu2", "gpu_sm_clock_hz")] == 1.275e9
    assert all(v[(f"gpu{i}", "gpu_clocks_event_hw_slowdown")] == 0.0 for i in range(8) if i != 2)
    # gpu7 lost one NVLink link
    assert (v[("gpu7", "gpu_nvlink_links")], v[("gpu7", "gpu_nvlink_links_active")]) == (18.0, 17.0)
    assert v[("gpu0", "gpu_nvlink_links_active")] == 18.0
    assert all(v[(f"gpu{i}", "gpu_responding")] == 1.0 for i in range(8))
    assert lib.refcount == 0  # collect() without start() opened a session; stop() closed it


def test_values_follow_the_device_between_ticks():
    c, _ = make(H100, {"xid_events": False})
    first = values(c.collect(1.0))
    second = values(c.collect(2.0))
    c.stop()
    assert first[("gpu1", "gpu_utilization_ratio")] == pytest.approx(0.91)
    assert second[("gpu1", "gpu_utilization_ratio")] == pytest.approx(0.95)


def test_xid_event_counted_by_the_waiter_thread():
    c, lib = make(H100)
    c.start()
    try:
        assert wait_for(lambda: values(c.collect(1.0)).get(("gpu6", "gpu_xid_errors_total")) == 1.0)
        v = values(c.collect(2.0))
        assert v[("gpu6", "gpu_xid_last_code")] == 94.0
        assert v[("gpu0", "gpu_xid_errors_total")] == 0.0 and v[("gpu0", "gpu_xid_last_code")] == 0.0
        lib.inject_event(6, XID, 79)  # later: it fell off the bus
        lib.inject_event(0, XID, 48)
        assert wait_for(lambda: values(c.collect(3.0)).get(("gpu6", "gpu_xid_errors_total")) == 2.0)
        v = values(c.collect(4.0))
        assert v[("gpu6", "gpu_xid_last_code")] == 79.0
        assert wait_for(lambda: values(c.collect(5.0)).get(("gpu0", "gpu_xid_last_code")) == 48.0)
    finally:
        t0 = time.monotonic()
        c.stop()
        stopped_in = time.monotonic() - t0
    assert stopped_in < 1.5  # the waiter wakes up within its wait timeout
    assert lib.open_event_sets == 0 and lib.refcount == 0


def test_xid_counter_survives_restart():
    c, lib = make(H100)
    c.start()
    assert wait_for(lambda: values(c.collect(1.0)).get(("gpu6", "gpu_xid_errors_total")) == 1.0)
    c.stop()
    c.start()
    lib.inject_event(6, XID, 94)
    try:
        assert wait_for(lambda: values(c.collect(2.0)).get(("gpu6", "gpu_xid_errors_total")) == 2.0)
    finally:
        c.stop()


def test_lost_gpu_reports_not_responding_and_others_continue():
    c, lib = make(H100, {"xid_events": False})
    c.collect(1.0)
    lib.lose_gpu(4)
    v = values(c.collect(2.0))
    c.stop()
    assert v[("gpu4", "gpu_responding")] == 0.0
    assert [s for e, s in v if e == "gpu4"] == ["gpu_responding"]
    assert v[("gpu5", "gpu_responding")] == 1.0 and ("gpu5", "gpu_power_watts") in v


# -- an older, smaller node: what it cannot answer is asked once ------------------------------
def test_old_driver_falls_back_to_throttle_reasons_and_skips_unsupported_quietly():
    c, lib = make(L4)
    c.start()
    try:
        v = values(c.collect(1.0))
        errors_after_first = dict(c.stats.errors)
        calls_after_first = dict(lib.calls)
        for t in range(2, 7):
            v = values(c.collect(float(t)))
    finally:
        c.stop()
    assert v[("gpu0", "gpu_clocks_event_reasons")] == 0x4  # via ...ThrottleReasons
    assert v[("gpu0", "gpu_clocks_event_sw_power_cap")] == 1.0
    assert v[("gpu1", "gpu_clocks_event_reasons")] == 0x1
    assert not any(s.startswith("gpu_nvlink") for _, s in v)
    # counted once per (GPU, query), never again; the failing calls are not repeated
    assert c.stats.errors == errors_after_first and set(c.stats.errors) == {"not_supported"}
    assert errors_after_first["not_supported"] == 2 * 3  # event reasons, NVLink count field, NVLink
    for fn in ("nvmlDeviceGetCurrentClocksEventReasons", "nvmlDeviceGetNvLinkState", "nvmlDeviceGetFieldValues"):
        assert lib.calls[fn] == calls_after_first[fn], fn
    assert lib.calls["nvmlDeviceGetCurrentClocksThrottleReasons"] == 2 * 6
    assert c.query.unsupported[0]["clocks_event_reasons"] == "Function Not Found"


# -- catalogue contract --------------------------------------------------------------------------
def test_every_emitted_signal_is_catalogued_and_every_catalogued_signal_is_emitted():
    emitted: set[str] = set()
    for path in (H100, L4):
        c, _ = make(path)
        c.start()
        try:
            if path == H100:
                assert wait_for(lambda: values(c.collect(1.0)).get(("gpu6", "gpu_xid_errors_total")) == 1.0)
            batch = c.collect(2.0)
        finally:
            c.stop()
        emitted |= batch.signals()
        assert set(batch.entity.tolist()) <= {f"gpu{i}" for i in range(8)}
    catalogued = {s.name for s in COLLECTOR.catalogue}
    assert emitted - catalogued == set()
    assert catalogued - emitted == set()
    for spec in COLLECTOR.catalogue:
        assert spec.collector == "gpu" and spec.scope.value == "gpu"
        assert spec.name.endswith("_total") == (spec.kind is Kind.COUNTER)


def test_registry_finds_the_gpu_collector():
    assert collector_class("gpu") is GpuCollector


# -- this host -----------------------------------------------------------------------------------
@pytest.mark.skipif(nvml_library_present(), reason="this host has an NVIDIA driver (libnvidia-ml)")
def test_probe_on_this_host_without_driver():
    st = GpuCollector("node1").probe()
    assert st.availability is Availability.ABSENT
    assert st.reason == "NVML library not found: no NVIDIA driver on this host"
    st = GpuCollector("node1", {"required": True}).probe()
    assert st.availability is Availability.NEEDS_OPERATOR
    assert "install the NVIDIA driver" in st.reason and "collectors.gpu.required" in st.reason


@pytest.mark.skipif(nvml_library_present(), reason="this host has an NVIDIA driver (libnvidia-ml)")
def test_lifecycle_on_this_host_without_driver():
    c = GpuCollector("node1")
    c.stop()  # safe before start
    c.start()  # returns even though NVML cannot initialise
    c.stop()
    c.stop()
    c.start()
    with pytest.raises(CollectorError) as e:
        c.collect(1.0)
    assert "NVML library not found" in str(e.value)
    c.stop()


def test_lifecycle_start_stop_restart_with_double():
    c, lib = make(H100)
    c.stop()
    for t in (1.0, 2.0):
        c.start()
        assert "gpu_power_watts" in c.collect(t).signals()  # fresh handles after a restart
        c.stop()
        c.stop()
        assert lib.refcount == 0 and lib.open_event_sets == 0


@pytest.mark.parametrize("config", [{"required": "yes"}, {"xid_events": 1}])
def test_bad_config_values_are_refused(config):
    with pytest.raises(ValueError, match="collectors.gpu"):
        GpuCollector("node1", config, backend=NvmlBackend(NvmlDouble.from_file(H100)))
