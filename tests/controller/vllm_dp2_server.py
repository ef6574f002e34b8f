"""A live vLLM 0.33 /metrics endpoint of one front end with two engine cores, for tests.

Runs in the vLLM CPU venv (tests/vllm_venv.py): vLLM's own PrometheusStatLogger records one
step per engine every ``step`` seconds - the SchedulerStats / IterationStats a running engine
hands its stat loggers, built by hand as tests/fixtures/vllm/v0.33/make_dp2_pages.py does (its
engines and NOTE: the numbers are invented) - and ``/metrics`` serves what the logger's registry
renders, as ``vllm serve`` does. Names, labels, buckets and layout are vLLM's.

Engine 0 is chat-like (decode dominates its time, KV 0.55, nothing waiting); engine 1
summarises (prefill dominates) with its KV cache at 0.93 and, from ``--saturate-after`` steps on,
one more request waiting every step: GPU-2's onset on that engine only.

    python vllm_dp2_server.py PORT [--step 0.5] [--saturate-after 4]

Prints ``ready`` once it listens; runs until killed.
"""
from __future__ import annotations

import argparse
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import prometheus_client

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "fixtures" / "vllm" / "v0.33"))
from make_dp2_pages import ENGINES, PrometheusStatLogger, config, step  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("port", type=int)
    ap.add_argument("--step", type=float, default=0.5)
    ap.add_argument("--saturate-after", type=int, default=4)
    a = ap.parse_args()
    logger = PrometheusStatLogger(config(), [0, 1])
    logger.log_engine_initialized()
    lock = threading.Lock()

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802 (http.server API)
            if self.path != "/metrics":
                self.send_error(404)
                return
            with lock:
                body = prometheus_client.generate_latest()
            self.send_response(200)
            self.send_header("Content-Type", prometheus_client.CONTENT_TYPE_LATEST)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: object) -> None:
            pass

    httpd = ThreadingHTTPServer(("127.0.0.1", a.port), Handler)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    print("ready", flush=True)
    waiting = ENGINES[1]["waiting"]
    n = 0
    while True:
        n += 1
        if n > a.saturate_after:
            waiting += 1
        ENGINES[1]["waiting"] = waiting
        with lock:
            for e in ENGINES:
                step(logger, e)
        time.sleep(a.step)


if __name__ == "__main__":
    main()
