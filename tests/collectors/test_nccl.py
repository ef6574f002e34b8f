"""The nccl collector: NCCL Inspector JSON lines and Prometheus textfiles (upstream's own examples
and an invented 8-GPU node in the exact byte layout, tests/fixtures/nccl/NOTE.md), parsed
directly, reduced across ranks, and followed in a real dump directory written while the
collector runs: appends, partial lines, truncation, rotation, many processes."""
from __future__ import annotations

import json
import os
import re
import shutil
from pathlib import Path

import pytest

from skewd.collectors.base import Availability
from skewd.collectors.nccl import COLLECTOR, NcclCollector, parse
from skewd.collectors.nccl.catalogue import CATALOGUE
from skewd.collectors.nccl.reduce import Reducer
from skewd.collectors.nccl.tail import DirTailer
from skewd.collectors.registry import collector_class

FIX = Path(__file__).resolve().parents[1] / "fixtures" / "nccl"
README = FIX / "inspector-v4.0-readme"
STRAGGLER_V = FIX / "inspector-v4.0-tp8-straggler-r5-verbose"
STRAGGLER = FIX / "inspector-v4.0-tp8-straggler-r5"
HEALTHY_V = FIX / "inspector-v4.0-tp8-healthy-verbose"
PROM = FIX / "inspector-prom-2.28-tp8"
HOST = "gpu-node-07"
COMM = "0x9a4c1e07d3b5f2"


def ent(rank: int, comm: str = COMM) -> str:
    return f"{comm}/r{rank}"


def records(path: Path) -> list[parse.Record]:
    stream = parse.JsonStream()
    return [r for line in path.read_bytes().splitlines() if (r := stream.feed(line)) is not None]


def values(batch) -> dict[str, dict[str, float]]:
    out: dict[str, dict[str, float]] = {}
    for _, _, e, s, v in batch.rows():
        out.setdefault(e, {})[s] = v
    return out


def collector(tmp_path: Path, **cfg) -> NcclCollector:
    c = NcclCollector("n1", {"dump_dir": str(tmp_path), "hostname": HOST, **cfg})
    c.start()
    return c


def append(path: Path, data: bytes | str) -> None:
    with open(path, "ab") as f:
        f.write(data.encode() if isinstance(data, str) else data)


# -- parsing: upstream's examples --------------------------------------------------------------------
def test_readme_record_parses_to_base_units():
    [r] = records(README / "example-hostname-pid1639453.log")
    assert (r.comm, r.rank, r.n_ranks, r.nnodes) == ("0x7f8c496ae9f661", 2, 8, 1)
    assert (r.hostname, r.pid, r.coll, r.sn) == ("example-hostname", 1639453, "AllReduce", 1407)
    assert r.msg_bytes == 17179869184
    assert r.exec_s == pytest.approx(0.061974)
    assert r.busbw_bps == pytest.approx(485.119099e9)
    assert r.algobw_bps == pytest.approx(277.210914e9)
    assert r.timing_source == "" and r.kernel_start_us is None  # the early v4.0 layout has neither


def test_readme_verbose_record_gives_the_earliest_kernel_start_on_the_host_clock():
    [r] = records(README / "example-hostname-pid438776.log")
    assert (r.coll, r.sn, r.timing_source) == ("ReduceScatter", 1231, "kernel_gpu")
    assert r.kernel_start_us == 1752867229235181
    assert r.exec_s == pytest.approx(0.041057)


def test_v4_4_marker_stream_restores_each_payload_lines_context():
    recs = records(FIX / "inspector-v4.4-markers" / "example-hostname-pid1639453.log")
    assert [(r.comm, r.rank, r.sn, r.coll) for r in recs] == [
        ("0x7f8c496ae9f661", 2, 1407, "AllReduce"), ("0x7f8c496ae9f661", 2, 1408, "AllReduce"),
        ("0x7f8c496ae9f661", 2, 1409, "ReduceScatter")]  # the p2p_perf line carries no collective
    assert recs[1].timing_source == "kernel_gpu" and recs[0].timing_source == ""


