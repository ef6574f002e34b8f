"""The controller's own ``/metrics`` (``metrics.listen``, 127.0.0.1:9466 by default).

Everything is read at scrape time from :meth:`Controller.status` (its public snapshot), taken on
the controller's event loop so a scrape never reads state the loop is changing. A scrape while
the loop is blocked for over two seconds reports ``skewd_controller_up 0`` instead of hanging.

- ``skewd_controller_<count>_total``: every :class:`ControllerStats` count (summaries, findings
  in, incidents published, remaps published, replies, errors, ...) as a counter;
- ``skewd_controller_incidents{state="open"|"held"}``: open incidents, published or still held;
- ``skewd_controller_suggestions{status}``: suggestions known, by status;
- ``skewd_controller_nats_connected``, ``skewd_controller_unaligned_groups``,
  ``skewd_controller_rule_eval_errors``; plus ``process_*`` and ``skewd_build_info``.
"""
from __future__ import annotations

import asyncio
import concurrent.futures
import logging
from typing import TYPE_CHECKING, Any, Iterator

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

from skewd import metrics

if TYPE_CHECKING:
    from .alertmanager import AlertmanagerSink
    from .service import Controller

log = logging.getLogger("skewd.controller.metrics")

#: how long a scrape waits for the event loop's snapshot
SNAPSHOT_TIMEOUT_S = 2.0


class ControllerMetrics:
    """Prometheus collector over one controller (and its Alertmanager sink, if any)."""

    def __init__(self, ctl: "Controller", loop: asyncio.AbstractEventLoop,
                 sink: "AlertmanagerSink | None" = None) -> None:
        self.ctl = ctl
        self.loop = loop
        self.sink = sink

    def _snapshot(self) -> dict[str, Any] | None:
        fut: concurrent.futures.Future = concurrent.futures.Future()

        def take() -> None:
            try:
                ncs = (self.ctl.nc, getattr(self.ctl, "intake_nc", None))  # control, summary intake
                connected = ncs[0] is not None and all(nc.is_connected for nc in ncs if nc is not None)
                fut.set_result((self.ctl.status(), connected,
                                self.sink.stats() if self.sink is not None else None))
            except Exception as e:  # noqa: BLE001 - reported as a failed scrape below
                fut.set_exception(e)

        try:
            self.loop.call_soon_threadsafe(take)
            status, connected, sink = fut.result(SNAPSHOT_TIMEOUT_S)
        except (concurrent.futures.TimeoutError, RuntimeError) as e:  # loop blocked or closed
            log.warning("metrics scrape: no controller snapshot (%s)", e)
            return None
        return {"status": status, "connected": connected, "sink": sink}

    def collect(self) -> Iterator[Any]:
        snap = self._snapshot()
        yield GaugeMetricFamily("skewd_controller_up", "1 when the controller answered this scrape",
                                value=0.0 if snap is None else 1.0)
        if snap is None:
            return
        st = snap["status"]
        for name, v in sorted(st["stats"].items()):
            yield CounterMetricFamily(f"skewd_controller_{name}", f"controller {name.replace('_', ' ')}",
                                      value=float(v))
        inc = GaugeMetricFamily("skewd_controller_incidents", "open incidents (held: not published yet)",
                                labels=["state"])
        held = sum(1 for i in st["open_incidents"] if i.get("held"))
        inc.add_metric(["open"], len(st["open_incidents"]) - held)
        inc.add_metric(["held"], held)
        yield inc
        sug = GaugeMetricFamily("skewd_controller_suggestions", "remap suggestions known, by status",
                                labels=["status"])
        counts: dict[str, int] = {}
        for status in st["suggestions"].values():
            counts[str(status)] = counts.get(str(status), 0) + 1
        for status in sorted({"planned", "published", "acked", "rejected", "expired", *counts}):
            sug.add_metric([status], counts.get(status, 0))
        yield sug
        yield GaugeMetricFamily("skewd_controller_nats_connected", "1 while connected to NATS (the control and the summary-intake connection both)",
                                value=1.0 if snap["connected"] else 0.0)
        yield GaugeMetricFamily("skewd_controller_unaligned_groups", "TP groups whose steps cannot be aligned",
                                value=float(len(st["unaligned_groups"])))
        yield GaugeMetricFamily("skewd_controller_rule_eval_errors", "group rules whose last evaluation failed",
                                value=float(len(st["eval_errors"])))
        if snap["sink"] is not None:
            for name, v in sorted(snap["sink"].items()):
                family = GaugeMetricFamily if name == "alerts_firing" else CounterMetricFamily
                yield family(f"skewd_alertmanager_{name}", f"Alertmanager sink {name.replace('_', ' ')}", value=float(v))


def serve(ctl: "Controller", listen: str, sink: "AlertmanagerSink | None" = None) -> Any:
    """Start the endpoint from inside the controller's event loop; returns the server (call
    ``.shutdown()``) or None when ``listen`` is empty."""
    return metrics.serve(metrics.registry("controller", ControllerMetrics(ctl, asyncio.get_running_loop(), sink)),
                         listen, "controller")
