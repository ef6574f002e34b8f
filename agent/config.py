"""Agent configuration: one YAML file, validated strictly, with environment overrides.

Unknown keys are errors (with a did-you-mean and file:line:col), every error is reported at
once, and defaults make an empty file a working local agent. Environment variables override
the file, for containers: those in :data:`ENV_VARS` (``SKEWD_NODE``, ``SKEWD_NATS_URL``, ...),
and generically ``SKEWD__section__key=value`` (value parsed as YAML), e.g.
``SKEWD__collectors__pkt__interface=eth0``.

:data:`DEFAULTS`, :data:`SECTION_KEYS`, :data:`ENV_VARS` and :data:`KEY_DOCS` are the schema:
``docs/config.md`` is generated from them (``python -m skewd.configref --write docs/config.md``)
and a test fails when a key has no line there.
"""
from __future__ import annotations

import difflib
import os
import re
import socket
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Mapping

import yaml

from skewd.collectors import registry
from skewd.model import parse_duration
from skewd.rules.limits import RuleLimits
from skewd.rules.yamlpos import Pos, SettingsFileError, deep_merge, read_settings

DEFAULTS: dict[str, Any] = {
    "node": "",  # default: the host name
    "cluster": "default",
    "labels": {},  # node labels, e.g. {tp_group: tp0, model: llama-70b}
    "sys_root": "/sys",
    "proc_root": "/proc",
    "rules": [],  # default: the shipped packs
    "rule_limits": {},  # budgets for loading rule files (skewd.rules.limits.RuleLimits)
    "reload": {"watch": True, "poll_interval": "2s"},
    "evaluation_interval": "1s",
    "lookback": "60s",
    "horizon": "10m",
    "summary_interval": "1s",
    "collectors": {},  # name → {enabled, interval, timeout, required, ...collector keys}
    "reprobe": {"min_interval": "1s", "max_interval": "1m"},
    "nats": {},  # see skewd.natsutil.NatsConfig; empty url → no publishing
    "publish": {"summary_encoding": "json", "summary_layout_every": "10s"},
    "spool": {"dir": "/var/lib/skewd/spool", "max_bytes": 256 * 1024 * 1024},
    "metrics": {"listen": "127.0.0.1:9465"},
    "record": {"dir": "", "max_bytes": 1024 * 1024 * 1024, "max_duration": "1h", "rotate": 4},
    "log": {"level": "info", "format": "json"},
}
SECTION_KEYS: dict[str, set[str]] = {
    "reload": {"watch", "poll_interval"},
    "reprobe": {"min_interval", "max_interval"},
    "spool": {"dir", "max_bytes", "max_messages", "fsync", "fsync_interval", "memory_bytes"},
    "metrics": {"listen"},
    "publish": {"summary_encoding", "summary_layout_every"},
    "record": {"dir", "max_bytes", "max_duration", "rotate"},
    "log": {"level", "format"},
    "nats": {"url", "servers", "user", "password", "token", "nkey_seed_file", "creds_file", "tls_ca_file",
             "tls_cert_file", "tls_key_file", "tls_hostname", "name", "connect_timeout", "reconnect_time_wait",
             "pending_size", "inbox_prefix"},
}
COMMON_COLLECTOR_KEYS = {"enabled", "interval", "timeout", "required"}
#: values of ``publish.summary_encoding`` (docs/wire.md, *Binary summaries*)
SUMMARY_ENCODINGS = ("json", "binary")

#: environment variable → the key it sets (after the file, before command-line overrides)
ENV_VARS: dict[str, str] = {
    "SKEWD_NODE": "node",
    "SKEWD_CLUSTER": "cluster",
    "SKEWD_SYS_ROOT": "sys_root",
    "SKEWD_PROC_ROOT": "proc_root",
    "SKEWD_RULES": "rules",  # ':'-separated
    "SKEWD_NATS_URL": "nats.url",
    "SKEWD_METRICS_LISTEN": "metrics.listen",
    "SKEWD_SPOOL_DIR": "spool.dir",
}

