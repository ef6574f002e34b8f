"""Runs inside the vLLM venv (scripts/vllm-cpu-venv.sh): drives SkewdStatLogger with the real
vLLM 0.33 stat classes the way vLLM's StatLoggerManager does, and prints one JSON line of
results. Invoked by test_vllm_plugin.py; the step values are invented for the test (NOTE):
``prefill`` steps carry prompt tokens, ``decode`` steps carry one token per running request.

usage: python vllm_driver.py STEPS_PREFILL STEPS_DECODE STEP_SLEEP [old-call-style]
"""
from __future__ import annotations

import json
import sys
import time
from types import SimpleNamespace

from vllm.v1.engine import FinishReason
from vllm.v1.metrics.loggers import StatLoggerBase, load_stat_logger_plugin_factories
from vllm.v1.metrics.stats import (FinishedRequestStats, IterationStats, SchedulerIterationDetails,
                                   SchedulerStats)

from skewd.controller.vllm_plugin import SkewdStatLogger


def main() -> None:
    n_prefill, n_decode, sleep = int(sys.argv[1]), int(sys.argv[2]), float(sys.argv[3])
    old_style = len(sys.argv) > 4 and sys.argv[4] == "old"
    factories = load_stat_logger_plugin_factories()  # vLLM's own entry-point loader
    assert SkewdStatLogger in factories, factories
    assert issubclass(SkewdStatLogger, StatLoggerBase)
    cfg = SimpleNamespace(model_config=SimpleNamespace(served_model_name="m1", model="org/m1"))
    lg = SkewdStatLogger(cfg, engine_index=0)
    lg.log_engine_initialized()
    durations = []
    t_start = time.time()
    for i in range(n_prefill + n_decode):
        prefill = i < n_prefill
        running = 4 if prefill else 16
        s = SchedulerStats(num_running_reqs=running, num_waiting_reqs=12 if prefill else 2,
                           kv_cache_usage=0.30 if prefill else 0.85, step_counter=i,
                           iteration_details=SchedulerIterationDetails(
                               iteration_index=i, num_ctx_requests=4 if prefill else 0,
                               num_ctx_tokens=2048 if prefill else 0, num_generation_requests=0 if prefill else running,
                               num_generation_tokens=0 if prefill else running, elapsed_ms=40.0 if prefill else 12.0))
        it = IterationStats()
        if prefill:
            it.time_to_first_tokens_iter = [0.25, 0.30]
        else:
            it.inter_token_latencies_iter = [0.012] * running
            if i % 10 == 0:
                it.finished_requests = [FinishedRequestStats(
                    finish_reason=FinishReason.STOP, e2e_latency=2.0, num_prompt_tokens=512, num_generation_tokens=100,
                    queued_time=0.05, prefill_time=0.2, decode_time=1.2, inference_time=1.4)]
        t0 = time.perf_counter()
        if old_style:
            lg.record(s, it, 0)  # vLLM 0.10 style: engine index third, positionally
        else:
            lg.record(scheduler_stats=s, iteration_stats=it, mm_cache_stats=None, engine_idx=0)
        durations.append(time.perf_counter() - t0)
        lg.log()
        time.sleep(sleep)
    elapsed = time.time() - t_start
    pub = lg.publisher
    time.sleep(0.5)  # let the publisher take the tail
    lg.close()
    print(json.dumps({"recorded": lg.recorded, "errors": lg.errors, "published": pub.published if pub else 0,
                      "dropped": dict(pub.dropped) if pub else {}, "max_record_s": max(durations),
                      "mean_record_s": sum(durations) / len(durations), "elapsed_s": elapsed}))


if __name__ == "__main__":
    main()
