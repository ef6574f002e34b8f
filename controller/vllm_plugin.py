"""vLLM stat-logger plugin: per-step prefill/decode stats from inside the engine, to NATS.

Install skewd next to vLLM (``pip install skewd[vllm]``); vLLM finds the plugin through the
``vllm.stat_logger_plugins`` entry point (``VLLM_PLUGINS=skewd`` limits loading to it), or pass
``stat_loggers=[SkewdStatLogger]`` to ``AsyncLLM.from_engine_args``. Configure with the
environment of the vLLM process:

``SKEWD_NATS_URL``        NATS server(s), comma-separated; unset = the plugin records nothing
``SKEWD_CLUSTER``         cluster name (default ``default``); ``SKEWD_NODE``: node name (default: host name)
``SKEWD_ENGINE_PREFIX``   engine entity prefix (default ``engine`` → ``engine0``; e.g. ``llama-70b/``)
``SKEWD_PHASE_INTERVAL``  seconds per published record per engine (default 0.2): the rate bound
``SKEWD_PHASE_MAX_STEPS`` steps kept per record (default 256; more are counted as ``truncated``)
``SKEWD_PHASE_QUEUE``     steps buffered between the engine and the publisher (default 8192)
``SKEWD_NATS_NKEY_SEED_FILE`` / ``SKEWD_NATS_CREDS_FILE`` / ``SKEWD_NATS_TLS_CA_FILE``  credentials and
                          CA on a secured server: the node's agent seed (``skewd nats-auth``) may
                          publish this node's phase subjects (docs/security.md)

The engine is never blocked: :meth:`SkewdStatLogger.record` copies a few numbers and does a
non-blocking put on a bounded queue (a full queue drops the step and counts it); a daemon
thread with its own asyncio loop aggregates the queue into one
:class:`~skewd.controller.messages.PhaseRecord` per engine per interval and publishes it on
``skewd.v1.phase.<cluster>.<node>.<engine>`` over core NATS; while NATS is unreachable records
are dropped and counted (``disconnected``). The counts travel in every record's ``dropped``.

vLLM calls ``SchedulerStats`` / ``IterationStats`` "not stable interfaces": every field is
read with a default, so a renamed field degrades one number, never the engine.
"""
from __future__ import annotations

import asyncio
import atexit
import logging
import os
import queue
import socket
import threading
import time
from typing import Any

from skewd.controller import messages as M

try:  # the plugin is only registered where vLLM is installed; importing it elsewhere still works
    from vllm.v1.metrics.loggers import StatLoggerBase
except Exception:  # noqa: BLE001 - vLLM absent or too old: keep the class importable for docs/tests
    class StatLoggerBase:  # type: ignore[no-redef]
        def __init__(self, vllm_config: Any, engine_index: int = 0) -> None: ...

log = logging.getLogger("skewd.vllm_plugin")

try:
    from skewd import __version__ as _VERSION
except Exception:  # noqa: BLE001
    _VERSION = ""


#: how long the steps recorded before the first connection are held rather than dropped
CONNECT_GRACE_S = 3.0


def _num(obj: Any, name: str, default: float = 0.0) -> float:
    v = getattr(obj, name, default) if obj is not None else default
    try:
        return float(v)
    except (TypeError, ValueError):
        return default


def _int(obj: Any, name: str) -> int:
    return int(_num(obj, name, 0))


