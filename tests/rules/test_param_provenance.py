"""Every parameter of the shipped rule packs says where its value comes from.

A parameter's line carries a comment that starts with one or more source tags (docs/rules.md,
"Where a parameter's value comes from"): ``lag: 5ms  # [real-lab] compute gap ...``. The tags
are read by rules/provenance.py (only the raw text keeps comments, so not by the loader).

The parameters whose only source is the simulator are listed in docs/rules.md. The test fails
when the packs and that list differ, so a new simulator-only value (or one that found a real
source) is an edit of the docs that a reviewer sees.
"""
from __future__ import annotations

from pathlib import Path

import pytest

from skewd.rules.provenance import ParamSource, pack_sources, param_sources

DOCS = Path(__file__).resolve().parents[2] / "docs" / "rules.md"
SIM_SECTION = "### Simulator-only parameters"


def simulator_only(sources: list[ParamSource]) -> set[tuple[str, str]]:
    """Parameters whose only source is the simulator (a window length chosen with it counts too)."""
    return {(s.rule, s.param) for s in sources if s.simulator_only}


def documented_simulator_only(text: str) -> set[tuple[str, str]]:
    """The (rule, param) pairs of the docs table: first column the rule id, second its params."""
    lines = text.splitlines()
    start = lines.index(SIM_SECTION)
    out: set[tuple[str, str]] = set()
    for line in lines[start + 1:]:
        if line.startswith("#"):
            break
        cells = [c.strip() for c in line.strip().strip("|").split("|")] if line.startswith("|") else []
        if len(cells) < 2 or not cells[0].startswith("`"):
            continue  # prose, the header row or the separator row
        rule = cells[0].strip("`")
        out |= {(rule, p.strip().strip("`")) for p in cells[1].split(",") if p.strip()}
    return out


def shipped() -> tuple[list[ParamSource], list[str]]:
    return pack_sources()


def test_every_shipped_parameter_names_its_source():
    sources, problems = shipped()
    assert len(sources) > 200, "the packs' parameters were not found"
    assert not problems, "\n".join(problems)


def test_the_simulator_only_parameters_are_the_documented_ones():
    sources, _ = shipped()
    in_packs = simulator_only(sources)
    in_docs = documented_simulator_only(DOCS.read_text())
    new = sorted(in_packs - in_docs)
    gone = sorted(in_docs - in_packs)
    assert not new and not gone, (
        f"docs/rules.md '{SIM_SECTION}' is out of date.\n"
        f"  [sim]-only in the packs, not in the list (add them, with what a real measurement needs): {new}\n"
        f"  in the list, no longer [sim]-only in the packs (remove them): {gone}")


BAD_PACK = """\
required_engine_version: 1
rules:
  - id: X-1
    params:
      window: 1m          # [choice] a minute of samples
      untagged: 3         # three is plenty
      bare: 4
      guessed: 0.5        # [guess] looked right
      tag_only: 7         # [sim]
      chosen: 0.9         # [choice] a threshold is not a window
      agreed: 2           # [physics][real-lab] both say so
      quoted: 'a # b'     # [vendor] a hash inside quotes is not a comment
"""


def test_the_check_names_every_parameter_without_a_usable_tag():
    sources, problems = param_sources(BAD_PACK, "bad.yaml")
    by_param = {p.split(" param ")[1].split(":")[0]: p for p in problems}
    assert sorted(by_param) == ["bare", "chosen", "guessed", "tag_only", "untagged"], problems
    assert by_param["untagged"].startswith("bad.yaml:6: X-1 param untagged: no source tag")
    assert "unknown source tag [guess]" in by_param["guessed"]
    assert "need a why" in by_param["tag_only"]
    assert "window lengths only" in by_param["chosen"]
    tags = {s.param: s.tags for s in sources}
    assert tags["agreed"] == ("physics", "real-lab") and tags["quoted"] == ("vendor",)
    assert simulator_only(sources) == {("X-1", "tag_only")}


@pytest.mark.parametrize("table,expected", [
    ("| `A-1` | `x`, `y` | an H100 |\n| `B-2` | `z` | a fabric |", {("A-1", "x"), ("A-1", "y"), ("B-2", "z")}),
    ("| rule | params | needs |\n|---|---|---|\n| `A-1` | `x` | - |", {("A-1", "x")}),
])
def test_the_documented_list_is_read_from_its_table(table: str, expected: set[tuple[str, str]]):
    text = f"# Title\n\n{SIM_SECTION}\n\nSome prose.\n\n{table}\n\n## Next\n| `C-3` | `w` | not in the section |\n"
    assert documented_simulator_only(text) == expected
