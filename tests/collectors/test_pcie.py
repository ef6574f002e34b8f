"""The pcie collector: sysfs fixture trees in the kernel's formats, NVML dumps, and this host."""
from __future__ import annotations

import sys
from pathlib import Path

import pytest

from skewd.collectors.base import Availability
from skewd.collectors.nvml_backend import NvmlBackend
from skewd.collectors.pcie import COLLECTOR, PcieCollector
from skewd.collectors.pcie import parse
from skewd.collectors.registry import collector_class
from skewd.model import Kind

try:
    from tests.nvml_double import NvmlDouble
except ImportError:  # tests/ is not a package on this sys.path
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    from nvml_double import NvmlDouble

FIX = Path(__file__).resolve().parents[1] / "fixtures"
SYS = FIX / "pcie" / "hgx-h100-cx7" / "sys"
OLD = FIX / "pcie" / "linux-4.19" / "sys" / "bus" / "pci" / "devices" / "0000:00:1c.0"
H100 = FIX / "gpu" / "h100-sxm-8gpu.yaml"
L4 = FIX / "gpu" / "l4-pcie-2gpu-driver525.yaml"
DOWN = "0000:5d:00.0"  # the downtrained H100 in the sysfs fixture (NVML gpu3)


def values(batch) -> dict[tuple[str, str], float]:
    return {(e, s): v for _, _, e, s, v in batch.rows()}


def no_nvml() -> NvmlBackend:
    return NvmlBackend(NvmlDouble({}, init_error="NVML_ERROR_LIBRARY_NOT_FOUND"))


def sysfs_only(config: dict | None = None, root: Path = SYS) -> PcieCollector:
    return PcieCollector("node1", {"nvml": False, **(config or {})}, sys_root=root, backend=no_nvml())


def read_device(addr: str, root: Path = SYS) -> dict[str, str | None]:
    d = root / "bus/pci/devices" / addr
    return {n: (d / n).read_text() if (d / n).exists() else None for n in parse.DEVICE_FILES}


# -- pure parsing of kernel formats --------------------------------------------------------------
@pytest.mark.parametrize("text, gts, gen", [
    ("2.5 GT/s PCIe\n", 2.5, 1), ("5.0 GT/s PCIe", 5.0, 2), ("8.0 GT/s PCIe", 8.0, 3),
    ("16.0 GT/s PCIe", 16.0, 4), ("32.0 GT/s PCIe", 32.0, 5), ("64.0 GT/s PCIe", 64.0, 6),
    ("8 GT/s", 8.0, 3), ("16 GT/s", 16.0, 4), ("5 GT/s\n", 5.0, 2),  # before Linux 5.6
    ("Unknown", None, None), ("Unknown speed", None, None), ("", None, None), (None, None, None),
])
def test_link_speed_formats(text, gts, gen):
    assert parse.link_speed_gts(text) == gts
    assert parse.link_gen(parse.link_speed_gts(text)) == gen


@pytest.mark.parametrize("text, width", [("16\n", 16), ("8", 8), ("0", 0), ("63", None), ("x", None), (None, None)])
def test_link_width(text, width):
    assert parse.link_width(text) == width


def test_downtrained_gpu_from_fixture_files():
    got = dict(parse.device_samples(read_device(DOWN)))
    assert got["pcie_current_link_transfers_per_second"] == 16e9
    assert got["pcie_max_link_transfers_per_second"] == 32e9
    assert (got["pcie_current_link_gen"], got["pcie_max_link_gen"]) == (4, 5)
    assert (got["pcie_current_link_width"], got["pcie_max_link_width"]) == (8, 16)
    assert got["pcie_link_downtrained"] == 1.0
    assert got["pcie_aer_correctable_errors_total"] == 49
    assert got["pcie_aer_receiver_errors_total"] == 37
    assert got["pcie_aer_bad_tlp_total"] == 4
    assert got["pcie_aer_bad_dllp_total"] == 9
    assert got["pcie_aer_replay_rollover_total"] == 0
    assert got["pcie_aer_replay_timeout_total"] == 2
    assert got["pcie_aer_nonfatal_errors_total"] == 1
    assert got["pcie_aer_completion_timeout_total"] == 1
    assert got["pcie_aer_fatal_errors_total"] == 0
    assert got["pcie_aer_surprise_down_errors_total"] == 0
    assert got["pcie_numa_node"] == 0


def test_healthy_gpu_is_not_downtrained():
    got = dict(parse.device_samples(read_device("0000:18:00.0")))
    assert got["pcie_link_downtrained"] == 0.0
    assert got["pcie_current_link_gen"] == 5 and got["pcie_current_link_width"] == 16
    assert got["pcie_aer_correctable_errors_total"] == 0


