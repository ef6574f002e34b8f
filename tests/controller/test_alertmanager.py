"""Incidents to Alertmanager: what the sink posts is a valid v2 ``postableAlerts`` body, firing
alerts are re-sent while open and end when the incident does, a failed post is retried; and a
real Alertmanager (Debian's ``prometheus-alertmanager``) shows the alert, then resolves it."""
from __future__ import annotations

import asyncio
import datetime as dt
import http.server
import json
import os
import re
import shutil
import subprocess
import threading
import time
import urllib.request
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import jsonschema
import nats
import pytest

from skewd.controller import messages as M
from skewd.controller.alertmanager import AlertmanagerSink, alert_for
from skewd.controller.config import AlertmanagerConfig, ConfigError, load_config
from skewd.natsutil import ensure_streams, free_port

pytestmark = pytest.mark.timeout(120)

# The v2 API's postableAlerts, restated as JSON Schema from Alertmanager's published OpenAPI
# definition (api/v2/openapi.yaml: postableAlert = startsAt, endsAt, annotations + alert =
# labels (required), generatorURL; labelSet = string → string). additionalProperties is false
# here (Alertmanager ignores unknown fields) so a misspelt field fails the test.
LABEL_SET = {"type": "object", "additionalProperties": {"type": "string"}}
POSTABLE_ALERTS = {
    "$schema": "https://json-schema.org/draft/2020-12/schema",
    "type": "array",
    "items": {"type": "object", "required": ["labels"], "additionalProperties": False,
              "properties": {"labels": {**LABEL_SET, "minProperties": 1}, "annotations": LABEL_SET,
                             "startsAt": {"type": "string", "format": "date-time"},
                             "endsAt": {"type": "string", "format": "date-time"},
                             "generatorURL": {"type": "string", "format": "uri"}}},
}
RFC3339 = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(\.\d+)?(Z|[+-]\d\d:\d\d)$")
FORMATS = jsonschema.FormatChecker()


@FORMATS.checks("date-time")
def _is_datetime(v: object) -> bool:
    return not isinstance(v, str) or bool(RFC3339.match(v)) and dt.datetime.fromisoformat(v.replace("Z", "+00:00")) is not None


@FORMATS.checks("uri")
def _is_uri(v: object) -> bool:
    return not isinstance(v, str) or bool(urlsplit(v).scheme and urlsplit(v).netloc)


def _ts(s: str) -> float:
    return dt.datetime.fromisoformat(s.replace("Z", "+00:00")).timestamp()


def incident(state: str, opened: float, updated: float, resolved: float | None = None, iid: str = "inc-1") -> M.Incident:
    return M.Incident(id=iid, cluster="amc", pathology="EW-1", rule_id="EW-1-tp-straggler", state=state,
                      group={"tp_group": "tp0"}, culprit=M.Target(node="n2", tp_group="tp0"),
                      cause=M.Cause(layer="pcie", reason="H2D feed starved", confidence=0.8), victims=["n0", "n1"],
                      findings=["f1"], inhibited=[], phase=None, effect=None, summary="n2 is late at every step",
                      opened_at=opened, updated_at=updated, resolved_at=resolved)


CFG = AlertmanagerConfig(urls=("http://127.0.0.1:1",), resend_interval=0.3, timeout=2.0,
                         generator_url="https://grafana.example/d/skewd?var-incident={incident}&var-cluster={cluster}",
                         labels=(("site", "eu-1"), ("node", "must-not-win")))