class _Publisher:
    """One per process (all engines/loggers share it): queue → records → NATS."""

    def __init__(self, url: str, interval: float, max_steps: int, maxsize: int) -> None:
        self.url = url
        self.interval = interval
        self.max_steps = max_steps
        self.queue: queue.Queue = queue.Queue(maxsize=maxsize)
        self.dropped = {"queue_full": 0, "disconnected": 0, "truncated": 0, "errors": 0}
        self.published = 0
        self.connected = False
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="skewd-phase-publisher", daemon=True)
        self._thread.start()

    def put(self, item: tuple) -> None:
        try:
            self.queue.put_nowait(item)
        except queue.Full:
            self.dropped["queue_full"] += 1

    def close(self, timeout: float = 2.0) -> None:
        """Publish what is queued (if connected) and stop the thread."""
        self._stop.set()
        self._thread.join(timeout)

    def _run(self) -> None:
        try:
            asyncio.run(self._main())
        except Exception:  # noqa: BLE001 - the publisher must never take vLLM down
            log.exception("skewd phase publisher stopped")

    async def _main(self) -> None:
        import nats

        nc = nats.NATS()

        async def on_disc() -> None:
            self.connected = False

        async def on_reconn() -> None:
            self.connected = True

        async def on_err(e: Exception) -> None:
            log.debug("skewd plugin nats: %s", e)

        from skewd.natsutil import NatsConfig, connect_options

        env = os.environ
        cfg = NatsConfig(servers=tuple(s.strip() for s in self.url.split(",") if s.strip()),
                         nkey_seed_file=env.get("SKEWD_NATS_NKEY_SEED_FILE") or None,
                         creds_file=env.get("SKEWD_NATS_CREDS_FILE") or None,
                         tls_ca_file=env.get("SKEWD_NATS_TLS_CA_FILE") or None,
                         name=f"skewd-vllm-plugin-{socket.gethostname()}-{os.getpid()}")
        connecting = asyncio.ensure_future(nc.connect(
            **connect_options(cfg), disconnected_cb=on_disc, reconnected_cb=on_reconn, error_cb=on_err))
        started = time.monotonic()
        try:
            while True:
                stop = self._stop.is_set()
                if connecting is not None and connecting.done():
                    if connecting.exception() is None:
                        self.connected = nc.is_connected
                    connecting = None
                if not self.connected and not stop and connecting is not None \
                        and time.monotonic() - started < CONNECT_GRACE_S:
                    await asyncio.sleep(min(self.interval, 0.05))  # first connect: hold the steps briefly
                    continue
                for subject, rec in self._records():
                    if self.connected and nc.is_connected:
                        try:
                            await nc.publish(subject, M.encode(rec), headers=M.headers(rec))
                            self.published += 1
                        except Exception:  # noqa: BLE001 - dropped, counted
                            self.dropped["disconnected"] += 1
                    else:
                        self.dropped["disconnected"] += 1
                if stop:
                    break
                await asyncio.sleep(self.interval)
            if nc.is_connected:
                await asyncio.wait_for(nc.flush(), 2.0)
        finally:
            if connecting is not None:
                connecting.cancel()
            try:
                await asyncio.wait_for(nc.close(), 2.0)
            except Exception:  # noqa: BLE001
                pass

    def _records(self) -> list[tuple[str, M.PhaseRecord]]:
        """Everything queued so far, one record per engine."""
        by_engine: dict[tuple, dict[str, Any]] = {}
        while True:
            try:
                item = self.queue.get_nowait()
            except queue.Empty:
                break
            meta, t, step, finished, ttft, itl = item
            acc = by_engine.setdefault(meta, {"t0": t, "t": t, "steps": [], "fin": [], "ttft": [], "itl": [0, 0.0, None]})
            acc["t0"], acc["t"] = min(acc["t0"], t), max(acc["t"], t)
            if step is not None:
                if len(acc["steps"]) < self.max_steps:
                    acc["steps"].append(step)
                else:
                    self.dropped["truncated"] += 1
            acc["fin"].extend(finished[: max(0, self.max_steps - len(acc["fin"]))])
            acc["ttft"].extend(ttft[: max(0, self.max_steps - len(acc["ttft"]))])
            n, s, mx = itl
            if n:
                acc["itl"][0] += n
                acc["itl"][1] += s
                acc["itl"][2] = mx if acc["itl"][2] is None else max(acc["itl"][2], mx)
        out = []
        for (cluster, node, engine, model), acc in by_engine.items():
            rec = M.PhaseRecord(node=node, cluster=cluster, engine=engine, model=model, t_start=acc["t0"], t=acc["t"],
                                phase=M.classify_steps(acc["steps"]), steps=acc["steps"], finished=acc["fin"],
                                ttft_s=acc["ttft"], itl_count=acc["itl"][0], itl_sum_s=acc["itl"][1],
                                itl_max_s=acc["itl"][2], dropped=dict(self.dropped), plugin_version=_VERSION)
            out.append((_phase_subject(cluster, node, engine), rec))
        return out


def _phase_subject(cluster: str, node: str, engine: str) -> str:
    from skewd import wire

    return wire.phase_subject(cluster, node, engine)


_shared: dict[str, _Publisher] = {}
_shared_lock = threading.Lock()


def _publisher(url: str) -> _Publisher:
    with _shared_lock:
        p = _shared.get(url)
        if p is None:
            p = _shared[url] = _Publisher(url, float(os.environ.get("SKEWD_PHASE_INTERVAL", "0.2")),
                                          int(os.environ.get("SKEWD_PHASE_MAX_STEPS", "256")),
                                          int(os.environ.get("SKEWD_PHASE_QUEUE", "8192")))
            atexit.register(p.close)
        return p