#: every key's meaning (a tuple gives the default as text where DEFAULTS cannot say it)
KEY_DOCS: dict[str, str | tuple[str, str]] = {
    "node": ("the host name", "this node's name: a NATS subject token (no spaces, dots, `*` or `>`)"),
    "cluster": "cluster name, the subject token every message of this cluster carries",
    "labels": "node labels sent with every summary and finding, e.g. `{tp_group: tp0, model: llama-70b}`; "
              "the controller groups nodes by `tp_group` and rules may split peers by labels (`peers_by`)",
    "sys_root": "where the host's `/sys` is mounted (`/host/sys` in a container)",
    "proc_root": "where the host's `/proc` is mounted (`/host/proc` in a container)",
    "rules": ("`[shipped]`", "rule files and directories, read in order (directories recursively); the word "
              "`shipped` names the packs installed with skewd, e.g. `[shipped, /etc/skewd/site-rules.yaml]`"),
    "rule_limits": ("each budget's own (docs/reliability.md)",
                    "budgets for reading rule files, e.g. `{yaml_depth: 64, file_bytes: 262144}`: `file_bytes`, "
                    "`yaml_depth`, `yaml_alias_ratio`, `yaml_nodes`, `rules`, `expr_chars`, `expr_depth`, "
                    "`expr_nodes`, `max_integer`, `max_duration`; a file past one is refused with E019/E020 at its "
                    "line and the old rules keep running"),
    "reload.watch": "re-read the rule files when they change on disk (SIGHUP always does)",
    "reload.poll_interval": "how often the rule files' modification times are compared",
    "reprobe.min_interval": "first wait before an inactive collector (absent, unavailable, needing an operator) "
                            "is probed again; the wait doubles after each failed probe",
    "reprobe.max_interval": "longest wait between two probes of an inactive collector (SIGHUP probes at once)",
    "evaluation_interval": "how often the rules are evaluated",
    "lookback": "what a bare signal name in a rule means: its latest value within this window",
    "horizon": "how long samples are kept in memory (the longest rule window must fit)",
    "summary_interval": "how often the node summary is published to the controller",
    "collectors": "per-collector settings, `collectors.<name>.<key>` (tables below)",
    "publish.summary_encoding": "how summaries travel: `json` (readable with `nats sub`, read by every controller "
                                "version) or `binary` (the layout now and then, the values as float64s: the "
                                "controller reads it at a fraction of the cost, but a controller older than binary "
                                "summaries refuses it: upgrade the controller first). docs/wire.md, *Binary summaries*",
    "publish.summary_layout_every": "with `binary`: the longest a summary goes without carrying its layout; a "
                                    "controller that restarted refuses the node's summaries (`layout_unknown`) until "
                                    "then",
    "spool.dir": "where findings wait on disk while NATS is unreachable (a subdirectory per node)",
    "spool.max_bytes": "spool size bound; the oldest findings are evicted beyond it (counted in health `drops`)",
    "spool.max_messages": ("`100000`", "spool bound in findings"),
    "spool.fsync": ("`interval`", "`always` (every append survives power loss), `interval` (at most every "
                    "`fsync_interval`), `never` (left to the OS); a crashed process loses nothing either way"),
    "spool.fsync_interval": ("`1s`", "with `fsync: interval`, the most a power loss can take; also how often a "
                             "spool whose disk refused writes retries it"),
    "spool.memory_bytes": ("`4194304`", "findings held in memory, in order, while the disk refuses writes (full, "
                           "I/O error); beyond it a finding is refused and counted (`drops.spool_error`)"),
    "metrics.listen": "the agent's own Prometheus `/metrics`; empty turns it off (binds localhost unless told)",
    "record.dir": "record capture bundles here continuously (`<dir>/<node>/seg-NNNNNN`); empty: off",
    "record.max_bytes": "the whole recording stays within this size (each of `rotate` segments gets its share)",
    "record.max_duration": "the recording covers about this much of the latest time",
    "record.rotate": "segments kept, the oldest deleted; 0: one segment, recording stops when it is full",
    "log.level": "`debug`, `info`, `warning` or `error`",
    "log.format": "`json` (one object per line) or `text`",
}

#: the keys every collector accepts, ``collectors.<name>.<key>``
COMMON_COLLECTOR_DOCS: dict[str, tuple[str, str]] = {
    "enabled": ("`true`", "`false` switches the collector off (it is never probed)"),
    "interval": ("the collector's own (below)", "collection period"),
    "timeout": ("0.8 × interval (vllm, exporter: half the interval, at most 2 s)",
                "a collection (or scrape) running longer is abandoned and counted; must be shorter than "
                "the interval"),
    "required": ("`false`", "`true`: not being active is an operator error (`needs_operator`, and "
                 "`skewd agent --check` exits 3)"),
}


class ConfigError(Exception):
    def __init__(self, problems: list[str]) -> None:
        super().__init__("\n".join(problems))
        self.problems = problems


