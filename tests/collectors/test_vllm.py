"""The vllm collector: genuine vLLM /metrics pages (0.33, 0.10.1.1, 0.8.5.post1), parsed directly
and scraped over real HTTP from a loopback server."""
from __future__ import annotations

import math
import sys
from pathlib import Path

import pytest

from skewd.collectors.base import Availability
from skewd.collectors.registry import collector_class
from skewd.collectors.vllm import COLLECTOR, VllmCollector, parse
from skewd.collectors.vllm.catalogue import CATALOGUE
from skewd.model import Kind

sys.path.insert(0, str(Path(__file__).resolve().parent))
from test_vllm_pageserver import VLLM, PageServer, free_port, page, port_in_use  # noqa: E402

V033, V010, V085 = VLLM / "v0.33", VLLM / "v0.10.1.1", VLLM / "v0.8.5.post1"
STATES = ("idle", "busy", "saturated")
KEY = ("llama-3-70b", "0")


def engine(path: Path) -> parse.Engine:
    p = parse.parse_page(page(path))
    assert list(p) == [KEY]
    return p[KEY]


def values(batch) -> dict[tuple[str, str], float]:
    return {(e, s): v for _, _, e, s, v in batch.rows()}


@pytest.fixture
def server():
    srv = PageServer()
    yield srv
    srv.close()


# -- parsing genuine pages -----------------------------------------------------------------------
@pytest.mark.parametrize("release", [V033, V010, V085], ids=lambda p: p.name)
def test_gauges_and_counters_of_every_release(release):
    busy = parse.derive(None, engine(release / "busy.prom"), None)
    assert busy["vllm_requests_running"] == 64
    assert busy["vllm_requests_waiting"] == 0
    assert busy["vllm_kv_cache_usage_ratio"] == pytest.approx(0.72)
    assert busy["vllm_prompt_tokens_total"] == 12000
    assert busy["vllm_generation_tokens_total"] == 4500
    assert busy["vllm_request_success_total"] == 15
    assert busy["vllm_ttft_observations_total"] == 15
    assert busy["vllm_itl_observations_total"] == 60
    sat = parse.derive(None, engine(release / "saturated.prom"), None)
    assert sat["vllm_requests_waiting"] == 40
    assert sat["vllm_kv_cache_usage_ratio"] == pytest.approx(0.99)
    assert sat["vllm_preemptions_total"] == 36  # 12 per step, 3 steps


def test_engine_steps_are_the_observation_count_of_the_iteration_tokens_histogram():
    # vLLM observes vllm:iteration_tokens_total once per engine step: the 0.33 pages ran three
    text = page(V033 / "busy.prom")
    assert 'vllm:iteration_tokens_total_count{engine="0",model_name="llama-3-70b"} 3.0' in text
    for st in STATES:
        assert parse.derive(None, engine(V033 / f"{st}.prom"), None)["vllm_iterations_total"] == 3
    # the created timestamp is the histogram's (..._total_created), not a counter's x_total -> x_created
    assert engine(V033 / "busy.prom").created["iterations"] == pytest.approx(1.7953264531289759e9)
    assert parse._created_name("vllm:iteration_tokens_total_count") == "vllm:iteration_tokens_total_created"
    assert parse._created_name("vllm:prompt_tokens_total") == "vllm:prompt_tokens_created"
    # one engine process scraped through three states: the count keeps growing, three steps each
    steps = [parse.derive(None, engine(V085 / f"run-{i + 1}-{st}.prom"), None)["vllm_iterations_total"]
             for i, st in enumerate(STATES)]
    assert steps == [3, 6, 9]


def test_a_page_without_the_iteration_histogram_has_no_step_counter():
    text = "\n".join(ln for ln in page(V033 / "busy.prom").splitlines()
                     if not ln.startswith(("vllm:iteration_tokens_total", "# HELP vllm:iteration_tokens",
                                           "# TYPE vllm:iteration_tokens")))
    out = parse.derive(None, parse.parse_page(text + "\n")[KEY], None)
    assert "vllm_iterations_total" not in out and out["vllm_requests_running"] == 64


def test_old_names_only_page_feeds_the_same_signals():
    text = page(V085 / "busy.prom")
    assert "vllm:gpu_cache_usage_perc" in text and "vllm:kv_cache_usage_perc" not in text
    assert "vllm:time_per_output_token_seconds" in text
    assert "vllm:inter_token_latency_seconds" not in text
    e = engine(V085 / "busy.prom")
    assert e.gauges["kv"] == pytest.approx(0.72)
    assert e.counters["prefix_queries"] == 12000 and e.counters["prefix_hits"] == 3000
    assert e.histograms["itl"].count == 60


