"""Validation of the controller config's structured sections, each into its typed value.

The flat keys (durations, numbers, strings) are checked where :func:`skewd.controller.config.load_config`
reads them; the sections with a structure of their own are checked here, one function each:
the topology (TP groups, PP groups, models), the correlation lists (inhibit rules with their
cycle check, pathology ID lists, culprit evidence), the Alertmanager sink and the metrics
listen address. Each function appends every problem it finds to ``problems`` as
``file:line:col: ...`` (``pos`` gives the position of a key path), with a did-you-mean for an
unknown key, and returns what is usable, so one run reports all of a file's mistakes.
"""
from __future__ import annotations

import difflib
from typing import Any, Callable, Mapping

from .configtypes import AlertmanagerConfig, InhibitRule, LossPaths, ModelSpec, PPGroup, TPGroup
from .culprit import CulpritEvidence

#: the keys of one ``topology.tp_groups.<name>``, ``topology.pp_groups.<name>``, ``topology.models.<name>``
TP_KEYS = {"nodes", "model", "engine"}
PP_KEYS = {"stages", "model"}
MODEL_KEYS = {"max_num_seqs", "max_model_len", "router", "engines"}
#: the keys of one ``correlation.inhibit_rules`` entry, and the labels its ``equal`` may name
INHIBIT_KEYS = ("source", "target", "equal")
INHIBIT_EQUAL = ("node", "entity", "tp_group", "model")
#: the keys of ``correlation.loss_paths``
LOSS_PATH_KEYS = ("ingress", "egress", "node")
#: the keys of one ``correlation.culprit_evidence.<rule id>`` entry
CULPRIT_EVIDENCE_KEYS = ("measure", "above", "steps", "min_steps", "abs", "negate", "minus", "per")


def hint(word: str, options: Any) -> str:
    """``; did you mean X?`` for the closest of ``options``, or nothing."""
    m = difflib.get_close_matches(str(word), list(options), n=1)
    return f"; did you mean {m[0]}?" if m else ""


def parse_inhibit_rules(value: Any, pos: Callable[..., str], problems: list[str]) -> tuple[InhibitRule, ...]:
    """``correlation.inhibit_rules``: known pathology IDs and labels, no rule inhibiting its own
    kind, and no cycle (which would hide every finding in it)."""
    from skewd.rules.pathologies import PATHOLOGIES

    name = "correlation.inhibit_rules"
    if value is None:
        return ()
    if not isinstance(value, list):
        problems.append(f"{pos('correlation', 'inhibit_rules')}: {name} must be a list of "
                        "{source: [IDs], target: [IDs], equal: [labels]} mappings")
        return ()
    out: list[InhibitRule] = []
    for i, r in enumerate(value):
        where = pos("correlation", "inhibit_rules", i)
        if not isinstance(r, dict):
            problems.append(f"{where}: {name}[{i}] must be a mapping with source, target and equal")
            continue
        bad = False
        for k in r:
            if k not in INHIBIT_KEYS:
                problems.append(f"{pos('correlation', 'inhibit_rules', i, k)}: unknown key {name}[{i}].{k}"
                                f"{hint(k, INHIBIT_KEYS)}")
                bad = True
        lists: dict[str, tuple[str, ...]] = {}
        for k in INHIBIT_KEYS:
            v = r.get(k, ["node"] if k == "equal" else None)
            v = [v] if isinstance(v, str) else v
            if not isinstance(v, list) or not v or not all(isinstance(x, str) for x in v):
                problems.append(f"{pos('correlation', 'inhibit_rules', i, k)}: {name}[{i}].{k} must be a "
                                "non-empty list of strings")
                bad = True
                continue
            known = INHIBIT_EQUAL if k == "equal" else PATHOLOGIES
            for x in v:
                if x not in known:
                    what = "label" if k == "equal" else "pathology ID"
                    problems.append(f"{pos('correlation', 'inhibit_rules', i, k)}: {name}[{i}].{k}: unknown "
                                    f"{what} {x!r}{hint(x, known)}")
                    bad = True
            lists[k] = tuple(v)
        if bad:
            continue
        both = set(lists["source"]) & set(lists["target"])
        if both:
            problems.append(f"{where}: {name}[{i}]: {', '.join(sorted(both))} is both source and target; "
                            "a finding would inhibit its own kind")
            continue
        out.append(InhibitRule(lists["source"], lists["target"], lists["equal"]))
    # a cycle (A inhibits B, B inhibits A) would hide both: refuse it, as a config error
    nxt: dict[str, set[str]] = {}
    for r in out:
        for s in r.source:
            nxt.setdefault(s, set()).update(r.target)
    cycle = find_cycle(nxt)
    if cycle:
        problems.append(f"{pos('correlation', 'inhibit_rules')}: {name}: {' -> '.join(cycle)} inhibit each other "
                        "in a cycle, which would hide all of them; drop one of those pairs")
    return tuple(out)