def test_v4_4_payload_without_its_marker_is_an_orphan_and_beyond_its_counts_an_error():
    lines = (FIX / "inspector-v4.4-markers" / "example-hostname-pid1639453.log").read_bytes().splitlines()
    s = parse.JsonStream()
    with pytest.raises(parse.OrphanPayload):
        s.feed(lines[1])  # picked up mid-dump
    s.feed(lines[0])
    s.feed(lines[1])
    s.feed(lines[2])
    s.feed(lines[3])
    with pytest.raises(parse.RecordError, match="beyond the counts"):
        s.feed(lines[2])


@pytest.mark.parametrize("edit, field", [
    (lambda o: o["coll_perf"].__setitem__("coll_exec_time_us", "61974"), "coll_perf.coll_exec_time_us"),
    (lambda o: o["coll_perf"].pop("coll_sn"), "coll_perf.coll_sn: missing"),
    (lambda o: o["header"].__setitem__("rank", 9), "header.rank"),
    (lambda o: o["metadata"].__setitem__("inspector_output_format_version", "v5.0"), "v5.0"),
    (lambda o: o["metadata"].pop("hostname"), "metadata.hostname"),
])
def test_a_bad_record_names_its_field(edit, field):
    obj = json.loads((README / "example-hostname-pid1639453.log").read_text())
    edit(obj)
    with pytest.raises(parse.RecordError, match=field.replace(".", r"\.")):
        parse.JsonStream().feed(json.dumps(obj))


def test_nan_bandwidth_and_nul_padding_are_read_as_the_writer_means_them():
    line = (README / "example-hostname-pid1639453.log").read_text().strip()
    line = line.replace('"coll_busbw_gbs":485.119099', '"coll_busbw_gbs":"nan"')
    r = parse.JsonStream().feed(b"\0" * 40 + line.encode())  # copytruncate hole before the line
    assert r is not None and r.sn == 1407 and r.busbw_bps is None


def test_textfile_of_nccl_2_28_gives_one_record_per_rank_and_collective():
    recs = []
    for f in sorted(PROM.glob("*.prom")):
        tf = parse.parse_textfile(f.read_text())
        assert not tf.problems and not tf.aggregated
        recs += tf.records
    assert sorted(r.rank for r in recs) == list(range(8))
    r5 = next(r for r in recs if r.rank == 5)
    assert (r5.comm, r5.n_ranks, r5.hostname, r5.coll, r5.sn) == (COMM, 8, HOST, "AllReduce", 5021)
    assert r5.exec_s == pytest.approx(47e-6) and r5.msg_bytes == 4 * 1024 ** 2
    assert r5.busbw_bps == pytest.approx(156.171e9)
    assert len({r.sn for r in recs}) == 3  # each process dumped at its own moment


def test_textfile_readme_labels_and_a_half_written_file():
    text = (FIX / "inspector-prom-readme" / "nccl_inspector_metrics_readme.prom").read_text()
    [r] = parse.parse_textfile(text).records
    assert (r.comm, r.rank, r.n_ranks, r.sn) == ("0xd152c00f111816", 4, 8, 228924)
    assert r.msg_bytes == 2 * 1024 ** 3
    # caught mid-rewrite: the cut series is not read, the complete one is
    cut = text[: text.index("nccl_bus_bandwidth_gbs") + 40]
    [r] = parse.parse_textfile(cut).records
    assert r.exec_s == pytest.approx(9498e-6) and r.busbw_bps is None


def test_textfile_v5_aggregated_series_are_recognised_as_carrying_no_rank_timing():
    tf = parse.parse_textfile((FIX / "inspector-prom-v5.1-aggregated" / "nccl_inspector_metrics_GPU0.prom").read_text())
    assert tf.aggregated and tf.records == [] and tf.problems == []


