"""``skewd nats-auth``: the NATS users of a secured skewd deployment, one nkey per principal,
with permissions that are exactly what the code does (docs/security.md has the threat model).

Principals and what each may do (``C`` = the cluster's subject token, ``N`` = a node's):

- **agent N** (one user per node): publish its own node's findings (into ``SKEWD_FINDINGS``),
  summaries, health and vLLM phase records; look up and create the findings stream; read
  replies under ``_INBOX.skewd.agent.C.N``. Nothing else: no other node's subjects, no
  remaps or incidents, no consumers, no KV, no inbox of anyone else.
- **controller** (one user, shared by the replicas of one cluster): read every summary, health
  and phase record of C and the ack/reject requests (queue group), answer those requests only
  (``allow_responses``), publish remaps, incidents and its own findings, own the three streams,
  its findings consumer, its ephemeral remap readers and incident follower (Alertmanager
  sink), and its KV keys ``<C>.>`` in the state bucket.
- **inference controller I**: read incidents, remaps, findings, summaries, health and phases
  of C (ordered consumers, or durable consumers named ``I-remap`` / ``I-incident`` /
  ``I-finding``), send ack/reject requests, read the controller's suggestion records
  (``<C>.remap.*`` keys only, read-only), replies under ``_INBOX.skewd.inference.C.I``.

NATS permissions in a config file cannot key on the user's name, so per-node agents get one
user each, generated here; ``--shared-agent`` instead makes one user for every agent (weaker:
a stolen agent key can speak for any node of the cluster; the controller's subject/body node
check then only stops mismatched messages). Seeds are kept across runs: re-running with more
nodes adds users without rotating the others.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable, Sequence

from skewd import wire
from skewd.natsutil import inbox_prefix

ACCOUNT = "SKEWD"
AGENT, CONTROLLER, INFERENCE = "agent", "controller", "inference"


@dataclass(frozen=True)
class ControllerNames:
    """What the controller calls its JetStream objects (from its config, so a site that renames
    the consumer or the bucket gets matching permissions)."""

    durable: str
    queue: str
    bucket: str
    kv_prefix: str  # the cluster's key prefix in the bucket (controller/state.py)

    @classmethod
    def for_cluster(cls, cluster: str, controller_config: str | None = None) -> "ControllerNames":
        from skewd.controller.config import load_config
        from skewd.controller.state import cluster_key

        cfg = load_config(controller_config, env={}, overrides={"cluster": cluster})
        return cls(durable=cfg.durable, queue=cfg.queue, bucket=cfg.bucket, kv_prefix=cluster_key(cfg.cluster))


def _streams() -> tuple[str, str, str]:
    from skewd.controller.messages import INCIDENTS_STREAM

    return wire.FINDINGS_STREAM.name, wire.REMAPS_STREAM.name, INCIDENTS_STREAM.name


def agent_permissions(cluster: str, node: str | None) -> dict[str, Any]:
    """One node's agent (``node=None``: the shared user of every agent of the cluster)."""
    c = wire.token(cluster)
    n = wire.token(node) if node is not None else "*"
    findings, _, _ = _streams()
    return {
        "publish": {"allow": [
            f"skewd.v1.finding.{c}.{n}.>", f"skewd.v1.summary.{c}.{n}", f"skewd.v1.health.{c}.{n}",
            f"skewd.v1.phase.{c}.{n}.>",
            # the publisher looks the findings stream up and creates it when missing (docs/wire.md)
            f"$JS.API.STREAM.INFO.{findings}", f"$JS.API.STREAM.CREATE.{findings}",
        ]},
        "subscribe": {"allow": [inbox_prefix(AGENT, cluster, node) + ".>" if node is not None
                                else inbox_prefix(AGENT, cluster) + ".>"]},
    }


