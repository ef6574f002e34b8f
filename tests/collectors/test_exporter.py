"""The exporter collector: dcgm-exporter page (real format, invented values) through the shipped
mapping, strict mapping validation, and scraping over real HTTP from a loopback server."""
from __future__ import annotations

import sys
from pathlib import Path

import pytest

from skewd.collectors.base import Availability
from skewd.collectors.exporter import COLLECTOR, ExporterCollector, mapping, parse
from skewd.collectors.exporter.catalogue import CATALOGUE, OWN
from skewd.collectors.exporter.collector import known_signals
from skewd.collectors.gpu.catalogue import CATALOGUE as GPU
from skewd.collectors.pcie.catalogue import CATALOGUE as PCIE
from skewd.collectors.registry import NAMES, collector_class
from skewd.model import Catalogue

sys.path.insert(0, str(Path(__file__).resolve().parent))
from test_vllm_pageserver import EXPORTER, VLLM, PageServer, free_port, page, port_in_use  # noqa: E402

DCGM_PAGE = EXPORTER / "dcgm-exporter-4.x-h100x2" / "metrics.prom"
MAPS = EXPORTER / "mappings"
MiB = 1024 * 1024


@pytest.fixture(scope="module")
def known():
    return known_signals()


@pytest.fixture(scope="module")
def dcgm(known):
    return mapping.load(mapping.resolve("dcgm-exporter"), known)


@pytest.fixture
def server():
    srv = PageServer()
    yield srv
    srv.close()


def values(batch) -> dict[tuple[str, str], float]:
    return {(e, s): v for _, _, e, s, v in batch.rows()}


# -- mapping a dcgm-exporter page --------------------------------------------------------------
def test_dcgm_page_maps_to_gpu_and_pcie_signals_in_base_units(dcgm):
    v = parse.apply(dcgm, page(DCGM_PAGE)).values
    assert v[("gpu0", "gpu_utilization_ratio")] == pytest.approx(0.97)
    assert v[("gpu1", "gpu_utilization_ratio")] == 0
    assert v[("gpu0", "gpu_power_watts")] == pytest.approx(612.439)
    assert v[("gpu0", "gpu_power_limit_watts")] == 700
    assert v[("gpu1", "gpu_sm_clock_hz")] == 1410e6
    assert v[("gpu1", "gpu_temperature_celsius")] == 83
    assert v[("gpu0", "pcie_gpu_tx_bytes_per_second")] == 1187431424
    assert v[("gpu0", "pcie_gpu_rx_bytes_per_second")] == 5421875200
    assert v[("gpu1", "gpu_xid_last_code")] == 94
    assert v[("gpu0", "gpu_tensor_active_ratio")] == pytest.approx(0.423871)


def test_counter_written_without_total_still_matches(dcgm):
    text = page(DCGM_PAGE)
    assert "# TYPE DCGM_FI_DEV_PCIE_REPLAY_COUNTER counter" in text
    assert "DCGM_FI_DEV_PCIE_REPLAY_COUNTER_total" not in text
    assert parse.apply(dcgm, text).values[("gpu1", "pcie_gpu_replays_total")] == 37


def test_framebuffer_is_counted_like_nvml_and_shows_the_squatter(dcgm):
    v = parse.apply(dcgm, page(DCGM_PAGE)).values
    # NVML "used" includes driver-reserved memory; total = used + free + reserved
    assert v[("gpu1", "gpu_memory_used_bytes")] == (79751 + 600) * MiB
    assert v[("gpu1", "gpu_memory_total_bytes")] == 81559 * MiB
    assert v[("gpu1", "gpu_memory_free_bytes")] == 1208 * MiB
    used = v[("gpu1", "gpu_memory_used_bytes")] / v[("gpu1", "gpu_memory_total_bytes")]
    assert used > 0.95 and v[("gpu1", "gpu_utilization_ratio")] <= 0.05  # GPU-1 inputs
    assert v[("gpu0", "gpu_memory_used_bytes")] / v[("gpu0", "gpu_memory_total_bytes")] < 0.95


def test_clock_event_bits_are_split_like_the_gpu_collector(dcgm):
    v = parse.apply(dcgm, page(DCGM_PAGE)).values
    assert v[("gpu0", "gpu_clocks_event_reasons")] == 4
    assert v[("gpu0", "gpu_clocks_event_sw_power_cap")] == 1
    assert v[("gpu0", "gpu_clocks_event_hw_slowdown")] == 0
    # 0x48 = HwSlowdown | HwThermal
    assert v[("gpu1", "gpu_clocks_event_reasons")] == 0x48
    assert v[("gpu1", "gpu_clocks_event_hw_slowdown")] == 1
    assert v[("gpu1", "gpu_clocks_event_hw_thermal")] == 1
    assert v[("gpu1", "gpu_clocks_event_hw_power_brake")] == 0
    assert v[("gpu1", "gpu_clocks_event_sw_power_cap")] == 0