@dataclass
class AgentConfig:
    node: str
    cluster: str
    labels: dict[str, str]
    sys_root: Path
    proc_root: Path
    rules: list[str]
    rule_limits: RuleLimits
    reload_watch: bool
    reload_poll: float
    evaluation_interval: float
    lookback: float
    horizon: float
    summary_interval: float
    collectors: dict[str, dict[str, Any]]
    nats: dict[str, Any]
    spool: dict[str, Any]
    metrics_listen: str
    record: dict[str, Any]
    log: dict[str, Any]
    source: str = "<defaults>"
    raw: dict[str, Any] = field(default_factory=dict)
    #: backoff between probes of an inactive collector (agent/scheduler.py)
    reprobe_min: float = 1.0
    reprobe_max: float = 60.0
    #: how summaries are published (``publish.summary_encoding``) and how often a binary one
    #: carries its layout (``publish.summary_layout_every``, seconds)
    summary_encoding: str = "json"
    summary_layout_every: float = 10.0

    def collector_config(self, name: str) -> dict[str, Any]:
        return dict(self.collectors.get(name, {}))




def _env_overrides(env: Mapping[str, str]) -> dict[str, Any]:
    over: dict[str, Any] = {}
    for var, key in ENV_VARS.items():
        if not env.get(var):
            continue
        value: Any = [p for p in env[var].split(":") if p] if key == "rules" else env[var]
        *sections, last = key.split(".")
        cur = over
        for sec in sections:
            cur = cur.setdefault(sec, {})
        cur[last] = value
    for var, val in env.items():
        if var.startswith("SKEWD__"):
            path = [p for p in var[len("SKEWD__"):].split("__") if p]
            if not path:
                continue
            cur = over
            for p in path[:-1]:
                cur = cur.setdefault(p.lower(), {})
            try:
                cur[path[-1].lower()] = yaml.safe_load(val)
            except yaml.YAMLError:
                cur[path[-1].lower()] = val
    return over


def _spool_problems(spool: dict[str, Any], pos: Any) -> list[str]:
    """Check the spool settings at load time (the Spool would refuse them only at start), and
    turn ``fsync_interval`` into seconds."""
    from .spool import FSYNC_POLICIES

    out = []
    if "fsync" in spool and spool["fsync"] not in FSYNC_POLICIES:
        out.append(f"{pos('fsync')}: spool.fsync must be {', '.join(FSYNC_POLICIES[:-1])} or {FSYNC_POLICIES[-1]}, "
                   f"got {spool['fsync']!r} (always: no loss on power failure; interval: at most fsync_interval "
                   "lost; never: the OS decides)")
    for k, lo in (("max_bytes", 1), ("max_messages", 1), ("memory_bytes", 0)):
        v = spool.get(k)
        if v is not None and (isinstance(v, bool) or not isinstance(v, int) or v < lo):
            out.append(f"{pos(k)}: spool.{k} must be an integer >= {lo}, got {v!r}")
    if "fsync_interval" in spool:
        try:
            spool["fsync_interval"] = parse_duration(spool["fsync_interval"])
            if spool["fsync_interval"] <= 0:
                raise ValueError("must be longer than 0s")
        except ValueError as e:
            out.append(f"{pos('fsync_interval')}: spool.fsync_interval: {e}")
    return out


