"""``skewd controller [--config FILE] [--check]``: run the controller for one cluster.

Exit codes: 0 clean stop, 1 config or rule errors (every problem printed with file:line:col),
2 NATS refused us (credentials / TLS: the message names the setting to fix), 3 NATS
unreachable at start (after retrying for 30 s).
"""
from __future__ import annotations

import argparse
import asyncio
import logging
import signal
import sys
from typing import Sequence


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="skewd controller",
                                description="Correlate node findings and summaries across a cluster; publish "
                                            "incidents and remap suggestions.")
    p.add_argument("--config", "-c", help="controller YAML config (default: built-in defaults + environment)")
    p.add_argument("--check", action="store_true",
                   help="validate config and rules, print what would run, and exit")
    p.add_argument("--log-level", choices=("debug", "info", "warning", "error"))
    return p


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(list(argv or []))
    from skewd.catalogue import full_catalogue
    from skewd.model import GROUP_SCOPES
    from skewd.natsutil import NatsAuthError, NatsConfigError, NatsTLSError, NatsUnavailableError
    from skewd.rules.cli import PACKS
    from skewd.rules.loader import RuleLoadError
    from skewd.rules.reload import RuleManager

    from .config import ConfigError, load_config

    try:
        cfg = load_config(args.config)
    except ConfigError as e:
        for p in e.problems:
            print(p, file=sys.stderr)
        return 1
    logging.basicConfig(level=(args.log_level or cfg.log_level).upper(),
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s", stream=sys.stderr)
    catalogue = full_catalogue()
    try:
        ruleset = RuleManager(cfg.rules or [str(PACKS)], catalogue).load_initial()
    except RuleLoadError as e:
        for i in e.issues:
            print(i, file=sys.stderr)
        return 1
    group_rules = [r for r in ruleset.rules if r.scope in GROUP_SCOPES]
    if args.check:
        print(f"cluster {cfg.cluster}; controller id {cfg.controller_id}; NATS {', '.join(cfg.nats.servers)}")
        print(f"{len(group_rules)} group-scope rules of {len(ruleset.rules)} loaded from "
              f"{', '.join(cfg.rules or [str(PACKS)])}")
        am = cfg.alertmanager
        print(f"metrics {'http://' + cfg.metrics_listen + '/metrics' if cfg.metrics_listen else 'off'}; "
              f"alertmanager {', '.join(am.urls) + f' (resend every {am.resend_interval:g}s)' if am else 'off'}")
        from .culprit import coverage

        named = coverage(group_rules, cfg.culprit_pathologies, cfg.culprit_evidence)
        for r in group_rules:
            print(f"  {r.id:40} {r.pathology:7} {r.scope.value:9} {r.maturity:10} requires {', '.join(r.requires) or '-'}")
            if r.id in named:
                print(f"    culprit evidence: {named[r.id]}")
        for g in cfg.tp_groups.values():
            print(f"  tp group {g.name}: {', '.join(g.nodes)}" + (f" (model {g.model})" if g.model else ""))
        for p in cfg.pp_groups.values():
            print(f"  pp group {p.name}: {' -> '.join(p.stages)}")
        return 0
    from .service import Controller

    ctl = Controller(cfg, catalogue=catalogue, ruleset=ruleset)

    async def run() -> None:
        loop = asyncio.get_running_loop()
        stop = asyncio.Event()
        for sig in (signal.SIGINT, signal.SIGTERM):
            try:
                loop.add_signal_handler(sig, stop.set)
            except (NotImplementedError, RuntimeError):
                pass
        await ctl.start()
        sink, server = await start_edges(ctl)
        try:
            await stop.wait()
        finally:
            await stop_edges(sink, server)
            await ctl.stop()

    try:
        asyncio.run(run())
    except (NatsAuthError, NatsTLSError, NatsConfigError) as e:
        print(f"skewd controller: {e}", file=sys.stderr)
        return 2
    except NatsUnavailableError as e:
        print(f"skewd controller: {e}", file=sys.stderr)
        return 3
    except KeyboardInterrupt:
        pass
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))


async def start_edges(ctl) -> tuple:
    """What ``skewd controller`` runs beside a started controller: the Alertmanager sink (when
    ``alertmanager.url`` is set) and the ``/metrics`` endpoint (``metrics.listen``)."""
    from .metrics import serve

    sink = None
    if ctl.cfg.alertmanager is not None:
        from .alertmanager import AlertmanagerSink

        sink = AlertmanagerSink(ctl.cfg.alertmanager, ctl.cfg.cluster)
        await sink.start(ctl.nc)
    return sink, serve(ctl, ctl.cfg.metrics_listen, sink)


async def stop_edges(sink, server) -> None:
    if server is not None:
        server.shutdown()
        server.server_close()
    if sink is not None:
        await sink.stop()


async def run_embedded(*, url: str, cluster: str, state_dir, stop: asyncio.Event,
                       topology: dict | None = None, rules: list[str] | None = None, ready: asyncio.Event | None = None,
                       on_start=None, recorded_time: bool = False) -> None:
    """Run a controller inside another program's event loop (``skewd up``, ``skewd demo``)
    until ``stop`` is set. State lives in the NATS server's JetStream, as in production.
    ``recorded_time``: the agents send simulated or recorded times (``skewd demo``), so the
    clock check against this machine's clock (``ingest.max_clock_skew``) is off."""
    from .config import load_config
    from .service import Controller

    over: dict = {"cluster": cluster, "nats": {"url": url}}
    if topology:
        over["topology"] = topology
    if rules:
        over["rules"] = rules
    if recorded_time:
        over["ingest"] = {"max_clock_skew": "0s"}
    cfg = load_config(None, env={}, overrides=over)
    ctl = Controller(cfg)
    await ctl.start()
    if on_start is not None:
        on_start(ctl)
    if ready is not None:
        ready.set()
    try:
        await stop.wait()
    finally:
        await ctl.stop()
