"""Controller configuration: one YAML file, validated strictly (unknown keys are errors with a
did-you-mean and ``file:line:col``; every problem is reported at once), defaults that make an
empty file a working single-cluster controller, and the environment overrides containers use:
``SKEWD_CLUSTER``, ``SKEWD_NATS_URL`` (comma-separated servers), ``SKEWD_RULES``
(``:``-separated paths), ``SKEWD_CONTROLLER_ID``, ``SKEWD_METRICS_LISTEN`` (``host:port``; empty: off).

The topology section names the tensor-parallel (TP) and pipeline-parallel (PP) groups and the
models they serve. Agents may declare their own group through summary labels; the file wins
where both speak (it is the operator's word), see :mod:`skewd.controller.topology`.

This module holds what an operator reads: the defaults (:data:`DEFAULTS`, the sample config),
what each key means (:data:`KEY_DOCS`, :data:`ENV_VARS`; docs/config.md is generated from them)
and :func:`load_config`, which layers defaults < file < environment < overrides and checks the
flat keys. The structured sections are checked in :mod:`skewd.controller.configsections`, and
the typed result (:class:`ControllerConfig` and its parts) is defined in
:mod:`skewd.controller.configtypes`; both are re-exported here, the public import path.
"""
from __future__ import annotations

import copy
import os
import socket
from pathlib import Path
from typing import Any, Mapping

from skewd.model import parse_duration
from skewd.natsutil import NatsConfig, NatsConfigError, inbox_prefix
from skewd.rules.yamlpos import Pos, SettingsFileError, deep_merge, read_settings

from .configsections import (hint, parse_alertmanager, parse_culprit_evidence, parse_inhibit_rules,
                             parse_loss_paths,
                             parse_listen_address, parse_pathologies, parse_topology)
# the typed configuration is this module's public API too (``from skewd.controller.config import ...``)
from .configtypes import (AlertmanagerConfig, ConfigError, ControllerConfig, InhibitRule, ModelSpec, PPGroup,
                          TPGroup)

__all__ = ["DEFAULTS", "ENV_VARS", "KEY_DOCS", "SECTIONS", "AlertmanagerConfig", "ConfigError",
           "ControllerConfig", "InhibitRule", "ModelSpec", "PPGroup", "TPGroup", "deep_merge_nats", "load_config"]