def test_alert_labels_annotations_and_times() -> None:
    now = 1_800_000_000.0
    a = alert_for(incident("open", now - 60, now - 5), CFG, now)
    jsonschema.validate([a], POSTABLE_ALERTS, format_checker=FORMATS)
    assert a["labels"] == {"alertname": "EW-1-tp-straggler", "pathology": "EW-1", "cluster": "amc", "incident": "inc-1",
                           "node": "n2", "tp_group": "tp0", "layer": "pcie", "site": "eu-1"}
    assert a["annotations"]["summary"] == "n2 is late at every step" and "pcie" in a["annotations"]["cause"]
    assert _ts(a["startsAt"]) == pytest.approx(now - 60) and _ts(a["endsAt"]) == pytest.approx(now + 4 * 0.3)
    assert a["generatorURL"].endswith("var-incident=inc-1&var-cluster=amc")
    r = alert_for(incident("resolved", now - 60, now - 2, resolved=now - 2), CFG, now)
    assert _ts(r["endsAt"]) == pytest.approx(now - 2)
    i = alert_for(incident("inhibited", now - 60, now - 1), CFG, now)
    assert _ts(i["endsAt"]) == pytest.approx(now - 1)  # explained by another incident: ends here


def test_config_validation() -> None:
    cfg = load_config(None, env={}, overrides={"alertmanager": {"url": "http://am:9093/", "labels": {"site": "x"}}})
    assert cfg.alertmanager is not None and cfg.alertmanager.urls == ("http://am:9093",)
    assert load_config(None, env={}).alertmanager is None and load_config(None, env={}).metrics_listen == "127.0.0.1:9466"
    with pytest.raises(ConfigError) as e:
        load_config(None, env={}, overrides={"alertmanager": {"url": "am:9093", "generator_url": "{nope}",
                                                              "resend_interval": "soon"}, "metrics": {"listen": "9466"}})
    text = "\n".join(e.value.problems)
    for want in ("alertmanager.url 'am:9093'", "generator_url may only use", "alertmanager.resend_interval",
                 "metrics.listen"):
        assert want in text, text


class _Receiver(http.server.BaseHTTPRequestHandler):
    """A real HTTP server standing in for Alertmanager's API: records each POST body, and
    answers 500 to the first ``fail`` requests."""

    bodies: list[tuple[float, list[dict]]] = []
    fail = 0

    def do_POST(self) -> None:  # noqa: N802 - http.server API
        body = self.rfile.read(int(self.headers["Content-Length"]))
        assert self.path == "/api/v2/alerts" and self.headers["Content-Type"] == "application/json"
        if type(self).fail > 0:
            type(self).fail -= 1
            self.send_response(500)
            self.end_headers()
            return
        type(self).bodies.append((time.time(), json.loads(body)))
        self.send_response(200)
        self.end_headers()

    def log_message(self, *a: Any) -> None:
        pass


async def test_posts_follow_the_incident_stream_and_match_the_v2_schema(nats_server) -> None:
    srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Receiver)
    _Receiver.bodies, _Receiver.fail = [], 1
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    cfg = AlertmanagerConfig(urls=(f"http://127.0.0.1:{srv.server_address[1]}",), resend_interval=0.3, timeout=2.0)
    nc = await nats.connect(nats_server.url)
    sink = AlertmanagerSink(cfg, "amc")
    try:
        js = nc.jetstream()
        await ensure_streams(js, [M.INCIDENTS_STREAM])
        t0 = time.time()
        old = incident("resolved", t0 - 7200, t0 - 3600, resolved=t0 - 3600, iid="inc-old")
        for inc in (old, incident("open", t0 - 30, t0 - 1)):
            await js.publish(M.incident_subject("amc"), M.encode(inc))
        await sink.start(nc)
        await _until(lambda: len(_Receiver.bodies) >= 3, 10, "the first post and two resends")
        assert sink.post_errors == 1  # the first attempt got a 500 and was retried
        for _, body in _Receiver.bodies:
            jsonschema.validate(body, POSTABLE_ALERTS, format_checker=FORMATS)
            assert [a["labels"]["incident"] for a in body] == ["inc-1"]  # the hour-old resolved one is not sent
        gaps = [b[0] - a[0] for a, b in zip(_Receiver.bodies, _Receiver.bodies[1:])]
        assert all(0.2 < g < 1.5 for g in gaps), gaps  # re-sent every resend_interval while firing
        for t, body in _Receiver.bodies:
            assert _ts(body[0]["endsAt"]) > t  # a firing alert ends in the future
        await js.publish(M.incident_subject("amc"), M.encode(incident("resolved", t0 - 30, time.time(), resolved=time.time())))
        await _until(lambda: any(_ts(b[0]["endsAt"]) <= t for t, b in _Receiver.bodies), 10, "the resolved alert")
        assert sink.stats()["alerts_firing"] == 0
    finally:
        await sink.stop()
        await nc.close()
        srv.shutdown()
        srv.server_close()


