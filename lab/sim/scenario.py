"""Scenario files: cluster shape, load and faults over time, validated strictly.

Like the rule loader: YAML is read keeping positions, every problem in a file is reported at
once as ``file:line:col: message`` (unknown keys with a did-you-mean, wrong types, values out
of range, a fault the cluster cannot host), and nothing runs until the file is clean.

A value that should vary from run to run is written as a range ``[lo, hi]``: the seed draws it
(fault onset, duration, severity, the culprit when ``node: any``). That is how a scenario
describes a pathology with its natural variability instead of one hand-picked instance.

Format::

    name: ew1-tp-straggler
    description: One node of a TP group runs late on every collective.
    shape: tp                      # dp | pergpu | tp | pp | disagg (a preset cluster + load)
    duration: 6m
    cluster: {nodes: 4}            # overrides of the shape's cluster
    load: {rate: 0.9}              # overrides of the shape's load (requests/s per replica)
    faults:
      - pathology: EW-1
        node: any                  # a node name, or any (drawn among eligible nodes)
        onset: [90s, 150s]
        duration: [2m, 3m]
        severity: [0.3, 1.0]       # 0..1, mapped by the injector to physical magnitudes
        variant: any               # a cause the injector models, or any
        params: {}                 # injector-specific overrides
"""
from __future__ import annotations

import difflib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from skewd.model import parse_duration
from skewd.rules.yamlpos import PList, PMap, Pos, YamlError, load

SCENARIO_DIR = Path(__file__).resolve().parent / "scenarios"

#: cluster presets: what each shape looks like (see docs/detection.md)
SHAPES: dict[str, dict[str, Any]] = {
    # four nodes, each a TP8 replica of a 405B FP8 model: the plain serving fleet
    # (their NICs are BlueField DPUs: DOCA Telemetry Service sees the hosts' PCIe links)
    "dp": {"cluster": {"nodes": 4, "gpus_per_node": 8, "gpu": "h100-sxm", "model": "dense-405b-fp8", "tp": 8, "pp": 1,
                       "max_num_seqs": 128, "dpu": True},
           "load": {"rate": 1.25, "prompt_tokens": {"median": 4000, "sigma": 0.8},
                    "output_tokens": {"median": 400, "sigma": 0.8}, "prefix_hit": 0.6}},
    # four PCIe servers with four L40S each, one 8B replica per GPU (no NVLink, no RDMA)
    "pergpu": {"cluster": {"nodes": 4, "gpus_per_node": 4, "gpu": "l40s", "model": "dense-8b", "tp": 1, "pp": 1,
                           "max_num_seqs": 64, "rdma_nics": 0, "front_speed": "25Gb", "cpus": 64},
               "load": {"rate": 1.6, "prompt_tokens": {"median": 1200, "sigma": 0.9},
                        "output_tokens": {"median": 220, "sigma": 0.9}, "prefix_hit": 0.4, "connections": 32}},
    # two replicas of a 405B bf16 model, TP16 across two nodes each: cross-node collectives
    "tp": {"cluster": {"nodes": 4, "gpus_per_node": 8, "gpu": "h100-sxm", "model": "dense-405b", "tp": 16, "pp": 1,
                       "max_num_seqs": 128},
           "load": {"rate": 1.5, "prompt_tokens": {"median": 4000, "sigma": 0.8},
                    "output_tokens": {"median": 400, "sigma": 0.8}, "prefix_hit": 0.6}},
    # two replicas, TP8 x PP2: stage 0 and stage 1 on different nodes. 1.3 requests/s per replica
    # keeps the KV headroom a healthy fleet runs with; at 1.5 one replica of two tips into KV
    # saturation with a growing queue within minutes (GPU-2 itself, not a healthy baseline).
    "pp": {"cluster": {"nodes": 4, "gpus_per_node": 8, "gpu": "h100-sxm", "model": "dense-405b", "tp": 8, "pp": 2,
                       "max_num_seqs": 128},
           "load": {"rate": 1.3, "prompt_tokens": {"median": 4000, "sigma": 0.8},
                    "output_tokens": {"median": 400, "sigma": 0.8}, "prefix_hit": 0.6}},
    # prefill/decode disaggregation: two prefill nodes ship KV to two decode nodes over RDMA
    "disagg": {"cluster": {"nodes": 4, "gpus_per_node": 8, "gpu": "h100-sxm", "model": "dense-70b", "tp": 8, "pp": 1,
                           "max_num_seqs": 192, "disaggregated": True},
               "load": {"rate": 3.0, "prompt_tokens": {"median": 3000, "sigma": 0.9},
                        "output_tokens": {"median": 250, "sigma": 0.9}, "prefix_hit": 0.3}},
}