def test_linux_4_19_aer_long_names():
    got = dict(parse.device_samples(read_device(OLD.name, root=OLD.parents[3])))
    assert got["pcie_aer_correctable_errors_total"] == 2
    assert got["pcie_aer_receiver_errors_total"] == 2
    assert got["pcie_aer_replay_rollover_total"] == 0  # "RELAY_NUM Rollover" (sic)
    assert got["pcie_aer_replay_timeout_total"] == 0
    assert got["pcie_aer_surprise_down_errors_total"] == 0
    assert got["pcie_aer_fatal_errors_total"] == 0
    assert (got["pcie_current_link_gen"], got["pcie_max_link_gen"]) == (2, 3)  # "5 GT/s", "8 GT/s"
    assert got["pcie_link_downtrained"] == 1.0


def test_uncorrectable_counts_sum_fatal_and_nonfatal_and_unnamed_bits_are_ignored():
    nonfatal = "Undefined 0\nDLP 0\nSDES 0\nTLP 3\nCmpltTO 5\nMalfTLP 0\nTOTAL_ERR_NONFATAL 8\n"
    fatal = "Undefined 0\nDLP 1\nSDES 2\nTLP 1\nCmpltTO 0\nMalfTLP 1\ndev_fatal_errs_bit[27] 4\nTOTAL_ERR_FATAL 4\n"
    cor = "RxErr 1\ndev_cor_errs_bit[3] 7\nTOTAL_ERR_COR 8\n"
    got = dict(parse.aer_samples(cor, nonfatal, fatal))
    assert got["pcie_aer_poisoned_tlp_total"] == 4
    assert got["pcie_aer_completion_timeout_total"] == 5
    assert got["pcie_aer_surprise_down_errors_total"] == 2
    assert got["pcie_aer_data_link_protocol_errors_total"] == 1
    assert got["pcie_aer_fatal_errors_total"] == 4 and got["pcie_aer_nonfatal_errors_total"] == 8
    assert got["pcie_aer_correctable_errors_total"] == 8 and got["pcie_aer_receiver_errors_total"] == 1
    assert parse.aer_samples(None, None, None) == []


def test_vf_without_link_capability_emits_no_link_state():
    got = dict(parse.device_samples(read_device("0000:29:00.1")))
    assert not any(k.startswith("pcie_current_link") or k.startswith("pcie_max_link") for k in got)
    assert "pcie_link_downtrained" not in got


@pytest.mark.parametrize("spec, dev_class, match", [
    ("0x0302", 0x030200, True), ("0302", 0x030200, True), (0x0302, 0x030200, True),
    ("0x0300", 0x030200, False), ("0x020700", 0x020700, True), ("0x020700", 0x020701, False),
])
def test_class_filters(spec, dev_class, match):
    assert parse.parse_class_filter(spec).matches(dev_class) is match


@pytest.mark.parametrize("bad", ["gpu", "0x3", True, 0x1000000, "0x03020"])
def test_bad_class_filter_refused(bad):
    with pytest.raises(ValueError):
        parse.parse_class_filter(bad)


def test_addresses_normalised():
    assert parse.normalise_address("3B:00.0") == "0000:3b:00.0"
    assert parse.normalise_address("0000:5D:00.0") == "0000:5d:00.0"
    for bad in ("3b:00", "0000:3b:20.0", "eth0", 5):
        with pytest.raises(ValueError):
            parse.normalise_address(bad)


# -- the collector on the fixture tree -----------------------------------------------------------
def test_default_selection_gpus_and_nics_but_not_vfs_bridges_or_storage():
    c = sysfs_only()
    assert c.select_devices() == ["0000:18:00.0", "0000:29:00.0", DOWN]
    v = values(c.collect(1.0))
    assert {e for e, _ in v} == {"0000:18:00.0", "0000:29:00.0", DOWN}
    assert v[(DOWN, "pcie_link_downtrained")] == 1.0
    assert v[("0000:29:00.0", "pcie_link_downtrained")] == 0.0
    assert v[("0000:29:00.0", "pcie_max_link_gen")] == 5


def test_explicit_addresses_add_devices_and_empty_classes_restrict():
    c = sysfs_only({"classes": [], "addresses": ["5c:01.0", "0000:29:00.1"]})
    assert c.select_devices() == ["0000:29:00.1", "0000:5c:01.0"]
    v = values(c.collect(1.0))
    assert v[("0000:5c:01.0", "pcie_aer_correctable_errors_total")] == 15  # the link partner saw errors too
    assert c.probe().availability is Availability.ACTIVE


