"""Pure conversion of NVML answers (pynvml's structures and integers, in NVML units) to samples.

Nothing here calls NVML: :class:`GpuReading` holds what the collector got for one GPU in one
round (None where NVML did not answer), and :func:`gpu_samples` turns it into
``(signal, value)`` pairs in base units. Missing answers produce no sample rather than a zero,
so rules see "unknown", never a fake healthy value.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import pynvml

MHZ = 1e6

#: per-reason 0/1 gauges: the reasons rules act on (GPU-5 throttle skew, PCIE-4)
CLOCK_EVENT_FLAGS: dict[str, int] = {
    "gpu_clocks_event_sw_power_cap": pynvml.nvmlClocksEventReasonSwPowerCap,  # 0x4
    "gpu_clocks_event_hw_slowdown": pynvml.nvmlClocksEventReasonHwSlowdown,  # 0x8
    "gpu_clocks_event_sw_thermal": pynvml.nvmlClocksEventReasonSwThermalSlowdown,  # 0x20
    "gpu_clocks_event_hw_thermal": pynvml.nvmlClocksEventReasonHwThermalSlowdown,  # 0x40
    "gpu_clocks_event_hw_power_brake": pynvml.nvmlClocksEventReasonHwPowerBrakeSlowdown,  # 0x80
}


@dataclass
class GpuReading:
    """One round of NVML answers for one GPU; None = not answered (unsupported or failed)."""

    utilization: Any = None  # pynvml.c_nvmlUtilization_t (percent)
    memory: Any = None  # pynvml.c_nvmlMemory_t (bytes)
    power_mw: int | None = None
    power_limit_mw: int | None = None
    sm_clock_mhz: int | None = None
    sm_clock_max_mhz: int | None = None
    temperature_c: int | None = None
    clocks_event_reasons: int | None = None
    nvlink_links: int | None = None
    nvlink_active: int | None = None


def clock_event_flags(mask: int) -> list[tuple[str, float]]:
    """The reasons bitmask → one 0/1 gauge per important reason."""
    return [(name, 1.0 if mask & bit else 0.0) for name, bit in CLOCK_EVENT_FLAGS.items()]


def gpu_samples(r: GpuReading) -> list[tuple[str, float]]:
    out: list[tuple[str, float]] = []
    if r.utilization is not None:
        out.append(("gpu_utilization_ratio", r.utilization.gpu / 100.0))
        out.append(("gpu_memory_utilization_ratio", r.utilization.memory / 100.0))
    if r.memory is not None:
        out.append(("gpu_memory_used_bytes", float(r.memory.used)))
        out.append(("gpu_memory_total_bytes", float(r.memory.total)))
    if r.power_mw is not None:
        out.append(("gpu_power_watts", r.power_mw / 1000.0))
    if r.power_limit_mw is not None:
        out.append(("gpu_power_limit_watts", r.power_limit_mw / 1000.0))
    if r.sm_clock_mhz is not None:
        out.append(("gpu_sm_clock_hz", r.sm_clock_mhz * MHZ))
    if r.sm_clock_max_mhz is not None:
        out.append(("gpu_sm_clock_max_hz", r.sm_clock_max_mhz * MHZ))
    if r.temperature_c is not None:
        out.append(("gpu_temperature_celsius", float(r.temperature_c)))
    if r.clocks_event_reasons is not None:
        out.append(("gpu_clocks_event_reasons", float(r.clocks_event_reasons)))
        out.extend(clock_event_flags(r.clocks_event_reasons))
    if r.nvlink_links is not None and r.nvlink_links > 0:
        out.append(("gpu_nvlink_links", float(r.nvlink_links)))
        if r.nvlink_active is not None:
            out.append(("gpu_nvlink_links_active", float(r.nvlink_active)))
    return out