DEFAULTS: dict[str, Any] = {
    "cluster": "default",
    "controller_id": "",  # default: <hostname>-<pid>
    "nats": {},
    "rules": [],  # default: the shipped packs (skewd.rules.cli.PACKS)
    "evaluation_interval": "1s",
    "lookback": "30s",
    "horizon": "10m",
    "warmup": "10s",
    "stale_after": "5s",
    "alignment": {"window": "30s", "max_skew": "250ms", "unsynced_clock_error": "50ms",
                  "min_group_fraction": 0.5},
    "correlation": {"group_wait": "30s", "culprit_pathologies": ["EW-1", "EW-2", "EW-3", "EW-9"],
                    "never_inhibit": ["GPU-1", "GPU-6"], "effect_window": "30s",
                    # Alertmanager-style inhibit rules: while a finding of a `source` pathology
                    # fires, findings of a `target` pathology with the same `equal` labels are
                    # attached to the source's incident instead of opening their own. The defaults
                    # are the runbooks' cause -> symptom pairs the fault lab shows (docs/controller.md).
                    "inhibit_rules": [
                        # a congested, lossy, credit-starved or churning port makes KV transfers slow
                        {"source": ["EW-4", "EW-5", "EW-6", "EW-7", "PCIE-9", "NS-9"], "target": ["EW-8"],
                         "equal": ["node"]},
                        # head-of-line blocking (queue exhaustion) shows at the port as credit waits
                        {"source": ["EW-5"], "target": ["EW-7"], "equal": ["node"]},
                        # a saturated link backs up the egress queue and skews the flows sharing it
                        {"source": ["NS-9"], "target": ["NS-3", "NS-5"], "equal": ["node"]},
                        # a port that tail-drops its bursts has a full queue (NS-5's backlog), and it drops
                        # its own ACKs too, so its peers resend to it (NS-4's ingress resends): real lab,
                        # drops seeds 311 and 312, each opened NS-4 or NS-5 on the dropping node 10-25 s
                        # after NS-7
                        {"source": ["NS-7"], "target": ["NS-4", "NS-5"], "equal": ["node"]},
                        # a slowed GPU feed, host or clock is why the engine's token rate eroded; so is a
                        # slow pipeline stage, which slows every step of the replica (EW-2 names both
                        # stages of the hand-off, the engine's node among them)
                        {"source": ["PCIE-1", "PCIE-2", "PCIE-3", "PCIE-4", "PCIE-5", "PCIE-6", "PCIE-7", "PCIE-8",
                                    "GPU-5", "GPU-6", "EW-2"], "target": ["GPU-8"], "equal": ["node"]},
                        # a stalled engine stops pulling requests and producing tokens
                        {"source": ["GPU-3"], "target": ["GPU-8", "NS-1", "NS-2"], "equal": ["node"]},
                        # a deadlocked engine holds its KV blocks and stops admitting: its cache reads full while
                        # its queue grows, GPU-2's red flag (gpu3-engine-stall seed 2 published GPU-2 beside GPU-3)
                        {"source": ["GPU-3"], "target": ["GPU-2"], "equal": ["node", "entity"]},
                        # a GPU that lags its node's peers for a named reason: the reason is the incident
                        {"source": ["PCIE-1", "PCIE-5", "PCIE-7", "GPU-5", "GPU-6"], "target": ["PCIE-4"],
                         "equal": ["node", "entity"]},
                        # a preemption storm keeps its GPU busy recomputing and admits no new prompts, so that
                        # GPU's H2D feed reads under a third of its node peers' (PCIE-4's thin feed); so does a
                        # saturated cache whose queue grows (GPU-2: the engine admits only what frees up).
                        # GPU-2/GPU-4 name the engine, PCIE-4 the GPU: no label joins them, so the node
                        # (gpu4-preemption-storm-l40s seeds 1, 4, 5; seed 1 fires GPU-2, not GPU-4; neither
                        # fired in pcie4-intra-node-skew)
                        {"source": ["GPU-2", "GPU-4"], "target": ["PCIE-4"], "equal": ["node"]},
                        # a stalled launch path or a saturated host idles all of the node's GPUs: their
                        # feed turns sporadic, which reads as H2D starvation
                        {"source": ["PCIE-3", "PCIE-8"], "target": ["PCIE-1"], "equal": ["node"]},
                        # a link trained below its width is a hardware fault sign before it is a thin feed
                        {"source": ["GPU-6"], "target": ["PCIE-1", "PCIE-5"], "equal": ["node", "entity"]},
                        # a preemption storm re-queues what it evicts and holds the cache full: the
                        # engine's KV saturation and growing queue (GPU-2) are the storm's symptoms; and
                        # it spends the engine's steps recomputing what it evicted, so each running
                        # request's token rate falls while the batch holds - GPU-8's erosion (gpu7
                        # memory-bound seed 107: 40-50 evictions a minute from a batch of 13, and GPU-8
                        # opened beside the storm)
                        {"source": ["GPU-4"], "target": ["GPU-2", "GPU-8"], "equal": ["node", "entity"]},
                        # anything that slows the node's engine or floods it fills its cache and grows its
                        # queue - GPU-2's red flag: a D2H drain or a slow pipeline stage (pcie2, ew2 seeds
                        # 101-103), a starved or sporadic H2D feed, a slow launch path or host, a
                        # downtrained, saturated or shared link, pinned-memory shortage, clock skew, a
                        # resource-imbalanced engine, bursts of admissions, or generation lengths that spread
                        # (NS-8: the long tail of a length-variance client holds its blocks for thousands of
                        # steps - ns8 seeds 107 and 109 filled the node's cache and grew its queue minutes
                        # after NS-8 fired; NS-8-latency-tail is incubating since the seeds 116-118 table, while
                        # GPU-7-compute-bound and PCIE-7's rules are sandbox and inhibit nothing until
                        # promoted, docs/rules.md). A growing queue over a full cache is demand outgrowing the cache
                        # only when nothing slowed the engine (held-out seeds 104-106: 17 of 19 wrong GPU-2
                        # incidents sat on the node of one of these faults).
                        # PCIE-4 and GPU-8 stay out: GPU-2 already explains PCIE-4's thin feed, which
                        # explains GPU-8 (a cycle)
                        {"source": ["PCIE-1", "PCIE-2", "PCIE-3", "PCIE-5", "PCIE-6", "PCIE-7", "PCIE-8", "GPU-5",
                                    "GPU-7", "EW-2", "NS-1", "NS-8"], "target": ["GPU-2"], "equal": ["node"]},
                        # a replica bound by memory (GPU-7: a cache full of fewer, bigger requests than its peers
                        # get, at no more arrivals) thrashes: its long sequences outgrow the cache and the
                        # scheduler evicts and recomputes them - the preemption storm (GPU-4) on that node is the
                        # imbalance's symptom, not a second fault (docs/pathologies.md GPU-7; fault lab: GPU-4
                        # was 8 of the 10 wrong incidents of the seeds 113-115 table, all on gpu7 memory-bound).
                        # GPU-7-memory-bound names the node only (cluster scope), so the node joins them. A
                        # storm of more sequences (GPU-4 on its own) is sent more requests than its peers and
                        # does not read as GPU-7
                        {"source": ["GPU-7"], "target": ["GPU-4"], "equal": ["node"]},
                        # GPUs that stop decoding early (PCIE-10, whose runbook reads the finished-length
                        # spread too) are why the engine's generation lengths spread (NS-8's latency tail);
                        # PCIE-10 names the GPU or engine, NS-8 the engine or port: the node joins them
                        {"source": ["PCIE-10"], "target": ["NS-8"], "equal": ["node"]},
                        # a batch client (NS-8's early stops next to long generations) sends its batch at
                        # once: the engine's queue jumps by the batch and the port's bytes burst - NS-1's
                        # red flag from the same client. The spread of lengths is what sets it apart from
                        # a merely bursty client (NS-1 alone spreads no lengths); NS-8 names the engine,
                        # NS-1 the port: the node joins them (fault lab, ns8 batch_early_stop seed 116:
                        # two NS-1 incidents on the NS-8 node)
                        {"source": ["NS-8"], "target": ["NS-1"], "equal": ["node"]},
                        # a load balancer that starves one node (NS-2: it hashes few sessions there) sends
                        # that node's share to its peers - the requests are not lost, they go elsewhere -
                        # so a peer serving the same model sees more demand than before, and one near its
                        # knee fills its cache while its queue grows (GPU-2 on ANOTHER node: fault lab
                        # ns2 seed 120, GPU-2 on node1 50 s before the starvation of node2 ended). The
                        # fix is the balancer's, so the saturation joins the starvation's incident; the
                        # model joins them (the replicas one balancer spreads a model over)
                        {"source": ["NS-2"], "target": ["GPU-2"], "equal": ["model"]},
                        # a congested, lossy, head-of-line blocked, credit-starved or registration-churning
                        # port delays and smears the node's collective sends: the agent's capture sees steps
                        # merge or start late, which reads as missing steps (EW-9) or a straggler (EW-1) on
                        # that node (fault lab, agent bursts: ew4 seeds 1 and 3, ew6 seed 1, pcie9 seed 1,
                        # ew5 seeds 101 and 103)
                        {"source": ["EW-4", "EW-5", "EW-6", "EW-7", "PCIE-9"], "target": ["EW-1", "EW-9"],
                         "equal": ["node"]},
                        # direct evidence beats inference: a node whose own egress/ingress drops packets or
                        # backs up (qdisc/NIC drops, a backlog, a saturated link, an RDMA loss storm)
                        # explains why its collectives look late, skipped or uneven to the controller - the
                        # cross-node finding naming that node joins the node's own incident (real lab, issue 19:
                        # a tbf drop storm's NS-7 on the right node, and a false EW-9 on the same group)
                        {"source": ["NS-4", "NS-5", "NS-7", "NS-9", "EW-6"], "target": ["EW-1", "EW-3", "EW-9"],
                         "equal": ["node"]},
                    ],
                    # node-local findings that measure a fault on their own node directly (drops,
                    # backlog, saturation, loss counted by that node's kernel or NIC): a cross-node
                    # inference naming ANOTHER node never inhibits them (docs/controller.md)
                    "direct_evidence": ["NS-4", "NS-5", "NS-7", "NS-9", "EW-6"],
                    # which end of a lossy path (controller/losspath.py, docs/controller.md): flows
                    # from two or more nodes losing into one node are that node's ingress trouble
                    # (a lossy switch port or cable in front of it), not each sender's: the senders'
                    # egress-loss findings (and a sender's loss storm, when all its lossy flows go
                    # there) join the receiver's ingress-loss incident; one node losing towards two
                    # or more is its egress trouble, the other way round. One lossy flow alone stays
                    # ambiguous. Real lab, ingress-drops seed 502: NS-7 on both ring neighbours of
                    # the node behind the lossy port, EW-6 on one; empty lists turn it off
                    "loss_paths": {"ingress": ["NS-4"], "egress": ["NS-7"], "node": ["EW-6"]},
                    # where each culprit rule's finding holds the measurement that names its node
                    # (controller/culprit.py): an evidence label of the rule (its expression's text) and
                    # the param it must exceed. Rules that put culprit_measure / culprit_bar into their
                    # evidence themselves need no entry; a rule with neither names no culprit.
                    "culprit_evidence": {
                        # clock-free: its compute gap over the other members' median (seconds)
                        "EW-1-tp-straggler": {"measure": "avg(summary_collective_compute_seconds, window)",
                                              "minus": "peer_others(avg(summary_collective_compute_seconds, window))",
                                              "above": "lag", "steps": "min(summary_collective_steps, window)",
                                              "min_steps": "min_steps"},
                        # clock-free, late in bursts: its share of the time computing over the others' median
                        "EW-1-tp-straggler-time-share": {
                            "measure": "avg(summary_collective_compute_share_ratio, window)",
                            "minus": "peer_others(avg(summary_collective_compute_share_ratio, window))",
                            "above": "time_share", "steps": "min(summary_collective_steps, window)",
                            "min_steps": "min_steps"},
                        "EW-1-tp-straggler-aligned": {"measure": "avg(ctl_arrival_lag_excess_seconds, window)",
                                                      "above": "lag", "steps": "min(ctl_aligned_steps, window)",
                                                      "min_steps": "min_steps"},
                        "EW-2-pp-handoff-gap": {"measure": "avg(ctl_pp_gap_ratio, window)", "above": "ratio"},
                        # clock-free: how much longer the neighbour stages wait than this one, as
                        # a share of the step (the rule's own comparison)
                        "EW-2-pp-stage-straggler": {
                            "measure": "peer_others(avg(summary_collective_wait_seconds, window))",
                            "minus": "avg(summary_collective_wait_seconds, window)",
                            "per": "avg(summary_collective_period_seconds, window)",
                            "above": "idle", "steps": "min(summary_collective_steps, window)",
                            "min_steps": "min_steps"},
                        "EW-3-collective-bytes-skew": {"measure": "peer_dev(1 + avg(ctl_collective_bytes_dev_ratio, window))",
                                                       "above": "dev", "abs": True,
                                                       "steps": "min(ctl_aligned_steps, window)",
                                                       "min_steps": "min_steps"},
                        "EW-3-cross-node-load-skew": {"measure": "peer_dev(avg(summary_rdma_xmit_bytes_per_second, window))",
                                                      "above": "dev", "abs": True},
                        "EW-9-early-stop-skew": {"measure": "peer_dev(avg(summary_rdma_xmit_bytes_per_second, window))",
                                                 "above": "quiet", "negate": True,
                                                 "steps": "min(ctl_aligned_steps, window)", "min_steps": "min_steps"},
                        "EW-9-missing-steps": {"measure": "avg(ctl_step_missing_ratio, window)", "above": "missing"},
                    }},
    "remap": {"ttl": "10m", "min_confidence": 0.3, "concurrency_factor": 0.75, "reroute_weight": 0.5},
    "consumer": {"durable": "", "queue": "", "ack_wait": "10s", "batch": 64},  # default names: skewd-controller-<cluster>
    "state": {"bucket": "SKEWD_CONTROLLER", "max_age": "7d"},
    # what the controller accepts from agents (docs/controller.md, "What the controller trusts"):
    # max_clock_skew: a summary whose t, or a finding whose times, lie further than this from
    #   the controller's clock (a finding: ahead of it) is rejected; 0s turns the check off (a
    #   lab replaying recorded time through NATS). 5m is far beyond NTP/chrony error (ms) and a
    #   summary's transit (ms), and short enough that one bad clock cannot move evaluation far.
    # silent_intervals: a node heard from neither by summary nor by finding for this many of its
    #   summary intervals (at least evaluation_interval each) is silent: its agents' open findings
    #   are resolved ("node silent") and its per-node state is forgotten. 30 x 1 s rides out an
    #   agent restart (a few seconds) and a NATS reconnect.
    # max_nodes: nodes heard from at once; messages from further new nodes are rejected (and
    #   counted) until silent nodes make room (about 18 kB of state per node; 10000 nodes ~ 200 MB)
    # summary_backlog_bytes: summaries read off the socket and not yet taken in, at most (all
    #   the intake's summary subscriptions together). Beyond it the oldest are shed and counted
    #   (rejected, reason backlog_full): an intake that falls behind stays seconds behind, not
    #   minutes, and its memory is bounded.
    #   32 MiB holds ~25,000 summaries of 1.3 kB: a whole 1 s interval of 10,000 nodes arriving at
    #   once, and about 1.5 s of one worker's intake at saturation (docs/benchmarks.md)
    "ingest": {"max_clock_skew": "5m", "silent_intervals": 30, "max_nodes": 10000,
               "summary_backlog_bytes": 32 << 20},
    "topology": {"tp_groups": {}, "pp_groups": {}, "models": {}},
    # scale-out (docs/controller.md, "Scale-out"): partitions = the N of the NATS server's summary
    # partition mapping (`skewd nats-auth --partitions N`); 1 = one process does everything, as
    # before. With N > 1 every `skewd controller` process is a worker: it holds the partitions
    # (and, for one of them, the leader role: cluster rules, correlation, incidents, suggestions)
    # whose KV leases it wins. lease: a holder that has not renewed for this long is presumed dead
    # and its partitions are taken over (renewed every third of it). max_partitions: most a worker
    # holds at once (0: an even share of the live workers')
    "scaleout": {"partitions": 1, "lease": "6s", "max_partitions": 0},
    "log": {"level": "info"},
    # the controller's own /metrics (empty: off); localhost unless an address is given
    "metrics": {"listen": "127.0.0.1:9466"},
    # send incidents to Prometheus Alertmanager (v2 API) when url is set (one URL or a list: every
    # member of an Alertmanager cluster, as Prometheus does); resend_interval: how often firing
    # alerts are re-sent (Prometheus' default 1m), so an alert whose sender died ends by itself
    # after 4 intervals; generator_url may hold {cluster} and {incident}
    "alertmanager": {"url": [], "resend_interval": "1m", "timeout": "10s", "generator_url": "", "labels": {}},
}
SECTIONS = {k: set(v) for k, v in DEFAULTS.items() if isinstance(v, dict) and k not in ("nats",)}