async def _until(pred, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if pred():
            return
        await asyncio.sleep(0.05)
    raise AssertionError(f"timed out after {timeout:g}s waiting for {what}")


def _alertmanager_bin() -> str:
    for name in ("alertmanager", "prometheus-alertmanager"):
        p = shutil.which(name)
        if p:
            return p
    pytest.skip("needs the Alertmanager binary (Debian: apt-get install prometheus-alertmanager; dev.sh installs it as root)")


@pytest.fixture
def alertmanager(tmp_path: Path):
    binary = _alertmanager_bin()
    conf = tmp_path / "am.yml"
    conf.write_text("route: {receiver: 'null', group_wait: 1s}\nreceivers: [{name: 'null'}]\n")
    port = free_port()
    log = open(tmp_path / "am.log", "wb")
    proc = subprocess.Popen([binary, f"--config.file={conf}", f"--storage.path={tmp_path / 'data'}",
                             f"--web.listen-address=127.0.0.1:{port}", "--cluster.listen-address="],
                            stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env={**os.environ})
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 20
        while True:
            try:
                with urllib.request.urlopen(f"{url}/-/ready", timeout=1) as r:
                    if r.status == 200:
                        break
            except OSError:
                if proc.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError((tmp_path / "am.log").read_text()[-2000:]) from None
                time.sleep(0.1)
        yield url
    finally:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(5)
        log.close()


def _am_alerts(url: str) -> list[dict]:
    with urllib.request.urlopen(f"{url}/api/v2/alerts?filter=cluster%3D%22amc%22", timeout=5) as r:
        return json.loads(r.read())


async def test_a_real_alertmanager_shows_the_incident_then_resolves_it(alertmanager: str, nats_server) -> None:
    cfg = AlertmanagerConfig(urls=(alertmanager,), resend_interval=0.5, timeout=5.0,
                             generator_url="http://skewd.example/incidents/{incident}")
    nc = await nats.connect(nats_server.url)
    sink = AlertmanagerSink(cfg, "amc")
    try:
        js = nc.jetstream()
        await ensure_streams(js, [M.INCIDENTS_STREAM])
        t0 = time.time()
        await js.publish(M.incident_subject("amc"), M.encode(incident("open", t0 - 30, t0 - 1, iid="inc-real")))
        await sink.start(nc)
        alerts: list[dict] = []

        async def shown() -> bool:
            alerts[:] = [a for a in await asyncio.to_thread(_am_alerts, alertmanager)
                         if a["labels"].get("incident") == "inc-real"]
            return bool(alerts) and alerts[0]["status"]["state"] == "active"

        await _until_async(shown, 15, "Alertmanager to list the alert as active")
        a = alerts[0]
        assert a["labels"]["alertname"] == "EW-1-tp-straggler" and a["labels"]["node"] == "n2"
        assert a["annotations"]["summary"] == "n2 is late at every step"
        assert a["generatorURL"] == "http://skewd.example/incidents/inc-real"
        assert _ts(a["startsAt"]) == pytest.approx(t0 - 30, abs=0.01)
        end = time.time()
        await js.publish(M.incident_subject("amc"), M.encode(incident("resolved", t0 - 30, end, resolved=end, iid="inc-real")))

        async def gone() -> bool:  # Alertmanager lists only unresolved alerts
            return not [x for x in await asyncio.to_thread(_am_alerts, alertmanager)
                        if x["labels"].get("incident") == "inc-real"]

        await _until_async(gone, 15, "Alertmanager to resolve the alert")
    finally:
        await sink.stop()
        await nc.close()


async def _until_async(pred, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if await pred():
            return
        await asyncio.sleep(0.2)
    raise AssertionError(f"timed out after {timeout:g}s waiting for {what}")
