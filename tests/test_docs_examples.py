"""Every example in the README and the docs works as shown.

Each fenced block of README.md, docs/*.md, CONTRIBUTING.md and collectors/*/README.md is
checked by what it is:

- YAML rule files (``rules:``, or a list of rules) are linted against the catalogue; site
  override files are linted after the shipped packs, as they are loaded;
- YAML rule unit tests (``rule_files:``) are run;
- YAML agent and controller configs (or sections of one) are loaded through the config
  loaders, collector settings included; exporter mapping files through the mapping loader;
- JSON is parsed, and wire messages (``"kind": ...``) are decoded with ``skewd.wire``;
- Python is compiled;
- every ``skewd ...`` command line is parsed by the CLI's own argparse parsers (usage lines
  with ``[optional]`` parts and ``a|b`` choices too), and the cheap ones (rules lint / test /
  explain / coverage / schema, signals, demo --list, agent --check) are run and must exit 0.
  A relative path on a command line is a path in this repository and must exist.
"""
from __future__ import annotations

import json
import re
import shlex
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[1]
DOCS = sorted([ROOT / "README.md", ROOT / "CONTRIBUTING.md", *(ROOT / "docs").glob("*.md"),
               *(ROOT / "collectors").glob("*/README.md")])


@dataclass
class Block:
    file: Path
    line: int
    lang: str
    text: str

    @property
    def where(self) -> str:
        return f"{self.file.relative_to(ROOT)}:{self.line}"


def blocks() -> list[Block]:
    out = []
    for f in DOCS:
        lines = f.read_text().splitlines()
        i = 0
        while i < len(lines):
            m = re.match(r"^```(\w*)\s*$", lines[i])
            if not m:
                i += 1
                continue
            j = i + 1
            while j < len(lines) and not lines[j].startswith("```"):
                j += 1
            out.append(Block(f, i + 2, m.group(1).lower(), "\n".join(lines[i + 1:j]) + "\n"))
            i = j + 1
    return out


BLOCKS = blocks()


def _ids(bs: list[Block]) -> list[str]:
    return [b.where for b in bs]


# -- YAML ------------------------------------------------------------------------------------------

def _yaml_kind(doc: object, text: str) -> str:
    from skewd.agent.config import DEFAULTS as AGENT
    from skewd.controller.config import DEFAULTS as CONTROLLER

    if isinstance(doc, list) and doc and all(isinstance(r, dict) and "id" in r for r in doc):
        return "rules"
    if not isinstance(doc, dict):
        return "unknown"
    if {"source", "confirmed"} <= set(doc):
        return "mapping"
    if "rule_files" in doc:
        return "rule_test"
    if "rules" in doc and isinstance(doc["rules"], list) and ("required_engine_version" in doc or
                                                              all(isinstance(r, dict) and "id" in r
                                                                  for r in doc["rules"])):
        return "rules"
    if set(doc) <= set(AGENT):
        return "agent"
    if set(doc) <= set(CONTROLLER):
        return "controller"
    return "unknown"


YAML_BLOCKS = [b for b in BLOCKS if b.lang in ("yaml", "yml")]


def test_there_are_examples_of_every_kind():
    kinds = {_yaml_kind(yaml.safe_load(b.text), b.text) for b in YAML_BLOCKS}
    assert {"rules", "rule_test", "agent", "controller", "mapping"} <= kinds
    assert len(_commands()) >= 20


@pytest.mark.parametrize("block", YAML_BLOCKS, ids=_ids(YAML_BLOCKS))
def test_yaml_example(block: Block, tmp_path: Path):
    doc = yaml.safe_load(block.text)
    kind = _yaml_kind(doc, block.text)
    assert kind != "unknown", f"{block.where}: a YAML example of no known kind (rule file, rule test, " \
                              f"agent/controller config, exporter mapping)"
    {"rules": _check_rules, "rule_test": _check_rule_test, "agent": _check_agent_config,
     "controller": _check_controller_config, "mapping": _check_mapping}[kind](block, doc, tmp_path)


