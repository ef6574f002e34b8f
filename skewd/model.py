"""The shared data model: signal catalogue, columnar sample batches and findings.

This module is the contract between collectors (which emit samples), the rule engine (which
reads windows of them) and the agent/controller (which ship findings). It depends on nothing
else in skewd, so every layer can import it without importing another layer's internals.

Wire objects carry ``schema`` (an int) so consumers can refuse data they do not understand.
"""
from __future__ import annotations

import dataclasses
import hashlib
import json
import math
import re
from dataclasses import dataclass, field
from enum import Enum
from typing import Any, Iterable, Iterator, Mapping, Sequence

import numpy as np

SCHEMA_VERSION = 1


class Kind(str, Enum):
    """How a signal behaves over time (Prometheus semantics)."""

    COUNTER = "counter"  # monotonically increasing, may reset or wrap; use rate()/increase()
    GAUGE = "gauge"  # a level; use avg()/max()/delta()


class Scope(str, Enum):
    """What an entity is. Signals are emitted per entity of one scope; rules evaluate per scope."""

    NODE = "node"
    GPU = "gpu"
    NIC_PORT = "nic_port"
    RDMA_PORT = "rdma_port"
    FLOW = "flow"
    PCI_DEVICE = "pci_device"
    ENGINE = "engine"
    CPU = "cpu"
    #: a rank of an NCCL communicator, ``<comm_id>/r<rank>``; peers: the same communicator's
    #: ranks on the same node
    RANK = "rank"
    TP_GROUP = "tp_group"
    CLUSTER = "cluster"


#: Scopes whose entities are nodes, grouped for peer comparison by a node label.
GROUP_SCOPES = {Scope.TP_GROUP: "tp_group", Scope.CLUSTER: "cluster"}
#: Scopes an agent evaluates on its own node; the controller evaluates GROUP_SCOPES.
NODE_SCOPES = frozenset(s for s in Scope if s not in GROUP_SCOPES)


class Layer(str, Enum):
    NETWORK = "network"
    PCIE = "pcie"
    GPU = "gpu"
    ENGINE = "engine"
    HOST = "host"


class Severity(str, Enum):
    INFO = "info"
    WARNING = "warning"
    CRITICAL = "critical"


class State(str, Enum):
    INACTIVE = "inactive"
    PENDING = "pending"
    FIRING = "firing"
    RESOLVED = "resolved"


_SIGNAL_NAME = re.compile(r"^[a-z][a-z0-9_]*$")


@dataclass(frozen=True)
class SignalSpec:
    """One catalogued signal: the only names rules may reference."""

    name: str
    kind: Kind
    unit: str
    scope: Scope
    desc: str
    collector: str
    #: counters that wrap at 2**bits (e.g. 32-bit hardware counters); None = treat a decrease as a reset
    wrap_bits: int | None = None
    #: computed by comparing timestamps taken on different nodes: only as good as their clocks'
    #: sync (an unsynced node weakens every rule reading it; the agent's --check and health say so)
    needs_synced_clock: bool = False

    def __post_init__(self) -> None:
        if not _SIGNAL_NAME.match(self.name):
            raise ValueError(f"signal name {self.name!r} must match {_SIGNAL_NAME.pattern}")
        object.__setattr__(self, "kind", Kind(self.kind))
        object.__setattr__(self, "scope", Scope(self.scope))


def signal(name: str, kind: str, unit: str, scope: str, desc: str, collector: str,
           wrap_bits: int | None = None, needs_synced_clock: bool = False) -> SignalSpec:
    """Terse constructor used by the collectors' catalogue modules."""
    return SignalSpec(name, Kind(kind), unit, Scope(scope), desc, collector, wrap_bits, needs_synced_clock)


class Catalogue(Mapping[str, SignalSpec]):
    """Name → SignalSpec. Adding a conflicting definition of an existing name is an error."""

    def __init__(self, specs: Iterable[SignalSpec] = ()) -> None:
        self._specs: dict[str, SignalSpec] = {}
        for s in specs:
            self.add(s)

    def add(self, spec: SignalSpec) -> None:
        old = self._specs.get(spec.name)
        if old is not None and old != spec:
            raise ValueError(f"signal {spec.name!r} catalogued twice with different definitions "
                             f"({old.collector} vs {spec.collector})")
        self._specs[spec.name] = spec

    def merge(self, other: Iterable[SignalSpec]) -> "Catalogue":
        out = Catalogue(self._specs.values())
        for s in other:
            out.add(s)
        return out

    def by_collector(self, collector: str) -> list[SignalSpec]:
        return [s for s in self._specs.values() if s.collector == collector]

    def __getitem__(self, name: str) -> SignalSpec:
        return self._specs[name]

    def __iter__(self) -> Iterator[str]:
        return iter(self._specs)

    def __len__(self) -> int:
        return len(self._specs)


