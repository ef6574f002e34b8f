"""Pure parsing of one RDMA port's sysfs files into samples.

Input: ``{relative path: file text}`` for one ``/sys/class/infiniband/<dev>/ports/<port>``
directory, e.g. ``{"state": "4: ACTIVE\\n", "counters/port_xmit_data": "123\\n",
"hw_counters/out_of_buffer": "0\\n"}``. Files that are absent (firmware without some
hw_counters, drivers without a PMA) are simply not emitted.
"""
from __future__ import annotations

import re
from typing import Mapping, NamedTuple


class Sample(NamedTuple):
    entity: str
    signal: str
    value: float


#: counters/<file> → (signal, multiplier). port_*_data count 32-bit words ("octets divided
#: by 4", IBA PortCounters/PortCountersExtended): x4 gives bytes.
COUNTERS: dict[str, tuple[str, int]] = {
    "port_xmit_data": ("rdma_port_xmit_bytes_total", 4),
    "port_rcv_data": ("rdma_port_rcv_bytes_total", 4),
    "port_xmit_packets": ("rdma_port_xmit_packets_total", 1),
    "port_rcv_packets": ("rdma_port_rcv_packets_total", 1),
    "unicast_xmit_packets": ("rdma_port_unicast_xmit_packets_total", 1),
    "unicast_rcv_packets": ("rdma_port_unicast_rcv_packets_total", 1),
    "multicast_xmit_packets": ("rdma_port_multicast_xmit_packets_total", 1),
    "multicast_rcv_packets": ("rdma_port_multicast_rcv_packets_total", 1),
    "port_xmit_wait": ("rdma_port_xmit_wait_total", 1),
    "port_xmit_discards": ("rdma_port_xmit_discards_total", 1),
    "port_rcv_errors": ("rdma_port_rcv_errors_total", 1),
    "port_rcv_remote_physical_errors": ("rdma_port_rcv_remote_physical_errors_total", 1),
    "port_rcv_switch_relay_errors": ("rdma_port_rcv_switch_relay_errors_total", 1),
    "port_xmit_constraint_errors": ("rdma_port_xmit_constraint_errors_total", 1),
    "port_rcv_constraint_errors": ("rdma_port_rcv_constraint_errors_total", 1),
    "symbol_error": ("rdma_port_symbol_error_total", 1),
    "link_downed": ("rdma_port_link_downed_total", 1),
    "link_error_recovery": ("rdma_port_link_error_recovery_total", 1),
    "local_link_integrity_errors": ("rdma_port_local_link_integrity_errors_total", 1),
    "excessive_buffer_overrun_errors": ("rdma_port_excessive_buffer_overrun_errors_total", 1),
    "VL15_dropped": ("rdma_port_vl15_dropped_total", 1),
}

#: hw_counters/<file> (mlx5 names) emitted as rdma_port_<file>_total
HW_COUNTERS: tuple[str, ...] = (
    "out_of_sequence", "packet_seq_err", "local_ack_timeout_err", "rnr_nak_retry_err",
    "out_of_buffer", "duplicate_request", "implied_nak_seq_err",
    "np_ecn_marked_roce_packets", "np_cnp_sent", "rp_cnp_handled", "rp_cnp_ignored",
    "roce_adp_retrans", "roce_adp_retrans_to", "roce_slow_restart",
    "req_transport_retries_exceeded", "req_rnr_retries_exceeded",
)

#: link_layer text → gauge value (the kernel's enum rdma_link_layer order)
LINK_LAYERS = {"InfiniBand": 1, "Ethernet": 2}

_RATE = re.compile(r"^\s*([0-9]{1,12}(?:\.[0-9]{1,12})?)\s*Gb/sec")
_STATE = re.compile(r"^\s*([0-9]{1,9})\s*:")


def hw_signal(name: str) -> str:
    return f"rdma_port_{name}_total"


def parse_counter(text: str | None) -> int | None:
    """A counter file's value; None for "N/A (no PMA)" (driver without a PMA) or garbage."""
    if text is None:
        return None
    s = text.strip()
    # ASCII digits only (str.isdigit also accepts "²", which int() refuses), and no more than a
    # 64-bit counter holds: anything else is garbage, not a sample
    if not (s.isascii() and s.isdigit()) or len(s) > 20:
        return None
    v = int(s)
    return v if v < 1 << 64 else None


def parse_state(text: str | None) -> int | None:
    """``"4: ACTIVE"`` → 4 (state and phys_state files)."""
    m = _STATE.match(text or "")
    return int(m.group(1)) if m else None


def parse_rate(text: str | None) -> float | None:
    """``"100 Gb/sec (4X EDR)"`` → bytes per second (decimal Gb, as IBA rates are quoted)."""
    m = _RATE.match(text or "")
    return float(m.group(1)) * 1e9 / 8 if m else None


def port_samples(entity: str, files: Mapping[str, str]) -> list[Sample]:
    """All samples for one port (entity ``mlx5_0/1``) from its files."""
    out: list[Sample] = []
    for fname, (sig, mult) in COUNTERS.items():
        v = parse_counter(files.get(f"counters/{fname}"))
        if v is not None:
            out.append(Sample(entity, sig, float(v * mult)))
    for name in HW_COUNTERS:
        v = parse_counter(files.get(f"hw_counters/{name}"))
        if v is not None:
            out.append(Sample(entity, hw_signal(name), float(v)))
    state = parse_state(files.get("state"))
    if state is not None:
        out.append(Sample(entity, "rdma_port_state", float(state)))
        out.append(Sample(entity, "rdma_port_active", 1.0 if state == 4 else 0.0))
    phys = parse_state(files.get("phys_state"))
    if phys is not None:
        out.append(Sample(entity, "rdma_port_phys_state", float(phys)))
    rate = parse_rate(files.get("rate"))
    if rate is not None:
        out.append(Sample(entity, "rdma_port_rate_bytes", rate))
    ll = files.get("link_layer")
    if ll is not None:
        out.append(Sample(entity, "rdma_port_link_layer", float(LINK_LAYERS.get(ll.strip(), 0))))
    return out


def port_files() -> list[str]:
    """The relative paths a collector should read for one port (nothing else is needed)."""
    return (["state", "phys_state", "rate", "link_layer"]
            + [f"counters/{n}" for n in COUNTERS] + [f"hw_counters/{n}" for n in HW_COUNTERS])


def resource_samples(text: str | None) -> list[Sample]:
    """``rdma -j resource show`` (iproute2's JSON summary of RDMA netlink resources) →
    per-device object counts. Entities are device names (``mlx5_0``): resource tracking is per
    device, not per port.

    [{"ifindex":1,"ifname":"mlx5_0","pd":3,"cq":7,"qp":4,"cm_id":0,"mr":12,"ctx":1,"srq":0}]
    """
    import json

    if not text:
        return []
    try:
        data = json.loads(text)
    except (ValueError, RecursionError):  # not JSON, or nested deeper than the decoder goes
        return []
    out: list[Sample] = []
    for dev in data if isinstance(data, list) else []:
        name = dev.get("ifname") if isinstance(dev, dict) else None
        if not isinstance(name, str):
            continue
        for key, sig in (("mr", "rdma_dev_mrs"), ("qp", "rdma_dev_qps")):
            v = dev.get(key)
            if isinstance(v, (int, float)) and not isinstance(v, bool) and 0 <= v < 2 ** 64:
                out.append(Sample(name, sig, float(v)))
    return out