def parse_pathologies(value: Any, key: str, pos: Callable[..., str], problems: list[str]) -> tuple[str, ...]:
    """A list of pathology IDs (``correlation.<key>``), each one known."""
    from skewd.rules.pathologies import PATHOLOGIES

    name = f"correlation.{key}"
    value = [value] if isinstance(value, str) else (value if value is not None else [])
    if not isinstance(value, list) or not all(isinstance(x, str) for x in value):
        problems.append(f"{pos('correlation', key)}: {name} must be a list of pathology IDs")
        return ()
    for x in value:
        if x not in PATHOLOGIES:
            problems.append(f"{pos('correlation', key)}: {name}: unknown pathology ID {x!r}{hint(x, PATHOLOGIES)}")
    return tuple(x for x in value if x in PATHOLOGIES)


def parse_loss_paths(value: Any, pos: Callable[..., str], problems: list[str]) -> LossPaths:
    """``correlation.loss_paths``: three lists of known pathology IDs (empty lists: off)."""
    from skewd.rules.pathologies import PATHOLOGIES

    name = "correlation.loss_paths"
    if not isinstance(value, dict):
        problems.append(f"{pos('correlation', 'loss_paths')}: {name} must be a mapping "
                        "{ingress: [IDs], egress: [IDs], node: [IDs]}")
        return LossPaths()
    got: dict[str, tuple[str, ...]] = {}
    for k, v in value.items():
        if k not in LOSS_PATH_KEYS:
            problems.append(f"{pos('correlation', 'loss_paths', k)}: unknown key {name}.{k}{hint(k, LOSS_PATH_KEYS)}")
            continue
        v = [v] if isinstance(v, str) else (v if v is not None else [])
        if not isinstance(v, list) or not all(isinstance(x, str) for x in v):
            problems.append(f"{pos('correlation', 'loss_paths', k)}: {name}.{k} must be a list of pathology IDs")
            continue
        for x in v:
            if x not in PATHOLOGIES:
                problems.append(f"{pos('correlation', 'loss_paths', k)}: {name}.{k}: unknown pathology ID "
                                f"{x!r}{hint(x, PATHOLOGIES)}")
        got[k] = tuple(x for x in v if x in PATHOLOGIES)
    return LossPaths(**got)


