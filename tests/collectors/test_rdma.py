"""rdma collector over a constructed mlx5 sysfs tree (see the fixture's NOTE.md)."""
from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from skewd.collectors.base import Availability, CollectorError
from skewd.collectors.rdma import COLLECTOR as Rdma
from skewd.collectors.rdma import parse
from skewd.model import SampleBatch

FIX = Path(__file__).resolve().parents[1] / "fixtures" / "rdma" / "mlx5-cx6dx-roce-cx7-ib"
SYS = FIX / "sys"
IB = SYS / "class" / "infiniband"


def values(batch: SampleBatch) -> dict[tuple[str, str], float]:
    out: dict[tuple[str, str], float] = {}
    for _, _, e, s, v in batch.rows():
        assert (e, s) not in out, f"duplicate {e} {s}"
        out[(e, s)] = v
    return out


def test_roce_port_counters_in_bytes_and_congestion_counters() -> None:
    v = values(Rdma("n", sys_root=SYS).collect(2.0))
    e = "mlx5_0/1"
    # port_xmit_data file holds 2749938262841 four-octet words
    assert v[(e, "rdma_port_xmit_bytes_total")] == 2749938262841 * 4 == 10999753051364
    assert v[(e, "rdma_port_rcv_bytes_total")] == 2611203991170 * 4
    assert v[(e, "rdma_port_xmit_packets_total")] == 2739810355  # packets are not scaled
    assert v[(e, "rdma_port_xmit_wait_total")] == 1893221
    assert v[(e, "rdma_port_link_downed_total")] == 1
    assert v[(e, "rdma_port_np_ecn_marked_roce_packets_total")] == 90412
    assert v[(e, "rdma_port_np_cnp_sent_total")] == 88213
    assert v[(e, "rdma_port_rp_cnp_handled_total")] == 301877
    assert v[(e, "rdma_port_out_of_sequence_total")] == 412
    assert v[(e, "rdma_port_roce_adp_retrans_total")] == 57
    # state / rate / link layer
    assert v[(e, "rdma_port_state")] == 4 and v[(e, "rdma_port_active")] == 1
    assert v[(e, "rdma_port_phys_state")] == 5
    assert v[(e, "rdma_port_rate_bytes")] == 100e9 / 8
    assert v[(e, "rdma_port_link_layer")] == 2  # Ethernet (RoCE)


def test_device_level_hw_counters_are_not_taken_for_a_port() -> None:
    v = values(Rdma("n", sys_root=SYS).collect(0.0))
    assert v[("mlx5_0/1", "rdma_port_out_of_buffer_total")] == 0  # ports/1/hw_counters
    assert 999999 not in v.values()  # mlx5_*/hw_counters (port 0) ignored
    assert {e for e, _ in v} == {"mlx5_0/1", "mlx5_1/1", "mlx5_2/1"}


def test_down_port_and_infiniband_port_without_roce_counters() -> None:
    v = values(Rdma("n", sys_root=SYS).collect(0.0))
    assert v[("mlx5_1/1", "rdma_port_state")] == 1
    assert v[("mlx5_1/1", "rdma_port_active")] == 0
    assert v[("mlx5_1/1", "rdma_port_phys_state")] == 3  # Disabled
    ib = "mlx5_2/1"
    assert v[(ib, "rdma_port_link_layer")] == 1
    assert v[(ib, "rdma_port_rate_bytes")] == 400e9 / 8  # 4X NDR
    assert v[(ib, "rdma_port_symbol_error_total")] == 12
    assert v[(ib, "rdma_port_link_error_recovery_total")] == 1
    assert v[(ib, "rdma_port_rnr_nak_retry_err_total")] == 1450
    assert v[(ib, "rdma_port_out_of_buffer_total")] == 77
    # firmware/link layer without these files: not emitted (not zero)
    for name in ("np_cnp_sent", "rp_cnp_handled", "np_ecn_marked_roce_packets", "roce_adp_retrans",
                 "roce_slow_restart", "rp_cnp_ignored", "roce_adp_retrans_to"):
        assert (ib, f"rdma_port_{name}_total") not in v
        assert ("mlx5_0/1", f"rdma_port_{name}_total") in v