# -- reduction across ranks --------------------------------------------------------------------------
def reduce_dir(d: Path) -> dict[str, dict[str, float]]:
    red = Reducer()
    for f in sorted(d.glob("*.log")):
        for r in records(f):
            red.add(r, 100.0)
    first = red.close(100.0)
    second = red.close(101.0)  # collectives not every rank reported are reduced one interval later
    for e, sigs in first.items():
        for s, v in sigs.items():
            second[e].setdefault(s, v)
    return second


@pytest.mark.parametrize("d", [STRAGGLER_V, STRAGGLER], ids=["verbose", "plain"])
def test_the_rank_everyone_waits_for_waits_least_and_starts_last(d):
    out = reduce_dir(d)
    assert sorted(out) == [ent(r) for r in range(8)]
    s, peers = out[ent(5)], [out[ent(r)] for r in range(8) if r != 5]
    assert s["nccl_collective_wait_p50_seconds"] == 0.0
    assert s["nccl_collective_least_wait_ratio"] > 0.9
    for p in peers:
        assert p["nccl_collective_wait_p50_seconds"] == pytest.approx(1.5e-3, abs=0.05e-3)
        assert p["nccl_collective_least_wait_ratio"] < 0.1
        assert p["nccl_collective_exec_p50_seconds"] > 30 * s["nccl_collective_exec_p50_seconds"]
    if d is STRAGGLER_V:
        assert s["nccl_kernel_start_lag_p50_seconds"] == pytest.approx(1.5e-3, abs=0.05e-3)
        assert s["nccl_kernel_start_last_ratio"] > 0.9
        assert all(p["nccl_kernel_start_lag_p50_seconds"] < 25e-6 for p in peers)
    else:
        assert "nccl_kernel_start_lag_p50_seconds" not in s
    assert s["nccl_collectives_total"] == 5023  # the last coll_sn
    assert s["nccl_message_size_p50_bytes"] == 4194304
    assert all(v["nccl_matched_collectives_total"] >= 15 for v in out.values())


def test_a_healthy_node_has_no_rank_that_waits_least_or_starts_last_consistently():
    out = reduce_dir(HEALTHY_V)
    for v in out.values():
        assert v["nccl_collective_wait_p50_seconds"] < 25e-6
        assert v["nccl_kernel_start_lag_p50_seconds"] < 25e-6
        assert v["nccl_collective_least_wait_ratio"] < 0.5 and v["nccl_kernel_start_last_ratio"] < 0.5


def _rec(comm: str, rank: int, sn: int, exec_us: float, start: int | None = None, host: str = HOST,
         source: str = "kernel_gpu") -> parse.Record:
    return parse.Record(comm, rank, 8, 1, host, 1, "AllReduce", sn, 1024.0, exec_us * 1e-6, source, None, None, start)


def test_collectives_match_within_a_communicator_and_a_host_only():
    red = Reducer()
    for sn in range(10):
        red.add(_rec("0xa", 0, sn, 2000, 1000), 1.0)
        red.add(_rec("0xa", 1, sn, 50, 2950), 1.0)        # 0xa/r1 is late
        red.add(_rec("0xb", 0, sn, 60, 1000), 1.0)        # same coll_sn, another communicator
        red.add(_rec("0xb", 1, sn, 55, 1005), 1.0)
        red.add(_rec("0xa", 2, sn, 40, 9000, host="other-node"), 1.0)  # other clock: never compared
    out = red.close(1.0)
    assert out[ent(1, "0xa")]["nccl_kernel_start_lag_p50_seconds"] == pytest.approx(1.95e-3)
    assert out[ent(0, "0xa")]["nccl_collective_wait_p50_seconds"] == pytest.approx(1.95e-3)
    assert out[ent(0, "0xb")]["nccl_collective_wait_p50_seconds"] == pytest.approx(5e-6)
    assert out[ent(2, "0xa")]["nccl_matched_collectives_total"] == 0
    assert out[ent(1, "0xa")]["nccl_matched_collectives_total"] == 10


