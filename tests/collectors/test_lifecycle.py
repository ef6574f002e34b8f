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