def controller_permissions(cluster: str, names: ControllerNames) -> dict[str, Any]:
    from skewd.controller.messages import incident_subject, reply_subject

    c = wire.token(cluster)
    findings, remaps, incidents = _streams()
    kv = f"KV_{names.bucket}"
    api = "$JS.API"
    d = names.durable
    return {
        "publish": {"allow": [
            f"skewd.v1.finding.{c}.>",  # the controller's own (group-scope) findings
            wire.remap_subject(cluster), incident_subject(cluster),
            f"{api}.INFO",
            *(f"{api}.STREAM.{op}.{s}" for s in (findings, remaps, incidents, kv) for op in ("INFO", "CREATE")),
            f"{api}.STREAM.UPDATE.{remaps}", f"{api}.STREAM.UPDATE.{incidents}",
            # its findings consumer: look up, create, pull, acknowledge
            f"{api}.CONSUMER.INFO.{findings}.{d}", f"{api}.CONSUMER.CREATE.{findings}.{d}.>",
            f"{api}.CONSUMER.CREATE.{findings}.{d}", f"{api}.CONSUMER.MSG.NEXT.{findings}.{d}",
            f"$JS.ACK.{findings}.{d}.>",
            # ephemeral readers of its own remap subject (what it published before a restart)
            f"{api}.CONSUMER.CREATE.{remaps}.*.{wire.remap_subject(cluster)}",
            f"{api}.CONSUMER.MSG.NEXT.{remaps}.*", f"{api}.CONSUMER.DELETE.{remaps}.*",
            f"{api}.CONSUMER.INFO.{remaps}.*",
            # the Alertmanager sink (controller/alertmanager.py) follows the incident stream
            f"{api}.CONSUMER.CREATE.{incidents}", f"{api}.CONSUMER.INFO.{incidents}.*",
            f"{api}.CONSUMER.DELETE.{incidents}.*", f"$JS.FC.{incidents}.>",
            # its state: keys under <C>. in the bucket (put, delete, get, watch)
            f"$KV.{names.bucket}.{names.kv_prefix}.>",
            f"{api}.DIRECT.GET.{kv}.$KV.{names.bucket}.{names.kv_prefix}.>",
            f"{api}.STREAM.MSG.GET.{kv}",
            f"{api}.CONSUMER.CREATE.{kv}", f"{api}.CONSUMER.CREATE.{kv}.>", f"{api}.CONSUMER.DELETE.{kv}.*",
            f"{api}.CONSUMER.INFO.{kv}.*",
            f"$JS.FC.{kv}.>",
        ]},
        "subscribe": {"allow": [
            wire.subject_filter("summary", cluster=cluster), wire.subject_filter("health", cluster=cluster),
            f"skewd.v1.phase.{c}.>", reply_subject(cluster), inbox_prefix(CONTROLLER, cluster) + ".>",
        ]},
        # answer ack/reject requests: publish once to each requester's reply subject, nowhere else
        "allow_responses": {"max": 1, "expires": "1m"},
    }


def inference_permissions(cluster: str, name: str, names: ControllerNames) -> dict[str, Any]:
    from skewd.controller.messages import incident_subject, reply_subject

    c = wire.token(cluster)
    findings, remaps, incidents = _streams()
    kv = f"KV_{names.bucket}"
    api = "$JS.API"
    pub = [reply_subject(cluster), f"{api}.INFO"]
    for stream, kind in ((remaps, "remap"), (incidents, "incident"), (findings, "finding")):
        own = durable_name(name, kind)
        pub += [f"{api}.STREAM.INFO.{stream}",
                # ordered (ephemeral) consumers: nats-py creates them without a name in the subject,
                # and the server refuses a durable on that subject
                f"{api}.CONSUMER.CREATE.{stream}",
                # its own durable consumer, by exact name: never the controller's
                f"{api}.CONSUMER.INFO.{stream}.{own}", f"{api}.CONSUMER.CREATE.{stream}.{own}",
                f"{api}.CONSUMER.CREATE.{stream}.{own}.>", f"{api}.CONSUMER.MSG.NEXT.{stream}.{own}",
                f"$JS.ACK.{stream}.{own}.>", f"$JS.FC.{stream}.>"]
    # the controller's suggestion records, read-only (client.suggestion_record)
    pub += [f"{api}.STREAM.INFO.{kv}", f"{api}.DIRECT.GET.{kv}.$KV.{names.bucket}.{names.kv_prefix}.remap.*"]
    return {
        "publish": {"allow": pub},
        "subscribe": {"allow": [
            incident_subject(cluster), wire.remap_subject(cluster), f"skewd.v1.finding.{c}.>",
            wire.subject_filter("summary", cluster=cluster), wire.subject_filter("health", cluster=cluster),
            f"skewd.v1.phase.{c}.>", inbox_prefix(INFERENCE, cluster, name) + ".>",
        ]},
    }


