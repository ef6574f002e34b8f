"""Signals the controller derives from node summaries (collector name ``controller``).

Signals marked ``needs_synced_clock`` come from matching burst timestamps taken on different
nodes (steps are aligned by time): an unsynced node's clock offset shifts them, so the agent
names the rules reading them when its clock is unsynced. Clock-free measures (a node's own
durations, byte rates) are not marked.

They are node-scope, stamped at the controller's evaluation time and ingested into the same
window store as the agents' summary signals, so cross-node rules (scope ``tp_group`` /
``cluster``) read them like any other signal. ``skewd.catalogue.full_catalogue`` merges this
list, so rule files may reference these names.
"""
from __future__ import annotations

from skewd.model import signal

_C = "controller"

CATALOGUE = [
    # -- EW-1 TP straggler: per-collective burst alignment across the TP group --------------------
    signal("ctl_arrival_lag_seconds", "gauge", "seconds", "node",
           "median, over the recent aligned collective steps of the node's TP group, of how long the "
           "node's burst started after the earliest peer's", _C, needs_synced_clock=True),
    signal("ctl_arrival_lag_excess_seconds", "gauge", "seconds", "node",
           "like ctl_arrival_lag_seconds but each step's lag reduced by the clock uncertainty of the two "
           "nodes compared (their reported max clock error); 0 when the lag is within clock error", _C, needs_synced_clock=True),
    signal("ctl_arrival_last_share_ratio", "gauge", "ratio", "node",
           "fraction of recent aligned steps in which the node's burst started last, by more than the "
           "clock uncertainty", _C, needs_synced_clock=True),
    signal("ctl_step_spread_seconds", "gauge", "seconds", "node",
           "median arrival spread (latest minus earliest burst start) of the node's TP group over recent "
           "aligned steps; the same value on every node of the group", _C, needs_synced_clock=True),
    signal("ctl_aligned_steps", "gauge", "steps", "node",
           "number of recent collective steps of the node's TP group in which every live peer had a burst "
           "(the sample size behind the ctl_arrival_* signals)", _C, needs_synced_clock=True),
    signal("ctl_clock_error_seconds", "gauge", "seconds", "node",
           "clock uncertainty the controller assumes for the node: its reported max error, or the "
           "configured unsynced_clock_error when it reports an unsynced clock", _C),
    # -- EW-9 early-stop skew ------------------------------------------------------------------------
    signal("ctl_step_missing_ratio", "gauge", "ratio", "node",
           "fraction of the TP group's recent steps (at least half the peers sending) in which this node "
           "sent no burst: it went quiet while its peers kept sending", _C, needs_synced_clock=True),
    # -- EW-3 cross-node load skew -------------------------------------------------------------------
    signal("ctl_collective_bytes_dev_ratio", "gauge", "ratio", "node",
           "(node's median bytes per aligned collective - TP group median) / group median; needs "
           "collective_burst_bytes in the summaries", _C, needs_synced_clock=True),
    signal("ctl_collective_bytes_ref_ratio", "gauge", "ratio", "node",
           "node's collective burst bytes per second over the median of the members of the other TP "
           "groups of the same size (1 = moves what the other replicas move); absent without such "
           "groups. Tells which member of a TP pair is off: inside the pair both deviate", _C),
    # -- EW-2 PP bubbles -----------------------------------------------------------------------------
    signal("ctl_pp_gap_seconds", "gauge", "seconds", "node",
           "median time from a pipeline stage's step start to the next stage's next step start (the "
           "hand-off gap; grows with bubbles), on the nodes of both stages (a middle stage: the longer "
           "of its two gaps) - the hand-off times do not say which side is slow", _C, needs_synced_clock=True),
    signal("ctl_pp_gap_ratio", "gauge", "ratio", "node",
           "the node's ctl_pp_gap_seconds over the median hand-off gap of all stage pairs of its "
           "pipeline group (1 = balanced)", _C, needs_synced_clock=True),
    signal("ctl_pp_stages", "gauge", "stages", "node",
           "stages of the pipeline (PP) group the node serves in, from the topology (absent for a node "
           "in no pipeline): lets a cluster-scope rule compare a stage with its own pipeline only", _C),
    # -- freshness -----------------------------------------------------------------------------------
    signal("ctl_summary_age_seconds", "gauge", "seconds", "node",
           "seconds between the controller's evaluation time and the node's latest summary", _C, needs_synced_clock=True),
]

NAMES = frozenset(s.name for s in CATALOGUE)
