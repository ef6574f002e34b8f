"""Hostile rule files: a clean error with file:line and bounded memory, never a traceback.

The files are the ``*.bad.yaml`` cases beside this test (billion laughs, 500-deep nesting, an
anchor inside itself, numbers and durations out of range). ``skewd rules lint`` runs them in a
subprocess whose peak RSS is compared with linting a good file, and a hot reload of each keeps
the running rules at a bounded allocation.
"""
from __future__ import annotations

import os
import resource
import sys
import tracemalloc

import pytest

from skewd.rules.limits import RuleLimits
from skewd.rules.loader import load_rules
from skewd.rules.reload import RuleManager
from skewd.rules.yamlpos import YamlLimitError, YamlLimits, load

from ..peak_rss import cli_argv, peak_kib
from .conftest import DATA
from .test_engine import make, run

HOSTILE = ["billion-laughs.bad.yaml", "deep-nesting.bad.yaml", "self-anchor.bad.yaml", "huge-numbers.bad.yaml"]
#: peak RSS a lint of a hostile file may add over a lint of a good one. Before the budgets the
#: billion laughs grew by gigabytes (3 GB in 40 s); parsing 600 bytes needs a few MiB at most.
RSS_GROWTH_BOUND_KB = 24 * 1024
#: a hard address-space cap on the child, so a regression fails the test instead of the machine
CHILD_AS_LIMIT = 3 << 30


def _lint(path: str) -> tuple[int, str, int]:
    """Run lint in a child that reports its own peak RSS (VmHWM; see tests/peak_rss.py)."""
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # child: cap memory, exec the CLI with stdout into the pipe
        try:
            os.close(r)
            os.dup2(w, 1)
            os.dup2(w, 2)
            resource.setrlimit(resource.RLIMIT_AS, (CHILD_AS_LIMIT, CHILD_AS_LIMIT))
            os.execv(sys.executable, cli_argv("rules", "lint", path))
        finally:
            os._exit(127)
    os.close(w)
    chunks = []
    with os.fdopen(r, "rb") as f:
        for chunk in iter(lambda: f.read(65536), b""):
            chunks.append(chunk)
    _, status = os.waitpid(pid, 0)
    out = b"".join(chunks).decode(errors="replace")
    return os.waitstatus_to_exitcode(status), out, peak_kib(out)


GOOD = """required_engine_version: 1
rules:
  - id: KV
    pathology: GPU-2
    scope: engine
    layer: engine
    expr: avg(vllm_kv_cache_usage_ratio, 1m) > 0.9
"""


@pytest.fixture(scope="module")
def baseline_rss(tmp_path_factory) -> int:
    good = tmp_path_factory.mktemp("good") / "good.yaml"
    good.write_text(GOOD)
    rc, out, rss = _lint(str(good))
    assert rc == 0, out
    return rss


@pytest.mark.parametrize("name", HOSTILE)
def test_lint_of_a_hostile_file_is_a_clean_error_in_bounded_memory(name, baseline_rss):
    path = str(DATA / name)
    rc, out, rss = _lint(path)
    assert rc == 1, out
    assert "Traceback" not in out and "Error:" not in out.split("\n")[0], out
    lines = [ln for ln in out.splitlines() if ": E0" in ln]
    assert lines and all(ln.startswith(f"{path}:") for ln in lines), out
    assert any(" E019 " in ln or " E020 " in ln for ln in lines), out
    assert rss - baseline_rss < RSS_GROWTH_BOUND_KB, f"peak RSS {rss} KiB vs {baseline_rss} KiB for a good file"


@pytest.mark.parametrize("name", HOSTILE[:3])
def test_hot_reload_of_a_hostile_file_keeps_the_old_rules_in_bounded_memory(cat, tmp_path, name):
    f, store, eng = make(cat, tmp_path, for_="0s")
    mgr = RuleManager([f], cat)
    before = eng.rules
    assert run(eng, store, [{"gpu0": 0.9}]) == [(0.0, "HOT", "gpu0", "firing")]
    f.write_text((DATA / name).read_text())
    tracemalloc.start()
    try:
        res = mgr.reload(eng)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert not res.ok and res.issues[0].code.value == "E019" and res.issues[0].pos.file == str(f)
    assert peak < 8 << 20, f"reload allocated {peak} bytes at its peak"
    assert eng.rules is before  # the old rules keep evaluating, with their state
    assert run(eng, store, [{"gpu0": 0.1}], start=1) == [(1.0, "HOT", "gpu0", "resolved")]


def test_aliases_within_the_budget_still_load_and_share_their_value():
    text = "base: &b {x: 1, y: [1, 2]}\nuse: [*b, *b, *b]\n"
    doc, dupes = load(text, "f.yaml")
    assert not dupes and doc["use"][0] == {"x": 1, "y": [1, 2]} and doc["use"][0] is doc["base"]
    assert doc["use"][2].pos.line == 1  # an alias points at where its value was written


def test_budgets_are_configurable_and_name_their_key(cat, tmp_path):
    deep = str(DATA / "deep-nesting.bad.yaml")
    res = load_rules([deep], cat, limits=RuleLimits(yaml_depth=600))
    assert all(i.code.value != "E019" for i in res.issues)  # deep is allowed now; other errors remain
    res = load_rules([deep], cat)
    assert "rule_limits.yaml_depth" in res.issues[0].message
    with pytest.raises(YamlLimitError) as e:
        load("a: " + "x" * 100, "f.yaml", YamlLimits(max_bytes=50))
    assert e.value.limit == "bytes"
    big = tmp_path / "big.yaml"
    big.write_text("required_engine_version: 1\n# " + "x" * 2000 + "\n")
    res = load_rules([big], cat, limits=RuleLimits(file_bytes=1000))
    assert [(i.code.value, i.pos.line) for i in res.issues] == [("E019", 1)]


def test_limits_from_config_reject_bad_values():
    lim, problems = RuleLimits.from_mapping({"yaml_depth": 10, "max_duration": "30d"})
    assert lim.yaml_depth == 10 and lim.max_duration == 30 * 86400 and not problems
    _, problems = RuleLimits.from_mapping({"yaml_deep": 1, "rules": 0, "max_duration": "soon"})
    assert len(problems) == 3 and "yaml_deep" in problems[0]


def test_macro_expansion_bomb_is_stopped(cat, tmp_path):
    lines = ["required_engine_version: 1", "macros:", "  - name: m0", "    expr: gpu_util_ratio > 0.5"]
    for i in range(1, 9):  # each macro names the previous one ten times: 10**8 nodes if expanded
        lines += [f"  - name: m{i}", "    expr: " + " and ".join([f"m{i - 1}"] * 10)]
    lines += ["rules:", "  - id: BOMB", "    pathology: GPU-1", "    scope: gpu", "    layer: gpu", "    expr: m8"]
    f = tmp_path / "bomb.yaml"
    f.write_text("\n".join(lines) + "\n")
    res = load_rules([f], cat)
    assert [(i.code.value, i.pos.line) for i in res.issues] == [("E019", 26)]
    assert "rule_limits.expr_nodes" in res.issues[0].message