def test_page_with_old_and_new_names_is_not_double_counted():
    text = page(V010 / "busy.prom")
    assert "vllm:gpu_prefix_cache_queries_total" in text and "vllm:prefix_cache_queries_total" in text
    e = engine(V010 / "busy.prom")
    assert e.counters["prefix_queries"] == 12000  # not 24000
    assert e.gauges["kv"] == pytest.approx(0.72)  # not 1.44


def test_new_name_wins_when_both_are_present():
    text = page(V010 / "busy.prom").replace(
        'vllm:gpu_cache_usage_perc{engine="0",model_name="llama-3-70b"} 0.72',
        'vllm:gpu_cache_usage_perc{engine="0",model_name="llama-3-70b"} 0.5')
    assert parse.parse_page(text)[KEY].gauges["kv"] == pytest.approx(0.72)


def test_data_parallel_page_gives_one_entity_per_engine_core():
    p = parse.parse_page(page(V010 / "dp2-busy-saturated.prom"))
    assert set(p) == {("llama-3-70b", "0"), ("llama-3-70b", "1")}
    assert p[("llama-3-70b", "0")].gauges["running"] == 64
    assert p[("llama-3-70b", "1")].gauges["waiting"] == 40
    assert parse.entity_names(p) == {("llama-3-70b", "0"): "engine0", ("llama-3-70b", "1"): "engine1"}
    assert parse.entity_names(p, "pod-a") == {("llama-3-70b", "0"): "pod-a/engine0",
                                              ("llama-3-70b", "1"): "pod-a/engine1"}


def test_entities_carry_the_model_when_a_page_serves_several():
    keys = [("llama", "0"), ("mistral", "0")]
    assert parse.entity_names(keys) == {("llama", "0"): "llama/0", ("mistral", "0"): "mistral/0"}
    assert parse.entity_names([("llama", "0")], "gpu3-server") == {("llama", "0"): "gpu3-server"}


def test_info_gauges_do_not_invent_engines():
    # 0.10 pages carry vllm:cache_config_info{engine="0", block_size=..} without model_name
    text = page(V010 / "busy.prom")
    assert "vllm:cache_config_info" in text
    assert list(parse.parse_page(text)) == [KEY]


def test_not_prometheus_text_is_an_error_and_a_foreign_page_is_empty():
    with pytest.raises(ValueError):
        parse.parse_page("<html><body>hello</body></html>\n{")
    assert parse.parse_page("# TYPE up gauge\nup 1\n") == {}


# -- histogram quantiles -------------------------------------------------------------------------
def test_histogram_quantile_interpolates_like_prometheus():
    inf = math.inf
    b = {0.1: 0.0, 0.25: 15.0, 0.5: 15.0, inf: 15.0}  # all 15 between 0.1 and 0.25
    assert parse.histogram_quantile(0.5, b) == pytest.approx(0.1 + 0.15 * 7.5 / 15)
    assert parse.histogram_quantile(0.99, b) == pytest.approx(0.1 + 0.15 * 14.85 / 15)
    # lowest bucket starts at 0
    assert parse.histogram_quantile(0.5, {1.0: 4.0, inf: 4.0}) == pytest.approx(0.5)
    # rank in +Inf: the highest finite bound
    assert parse.histogram_quantile(0.99, {1.0: 1.0, 2.0: 1.0, inf: 10.0}) == 2.0
    assert math.isnan(parse.histogram_quantile(0.5, {1.0: 0.0, inf: 0.0}))
    assert math.isnan(parse.histogram_quantile(0.5, {1.0: 3.0}))  # no +Inf bucket


def test_quantiles_cover_only_the_interval_between_two_scrapes():
    busy, sat = engine(V085 / "run-2-busy.prom"), engine(V085 / "run-3-saturated.prom")
    cumulative = parse.derive(None, sat, None)
    interval = parse.derive(busy, sat, 3.0)
    # the 6 saturated TTFTs of 2.4 s fall in (1.0, 2.5]; the 15 earlier ones of 0.15 s do not count
    assert interval["vllm_ttft_p50_seconds"] == pytest.approx(1.0 + 1.5 * 3 / 6)
    assert interval["vllm_ttft_p99_seconds"] == pytest.approx(1.0 + 1.5 * 5.94 / 6)
    # cumulative view is dominated by the earlier fast requests
    assert cumulative["vllm_ttft_p50_seconds"] == pytest.approx(0.1 + 0.15 * 10.5 / 15)
    # queue time: 2.45 s per saturated request, in the (2.0, 2.5] bucket of vLLM's latency buckets
    assert interval["vllm_queue_time_p50_seconds"] == pytest.approx(2.0 + 0.5 * 3 / 6)
    assert cumulative["vllm_queue_time_p50_seconds"] < 0.25
    assert interval["vllm_prompt_tokens_per_second"] == pytest.approx(1800 / 3.0)
    assert interval["vllm_generation_tokens_per_second"] == pytest.approx(2700 / 3.0)
    assert interval["vllm_phase"] == parse.PHASE_DECODE