def test_waits_compare_only_times_measured_the_same_way():
    red = Reducer()
    red.add(_rec("0xa", 0, 1, 5000, source="collective_cpu"), 1.0)  # host-timed: includes enqueue
    red.add(_rec("0xa", 1, 1, 50), 1.0)
    red.add(_rec("0xa", 2, 1, 60), 1.0)
    out = red.close(1.0)
    assert "nccl_collective_wait_p50_seconds" not in out[ent(0, "0xa")]
    assert out[ent(2, "0xa")]["nccl_collective_wait_p50_seconds"] == pytest.approx(10e-6)


def test_a_record_seen_again_counts_once_and_an_idle_rank_is_forgotten():
    red = Reducer(idle_s=10)
    assert red.add(_rec("0xa", 0, 5, 50), 1.0)
    assert not red.add(_rec("0xa", 0, 5, 50), 1.0)  # a rotated copy, a re-read textfile
    assert not red.add(_rec("0xa", 0, 4, 50), 1.0)
    assert red.close(1.0)[ent(0, "0xa")]["nccl_collectives_total"] == 5
    assert ent(0, "0xa") in red.close(9.0)  # alive: progress counters keep coming
    assert red.close(20.0) == {}


def test_a_collective_waits_one_interval_for_the_ranks_that_have_not_reported_it():
    red = Reducer()
    red.add(_rec("0xa", 0, 1, 2000, 100), 1.0)
    red.add(_rec("0xa", 1, 1, 50, 2050), 1.0)
    red.add(_rec("0xa", 2, 0, 50, 50), 1.0)  # rank 2 is local but has not reported sn 1 yet
    assert "nccl_kernel_start_lag_p50_seconds" not in red.close(1.0)[ent(1, "0xa")]
    red.add(_rec("0xa", 2, 1, 2010, 90), 2.0)  # arrives one interval later: matched with the others
    out = red.close(2.0)
    assert out[ent(1, "0xa")]["nccl_kernel_start_lag_p50_seconds"] == pytest.approx(1.96e-3)
    assert out[ent(2, "0xa")]["nccl_kernel_start_lag_p50_seconds"] == 0.0


def test_pending_collectives_are_bounded():
    red = Reducer(max_pending=50)
    for sn in range(1000):
        red.add(_rec("0xa", 0, sn, 50), 1.0)
    assert len(red._pending) <= 50


# -- the collector on a real directory ---------------------------------------------------------------
def fixture_lines(d: Path) -> dict[str, list[bytes]]:
    return {f.name: [line + b"\n" for line in f.read_bytes().splitlines()] for f in sorted(d.glob("*.log"))}


def test_files_from_eight_processes_written_while_the_collector_runs_name_the_straggler(tmp_path):
    c = collector(tmp_path)
    files = fixture_lines(STRAGGLER_V)
    got: dict[str, dict[str, float]] = {}
    t = 1000.0
    for part in range(4):  # each process appends a quarter of its lines per second
        for name, lines in files.items():
            q = len(lines) // 4 + 1
            append(tmp_path / name, b"".join(lines[part * q:(part + 1) * q]))
        for e, sigs in values(c.collect(t)).items():
            got.setdefault(e, {}).update({s: v for s, v in sigs.items() if s not in got.get(e, {}) or "lag" not in s})
        t += 1.0
    for e, sigs in values(c.collect(t)).items():
        got.setdefault(e, {}).update(sigs)
    assert sorted(got) == [ent(r) for r in range(8)]
    assert got[ent(5)]["nccl_collectives_total"] == 5023
    lags = {e: v.get("nccl_kernel_start_lag_p50_seconds", 0.0) for e, v in got.items()}
    assert max(lags, key=lags.get) == ent(5) and lags[ent(5)] > 1e-3
    assert c.stats.errors == {}


