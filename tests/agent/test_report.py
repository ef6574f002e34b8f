"""The HTML post-mortem report: self-contained, deterministic, and it renders in Chromium."""
from __future__ import annotations

import json
import re
import shutil
import subprocess
import zlib
from pathlib import Path

import pytest

from skewd.agent import bundle as B
from skewd.agent import replay as R
from skewd.agent.report import render, write_report

from .test_record import catalogue, run_live, write_rules


def _chromium() -> str | None:
    for name in ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable"):
        p = shutil.which(name)
        if p:
            return p
    return None


def _replay(path: Path) -> R.ReplayResult:
    segs, dmg = R.open_segments([path])
    return R.replay_cluster(segs, catalogue(), open_damage=dmg)


@pytest.fixture
def bundle(tmp_path: Path) -> Path:
    return run_live(tmp_path / "cap", [write_rules(tmp_path / "rules.yaml")]).bundle


def test_report_is_self_contained_and_complete(bundle: Path, tmp_path: Path) -> None:
    res = _replay(bundle)
    html = render(res)
    # one file: nothing fetched from anywhere
    assert not re.search(r"""(?:src|href|action)\s*=\s*["']?\s*(?:https?:|//|file:)""", html, re.I)
    assert "<link" not in html and "<script src" not in html and "@import" not in html and "url(" not in html
    # the findings table, with evidence and mitigation from the rule
    table = html[html.index("<table id='findings'>"):]
    table = table[: table.index("</table>")]
    assert table.count("<tr class='occ'") == 1
    (evidence,) = [f.evidence for f in res.findings if f.state.value == "resolved"]
    (value,) = evidence.values()
    assert "NS5-BACKLOG" in table and value >= 100_000
    assert f"<code>last(netdev_qdisc_backlog_bytes, 5s)</code> = {value:.4g}" in table
    assert "reduce the egress rate or move traffic off eth0" in table  # placeholders filled
    # timelines of the rule's signal with the pending and firing intervals shaded
    assert "<svg class=\"plot timeline\"" in html and 'class="line"' in html
    assert "shade pending" in html and "shade firing warning" in html
    # heatmap of a multi-entity measure, and the rule versions used (original file path)
    assert "<svg class=\"plot heatmap\"" in html
    assert str(tmp_path / "rules.yaml") in html and "Replayed with rule set version" in html


def test_report_is_deterministic(bundle: Path, tmp_path: Path) -> None:
    a = write_report(_replay(bundle), tmp_path / "a.html").read_bytes()
    b = write_report(_replay(bundle), tmp_path / "b.html").read_bytes()
    assert a == b


def test_multi_node_report_has_a_row_per_node_in_the_heatmap(tmp_path: Path) -> None:
    rules = write_rules(tmp_path / "rules.yaml")
    for node, rate in (("n1", 1e6), ("n2", 1.1e6), ("n3", 1e5)):
        run_live(tmp_path / "root" / node, [rules], node=node, tx_rate=rate)
    html = render(_replay(tmp_path / "root"))
    heat = html[html.index("id='heatmaps'"):html.index("id='rules'")]
    for node in ("n1", "n2", "n3"):
        assert f">{node}/eth0<" in heat
    assert "LOW-TX-PEER" in html[html.index("<table id='findings'>"):html.index("id='timelines'")]


def _rewrite_jsonl(seg: Path, name: str, lines: list[str]) -> None:
    """Replace a JSONL file with new content, re-indexed (one chunk) like the recorder would."""
    data = "".join(x + "\n" for x in lines).encode()
    (seg / name).write_bytes(data)
    idx = seg / B.INDEX
    keep = [x for x in idx.read_text().splitlines() if json.loads(x)["file"] != name]
    entry = {"file": name, "chunk": 0, "offset": 0, "length": len(data), "crc32": zlib.crc32(data), "rows": len(lines)}
    entry["line_crc32"] = B._line_crc(entry)
    idx.write_text("\n".join(keep + [json.dumps(entry, sort_keys=True, separators=(",", ":"))]) + "\n")


def test_root_cause_and_suggestions_from_the_bundle_are_shown(bundle: Path) -> None:
    seg = B.segment_dirs(bundle)[0]
    recorded = B.Segment(seg).findings()
    for d in recorded:
        d["root_cause"] = "tbf shaper on eth0 at 10 Mbit/s"
        d["suggestions"] = ["remove the shaper", "move the flow to eth1"]
    _rewrite_jsonl(seg, B.FINDINGS, [json.dumps(d, sort_keys=True) for d in recorded])
    html = render(_replay(bundle))
    assert "<th>Root cause</th>" in html and "tbf shaper on eth0 at 10 Mbit/s" in html
    assert "remove the shaper<br>move the flow to eth1" in html


def test_damage_is_reported_in_the_page(bundle: Path) -> None:
    p = B.segment_dirs(bundle)[0] / B.SAMPLES
    with open(p, "r+b") as f:
        f.truncate(p.stat().st_size // 2)
    html = render(_replay(bundle))
    assert "Damaged input" in html and f"{p}: byte offset" in html


@pytest.mark.timeout(180)
def test_report_renders_in_headless_chromium(bundle: Path, tmp_path: Path) -> None:
    browser = _chromium()
    if browser is None:
        pytest.skip("needs Debian's chromium package (apt-get install -y chromium) to render the report")
    rc, _, err = _cli_report(bundle, tmp_path / "report.html")
    assert rc == 0, err
    args = [browser, "--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
            "--disable-component-update", "--disable-sync", "--no-first-run", "--disable-dev-shm-usage",
            f"--user-data-dir={tmp_path / 'profile'}", "--window-size=1280,2400"]
    url = (tmp_path / "report.html").as_uri()
    dom = subprocess.run(args + ["--dump-dom", url], capture_output=True, text=True, timeout=120)
    assert dom.returncode == 0, dom.stderr[-2000:]
    page = dom.stdout
    # the inline script ran (no JS error before its last line) ...
    assert re.search(r"<html[^>]*data-ready=\"1\"", page), page[:300]
    # ... the findings table is in the rendered DOM with its row ...
    m = re.search(r"<table id=\"findings\">(.*?)</table>", page, re.S)
    assert m and "NS5-BACKLOG" in m.group(1) and "class=\"occ\"" in m.group(1)
    # ... and at least one plot with a drawn line and a shaded finding interval
    assert re.search(r"<svg class=\"plot timeline\"[^>]*>.*?<path class=\"line\" d=\"M[\d.]+,[\d.]+ L", page, re.S)
    assert "class=\"shade firing warning\"" in page
    shot = tmp_path / "report.png"
    r = subprocess.run(args + [f"--screenshot={shot}", url], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0 and shot.stat().st_size > 20_000  # a blank page compresses to a few kB


def _cli_report(bundle: Path, out: Path) -> tuple[int, str, str]:
    import io

    o, e = io.StringIO(), io.StringIO()
    rc = R.main([str(bundle), "--report", str(out), "--quiet"], out=o, err=e)
    return rc, o.getvalue(), e.getvalue()