def parse_culprit_evidence(value: Any, pos: Callable[..., str], problems: list[str]) -> dict[str, CulpritEvidence]:
    """``correlation.culprit_evidence``: rule id → where its finding holds its culprit measurement."""
    name = "correlation.culprit_evidence"
    if value is None:
        return {}
    if not isinstance(value, dict):
        problems.append(f"{pos('correlation', 'culprit_evidence')}: {name} must map rule ids to "
                        "{measure: <evidence label>, above: <param or number>, ...}")
        return {}
    out: dict[str, CulpritEvidence] = {}
    for rid, spec in value.items():
        where = ("correlation", "culprit_evidence", rid)
        if spec is None:  # a site may switch a default entry off with `<rule id>: null`
            continue
        if not isinstance(spec, dict):
            problems.append(f"{pos(*where)}: {name}.{rid} must be a mapping with measure and above")
            continue
        bad = False
        for k in spec:
            if k not in CULPRIT_EVIDENCE_KEYS:
                problems.append(f"{pos(*where, k)}: unknown key {name}.{rid}.{k}{hint(k, CULPRIT_EVIDENCE_KEYS)}")
                bad = True
        measure, above = spec.get("measure"), spec.get("above")
        if not isinstance(measure, str) or not measure.strip():
            problems.append(f"{pos(*where, 'measure')}: {name}.{rid}.measure must be the evidence label of the "
                            "measurement (the rule expression's text, e.g. 'avg(ctl_step_missing_ratio, window)')")
            bad = True
        for k in ("above", "min_steps"):
            v = spec.get(k)
            if (k == "above" or v is not None) and (isinstance(v, bool) or not isinstance(v, (str, int, float))):
                problems.append(f"{pos(*where, k)}: {name}.{rid}.{k} must be a param name of the rule or a number")
                bad = True
        steps = spec.get("steps", "")
        if not isinstance(steps, str):
            problems.append(f"{pos(*where, 'steps')}: {name}.{rid}.steps must be an evidence label")
            bad = True
        for k in ("abs", "negate"):
            if not isinstance(spec.get(k, False), bool):
                problems.append(f"{pos(*where, k)}: {name}.{rid}.{k} must be true or false")
                bad = True
        if spec.get("abs") and spec.get("negate"):
            problems.append(f"{pos(*where)}: {name}.{rid}: abs and negate exclude each other")
            bad = True
        if bad:
            continue
        minus, per = spec.get("minus", ""), spec.get("per", "")
        for k, v in (("minus", minus), ("per", per)):
            if not isinstance(v, str):
                problems.append(f"{pos(*where, k)}: {name}.{rid}.{k} must be an evidence label")
                bad = True
        if bad:
            continue
        out[str(rid)] = CulpritEvidence(measure=measure.strip(), above=above, steps=steps.strip(),
                                        min_steps=spec.get("min_steps"), abs=bool(spec.get("abs", False)),
                                        negate=bool(spec.get("negate", False)), minus=minus.strip(),
                                        per=per.strip())
    return out


def find_cycle(nxt: Mapping[str, set[str]]) -> list[str]:
    """A cycle in the graph ``nxt`` (node → successors) as its path, first node repeated; [] if none."""
    state: dict[str, int] = {}  # 1 on the path, 2 done
    path: list[str] = []

    def visit(n: str) -> list[str]:
        state[n] = 1
        path.append(n)
        for m in sorted(nxt.get(n, ())):
            if state.get(m) == 1:
                return path[path.index(m):] + [m]
            if m not in state:
                c = visit(m)
                if c:
                    return c
        path.pop()
        state[n] = 2
        return []

    for n in sorted(nxt):
        if n not in state:
            c = visit(n)
            if c:
                return c
    return []


def parse_listen_address(value: Any, pos: Any, problems: list[str]) -> str:
    """``metrics.listen``: ``host:port`` as the metrics server parses it, or "" (off)."""
    from skewd.metrics import parse_listen

    if value in (None, ""):
        return ""
    try:
        parse_listen(str(value))
    except ValueError as e:
        problems.append(f"{pos('metrics', 'listen')}: metrics.listen: {e} (or '' to disable)")
        return ""
    return str(value)


def parse_alertmanager(am: dict[str, Any], pos: Any, dur: Callable[..., float],
                       problems: list[str]) -> AlertmanagerConfig | None:
    """The ``alertmanager`` section; None when no URL is set (the sink is off)."""
    from urllib.parse import urlsplit

    urls = am.get("url")
    urls = [urls] if isinstance(urls, str) else urls
    if not isinstance(urls, list) or not all(isinstance(u, str) for u in urls):
        problems.append(f"{pos('alertmanager', 'url')}: alertmanager.url must be a URL or a list of URLs")
        return None
    for u in urls:
        if urlsplit(u).scheme not in ("http", "https") or not urlsplit(u).netloc:
            problems.append(f"{pos('alertmanager', 'url')}: alertmanager.url {u!r} must be http(s)://host[:port]"
                            "[/prefix] (the API path /api/v2/alerts is added)")
    labels = am.get("labels") or {}
    if not isinstance(labels, dict) or not all(isinstance(k, str) and isinstance(v, (str, int, float))
                                               for k, v in labels.items()):
        problems.append(f"{pos('alertmanager', 'labels')}: alertmanager.labels must map label names to values")
        labels = {}
    gen = str(am.get("generator_url") or "")
    try:
        gen.format(cluster="c", incident="i")
    except (KeyError, IndexError, ValueError) as e:
        problems.append(f"{pos('alertmanager', 'generator_url')}: alertmanager.generator_url may only use "
                        f"{{cluster}} and {{incident}} ({e})")
    resend = dur(am.get("resend_interval"), "alertmanager.resend_interval", "alertmanager", "resend_interval")
    timeout = dur(am.get("timeout"), "alertmanager.timeout", "alertmanager", "timeout")
    if not urls:
        return None
    return AlertmanagerConfig(urls=tuple(u.rstrip("/") for u in urls), resend_interval=resend, timeout=timeout,
                              generator_url=gen, labels=tuple(sorted((k, str(v)) for k, v in labels.items())))