def test_existing_content_is_history_new_lines_count(tmp_path):
    f = tmp_path / f"{HOST}-pid41206.log"
    lines = fixture_lines(STRAGGLER_V)[f.name]
    f.write_bytes(b"".join(lines[:10]))
    c = collector(tmp_path)
    assert values(c.collect(1.0)) == {}
    append(f, b"".join(lines[10:12]))
    v = values(c.collect(2.0))[ent(5)]
    assert v["nccl_collectives_total"] == records(STRAGGLER_V / f.name)[11].sn
    assert c.stats.discarded == 0


def test_a_file_picked_up_mid_line_skips_that_lines_end_quietly(tmp_path):
    f = tmp_path / f"{HOST}-pid41201.log"
    lines = fixture_lines(STRAGGLER_V)[f.name]
    append(f, lines[0] + lines[1][:50])  # the writer is mid-line when the agent starts
    c = collector(tmp_path)
    append(f, lines[1][50:] + lines[2])
    assert values(c.collect(1.0))[ent(0)]["nccl_collectives_total"] == records(STRAGGLER_V / f.name)[2].sn
    assert c.stats.errors == {} and c.stats.discarded == 0


def test_a_partial_last_line_waits_for_its_end(tmp_path):
    c = collector(tmp_path)
    line = fixture_lines(STRAGGLER_V)[f"{HOST}-pid41201.log"][0]
    f = tmp_path / f"{HOST}-pid41201.log"
    append(f, line[:100])
    assert values(c.collect(1.0)) == {}
    append(f, line[100:])
    assert values(c.collect(2.0))[ent(0)]["nccl_collectives_total"] == records(STRAGGLER_V / f.name)[0].sn
    assert c.stats.errors == {}


def test_a_truncated_file_is_read_again_from_its_start(tmp_path):
    c = collector(tmp_path)
    lines = fixture_lines(STRAGGLER_V)[f"{HOST}-pid41201.log"]
    f = tmp_path / f"{HOST}-pid41201.log"
    append(f, b"".join(lines[:15]))
    c.collect(1.0)
    f.write_bytes(b"".join(lines[15:17]))  # copytruncate, then the writer goes on
    v = values(c.collect(2.0))[ent(0)]
    assert v["nccl_collectives_total"] == records(STRAGGLER_V / f.name)[16].sn
    assert c.stats.errors == {}


def test_copytruncate_with_a_writer_that_keeps_its_offset(tmp_path):
    c = collector(tmp_path)
    lines = fixture_lines(STRAGGLER_V)[f"{HOST}-pid41201.log"]
    f = tmp_path / f"{HOST}-pid41201.log"
    append(f, b"".join(lines[:10]))
    c.collect(1.0)
    shutil.copyfile(f, tmp_path / f"{HOST}-pid41201.log.1")  # the copy: lines already read
    size = f.stat().st_size
    with open(f, "r+b") as fh:
        fh.truncate(0)
    c.collect(2.0)  # polled while the file is empty: read again from 0 from now on
    with open(f, "r+b") as fh:  # no O_APPEND: the next write lands at the old offset, a hole before it
        fh.seek(size)
        fh.write(lines[10])
    v = values(c.collect(3.0))[ent(0)]
    assert v["nccl_collectives_total"] == records(STRAGGLER_V / f.name)[10].sn
    assert c.stats.errors == {}
    assert c.reducer.duplicates == 0  # the copy's lines were not read a second time


def test_rename_rotation_follows_the_old_file_and_reads_the_new_one(tmp_path):
    c = collector(tmp_path)
    lines = fixture_lines(STRAGGLER_V)[f"{HOST}-pid41201.log"]
    f = tmp_path / f"{HOST}-pid41201.log"
    append(f, b"".join(lines[:5]))
    c.collect(1.0)
    rotated = tmp_path / f"{HOST}-pid41201.log.1"
    os.rename(f, rotated)
    append(rotated, lines[5])  # the writer's descriptor still points at the renamed file
    append(f, lines[6])  # a new file under the old name (a restarted writer)
    v = values(c.collect(2.0))[ent(0)]
    assert v["nccl_collectives_total"] == records(STRAGGLER_V / f.name)[6].sn
    assert c.reducer.duplicates == 0 and c.stats.errors == {}


