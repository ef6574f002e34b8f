"""What the controller accepts from agents, and from how many: the checks every message passes
after its (total) decoder and before it touches any state.

The controller trusts an agent for what that agent says *about its own node*, and for nothing
else. NATS permissions let an agent publish only on its own node's subjects (issue 20), so the
subject's node token is what the server vouches for; the body's ``node`` is what the agent
claims. A body naming another node than its subject is rejected (``subject_mismatch``): an
agent on gpu-node-17 cannot make the controller reroute or drain gpu-node-99. Times are the
agent's clock: a summary whose ``t`` lies further than ``ingest.max_clock_skew`` from the
controller's clock (in either direction), or a finding whose times lie that far ahead of it, is
rejected (``clock_skew``) - evaluation follows the summaries' clock, and one node a year ahead
would otherwise stop it. How many nodes the controller keeps state for is bounded
(``ingest.max_nodes``, reason ``too_many_nodes``), and a node heard from neither by summary,
health report nor finding for ``ingest.silent_intervals`` of its intervals is *silent*
(:class:`NodeBook`): the service resolves its open findings and forgets its state.

Every rejection is counted by message kind and reason (:class:`Rejections`, in
``Controller.status()``) and logged with the subject and the reason, at most a few lines per
kind and reason a minute so a flood cannot flood the log too.
"""
from __future__ import annotations

import functools
import logging
import math
import time
from collections import OrderedDict
from typing import Callable

from skewd import wire
from skewd.model import Finding

#: rejection reasons (status keys), in the order the checks run
MALFORMED = "malformed"  # the decoder refused it (shape, types, numbers, size, depth)
SCHEMA = "schema"  # a schema version this controller does not read (upgrade one side)
SUBJECT_MISMATCH = "subject_mismatch"  # the body names another node/cluster/rule than its subject
CLOCK_SKEW = "clock_skew"  # its time is implausibly far from the controller's clock
TOO_MANY_NODES = "too_many_nodes"  # a new node while ingest.max_nodes nodes are live
#: a summary dropped unread: ingest.summary_backlog_bytes of summaries were waiting to be taken in
BACKLOG_FULL = "backlog_full"
#: a binary summary whose layout the controller has not learned yet (after its restart, until the
#: node's next summary carrying the layout): expected, so logged at info level, not as a warning
LAYOUT_UNKNOWN = "layout_unknown"
REASONS = (MALFORMED, SCHEMA, SUBJECT_MISMATCH, CLOCK_SKEW, LAYOUT_UNKNOWN, TOO_MANY_NODES, BACKLOG_FULL)
#: reasons that say nothing is wrong: their log lines are info, not warnings
EXPECTED_REASONS = frozenset({LAYOUT_UNKNOWN})

LOG_LINES_PER_MINUTE = 5  # per (kind, reason): the first few show what is wrong, the count the rest


class Rejections:
    """Counts of rejected messages by kind and reason, and their rate-limited log lines.

    Owned by the controller service; :meth:`reject` is called from its input handlers."""

    def __init__(self, logger: logging.Logger, clock: Callable[[], float] = time.monotonic,
                 per_minute: int = LOG_LINES_PER_MINUTE) -> None:
        self.counts: dict[str, dict[str, int]] = {}
        self.log = logger
        self.clock = clock
        self.per_minute = per_minute
        self._window: dict[tuple[str, str], list[float]] = {}  # (kind, reason) → [window start, logged, held back]

    def reject(self, kind: str, reason: str, subject: str, detail: str, n: int = 1) -> None:
        """Count ``n`` messages rejected for one reason (the first on ``subject``), and log a
        line for them unless this minute's lines for the reason are used up."""
        per = self.counts.setdefault(kind, {})
        per[reason] = per.get(reason, 0) + n
        now = self.clock()
        w = self._window.setdefault((kind, reason), [now, 0, 0])
        level = logging.INFO if reason in EXPECTED_REASONS else logging.WARNING
        if now - w[0] >= 60.0:
            if w[2]:
                self.log.log(level, "%d more %s messages rejected (%s) in the last minute, not logged one by one",
                             int(w[2]), kind, reason)
            w[:] = [now, 0, 0]
        if w[1] < self.per_minute:
            w[1] += 1
            if n == 1:
                self.log.log(level, "%s rejected (%s) on %s: %s", kind, reason, subject, detail[:300])
            else:
                self.log.log(level, "%d %s messages rejected (%s), the first on %s: %s", n, kind, reason, subject,
                             detail[:300])
            w[2] += n - 1  # (counted in the minute's "more ... rejected" line)
        else:
            w[2] += n

    def total(self, kind: str | None = None) -> int:
        kinds = [kind] if kind is not None else list(self.counts)
        return sum(sum(self.counts.get(k, {}).values()) for k in kinds)


def reason_of(e: wire.WireError) -> str:
    return SCHEMA if isinstance(e, wire.SchemaVersionError) else MALFORMED


