"""Shared bundles built to hurt: content tampered with and re-sealed (valid CRCs), metadata of the
wrong shape, size or depth, rules that explode, output into a closed pipe. Replay reports each
as damage naming the file (and offset), exits with a status, and never prints a traceback."""
from __future__ import annotations

import hashlib
import io
import json
import subprocess
import sys
import zlib
from pathlib import Path

import pyarrow as pa
import pyarrow.ipc as ipc
import pytest

from skewd.agent import bundle as B
from skewd.agent import replay as R

from ..peak_rss import cli_argv, peak_kib
from .test_record import run_live, write_rules

DATA = Path(__file__).resolve().parents[1] / "rules" / "data"


def cli(*args: str) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    rc = R.main([str(a) for a in args], out=out, err=err)
    return rc, out.getvalue(), err.getvalue()


@pytest.fixture
def seg(tmp_path: Path) -> Path:
    live = run_live(tmp_path / "cap", [write_rules(tmp_path / "rules.yaml")])
    assert live.findings
    return B.segment_dirs(live.bundle)[0]


def reseal(seg: Path, name: str) -> None:
    """Make the index agree with a rewritten data file again (one chunk covering it all), as a
    tamperer who knows the format would: only the content is then wrong."""
    data = (seg / name).read_bytes()
    lines = []
    first = True
    for line in (seg / B.INDEX).read_text().splitlines():
        e = json.loads(line)
        if e["file"] == name:
            if not first:
                continue
            first = False
            e.update(offset=0, length=len(data), crc32=zlib.crc32(data))
            e.pop("line_crc32")
            e["line_crc32"] = B.line_crc(e)
            line = B.canon(e)
        lines.append(line)
    (seg / B.INDEX).write_text("\n".join(lines) + "\n")


def edit_meta(seg: Path, change) -> None:
    meta = json.loads((seg / B.META).read_text())
    change(meta)
    (seg / B.META).write_text(json.dumps(meta))