@pytest.mark.parametrize("raw", ["+Inf", "inf", "-4", "18446744073709551616", "1e30", "NaN"])
def test_clock_event_bits_of_a_value_no_uint64_holds_are_not_samples(dcgm, raw):
    """Found by bench/fuzz.py (target prometheus, seed 1, input 460679: GPU 1's
    DCGM_FI_DEV_CLOCK_THROTTLE_REASONS written as ``inf``): splitting the bits raised
    OverflowError out of apply() and the whole page was lost. The bits of such a value are not
    samples; the raw reasons gauge and the other GPU still read."""
    lines = page(DCGM_PAGE).splitlines()
    i = next(k for k, ln in enumerate(lines)
             if ln.startswith("DCGM_FI_DEV_CLOCK_THROTTLE_REASONS{") and 'gpu="1"' in ln)
    lines[i] = lines[i].rsplit(" ", 1)[0] + " " + raw
    v = parse.apply(dcgm, "\n".join(lines) + "\n").values
    assert not any(ent == "gpu1" and sig.startswith("gpu_clocks_event_") and sig != "gpu_clocks_event_reasons"
                   for ent, sig in v)
    assert v[("gpu0", "gpu_clocks_event_sw_power_cap")] == 1  # the healthy GPU's bits are still read
    assert v[("gpu0", "gpu_utilization_ratio")] >= 0


def test_newer_dcgm_field_name_for_clock_events_is_accepted(dcgm):
    text = page(DCGM_PAGE).replace("DCGM_FI_DEV_CLOCK_THROTTLE_REASONS",
                                   "DCGM_FI_DEV_CLOCKS_EVENT_REASONS")
    v = parse.apply(dcgm, text).values
    assert v[("gpu1", "gpu_clocks_event_hw_thermal")] == 1


def test_mig_instance_series_do_not_inflate_whole_gpu_values(dcgm):
    mig = ('DCGM_FI_DEV_FB_USED{gpu="0",UUID="GPU-x",device="nvidia0",modelName="NVIDIA H100 80GB HBM3",'
           'GPU_I_PROFILE="1g.10gb",GPU_I_ID="7",Hostname="gpu-node-07"} 9000\n')
    v = parse.apply(dcgm, page(DCGM_PAGE) + mig).values
    assert v[("gpu0", "gpu_memory_used_bytes")] == (74947 + 600) * MiB


def test_series_without_the_entity_label_are_discarded_and_counted(dcgm):
    text = "# TYPE DCGM_FI_DEV_GPU_TEMP gauge\nDCGM_FI_DEV_GPU_TEMP{UUID=\"GPU-x\"} 50\n"
    a = parse.apply(dcgm, text)
    assert a.values == {} and a.discarded_series == 1


def test_rules_combine_several_series_of_one_entity(known):
    m = mapping.loads("source: x\nconfirmed: true\nrules:\n"
                      "  - {metric: replays_total, signal: pcie_gpu_replays_total, entity: 'gpu{gpu}'}\n"
                      "  - {metric: temp, signal: gpu_temperature_celsius, entity: 'gpu{gpu}'}\n",
                      known)
    text = ("# TYPE replays_total counter\nreplays_total{gpu=\"0\",link=\"0\"} 3\n"
            "replays_total{gpu=\"0\",link=\"1\"} 4\n"
            "# TYPE temp gauge\ntemp{gpu=\"0\",sensor=\"a\"} 40\ntemp{gpu=\"0\",sensor=\"b\"} 70\n")
    v = parse.apply(m, text).values
    assert v[("gpu0", "pcie_gpu_replays_total")] == 7  # counters: summed
    assert v[("gpu0", "gpu_temperature_celsius")] == 70  # gauges: max


# -- catalogue ---------------------------------------------------------------------------------
DTS_PAGE = Path(__file__).parent.parent / "fixtures" / "exporter" / "dts-template-bf3" / "metrics.prom"


def test_every_catalogued_signal_comes_from_the_fixtures_and_nothing_else(dcgm):
    emitted = {s for _, s in parse.apply(dcgm, page(DCGM_PAGE)).values} | {"exporter_up"}
    own = {s.name for s in OWN}
    dts = mapping.load(mapping.resolve("dts"), known_signals())
    from_dts = {s for _, s in parse.apply(dts, DTS_PAGE.read_text()).values}
    assert emitted | (from_dts & own) == {s.name for s in CATALOGUE}