def durable_name(inference_controller: str, kind: str) -> str:
    """The durable consumer ``client.subscribe(..., durable=NAME)`` creates for ``kind``."""
    return f"{inference_controller}-{kind}"


# --------------------------------------------------------------------------------------------
# keys and rendering
# --------------------------------------------------------------------------------------------

def _seed(path: Path) -> bytes:
    """The user seed in ``path``, created (mode 0600) when missing: re-runs keep identities."""
    import nkeys

    if path.exists():
        return path.read_bytes().strip()
    seed = nkeys.encode_seed(os.urandom(32), nkeys.PREFIX_BYTE_USER)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "wb") as f:
        f.write(seed + b"\n")
    return seed


def _public(seed: bytes) -> str:
    import nkeys

    return nkeys.from_seed(seed).public_key.decode()


@dataclass(frozen=True)
class User:
    """One generated principal: who it is, its seed file and its permissions."""

    role: str
    name: str  # node, inference controller name, "" for the controller / shared agent
    seed_file: Path
    public_key: str
    permissions: dict[str, Any] | None

    @property
    def label(self) -> str:
        return f"{self.role} {self.name}".strip()


def _file_stem(role: str, name: str) -> str:
    return f"{role}-{wire.token(name)}" if name else role


def generate(out: Path, cluster: str, nodes: Iterable[str], inference_controllers: Iterable[str] = (), *,
             shared_agent: bool = False, controller_config: str | None = None) -> list[User]:
    """Create (or reuse) a seed per principal under ``out`` and write ``out/skewd-auth.conf``
    (``include`` it from the server config). Returns the users, in the file's order."""
    out.mkdir(parents=True, exist_ok=True)
    names = ControllerNames.for_cluster(cluster, controller_config)
    clashes = [i for i in inference_controllers
               if names.durable in {durable_name(i, k) for k in ("remap", "incident", "finding")}]
    if clashes:
        raise ValueError(f"inference controller name(s) {clashes} would own the controller's consumer {names.durable!r}")
    plan: list[tuple[str, str, dict[str, Any] | None]] = []
    plan.append((CONTROLLER, "", controller_permissions(cluster, names)))
    if shared_agent:
        plan.append((AGENT, "", agent_permissions(cluster, None)))
    else:
        plan += [(AGENT, n, agent_permissions(cluster, n)) for n in dict.fromkeys(nodes)]
    plan += [(INFERENCE, i, inference_permissions(cluster, i, names)) for i in dict.fromkeys(inference_controllers)]
    users = []
    for role, name, perms in plan:
        seed_file = out / f"{_file_stem(role, name)}.nk"
        users.append(User(role, name, seed_file, _public(_seed(seed_file)), perms))
    sys_seed = out / "sys.nk"
    sys_user = User("sys", "", sys_seed, _public(_seed(sys_seed)), None)
    (out / "skewd-auth.conf").write_text(render(cluster, users, sys_user))
    return users + [sys_user]