def test_reading_is_bounded_per_collection_and_catches_up(tmp_path):
    c = collector(tmp_path, max_read_bytes=65536)
    src = fixture_lines(STRAGGLER_V)
    for name, lines in src.items():
        append(tmp_path / name, b"".join(lines))
    assert sum(len(b"".join(x)) for x in src.values()) > 2 * 65536
    seen = []
    for i in range(6):
        seen.append(sum(sigs["nccl_collectives_total"] for sigs in values(c.collect(float(i))).values()))
    assert seen[0] < 8 * 5023  # the first collection read at most 64 KiB of the 160 KiB
    assert seen[-1] == 8 * 5023 and c.stats.errors == {}  # and later ones caught up


def test_a_line_longer_than_the_bound_is_dropped_and_reading_goes_on(tmp_path):
    t = DirTailer(tmp_path, lambda n: True, parse.JsonStream, max_line=1000)
    t.prime()
    f = tmp_path / "x.log"
    append(f, b"x" * 700)
    assert t.poll().files == []
    append(f, b"y" * 700 + b"\nshort\n")
    res = t.poll()
    assert [line for _, line in res.files[0].lines] == [b"short"] and res.events


def test_a_hole_left_by_a_truncation_is_skipped_not_read(tmp_path):
    # a long-running writer's offset is hundreds of MB: after copytruncate its next line lands
    # there, and reading the hole's NULs at the per-poll bound would take minutes
    t = DirTailer(tmp_path, lambda n: True, parse.JsonStream, max_bytes=65536)
    f = tmp_path / "x.log"
    t.prime()
    f.write_bytes(b"first\n")
    t.poll()
    with open(f, "r+b") as fh:
        fh.truncate(0)
    t.poll()
    with open(f, "r+b") as fh:
        fh.seek(64 << 20)
        fh.write(b"after the hole\n")
    probe = os.open(f, os.O_RDONLY)
    try:
        if os.lseek(probe, 0, getattr(os, "SEEK_DATA", 0)) == 0:
            pytest.skip("this file system does not report holes (SEEK_DATA)")
    finally:
        os.close(probe)
    res = t.poll()
    assert [line for _, line in res.files[0].lines] == [b"after the hole"]


def test_a_bad_line_is_counted_named_and_skipped(tmp_path, caplog):
    c = collector(tmp_path)
    f = tmp_path / f"{HOST}-pid41201.log"
    lines = fixture_lines(STRAGGLER_V)[f.name]
    bad = re.sub(rb'"coll_sn":(\d+)', rb'"coll_sn":"\1"', lines[1])
    append(f, lines[0] + bad + lines[2])
    v = values(c.collect(1.0))[ent(0)]
    assert v["nccl_collectives_total"] == records(STRAGGLER_V / f.name)[2].sn
    assert c.stats.errors == {"parse": 1}
    assert c.last_problem.startswith(f"{tmp_path}/{f.name}:2: coll_perf.coll_sn")
    assert f"{f.name}:2" in caplog.text


def test_other_hosts_files_in_a_shared_dump_dir_are_not_this_nodes(tmp_path):
    shutil.copyfile(README / "example-hostname-pid1639453.log", tmp_path / "example-hostname-pid1639453.log")
    c = collector(tmp_path)
    st = c.probe()
    assert st.availability is Availability.ACTIVE and "example-hostname" in st.reason
    append(tmp_path / "example-hostname-pid1639453.log", (README / "example-hostname-pid1639453.log").read_bytes())
    line = fixture_lines(STRAGGLER_V)[f"{HOST}-pid41201.log"][0]
    append(tmp_path / f"{HOST}-pid41201.log", line.replace(HOST.encode(), b"gpu-node-08"))  # wrong host inside
    assert values(c.collect(1.0)) == {}
    assert c.stats.discarded == 1
    anyhost = collector(tmp_path, hostname="*")
    append(tmp_path / "example-hostname-pid1639453.log", (README / "example-hostname-pid1639453.log").read_bytes()
           .replace(b'"coll_sn":1407', b'"coll_sn":1408'))
    assert ent(2, "0x7f8c496ae9f661") in values(anyhost.collect(1.0))


