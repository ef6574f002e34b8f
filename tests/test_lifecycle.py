"""One lifecycle vocabulary for the long-lived components (OpenTelemetry's Start/Shutdown).

The agent, the controller, the publisher, the recorder, the live source and every collector
stop with ``stop()``: idempotent and safe when ``start()`` never ran (a failed boot, a test
that built one and gave up). What each does with work still running at stop is written down
in ``collectors/README.md``; the collectors themselves are held to their contract by
``tests/collectors/test_lifecycle.py``.
"""
from __future__ import annotations

import asyncio
import inspect

import pytest

from skewd.agent.config import load_config as agent_config
from skewd.agent.publisher import Publisher
from skewd.agent.record import Recorder
from skewd.agent.runner import Agent
from skewd.agent.scheduler import LiveSource
from skewd.agent.spool import Spool
from skewd.collectors.base import Collector
from skewd.controller.config import load_config as controller_config
from skewd.controller.service import Controller
from skewd.natsutil import NatsConfig

pytestmark = pytest.mark.timeout(60)

#: components with something to start (a recorder is ready when built: it has only stop())
STARTED = (Agent, Controller, Publisher, LiveSource, Collector)
COMPONENTS = STARTED + (Recorder,)


@pytest.mark.parametrize("cls", COMPONENTS, ids=lambda c: c.__name__)
def test_one_word_for_stopping(cls: type) -> None:
    assert callable(getattr(cls, "stop", None)), f"{cls.__name__} has no stop()"
    for other in ("close", "shutdown", "aclose", "terminate"):
        assert not hasattr(cls, other), f"{cls.__name__}.{other}(): call it stop()"
    if cls in STARTED:
        assert callable(getattr(cls, "start", None)), f"{cls.__name__} has no start()"


async def _stop_twice(component: object) -> None:
    for _ in range(2):
        r = component.stop()  # type: ignore[attr-defined]
        if inspect.isawaitable(r):
            await asyncio.wait_for(r, 10)


def test_stop_without_start_is_safe_and_idempotent(tmp_path) -> None:
    async def main() -> None:
        cfg = agent_config(None, env={}, overrides={"node": "n1", "cluster": "c"})
        await _stop_twice(Agent(cfg))
        await _stop_twice(Controller(controller_config(None, env={}, overrides={"cluster": "c"})))
        spool = Spool(tmp_path / "spool")
        try:
            # a server nobody listens on: stop() must not try to reach it
            await _stop_twice(Publisher(NatsConfig(servers=("nats://127.0.0.1:9",)), spool, cluster="c"))
        finally:
            spool.close()
        await _stop_twice(LiveSource([]))
        rec = Recorder(tmp_path / "cap", node="n1")
        await _stop_twice(rec)
        assert rec.stopped

    asyncio.run(main())
