"""Loader: every error at once, each with file:line:col and a code; overrides; hot reload."""
from __future__ import annotations

import re
from pathlib import Path

import pytest

from skewd.rules.loader import load_rules
from skewd.rules.codes import Code

from .conftest import DATA


def expected_errors(path: Path) -> list[tuple[int, str]]:
    out = []
    for n, line in enumerate(path.read_text().splitlines(), 1):
        m = re.search(r"# expect: (E\d{3})", line)
        if m:
            out.append((n, m.group(1)))
    return out


def test_good_file_loads_every_rule(cat):
    res = load_rules([DATA / "example.good.yaml"], cat)
    assert res.ok, [str(i) for i in res.issues]
    ids = [r.id for r in res.ruleset.rules]
    assert ids == ["EX-1-starved-feed", "EX-2-kv", "EX-3-retrans", "EX-4-straggler", "EX-5-rdma", "EX-6-gaps",
                   "EX-7-backlog"]
    r = res.ruleset.by_id()["EX-1-starved-feed"]
    assert r.for_s == 10 and r.keep_firing_for_s == 5 and r.maturity == "incubating"
    assert set(r.requires) == {"pcie_rx_bytes_total", "gpu_util_ratio"}


@pytest.mark.parametrize("bad", sorted(DATA.glob("*.bad.yaml")), ids=lambda p: p.name)
def test_bad_file_reports_every_error_at_its_line(cat, bad):
    res = load_rules([bad], cat)
    got = sorted((i.pos.line, i.code.value) for i in res.issues)
    assert got == sorted(expected_errors(bad)), "\n".join(map(str, res.issues))
    assert all(i.pos.file == str(bad) for i in res.issues)


def test_error_columns_point_into_the_expression(cat):
    res = load_rules([DATA / "errors.bad.yaml"], cat)
    by_rule = {i.rule_id: i for i in res.issues}
    text = (DATA / "errors.bad.yaml").read_text().splitlines()
    # the column of an uncatalogued signal is where its name starts on that line
    i = by_rule["BAD-3"]
    assert text[i.pos.line - 1][i.pos.col - 1:].startswith("vllm_kv_cache_usage_perc")
    i = by_rule["BAD-8"]
    assert text[i.pos.line - 1][i.pos.col - 1:].startswith("kv_hihg")
    i = by_rule["BAD-5"]
    assert text[i.pos.line - 1][i.pos.col - 1:].startswith("avgg(")


def test_block_scalar_expression_error_position(cat, tmp_path):
    f = tmp_path / "r.yaml"
    f.write_text("required_engine_version: 1\nrules:\n  - id: R\n    pathology: GPU-2\n    scope: engine\n"
                 "    layer: engine\n    expr: |\n      avg(vllm_kv_cache_usage_ratio, 1m) > 0.5\n"
                 "        and nosuch_thing > 1\n")
    res = load_rules([f], cat)
    [i] = res.issues
    assert (i.pos.line, i.pos.col) == (9, 13)
    assert i.code is Code.UNKNOWN_PARAM


def test_typo_in_top_level_and_missing_version(cat, tmp_path):
    f = tmp_path / "r.yaml"
    f.write_text("rulez: []\n")
    res = load_rules([f], cat)
    codes = sorted(i.code.value for i in res.issues)
    assert codes == ["E002", "E003"]
    assert "did you mean rules?" in str(res.issues[0]) + str(res.issues[1])


def test_newer_engine_version_is_refused(cat, tmp_path):
    f = tmp_path / "r.yaml"
    f.write_text("required_engine_version: 99\nrules: []\n")
    [i] = load_rules([f], cat).issues
    assert i.code is Code.ENGINE_VERSION and (i.pos.line, i.pos.col) == (1, 26)


def test_yaml_syntax_error_position(cat, tmp_path):
    f = tmp_path / "r.yaml"
    f.write_text("required_engine_version: 1\nrules:\n  - id: [unclosed\n")
    [i] = load_rules([f], cat).issues
    assert i.code is Code.YAML_SYNTAX and i.pos.line >= 3


def test_duplicate_yaml_key_is_an_error(cat, tmp_path):
    f = tmp_path / "r.yaml"
    f.write_text("required_engine_version: 1\nrules:\n  - id: R\n    id: S\n")
    issues = load_rules([f], cat).issues
    assert any(i.code is Code.YAML_SYNTAX and i.pos.line == 4 and "duplicate key" in i.message for i in issues)


def test_site_override_tunes_params_and_appends_expr(cat, tmp_path):
    site = tmp_path / "site.yaml"
    site.write_text(
        "required_engine_version: 1\nrules:\n"
        "  - id: EX-2-kv\n    override: {params: replace, expr: append, severity: replace}\n"
        "    params: {kv_high: 0.97}\n    expr: vllm_num_requests_waiting > 5\n    severity: critical\n"
        "  - id: EX-3-retrans\n    enabled: false\n")
    res = load_rules([DATA / "example.good.yaml", site], cat)
    assert res.ok, [str(i) for i in res.issues]
    r = res.ruleset.by_id()["EX-2-kv"]
    assert r.params["kv_high"] == 0.97 and r.severity.value == "critical"
    assert "vllm_num_requests_waiting > 5" in r.expr and r.expr.startswith("(")
    assert res.ruleset.by_id()["EX-3-retrans"].enabled is False


