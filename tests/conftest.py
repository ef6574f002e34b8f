pytest_plugins = ["tests.conftest_nats"]

import gc

import pytest


@pytest.fixture(autouse=True)
def _gc_unfrozen():
    """A controller started in a test freezes the process's long-lived objects once warm
    (controller/gcpolicy.py), as the `skewd controller` process does; give them back to the
    collector after each test, so one test's leftovers never outlive it uncollected; and the
    collector's thresholds as they were (a started controller raises the young one)."""
    threshold = gc.get_threshold()
    yield
    if gc.get_freeze_count():
        gc.unfreeze()
    if gc.get_threshold() != threshold:
        gc.set_threshold(*threshold)