def test_missing_and_unreadable_files_are_skipped(tmp_path: Path) -> None:
    root = tmp_path / "sys"
    shutil.copytree(SYS, root)
    port = root / "class" / "infiniband" / "mlx5_0" / "ports" / "1"
    (port / "hw_counters" / "out_of_sequence").unlink()  # older firmware
    (port / "counters" / "symbol_error").write_text("N/A (no PMA)\n")  # driver without a PMA
    v = values(Rdma("n", sys_root=root).collect(0.0))
    assert ("mlx5_0/1", "rdma_port_out_of_sequence_total") not in v
    assert ("mlx5_0/1", "rdma_port_symbol_error_total") not in v
    assert v[("mlx5_0/1", "rdma_port_xmit_wait_total")] == 1893221


@pytest.mark.parametrize("text,bps", [
    ("100 Gb/sec (4X EDR)\n", 12.5e9),
    ("2.5 Gb/sec (1X SDR)\n", 2.5e9 / 8),
    ("10 Gb/sec (4X)\n", 10e9 / 8),  # SDR prints no speed name
    ("200 Gb/sec (2X NDR)\n", 25e9),
    ("", None),
])
def test_rate_parsing(text: str, bps: float | None) -> None:
    assert parse.parse_rate(text) == bps


def test_state_parsing() -> None:
    assert parse.parse_state("4: ACTIVE\n") == 4
    assert parse.parse_state("5: LinkUp\n") == 5
    assert parse.parse_state("7: Phy Test\n") == 7
    assert parse.parse_state("ACTIVE") is None


def test_device_filter_and_probe_reasons(tmp_path: Path) -> None:
    v = values(Rdma("n", {"devices": ["mlx5_2"]}, sys_root=SYS).collect(0.0))
    assert {e for e, _ in v} == {"mlx5_2/1"}
    st = Rdma("n", sys_root=SYS).probe()
    assert st.availability is Availability.ACTIVE
    assert "mlx5_0/1" in st.reason and "mlx5_2/1" in st.reason
    st = Rdma("n", {"devices": ["bnxt_re*"]}, sys_root=SYS).probe()
    assert st.availability is Availability.NEEDS_OPERATOR and "mlx5_0" in st.reason
    (tmp_path / "class" / "infiniband").mkdir(parents=True)  # class dir exists but is empty
    st = Rdma("n", sys_root=tmp_path).probe()
    assert st.availability is Availability.ABSENT
    assert st.reason == f"no RDMA devices under {tmp_path}/class/infiniband"
    with pytest.raises(ValueError, match="devices"):
        Rdma("n", {"devices": "mlx5_0"})


def test_probe_on_this_host() -> None:
    c = Rdma("here")
    st = c.probe()
    ib = Path("/sys/class/infiniband")
    if not ib.is_dir():
        assert st.availability is Availability.ABSENT
        assert st.reason == "no RDMA devices under /sys/class/infiniband"
        with pytest.raises(CollectorError, match="/sys/class/infiniband"):
            c.collect(0.0)
    elif not any(ib.iterdir()):
        assert st.availability is Availability.ABSENT
        assert len(c.collect(0.0)) == 0
    else:
        assert st.availability is Availability.ACTIVE
    c.start()
    c.stop()
    c.stop()


RESOURCES = Path(__file__).parent.parent / "fixtures" / "rdma" / "iproute2-6.1" / "resource-show.json"


def test_mr_and_qp_counts_from_rdma_resource_show() -> None:
    c = Rdma("n", sys_root=SYS)
    c.resource_reader = RESOURCES.read_text
    b = c.collect(5.0)
    got = {(e, s): v for _, _, e, s, v in b.rows() if s.startswith("rdma_dev_")}
    assert got == {("mlx5_0", "rdma_dev_mrs"): 18.0, ("mlx5_0", "rdma_dev_qps"): 7.0,
                   ("mlx5_1", "rdma_dev_mrs"): 0.0, ("mlx5_1", "rdma_dev_qps"): 1.0}
    c.resource_reader = lambda: "Failed to open NETLINK_RDMA socket"
    assert not [s for s in c.collect(6.0).signals() if s.startswith("rdma_dev_")]


def test_catalogue_covers_exactly_what_the_fixture_emits() -> None:
    cat = {s.name: s for s in Rdma.catalogue}
    c = Rdma("n", sys_root=SYS)
    c.resource_reader = RESOURCES.read_text
    emitted = c.collect(0.0).signals()
    assert emitted - set(cat) == set()
    assert set(cat) - emitted == set()
    for s in cat.values():
        assert s.collector == "rdma" and s.scope.value == "rdma_port"
        assert s.name.endswith("_total") == (s.kind.value == "counter")
        assert s.wrap_bits is None  # see catalogue.py: saturating or 64-bit, never a known wrap