def test_textfile_mode_reads_each_rewrite_once(tmp_path):
    for f in PROM.glob("*.prom"):
        shutil.copyfile(f, tmp_path / f.name)
    c = NcclCollector("n1", {"textfile": str(tmp_path), "hostname": HOST})
    assert c.probe().availability is Availability.ACTIVE
    c.start()
    first = values(c.collect(1.0))
    assert sorted(first) == [ent(r) for r in range(8)]
    assert first[ent(5)]["nccl_collective_exec_p50_seconds"] == pytest.approx(47e-6)
    second = values(c.collect(2.0))
    assert "nccl_collective_exec_p50_seconds" not in second[ent(5)]  # unchanged file: nothing new
    assert second[ent(5)]["nccl_collectives_total"] == 5021
    f5 = next(tmp_path.glob("*0005.prom"))
    f5.write_text(f5.read_text().replace('coll_sn="5021"', 'coll_sn="5100"'))
    third = values(c.collect(3.0))
    assert third[ent(5)]["nccl_collectives_total"] == 5100 and "nccl_collective_exec_p50_seconds" in third[ent(5)]
    assert c.stats.errors == {}


def test_textfile_with_v5_aggregated_series_says_to_use_json_mode(tmp_path, caplog):
    shutil.copyfile(FIX / "inspector-prom-v5.1-aggregated" / "nccl_inspector_metrics_GPU0.prom",
                    tmp_path / "nccl_inspector_metrics_GPU0.prom")
    c = NcclCollector("n1", {"textfile": str(tmp_path), "hostname": "*"})
    assert values(c.collect(1.0)) == {}
    assert "use JSON mode (collectors.nccl.dump_dir)" in caplog.text
    assert "JSON mode" in c.unavailable_reason("nccl_collective_wait_p50_seconds")


# -- probe, config, catalogue --------------------------------------------------------------------------
def test_probe_says_why(tmp_path):
    absent = NcclCollector("n1", {})
    st = absent.probe()
    assert st.availability is Availability.ABSENT and "collectors.nccl.dump_dir" in st.reason
    assert NcclCollector("n1", {"required": True}).probe().availability is Availability.NEEDS_OPERATOR
    st = NcclCollector("n1", {"dump_dir": str(tmp_path / "no" / "such")}).probe()
    assert st.availability is Availability.NEEDS_OPERATOR and "nor does its parent" in st.reason
    st = NcclCollector("n1", {"dump_dir": str(tmp_path / "later")}).probe()
    assert st.availability is Availability.ACTIVE and "waiting for" in st.reason
    (tmp_path / "file").write_text("")
    st = NcclCollector("n1", {"dump_dir": str(tmp_path / "file")}).probe()
    assert st.availability is Availability.NEEDS_OPERATOR and "not a directory" in st.reason


def test_a_dump_dir_created_after_start_is_read_from_its_start(tmp_path):
    d = tmp_path / "later"
    c = collector(d)
    assert values(c.collect(1.0)) == {}
    d.mkdir()
    append(d / f"{HOST}-pid41201.log", b"".join(fixture_lines(STRAGGLER_V)[f"{HOST}-pid41201.log"][:3]))
    sn = records(STRAGGLER_V / f"{HOST}-pid41201.log")[2].sn
    assert values(c.collect(2.0))[ent(0)]["nccl_collectives_total"] == sn