class SampleBatch:
    """Columnar samples: parallel arrays ``t`` (float64 seconds), ``node``, ``entity``,
    ``signal`` (object arrays of str) and ``value`` (float64).

    Collectors build one per tick with :class:`BatchBuilder`; the window store ingests it
    grouped by signal, so a batch never needs to be sorted.
    """

    __slots__ = ("t", "node", "entity", "signal", "value")

    def __init__(self, t: np.ndarray, node: np.ndarray, entity: np.ndarray, signal: np.ndarray,
                 value: np.ndarray) -> None:
        n = len(t)
        if not (len(node) == len(entity) == len(signal) == len(value) == n):
            raise ValueError("SampleBatch columns must have equal length")
        self.t = np.asarray(t, dtype=np.float64)
        self.node = np.asarray(node, dtype=object)
        self.entity = np.asarray(entity, dtype=object)
        self.signal = np.asarray(signal, dtype=object)
        self.value = np.asarray(value, dtype=np.float64)

    @classmethod
    def empty(cls) -> "SampleBatch":
        e = np.empty(0, dtype=object)
        return cls(np.empty(0), e, e, e, np.empty(0))

    @classmethod
    def from_rows(cls, rows: Iterable[tuple[float, str, str, str, float]]) -> "SampleBatch":
        rows = list(rows)
        if not rows:
            return cls.empty()
        t, node, entity, sig, value = zip(*rows)
        return cls(np.array(t, dtype=np.float64), np.array(node, dtype=object),
                   np.array(entity, dtype=object), np.array(sig, dtype=object),
                   np.array(value, dtype=np.float64))

    @classmethod
    def concat(cls, batches: Sequence["SampleBatch"]) -> "SampleBatch":
        batches = [b for b in batches if len(b)]
        if not batches:
            return cls.empty()
        if len(batches) == 1:
            return batches[0]
        return cls(*(np.concatenate([getattr(b, c) for b in batches]) for c in cls.__slots__))

    def __len__(self) -> int:
        return len(self.t)

    def rows(self) -> Iterator[tuple[float, str, str, str, float]]:
        for i in range(len(self)):
            yield (float(self.t[i]), self.node[i], self.entity[i], self.signal[i], float(self.value[i]))

    def signals(self) -> set[str]:
        return set(self.signal.tolist())

    def select(self, mask: np.ndarray) -> "SampleBatch":
        return SampleBatch(*(getattr(self, c)[mask] for c in self.__slots__))

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, SampleBatch):
            return NotImplemented
        return (len(self) == len(other)
                and np.array_equal(self.t, other.t)
                and np.array_equal(self.value, other.value, equal_nan=True)
                and all(np.array_equal(getattr(self, c), getattr(other, c))
                        for c in ("node", "entity", "signal")))

    def __repr__(self) -> str:
        return f"SampleBatch({len(self)} samples, signals={sorted(self.signals())})"


class BatchBuilder:
    """Append-only helper for collectors: ``b.add(t, entity, signal, value)`` then ``b.build()``."""

    def __init__(self, node: str) -> None:
        self.node = node
        self._t: list[float] = []
        self._entity: list[str] = []
        self._signal: list[str] = []
        self._value: list[float] = []

    def add(self, t: float, entity: str, signal_name: str, value: float) -> None:
        self._t.append(t)
        self._entity.append(entity)
        self._signal.append(signal_name)
        self._value.append(value)

    def __len__(self) -> int:
        return len(self._t)

    def build(self) -> SampleBatch:
        n = len(self._t)
        node = np.empty(n, dtype=object)
        node[:] = self.node
        ent = np.empty(n, dtype=object)
        ent[:] = self._entity
        sig = np.empty(n, dtype=object)
        sig[:] = self._signal
        return SampleBatch(np.array(self._t, dtype=np.float64), node, ent, sig,
                           np.array(self._value, dtype=np.float64))


def fingerprint(rule_id: str, node: str, entity: str, labels: Mapping[str, str] | None = None,
                cluster: str = "") -> str:
    """Stable identity of one alert instance: rule + entity labels (Prometheus-style). The
    cluster is part of it so clusters sharing one NATS account never de-duplicate each other."""
    items = [("rule", rule_id), ("node", node), ("entity", entity)]
    if cluster:
        items.append(("cluster", cluster))
    items += sorted((labels or {}).items())
    h = hashlib.sha256(json.dumps(items, separators=(",", ":")).encode()).hexdigest()
    return h[:16]