def render(cluster: str, users: Sequence[User], sys_user: User) -> str:
    """NATS server config text: the skewd account with one nkey user per principal, and a
    system account for monitoring."""
    lines = [f"# skewd users for cluster {cluster!r}: generated by `skewd nats-auth`; re-run it to add",
             "# nodes (existing seeds are kept). Include this file from the server config.",
             "accounts {", f"  {ACCOUNT} {{", "    jetstream: enabled", "    users: ["]
    for u in users:
        lines.append(f"      # {u.label} (seed: {u.seed_file.name})")
        lines.append(f"      {{nkey: {json.dumps(u.public_key)}, permissions: {json.dumps(u.permissions)}}}")
    lines += ["    ]", "  }",
              f"  SYS {{ users: [ {{nkey: {json.dumps(sys_user.public_key)}}} ] }}  # seed: {sys_user.seed_file.name}",
              "}", "system_account: SYS", ""]
    return "\n".join(lines)


# --------------------------------------------------------------------------------------------
# CLI
# --------------------------------------------------------------------------------------------

def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="skewd nats-auth",
        description="Generate the NATS users (nkeys) and per-role permissions of a secured skewd "
                    "deployment: writes OUT/skewd-auth.conf (include it from deploy/nats/nats-cluster.conf) "
                    "and one seed file per principal. See docs/security.md.")
    p.add_argument("--cluster", required=True, help="the skewd cluster name (agents' and controller's `cluster`)")
    p.add_argument("--node", action="append", default=[], help="an agent node name (repeat), as the agent's `node`")
    p.add_argument("--nodes-file", help="a file with one node name per line")
    p.add_argument("--inference-controller", action="append", default=[], metavar="NAME",
                   help="an inference controller (repeat); its durable consumers are NAME-remap, NAME-incident, NAME-finding")
    p.add_argument("--shared-agent", action="store_true",
                   help="one user for all agents instead of one per node (weaker; see docs/security.md)")
    p.add_argument("--controller-config", help="the controller's YAML config, for its consumer and bucket names")
    p.add_argument("--out", required=True, help="directory for skewd-auth.conf and the seed files")
    return p


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(list(argv or []))
    nodes = list(args.node)
    if args.nodes_file:
        try:
            text = Path(args.nodes_file).read_text()
        except OSError as e:
            print(f"skewd nats-auth: --nodes-file: {e}", file=sys.stderr)
            return 2
        nodes += [ln.strip() for ln in text.splitlines() if ln.strip() and not ln.lstrip().startswith("#")]
    if not nodes and not args.shared_agent:
        print("skewd nats-auth: name the agent nodes (--node / --nodes-file) or use --shared-agent", file=sys.stderr)
        return 2
    from skewd.controller.config import ConfigError

    try:
        users = generate(Path(args.out), args.cluster, nodes, args.inference_controller,
                         shared_agent=args.shared_agent, controller_config=args.controller_config)
    except ConfigError as e:  # the cluster name or the controller config: the controller would refuse it too
        for problem in e.problems:
            print(f"skewd nats-auth: {problem}", file=sys.stderr)
        return 1
    except (ValueError, OSError) as e:
        print(f"skewd nats-auth: {e}", file=sys.stderr)
        return 1
    print(f"wrote {Path(args.out) / 'skewd-auth.conf'}; copy each seed only to the host that uses it:")
    for u in users:
        where = {AGENT: f"node {u.name}" if u.name else "every agent node", CONTROLLER: "the controller",
                 INFERENCE: f"inference controller {u.name}", "sys": "operators (nats CLI, system account)"}[u.role]
        print(f"  {u.seed_file.name:40} → {where}  (nats.nkey_seed_file)")
    print("agents and the controller pick their reply inbox prefix themselves; an inference controller connects "
          "with inbox_prefix=skewd.natsutil.inbox_prefix('inference', CLUSTER, NAME) (docs/client.md)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
