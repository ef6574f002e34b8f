"""An incident on a two-engine node quotes that engine's own phase, KV and TTFT/ITL (issue 19
item 9), end to end from genuine vLLM 0.33 pages: the vllm collector scrapes a front end with two
engine cores over real HTTP, the agent's summary goes through the wire codec into the
controller's ingest, and the correlator builds the incidents.

The pages (tests/fixtures/vllm/v0.33/dp2-chat-summarize-{1,2}.prom, made by vLLM's own
PrometheusStatLogger, see make_dp2_pages.py): engine 0 chat-like (prompts 5x its answers, yet
decode dominates its time), KV 0.55, TTFT 0.2 s; engine 1 summarising (prefill dominates), KV
0.93, 12 waiting, TTFT 2 s. Before: both incidents quoted the node's maximum (KV 93 %, the phase
"prefill_heavy" of the token mix) and "TTFT not observed; ITL not observed"."""
from __future__ import annotations

import sys
from pathlib import Path

import pytest

from skewd import wire
from skewd.agent import engines as agent_engines
from skewd.agent.summary import make_summary
from skewd.catalogue import full_catalogue
from skewd.collectors.vllm import VllmCollector
from skewd.controller import timeline
from skewd.controller.config import load_config
from skewd.controller.service import Controller
from skewd.model import Layer, Scope
from skewd.rules.store import WindowStore

from .sim import finding

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "collectors"))
from test_vllm_pageserver import VLLM, PageServer, page  # noqa: E402

T0 = 1_700_000_000.0
PAGES = [VLLM / "v0.33" / f"dp2-chat-summarize-{i}.prom" for i in (1, 2)]


@pytest.fixture
def ctl_after_two_scrapes():
    srv = PageServer()
    c = VllmCollector("n1", {"endpoints": [srv.url]})
    store = WindowStore(full_catalogue())
    try:
        for i, p in enumerate(PAGES):  # one front end, scraped twice, 3 s apart
            srv.body = page(p)
            store.ingest(c.collect(T0 + 3 * i))
    finally:
        c.stop()
        srv.close()
    t = T0 + 3
    msg = wire.decode_summary(wire.encode(make_summary(store, "n1", "c", t, 5.0)))
    ctl = Controller(load_config(None, env={}, overrides={"cluster": "c"}))
    ctl.ingest_summary(msg)
    return ctl, msg, t


def test_the_summary_carries_each_engines_own_values(ctl_after_two_scrapes) -> None:
    _, msg, _ = ctl_after_two_scrapes
    s = msg.signals
    assert s["engine_phase"] == {"engine0": 1.0, "engine1": 2.0}  # decode-heavy chat, prefill-heavy summariser
    assert s["engine_kv_cache_usage_ratio"] == {"engine0": 0.55, "engine1": 0.93}
    assert s["engine_requests_waiting"] == {"engine0": 0.0, "engine1": 12.0}
    assert s["engine_ttft_p50_seconds"]["engine0"] < 0.25 < 1.0 < s["engine_ttft_p50_seconds"]["engine1"]
    assert 0.02 < s["engine_itl_p50_seconds"]["engine0"] <= 0.04
    # the node's reductions stay what the cross-node rules compare
    assert s["summary_kv_cache_usage_ratio"] == {"": 0.93} and s["summary_engine_phase"] == {"": 2.0}


@pytest.mark.parametrize("engine,phase,kv,ttft_lo,ttft_hi", [
    ("engine0", "decode_heavy", 0.55, 0.1, 0.25),
    ("engine1", "prefill_heavy", 0.93, 1.0, 2.5),
])
def test_an_engines_incident_quotes_that_engines_phase_kv_and_latency(ctl_after_two_scrapes, engine, phase, kv,
                                                                      ttft_lo, ttft_hi) -> None:
    ctl, _, t = ctl_after_two_scrapes
    f = finding("n1", "GPU-8-x", "GPU-8", Layer.ENGINE, t, cluster="c", entity=engine, scope=Scope.ENGINE)
    ctl.correlator.observe(f)
    (inc,) = ctl.correlator.correlate(t + 1)
    assert inc.phase.engine == f"n1/{engine}" and inc.phase.phase == phase
    assert inc.phase.kv_usage_ratio == pytest.approx(kv)
    assert ttft_lo < inc.effect.ttft_s < ttft_hi and inc.effect.itl_s is not None
    assert f"phase {phase} of n1/{engine} (KV {kv:.0%})" in inc.summary
    assert "TTFT not observed" not in inc.summary and "ITL not observed" not in inc.summary


def test_a_finding_that_names_no_engine_on_a_two_engine_node_says_it_quotes_all_of_them(ctl_after_two_scrapes) -> None:
    ctl, _, t = ctl_after_two_scrapes
    ctl.correlator.observe(finding("n1", "NS-5-x", "NS-5", Layer.NETWORK, t, cluster="c", entity="eth0",
                                   scope=Scope.NIC_PORT))
    (inc,) = ctl.correlator.correlate(t + 1)
    assert inc.phase.engine == "n1" and "of n1 (all its engines)" in inc.summary


def test_agent_and_controller_agree_on_the_per_engine_keys() -> None:
    assert set(agent_engines.ENGINE_KEYS) == timeline.ENGINE_KEYS
