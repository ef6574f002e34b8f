"""The agent reports its clock discipline so the controller can widen alignment tolerance."""
from __future__ import annotations

from skewd import wire
from skewd.agent.clock import clock_state


def test_clock_state_reads_the_kernel_discipline():
    st = clock_state()
    assert st.source == "adjtimex"
    # the kernel keeps maxerror (µs) even when unsynchronised (it grows to 16 s)
    assert st.max_error_s is not None and 0 <= st.max_error_s <= 16.0
    assert isinstance(st.synced, bool)


def test_summary_carries_labels_and_clock_through_the_wire():
    s = wire.Summary(node="n1", cluster="c", t=1.0, interval=1.0, signals={"summary_burst_bytes": {"": 5.0}},
                     clock_sync=wire.ClockSync(synced=False, max_error_s=0.25), agent_version="x",
                     labels={"tp_group": "tp0", "tp_rank": "3"})
    back = wire.decode(wire.encode(s), expect="summary")
    assert back.labels == {"tp_group": "tp0", "tp_rank": "3"} and back.clock_sync.max_error_s == 0.25