CLUSTER_DEFAULTS: dict[str, Any] = {
    "nodes": 4, "gpus_per_node": 8, "gpu": "h100-sxm", "model": "dense-405b-fp8", "tp": 8, "pp": 1,
    "rdma_nics": 4, "rdma_speed": "400Gb", "front_speed": "100Gb", "cpus": 96, "kv_offload": True,
    "gpu_memory_utilization": 0.9, "max_num_seqs": 128, "disaggregated": False, "pkt_ports": "all", "dpu": False,
    "clock": "ptp", "collective_transport": "roce",
}
LOAD_DEFAULTS: dict[str, Any] = {
    "rate": 1.0, "variation": 0.12, "prompt_tokens": {"median": 2000, "sigma": 0.9, "max": 32000},
    "output_tokens": {"median": 250, "sigma": 0.9, "max": 4096}, "prefix_hit": 0.5, "connections": 64,
}
TOP_KEYS = {"name": False, "description": False, "shape": True, "duration": True, "cluster": False, "load": False,
            "faults": False, "start": False, "pathology": False}
FAULT_KEYS = {"pathology": True, "node": False, "entity": False, "onset": True, "duration": True,
              "severity": False, "variant": False, "params": False}
LENGTH_KEYS = {"median", "sigma", "max"}
DEFAULT_START = 1767225600.0  # 2026-01-01T00:00:00Z: fixed, so runs are reproducible


class ScenarioError(ValueError):
    """Every problem found in one scenario file, one ``file:line:col: message`` per line."""

    def __init__(self, errors: list[str]) -> None:
        super().__init__("\n".join(errors))
        self.errors = errors


Range = tuple[float, float]


@dataclass
class FaultSpec:
    pathology: str
    node: str  # node name or "any"
    entity: str  # entity name or "any"
    onset: Range
    duration: Range
    severity: Range
    variant: str
    params: dict[str, float]
    pos: Pos


@dataclass
class Scenario:
    name: str
    description: str
    shape: str
    duration: float
    cluster: dict[str, Any]
    load: dict[str, Any]
    faults: list[FaultSpec]
    start: float = DEFAULT_START
    pathology: str = ""  # what the scenario is about (defaults to its faults' IDs, or "healthy")
    path: str = ""

    @property
    def label(self) -> str:
        if self.pathology:
            return self.pathology
        ids = sorted({f.pathology for f in self.faults})
        return ",".join(ids) if ids else "healthy"


def _suggest(word: str, options: Any) -> str:
    m = difflib.get_close_matches(str(word), [str(o) for o in options], n=1)
    return f" (did you mean {m[0]!r}?)" if m else ""


def _speed(v: Any) -> float:
    """'400Gb' → bytes/s; plain numbers are bytes/s."""
    if isinstance(v, (int, float)) and not isinstance(v, bool):
        return float(v)
    s = str(v).strip()
    for suf, mult in (("Gb", 1e9 / 8), ("Mb", 1e6 / 8), ("GB", 1e9), ("MB", 1e6)):
        if s.endswith(suf):
            return float(s[: -len(suf)]) * mult
    raise ValueError(f"bad speed {v!r}: write e.g. 400Gb, 100Gb, 25Gb")


def _deep(base: dict[str, Any], over: dict[str, Any]) -> dict[str, Any]:
    out = dict(base)
    for k, v in over.items():
        out[k] = _deep(out[k], v) if isinstance(v, dict) and isinstance(out.get(k), dict) else v
    return out


