"""Signals of the ``exporter`` collector.

Mapped signals are the gpu/pcie collectors' own (same name, same spec), so rules do not care
whether a GPU was read through NVML or through dcgm-exporter. Only what NVML-side collectors
do not emit is catalogued here (``OWN``). ``CATALOGUE`` is what the shipped dcgm-exporter
mapping can produce plus ``exporter_up``; an instance loaded with other mappings reports the
signals of those mappings (``ExporterCollector.catalogue`` on the instance).
"""
from __future__ import annotations

from pathlib import Path

import yaml

from skewd.collectors.gpu.catalogue import CATALOGUE as GPU
from skewd.collectors.pcie.catalogue import CATALOGUE as PCIE
from skewd.model import SignalSpec, signal


def _g(name: str, kind: str, unit: str, desc: str) -> SignalSpec:
    return signal(name, kind, unit, "gpu", desc, "exporter")


UP = signal("exporter_up", "gauge", "bool", "node",
            "1 when the exporter endpoint answered with Prometheus text this tick, 0 when the "
            "scrape failed. Entity: the target's name (default: the mapping's source, e.g. "
            "dcgm-exporter), not \"\": one node may scrape several exporters.", "exporter")

OWN: list[SignalSpec] = [
    UP,
    _g("gpu_memory_free_bytes", "gauge", "bytes",
       "Framebuffer memory free (DCGM_FI_DEV_FB_FREE, MiB → bytes)."),
    _g("gpu_graphics_engine_active_ratio", "gauge", "ratio",
       "Fraction of time the graphics/compute engine was active (DCGM_FI_PROF_GR_ENGINE_ACTIVE)."),
    _g("gpu_tensor_active_ratio", "gauge", "ratio",
       "Fraction of cycles the tensor pipe was active (DCGM_FI_PROF_PIPE_TENSOR_ACTIVE)."),
    _g("gpu_dram_active_ratio", "gauge", "ratio",
       "Fraction of cycles the device-memory interface was busy (DCGM_FI_PROF_DRAM_ACTIVE): "
       "memory-bound work shows high DRAM with low tensor activity."),
    _g("gpu_nvlink_tx_bytes_per_second", "gauge", "bytes_per_second",
       "NVLink transmit rate, headers included (DCGM_FI_PROF_NVLINK_TX_BYTES)."),
    _g("gpu_nvlink_rx_bytes_per_second", "gauge", "bytes_per_second",
       "NVLink receive rate, headers included (DCGM_FI_PROF_NVLINK_RX_BYTES)."),
    _g("gpu_nvlink_bandwidth_raw", "gauge", "unconfirmed",
       "DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL (field 449; ..._THROUGHPUT_TOTAL in newer DCGM) as "
       "exported. dcgm-exporter types it a counter; its unit and whether it is cumulative are "
       "not documented: compare GPUs of one node with each other, not with link capacity."),
]

#: The BlueField DPU's view of its host's PCIe link (DTS diagnostic-data provider). Only a DPU
#: sees TLP counts: they tell many small DMAs (pinned-memory shortage, PCIE-7) from few large ones.
DPU_PCIE: list[SignalSpec] = [
    signal("dpu_pcie_inbound_bytes_per_second", "gauge", "bytes_per_second", "pci_device",
           "Host-to-device payload bytes per second on the host PCIe link, seen from the DPU "
           "(DTS diagnostic data; name unconfirmed, see mappings/dts.yaml).", "exporter"),
    signal("dpu_pcie_inbound_tlps_per_second", "gauge", "tlps_per_second", "pci_device",
           "Host-to-device TLPs per second on the host PCIe link, seen from the DPU: bytes per TLP "
           "far below the max payload size means many small DMAs.", "exporter"),
]
OWN += DPU_PCIE

SHIPPED = Path(__file__).resolve().parent / "mappings"
DEFAULT_MAPPING = SHIPPED / "dcgm-exporter.yaml"
DTS_MAPPING = SHIPPED / "dts.yaml"


def _targets(path: Path) -> list[str]:
    """Signal names a shipped mapping targets (read plainly; validation happens on load)."""
    doc = yaml.safe_load(path.read_text())
    out: list[str] = []
    for r in doc.get("rules", []):
        if r["signal"] not in out:
            out.append(r["signal"])
    return out


def known_for_shipped() -> dict[str, SignalSpec]:
    """gpu + pcie + own specs by name: what the shipped dcgm-exporter mapping may target."""
    return {s.name: s for s in [*GPU, *PCIE, *OWN]}


_known = known_for_shipped()
CATALOGUE: list[SignalSpec] = [UP] + [_known[n] for n in _targets(DEFAULT_MAPPING)
                                      if n in _known and n != UP.name] + DPU_PCIE
