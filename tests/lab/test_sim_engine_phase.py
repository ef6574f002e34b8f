"""The simulator labels an engine's phase by time, as the agent's vllm collector does.

The collector decides prefill- vs decode-heavy from vLLM's prefill and decode time histograms
(the seconds the requests that finished in the interval spent in each), not from the token mix
(collectors/vllm/parse.py, ``phase``): a chat engine whose prompts are ten times its answers
processes mostly prompt tokens, yet spends most of its time decoding. The simulator emits what a
scrape of those histograms yields and computes the phase with the collector's own function, so
the lab exercises the phase-by-time path - in both directions.
"""
from __future__ import annotations

from collections import Counter
from pathlib import Path

from skewd.lab.sim.simulator import simulate

from .helpers import scenario


def _phases_and_tokens(tmp: Path, load: str) -> tuple[Counter, float, float, set[str]]:
    sc = scenario(tmp, f"name: ph\nshape: pergpu\nduration: 90s\nload: {load}\n")
    phases: Counter = Counter()
    prompt = gen = 0.0
    signals: set[str] = set()
    for t, _, b in simulate(sc, 2):
        for s, v in zip(b.signal.tolist(), b.value.tolist()):
            if s.startswith("vllm_"):
                signals.add(s)
            if t < 30:  # past the first requests' first finishes
                continue
            if s == "vllm_phase":
                phases[v] += 1
            elif s == "vllm_prompt_tokens_per_second":
                prompt += v
            elif s == "vllm_generation_tokens_per_second":
                gen += v
    return phases, prompt, gen, signals


def test_a_chat_engine_whose_tokens_are_mostly_prompt_is_decode_heavy_by_time(tmp_path) -> None:
    # the pergpu shape's own mix: prompts ~1200 tokens, answers ~220
    phases, prompt, gen, signals = _phases_and_tokens(tmp_path, "{}")
    assert prompt > 3 * gen  # by token share it would be prefill-heavy
    busy = phases[1.0] + phases[2.0]
    assert busy > 100 and phases[1.0] >= 0.9 * busy, phases
    # the histograms the phase comes from are what the lab's scrape yields
    assert {"vllm_prefill_time_p50_seconds", "vllm_decode_time_p50_seconds",
            "vllm_prefill_time_observations_total", "vllm_decode_time_observations_total"} <= signals


def test_a_summarising_engine_with_long_prompts_and_short_answers_is_prefill_heavy(tmp_path) -> None:
    phases, prompt, gen, _ = _phases_and_tokens(
        tmp_path, "{rate: 0.6, prompt_tokens: {median: 12000, sigma: 0.2}, output_tokens: {median: 2, sigma: 0.1}}")
    busy = phases[1.0] + phases[2.0]
    assert busy > 100 and phases[2.0] >= 0.9 * busy, phases