def deep_merge_nats(base: dict[str, Any], over: Mapping[str, Any]) -> dict[str, Any]:
    """nats settings replace each other whole (url vs servers must not mix)."""
    return deep_merge(base, dict(over), atomic=("nats",))


def load_config(path: str | Path | None = None, env: Mapping[str, str] | None = None,
                overrides: Mapping[str, Any] | None = None) -> ControllerConfig:
    """Read, merge (defaults < file < env < overrides) and validate. Raises :class:`ConfigError`."""
    env = os.environ if env is None else env
    problems: list[str] = []
    doc: Any = {}
    where = "<defaults>"
    pos_of: dict[tuple, Pos] = {}
    if path is not None:
        where = str(path)
        try:
            doc, pos_of, problems = read_settings(path, "controller")
        except SettingsFileError as e:
            raise ConfigError(e.problems) from None
    over: dict[str, Any] = {}
    if env.get("SKEWD_CLUSTER"):
        over["cluster"] = env["SKEWD_CLUSTER"]
    if env.get("SKEWD_CONTROLLER_ID"):
        over["controller_id"] = env["SKEWD_CONTROLLER_ID"]
    if env.get("SKEWD_RULES"):
        over["rules"] = [p for p in env["SKEWD_RULES"].split(":") if p]
    if "SKEWD_METRICS_LISTEN" in env:
        over["metrics"] = {"listen": env["SKEWD_METRICS_LISTEN"]}
    merged = deep_merge_nats(deep_merge_nats(DEFAULTS, doc), over)
    if env.get("SKEWD_NATS_URL"):
        merged["nats"] = {**(merged.get("nats") or {}), "servers": env["SKEWD_NATS_URL"]}
    merged = deep_merge_nats(merged, overrides or {})

    def pos(*keys: Any) -> str:
        for i in range(len(keys), 0, -1):
            p = pos_of.get(tuple(keys[:i]))
            if p:
                return str(p)
        return where

    for k in merged:
        if k not in DEFAULTS:
            problems.append(f"{pos(k)}: unknown key {k!r}{hint(k, DEFAULTS)}")
    for sec, allowed in SECTIONS.items():
        val = merged.get(sec)
        if not isinstance(val, dict):
            problems.append(f"{pos(sec)}: {sec} must be a mapping")
            merged[sec] = copy.deepcopy(DEFAULTS[sec])
            continue
        for k in val:
            if k not in allowed:
                problems.append(f"{pos(sec, k)}: unknown key {sec}.{k}{hint(k, allowed)}")

    def dur(value: Any, name: str, *keys: str, positive: bool = True) -> float:
        try:
            v = parse_duration(value)
            if positive and v <= 0:
                raise ValueError("must be longer than 0s")
            return v
        except ValueError as e:
            problems.append(f"{pos(*keys)}: {name}: {e}")
            return 1.0

    def num(value: Any, name: str, lo: float, hi: float, *keys: str) -> float:
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not lo <= value <= hi:
            problems.append(f"{pos(*keys)}: {name} must be a number in [{lo:g}, {hi:g}], got {value!r}")
            return lo
        return float(value)

    def strlist(value: Any, name: str, *keys: str) -> tuple[str, ...]:
        if isinstance(value, str):
            value = [value]
        if not isinstance(value, list) or not all(isinstance(x, str) for x in value):
            problems.append(f"{pos(*keys)}: {name} must be a list of strings")
            return ()
        return tuple(value)

    d = {k: dur(merged[k], k, k) for k in ("evaluation_interval", "lookback", "horizon", "warmup", "stale_after")}
    al, co, rm, cons, st, ing, so = (merged[s] for s in ("alignment", "correlation", "remap", "consumer", "state",
                                                          "ingest", "scaleout"))
    cluster = str(merged.get("cluster") or "")
    if not cluster or any(c in cluster for c in " .*>\t"):
        problems.append(f"{pos('cluster')}: cluster {cluster!r} must be non-empty without spaces, dots, '*' or '>'")
    nats_raw = dict(merged.get("nats") or {})
    if "url" in nats_raw:  # the agent's spelling: accept it here too
        nats_raw["servers"] = nats_raw.pop("url")
    try:
        nats_cfg = NatsConfig.from_dict(nats_raw)
    except NatsConfigError as e:
        problems += [f"{pos('nats')}: {line.strip()}" for line in str(e).splitlines()[1:]]
        nats_cfg = NatsConfig()
    rules = merged.get("rules")
    rules = [rules] if isinstance(rules, str) else rules
    if not isinstance(rules, list) or not all(isinstance(r, str) for r in rules):
        problems.append(f"{pos('rules')}: rules must be a list of files or directories")
        rules = []
    bucket = str(st.get("bucket", ""))
    if not bucket or not all(c.isalnum() or c in "_-" for c in bucket):
        problems.append(f"{pos('state', 'bucket')}: state.bucket {bucket!r} must be letters, digits, '_' or '-'")
    tp, pp, models = parse_topology(merged.get("topology"), pos, problems)
    level = str((merged.get("log") or {}).get("level", "info")).lower()
    if level not in ("debug", "info", "warning", "error"):
        problems.append(f"{pos('log', 'level')}: log.level must be debug, info, warning or error")
    durable = str(cons.get("durable") or f"skewd-controller-{cluster}")
    # replies under the controller's own inbox: what its NATS user may read (docs/security.md)
    nats_cfg = nats_cfg.with_default_inbox(inbox_prefix("controller", cluster))
    cfg = ControllerConfig(
        cluster=cluster,
        controller_id=str(merged.get("controller_id") or f"{socket.gethostname()}-{os.getpid()}"),
        nats=nats_cfg, rules=list(rules), **d,
        align_window=dur(al.get("window"), "alignment.window", "alignment", "window"),
        max_skew=dur(al.get("max_skew"), "alignment.max_skew", "alignment", "max_skew"),
        unsynced_clock_error=dur(al.get("unsynced_clock_error"), "alignment.unsynced_clock_error",
                                 "alignment", "unsynced_clock_error", positive=False),
        min_group_fraction=num(al.get("min_group_fraction"), "alignment.min_group_fraction", 0.0, 1.0,
                               "alignment", "min_group_fraction"),
        group_wait=dur(co.get("group_wait"), "correlation.group_wait", "correlation", "group_wait", positive=False),
        culprit_pathologies=strlist(co.get("culprit_pathologies"), "correlation.culprit_pathologies",
                                    "correlation", "culprit_pathologies"),
        never_inhibit=strlist(co.get("never_inhibit"), "correlation.never_inhibit", "correlation", "never_inhibit"),
        inhibit_rules=parse_inhibit_rules(co.get("inhibit_rules"), pos, problems),
        effect_window=dur(co.get("effect_window"), "correlation.effect_window", "correlation", "effect_window"),
        direct_evidence=parse_pathologies(co.get("direct_evidence"), "direct_evidence", pos, problems),
        loss_paths=parse_loss_paths(co.get("loss_paths"), pos, problems),
        culprit_evidence=parse_culprit_evidence(co.get("culprit_evidence"), pos, problems),
        remap_ttl=dur(rm.get("ttl"), "remap.ttl", "remap", "ttl"),
        min_confidence=num(rm.get("min_confidence"), "remap.min_confidence", 0.0, 1.0, "remap", "min_confidence"),
        concurrency_factor=num(rm.get("concurrency_factor"), "remap.concurrency_factor", 0.05, 1.0,
                               "remap", "concurrency_factor"),
        reroute_weight=num(rm.get("reroute_weight"), "remap.reroute_weight", 0.0, 1.0, "remap", "reroute_weight"),
        durable=durable.replace(".", "_"), queue=str(cons.get("queue") or durable),
        ack_wait=dur(cons.get("ack_wait"), "consumer.ack_wait", "consumer", "ack_wait"),
        batch=int(num(cons.get("batch"), "consumer.batch", 1, 4096, "consumer", "batch")),
        bucket=bucket, state_max_age=dur(st.get("max_age"), "state.max_age", "state", "max_age"),
        max_clock_skew=dur(ing.get("max_clock_skew"), "ingest.max_clock_skew", "ingest", "max_clock_skew",
                           positive=False),
        silent_intervals=num(ing.get("silent_intervals"), "ingest.silent_intervals", 2, 1e6,
                             "ingest", "silent_intervals"),
        max_nodes=int(num(ing.get("max_nodes"), "ingest.max_nodes", 1, 10_000_000, "ingest", "max_nodes")),
        summary_backlog_bytes=int(num(ing.get("summary_backlog_bytes"), "ingest.summary_backlog_bytes", 1 << 16,
                                      1 << 34, "ingest", "summary_backlog_bytes")),
        tp_groups=tp, pp_groups=pp, models=models, log_level=level, source=where,
        metrics_listen=parse_listen_address(merged["metrics"].get("listen"), pos, problems),
        alertmanager=parse_alertmanager(merged["alertmanager"], pos, dur, problems),
        partitions=int(num(so.get("partitions"), "scaleout.partitions", 1, 4096, "scaleout", "partitions")),
        lease=dur(so.get("lease"), "scaleout.lease", "scaleout", "lease"),
        max_partitions=int(num(so.get("max_partitions"), "scaleout.max_partitions", 0, 4096,
                               "scaleout", "max_partitions")),
    )
    if cfg.warmup > cfg.horizon:
        problems.append(f"{pos('warmup')}: warmup ({cfg.warmup:g}s) must not exceed horizon ({cfg.horizon:g}s)")
    if problems:
        raise ConfigError(problems)
    return cfg