@dataclass
class Finding:
    """A rule's state transition for one entity: what fired, where, why, and what to do.

    ``id`` is stable across the pending → firing → resolved life of one occurrence
    (fingerprint + activation time); ``event_id`` is unique per transition and is what
    publishers use for de-duplication.
    """

    rule_id: str
    pathology: str
    severity: Severity
    layer: Layer
    scope: Scope
    node: str
    entity: str
    state: State
    active_at: float  # when the expression first became true (pending start)
    evaluated_at: float  # the evaluation time that produced this transition
    fired_at: float | None = None
    resolved_at: float | None = None
    labels: dict[str, str] = field(default_factory=dict)
    evidence: dict[str, float | None] = field(default_factory=dict)
    params: dict[str, Any] = field(default_factory=dict)
    mitigation: str = ""
    summary: str = ""
    cluster: str = ""
    #: the rule's maturity tag (stable, incubating, sandbox): what the controller may do with the
    #: finding (docs/rules.md, "Maturity"); "" from an agent older than the field
    maturity: str = ""
    schema: int = SCHEMA_VERSION

    @property
    def fingerprint(self) -> str:
        return fingerprint(self.rule_id, self.node, self.entity, self.labels, self.cluster)

    @property
    def id(self) -> str:
        return f"{self.fingerprint}-{int(round(self.active_at * 1000))}"

    @property
    def event_id(self) -> str:
        return f"{self.id}-{self.state.value}"

    def to_dict(self) -> dict[str, Any]:
        d = dataclasses.asdict(self)
        for k in ("severity", "layer", "scope", "state"):
            d[k] = getattr(self, k).value
        d["id"] = self.id
        d["fingerprint"] = self.fingerprint
        # NaN and +-inf have no JSON number: null, "no finite value"
        d["evidence"] = {k: (None if isinstance(v, float) and not math.isfinite(v) else v)
                         for k, v in self.evidence.items()}
        return d

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), sort_keys=True, separators=(",", ":"))

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> "Finding":
        schema = d.get("schema")
        if schema != SCHEMA_VERSION:
            raise ValueError(f"finding schema {schema!r} not supported (this skewd reads {SCHEMA_VERSION})")
        names = {f.name for f in dataclasses.fields(cls)}
        kw = {k: v for k, v in d.items() if k in names}
        kw["severity"] = Severity(kw["severity"])
        kw["layer"] = Layer(kw["layer"])
        kw["scope"] = Scope(kw["scope"])
        kw["state"] = State(kw["state"])
        return cls(**kw)


def format_duration(seconds: float) -> str:
    """Render seconds the way rule files write them (``90s`` → ``1m30s``)."""
    if seconds == 0:
        return "0s"
    out = []
    rest = float(seconds)
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if rest >= size:
            n = int(rest // size)
            out.append(f"{n}{unit}")
            rest -= n * size
    if rest >= 1:
        out.append(f"{rest:g}s")
    elif rest > 0:
        out.append(f"{rest * 1000:g}ms")
    return "".join(out)


_DURATION_PART = re.compile(r"(\d+(?:\.\d+)?)(ms|s|m|h|d)")
_UNIT = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0}
_SECONDS = re.compile(r"\d+(?:\.\d+)?")


def parse_duration(text: str | int | float) -> float:
    """The one duration syntax of config files, rule files and command lines: ``'1m30s'`` → 90.0,
    ``'250ms'`` → 0.25, and a bare number is seconds (``5``, ``'5'``, ``'1.5'``), as YAML's
    ``interval: 5`` always was. Raises ValueError with a hint on anything else."""
    hint = "write e.g. '30s', '5m', '1h30m', '250ms' or seconds ('5')"
    if isinstance(text, bool):
        raise ValueError(f"bad duration {text!r}: {hint}")
    if isinstance(text, (int, float)):
        if not text >= 0 or text == float("inf") or (isinstance(text, int) and text > 1e300):
            raise ValueError(f"bad duration {str(text)[:40]!r}: must be a finite number of seconds, not negative")
        return float(text)
    s = str(text).strip()
    if _SECONDS.fullmatch(s):
        if float(s) == float("inf"):  # 400 digits: a float of them is inf, not a number of seconds
            raise ValueError(f"bad duration {s[:40]!r}: must be a finite number of seconds")
        return float(s)
    pos = 0
    total = 0.0
    for m in _DURATION_PART.finditer(s):
        if m.start() != pos:
            break
        total += float(m.group(1)) * _UNIT[m.group(2)]
        pos = m.end()
    if pos != len(s) or not s:
        raise ValueError(f"bad duration {text!r}: {hint}")
    return total


def parse_speed(text: str | int | float, allow_max: bool = True) -> float | None:
    """The speed syntax of ``skewd replay --speed`` and ``skewd demo --speed``: a factor of real
    time written ``1x``, ``4x``, ``0.5x`` (the ``x`` may be left out: ``4`` is ``4x``), and, where
    the command can run unpaced, ``max`` → None. A speed is not a duration, so it has its own
    syntax rather than a unit of parse_duration."""
    s = str(text).strip().lower()
    forms = "max, 1x, 4x, 0.5x" if allow_max else "1x, 4x, 0.5x"
    if s == "max" and allow_max:
        return None
    if s.endswith("x"):
        s = s[:-1]
    try:
        v = float(s)
    except ValueError:
        raise ValueError(f"bad speed {text!r}: write {forms}") from None
    if not 0 < v < float("inf"):
        raise ValueError(f"bad speed {text!r}: must be a positive factor ({forms})")
    return v