def test_no_observation_in_the_interval_means_no_quantile():
    a = engine(V085 / "run-2-busy.prom")
    out = parse.derive(a, a, 1.0)
    assert "vllm_ttft_p50_seconds" not in out and "vllm_ttft_observations_total" in out
    assert out["vllm_phase"] == parse.PHASE_IDLE


def test_restart_with_lower_counters_counts_from_zero():
    busy, sat = engine(V033 / "busy.prom"), engine(V033 / "saturated.prom")
    assert parse.restarted(busy, sat)
    out = parse.derive(busy, sat, 2.0)
    assert out["vllm_prompt_tokens_per_second"] == pytest.approx(1800 / 2.0)
    assert out["vllm_generation_tokens_per_second"] == pytest.approx(2700 / 2.0)


def test_restart_seen_through_created_even_when_counters_grew():
    # a fresh engine's busy page, then a different engine process whose counters are larger
    a, b = engine(V085 / "busy.prom"), engine(V085 / "run-3-saturated.prom")
    assert b.counters["prompt_tokens"] > a.counters["prompt_tokens"]
    assert parse.restarted(a, b)
    assert parse.derive(a, b, 1.0)["vllm_prompt_tokens_per_second"] == pytest.approx(13800)
    # same process: not a restart
    assert not parse.restarted(engine(V085 / "run-2-busy.prom"), b)


def test_phase_thresholds_are_configurable():
    th = parse.PhaseThresholds(idle_tokens_per_second=10, prefill_share=0.5)
    assert parse.phase(4, 5, th, 1.0, 0.0) == parse.PHASE_IDLE
    # time decides: 0.75 s of prefill, 60 s of decode (busy pages) is decode-heavy whatever the tokens
    assert parse.phase(4000, 1500, th, 0.75, 60.0) == parse.PHASE_DECODE
    assert parse.phase(600, 900, th, 9.0, 3.6) == parse.PHASE_PREFILL
    assert parse.phase(4000, 1500, th, 0.0, 0.0) is None  # working, nothing finished: unknown
    strict = parse.PhaseThresholds(prefill_share=0.8)
    assert parse.phase(600, 900, strict, 9.0, 3.6) == parse.PHASE_DECODE  # 71 % of the time < 80 %
    # a release without the time histograms: the token mix, as before
    assert parse.phase(4000, 1500, th) == parse.PHASE_PREFILL
    assert parse.phase(4000, 1500, strict) == parse.PHASE_DECODE  # 73 % prompt < 80 %


def test_two_scrapes_of_a_two_engine_front_end_give_each_engine_its_own_phase_by_time():
    """Genuine 0.33 pages (make_dp2_pages.py): engine 0 chat-like (prompts 5x the answers),
    engine 1 summarising (8000-token prompts, 20-token answers)."""
    one, two = (parse.parse_page(page(V033 / f"dp2-chat-summarize-{i}.prom")) for i in (1, 2))
    chat, summ = ("llama-3-70b", "0"), ("llama-3-70b", "1")
    a = parse.derive(one[chat], two[chat], 3.0)
    b = parse.derive(one[summ], two[summ], 3.0)
    assert a["vllm_prompt_tokens_per_second"] == pytest.approx(5000)  # 5/6 of its tokens are prompt tokens ...
    assert a["vllm_phase"] == parse.PHASE_DECODE  # ... yet 0.12 s prefill vs 12 s decode per request
    assert b["vllm_phase"] == parse.PHASE_PREFILL  # 1.5 s prefill vs 0.6 s decode
    assert (a["vllm_kv_cache_usage_ratio"], b["vllm_kv_cache_usage_ratio"]) == (0.55, 0.93)
    assert a["vllm_ttft_p50_seconds"] < 0.25 < 1.0 < b["vllm_ttft_p50_seconds"]
    # the same page twice: tokens flowed before but nothing now - idle; and a working interval
    # in which no request finished holds the phase last measured
    assert parse.derive(two[chat], two[chat], 1.0)["vllm_phase"] == parse.PHASE_IDLE
    working = parse.Engine(**{**two[chat].__dict__, "counters": {**two[chat].counters,
                                                                 "generation_tokens": two[chat].counters["generation_tokens"] + 500}})
    assert parse.derive(two[chat], working, 1.0, last_phase=parse.PHASE_DECODE)["vllm_phase"] == parse.PHASE_DECODE
    assert "vllm_phase" not in parse.derive(two[chat], working, 1.0)