def load_config(path: str | Path | None = None, env: Mapping[str, str] | None = None,
                overrides: Mapping[str, Any] | None = None,
                collector_keys: Mapping[str, set[str]] | None = None,
                collector_checks: Mapping[str, Callable[[dict[str, Any]], list[str]]] | None = None
                ) -> AgentConfig:
    """Read, merge (defaults < file < env < overrides) and validate. Raises ConfigError.

    ``collector_keys`` (name → accepted keys) turns on the check of ``collectors:``: unknown
    collectors and keys are errors. ``collector_checks`` (name → ``Collector.config_problems``)
    lets each enabled collector validate its own settings here, at load time, so a bad
    endpoint URL is an operator error at startup rather than a collector "unavailable" for
    the agent's whole life. Without it, the checks of the shipped collectors run whenever
    ``collector_keys`` is given (:func:`skewd.collectors.registry.collector_config_checks`)."""
    env = os.environ if env is None else env
    problems: list[str] = []
    doc: Any = {}
    where = "<defaults>"
    key_pos: dict[tuple, Pos] = {}
    if path is not None:
        where = str(path)
        try:
            doc, key_pos, problems = read_settings(path, "agent")
        except SettingsFileError as e:
            raise ConfigError(e.problems) from None
    merged = deep_merge(DEFAULTS, doc)
    merged = deep_merge(merged, _env_overrides(env))
    merged = deep_merge(merged, overrides or {})

    def pos(*keys: str) -> str:
        p = key_pos.get(tuple(keys))
        return str(p) if p else where

    for k in merged:
        if k not in DEFAULTS:
            hint = difflib.get_close_matches(k, DEFAULTS, n=1)
            problems.append(f"{pos(k)}: unknown key {k!r}" + (f"; did you mean {hint[0]}?" if hint else ""))
    for sec, allowed in SECTION_KEYS.items():
        val = merged.get(sec)
        if not isinstance(val, dict):
            problems.append(f"{pos(sec)}: {sec} must be a mapping")
            continue
        for k in val:
            if k not in allowed:
                hint = difflib.get_close_matches(k, allowed, n=1)
                problems.append(f"{pos(sec, k)}: unknown key {sec}.{k}" + (f"; did you mean {hint[0]}?" if hint else ""))
    collectors = merged.get("collectors") or {}
    if not isinstance(collectors, dict):
        problems.append(f"{pos('collectors')}: collectors must map collector names to settings")
        collectors = {}
    known = collector_keys or {}
    checks = collector_checks
    for name, cc in collectors.items():
        if known and name not in known:
            hint = difflib.get_close_matches(name, known, n=1)
            problems.append(f"{pos('collectors', name)}: unknown collector {name!r}"
                            + (f"; did you mean {hint[0]}?" if hint else f" (known: {', '.join(sorted(known))})"))
            continue
        if cc is None:
            collectors[name] = cc = {}
        if not isinstance(cc, dict):
            problems.append(f"{pos('collectors', name)}: collectors.{name} must be a mapping")
            continue
        allowed = COMMON_COLLECTOR_KEYS | set(known.get(name, set()))
        for k in cc:
            if known and k not in allowed:
                hint = difflib.get_close_matches(k, allowed, n=1)
                problems.append(f"{pos('collectors', name, k)}: unknown key collectors.{name}.{k}"
                                + (f"; did you mean {hint[0]}?" if hint else ""))
        for dk in ("interval", "timeout"):
            if dk in cc:
                try:
                    cc[dk] = parse_duration(cc[dk])
                except ValueError as e:
                    problems.append(f"{pos('collectors', name, dk)}: collectors.{name}.{dk}: {e}")
        if "interval" in cc and "timeout" in cc and cc["timeout"] >= cc["interval"]:
            problems.append(f"{pos('collectors', name, 'timeout')}: collectors.{name}.timeout must be shorter "
                            f"than its interval ({cc['interval']:g}s)")
        for bk in ("enabled", "required"):
            if bk in cc and not isinstance(cc[bk], bool):
                problems.append(f"{pos('collectors', name, bk)}: collectors.{name}.{bk} must be true or false")
        if cc.get("enabled") is False and cc.get("required") is True:
            problems.append(f"{pos('collectors', name)}: collectors.{name} is both disabled and required")
        if known and cc.get("enabled") is not False:
            if checks is None:
                checks = registry.collector_config_checks()
            check = checks.get(name)
            if check is not None:
                # at the offending key's line when the message names it (collectors.<name>.<key>)
                for p in check(cc):
                    key = re.match(rf"collectors\.{re.escape(name)}\.(\w+)", p)
                    at = ("collectors", name, key.group(1)) if key and key.group(1) in cc else ("collectors", name)
                    problems.append(f"{pos(*at)}: {p}")
    durations = {}
    for k in ("evaluation_interval", "lookback", "horizon", "summary_interval"):
        try:
            durations[k] = parse_duration(merged[k])
            if durations[k] <= 0:
                raise ValueError("must be longer than 0s")
        except ValueError as e:
            problems.append(f"{pos(k)}: {k}: {e}")
    reprobe = merged["reprobe"] if isinstance(merged.get("reprobe"), dict) else {}
    reprobe_s = {}
    for k, default in (("min_interval", 1.0), ("max_interval", 60.0)):
        try:
            reprobe_s[k] = parse_duration(reprobe.get(k, default))
            if reprobe_s[k] <= 0:
                raise ValueError("must be longer than 0s")
        except ValueError as e:
            problems.append(f"{pos('reprobe', k)}: reprobe.{k}: {e}")
            reprobe_s[k] = default
    if reprobe_s["max_interval"] < reprobe_s["min_interval"]:
        problems.append(f"{pos('reprobe', 'max_interval')}: reprobe.max_interval must not be shorter than "
                        "reprobe.min_interval")
    reload = merged["reload"] if isinstance(merged.get("reload"), dict) else {}
    try:
        reload_poll = parse_duration(reload.get("poll_interval", "2s"))
    except ValueError as e:
        problems.append(f"{pos('reload', 'poll_interval')}: reload.poll_interval: {e}")
        reload_poll = 2.0
    rules = merged.get("rules")
    if isinstance(rules, str):
        rules = [rules]
    if not isinstance(rules, list) or not all(isinstance(r, str) for r in rules):
        problems.append(f"{pos('rules')}: rules must be a list of files or directories")
        rules = []
    rule_limits = RuleLimits()
    if not isinstance(merged.get("rule_limits") or {}, dict):
        problems.append(f"{pos('rule_limits')}: rule_limits must be a mapping")
    else:
        rule_limits, bad = RuleLimits.from_mapping(merged.get("rule_limits") or {})
        problems += [f"{pos('rule_limits')}: rule_limits: {b}" for b in bad]
    labels = merged.get("labels") or {}
    if not isinstance(labels, dict):
        problems.append(f"{pos('labels')}: labels must be a mapping of strings")
        labels = {}
    node = str(merged.get("node") or socket.gethostname())
    for k in ("node", "cluster"):
        v = node if k == "node" else str(merged.get(k, ""))
        if not v or any(c in v for c in " .*>\t"):
            problems.append(f"{pos(k)}: {k} {v!r} must be non-empty without spaces, dots, '*' or '>' (NATS subject token)")
    nats = merged.get("nats") or {}
    if isinstance(nats, dict) and (nats.get("url") or nats.get("servers")):
        from skewd.natsutil import NatsConfig, NatsConfigError

        try:
            NatsConfig.from_dict(nats)
        except NatsConfigError as e:
            problems += [f"{pos('nats')}: {line.strip()}" for line in str(e).splitlines()[1:]]
    logc = merged.get("log") if isinstance(merged.get("log"), dict) else {}
    if str(logc.get("level", "info")).lower() not in ("debug", "info", "warning", "error"):
        problems.append(f"{pos('log', 'level')}: log.level must be debug, info, warning or error")
    if logc.get("format", "json") not in ("json", "text"):
        problems.append(f"{pos('log', 'format')}: log.format must be json or text")
    spool = merged.get("spool") if isinstance(merged.get("spool"), dict) else {}
    problems += _spool_problems(spool, lambda k: pos("spool", k))
    publish = merged.get("publish") if isinstance(merged.get("publish"), dict) else {}
    encoding = publish.get("summary_encoding", "json")
    if encoding not in SUMMARY_ENCODINGS:
        problems.append(f"{pos('publish', 'summary_encoding')}: publish.summary_encoding must be json or binary, "
                        f"got {encoding!r} (json: readable and read by every controller; binary: cheaper to read, "
                        "needs a controller that reads it)")
    try:
        layout_every = parse_duration(publish.get("summary_layout_every", "10s"))
        if layout_every <= 0:
            raise ValueError("must be longer than 0s")
    except ValueError as e:
        problems.append(f"{pos('publish', 'summary_layout_every')}: publish.summary_layout_every: {e}")
        layout_every = 10.0
    record = merged.get("record") if isinstance(merged.get("record"), dict) else {}
    if record.get("max_duration"):
        try:
            record["max_duration"] = parse_duration(record["max_duration"])
        except ValueError as e:
            problems.append(f"{pos('record', 'max_duration')}: record.max_duration: {e}")
    if problems:
        raise ConfigError(problems)
    return AgentConfig(
        node=node, cluster=str(merged["cluster"]), labels={str(k): str(v) for k, v in labels.items()},
        sys_root=Path(merged["sys_root"]), proc_root=Path(merged["proc_root"]), rules=list(rules),
        rule_limits=rule_limits,
        reload_watch=bool(reload.get("watch", True)), reload_poll=reload_poll,
        evaluation_interval=durations["evaluation_interval"], lookback=durations["lookback"],
        horizon=durations["horizon"], summary_interval=durations["summary_interval"],
        collectors=collectors, nats=dict(merged.get("nats") or {}), spool=dict(merged["spool"]),
        metrics_listen=str(merged["metrics"].get("listen", "")), record=record, log=dict(merged["log"]),
        source=where, raw=merged, reprobe_min=reprobe_s["min_interval"], reprobe_max=reprobe_s["max_interval"],
        summary_encoding=str(encoding), summary_layout_every=layout_every,
    )


