"""Signals of the ``pcie`` collector.

Two views of the same links: sysfs (every selected PCI device: GPUs, NICs; entity = PCI address,
scope pci_device) and NVML (NVIDIA GPUs only; entity ``gpu<index>``, scope gpu). Join them with
``PcieCollector.gpu_pci_addresses()`` (gpu index → PCI address, from NVML's bus id).
"""
from __future__ import annotations

from skewd.model import SignalSpec, signal


def _d(name: str, kind: str, unit: str, desc: str) -> SignalSpec:
    return signal(name, kind, unit, "pci_device", desc, "pcie")


def _g(name: str, kind: str, unit: str, desc: str, wrap_bits: int | None = None) -> SignalSpec:
    return signal(name, kind, unit, "gpu", desc, "pcie", wrap_bits)


_AER_NOTE = (" AER counts errors as seen by this device: a faulty endpoint may show zeros while its "
             "link partner (the upstream port) counts them.")

SYSFS_SIGNALS: list[SignalSpec] = [
    _d("pcie_current_link_transfers_per_second", "gauge", "transfers_per_second",
       "Negotiated link speed (sysfs current_link_speed, '16.0 GT/s PCIe' → 16e9). NVIDIA GPUs drop "
       "to 2.5 GT/s when idle: compare under load."),
    _d("pcie_max_link_transfers_per_second", "gauge", "transfers_per_second",
       "Highest speed the device supports (sysfs max_link_speed)."),
    _d("pcie_current_link_gen", "gauge", "generation",
       "PCIe generation of the negotiated speed (2.5→1, 5→2, 8→3, 16→4, 32→5, 64→6 GT/s)."),
    _d("pcie_max_link_gen", "gauge", "generation", "PCIe generation of max_link_speed."),
    _d("pcie_current_link_width", "gauge", "lanes", "Negotiated link width (sysfs current_link_width)."),
    _d("pcie_max_link_width", "gauge", "lanes", "Widest link the device supports (sysfs max_link_width)."),
    _d("pcie_link_downtrained", "gauge", "bool",
       "1 when the link runs narrower or slower than the device's maximum. Width loss is a fault "
       "sign (bad slot/riser/cable); speed loss can be idle power saving or a slower slot."),
    _d("pcie_aer_correctable_errors_total", "counter", "messages",
       "ERR_COR messages sent by this device (aer_dev_correctable TOTAL_ERR_COR)." + _AER_NOTE),
    _d("pcie_aer_nonfatal_errors_total", "counter", "messages",
       "ERR_NONFATAL messages sent by this device (aer_dev_nonfatal TOTAL_ERR_NONFATAL)." + _AER_NOTE),
    _d("pcie_aer_fatal_errors_total", "counter", "messages",
       "ERR_FATAL messages sent by this device (aer_dev_fatal TOTAL_ERR_FATAL)." + _AER_NOTE),
    _d("pcie_aer_receiver_errors_total", "counter", "errors",
       "Physical-layer receiver errors (correctable RxErr): signal integrity."),
    _d("pcie_aer_bad_tlp_total", "counter", "errors", "Bad TLPs received (correctable BadTLP): LCRC failures, replayed."),
    _d("pcie_aer_bad_dllp_total", "counter", "errors", "Bad DLLPs received (correctable BadDLLP)."),
    _d("pcie_aer_replay_rollover_total", "counter", "errors",
       "REPLAY_NUM rollovers (correctable Rollover): the same TLP replayed 4 times, link retrains."),
    _d("pcie_aer_replay_timeout_total", "counter", "errors",
       "Replay timer timeouts (correctable Timeout): no ACK in time, TLP replayed."),
    _d("pcie_aer_data_link_protocol_errors_total", "counter", "errors",
       "Data link protocol errors (uncorrectable DLP; fatal and non-fatal reports summed)."),
    _d("pcie_aer_surprise_down_errors_total", "counter", "errors",
       "Surprise link down (uncorrectable SDES; fatal and non-fatal summed)."),
    _d("pcie_aer_poisoned_tlp_total", "counter", "errors",
       "Poisoned TLPs received (uncorrectable TLP; fatal and non-fatal summed): data corrupted upstream."),
    _d("pcie_aer_completion_timeout_total", "counter", "errors",
       "Completion timeouts (uncorrectable CmpltTO; fatal and non-fatal summed): a request never completed."),
    _d("pcie_aer_malformed_tlp_total", "counter", "errors",
       "Malformed TLPs (uncorrectable MalfTLP; fatal and non-fatal summed)."),
    _d("pcie_numa_node", "gauge", "node",
       "NUMA node the device is attached to (sysfs numa_node); -1 when the platform reports none."),
]

NVML_SIGNALS: list[SignalSpec] = [
    _g("pcie_gpu_rx_bytes_per_second", "gauge", "bytes_per_second",
       "Host-to-device PCIe traffic (NVML RX) over NVML's ~20 ms sample window; NVML KB taken as 1024 B."),
    _g("pcie_gpu_tx_bytes_per_second", "gauge", "bytes_per_second",
       "Device-to-host PCIe traffic (NVML TX) over NVML's ~20 ms sample window; NVML KB taken as 1024 B."),
    _g("pcie_gpu_replays_total", "counter", "replays",
       "PCIe replays seen by the GPU (nvmlDeviceGetPcieReplayCounter): link-level retransmissions.",
       wrap_bits=32),
    _g("pcie_gpu_current_link_gen", "gauge", "generation", "Current PCIe generation (NVML)."),
    _g("pcie_gpu_max_link_gen", "gauge", "generation",
       "Highest PCIe generation possible for this GPU in this system (NVML)."),
    _g("pcie_gpu_current_link_width", "gauge", "lanes", "Current PCIe link width (NVML)."),
    _g("pcie_gpu_max_link_width", "gauge", "lanes", "Widest PCIe link possible for this GPU (NVML)."),
    _g("pcie_gpu_link_downtrained", "gauge", "bool",
       "1 when the GPU's link runs below its max generation or width. GPUs lower the generation when "
       "idle: read together with utilisation; width loss is the hardware sign."),
    _g("pcie_gpu_correctable_errors_total", "counter", "errors",
       "Correctable PCIe errors counted by the GPU (NVML_FI_DEV_PCIE_COUNT_CORRECTABLE_ERRORS); newer drivers only."),
    _g("pcie_gpu_nonfatal_errors_total", "counter", "errors",
       "Non-fatal uncorrectable PCIe errors counted by the GPU (NVML_FI_DEV_PCIE_COUNT_NON_FATAL_ERROR)."),
    _g("pcie_gpu_fatal_errors_total", "counter", "errors",
       "Fatal PCIe errors counted by the GPU (NVML_FI_DEV_PCIE_COUNT_FATAL_ERROR)."),
    _g("pcie_gpu_link_recoveries_total", "counter", "events",
       "Link transitions from L0 to Recovery (NVML_FI_DEV_PCIE_L0_TO_RECOVERY_COUNTER): retraining."),
]

CATALOGUE: list[SignalSpec] = SYSFS_SIGNALS + NVML_SIGNALS
