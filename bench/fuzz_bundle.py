"""Fuzz target ``bundle``: capture bundles with CRC-consistent tampering, replayed.

A bundle protects its segments with checksums, so random bytes only ever test the checksum.
This target writes a small segment with skewd's own ``SegmentWriter``, packs its files into
one input, mutates a file's content and re-seals it (:func:`_reseal` makes the index and the
rule checksums agree with the changed file again), so what is wrong is the content: the reader and replay (nodes and controller) must reject it with
their documented error, never crash.
"""
from __future__ import annotations

import hashlib
import json
import os
import random
import shutil
import tempfile
import zlib
from pathlib import Path
from typing import Any

from fuzz_mutate import Mutator, dumps


# -- capture bundles ---------------------------------------------------------------------------
RULES_FOR_BUNDLE = """required_engine_version: 1
rules:
  - id: FUZZ-busy
    pathology: custom-fuzz
    scope: node
    layer: host
    expr: avg(host_procs_running, 10s) > 2
  - id: FUZZ-kv
    pathology: custom-fuzz
    scope: engine
    layer: engine
    for: 2s
    expr: last(vllm_kv_cache_usage_ratio, 5s) > 0.5
"""


def _seed_bundle(d: Path) -> Path:
    """A small segment written by skewd's own SegmentWriter: samples of two nodes, ticks, findings,
    summaries, a stored rule file, a packets block."""
    from skewd import wire
    from skewd.agent import bundle as B
    from skewd.agent import summary as summary_mod
    from skewd.catalogue import full_catalogue
    from skewd.model import BatchBuilder, Finding, Layer, Scope, Severity, State
    from skewd.rules.store import WindowStore

    cat = full_catalogue()
    seg = d / "seg-000001"
    meta = {"cluster": "fz", "nodes": ["n1", "n2"], "recorder_node": "n1",
            "node_labels": {"n1": {"cluster": "fz", "model": "m"}, "n2": {"cluster": "fz", "model": "m"}},
            "settings": {"evaluation_interval": 1.0, "summary_interval": 1.0, "lookback": 30.0, "horizon": 120.0},
            "available_signals": None}
    w = B.SegmentWriter(seg, meta, [("rules.yaml", RULES_FOR_BUNDLE)])
    stores = {n: WindowStore(cat) for n in ("n1", "n2")}
    t0 = 1_700_000_000.0
    for k in range(8):
        t = t0 + k
        batches = []
        for n in ("n1", "n2"):
            b = BatchBuilder(n)
            b.add(t, "", "host_procs_running", float(k % 4))
            b.add(t, "engine0", "vllm_kv_cache_usage_ratio", 0.1 * k)
            b.add(t, "cpu0", "host_cpu_user_seconds_total", 10.0 + k)
            batches.append(b.build())
            stores[n].ingest(batches[-1])
        w.write_samples(batches)
        w.write_ticks([(t, w.batches, k % 2)])
        lines = []
        for n in ("n1", "n2"):
            msg = summary_mod.make_summary(stores[n], n, "fz", t, 1.0)
            lines.append(wire.encode(msg).decode())
        w.write_lines(B.SUMMARIES, lines, [t, t])
        if k % 3 == 0:
            f = Finding(rule_id="FUZZ-busy", pathology="custom-fuzz", severity=Severity.WARNING, layer=Layer.HOST,
                        scope=Scope.NODE, node="n1", entity="", state=State.FIRING, active_at=t, evaluated_at=t,
                        cluster="fz")
            w.write_lines(B.FINDINGS, [json.dumps(f.to_dict())], [t])
        w.write_packets([(int(t * 1e9), bytes(14) + b"\x45" + bytes(40), None, 1)])
    w.close([cat[s] for s in ("host_procs_running", "vllm_kv_cache_usage_ratio", "host_cpu_user_seconds_total")])
    return seg


def _pack(files: dict[str, bytes]) -> bytes:
    out = bytearray()
    for name in sorted(files):
        nb = name.encode()
        out += len(nb).to_bytes(2, "little") + nb + len(files[name]).to_bytes(4, "little") + files[name]
    return bytes(out)


def _unpack(data: bytes) -> dict[str, bytes]:
    files: dict[str, bytes] = {}
    i = 0
    while i + 6 <= len(data):
        n = int.from_bytes(data[i:i + 2], "little")
        name = data[i + 2:i + 2 + n].decode("utf-8", "replace")
        ln = int.from_bytes(data[i + 2 + n:i + 6 + n], "little")
        files[name] = data[i + 6 + n:i + 6 + n + ln]
        i += 6 + n + ln
    return files


def load_bundle() -> dict:
    base = Path(tempfile.mkdtemp(prefix="skewd-fuzz-bundle-", dir="/dev/shm" if os.path.isdir("/dev/shm") else None))
    seg = _seed_bundle(base / "seed")
    files = {str(p.relative_to(seg)): p.read_bytes() for p in sorted(seg.rglob("*")) if p.is_file()}
    from skewd.agent.replay import replay_catalogue  # noqa: F401 - imported once, not per input
    from skewd.catalogue import full_catalogue

    return {"seeds": [files], "dir": base / "in", "cat": full_catalogue(), "texts": [
        v for v in files.values()]}