# -- catalogue -----------------------------------------------------------------------------------
def test_every_signal_is_catalogued_and_every_catalogued_signal_is_emitted():
    cat = {s.name: s for s in CATALOGUE}
    assert len(cat) == len(CATALOGUE)
    emitted: set[str] = set()
    for release in (V033, V010, V085):
        prev = None
        for st in STATES:
            cur = parse.parse_page(page(release / f"{st}.prom"))
            for k, e in cur.items():
                emitted |= set(parse.derive(prev.get(k) if prev else None, e, 1.0 if prev else None))
            prev = cur
    emitted.add("vllm_up")  # emitted by the collector itself (tested below over HTTP)
    assert emitted - set(cat) == set()
    assert set(cat) - emitted == set()
    for s in CATALOGUE:
        assert s.collector == "vllm" and s.scope.value == "engine"
        assert (s.kind is Kind.COUNTER) == s.name.endswith("_total")


def test_registry_finds_the_collector():
    assert collector_class("vllm") is COLLECTOR is VllmCollector


# -- over real HTTP ------------------------------------------------------------------------------
def test_scrapes_idle_busy_saturated_in_sequence(server):
    c = VllmCollector("node1", {"endpoints": [server.url], "interval": 1.0})
    c.start()
    try:
        out = []
        # one engine process living through the three states, scraped once per state
        for i, st in enumerate(STATES):
            server.body = page(V085 / f"run-{i + 1}-{st}.prom")
            out.append(values(c.collect(100.0 + 2 * i)))
    finally:
        c.stop()
    first, busy, sat = out
    assert first[("engine0", "vllm_up")] == 1.0
    assert ("engine0", "vllm_phase") not in first  # no rate on the first scrape
    assert busy[("engine0", "vllm_prompt_tokens_per_second")] == pytest.approx(12000 / 2)
    assert busy[("engine0", "vllm_generation_tokens_per_second")] == pytest.approx(4500 / 2)
    # prompts 2.7x the answers, but 0.05 s prefill against 4 s decode per request: decode by time
    assert busy[("engine0", "vllm_phase")] == parse.PHASE_DECODE
    assert sat[("engine0", "vllm_prompt_tokens_per_second")] == pytest.approx(1800 / 2)
    assert sat[("engine0", "vllm_phase")] == parse.PHASE_DECODE
    assert sat[("engine0", "vllm_requests_waiting")] == 40
    assert sat[("engine0", "vllm_kv_cache_usage_ratio")] == pytest.approx(0.99)
    assert sat[("engine0", "vllm_preemptions_total")] == 36
    assert sat[("engine0", "vllm_ttft_p50_seconds")] == pytest.approx(1.75)
    assert server.accept and all(a.startswith("text/plain;version=0.0.4") for a in server.accept)


def test_genuine_033_pages_over_http_and_idle_phase(server):
    c = VllmCollector("node1", {"endpoints": [server.url], "phase_idle_tokens_per_second": 5})
    server.body = page(V033 / "busy.prom")
    c.collect(10.0)
    server.body = page(V033 / "busy.prom")  # nothing happened in between
    v = values(c.collect(11.0))
    assert v[("engine0", "vllm_phase")] == parse.PHASE_IDLE
    assert v[("engine0", "vllm_prompt_tokens_per_second")] == 0
    server.body = page(V033 / "saturated.prom")  # engine restarted with new counters
    v = values(c.collect(12.0))
    assert v[("engine0", "vllm_generation_tokens_per_second")] == pytest.approx(2700)