def subject_mismatch(subject: str, kind: wire.MessageKind, cluster: str, node: str, rule: str | None = None,
                     engine: str | None = None) -> str | None:
    """Why the body does not belong on ``subject`` (None when it does): its node (and rule,
    engine) must be the subject's tokens, its cluster the subject's or empty (a finding
    published by :func:`skewd.wire.subject_for` with the publisher's cluster)."""
    parsed = _parsed(subject)
    if isinstance(parsed, str):
        return parsed
    if parsed.kind is not kind:
        return f"a {kind.value} message on a {parsed.kind.value} subject"
    if parsed["node"] != node:
        return f"body names node {node!r} but was published on node {parsed['node']!r}'s subject"
    if cluster and parsed["cluster"] != cluster:
        return f"body names cluster {cluster!r} but was published on cluster {parsed['cluster']!r}'s subject"
    if rule is not None and parsed["rule"] != rule:
        return f"body names rule {rule!r} but was published on rule {parsed['rule']!r}'s subject"
    if engine is not None and parsed["engine"] != engine:
        return f"body names engine {engine!r} but was published on engine {parsed['engine']!r}'s subject"
    return None


def parsed_subject(subject: str) -> wire.ParsedSubject | str:
    """:func:`skewd.wire.parse_subject` of ``subject`` (or its error text), remembered."""
    return _parsed(subject)


@functools.lru_cache(maxsize=1 << 16)
def _parsed(subject: str) -> wire.ParsedSubject | str:
    """``wire.parse_subject`` (or its error), remembered: every node sends on the same few
    subjects every interval, and the parse was a tenth of a summary's ingest time."""
    try:
        return wire.parse_subject(subject)
    except wire.WireError as e:
        return str(e)


def summary_clock_problem(t: float, wall: float, max_skew: float) -> str | None:
    """A summary's ``t`` further than ``max_skew`` from ``wall`` (either way); 0 = no check."""
    if max_skew <= 0:
        return None
    if not math.isfinite(t) or abs(t - wall) > max_skew:
        return (f"t={t!r} is {t - wall:+.3g} s from the controller's clock (limit ingest.max_clock_skew "
                f"{max_skew:g} s): fix the node's time sync")
    return None


def finding_clock_problem(f: Finding, wall: float, max_skew: float, max_age: float) -> str | None:
    """A finding's times ahead of ``wall`` by more than ``max_skew``, or its evaluation older
    than ``max_age`` (what the findings stream keeps) plus the skew; 0 = no check. A finding may
    be late (spooled through an outage, caught up from the durable consumer), never early."""
    if max_skew <= 0:
        return None
    times = [("active_at", f.active_at), ("evaluated_at", f.evaluated_at), ("fired_at", f.fired_at),
             ("resolved_at", f.resolved_at)]
    for name, v in times:
        if v is not None and v > wall + max_skew:
            return (f"{name}={v!r} is {v - wall:+.3g} s ahead of the controller's clock (limit "
                    f"ingest.max_clock_skew {max_skew:g} s): fix the node's time sync")
    if f.evaluated_at < wall - max_age - max_skew:
        return f"evaluated_at={f.evaluated_at!r} is older than the findings stream keeps ({max_age:g} s)"
    return None


class NodeBook:
    """The nodes the controller hears from: when each was last heard (the controller's wall
    clock) and its summary interval, in order of last hearing, at most ``max_nodes`` of them.

    Owned by the controller service: :meth:`admit` on every summary, health report and node
    finding; :meth:`pop_silent` from housekeeping."""

    def __init__(self, max_nodes: int, silent_intervals: float, min_interval: float) -> None:
        self.max_nodes = max_nodes
        self.silent_intervals = silent_intervals
        self.min_interval = min_interval
        self.heard: OrderedDict[str, float] = OrderedDict()  # oldest first
        self.interval: dict[str, float] = {}

    def __len__(self) -> int:
        return len(self.heard)

    def __contains__(self, node: str) -> bool:
        return node in self.heard

    def admit(self, node: str, wall: float, interval: float | None = None) -> bool:
        """Note that ``node`` was heard at ``wall``; False (nothing noted) for a new node while
        ``max_nodes`` are live."""
        heard = self.heard
        if node in heard:
            heard.move_to_end(node)
        elif len(heard) >= self.max_nodes:
            return False
        heard[node] = wall
        if interval is not None and interval > 0 and self.interval.get(node) != interval:
            self.interval[node] = interval
        return True

    def silent_after(self, node: str) -> float:
        """Seconds without a word after which ``node`` is silent."""
        return self.silent_intervals * max(self.interval.get(node, 0.0), self.min_interval)

    def pop_silent(self, wall: float) -> list[tuple[str, float]]:
        """Remove and return the nodes silent at ``wall``, with when each was last heard.
        Walks from the longest-silent node and stops at the first one heard within the shortest
        possible silence, so a tick costs the silent nodes, not all of them."""
        out = []
        floor = self.silent_intervals * self.min_interval
        for node, last in list(self.heard.items()):
            if wall - last <= floor:
                break
            if wall - last > self.silent_after(node):
                out.append((node, last))
        for node, _ in out:
            del self.heard[node]
            self.interval.pop(node, None)
        return out