def test_missing_configured_address_needs_operator():
    st = sysfs_only({"addresses": ["0000:3b:00.0"]}).probe()
    assert st.availability is Availability.NEEDS_OPERATOR
    assert "0000:3b:00.0" in st.reason and "collectors.pcie.addresses" in st.reason


def test_no_matching_device_and_no_nvml_is_absent(tmp_path):
    (tmp_path / "bus/pci/devices").mkdir(parents=True)
    st = PcieCollector("node1", sys_root=tmp_path, backend=no_nvml()).probe()
    assert st.availability is Availability.ABSENT
    assert "no PCI device" in st.reason and "NVML library not found" in st.reason
    st = PcieCollector("node1", sys_root=tmp_path / "nowhere", backend=no_nvml()).probe()
    assert st.availability is Availability.ABSENT and "not found" in st.reason


@pytest.mark.parametrize("config", [{"classes": ["vga"]}, {"addresses": ["eth0"]}, {"classes": "0x0302"},
                                    {"nvml": "auto"}, {"nvml_required": 1}])
def test_bad_config_refused(config):
    with pytest.raises(ValueError, match="collectors.pcie"):
        PcieCollector("node1", config, sys_root=SYS, backend=no_nvml())


def test_selection_rescanned_for_hotplug(tmp_path):
    devs = tmp_path / "bus/pci/devices"
    devs.mkdir(parents=True)
    c = PcieCollector("node1", {"nvml": False}, sys_root=tmp_path, backend=no_nvml())
    assert len(c.collect(0.0)) == 0
    gpu = devs / "0000:18:00.0"
    gpu.mkdir()
    (gpu / "class").write_text("0x030200\n")
    (gpu / "numa_node").write_text("1\n")
    assert len(c.collect(30.0)) == 0  # not rescanned yet
    assert values(c.collect(60.0)) == {("0000:18:00.0", "pcie_numa_node"): 1.0}


# -- the NVML half -------------------------------------------------------------------------------
def with_nvml(path: Path) -> tuple[PcieCollector, NvmlDouble]:
    lib = NvmlDouble.from_file(path)
    return PcieCollector("node1", sys_root=SYS, backend=NvmlBackend(lib)), lib


def test_nvml_view_of_the_h100_node():
    c, lib = with_nvml(H100)
    c.start()
    try:
        ticks = [values(c.collect(float(t))) for t in range(1, 5)]
        joined = c.gpu_pci_addresses()
    finally:
        c.stop()
    v = ticks[0]
    assert v[("gpu3", "pcie_gpu_rx_bytes_per_second")] == 6412000 * 1024  # host → device
    assert v[("gpu3", "pcie_gpu_tx_bytes_per_second")] == 201000 * 1024
    assert (v[("gpu3", "pcie_gpu_current_link_gen")], v[("gpu3", "pcie_gpu_current_link_width")]) == (4, 8)
    assert (v[("gpu3", "pcie_gpu_max_link_gen")], v[("gpu3", "pcie_gpu_max_link_width")]) == (5, 16)
    assert v[("gpu3", "pcie_gpu_link_downtrained")] == 1.0
    assert [v[(f"gpu{i}", "pcie_gpu_link_downtrained")] for i in range(8)].count(1.0) == 1
    assert v[("gpu3", "pcie_gpu_link_recoveries_total")] == 3
    # counters rise tick by tick on the sick GPUs, stay flat elsewhere
    assert [t[("gpu5", "pcie_gpu_replays_total")] for t in ticks] == [0, 14, 37, 81]
    assert [t[("gpu3", "pcie_gpu_correctable_errors_total")] for t in ticks] == [112, 118, 131, 131]
    assert {t[("gpu0", "pcie_gpu_replays_total")] for t in ticks} == {0}
    # both views of the same card agree: NVML's gpu3 is the sysfs device that is downtrained
    assert joined[3] == DOWN and joined[0] == "0000:18:00.0"
    assert v[(joined[3], "pcie_link_downtrained")] == 1.0 and v[(joined[0], "pcie_link_downtrained")] == 0.0
    assert lib.refcount == 0


def test_nvml_unsupported_fields_are_asked_once():
    c, lib = with_nvml(L4)
    c.start()
    try:
        first = values(c.collect(1.0))
        field_calls = lib.calls["nvmlDeviceGetFieldValues"]
        v = values(c.collect(2.0))
        v = values(c.collect(3.0))
    finally:
        c.stop()
    assert field_calls == 2 and lib.calls["nvmlDeviceGetFieldValues"] == 2
    gpu_signals = {s for e, s in first if e.startswith("gpu")}
    assert gpu_signals and not any(s.endswith("_errors_total") or s == "pcie_gpu_link_recoveries_total"
                                   for s in gpu_signals)
    assert c.stats.errors == {"not_supported": 2 * 4}
    assert v[("gpu1", "pcie_gpu_current_link_gen")] == 1 and v[("gpu1", "pcie_gpu_link_downtrained")] == 1.0
    assert v[("gpu0", "pcie_gpu_link_downtrained")] == 0.0