def test_dpu_sees_small_tlps_through_the_dts_mapping():
    dts = mapping.load(mapping.resolve("dts"), known_signals())
    v = parse.apply(dts, DTS_PAGE.read_text()).values
    nbytes = v[("0000:3b:00.0", "dpu_pcie_inbound_bytes_per_second")]
    tlps = v[("0000:3b:00.0", "dpu_pcie_inbound_tlps_per_second")]
    assert (nbytes, tlps) == (1.2e9, 1.9e7) and nbytes / tlps < 64  # ~63 B per TLP: small DMAs
    assert v[("mlx5_0/1", "rdma_port_xmit_bytes_total")] == 4 * 2.5e10


def test_mapped_signals_are_the_gpu_and_pcie_collectors_own(dcgm):
    theirs = {s.name: s for s in [*GPU, *PCIE]}
    own = {s.name for s in OWN}
    for spec in CATALOGUE:
        if spec.name in own:
            assert spec.collector == "exporter"
            assert spec.name not in theirs  # an own name must not shadow theirs
        else:
            assert theirs[spec.name] == spec  # same definition, so catalogues merge
    # every landed collector's catalogue merges with ours without a conflicting definition
    merged = Catalogue(CATALOGUE)
    for name in NAMES:
        try:
            cls = collector_class(name)
        except (ImportError, AttributeError):  # a collector another change has not landed yet
            continue
        merged = merged.merge(cls.catalogue)
    assert {s.name for s in CATALOGUE} <= set(merged)


def test_instance_catalogue_follows_the_loaded_mappings():
    c = ExporterCollector("node1", {"targets": [
        {"url": "http://127.0.0.1:1/metrics", "mapping": "dts"}]})
    names = {s.name for s in c.catalogue}
    assert "rdma_port_xmit_bytes_total" in names and "exporter_up" in names
    assert "gpu_utilization_ratio" not in names


def test_registry_finds_the_collector():
    assert collector_class("exporter") is COLLECTOR is ExporterCollector


# -- strict mapping validation -----------------------------------------------------------------
def test_shipped_mappings_and_good_files_validate(known):
    for name in ("dcgm-exporter", "dts"):
        assert mapping.load(mapping.resolve(name), known).rules
    assert not mapping.load(mapping.resolve("dts"), known).confirmed
    m = mapping.load(MAPS / "minimal.good.yaml", known)
    assert m.rules[0].scale == 1.0 and m.rules[0].combine == "max"


def test_typo_is_reported_with_file_line_column_and_a_hint(known):
    with pytest.raises(mapping.MappingError) as e:
        mapping.load(MAPS / "typo.bad.yaml", known)
    assert e.value.errors == [f"{MAPS / 'typo.bad.yaml'}:7:5: rules[0]: unknown key 'scael' "
                              "(did you mean 'scale'?); known: metric, signal, entity, scale, "
                              "bits, where, combine"]


def test_all_errors_of_a_file_are_reported_at_once(known):
    with pytest.raises(mapping.MappingError) as e:
        mapping.load(MAPS / "many.bad.yaml", known)
    errs = e.value.errors
    f = str(MAPS / "many.bad.yaml")
    expect = [
        (f"{f}:2:1:", "unknown key 'confirmd' (did you mean 'confirmed'?)"),
        (f"{f}:1:1:", "missing required key 'confirmed'"),
        (f"{f}:5:13:", "'gpu_util_ratio' is not a catalogued signal "
                       "(did you mean 'gpu_utilization_ratio'?)"),
        (f"{f}:10:5:", "duplicate key 'signal'"),
        (f"{f}:11:13:", "must name a label"),
        (f"{f}:14:13:", "has scope gpu: its entity must not be empty"),
        (f"{f}:15:5:", "bits and scale cannot be combined"),
        (f"{f}:17:5:", "missing required key 'metric'"),
        (f"{f}:18:13:", "has scope node: its entity must be \"\""),
        (f"{f}:19:14:", "'average' is not one of sum, max, min, first"),
    ]
    assert len(errs) == len(expect)
    for err, (prefix, text) in zip(errs, expect):
        assert err.startswith(prefix) and text in err, err


def test_rules_of_one_signal_must_agree_on_combine(known):
    with pytest.raises(mapping.MappingError, match=r"combine.bad.yaml:8:1: rules for "
                                                   r"gpu_memory_used_bytes disagree on combine"):
        mapping.load(MAPS / "combine.bad.yaml", known)


def test_yaml_syntax_error_has_a_position(known):
    with pytest.raises(mapping.MappingError, match=r"syntax.bad.yaml:5:1: not valid YAML"):
        mapping.load(MAPS / "syntax.bad.yaml", known)