def _check_rules(block: Block, doc: object, tmp_path: Path) -> None:
    from skewd.catalogue import full_catalogue
    from skewd.rules.loader import load_rules
    from skewd.rules.paths import PACKS

    text = block.text
    if isinstance(doc, list):  # a fragment: the rules of a file
        text = "required_engine_version: 1\nrules:\n" + "".join(f"  {line}\n" for line in block.text.splitlines())
        doc = yaml.safe_load(text)
    f = tmp_path / "example.yaml"
    f.write_text(text)
    overrides = any("override" in r or set(r) <= {"id", "enabled"} for r in doc["rules"])
    res = load_rules([PACKS, f] if overrides else [f], full_catalogue())
    assert res.ok, f"{block.where}:\n" + "\n".join(str(i) for i in res.issues)


def _check_rule_test(block: Block, doc: object, tmp_path: Path) -> None:
    """Run it where its relative rule_files resolve as in the repository (rules/tests/)."""
    from skewd.catalogue import full_catalogue
    from skewd.rules.paths import PACKS
    from skewd.rules.testing import run_tests

    (tmp_path / "packs").symlink_to(PACKS)
    (tmp_path / "tests").mkdir()
    f = tmp_path / "tests" / "example.test.yaml"
    f.write_text(block.text)
    run = run_tests([f], full_catalogue())
    problems = [str(i) for i in run.issues] + [f"{r.name}: {r.failures}" for r in run.results if not r.ok]
    assert run.ok and run.results and not problems, f"{block.where}:\n" + "\n".join(problems)


def _check_agent_config(block: Block, doc: object, tmp_path: Path) -> None:
    from skewd.agent.config import ConfigError, load_config
    from skewd.agent.scheduler import collector_config_keys

    f = tmp_path / "agent.yaml"
    f.write_text(block.text)
    try:
        load_config(f, env={}, collector_keys=collector_config_keys())
    except ConfigError as e:
        pytest.fail(f"{block.where}: the agent config loader refuses it:\n" + "\n".join(e.problems))


def _check_controller_config(block: Block, doc: object, tmp_path: Path) -> None:
    from skewd.controller.config import ConfigError, load_config

    f = tmp_path / "controller.yaml"
    f.write_text(block.text)
    try:
        load_config(f, env={})
    except ConfigError as e:
        pytest.fail(f"{block.where}: the controller config loader refuses it:\n" + "\n".join(e.problems))


def _check_mapping(block: Block, doc: object, tmp_path: Path) -> None:
    from skewd.collectors.exporter.collector import known_signals
    from skewd.collectors.exporter.mapping import loads

    loads(block.text, known_signals(), block.where)


# -- JSON, Python ----------------------------------------------------------------------------------

JSON_BLOCKS = [b for b in BLOCKS if b.lang == "json"]
PY_BLOCKS = [b for b in BLOCKS if b.lang == "python"]


@pytest.mark.parametrize("block", JSON_BLOCKS, ids=_ids(JSON_BLOCKS))
def test_json_example(block: Block):
    from skewd import wire

    doc = json.loads(block.text)
    if isinstance(doc, dict) and doc.get("kind") in ("summary", "health", "finding"):
        wire.decode(block.text)


@pytest.mark.parametrize("block", PY_BLOCKS, ids=_ids(PY_BLOCKS))
def test_python_example_compiles(block: Block):
    compile(block.text, block.where, "exec")


# -- commands --------------------------------------------------------------------------------------

def _commands() -> list[tuple[str, list[str]]]:
    """(where, argv) of every ``skewd`` command line in a plain or shell block."""
    out = []
    for b in BLOCKS:
        if b.lang not in ("", "sh", "shell", "console", "bash"):
            continue
        lines = b.text.splitlines()
        for n, line in enumerate(lines):
            s = line.strip()
            if s.startswith("$ "):
                s = s[2:]
            if not s.startswith("skewd "):
                continue
            k = n + 1  # a usage line continues on indented lines
            while k < len(lines) and lines[k].startswith(" ") and lines[k].strip().startswith("["):
                s += " " + lines[k].strip()
                k += 1
            out.append((f"{b.where}+{n}", _argv(s)))
    return out