def load_scenario(path: str | Path) -> Scenario:
    """Parse and validate one scenario file; raises :class:`ScenarioError` listing every problem."""
    from .faults import INJECTORS  # the injectors know their own parameters and requirements

    p = Path(path)
    file = str(p)
    try:
        text = p.read_text()
    except OSError as e:
        raise ScenarioError([f"{file}:1:1: cannot read: {e.strerror or e}"]) from None
    errors: list[str] = []
    try:
        doc, dupes = load(text, file)
    except YamlError as e:
        raise ScenarioError([f"{e.pos}: {e.message}"]) from None
    errors += [f"{d.pos}: {d.message}" for d in dupes]
    if not isinstance(doc, PMap):
        raise ScenarioError(errors + [f"{file}:1:1: a scenario is a mapping (name, shape, duration, faults...)"])

    def at(m: PMap, key: str, value: bool = True) -> Pos:
        return (m.val_pos if value else m.key_pos).get(key, m.pos)

    for k in doc:
        if k not in TOP_KEYS:
            errors.append(f"{at(doc, k, False)}: unknown key {k!r}{_suggest(k, TOP_KEYS)}")
    for k, req in TOP_KEYS.items():
        if req and k not in doc:
            errors.append(f"{doc.pos}: missing key {k!r}")
    shape = str(doc.get("shape", ""))
    if "shape" in doc and shape not in SHAPES:
        errors.append(f"{at(doc, 'shape')}: unknown shape {shape!r}{_suggest(shape, SHAPES)}; "
                      f"one of {', '.join(SHAPES)}")
    duration = 0.0
    if "duration" in doc:
        try:
            duration = parse_duration(doc["duration"])
            if duration < 60:
                errors.append(f"{at(doc, 'duration')}: duration must be at least 1m (rules look back minutes)")
        except ValueError as e:
            errors.append(f"{at(doc, 'duration')}: {e}")
    start = DEFAULT_START
    if "start" in doc:
        v = doc["start"]
        if isinstance(v, (int, float)) and not isinstance(v, bool) and v > 0:
            start = float(v)
        else:
            errors.append(f"{at(doc, 'start')}: start is epoch seconds (e.g. {DEFAULT_START:.0f})")
    base = SHAPES.get(shape, {"cluster": {}, "load": {}})
    cluster = _deep(CLUSTER_DEFAULTS, base["cluster"])
    load_ = _deep(LOAD_DEFAULTS, base["load"])
    cl = doc.get("cluster", PMap())
    if "cluster" in doc and not isinstance(cl, PMap):
        errors.append(f"{at(doc, 'cluster')}: cluster is a mapping")
        cl = PMap()
    for k in cl:
        if k not in CLUSTER_DEFAULTS:
            errors.append(f"{at(cl, k, False)}: unknown cluster key {k!r}{_suggest(k, CLUSTER_DEFAULTS)}")
            continue
        v = cl[k]
        pos = at(cl, k)
        try:
            cluster[k] = _cluster_value(k, v)
        except ValueError as e:
            errors.append(f"{pos}: cluster.{k}: {e}")
    ld = doc.get("load", PMap())
    if "load" in doc and not isinstance(ld, PMap):
        errors.append(f"{at(doc, 'load')}: load is a mapping")
        ld = PMap()
    for k in ld:
        if k not in LOAD_DEFAULTS:
            errors.append(f"{at(ld, k, False)}: unknown load key {k!r}{_suggest(k, LOAD_DEFAULTS)}")
            continue
        v = ld[k]
        pos = at(ld, k)
        if k in ("prompt_tokens", "output_tokens"):
            if not isinstance(v, PMap):
                errors.append(f"{pos}: load.{k} is a mapping {{median, sigma, max}}")
                continue
            for kk in v:
                if kk not in LENGTH_KEYS:
                    errors.append(f"{at(v, kk, False)}: unknown key {kk!r}{_suggest(kk, LENGTH_KEYS)}")
                elif not _num(v[kk]) or v[kk] <= 0:
                    errors.append(f"{at(v, kk)}: load.{k}.{kk} must be a positive number")
                else:
                    load_[k] = {**load_[k], kk: float(v[kk])}
        elif k == "connections":
            if not isinstance(v, int) or isinstance(v, bool) or not 1 <= v <= 4096:
                errors.append(f"{pos}: load.connections must be an integer 1..4096")
            else:
                load_[k] = v
        else:
            lo, hi = {"rate": (0.0, 1000.0), "variation": (0.0, 1.0), "prefix_hit": (0.0, 0.95)}[k]
            if not _num(v) or not lo <= float(v) <= hi:
                errors.append(f"{pos}: load.{k} must be a number in [{lo:g}, {hi:g}]")
            else:
                load_[k] = float(v)
    # the cluster must lay out
    topo = None
    if not errors:
        try:
            topo = build_from(cluster, "check")
        except ValueError as e:
            errors.append(f"{at(doc, 'cluster') if 'cluster' in doc else at(doc, 'shape')}: cluster: {e}")
    faults: list[FaultSpec] = []
    fl = doc.get("faults", PList())
    if "faults" in doc and not isinstance(fl, PList):
        errors.append(f"{at(doc, 'faults')}: faults is a list")
        fl = PList()
    for i, f in enumerate(fl):
        fpos = fl.item_pos[i] if hasattr(fl, "item_pos") else doc.pos
        if not isinstance(f, PMap):
            errors.append(f"{fpos}: a fault is a mapping (pathology, onset, duration...)")
            continue
        faults.append(_fault(f, fpos, duration, topo, INJECTORS, errors))
    name = str(doc.get("name", p.stem))
    if errors:
        raise ScenarioError(errors)
    return Scenario(name=name, description=str(doc.get("description", "")).strip(), shape=shape, duration=duration,
                    cluster=cluster, load=load_, faults=faults, start=start,
                    pathology=str(doc.get("pathology", "")), path=file)


