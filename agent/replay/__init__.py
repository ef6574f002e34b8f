"""``skewd replay``: capture bundles back through the agents and the controller, on the
recorded time, deterministically.

One idea per module:

- :mod:`.core` - the nodes: :class:`Replayer` drives one agent pipeline per recorded node from
  the bundle's batches at the recorded ticks (range evaluation included);
- :mod:`.feed` - a segment's stored chunks cut per collector layout with numpy;
- :mod:`.ahead` - a node's collections held back and written per layout while its ticks wait;
- :mod:`.slices` - ``--jobs``: time slices replayed in parallel processes, handed over only on
  an equal state;
- :mod:`.cluster` - cluster replay: :class:`ClusterReplay` adds the controller service
  (:mod:`skewd.controller.offline`, shared with the fault lab) fed with what the agents sent;
- :mod:`.diff` - ``--diff``: incident-level and finding-level differences between two rule sets;
- :mod:`.output` - the table and JSON lines printed on stdout;
- :mod:`.progress` - the progress line on a terminal;
- :mod:`.cli` - the command line; :mod:`skewd.agent.report` writes the HTML report.
"""
from __future__ import annotations

from .cli import EXIT_DAMAGED, EXIT_DIFF, EXIT_OK, EXIT_USAGE, build_parser, drive, explain, main, parse_speed, parse_time
from .cluster import ClusterReplay, replay_cluster
from .core import Event, ReplayError, Replayer, ReplayResult, RuleLoadFailed, open_segments, replay_catalogue
from .diff import (DiffEntry, IncidentChange, IncidentStory, Occurrence, diff_findings, diff_incidents,
                   incident_stories, occurrences)
from .output import (TABLE_HEADER, finding_json, finding_row, fmt_t, incident_json, incident_row, suggestion_json,
                     suggestion_row)

__all__ = ["EXIT_DAMAGED", "EXIT_DIFF", "EXIT_OK", "EXIT_USAGE", "TABLE_HEADER", "ClusterReplay", "DiffEntry", "Event",
           "IncidentChange", "IncidentStory", "Occurrence", "ReplayError", "ReplayResult", "Replayer",
           "RuleLoadFailed", "build_parser", "diff_findings", "diff_incidents", "drive", "explain", "finding_json",
           "finding_row", "fmt_t", "incident_json", "incident_row", "incident_stories", "main", "occurrences",
           "open_segments", "parse_speed", "parse_time", "replay_catalogue", "replay_cluster", "suggestion_json",
           "suggestion_row"]
