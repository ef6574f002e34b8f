"""The controller's configuration as the code reads it: typed, validated, immutable where shared.

:func:`skewd.controller.config.load_config` builds a :class:`ControllerConfig` from the YAML file,
the environment and overrides; every other part of the controller (topology, correlator,
planner, Alertmanager sink, service) takes these types and never sees the raw mapping. Kept apart
from the loader so a module that only reads settings does not import YAML handling, and from
the defaults so the schema of a setting and its default value each have one home.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from skewd.natsutil import NatsConfig

from .culprit import CulpritEvidence


class ConfigError(Exception):
    """Every problem of a controller config at once, each ``file:line:col: what to do``."""

    def __init__(self, problems: list[str]) -> None:
        super().__init__("\n".join(problems))
        self.problems = problems


@dataclass(frozen=True)
class LossPaths:
    """``correlation.loss_paths`` (controller/losspath.py): the pathologies of a flow's loss seen
    from its receiver (``ingress``) and its sender (``egress``), and node-level loss storms
    (``node``); empty lists turn the attribution off."""
    ingress: tuple[str, ...] = ("NS-4",)
    egress: tuple[str, ...] = ("NS-7",)
    node: tuple[str, ...] = ("EW-6",)


@dataclass(frozen=True)
class TPGroup:
    name: str
    nodes: tuple[str, ...]  # in TP-rank order
    model: str = ""
    engine: str = ""  # "<node>/<engine>" of the vLLM front end serving this group, if known


@dataclass(frozen=True)
class PPGroup:
    name: str
    stages: tuple[str, ...]  # TP group names (or single nodes), stage 0 first
    model: str = ""


@dataclass(frozen=True)
class ModelSpec:
    name: str
    max_num_seqs: int | None = None
    max_model_len: int | None = None
    router: str = ""  # the name a router knows this model's pool by (reroute target)
    engines: tuple[str, ...] = ()


@dataclass
class ControllerConfig:
    cluster: str
    controller_id: str
    nats: NatsConfig
    rules: list[str]
    evaluation_interval: float
    lookback: float
    horizon: float
    warmup: float
    stale_after: float
    align_window: float
    max_skew: float
    unsynced_clock_error: float
    min_group_fraction: float
    group_wait: float
    culprit_pathologies: tuple[str, ...]
    never_inhibit: tuple[str, ...]
    inhibit_rules: tuple["InhibitRule", ...]
    effect_window: float
    remap_ttl: float
    min_confidence: float
    concurrency_factor: float
    reroute_weight: float
    durable: str
    queue: str
    ack_wait: float
    batch: int
    bucket: str
    state_max_age: float
    #: ingest.max_clock_skew in seconds; 0 = no clock check
    max_clock_skew: float = 300.0
    silent_intervals: float = 30.0
    max_nodes: int = 10000
    #: correlation.loss_paths
    loss_paths: LossPaths = field(default_factory=LossPaths)
    #: ingest.summary_backlog_bytes: summaries waiting to be taken in, at most (service.py sheds the oldest)
    summary_backlog_bytes: int = 32 << 20
    tp_groups: dict[str, TPGroup] = field(default_factory=dict)
    pp_groups: dict[str, PPGroup] = field(default_factory=dict)
    models: dict[str, ModelSpec] = field(default_factory=dict)
    #: correlation.direct_evidence / culprit_evidence (see DEFAULTS and controller/culprit.py)
    direct_evidence: tuple[str, ...] = ()
    culprit_evidence: dict[str, CulpritEvidence] = field(default_factory=dict)
    log_level: str = "info"
    source: str = "<defaults>"
    metrics_listen: str = "127.0.0.1:9466"
    alertmanager: "AlertmanagerConfig | None" = None
    #: scale-out: summary partitions (the server mapping's N), lease seconds, partitions per worker (0 = fair share)
    partitions: int = 1
    lease: float = 6.0
    max_partitions: int = 0


@dataclass(frozen=True)
class AlertmanagerConfig:
    """Where and how incidents are sent to Alertmanager (controller/alertmanager.py)."""

    urls: tuple[str, ...]
    resend_interval: float = 60.0
    timeout: float = 10.0
    generator_url: str = ""
    labels: tuple[tuple[str, str], ...] = ()


@dataclass(frozen=True)
class InhibitRule:
    """While a firing finding of a ``source`` pathology exists, firing findings of a ``target``
    pathology whose ``equal`` labels match it are inhibited (Alertmanager's inhibit_rules)."""
    source: tuple[str, ...]
    target: tuple[str, ...]
    equal: tuple[str, ...]