class SkewdStatLogger(StatLoggerBase):
    """vLLM ``StatLoggerBase`` that forwards each step's prefill/decode split, KV usage, queue
    and finished-request phase times to skewd (see the module doc)."""

    def __init__(self, vllm_config: Any, engine_index: int = 0) -> None:
        self.engine_index = engine_index
        mc = getattr(vllm_config, "model_config", None)
        name = getattr(mc, "served_model_name", None) or getattr(mc, "model", None) or ""
        self.model = str(name[0] if isinstance(name, (list, tuple)) and name else name)
        self.cluster = os.environ.get("SKEWD_CLUSTER") or "default"
        self.node = os.environ.get("SKEWD_NODE") or socket.gethostname()
        self.prefix = os.environ.get("SKEWD_ENGINE_PREFIX", "engine")
        url = os.environ.get("SKEWD_NATS_URL", "")
        self.publisher: _Publisher | None = _publisher(url) if url else None
        self.recorded = 0
        self.errors = 0
        if self.publisher is None:
            log.warning("skewd stat logger: SKEWD_NATS_URL is not set; phase records are not published")

    def _engine(self, idx: int) -> str:
        return f"{self.prefix}{idx}"

    def record(self, scheduler_stats: Any = None, iteration_stats: Any = None, mm_cache_stats: Any = None,
               engine_idx: Any = None, *args: Any, **kwargs: Any) -> None:
        """Called by vLLM after every engine step (0.10 passed ``engine_idx`` third). Never
        raises, never blocks."""
        pub = self.publisher
        if pub is None:
            return
        try:
            if engine_idx is None:
                engine_idx = mm_cache_stats if isinstance(mm_cache_stats, int) else kwargs.get("engine_idx",
                                                                                                 self.engine_index)
            t = _num(iteration_stats, "iteration_timestamp", 0.0) or _num(scheduler_stats, "iteration_timestamp",
                                                                             0.0) or time.time()
            step = None
            if scheduler_stats is not None:
                d = getattr(scheduler_stats, "iteration_details", None)
                if d is not None and getattr(d, "is_dummy", False):
                    d = None
                if d is not None:
                    ctx_r, ctx_t = _int(d, "num_ctx_requests"), _int(d, "num_ctx_tokens")
                    gen_r, gen_t = _int(d, "num_generation_requests"), _int(d, "num_generation_tokens")
                    elapsed = _num(d, "elapsed_ms", -1.0)
                    elapsed_s = elapsed / 1000.0 if elapsed >= 0 else None
                    index = _int(d, "iteration_index") or _int(scheduler_stats, "step_counter")
                else:  # older vLLM: the split from the iteration's token counts
                    ctx_r = gen_r = 0
                    ctx_t = _int(iteration_stats, "num_prompt_tokens")
                    gen_t = _int(iteration_stats, "num_generation_tokens")
                    elapsed_s, index = None, _int(scheduler_stats, "step_counter")
                step = M.StepStat(t=t, index=index, ctx_reqs=ctx_r, ctx_tokens=ctx_t, gen_reqs=gen_r, gen_tokens=gen_t,
                                  elapsed_s=elapsed_s, running=_int(scheduler_stats, "num_running_reqs"),
                                  waiting=_int(scheduler_stats, "num_waiting_reqs"),
                                  kv_usage_ratio=_num(scheduler_stats, "kv_cache_usage",
                                                      _num(scheduler_stats, "gpu_cache_usage")))
            finished: list[M.FinishedStat] = []
            ttft: list[float] = []
            itl = (0, 0.0, None)
            if iteration_stats is not None:
                for fr in getattr(iteration_stats, "finished_requests", None) or ():
                    reason = getattr(fr, "finish_reason", "")
                    finished.append(M.FinishedStat(
                        t=t, queued_s=_num(fr, "queued_time"), prefill_s=_num(fr, "prefill_time"),
                        decode_s=_num(fr, "decode_time"), prompt_tokens=_int(fr, "num_prompt_tokens"),
                        gen_tokens=_int(fr, "num_generation_tokens"),
                        finish_reason=str(getattr(reason, "name", reason)).lower()))
                ttft = [float(x) for x in (getattr(iteration_stats, "time_to_first_tokens_iter", None) or ())]
                lat = getattr(iteration_stats, "inter_token_latencies_iter", None) or ()
                if lat:
                    itl = (len(lat), float(sum(lat)), float(max(lat)))
            if step is None and not finished and not ttft:
                return
            pub.put(((self.cluster, self.node, self._engine(int(engine_idx or 0)), self.model),
                     t, step, finished, ttft, itl))
            self.recorded += 1
        except Exception:  # noqa: BLE001 - a changed vLLM field must never break the engine
            self.errors += 1
            if pub is not None:
                pub.dropped["errors"] += 1

    def log_engine_initialized(self) -> None:
        log.info("skewd stat logger active for %s engine %d (cluster %s, node %s, NATS %s)", self.model or "?",
                 self.engine_index, self.cluster, self.node, "on" if self.publisher else "off")

    def log(self) -> None:  # vLLM's periodic log tick: nothing to print, the thread publishes
        pass

    def record_sleep_state(self, is_awake: int, level: int) -> None:
        pass

    def close(self) -> None:
        """Flush and stop the shared publisher (tests; vLLM exits without calling it)."""
        if self.publisher is not None:
            self.publisher.close()