# -- the schema's documentation (docs/config.md is generated from it: python -m skewd.configref) --

#: environment variable → the key it sets (after the file, before command-line overrides)
ENV_VARS: dict[str, str] = {
    "SKEWD_CLUSTER": "cluster",
    "SKEWD_CONTROLLER_ID": "controller_id",
    "SKEWD_RULES": "rules",  # ':'-separated
    "SKEWD_NATS_URL": "nats.servers",  # comma-separated
    "SKEWD_METRICS_LISTEN": "metrics.listen",  # host:port; empty: off
}

#: every key's meaning (a tuple gives the default as text where DEFAULTS cannot say it);
#: ``topology.<section>.<name>.<key>`` entries are written with ``*`` for the name
KEY_DOCS: dict[str, str | tuple[str, str]] = {
    "cluster": "the cluster this controller correlates (the subject token its agents use)",
    "controller_id": ("`<hostname>-<pid>`", "this instance's name, shown in suggestions"),
    "nats": "how to reach NATS (the `nats:` table below; `url` is accepted as for the agent)",
    "rules": ("`[shipped]`", "rule files and directories; only tp_group/cluster rules run here; `shipped` "
              "names the packs installed with skewd"),
    "evaluation_interval": "grid of evaluation times, on the summaries' clock",
    "lookback": "what a bare signal name in a rule means: its latest value within this window",
    "horizon": "how long samples, bursts and engine timelines are kept",
    "warmup": "no rule evaluation until this much summary time has been seen (at most `horizon`)",
    "stale_after": "a node without a summary this long leaves its group's alignment",
    "alignment.window": "recent collective steps the `ctl_*` signals summarise",
    "alignment.max_skew": "largest lag matched to the same step (also at most half the step period)",
    "alignment.unsynced_clock_error": "clock error assumed for a node whose clock is unsynced or unknown",
    "alignment.min_group_fraction": "a step counts for `ctl_step_missing_ratio` when this share of peers sent",
    "correlation.group_wait": "a new incident is held this long before it is published and planned (its "
                              "cause or culprit may still take it over)",
    "correlation.culprit_pathologies": "group findings that name a culprit node",
    "correlation.never_inhibit": "pathologies whose findings always stay incidents of their own",
    "correlation.effect_window": "baseline before the onset for the TTFT/ITL comparison",
    "correlation.inhibit_rules": ("the runbooks' cause → symptom pairs (docs/controller.md)",
                                  "Alertmanager-style `{source: [IDs], target: [IDs], equal: [node, entity, "
                                  "tp_group, model]}` (`model`: the model the node's TP group serves, `topology`); a list you "
                                  "set replaces the defaults"),
    "correlation.direct_evidence": ("`[NS-4, NS-5, NS-7, NS-9, EW-6]`",
                                    "node-local findings that measure a fault on their own node directly (drops, "
                                    "backlog, saturation, loss): a cross-node inference naming another node never "
                                    "hides them, and they fold that inference about their own node into their incident"),
    "correlation.loss_paths": ("`{ingress: [NS-4], egress: [NS-7], node: [EW-6]}`",
                              "which end of a lossy path: flows from several nodes losing into one node join "
                              "that node's ingress-loss incident (and the other way round); empty lists: off "
                              "(docs/controller.md)"),
    "correlation.culprit_evidence": ("one entry per shipped culprit rule",
                                     "where each culprit rule's finding holds the measurement naming its node: "
                                     "`{measure, minus, per, above, steps, min_steps, abs, negate}` (docs/controller.md); "
                                     "entries add to / replace the defaults, `<rule id>: null` drops one"),
    "ingest.max_clock_skew": "summaries and findings further than this from the controller's clock are rejected "
                             "and counted; `0s` turns the check off (recorded time through NATS)",
    "ingest.silent_intervals": "a node heard from neither by summary nor by finding for this many of its summary "
                               "intervals is silent: its open findings resolve with reason `node silent` and its "
                               "state is forgotten",
    "ingest.max_nodes": "nodes heard from at once; further new nodes are rejected (and counted) until silent "
                        "nodes make room",
    "ingest.summary_backlog_bytes": "summaries received and not yet taken in, at most (a worker's partitions share "
                                    "it); beyond it the oldest are shed and counted (rejected, `backlog_full`), so an "
                                    "overloaded intake stays seconds behind with bounded memory",
    "scaleout.partitions": "summary partitions: the N of the NATS server's `partition(N, ...)` mapping "
                           "(deploy/nats/partitions.conf); 1: one controller takes every summary; N > 1: every "
                           "controller process with this config is a worker holding partitions through KV leases",
    "scaleout.lease": "a worker (or the leader) that has not renewed its KV lease for this long is presumed dead "
                      "and its partitions are taken over (renewed every third of it)",
    "scaleout.max_partitions": "most partitions one worker holds at once (0: an even share of the live workers')",
    "metrics.listen": "the controller's `/metrics` (`host:port`, localhost unless an address is given; empty: off)",
    "alertmanager.url": ("`[]`", "Alertmanager v2 URL(s) to send incidents to (every member of an Alertmanager "
                                  "cluster); empty: off"),
    "alertmanager.resend_interval": "how often firing incidents are re-sent (an alert whose sender died ends "
                                    "after 4 intervals)",
    "alertmanager.timeout": "HTTP timeout of one post",
    "alertmanager.generator_url": "the alerts' generatorURL (may hold `{cluster}` and `{incident}`)",
    "alertmanager.labels": "labels added to every alert (e.g. `{team: inference}`)",
    "remap.ttl": "suggestions expire (status `expired`) after this",
    "remap.min_confidence": "actions below this confidence are left out; none left, no suggestion",
    "remap.concurrency_factor": "`cap_concurrency` suggests max_num_seqs × this",
    "remap.reroute_weight": "`reroute` suggests this weight for the affected group",
    "consumer.durable": ("`skewd-controller-<cluster>`", "the JetStream findings consumer, shared by replicas"),
    "consumer.queue": ("= `durable`", "queue group of the remap reply subject"),
    "consumer.ack_wait": "redelivery delay of an unacknowledged finding",
    "consumer.batch": "findings fetched per pull",
    "state.bucket": "JetStream KV bucket holding the controller's state",
    "state.max_age": "a state key not rewritten for this long expires",
    "topology.tp_groups": "TP groups by name: `{nodes: [...], model, engine}`",
    "topology.tp_groups.*.nodes": ("required", "the group's nodes in TP-rank order"),
    "topology.tp_groups.*.model": ("`\"\"`", "the model it serves"),
    "topology.tp_groups.*.engine": ("`\"\"`", "the vLLM front end serving it, `<node>/<engine>`"),
    "topology.pp_groups": "PP groups by name: `{stages: [...], model}`",
    "topology.pp_groups.*.stages": ("required", "TP group names (or single nodes), stage 0 first"),
    "topology.pp_groups.*.model": ("`\"\"`", "the model it serves"),
    "topology.models": "models by name: `{max_num_seqs, max_model_len, router, engines}`",
    "topology.models.*.max_num_seqs": ("none", "the engines' `--max-num-seqs` (for cap_concurrency)"),
    "topology.models.*.max_model_len": ("none", "the engines' `--max-model-len`"),
    "topology.models.*.router": ("`\"\"`", "the name a router knows this model's pool by (reroute target)"),
    "topology.models.*.engines": ("`[]`", "the model's engines, `<node>/<engine>`"),
    "log.level": "`debug`, `info`, `warning` or `error`",
}