@pytest.mark.parametrize("cfg, key", [
    ({"dump_dir": "relative/dir"}, "dump_dir"),
    ({"textfile": 5}, "textfile"),
    ({"dump_dir": "/tmp", "max_read_bytes": 10}, "max_read_bytes"),
    ({"dump_dir": "/tmp", "hostname": "a b"}, "hostname"),
])
def test_config_errors_name_the_key(cfg, key):
    with pytest.raises(ValueError, match=f"collectors.nccl.{key}"):
        NcclCollector("n1", cfg)


def test_registered_and_every_emitted_signal_is_catalogued_and_every_catalogued_one_emitted(tmp_path):
    assert collector_class("nccl") is COLLECTOR
    c = collector(tmp_path)
    for name, lines in fixture_lines(STRAGGLER_V).items():
        append(tmp_path / name, b"".join(lines))
    emitted = set()
    for t in (1.0, 2.0):
        emitted |= {s for sigs in values(c.collect(t)).values() for s in sigs}
    assert emitted == {s.name for s in CATALOGUE}
    assert {s.scope.value for s in CATALOGUE} == {"rank"}


def test_agent_check_lists_the_collector_inactive_with_its_reason(tmp_path):
    import io

    from skewd.agent.check import run_check
    from skewd.agent.config import load_config
    from skewd.agent.scheduler import collector_config_keys

    out = io.StringIO()
    cfg = load_config(None, env={}, collector_keys=collector_config_keys())
    run_check(cfg, out)
    line = next(x for x in out.getvalue().splitlines() if " nccl " in x)
    assert "INACTIVE" in line and "collectors.nccl.dump_dir" in line
    assert "inactive EW-1-nccl-rank-straggler" in out.getvalue()
    p = tmp_path / "agent.yaml"
    p.write_text(f"collectors:\n  nccl: {{dump_dir: {tmp_path}/gone/dump}}\n")
    out = io.StringIO()
    run_check(load_config(str(p), env={}, collector_keys=collector_config_keys()), out)
    line = next(x for x in out.getvalue().splitlines() if " nccl " in x)
    assert "INACTIVE" in line and "nor does its parent" in line


# -- the shipped rule on the collector's own output ----------------------------------------------------
def _second(lines: list[bytes], k: int) -> bytes:
    """The fixture's collectives replayed as second ``k``: sequence numbers and timestamps moved on."""
    n = 24  # collectives per fixture file (make_fixtures.py N_COLL)

    def shift(m: re.Match) -> bytes:
        return str(int(m.group(0)) + k * 1_000_000).encode()

    out = []
    for line in lines:
        line = re.sub(rb'"coll_sn":(\d+)', lambda m: b'"coll_sn":%d' % (int(m.group(1)) + k * n), line)
        out.append(re.sub(rb"\b1764\d{12}\b", shift, line))
    return b"".join(out)


@pytest.mark.parametrize("d, named", [(STRAGGLER_V, [ent(5)]), (STRAGGLER, [ent(5)]), (HEALTHY_V, [])],
                         ids=["straggler-verbose", "straggler-plain", "healthy"])
def test_the_shipped_rule_names_the_straggler_from_the_collectors_output(tmp_path, d, named):
    from skewd.catalogue import full_catalogue
    from skewd.rules.cli import PACKS
    from skewd.rules.engine import Engine
    from skewd.rules.loader import load_rules
    from skewd.rules.store import WindowStore

    cat = full_catalogue()
    store = WindowStore(cat)
    engine = Engine(load_rules([PACKS], cat).ruleset, store)
    c = collector(tmp_path)
    files = fixture_lines(d)
    firing: set[str] = set()
    for k in range(100):
        for name, lines in files.items():
            append(tmp_path / name, _second(lines, k))
        t = 1_764_147_600.0 + k
        store.ingest(c.collect(t))
        for f in engine.evaluate(t):
            if f.rule_id == "EW-1-nccl-rank-straggler" and f.state.value == "firing":
                firing.add(f.entity)
    assert sorted(firing) == named
    assert c.stats.errors == {}