def test_override_errors_point_at_the_site_file(cat, tmp_path):
    site = tmp_path / "site.yaml"
    site.write_text(
        "required_engine_version: 1\nrules:\n"
        "  - id: EX-2-kv\n    override: {params: replace}\n    params: {kv_hihg: 0.97}\n"
        "  - id: NOPE\n    override: {severity: replace}\n    severity: info\n"
        "  - id: EX-2-kv\n    override: {expr: append}\n    expr: vllm_num_requests_waiting >\n")
    res = load_rules([DATA / "example.good.yaml", site], cat)
    got = sorted((i.pos.file == str(site), i.pos.line, i.code.value) for i in res.issues)
    assert got == [(True, 5, "E010"), (True, 6, "E014"), (True, 11, "E006")]


def test_directory_loads_in_sorted_order_and_skips_tests(cat, tmp_path):
    (tmp_path / "b.yaml").write_text((DATA / "example.good.yaml").read_text())
    (tmp_path / "a.test.yaml").write_text("not: a rule file\n")
    res = load_rules([tmp_path], cat)
    assert res.ok and len(res.ruleset.rules) == 7


def test_unreadable_path_is_reported(cat, tmp_path):
    res = load_rules([tmp_path / "missing.yaml"], cat)
    [i] = res.issues
    assert i.code is Code.IO and "missing.yaml" in str(i)


STRING_PARAMS = """\
required_engine_version: 1
rules:
  - id: PORT-RX
    pathology: custom-port-rx
    scope: rdma_port
    layer: network
    params: {{port: {port}, window: {window}, limit: 0}}
    expr: entity == port and rate(rdma_port_xmit_bytes_total, window) > limit
"""


def test_string_params_are_strings_and_durations_where_used_as_one(cat, tmp_path):
    from skewd.model import BatchBuilder
    from skewd.rules.engine import Engine
    from skewd.rules.store import WindowStore

    f = tmp_path / "r.yaml"
    f.write_text(STRING_PARAMS.format(port="mlx5_1/1", window="30s"))
    res = load_rules([f], cat)
    assert res.ok, [str(i) for i in res.issues]
    # the string picks its port: only mlx5_1/1 fires, mlx5_0/1 carries the same traffic
    eng = Engine(res.ruleset, WindowStore(cat))
    b = BatchBuilder("n1")
    for i in range(10):
        for port in ("mlx5_0/1", "mlx5_1/1"):
            b.add(100.0 + i, port, "rdma_port_xmit_bytes_total", 1000.0 * i)
    eng.store.ingest(b.build())
    fired = {x.entity for x in eng.evaluate(109.0)}
    assert fired == {"mlx5_1/1"}
    # a bare number string is a duration in seconds, as everywhere else
    f.write_text(STRING_PARAMS.format(port="mlx5_1/1", window="'30'"))
    assert load_rules([f], cat).ok


def test_a_string_param_used_as_a_duration_must_parse(cat, tmp_path):
    f = tmp_path / "r.yaml"
    f.write_text(STRING_PARAMS.format(port="mlx5_1/1", window="5 minutes"))
    res = load_rules([f], cat)
    assert [i.code for i in res.issues] == [Code.BAD_DURATION]
    assert "param window: bad duration '5 minutes'" in str(res.issues[0])
    # used as a number, a string says so
    f.write_text(STRING_PARAMS.format(port="mlx5_1/1", window="1m").replace("limit: 0", "limit: lots"))
    res = load_rules([f], cat)
    assert [i.code for i in res.issues] == [Code.WRONG_TYPE]
    assert "param limit is the string 'lots'" in str(res.issues[0])


RULE_HEAD = """required_engine_version: 1
rules:
  - id: R-1
    pathology: GPU-5
    scope: gpu
    layer: gpu
    severity: warning
"""


def test_requires_items_that_are_not_names_are_errors_at_their_line(cat, tmp_path):
    """`requires: [{a: 1}]` once raised TypeError (unhashable) out of the loader (bench/fuzz.py
    rules input 37886): it is a lint error at the item, and the rule is not loaded."""
    f = tmp_path / "r.yaml"
    f.write_text(RULE_HEAD + "    requires:\n      - gpu_power_watts\n      - {a: 1}\n"
                 "    expr: gpu_power_watts > 90\n")
    res = load_rules([f], cat)
    [i] = res.issues
    assert i.code is Code.BAD_VALUE and i.pos.line == 10 and "item 2 must be a signal name, not a mapping" in i.message, str(i)
    assert not res.ok and res.ruleset is None


def test_a_param_whose_name_is_not_text_is_an_error_and_no_name(cat, tmp_path):
    """`&min_engines: 2` makes a null key with an anchor; the did-you-mean of an unknown name
    in the expression once crashed on it (bench/fuzz.py rules input 74584)."""
    f = tmp_path / "r.yaml"
    f.write_text(RULE_HEAD + "    params:\n      &hot: 90\n"
                 "    expr: gpu_power_watts > hott\n")
    res = load_rules([f], cat)
    msgs = sorted((i.code.value, i.message) for i in res.issues)
    assert len(msgs) == 2, msgs
    assert any("param name None" in m for _, m in msgs) and any("unknown name hott" in m for _, m in msgs), msgs


@pytest.mark.parametrize("key", ["severity", "layer", "scope"])
def test_an_enum_key_written_empty_is_an_error_at_its_line(cat, tmp_path, key):
    """`severity:` with nothing after it is null: the rule once loaded with severity None and
    its first finding crashed the encoder in a replay (bench/fuzz.py bundle input 147723)."""
    f = tmp_path / "r.yaml"
    text = RULE_HEAD + "    expr: gpu_power_watts > 90\n"
    text = text.replace(f"    {key}: " + {"severity": "warning", "layer": "gpu", "scope": "gpu"}[key], f"    {key}:")
    f.write_text(text)
    res = load_rules([f], cat)
    assert any(i.code is Code.BAD_VALUE and f"{key} is empty" in i.message for i in res.issues), res.issues
    assert res.ruleset is None
