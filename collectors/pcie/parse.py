"""Pure parsing for the ``pcie`` collector: sysfs text in, ``(signal, value)`` pairs out.

Formats (Linux ``drivers/pci/pci-sysfs.c`` and ``drivers/pci/pcie/aer.c``):

- ``current_link_speed`` / ``max_link_speed``: ``"16.0 GT/s PCIe"`` since 5.6 (``pci_speed_string``),
  ``"16 GT/s"`` before; ``"Unknown"`` / ``"Unknown speed"`` when the link state is not known.
- ``current_link_width`` / ``max_link_width``: ``"%u"`` lanes.
- ``aer_dev_{correctable,nonfatal,fatal}``: one ``"<name> <count>"`` line per named error bit,
  ``"<array>_bit[<n>] <count>"`` for unnamed bits with a non-zero count, then
  ``"TOTAL_ERR_COR|TOTAL_ERR_NONFATAL|TOTAL_ERR_FATAL <count>"``. Names are short since ~5.x
  (``RxErr``, ``BadTLP``); 4.19 printed long ones (``Receiver Error``, ``Bad TLP``): both are read.
- ``class``: ``"0x030200"`` (class, subclass, prog-if).
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Iterable, Mapping

import pynvml

_SPEED = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*GT/s")
_GEN_BY_GTS = {2.5: 1, 5.0: 2, 8.0: 3, 16.0: 4, 32.0: 5, 64.0: 6}
_VALID_WIDTHS = {0, 1, 2, 4, 8, 12, 16, 32}
_ADDRESS = re.compile(r"^(?:([0-9a-fA-F]{4,8}):)?([0-9a-fA-F]{2}):([0-1][0-9a-fA-F])\.([0-7])$")

#: sysfs files read per device, in the order the collector reads them
DEVICE_FILES = ("current_link_speed", "max_link_speed", "current_link_width", "max_link_width",
                "aer_dev_correctable", "aer_dev_nonfatal", "aer_dev_fatal", "numa_node")

#: correctable AER lines worth their own counter (modern short name, 4.19 long name)
AER_CORRECTABLE: dict[str, tuple[str, ...]] = {
    "pcie_aer_receiver_errors_total": ("RxErr", "Receiver Error"),
    "pcie_aer_bad_tlp_total": ("BadTLP", "Bad TLP"),
    "pcie_aer_bad_dllp_total": ("BadDLLP", "Bad DLLP"),
    "pcie_aer_replay_rollover_total": ("Rollover", "RELAY_NUM Rollover"),
    "pcie_aer_replay_timeout_total": ("Timeout", "Replay Timer Timeout"),
}
#: uncorrectable AER lines; the count is summed over the fatal and non-fatal files
AER_UNCORRECTABLE: dict[str, tuple[str, ...]] = {
    "pcie_aer_data_link_protocol_errors_total": ("DLP", "Data Link Protocol"),
    "pcie_aer_surprise_down_errors_total": ("SDES", "Surprise Down Error"),
    "pcie_aer_poisoned_tlp_total": ("TLP", "Poisoned TLP"),
    "pcie_aer_completion_timeout_total": ("CmpltTO", "Completion Timeout"),
    "pcie_aer_malformed_tlp_total": ("MalfTLP", "Malformed TLP"),
}
AER_TOTALS = {
    "aer_dev_correctable": ("TOTAL_ERR_COR", "pcie_aer_correctable_errors_total"),
    "aer_dev_nonfatal": ("TOTAL_ERR_NONFATAL", "pcie_aer_nonfatal_errors_total"),
    "aer_dev_fatal": ("TOTAL_ERR_FATAL", "pcie_aer_fatal_errors_total"),
}

#: default device selection: display VGA/3D controllers and Ethernet/InfiniBand controllers
DEFAULT_CLASSES = ("0x0300", "0x0302", "0x0200", "0x0207")


# -- small parsers ----------------------------------------------------------------------------
def link_speed_gts(text: str | None) -> float | None:
    """``"16.0 GT/s PCIe"`` / ``"16 GT/s"`` → 16.0; ``"Unknown"`` or unreadable → None."""
    if not text:
        return None
    m = _SPEED.match(text)
    return float(m.group(1)) if m else None


def link_gen(gts: float | None) -> int | None:
    return None if gts is None else _GEN_BY_GTS.get(gts)


def link_width(text: str | None) -> int | None:
    """Lanes; None for unreadable text or impossible widths (a gone device reads 0xffff → 63)."""
    if text is None:
        return None
    try:
        w = int(text.strip())
    except ValueError:
        return None
    return w if w in _VALID_WIDTHS else None


def pci_class(text: str | None) -> int | None:
    """``"0x030200"`` → 0x030200."""
    if not text:
        return None
    try:
        return int(text.strip(), 16)
    except ValueError:
        return None


@dataclass(frozen=True)
class ClassFilter:
    """One configured class: 4 hex digits match class+subclass, 6 also match the prog-if."""

    value: int
    full: bool

    def matches(self, dev_class: int) -> bool:
        return dev_class == self.value if self.full else dev_class >> 8 == self.value


def parse_class_filter(spec: object) -> ClassFilter:
    """``"0x0302"`` / ``"0302"`` / ``0x0302`` → class+subclass; ``"0x030200"`` → exact."""
    if isinstance(spec, bool):
        raise ValueError(f"{spec!r} is not a PCI class")
    if isinstance(spec, int):
        if 0 <= spec <= 0xFFFF:
            return ClassFilter(spec, False)
        if spec <= 0xFFFFFF:
            return ClassFilter(spec, True)
        raise ValueError(f"{spec!r} is not a PCI class (write e.g. \"0x0302\")")
    if isinstance(spec, str):
        digits = spec.strip().lower().removeprefix("0x")
        if re.fullmatch(r"[0-9a-f]{4}", digits):
            return ClassFilter(int(digits, 16), False)
        if re.fullmatch(r"[0-9a-f]{6}", digits):
            return ClassFilter(int(digits, 16), True)
    raise ValueError(f"{spec!r} is not a PCI class: write 4 hex digits (class+subclass, e.g. "
                     f"\"0x0302\") or 6 (with prog-if, e.g. \"0x030200\")")


def class_matches(dev_class: int, filters: Iterable[ClassFilter]) -> bool:
    return any(f.matches(dev_class) for f in filters)


def normalise_address(text: object) -> str:
    """``"3B:00.0"`` / ``"0000:3b:00.0"`` → ``"0000:3b:00.0"`` (the sysfs directory name)."""
    m = _ADDRESS.match(str(text).strip()) if isinstance(text, str) else None
    if m is None:
        raise ValueError(f"{text!r} is not a PCI address: write e.g. \"0000:3b:00.0\"")
    domain = int(m.group(1), 16) if m.group(1) else 0
    return f"{domain:04x}:{m.group(2).lower()}:{m.group(3).lower()}.{m.group(4)}"


def parse_aer(text: str | None) -> dict[str, int]:
    """Lines ``"<name> <count>"`` → {name: count}. Names may contain spaces (4.19 format)."""
    out: dict[str, int] = {}
    if not text:
        return out
    for line in text.splitlines():
        name, _, count = line.strip().rpartition(" ")
        if not name:
            continue
        try:
            v = int(count)
        except ValueError:
            continue
        if 0 <= v < 1 << 64:  # AER counters are u64; anything else is not a count
            out[name] = v
    return out


# -- samples ----------------------------------------------------------------------------------
def link_samples(cur_speed: str | None, max_speed: str | None, cur_width: str | None,
                 max_width: str | None) -> list[tuple[str, float]]:
    out: list[tuple[str, float]] = []
    cs, ms = link_speed_gts(cur_speed), link_speed_gts(max_speed)
    cw, mw = link_width(cur_width), link_width(max_width)
    if mw == 0:  # no link capability of its own (e.g. an SR-IOV VF): widths say nothing
        cw = mw = None
    if cs is not None:
        out.append(("pcie_current_link_transfers_per_second", cs * 1e9))
        if link_gen(cs) is not None:
            out.append(("pcie_current_link_gen", float(link_gen(cs))))  # type: ignore[arg-type]
    if ms is not None:
        out.append(("pcie_max_link_transfers_per_second", ms * 1e9))
        if link_gen(ms) is not None:
            out.append(("pcie_max_link_gen", float(link_gen(ms))))  # type: ignore[arg-type]
    if cw is not None:
        out.append(("pcie_current_link_width", float(cw)))
    if mw is not None:
        out.append(("pcie_max_link_width", float(mw)))
    width_known = cw is not None and mw is not None and mw > 0
    speed_known = cs is not None and ms is not None
    if width_known or speed_known:
        down = (width_known and cw < mw) or (speed_known and cs < ms)  # type: ignore[operator]
        out.append(("pcie_link_downtrained", 1.0 if down else 0.0))
    return out


def aer_samples(correctable: str | None, nonfatal: str | None, fatal: str | None) -> list[tuple[str, float]]:
    out: list[tuple[str, float]] = []
    files = {"aer_dev_correctable": parse_aer(correctable), "aer_dev_nonfatal": parse_aer(nonfatal),
             "aer_dev_fatal": parse_aer(fatal)}
    for fname, (total_key, sig) in AER_TOTALS.items():
        if total_key in files[fname]:
            out.append((sig, float(files[fname][total_key])))
    cor = files["aer_dev_correctable"]
    for sig, names in AER_CORRECTABLE.items():
        vals = [cor[n] for n in names if n in cor]
        if vals:
            out.append((sig, float(vals[0])))
    uncor = [files["aer_dev_nonfatal"], files["aer_dev_fatal"]]
    for sig, names in AER_UNCORRECTABLE.items():
        vals = [f[n] for f in uncor for n in names if n in f]
        if vals:
            out.append((sig, float(sum(vals))))
    return out


def numa_samples(text: str | None) -> list[tuple[str, float]]:
    if text is None:
        return []
    try:
        v = int(text.strip())
    except ValueError:
        return []
    return [("pcie_numa_node", float(v))] if -1 <= v < 1 << 16 else []  # -1: no NUMA affinity


def device_samples(files: Mapping[str, str | None]) -> list[tuple[str, float]]:
    """All samples for one PCI device from its sysfs files (name → text, None = absent)."""
    g = files.get
    return (link_samples(g("current_link_speed"), g("max_link_speed"), g("current_link_width"),
                         g("max_link_width"))
            + aer_samples(g("aer_dev_correctable"), g("aer_dev_nonfatal"), g("aer_dev_fatal"))
            + numa_samples(g("numa_node")))


# -- NVML view --------------------------------------------------------------------------------
KIB = 1024.0

#: NVML field id → counter signal (all cumulative counts, newer drivers only)
NVML_ERROR_FIELDS: dict[int, str] = {
    pynvml.NVML_FI_DEV_PCIE_COUNT_CORRECTABLE_ERRORS: "pcie_gpu_correctable_errors_total",  # 173
    pynvml.NVML_FI_DEV_PCIE_COUNT_NON_FATAL_ERROR: "pcie_gpu_nonfatal_errors_total",  # 179
    pynvml.NVML_FI_DEV_PCIE_COUNT_FATAL_ERROR: "pcie_gpu_fatal_errors_total",  # 180
    pynvml.NVML_FI_DEV_PCIE_L0_TO_RECOVERY_COUNTER: "pcie_gpu_link_recoveries_total",  # 169
}


@dataclass
class PcieGpuReading:
    """One round of NVML PCIe answers for one GPU, in NVML units; None = not answered."""

    tx_kbps: int | None = None
    rx_kbps: int | None = None
    replays: int | None = None
    cur_gen: int | None = None
    max_gen: int | None = None
    cur_width: int | None = None
    max_width: int | None = None
    fields: Mapping[int, float] | None = None


def nvml_samples(r: PcieGpuReading) -> list[tuple[str, float]]:
    out: list[tuple[str, float]] = []
    if r.rx_kbps is not None:
        out.append(("pcie_gpu_rx_bytes_per_second", r.rx_kbps * KIB))
    if r.tx_kbps is not None:
        out.append(("pcie_gpu_tx_bytes_per_second", r.tx_kbps * KIB))
    if r.replays is not None:
        out.append(("pcie_gpu_replays_total", float(r.replays)))
    for sig, v in (("pcie_gpu_current_link_gen", r.cur_gen), ("pcie_gpu_max_link_gen", r.max_gen),
                   ("pcie_gpu_current_link_width", r.cur_width), ("pcie_gpu_max_link_width", r.max_width)):
        if v is not None:
            out.append((sig, float(v)))
    gen_known = r.cur_gen is not None and r.max_gen is not None and r.max_gen > 0
    width_known = r.cur_width is not None and r.max_width is not None and r.max_width > 0
    if gen_known or width_known:
        down = (gen_known and r.cur_gen < r.max_gen) or (width_known and r.cur_width < r.max_width)  # type: ignore[operator]
        out.append(("pcie_gpu_link_downtrained", 1.0 if down else 0.0))
    for fid, sig in NVML_ERROR_FIELDS.items():
        if r.fields and fid in r.fields:
            out.append((sig, float(r.fields[fid])))
    return out