def parse_topology(topo: Any, pos: Any, problems: list[str]) -> tuple[dict[str, TPGroup], dict[str, PPGroup],
                                                                       dict[str, ModelSpec]]:
    """The ``topology`` section: TP groups (a node in one only), PP groups and models."""
    tp: dict[str, TPGroup] = {}
    pp: dict[str, PPGroup] = {}
    models: dict[str, ModelSpec] = {}
    if not isinstance(topo, dict):
        problems.append(f"{pos('topology')}: topology must be a mapping")
        return tp, pp, models
    seen: dict[str, str] = {}

    def section(name: str) -> dict:
        v = topo.get(name) or {}
        if not isinstance(v, dict):
            problems.append(f"{pos('topology', name)}: topology.{name} must map names to settings")
            return {}
        return v

    def entry(sec: str, name: Any, v: Any, keys: Any, what: str) -> bool:
        """Whether one named entry of a section is a mapping; its unknown keys are problems."""
        where = ("topology", sec, name)
        if not isinstance(v, dict):
            problems.append(f"{pos(*where)}: {what}")
            return False
        for k in v:
            if k not in keys:
                problems.append(f"{pos(*where, k)}: unknown key topology.{sec}.{name}.{k}{hint(k, keys)}")
        return True

    for name, g in section("tp_groups").items():
        where = ("topology", "tp_groups", name)
        if not entry("tp_groups", name, g, TP_KEYS, f"tp group {name!r} must be a mapping with nodes"):
            continue
        nodes = g.get("nodes")
        if not isinstance(nodes, list) or not nodes or not all(isinstance(n, str) and n for n in nodes):
            problems.append(f"{pos(*where, 'nodes')}: tp group {name!r}: nodes must be a non-empty list of node names "
                            "in TP-rank order")
            continue
        for n in nodes:
            if n in seen:
                problems.append(f"{pos(*where, 'nodes')}: node {n!r} is in tp groups {seen[n]!r} and {name!r}; "
                                "a node serves one TP group")
            seen[n] = str(name)
        if len(set(nodes)) != len(nodes):
            problems.append(f"{pos(*where, 'nodes')}: tp group {name!r} lists a node twice")
        tp[str(name)] = TPGroup(str(name), tuple(nodes), str(g.get("model", "")), str(g.get("engine", "")))
    for name, g in section("pp_groups").items():
        where = ("topology", "pp_groups", name)
        if not entry("pp_groups", name, g, PP_KEYS, f"pp group {name!r} must be a mapping with stages"):
            continue
        stages = g.get("stages")
        if not isinstance(stages, list) or len(stages) < 2 or not all(isinstance(s, str) for s in stages):
            problems.append(f"{pos(*where, 'stages')}: pp group {name!r}: stages must list at least two TP groups "
                            "(or nodes), stage 0 first")
            continue
        pp[str(name)] = PPGroup(str(name), tuple(stages), str(g.get("model", "")))
    for name, m in section("models").items():
        where = ("topology", "models", name)
        m = m or {}
        if not entry("models", name, m, MODEL_KEYS, f"model {name!r} must be a mapping"):
            continue
        ints = {}
        for k in ("max_num_seqs", "max_model_len"):
            v = m.get(k)
            if v is not None and (isinstance(v, bool) or not isinstance(v, int) or v <= 0):
                problems.append(f"{pos(*where, k)}: {k} must be a positive integer")
                v = None
            ints[k] = v
        engines = m.get("engines") or []
        if not isinstance(engines, list) or not all(isinstance(e, str) for e in engines):
            problems.append(f"{pos(*where, 'engines')}: engines must be a list of '<node>/<engine>' names")
            engines = []
        models[str(name)] = ModelSpec(str(name), ints["max_num_seqs"], ints["max_model_len"],
                                      str(m.get("router", "")), tuple(engines))
    return tp, pp, models
