"""Every registered collector honours the lifecycle contract (OpenTelemetry Collector style):
probe() never raises and explains an inactive state, start() returns quickly, stop() is
idempotent and safe without start(), and a stopped collector can start again."""
from __future__ import annotations

import time

import pytest

from skewd.collectors.base import Availability, Status
from skewd.collectors.registry import NAMES, catalogue, collector_class
from skewd.model import Catalogue


#: what a collector needs to be startable here (pkt captures on loopback, which needs root)
CONFIG = {"pkt": {"interface": "lo"}}


@pytest.mark.parametrize("name", NAMES)
def test_start_stop_restart(name, tmp_path):
    import os

    if name == "pkt" and os.geteuid() != 0:
        pytest.skip("packet capture needs CAP_NET_RAW (root)")
    cls = collector_class(name)
    c = cls("lifecycle-node", CONFIG.get(name, {}))
    c.stop()  # safe before start
    st = c.probe()
    assert isinstance(st, Status)
    if st.availability is not Availability.ACTIVE:
        assert st.reason, f"{name} is {st.availability.value} without saying why"
    for _ in range(2):  # start, stop, stop again, restart
        t0 = time.perf_counter()
        c.start()
        assert time.perf_counter() - t0 < 2.0, f"{name}.start() must return quickly"
        c.stop()
        c.stop()


@pytest.mark.parametrize("name", NAMES)
def test_collector_catalogue_is_its_own_and_well_formed(name):
    cls = collector_class(name)
    specs = {s.name: s for s in cls.catalogue}
    assert specs, name
    for s in specs.values():
        assert s.name.endswith("_total") == (s.kind.value == "counter"), s.name
        assert s.unit and s.desc
    if name != "exporter":  # the exporter also maps onto gpu/pcie signals, with their owners' specs
        assert {s.collector for s in specs.values()} == {name}


def test_all_catalogues_merge_without_conflicts():
    cat = catalogue()
    assert isinstance(cat, Catalogue) and len(cat) > 200


@pytest.mark.parametrize("name", NAMES)
def test_probe_holds_nothing(name):
    """An inactive collector is probed again and again for the agent's life: a probe that kept
    a socket or file open would leak one per retry."""
    import os

    cls = collector_class(name)
    cls("warm-up", CONFIG.get(name, {})).probe()  # first use may import modules, look up libraries
    c = cls("lifecycle-node", CONFIG.get(name, {}))
    before = sorted(os.listdir("/proc/self/fd"))
    for _ in range(3):
        c.probe()
        after = sorted(os.listdir("/proc/self/fd"))
        assert after == before, f"{name}.probe() left {len(after) - len(before)} descriptor(s) open"
    c.stop()


@pytest.mark.parametrize("name", NAMES)
def test_config_problems_name_the_key(name):
    """Each collector validates its own settings at config load; a bad value is reported with
    the collector's key, a good (empty) config has no problem."""
    cls = collector_class(name)
    assert cls.config_problems(CONFIG.get(name, {})) == []
    bad = {"vllm": {"endpoints": ["ftp://x"]}, "exporter": {"targets": [{"url": "http://h:1/m", "mapping": "nope"}]},
           "host": {"user_hz": 0}, "pkt": {"interface": "lo", "snaplen": 10}, "netdev": {"interfaces": "eth0"},
           "rdma": {"devices": "mlx5_0"}, "pcie": {"classes": "0x0302"}, "gpu": {"xid_events": "yes"},
           "nccl": {"dump_dir": "relative/dir"}}[name]
    problems = cls.config_problems(bad)
    assert problems and all(p.startswith(f"collectors.{name}") for p in problems), problems