def test_replay_into_a_closed_pipe_exits_quietly(seg: Path) -> None:
    for args in (["--json"], []):
        p = subprocess.Popen([sys.executable, "-m", "skewd.cli", "replay", str(seg), *args],
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        assert p.stdout is not None and p.stderr is not None
        p.stdout.close()  # `| head -0`: the reader is gone before the first line
        err = p.stderr.read().decode()
        assert p.wait(60) == 141, err
        assert "Traceback" not in err and "BrokenPipe" not in err, err


@pytest.mark.parametrize("what, change, field", [
    ("deep JSON", "deep", "nested deeper"),
    ("100k nodes", lambda m: m.update(nodes=[f"n{i}" for i in range(100_000)]), "nodes: 100000 entries"),
    ("settings of the wrong type", lambda m: m.update(settings=[1, 2]), "settings: expected a mapping"),
    ("a zero interval", lambda m: m["settings"].update(evaluation_interval=0), "settings.evaluation_interval"),
    ("labels not text", lambda m: m.update(node_labels={"n1": [1]}), "node_labels.n1"),
    ("a catalogue entry without a unit", lambda m: m["catalogue"][0].pop("unit"), "catalogue[0]"),
    ("a stored rule outside the segment", lambda m: m["rules"]["files"][0].update(stored="../../../etc/passwd"),
     "rules.files[0]"),
    ("a time of the wrong type", lambda m: m.update(time_range={"start": {"a": 1}}), "time_range.start"),
    # found by bench/fuzz.py (bundle input 2881): the replayed controller refused the cluster with
    # its own ConfigError
    ("a cluster with a dot", lambda m: m.update(cluster="a.b"), "cluster: 'a.b' is not a cluster name"),
    # bundle input 339577: a lone surrogate ("\udcff" in the JSON) reached the subject encoder
    ("a cluster that is not UTF-8", lambda m: m.update(cluster="\udcff"), "cluster: expected UTF-8 text"),
    ("a node that is not UTF-8", lambda m: m.update(nodes=["\udcff"]), "nodes: expected names"),
])
def test_tampered_meta_is_a_clean_damage_report(seg: Path, what: str, change, field: str) -> None:
    if change == "deep":  # more than json.loads can nest: written as text
        text = (seg / B.META).read_text().rstrip()
        (seg / B.META).write_text(text[:-1] + ', "x": ' + "[" * 5000 + "]" * 5000 + "}")
    else:
        edit_meta(seg, change)
    rc, _, err = cli(seg)
    assert rc == R.EXIT_DAMAGED, err
    assert f"{seg / B.META}: byte offset 0:" in err and field in err, err
    assert "Traceback" not in err


def test_index_entries_of_the_wrong_shape_with_valid_line_crcs_are_damage(seg: Path) -> None:
    lines = (seg / B.INDEX).read_text().splitlines()
    k = next(i for i, ln in enumerate(lines) if json.loads(ln)["file"] == B.SAMPLES and i > 2)
    e = json.loads(lines[k])
    e["length"] = "12"
    e.pop("line_crc32")
    e["line_crc32"] = B.line_crc(e)
    lines[k] = B.canon(e)
    (seg / B.INDEX).write_text("\n".join(lines) + "\n")
    at = sum(len(ln) + 1 for ln in lines[:k])
    rc, out, err = cli(seg, "--json")
    assert rc == R.EXIT_DAMAGED and f"{seg / B.INDEX}: byte offset {at}: index entry corrupted (length" in err, err
    assert "Traceback" not in err


def test_index_fields_written_as_null_read_as_absent(seg: Path) -> None:
    """`batches: null` passes the shape check (the field is optional); the reader once indexed
    into the None (bench/fuzz.py bundle input 15273). It replays like a bundle without it."""
    rc0, out0, _ = cli(seg, "--json")
    lines = (seg / B.INDEX).read_text().splitlines()
    changed = 0
    for k, ln in enumerate(lines):
        e = json.loads(ln)
        if e["file"] == B.SAMPLES and "batches" in e:
            e["batches"] = None
            e.pop("line_crc32")
            e["line_crc32"] = B.line_crc(e)
            lines[k] = B.canon(e)
            changed += 1
    assert changed
    (seg / B.INDEX).write_text("\n".join(lines) + "\n")
    rc, out, err = cli(seg, "--json")
    assert "Traceback" not in err and rc == rc0, err
    assert out == out0  # the same findings: the field only lets a replay skip verified chunks


def test_an_arrow_stream_of_another_schema_with_valid_crcs_is_damage(seg: Path) -> None:
    sink = io.BytesIO()
    schema = pa.schema([("t", pa.string()), ("value", pa.float64())])
    with ipc.new_stream(sink, schema) as w:
        w.write_batch(pa.record_batch([pa.array(["x"]), pa.array([1.0])], schema=schema))
    (seg / B.SAMPLES).write_bytes(sink.getvalue())
    reseal(seg, B.SAMPLES)
    rc, _, err = cli(seg)
    assert rc == R.EXIT_DAMAGED and f"{seg / B.SAMPLES}: byte offset 0: Arrow schema is not a skewd" in err, err


def test_dictionary_codes_out_of_range_with_valid_crcs_are_damage(seg: Path) -> None:
    reader = ipc.open_stream((seg / B.SAMPLES).read_bytes())
    rb = reader.read_next_batch()
    node = rb.column(rb.schema.get_field_index("node"))
    bad = pa.DictionaryArray.from_arrays(pa.array([1_000_000] * len(node), pa.int32()), node.dictionary, safe=False)
    cols = [bad if f.name == "node" else rb.column(i) for i, f in enumerate(rb.schema)]
    sink = io.BytesIO()
    with ipc.new_stream(sink, rb.schema) as w:
        w.write_batch(pa.record_batch(cols, schema=rb.schema))
    (seg / B.SAMPLES).write_bytes(sink.getvalue())
    reseal(seg, B.SAMPLES)
    rc, _, err = cli(seg)
    assert rc == R.EXIT_DAMAGED and f"{seg / B.SAMPLES}: byte offset" in err and "Traceback" not in err, err


def test_repeated_codes_against_a_smaller_dictionary_are_damage(seg: Path) -> None:
    # the reader checks a code column in full only when its bytes or its dictionary's size
    # change (reader._validate): a batch repeating the codes of a good one under a dictionary
    # cut to one name is damage at that batch, and the two good batches before it still read
    reader = ipc.open_stream((seg / B.SAMPLES).read_bytes())
    rb = reader.read_next_batch()
    k = rb.schema.get_field_index("signal")
    sig = rb.column(k)
    assert len(sig.dictionary) > 1 and max(sig.indices.to_pylist()) >= 1
    cut = pa.DictionaryArray.from_arrays(sig.indices, sig.dictionary[:1], safe=False)
    bad = pa.record_batch([cut if i == k else rb.column(i) for i in range(rb.num_columns)], schema=rb.schema)
    sink = io.BytesIO()
    with ipc.new_stream(sink, rb.schema) as w:
        w.write_batch(rb)
        w.write_batch(rb)
        at = sink.tell()
        w.write_batch(bad)
    (seg / B.SAMPLES).write_bytes(sink.getvalue())
    reseal(seg, B.SAMPLES)
    s = B.Segment(seg)
    cols = list(s.iter_sample_columns())
    assert len(cols) == 2
    assert any(d.path.endswith(B.SAMPLES) and d.offset == at and "unreadable" in d.message for d in s.damage), s.damage


def test_summary_lines_that_are_not_objects_are_damage(seg: Path) -> None:
    lines = (seg / B.SUMMARIES).read_text().splitlines()
    lines[3] = "[1, 2, 3]"
    lines[5] = json.dumps({**json.loads(lines[5]), "t": "soon"})
    (seg / B.SUMMARIES).write_text("\n".join(lines) + "\n")
    reseal(seg, B.SUMMARIES)
    rc, out, err = cli(seg, "--json")
    assert rc == R.EXIT_DAMAGED and f"{seg / B.SUMMARIES}: byte offset" in err and "not a JSON object" in err, err
    assert out  # the node findings replay regardless


def test_a_shared_bundle_with_a_billion_laughs_rule_file_is_refused_in_bounded_memory(seg: Path) -> None:
    meta = json.loads((seg / B.META).read_text())
    stored = seg / meta["rules"]["files"][0]["stored"]
    stored.write_bytes((DATA / "billion-laughs.bad.yaml").read_bytes())
    edit_meta(seg, lambda m: m["rules"]["files"][0].update(sha256=hashlib.sha256(stored.read_bytes()).hexdigest()))
    p = subprocess.run(cli_argv("replay", str(seg)), capture_output=True, text=True, timeout=120)
    assert p.returncode == R.EXIT_USAGE, p.stderr
    assert "E019" in p.stderr and str(stored) in p.stderr and "Traceback" not in p.stderr
    assert peak_kib(p.stderr) < 400_000, "peak RSS of the refusing replay, KiB"


def test_nodes_in_the_data_beyond_the_limit_are_not_replayed(tmp_path: Path) -> None:
    live = run_live(tmp_path / "cap", [write_rules(tmp_path / "rules.yaml")], ticks=12)
    seg = B.segment_dirs(live.bundle)[0]
    rc, out, err = cli(seg, "--limit", "nodes=1", "--no-group")
    assert rc == 0 and out, err  # one node: within the limit
    rc, _, err = cli(seg, "--limit", "nodes=x")
    assert rc == R.EXIT_USAGE and "bundle limit nodes" in err
    segs, _ = R.open_segments([seg])
    rep = R.Replayer(segs, R.replay_catalogue(segs), max_nodes=1)
    rep.pipelines["other"] = rep.pipelines.get("other")  # a node already occupying the one slot
    rep.pipelines.pop("other")
    assert rep._pipeline("n1", rep._seg_rules[0], segs[0]) is not None
    assert rep._pipeline("n2", rep._seg_rules[0], segs[0]) is None  # the second node is refused
    assert any("more than 1 nodes" in s for s in rep.stopped_early)


def test_a_bundle_without_a_cluster_replays_through_the_controller_as_cluster_replay(seg: Path) -> None:
    """A recording made without a cluster name (a Recorder used as a library) still replays
    with the controller: under the cluster name "replay", which every controller config takes
    (the controller itself would refuse an empty one), from the library as from the command line."""
    edit_meta(seg, lambda m: m.pop("cluster"))
    segs, damage = R.open_segments([seg])
    assert segs and not damage
    assert R.ClusterReplay(R.Replayer(segs, R.replay_catalogue(segs))).cfg.cluster == "replay"
    rc, out, err = cli(seg)
    assert rc == 0 and out and "Traceback" not in err, err


@pytest.mark.parametrize("t", [1e30, -1e30])
def test_a_summary_time_no_calendar_holds_is_reported_not_raised(seg: Path, t: float) -> None:
    """A summary at t = 1e30 s (beyond year 9999 and time_t) in a tampered bundle: the replay
    reports where the summaries stop, quoting the raw time, and still replays the rest (fuzz
    input bundle 836208 raised OverflowError out of the time formatter)."""
    lines = (seg / B.SUMMARIES).read_text().splitlines()
    lines[5] = json.dumps({**json.loads(lines[5]), "t": t})
    (seg / B.SUMMARIES).write_text("\n".join(lines) + "\n")
    reseal(seg, B.SUMMARIES)
    rc, out, err = cli(seg, "--json")
    assert rc in (0, R.EXIT_DAMAGED) and "Traceback" not in err, err
    assert out
    assert R.fmt_t(t) == f"t={t:g}" and R.fmt_t(1700000000.25) == "2023-11-14T22:13:20.250Z"