def _argv(line: str) -> list[str]:
    """A command line as the docs write it → argv: comments dropped; in usage lines ``[x]`` is
    kept as ``x``, ``a|b`` is ``a`` and ``X...`` is ``X``."""
    line = re.sub(r"\s+#.*$", "", line)
    words = []
    for w in shlex.split(line.replace("[", " ").replace("]", " "))[1:]:
        if w == "...":
            continue
        w = w[:-3] if w.endswith("...") else w
        words.append(w.split("|")[0] if "|" in w and not w.startswith("-") else w)
    return words


COMMANDS = _commands()
#: commands cheap enough to run here: (subcommand, sub-subcommand or required flag)
CHEAP = {("rules", "lint"), ("rules", "test"), ("rules", "explain"), ("rules", "coverage"), ("rules", "schema"),
         ("signals", None), ("demo", "--list"), ("agent", "--check")}


def _cheap(argv: list[str]) -> bool:
    head = argv[0]
    return any(c == head and (arg is None or arg in argv[1:2] or (arg.startswith("--") and arg in argv))
               for c, arg in CHEAP)


@pytest.mark.parametrize("where,argv", COMMANDS, ids=[w for w, _ in COMMANDS])
def test_command_example(where: str, argv: list[str], capsys, monkeypatch):
    from skewd.cli import main, parse_command

    try:
        parse_command(argv)
    except SystemExit as e:
        pytest.fail(f"{where}: `skewd {' '.join(argv)}` does not parse ({capsys.readouterr().err.strip()}; exit {e})")
    if not _cheap(argv):
        return
    paths = [a for a in argv[1:] if not a.startswith("-") and ("/" in a or a.endswith((".yaml", ".yml")))]
    for p in paths:
        if not p.startswith("/"):
            assert (ROOT / p).exists(), f"{where}: `skewd {' '.join(argv)}` names {p}, which does not exist"
    if any(p.startswith("/") and not Path(p).exists() for p in paths):
        return  # an operator's path (/etc/skewd/...): parsing is what can be checked here
    key = tuple(argv)
    if key not in _RAN:  # the same command shown in two places runs once
        monkeypatch.chdir(ROOT)
        rc = main(argv)
        out = capsys.readouterr()
        _RAN[key] = (rc, out.out[-2000:] + out.err[-2000:])
    rc, text = _RAN[key]
    assert rc == 0, f"{where}: `skewd {' '.join(argv)}` exited {rc}:\n{text}"


_RAN: dict[tuple[str, ...], tuple[int, str]] = {}


def test_deploy_agent_config_loads_and_its_rules_lint_with_the_example_site_file(tmp_path: Path):
    """deploy/systemd/agent.yaml names `shipped` plus /etc/skewd/site-rules.yaml: with the
    shipped example in that place, the config loads and its rules load."""
    from skewd.agent.config import load_config
    from skewd.agent.scheduler import collector_config_keys
    from skewd.catalogue import full_catalogue
    from skewd.rules.loader import load_rules

    cfg = load_config(ROOT / "deploy" / "systemd" / "agent.yaml", env={}, collector_keys=collector_config_keys())
    assert cfg.rules[0] == "shipped"
    site = str(ROOT / "deploy" / "site-rules.example.yaml")
    rules = [site if r == "/etc/skewd/site-rules.yaml" else r for r in cfg.rules]
    assert site in rules
    res = load_rules(rules, full_catalogue())
    assert res.ok, [str(i) for i in res.issues]
    assert not res.ruleset.by_id()["PCIE-7-pinned-memory-shortage"].enabled
