"""Values no healthy kernel, exporter or driver writes, found by bench/fuzz.py: each parser
answers with its documented error (ValueError) or leaves the value out, and never raises
OverflowError, StopIteration or spins."""
from __future__ import annotations

import math
import time
from pathlib import Path

import pytest

from skewd.collectors.exporter.parse import series
from skewd.collectors.gpu import GpuCollector
from skewd.collectors.host import parse as host
from skewd.collectors.netdev.parse import speed_samples
from skewd.collectors.nvml_backend import NvmlBackend
from skewd.collectors.pcie.parse import device_samples
from skewd.collectors.rdma.parse import parse_counter, parse_rate, parse_state, port_samples
from skewd.collectors.vllm.parse import histogram_quantile, parse_page

from tests.nvml_double import NvmlDouble

HUGE = "9" * 400


def test_sysfs_counters_past_64_bits_or_in_foreign_digits_are_not_samples() -> None:
    assert parse_counter(HUGE) is None and parse_counter(str(1 << 64)) is None
    assert parse_counter(str((1 << 64) - 1)) == (1 << 64) - 1
    assert parse_counter("\u00b2") is None  # "²".isdigit() is True, int("²") fails
    assert port_samples("mlx5_0/1", {"counters/port_xmit_data": HUGE, "state": HUGE + ": ACTIVE"}) == []
    assert parse_state("4: ACTIVE") == 4 and parse_rate(HUGE + " Gb/sec") is None
    assert device_samples({"aer_dev_correctable": f"TOTAL_ERR_COR {HUGE}", "numa_node": HUGE}) == []
    assert speed_samples("eth0", HUGE) == [] and speed_samples("eth0", "25000")[0].value == 25000 * 125_000.0


def test_deeply_nested_json_from_rdma_tool_or_nccl_inspector_is_refused_cleanly() -> None:
    from skewd.collectors.nccl.parse import JsonStream, RecordError
    from skewd.collectors.rdma.parse import resource_samples

    deep = "[" * 100_000 + "]" * 100_000
    assert resource_samples(deep) == []
    assert resource_samples(f'[{{"ifname": "mlx5_0", "qp": {HUGE}, "mr": 3}}]') == [("mlx5_0", "rdma_dev_mrs", 3.0)]
    with pytest.raises(RecordError, match="nested deeper"):
        JsonStream().feed(deep)


def test_proc_stat_with_an_impossible_tick_count_is_a_value_error() -> None:
    with pytest.raises(ValueError, match="not a 64-bit tick count"):
        host.parse_stat(f"cpu  {HUGE} 0 0 0\n")
    assert host.parse_stat("cpu  100 0 0 0\n")


def test_prometheus_integers_past_float_range_read_as_infinity() -> None:
    page = (f'# TYPE vllm:num_requests_running gauge\nvllm:num_requests_running{{model_name="m",engine="0"}} {HUGE}\n')
    assert parse_page(page)[("m", "0")].gauges["running"] == math.inf
    assert [v for _, _, v in series(f"x_total {HUGE}\nx_total -{HUGE}\n")] == [math.inf, -math.inf]


def test_histogram_quantile_of_nan_counts_is_nan_not_stop_iteration() -> None:
    assert math.isnan(histogram_quantile(0.5, {0.1: math.nan, math.inf: math.nan}))
    assert math.isnan(histogram_quantile(0.5, {0.1: 1.0, math.inf: math.inf}))
    assert histogram_quantile(0.5, {0.1: 1.0, 1.0: 2.0, math.inf: 2.0}) == pytest.approx(0.1)


@pytest.mark.parametrize("links", [0xFFFFFFFF, float("nan"), -1])
def test_an_absurd_nvlink_count_from_the_driver_does_not_walk_billions_of_links(links) -> None:
    dump = NvmlDouble.from_file(Path(__file__).resolve().parents[1] / "fixtures" / "gpu" / "h100-sxm-8gpu.yaml").dump
    dump["defaults"]["nvmlDeviceGetFieldValues"]["NVML_FI_DEV_NVLINK_LINK_COUNT"] = {
        "value": links, "type": "DOUBLE" if isinstance(links, float) else "UNSIGNED_INT" if links >= 0 else
        "SIGNED_INT"}
    dump.pop("events", None)
    c = GpuCollector("n1", {"xid_events": False}, backend=NvmlBackend(NvmlDouble(dump)))
    t0 = time.monotonic()
    try:
        batch = c.collect(1.0)
    finally:
        c.stop()
    assert time.monotonic() - t0 < 5.0
    vals = {(e, s) for _, _, e, s, _ in batch.rows()}
    assert ("gpu0", "gpu_utilization_ratio") in vals and ("gpu0", "gpu_nvlink_links") not in vals
    assert c.stats.errors.get("read", 0) >= 1
