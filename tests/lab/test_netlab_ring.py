"""The real-traffic lab's fallback collective (where torch is absent): a plain ring all-reduce
over real TCP sockets must compute what an all-reduce computes, for uneven chunks too, and
agree on a maximum the way the ranks calibrate their compute time."""
from __future__ import annotations

import argparse
import importlib.util
import threading
from pathlib import Path

import numpy as np
import pytest

from skewd.natsutil import free_port

RANK = Path(__file__).resolve().parents[2] / "lab" / "netlab" / "workers" / "rank.py"

pytestmark = pytest.mark.timeout(60)


def load_rank_module():
    # the worker is a stand-alone script (it runs in venvs without skewd): load it by path
    spec = importlib.util.spec_from_file_location("netlab_rank", RANK)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def ring(world: int, n_bytes: int):
    mod = load_rank_module()
    base = free_port()
    comms: list = [None] * world
    errors: list[BaseException] = []

    def make(r: int) -> None:
        try:
            a = argparse.Namespace(rank=r, world=world, addrs=",".join(["127.0.0.1"] * world), port=base,
                                   bytes=n_bytes)
            comms[r] = mod.RingComm(a)
        except BaseException as e:  # noqa: BLE001 - reported by the test
            errors.append(e)

    ts = [threading.Thread(target=make, args=(r,)) for r in range(world)]
    for t in ts:
        t.start()
    for t in ts:
        t.join(30)
    assert not errors, errors
    return comms


def run_all(comms, fn) -> None:
    errors: list[BaseException] = []

    def go(r: int) -> None:
        try:
            fn(r, comms[r])
        except BaseException as e:  # noqa: BLE001
            errors.append(e)

    ts = [threading.Thread(target=go, args=(r,)) for r in range(len(comms))]
    for t in ts:
        t.start()
    for t in ts:
        t.join(30)
    assert not errors, errors


@pytest.mark.parametrize("world,n_bytes", [(2, 4 * 1000), (3, 4 * 1001), (5, 4 * 257)])
def test_ring_allreduce_sums_every_ranks_buffer(world: int, n_bytes: int) -> None:
    comms = ring(world, n_bytes)
    try:
        n = n_bytes // 4
        bufs = [np.arange(n, dtype=np.float32) * (r + 1) for r in range(world)]
        expect = np.arange(n, dtype=np.float32) * sum(range(1, world + 1))
        run_all(comms, lambda r, c: c._ring(bufs[r], "sum"))
        for r in range(world):
            np.testing.assert_allclose(bufs[r], expect, rtol=1e-6)
        got: dict[int, float] = {}
        run_all(comms, lambda r, c: got.__setitem__(r, c.agree_max(0.01 * (r + 1))))
        assert got == {r: pytest.approx(0.01 * world) for r in range(world)}
    finally:
        for c in comms:
            c.close()


def test_ring_sends_only_to_the_right_neighbour() -> None:
    comms = ring(3, 4 * 300)
    try:
        for r, c in enumerate(comms):
            # the ring's wire pattern: rank r's only outgoing connection ends at rank r+1's listener
            right = comms[(r + 1) % 3]
            assert c.tx.getpeername() == right.rx.getsockname()
    finally:
        for c in comms:
            c.close()
