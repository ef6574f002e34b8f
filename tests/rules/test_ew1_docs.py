"""docs/pathologies.md describes EW-1 across nodes as the shipped rules are: the clock-free rule
(compute gap excess and the peers' wait, per step, from collective silences) and the aligned
variant, with the parameters the packs hold. A pack change that the page does not follow fails
here, so a reader is not told about a rule that no longer exists."""
from __future__ import annotations

from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[2]


def _row(doc: str, head: str) -> str:
    rows = [line for line in doc.splitlines() if line.startswith(f"| {head} |")]
    assert len(rows) == 1, f"docs/pathologies.md: no single '{head}' row"
    return rows[0]


def _params(rule_id: str) -> dict:
    pack = yaml.safe_load((ROOT / "rules" / "packs" / "east-west.yaml").read_text())
    return next(r for r in pack["rules"] if r.get("id") == rule_id)["params"]


def test_the_ew1_row_describes_the_clock_free_rule_and_the_aligned_variant_as_shipped() -> None:
    row = _row((ROOT / "docs" / "pathologies.md").read_text(), "EW-1 (across nodes)")
    free, aligned = _params("EW-1-tp-straggler"), _params("EW-1-tp-straggler-aligned")
    for words in ("`EW-1-tp-straggler`", "no synchronised clocks", "silences", "compute gap", "wait",
                  "per step", "`agent/steps.py`", "`EW-1-tp-straggler-aligned`", "clocks' error",
                  "`alignment.unsynced_clock_error`"):
        assert words in row, words
    assert f"{free['lag']}" in row.replace(" ms", "ms") and f"{round(free['share'] * 100)} %" in row
    assert "a quarter of that excess" in row and free["waited"] == 0.25
    assert f"within {round(free['period_dev'] * 100)} %" in row and f"regularity {free['regular']}" in row
    assert f"{free['min_steps']}+ steps" in row and f"{free['min_step_bytes'] // 1024} kB" in row
    assert f"{aligned['lag']}".replace("ms", " ms") in row and f"{round(aligned['last_share'] * 100)} %" in row
    assert f"{aligned['min_steps']}+ aligned steps" in row
