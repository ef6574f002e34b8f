"""Signals of the ``gpu`` collector (NVML). Entity ``gpu<index>``, scope gpu."""
from __future__ import annotations

from skewd.model import SignalSpec, signal


def _g(name: str, kind: str, unit: str, desc: str, wrap_bits: int | None = None) -> SignalSpec:
    return signal(name, kind, unit, "gpu", desc, "gpu", wrap_bits)


CATALOGUE: list[SignalSpec] = [
    _g("gpu_utilization_ratio", "gauge", "ratio",
       "Fraction of the last NVML sample period (1/6 s to 1 s) in which a kernel ran on the GPU "
       "(nvmlDeviceGetUtilizationRates .gpu / 100). Says busy, not how much of the SMs."),
    _g("gpu_memory_utilization_ratio", "gauge", "ratio",
       "Fraction of the last sample period in which device memory was being read or written "
       "(.memory / 100): bandwidth activity, NOT capacity (see gpu_memory_used_bytes)."),
    _g("gpu_memory_used_bytes", "gauge", "bytes",
       "Framebuffer memory in use, including driver-reserved memory (nvmlDeviceGetMemoryInfo v1)."),
    _g("gpu_memory_total_bytes", "gauge", "bytes", "Framebuffer memory size."),
    _g("gpu_power_watts", "gauge", "watts", "Board power draw (nvmlDeviceGetPowerUsage, mW / 1000)."),
    _g("gpu_power_limit_watts", "gauge", "watts",
       "Enforced power limit: the lower of the admin cap and board limits (nvmlDeviceGetEnforcedPowerLimit)."),
    _g("gpu_sm_clock_hz", "gauge", "hz", "Current SM clock."),
    _g("gpu_sm_clock_max_hz", "gauge", "hz", "Maximum SM clock of this GPU (nvmlDeviceGetMaxClockInfo)."),
    _g("gpu_temperature_celsius", "gauge", "celsius", "GPU die temperature."),
    _g("gpu_clocks_event_reasons", "gauge", "bitmask",
       "Why clocks are below max right now: nvmlDeviceGetCurrentClocksEventReasons bitmask "
       "(GpuIdle 0x1, AppClocks 0x2, SwPowerCap 0x4, HwSlowdown 0x8, SyncBoost 0x10, SwThermal 0x20, "
       "HwThermal 0x40, HwPowerBrake 0x80). Falls back to the older ...ThrottleReasons call."),
    _g("gpu_clocks_event_sw_power_cap", "gauge", "bool",
       "1 while the driver holds clocks down to stay under the power limit (SwPowerCap 0x4)."),
    _g("gpu_clocks_event_hw_slowdown", "gauge", "bool",
       "1 while hardware slowdown is engaged (HwSlowdown 0x8): thermal, power brake or an external "
       "signal halving clocks or worse. Also set whenever hw_thermal or hw_power_brake is."),
    _g("gpu_clocks_event_sw_thermal", "gauge", "bool",
       "1 while the driver lowers clocks to keep the GPU under its temperature target (SwThermal 0x20)."),
    _g("gpu_clocks_event_hw_thermal", "gauge", "bool",
       "1 while the hardware thermal slowdown is engaged (HwThermal 0x40): cooling problem."),
    _g("gpu_clocks_event_hw_power_brake", "gauge", "bool",
       "1 while an external power brake (e.g. the PSU/BMC) is asserted (HwPowerBrake 0x80)."),
    _g("gpu_nvlink_links", "gauge", "links",
       "NVLink links this GPU has (NVML_FI_DEV_NVLINK_LINK_COUNT). Not emitted on GPUs without NVLink."),
    _g("gpu_nvlink_links_active", "gauge", "links",
       "NVLink links currently up (nvmlDeviceGetNvLinkState); below gpu_nvlink_links means a link is down "
       "and peer traffic falls back to fewer links or PCIe."),
    _g("gpu_xid_errors_total", "counter", "events",
       "XID critical-error events seen by the agent's event waiter since the collector was created "
       "(nvmlEventTypeXidCriticalError). Emitted only for GPUs that accept XID event registration."),
    _g("gpu_xid_last_code", "gauge", "code",
       "XID code of the most recent XID event on this GPU (e.g. 79 fell off the bus, 94/95 ECC); "
       "0 when none was seen since the collector was created."),
    _g("gpu_responding", "gauge", "bool",
       "1 when NVML answered for this GPU this round; 0 when NVML reports it lost (GPU is lost / "
       "fallen off the bus) or cannot open it."),
]