def test_unknown_mapping_name_lists_the_shipped_ones():
    with pytest.raises(FileNotFoundError, match=r"dcgm-exporter.*dts|dts.*dcgm-exporter"):
        mapping.resolve("dcgm")


# -- over real HTTP ----------------------------------------------------------------------------
def test_collects_the_dcgm_page_over_http(server):
    server.body = page(DCGM_PAGE)
    c = ExporterCollector("node1", {"targets": [{"url": server.url}]})
    v = values(c.collect(5.0))
    assert v[("dcgm-exporter", "exporter_up")] == 1
    assert v[("gpu1", "gpu_memory_used_bytes")] == (79751 + 600) * MiB
    assert {s for _, s in v} == {s.name for s in c.catalogue}
    server.status = 503
    assert values(c.collect(10.0)) == {("dcgm-exporter", "exporter_up"): 0.0}
    assert c.stats.errors == {"read": 1}


def test_two_targets_in_parallel_keep_their_names(server):
    other = PageServer()
    try:
        server.body = page(DCGM_PAGE)
        other.body = page(DCGM_PAGE).replace('gpu="0"', 'gpu="2"').replace('gpu="1"', 'gpu="3"')
        c = ExporterCollector("node1", {"targets": [{"url": server.url, "name": "a"},
                                                    {"url": other.url, "name": "b"}]})
        c.start()
        try:
            v = values(c.collect(1.0))
        finally:
            c.stop()
        assert v[("a", "exporter_up")] == v[("b", "exporter_up")] == 1
        assert v[("gpu3", "gpu_xid_last_code")] == 94 and v[("gpu1", "gpu_xid_last_code")] == 94
    finally:
        other.close()


def test_probe_active_reports_how_many_mapped_metrics_appear(server, dcgm):
    server.body = page(DCGM_PAGE)
    st = ExporterCollector("node1", {"targets": [{"url": server.url}]}).probe()
    wanted = len({r.metric for r in dcgm.rules})
    assert st.availability is Availability.ACTIVE
    # the page lacks the newer aliases DCGM_FI_DEV_CLOCKS_EVENT_REASONS and ..._THROUGHPUT_TOTAL
    assert f"({wanted - 2}/{wanted} mapped metrics)" in st.reason


def test_probe_flags_a_page_without_any_mapped_metric(server):
    server.body = page(VLLM / "v0.33" / "idle.prom")
    st = ExporterCollector("node1", {"targets": [{"url": server.url, "mapping": "dts"}]}).probe()
    assert st.availability is Availability.UNAVAILABLE
    assert "shows none of the 18 metrics" in st.reason and "unconfirmed" in st.reason


def test_probe_unavailable_names_url_and_error():
    dead = f"http://127.0.0.1:{free_port()}/metrics"
    st = ExporterCollector("node1", {"targets": [{"url": dead}]}).probe()
    assert st.availability is Availability.UNAVAILABLE
    assert st.reason == f"{dead}: connection refused"


@pytest.mark.skipif(port_in_use(9400), reason="something listens on 127.0.0.1:9400 on this host")
def test_probe_on_this_host_without_config_is_absent():
    st = ExporterCollector("node1", {}).probe()
    assert st.availability is Availability.ABSENT
    assert st.reason == ("no dcgm-exporter /metrics at http://127.0.0.1:9400/metrics "
                         "(set collectors.exporter.targets)")


@pytest.mark.parametrize("config, message", [
    ({"targets": {"url": "http://x:1/metrics"}}, "expected a list"),
    ({"targets": [{"url": "http://x:1/metrics", "mapings": "dts"}]}, "unknown key"),
    ({"targets": [{"url": "http://x:1/metrics", "mapping": "nope"}]}, "no mapping 'nope'"),
    ({"targets": [{"url": "http://x:1/metrics", "mapping": str(MAPS / "typo.bad.yaml")}]},
     "typo.bad.yaml:7:5"),
    ({"targets": [{"url": "http://a:1/m"}, {"url": "http://b:1/m"}]}, "distinct name"),
    ({"interval": 5, "timeout": 5}, "shorter than the interval"),
])
def test_bad_config_is_refused(config, message):
    with pytest.raises(ValueError, match=message):
        ExporterCollector("node1", config)


def test_start_stop_restart(server):
    server.body = page(DCGM_PAGE)
    c = ExporterCollector("node1", {"targets": [{"url": server.url, "name": "a"},
                                                {"url": server.url, "name": "b"}]})
    c.stop()  # safe without start
    for _ in range(2):
        c.start()
        c.start()
        assert c.started and len(c.collect(1.0)) > 0
        c.stop()
        c.stop()
        assert not c.started
    assert len(c.collect(2.0)) > 0