def _num(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def _cluster_value(k: str, v: Any) -> Any:
    from .topology import GPUS, MODELS

    if k in ("nodes", "gpus_per_node", "tp", "pp", "rdma_nics", "cpus", "max_num_seqs"):
        lim = {"nodes": (1, 64), "gpus_per_node": (1, 16), "tp": (1, 64), "pp": (1, 16), "rdma_nics": (0, 8),
               "cpus": (2, 512), "max_num_seqs": (1, 4096)}[k]
        if not isinstance(v, int) or isinstance(v, bool) or not lim[0] <= v <= lim[1]:
            raise ValueError(f"must be an integer {lim[0]}..{lim[1]}")
        return v
    if k == "gpu":
        if v not in GPUS:
            raise ValueError(f"unknown GPU {v!r}{_suggest(v, GPUS)}; one of {', '.join(GPUS)}")
        return v
    if k == "model":
        if v not in MODELS:
            raise ValueError(f"unknown model {v!r}{_suggest(v, MODELS)}; one of {', '.join(MODELS)}")
        return v
    if k in ("rdma_speed", "front_speed"):
        return _speed(v)
    if k in ("kv_offload", "disaggregated", "dpu"):
        if not isinstance(v, bool):
            raise ValueError("must be true or false")
        return v
    if k == "gpu_memory_utilization":
        if not _num(v) or not 0.3 <= v <= 0.98:
            raise ValueError("must be a number in [0.3, 0.98]")
        return float(v)
    if k == "clock":
        if v not in ("ptp", "ntp", "none"):
            raise ValueError("one of ptp, ntp, none")
        return v
    if k == "collective_transport":
        if v not in ("roce", "tcp"):
            raise ValueError("one of roce, tcp")
        return v
    if k == "pkt_ports":
        if v not in ("all", "front", "rdma"):
            raise ValueError("one of all, front, rdma")
        return v
    raise ValueError("unknown")


def build_from(cluster: dict[str, Any], name: str):
    from .topology import build_cluster

    c = dict(cluster)
    for k in ("rdma_speed", "front_speed"):
        c[k] = _speed(c[k])
    return build_cluster(name=name, nodes=c["nodes"], gpus_per_node=c["gpus_per_node"], gpu=c["gpu"], model=c["model"],
                         tp=c["tp"], pp=c["pp"], rdma_nics=c["rdma_nics"], rdma_speed=c["rdma_speed"],
                         front_speed=c["front_speed"], cpus=c["cpus"], kv_offload=c["kv_offload"],
                         gpu_memory_utilization=c["gpu_memory_utilization"], max_num_seqs=c["max_num_seqs"],
                         disaggregated=c["disaggregated"], pkt_ports=c["pkt_ports"], dpu=c["dpu"], clock=c["clock"],
                         collective_transport=c["collective_transport"])


def _range(v: Any, pos: Pos, what: str, errors: list[str], dur: bool) -> Range | None:
    def one(x: Any) -> float:
        if dur:
            return parse_duration(x)
        if not _num(x):
            raise ValueError(f"{what} must be a number or [lo, hi]")
        return float(x)

    try:
        if isinstance(v, list):
            if len(v) != 2:
                raise ValueError(f"{what} range is [lo, hi]")
            lo, hi = one(v[0]), one(v[1])
            if lo > hi:
                raise ValueError(f"{what} range [lo, hi] needs lo <= hi")
            return lo, hi
        x = one(v)
        return x, x
    except ValueError as e:
        errors.append(f"{pos}: {e}")
        return None


def _fault(f: PMap, fpos: Pos, duration: float, topo: Any, injectors: dict, errors: list[str]) -> FaultSpec:
    def at(key: str, value: bool = True) -> Pos:
        return (f.val_pos if value else f.key_pos).get(key, f.pos)

    for k in f:
        if k not in FAULT_KEYS:
            errors.append(f"{at(k, False)}: unknown fault key {k!r}{_suggest(k, FAULT_KEYS)}")
    for k, req in FAULT_KEYS.items():
        if req and k not in f:
            errors.append(f"{f.pos}: fault: missing key {k!r}")
    pid = str(f.get("pathology", ""))
    inj = injectors.get(pid)
    if "pathology" in f and inj is None:
        errors.append(f"{at('pathology')}: unknown pathology {pid!r}{_suggest(pid, injectors)}")
    onset = _range(f.get("onset", 0), at("onset"), "onset", errors, True) or (0.0, 0.0)
    dur = _range(f.get("duration", 60), at("duration"), "duration", errors, True) or (60.0, 60.0)
    sev_default = inj.severity if inj is not None else (0.5, 1.0)
    sev = _range(f["severity"], at("severity"), "severity", errors, False) if "severity" in f else sev_default
    sev = sev or sev_default
    if not (0.0 <= sev[0] <= sev[1] <= 1.0):
        errors.append(f"{at('severity')}: severity is in [0, 1]")
    if duration and onset[1] + dur[1] > duration:
        errors.append(f"{at('duration')}: fault ends after the scenario (onset {onset[1]:g}s + duration {dur[1]:g}s "
                      f"> {duration:g}s)")
    if onset[0] < 60 and "onset" in f:
        errors.append(f"{at('onset')}: onset must leave at least 1m of healthy warm-up (rules need history)")
    node = str(f.get("node", "any"))
    entity = str(f.get("entity", "any"))
    variant = str(f.get("variant", "any"))
    params: dict[str, float] = {}
    pm = f.get("params", PMap())
    if "params" in f and not isinstance(pm, PMap):
        errors.append(f"{at('params')}: params is a mapping")
        pm = PMap()
    if inj is not None:
        if variant != "any" and variant not in inj.variants:
            errors.append(f"{at('variant')}: {pid} has no variant {variant!r}{_suggest(variant, inj.variants)}; "
                          f"one of {', '.join(inj.variants)} or any")
        for k in pm:
            if k not in inj.params:
                hint = _suggest(k, inj.params)
                known = f"; {pid} takes {', '.join(sorted(inj.params))}" if inj.params else f"; {pid} takes no params"
                errors.append(f"{pm.key_pos[k]}: unknown param {k!r}{hint}{known}")
            elif not _num(pm[k]):
                errors.append(f"{pm.val_pos[k]}: param {k!r} must be a number")
            else:
                params[k] = float(pm[k])
        if topo is not None:
            why = inj.unsupported(topo)
            if why:
                errors.append(f"{at('pathology')}: {pid} cannot happen on this cluster: {why}")
            elif node != "any":
                if node not in topo.node_names:
                    errors.append(f"{at('node')}: unknown node {node!r}{_suggest(node, topo.node_names)}")
                elif node not in inj.eligible_nodes(topo):
                    errors.append(f"{at('node')}: {pid} cannot be placed on {node} "
                                  f"(eligible: {', '.join(inj.eligible_nodes(topo))})")
            if entity != "any" and node != "any" and node in topo.node_names:
                ents = inj.eligible_entities(topo, topo.node(node))
                if entity not in ents:
                    errors.append(f"{at('entity')}: {pid} on {node} targets one of {', '.join(ents) or 'no entity'}; "
                                  f"got {entity!r}{_suggest(entity, ents)}")
    return FaultSpec(pid, node, entity, onset, dur, sev, variant, params, fpos)


def list_scenarios(directory: str | Path | None = None) -> list[Path]:
    """The shipped scenario files (or those of ``directory``), sorted by name."""
    d = Path(directory) if directory is not None else SCENARIO_DIR
    return sorted(d.glob("*.yaml"))