def test_nvml_absent_is_retried_rarely_and_sysfs_still_works():
    lib = NvmlDouble({}, init_error="NVML_ERROR_LIBRARY_NOT_FOUND")
    c = PcieCollector("node1", sys_root=SYS, backend=NvmlBackend(lib))
    c.start()
    for t in range(0, 299, 10):
        assert (DOWN, "pcie_link_downtrained") in values(c.collect(1000.0 + t))
    assert lib.calls["nvmlInit"] == 1  # at start(); the next try waits 300 s of tick time
    c.collect(1300.0)
    assert lib.calls["nvmlInit"] == 2
    assert "NVML library not found" in c.nvml_reason
    c.stop()


def test_lost_gpu_is_skipped_by_the_pcie_view():
    c, lib = with_nvml(H100)
    c.start()
    lib.lose_gpu(2)
    v = values(c.collect(1.0))
    c.stop()
    assert not any(e == "gpu2" for e, _ in v)
    assert ("gpu1", "pcie_gpu_rx_bytes_per_second") in v


def test_probe_states_each_half():
    c, _ = with_nvml(H100)
    st = c.probe()
    assert st.availability is Availability.ACTIVE
    assert "3 PCI device(s) matched" in st.reason and "3 report PCIe link state, 3 AER" in st.reason
    assert "NVML active: 8 GPU(s)" in st.reason
    st = PcieCollector("node1", {"nvml_required": True}, sys_root=SYS, backend=no_nvml()).probe()
    assert st.availability is Availability.NEEDS_OPERATOR and "nvml_required" in st.reason


# -- catalogue contract --------------------------------------------------------------------------
def test_every_emitted_signal_is_catalogued_and_every_catalogued_signal_is_emitted():
    emitted: dict[str, set[str]] = {}
    for path in (H100, L4):
        c, _ = with_nvml(path)
        c.start()
        try:
            batch = c.collect(1.0)
        finally:
            c.stop()
        for _, _, e, s, _ in batch.rows():
            emitted.setdefault(s, set()).add(e)
    by_name = {s.name: s for s in COLLECTOR.catalogue}
    assert set(emitted) - set(by_name) == set()
    assert set(by_name) - set(emitted) == set()
    for name, entities in emitted.items():  # entity naming follows each signal's scope
        scope = by_name[name].scope.value
        if scope == "gpu":
            assert all(e.startswith("gpu") for e in entities), name
        else:
            assert scope == "pci_device" and all(parse.normalise_address(e) == e for e in entities), name
    for spec in COLLECTOR.catalogue:
        assert spec.collector == "pcie"
        assert spec.name.endswith("_total") == (spec.kind is Kind.COUNTER)


def test_registry_finds_the_pcie_collector():
    assert collector_class("pcie") is PcieCollector


# -- this host's real sysfs ----------------------------------------------------------------------
@pytest.mark.skipif(not Path("/sys/bus/pci/devices").is_dir(), reason="no /sys/bus/pci on this host")
def test_real_sysfs_on_this_host():
    real = Path("/sys/bus/pci/devices")
    wanted = {0x0300, 0x0302, 0x0200, 0x0207}
    expected = sorted(d.name for d in real.iterdir()
                      if int((d / "class").read_text(), 16) >> 8 in wanted and not (d / "physfn").exists())
    c = PcieCollector("node1", {"nvml": False})
    st = c.probe()
    batch = c.collect(1.0)
    if not expected:
        assert st.availability is Availability.ABSENT and "no PCI device" in st.reason
        assert len(batch) == 0
        return
    assert st.availability is Availability.ACTIVE
    assert all(a in st.reason for a in expected[:8])
    v = values(batch)
    assert sorted({e for e, _ in v}) == expected
    for addr in expected:  # the numa node is always there; compare with the kernel's own file
        assert v[(addr, "pcie_numa_node")] == int((real / addr / "numa_node").read_text())
        if (real / addr / "current_link_width").exists() and int((real / addr / "max_link_width").read_text()) > 0:
            assert v[(addr, "pcie_current_link_width")] == int((real / addr / "current_link_width").read_text())


def test_lifecycle_on_this_host():
    c = PcieCollector("node1")  # real sysfs, real NVML binding
    c.stop()
    c.start()
    c.collect(1.0)
    c.stop()
    c.stop()
    c.start()
    c.collect(2.0)
    c.stop()
