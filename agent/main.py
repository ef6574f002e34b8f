"""``skewd agent [--config FILE] [--check] [--json]``."""
from __future__ import annotations

import argparse
import asyncio
import logging
import signal
import sys

from .config import ConfigError, load_config
from .scheduler import collector_config_keys


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="skewd agent", description="Run the skewd node agent.",
        epilog="--check exit status: 0 ready; 1 the rules do not load; 2 invalid config; 3 a collector "
               "marked required: true is not active (use it as systemd ExecStartPre=).")
    p.add_argument("--config", "-c", help="agent config YAML (default: built-in defaults + SKEWD_* env)")
    p.add_argument("--check", action="store_true", help="list collectors and rules active on this host, then exit (status below)")
    p.add_argument("--json", action="store_true", help="with --check: machine-readable output")
    p.add_argument("--node", help="override the node name")
    p.add_argument("--nats", help="override nats.url")
    return p


def parse(argv: list[str]) -> argparse.Namespace:
    return build_parser().parse_args(list(argv))


def main(argv: list[str]) -> int:
    args = parse(argv)
    over: dict = {}
    if args.node:
        over["node"] = args.node
    if args.nats:
        over["nats"] = {"url": args.nats}
    try:
        cfg = load_config(args.config, overrides=over, collector_keys=collector_config_keys())
    except ConfigError as e:
        print("skewd agent: invalid config:", file=sys.stderr)
        for p in e.problems:
            print(f"  {p}", file=sys.stderr)
        return 2
    if args.check:
        from .check import run_check

        return run_check(cfg, sys.stdout, args.json)
    from skewd.rules.loader import RuleLoadError

    from .arenas import AGENT_ARENAS, bound_arenas
    from .logs import setup_logging
    from .runner import Agent

    setup_logging(cfg.log.get("level", "info"), cfg.log.get("format", "json"))
    # before the collectors' worker threads exist: each would otherwise get its own arena
    arenas = bound_arenas()
    logging.getLogger("skewd.agent").info("malloc arenas: %s", arenas if arenas != "set" else AGENT_ARENAS)
    agent = Agent(cfg)
    try:
        agent.setup()
    except RuleLoadError as e:
        print("skewd agent: rules do not load (fix them, or point rules: at other files):", file=sys.stderr)
        for i in e.issues:
            print(f"  {i}", file=sys.stderr)
        return 2

    async def _main() -> None:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, stop.set)
        await agent.run(stop)

    asyncio.run(_main())
    return 0
