"""Cluster topology: which nodes form each TP group (in rank order), how TP groups chain into
pipeline (PP) groups, and which model each serves.

Two sources: the controller config (the operator's word, always wins) and the labels agents
put in their summaries (``labels: {tp_group, tp_rank, pp_group, pp_stage, model}``) for nodes
the config does not place. A node whose summary label contradicts the config is reported once
in :attr:`Topology.conflicts` and kept where the config put it.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Mapping

from .configtypes import ControllerConfig, ModelSpec, PPGroup, TPGroup


def _label_int(v: object) -> int | None:
    """A rank or stage label as an int (None: absent or not a number)."""
    try:
        return int(str(v))
    except (TypeError, ValueError):
        return None


@dataclass
class _Learned:
    tp_group: str = ""
    tp_rank: int | None = None
    pp_group: str = ""
    pp_stage: int | None = None
    model: str = ""


@dataclass
class Topology:
    """Owns the cluster's groups (TP/PP groups and models, configured or learned from the labels
    agents send); the controller hands it each summary's labels (:meth:`observe`), gives its
    node labels to the rule engine's store, and the correlator asks it a node's group."""

    cluster: str
    configured_tp: dict[str, TPGroup] = field(default_factory=dict)  # changed through configure_tp only
    configured_pp: dict[str, PPGroup] = field(default_factory=dict)
    models: dict[str, ModelSpec] = field(default_factory=dict)
    learned: dict[str, _Learned] = field(default_factory=dict)
    conflicts: dict[str, str] = field(default_factory=dict)
    version: int = 0
    #: node → the labels its agent last sent (the rule engine's node labels, see node_labels)
    reported: dict[str, dict[str, str]] = field(default_factory=dict)
    #: tp_groups() and a node → group index, for the (version, configured groups) they came from:
    #: rebuilding them per call made every tick quadratic in the number of nodes
    _cache: tuple | None = field(default=None, repr=False, compare=False)
    #: node → (its configured group, the labels it last sent): every summary carries the same
    #: labels, and with the same configured group they change nothing
    _seen: dict = field(default_factory=dict, repr=False, compare=False)
    #: node → its configured group's name, for configured_tp as :meth:`configure_tp` last left it
    #: (None: to be made): observe() asks it per summary, and a scan of the groups was O(groups)
    _cfg_index: dict | None = field(default=None, repr=False, compare=False)

    @classmethod
    def from_config(cls, cfg: ControllerConfig) -> "Topology":
        return cls(cfg.cluster, dict(cfg.tp_groups), dict(cfg.pp_groups), dict(cfg.models))

    # -- learning from agents --------------------------------------------------------------------
    def observe(self, node: str, labels: Mapping[str, str]) -> bool:
        """Record what an agent says about itself; True when the topology changed."""
        cfg_group = self._configured_group_of(node)
        seen = self._seen.get(node)
        if seen is not None and seen[0] == cfg_group and seen[1] == labels:
            return False  # the same inputs as last time, which left learned/conflicts as they are
        self._seen[node] = (cfg_group, dict(labels))
        if self.reported.get(node) != labels:
            self.reported[node] = dict(labels)
            self.version += 1  # the rule engine's peer groups (peers_by) follow every label
        new = _Learned(str(labels.get("tp_group", "")), _label_int(labels.get("tp_rank")),
                       str(labels.get("pp_group", "")), _label_int(labels.get("pp_stage")), str(labels.get("model", "")))
        if cfg_group and new.tp_group and new.tp_group != cfg_group:
            self.conflicts[node] = (f"agent on {node} says tp_group {new.tp_group!r}, the controller config says "
                                    f"{cfg_group!r}: the config wins; fix one of them")
        if self.learned.get(node) == new:
            return False
        self.learned[node] = new
        self.version += 1
        return True

    def forget(self, node: str) -> None:
        """Drop what ``node``'s agent told us (it fell silent); its configured place stays."""
        self._seen.pop(node, None)
        self.conflicts.pop(node, None)
        had = self.learned.pop(node, None) is not None
        if self.reported.pop(node, None) is not None or had:
            self.version += 1

    def configure_tp(self, name: str, group: TPGroup | None) -> None:
        """Set (None: remove) a configured TP group: how configured_tp changes after construction."""
        if group is None:
            self.configured_tp.pop(name, None)
        else:
            self.configured_tp[name] = group
        self._cfg_index = None

    def _configured_group_of(self, node: str) -> str:
        idx = self._cfg_index
        if idx is None:
            idx = {}
            for g in self.configured_tp.values():
                for n in g.nodes:
                    idx.setdefault(n, g.name)  # the first group listing a node, as a scan finds it
            self._cfg_index = idx
        return idx.get(node, "")

    # -- queries ---------------------------------------------------------------------------------
    def tp_groups(self) -> dict[str, TPGroup]:
        """Configured groups plus groups assembled from agents' labels (rank order, then name)."""
        return dict(self._groups()[0])

    def _groups(self) -> tuple[dict[str, TPGroup], dict[str, TPGroup]]:
        key = (self.version, tuple(self.configured_tp.items()))
        c = self._cache
        if c is not None and c[0] == key:
            return c[1], c[2]
        groups = self._assemble()
        index: dict[str, TPGroup] = {}
        for g in groups.values():
            for n in g.nodes:
                index.setdefault(n, g)  # the first group listing a node, as a scan would find
        self._cache = (key, groups, index)
        return groups, index

    def _assemble(self) -> dict[str, TPGroup]:
        out = dict(self.configured_tp)
        placed = {n for g in out.values() for n in g.nodes}
        extra: dict[str, list[tuple[int, str]]] = {}
        for node, l in self.learned.items():
            if node in placed or not l.tp_group:
                continue
            if l.tp_group in out:  # a configured group's name: the config lists its members
                continue
            extra.setdefault(l.tp_group, []).append((l.tp_rank if l.tp_rank is not None else 1 << 30, node))
        for name, members in extra.items():
            model = next((self.learned[n].model for _, n in members if self.learned[n].model), "")
            out[name] = TPGroup(name, tuple(n for _, n in sorted(members)), model)
        return out

    def pp_groups(self) -> dict[str, PPGroup]:
        out = dict(self.configured_pp)
        stages: dict[str, dict[int, str]] = {}
        for node, l in self.learned.items():
            if l.pp_group and l.pp_group not in out and l.pp_stage is not None:
                stages.setdefault(l.pp_group, {})[l.pp_stage] = l.tp_group or node
        for name, st in stages.items():
            if len(st) >= 2:
                out[name] = PPGroup(name, tuple(st[k] for k in sorted(st)))
        return out

    def group_of(self, node: str) -> TPGroup | None:
        return self._groups()[1].get(node)

    def node_labels(self, node: str) -> dict[str, str]:
        """Labels for the rule engine's group scopes: the node's own, as its agent reports them
        (a rule's ``peers_by`` splits its peers by them), with ``cluster`` and ``tp_group`` as
        this topology decides (config over the agent's word)."""
        out = {k: v for k, v in self.reported.get(node, {}).items() if k not in ("cluster", "tp_group")}
        g = self.group_of(node)
        out["cluster"] = self.cluster
        if g is not None:
            out["tp_group"] = g.name
        return out

    def stage_members(self, stage: str) -> tuple[str, ...]:
        """Nodes of one PP stage: a TP group's nodes, or the stage name as a single node."""
        g = self._groups()[0].get(stage)
        return g.nodes if g is not None else (stage,)

    def pp_of(self, node: str) -> tuple[PPGroup, int] | None:
        for p in self.pp_groups().values():
            for i, st in enumerate(p.stages):
                if node in self.stage_members(st):
                    return p, i
        return None

    def model_of(self, node: str) -> ModelSpec | None:
        g = self.group_of(node)
        name = g.model if g is not None and g.model else (self.learned.get(node) or _Learned()).model
        if not name:
            return None
        return self.models.get(name) or ModelSpec(name)

    def engine_of(self, node: str) -> str:
        """The ``<node>/<engine>`` of the vLLM front end serving ``node``'s group, if known."""
        g = self.group_of(node)
        if g is not None and g.engine:
            return g.engine
        m = self.model_of(node)
        if m is not None:
            members = set(g.nodes) if g is not None else {node}
            for e in m.engines:
                if e.split("/", 1)[0] in members:
                    return e
        return ""