def _reseal(files: dict[str, bytes], changed: str) -> None:
    """Make the index (and meta.json's rule checksums) agree with a changed file again: the
    damage is then in the content, which is what the readers must survive."""
    from skewd.agent import bundle as B

    if changed.startswith("rules/") and "meta.json" in files:
        try:
            meta = json.loads(files["meta.json"])
            for f in (meta.get("rules") or {}).get("files") or []:
                if isinstance(f, dict) and f.get("stored") == changed:
                    f["sha256"] = hashlib.sha256(files[changed]).hexdigest()
            files["meta.json"] = json.dumps(meta).encode()
        except (ValueError, AttributeError, TypeError, RecursionError):
            pass
        return
    if "index.jsonl" not in files or changed in ("index.jsonl", "meta.json"):
        return
    lines = files["index.jsonl"].split(b"\n")
    entries = []
    for ln in lines:
        try:
            entries.append(json.loads(ln) if ln.strip() else None)
        except (ValueError, RecursionError):
            entries.append(None)
    mine = [e for e in entries if isinstance(e, dict) and e.get("file") == changed]
    data = files[changed]
    if mine:
        # keep the chunk boundaries; the last chunk absorbs a change of length
        off = 0
        for k, e in enumerate(mine):
            ln_ = e.get("length") if isinstance(e.get("length"), int) else 0
            if k == len(mine) - 1:
                ln_ = max(0, len(data) - off)
            e["offset"], e["length"] = off, ln_
            e["crc32"] = zlib.crc32(data[off:off + ln_])
            off += ln_
    out = []
    for raw, e in zip(lines, entries):
        if isinstance(e, dict) and e.get("file") == changed:
            e.pop("line_crc32", None)
            if _finite_json(e):  # a mutant with NaN has no canonical form: keep the raw line
                e["line_crc32"] = B.line_crc(e)
                out.append(B.canon(e).encode())
            else:
                out.append(raw)
        else:
            out.append(raw)
    files["index.jsonl"] = b"\n".join(out)


def _finite_json(e: Any) -> bool:
    try:
        json.dumps(e, allow_nan=False)
        return True
    except (ValueError, TypeError, RecursionError):
        return False


def make_bundle(ctx: dict, rng: random.Random) -> bytes:
    files = dict(rng.choice(ctx["seeds"]))
    m = Mutator(rng, ctx["texts"], None, 1 << 20)
    for _ in range(rng.choice((1, 1, 2))):
        name = rng.choice(sorted(files))
        data = files[name]
        if name == "meta.json" or (name == "index.jsonl" and rng.random() < 0.5) or \
                (name.endswith(".jsonl") and rng.random() < 0.7):
            if name == "meta.json":
                try:
                    doc = json.loads(data)
                except (ValueError, RecursionError):  # an earlier round made it unreadable
                    files[name] = m.bytes_(data)
                    continue
                for _ in range(rng.choice((1, 1, 2, 3))):
                    doc = m.json(doc)
                files[name] = dumps(doc).encode("utf-8", "surrogatepass")
            else:
                lines = data.split(b"\n")
                i = rng.randrange(len(lines))
                try:
                    doc = json.loads(lines[i]) if lines[i].strip() else {}
                    doc = m.json(doc)
                    if isinstance(doc, dict) and name == "index.jsonl":
                        doc.pop("line_crc32", None)
                        from skewd.agent import bundle as B

                        if _finite_json(doc):
                            doc["line_crc32"] = B.line_crc(doc)
                    lines[i] = dumps(doc).encode("utf-8", "surrogatepass")
                except (ValueError, RecursionError):
                    lines[i] = m.bytes_(lines[i])
                files[name] = b"\n".join(lines)
        elif name.endswith(".yaml"):
            files[name] = m.text(data.decode("utf-8", "replace")).encode("utf-8", "surrogatepass")
        elif rng.random() < 0.15:
            del files[name]
            continue
        else:
            files[name] = m.bytes_(data, ints=[0, 1, 0xFFFFFFFF, 0x7FFFFFFF, 8, 0x10000000])
        if rng.random() < 0.85:
            _reseal(files, name)
    return _pack(files)


def run_bundle(ctx: dict, data: bytes) -> None:
    from skewd.agent import bundle as B
    from skewd.agent.replay import ClusterReplay, ReplayError, Replayer

    d: Path = ctx["dir"]
    shutil.rmtree(d, ignore_errors=True)
    seg_dir = d / "seg-000001"
    for name, content in _unpack(data).items():
        if ".." in name or name.startswith("/") or not name:
            continue
        p = seg_dir / name
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_bytes(content)
    try:
        seg = B.Segment(seg_dir)
    except B.BundleError:
        return
    try:
        seg.verify()
        for _ in seg.iter_batches():
            pass
        seg.ticks()
        seg.findings()
        seg.summaries()
        seg.readable_batches()
        for name in (B.SAMPLES, B.TICKS, B.FINDINGS, B.SUMMARIES):
            seg.readable_until(name)
        (seg.start, seg.end, seg.nodes, seg.node_labels, seg.settings, seg.cluster, seg.catalogue())
        try:
            # as `skewd replay` runs by default: the nodes and the controller fed with what they sent
            ClusterReplay(Replayer([seg], ctx["cat"])).run()
        except (ReplayError, B.BundleError):
            pass
    finally:
        seg.close()