def test_endpoint_down_gives_vllm_up_zero_for_the_engines_last_seen(server):
    c = VllmCollector("node1", {"endpoints": [{"url": server.url, "name": "gpu0-llama"}]})
    server.body = page(V010 / "dp2-busy-saturated.prom")
    v = values(c.collect(1.0))
    assert v[("gpu0-llama/engine0", "vllm_up")] == 1 and v[("gpu0-llama/engine1", "vllm_up")] == 1
    server.status = 503
    v = values(c.collect(2.0))
    assert v == {("gpu0-llama/engine0", "vllm_up"): 0.0, ("gpu0-llama/engine1", "vllm_up"): 0.0}
    assert c.stats.errors.get("read") == 1
    server.status = 200
    server.body = "# TYPE up gauge\nup 1\n"  # something else now answers there
    v = values(c.collect(3.0))
    assert v[("gpu0-llama/engine0", "vllm_up")] == 0.0
    assert c.stats.errors.get("parse") == 1


def test_never_seen_endpoint_reports_down_under_its_name():
    dead = f"http://127.0.0.1:{free_port()}/metrics"
    c = VllmCollector("node1", {"endpoints": [{"url": dead, "name": "llama"}]})
    assert values(c.collect(1.0)) == {("llama", "vllm_up"): 0.0}
    c = VllmCollector("node1", {"endpoints": [dead]})
    assert values(c.collect(1.0)) == {("engine0", "vllm_up"): 0.0}


def test_several_endpoints_are_scraped_in_parallel_and_kept_apart(server):
    other = PageServer()
    try:
        server.body = page(V033 / "busy.prom")
        other.body = page(V085 / "saturated.prom")
        c = VllmCollector("node1", {"endpoints": [server.url, {"url": other.url, "name": "b"}]})
        c.start()
        try:
            v = values(c.collect(1.0))
        finally:
            c.stop()
        a = f"127.0.0.1:{server.port}"
        assert v[(a, "vllm_requests_running")] == 64
        assert v[("b", "vllm_requests_running")] == 96
    finally:
        other.close()


def test_timeout_is_bounded_by_the_interval(server):
    server.body = page(V033 / "idle.prom")
    server.delay = 1.0
    c = VllmCollector("node1", {"endpoints": [server.url], "interval": 0.5, "timeout": 0.2})
    assert values(c.collect(1.0)) == {("engine0", "vllm_up"): 0.0}
    st = c.probe()
    assert st.availability is Availability.UNAVAILABLE
    assert server.url in st.reason and "timed out after 0.2 s" in st.reason


@pytest.mark.parametrize("config, message", [
    ({"timeout": 2.0, "interval": 1.0}, "shorter than the interval"),
    ({"endpoints": "http://x/metrics"}, "expected a list"),
    ({"endpoints": ["ftp://x/metrics"]}, "endpoints[0]"),
    ({"endpoints": [{"url": "http://x:1/metrics", "nmae": "a"}]}, "unknown key"),
    ({"endpoints": [{"url": "http://a:1/m", "name": "x"}, {"url": "http://b:1/m", "name": "x"}]},
     "distinct"),
    ({"phase_prefill_share": 1.5}, "phase_prefill_share"),
])
def test_bad_config_is_refused_with_the_key(config, message):
    with pytest.raises(ValueError, match=message.replace("[", r"\[").replace("]", r"\]")):
        VllmCollector("node1", config)


# -- probe and lifecycle -------------------------------------------------------------------------
def test_probe_active_when_an_endpoint_answers(server):
    server.body = page(V033 / "idle.prom")
    st = VllmCollector("node1", {"endpoints": [server.url]}).probe()
    assert st.availability is Availability.ACTIVE and server.url in st.reason


def test_probe_unavailable_names_url_and_error():
    dead = f"http://127.0.0.1:{free_port()}/metrics"
    st = VllmCollector("node1", {"endpoints": [dead]}).probe()
    assert st.availability is Availability.UNAVAILABLE
    assert st.reason == f"{dead}: connection refused"


@pytest.mark.skipif(port_in_use(8000), reason="something listens on 127.0.0.1:8000 on this host")
def test_probe_on_this_host_without_config_is_absent():
    st = VllmCollector("node1", {}).probe()
    assert st.availability is Availability.ABSENT
    assert st.reason == ("no vLLM /metrics at http://127.0.0.1:8000/metrics "
                         "(set collectors.vllm.endpoints)")


def test_start_stop_restart(server):
    server.body = page(V033 / "idle.prom")
    c = VllmCollector("node1", {"endpoints": [server.url, {"url": server.url, "name": "again"}]})
    c.stop()  # safe without start
    for _ in range(2):
        c.start()
        c.start()
        assert c.started
        assert len(c.collect(1.0)) > 0
        c.stop()
        c.stop()
        assert not c.started
    assert len(c.collect(2.0)) > 0  # still works after stop (scrapes in turn)
