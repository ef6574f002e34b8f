"""Silent nodes: a node's summaries are its heartbeat.

An agent that stops (crash, node down, partition) sends no resolved transition, so without this
its incidents would stay open for ever, as Alertmanager's would without ``resolve_timeout``. A
node not heard from for ``ingest.silent_intervals`` of its intervals has its agents' open
findings resolved (:data:`NODE_SILENT`), the incidents that held only those close, and its
per-node state is forgotten (a node that left costs nothing). After a restart, nodes whose open
findings were restored from KV are not re-announced until they are heard from again.
"""
from __future__ import annotations

import dataclasses
import logging
import math

from skewd.model import GROUP_SCOPES, Finding, State

from . import messages as M
from .roles import ROLE_LEADER

log = logging.getLogger("skewd.controller")

NODE_SILENT = "node silent"  # the resolution reason of a silent node's findings and incidents


def agent_open(f: Finding) -> bool:
    """An open (pending or firing) finding an agent raised about its own node: what a silent
    node leaves behind (the controller's own group findings follow the summaries instead)."""
    return f.scope not in GROUP_SCOPES and f.state in (State.PENDING, State.FIRING)


class SilentNodes:
    """Expiry of silent nodes (:meth:`expire_silent_nodes`, called by housekeeping and the lab)
    and the hold on incidents of nodes not heard from since a restart.

    A part of :class:`~skewd.controller.service.Controller`, which declares every field in
    its ``__init__``; this class adds behaviour only."""

    async def expire_silent_nodes(self, wall: float) -> list[str]:
        """Nodes not heard from for ``ingest.silent_intervals`` of their intervals at ``wall``:
        their agents' open findings are resolved (:data:`NODE_SILENT`, stored in KV so a
        restart does not re-open them), the incidents that held only those close as resolved
        with ``resolved_reason`` "node silent" (published), and their per-node state is
        forgotten (cardinality: a node that left costs nothing). Returns the silent nodes.

        Why: an agent that stops (crash, node down, partition) sends no resolved transition,
        so without this its incidents stay open for ever, as Alertmanager's would without
        ``resolve_timeout``; a node's summaries are its heartbeat."""
        silent = self.nodes.pop_silent(wall)
        if not silent:
            return []
        async with self._lock:
            t = self.now if self.now > -math.inf else wall
            # incidents restored from KV are rebuilt first, so their resolution is published
            await self._correlate_and_plan(t)
            for node, last in silent:
                await self._node_silent(node, wall - last, t)
            await self._correlate_and_plan(t)
        return [n for n, _ in silent]

    async def _node_silent(self, node: str, silent_for: float, t: float) -> None:
        n = 0
        for fp, f in list(self.correlator.findings.items()):
            if f.node != node or not agent_open(f):
                continue
            at = max(t, f.evaluated_at)
            r = dataclasses.replace(f, state=State.RESOLVED, evaluated_at=at, resolved_at=at,
                                    evidence=dict(f.evidence), labels=dict(f.labels), params=dict(f.params),
                                    summary=f"{f.summary} [resolved by the controller: {NODE_SILENT} "
                                            f"for {silent_for:.0f}s]")
            self.correlator.findings[fp] = r
            self._silenced[r.id] = at
            n += 1
            try:
                await self.state.put_finding(r)  # type: ignore[union-attr]
            except Exception as e:  # noqa: BLE001 - a restart would then re-check the node's silence
                self.stats.errors += 1
                log.warning("silenced finding %s not stored: %s", r.event_id, e)
        self.stats.nodes_silenced += 1
        self.stats.findings_silenced += n
        self._unconfirmed.discard(node)
        self._forget_node(node)
        (log.warning if n else log.info)("node %s silent for %.0fs (limit %.0fs): %d open findings resolved, "
                                         "its state forgotten", node, silent_for, self.nodes.silent_after(node), n)

    def _forget_node(self, node: str) -> None:
        """Drop every piece of per-node state (it comes back with the node's next summary)."""
        self.aligner.bursts.pop(node, None)
        self.aligner.clocks.pop(node, None)
        for key in [k for k in self.timelines.engines if k == node or k.startswith(node + "/")]:
            del self.timelines.engines[key]
        self.topology.forget(node)
        self.feed.forget_node(node)  # its store rows and known layouts
        self.layouts.forget_node(node)  # the binary summary layouts it kept
        self._health.pop(node, None)
        self._lanes.pop(node, None)

    def _note_silence(self, inc: M.Incident) -> None:
        """Say why an incident resolved when its findings were resolved for their node's silence."""
        if inc.state == "resolved" and not inc.resolved_reason and inc.findings \
                and all(fid in self._silenced for fid in inc.findings):
            inc.resolved_reason = NODE_SILENT
            inc.summary = f"{inc.summary} [resolved: {NODE_SILENT}]"

    def _awaits_node(self, inc: M.Incident | None) -> bool:
        """Whether ``inc`` is made only of agent findings from nodes restored from KV but not
        heard from since this process started (not re-announced until they are); for a new
        leader, group findings count too (their data comes with their partition's digests)."""
        if inc is None or not self._unconfirmed or inc.state != "open":
            return False
        nodes = set()
        for fid in inc.findings:
            f = self.correlator.findings.get(fid.split("-", 1)[0])
            if f is None or (f.scope in GROUP_SCOPES and self.role != ROLE_LEADER):
                return False
            nodes.add(f.node)
        return bool(nodes) and nodes <= self._unconfirmed
