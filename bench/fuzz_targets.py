"""The per-parser fuzz targets and their registry :data:`TARGETS`.

One section per parser family: YAML and rule files, rule expressions, Prometheus text pages,
pcap/pcapng framing and capture files under the decompression budget, /proc and sysfs files,
wire messages; NVML (:mod:`fuzz_nvml`) and capture bundles (:mod:`fuzz_bundle`) are modules of
their own. Each target says how to load its seeds, make an input, run the parser, and which
exception types the parser documents (:func:`_expected`): anything else is a bug.
"""
from __future__ import annotations

import gzip
import io
import json
import os
import random
import re
import struct
import tempfile
import zlib
from pathlib import Path
from typing import Any

from fuzz_bundle import load_bundle, make_bundle, run_bundle
from fuzz_mutate import NUMBERS, Mutator, dumps
from fuzz_nvml import load_nvml, make_nvml, run_nvml
from fuzz_seeds import FIX, ROOT, SHARED, Target, _read_seeds, _yaml_pieces, make_bytes, make_text


# -- YAML and rules ----------------------------------------------------------------------------
YAML_TOKENS = ["&a ", "*a", "&b [*a, *a, *a, *a]", "<<: *a", "!!python/object/apply:os.system ['true']",
               "!!binary", "!!float", "!!int", "!!timestamp 2023-13-45", "!!set", "!!omap", "? ", "- ", ": ",
               "---\n", "...\n", "%YAML 1.1\n", "|\n", ">-\n", "{a: 1}", "[1, 2]", "~", "null", "yes", "NO",
               "2001-12-14t21:59:43.10-05:00", "0o17", "1:30:00", "\"\\u0000\"", "'''", "\t", "\n  ", "\n- ",
               "expr: ", "params: ", "for: ", "id: ", "scope: ", "rules:\n", "macros:\n", "lists:\n",
               "override: {expr: append}", "required_engine_version: ", "pathology: {a: 1}", "tags: [stable]"]
EXPR_TOKENS = ["rate(", "avg(", "increase(", "quantile(", "last(", "age(", "gaps(", "longest_gap(", "peer_median(",
               "peer_zscore(", "bitand(", "default(", "greatest(", "least(", "abs(", "spread(", "rank(", "p99(",
               " and ", " or ", "not ", " > ", " < ", " == ", " != ", " in ", " not in ", " ** ", " % ", " / ", "-",
               "(", ")", ", ", "1m", "30s", "5m", "250ms", "1h30m", "0s", "99999999999999999999999h", "1e309",
               "10**400", "entity", "node", "[1, 2]", "'x'", "__class__", ".__dict__", "lambda x: x", "x[0]",
               "f(*a)", "f(k=1)", "#", "_d0_", "0.5", "gpu_utilization_ratio", "vllm_kv_cache_usage_ratio",
               "host_tcp_retrans_segs_total", "pcie_rx_bytes_total", "netdev_qdisc_backlog_bytes"]


def _rule_files() -> list[Path]:
    return (sorted((ROOT / "rules" / "packs").glob("*.yaml")) + sorted((ROOT / "tests" / "rules" / "data").glob("*.yaml"))
            + sorted((ROOT / "rules" / "tests").glob("*.yaml")))


def load_yaml() -> dict:
    files = _rule_files() + sorted((ROOT / "lab" / "sim" / "scenarios").glob("*.yaml")) \
        + sorted((ROOT / "collectors" / "exporter" / "mappings").glob("*.yaml")) \
        + sorted((FIX / "exporter" / "mappings").glob("*.yaml")) + sorted((ROOT / "deploy").rglob("*.yaml"))
    return {"seeds": _yaml_pieces(files)}


def run_yaml(ctx: dict, data: bytes) -> None:
    from skewd.rules.yamlpos import load

    load(data.decode("utf-8", "replace"), "fuzz.yaml")


class _RuleEval:
    """Evaluates a loaded rule set on a few ticks of made-up samples for every signal it reads."""

    def __init__(self) -> None:
        from skewd.catalogue import full_catalogue

        self.cat = full_catalogue()

    def run(self, ruleset: Any, rng_seed: int) -> None:
        import numpy as np

        from skewd.model import BatchBuilder
        from skewd.rules.engine import Engine
        from skewd.rules.store import WindowStore

        store = WindowStore(self.cat, horizon=120.0)
        eng = Engine(ruleset, store, lookback=30.0)
        signals = sorted({s for r in ruleset.rules for s in r.requires if s in self.cat})
        rng = np.random.default_rng(rng_seed)
        vals = np.array([0.0, 1.0, -1.0, 0.5, 1e308, -1e308, np.nan, np.inf, -np.inf, 2.0 ** 64, 5e-324, 1e9])
        for tick in range(3):
            t = 1_700_000_000.0 + tick
            b = BatchBuilder("n1")
            for s in signals:
                scope = self.cat[s].scope.value
                for e in ("", f"{scope}0", f"{scope}1") if scope != "node" else ("",):
                    b.add(t, e, s, float(vals[rng.integers(len(vals))]))
            store.ingest(b.build())
            eng.evaluate(t)


def load_rules_ctx() -> dict:
    return {"seeds": _yaml_pieces(_rule_files()), "eval": _RuleEval()}


def run_rules(ctx: dict, data: bytes) -> None:
    from skewd.rules.loader import load_rules

    name = "/fuzz/rules.yaml"
    res = load_rules([name], ctx["eval"].cat, texts={name: data.decode("utf-8", "replace")})
    if res.ok and res.ruleset.rules:
        ctx["eval"].run(res.ruleset, zlib.crc32(data))


def load_expr() -> dict:
    """(scope, params, expr) of every shipped rule, and the packs' macros and lists."""
    import yaml

    seeds, macros, lists = [], [], []
    for p in _rule_files():
        if ".bad." in p.name:
            continue
        try:
            doc = yaml.safe_load(p.read_text())
        except (yaml.YAMLError, RecursionError):
            continue
        if not isinstance(doc, dict):
            continue
        macros += [m for m in doc.get("macros") or [] if isinstance(m, dict)]
        lists += [x for x in doc.get("lists") or [] if isinstance(x, dict)]
        for r in doc.get("rules") or []:
            if isinstance(r, dict) and isinstance(r.get("expr"), str) and r.get("scope"):
                seeds.append({"scope": r["scope"], "params": r.get("params") or {}, "expr": r["expr"]})
    return {"seeds": seeds, "macros": macros, "lists": lists, "eval": _RuleEval(),
            "texts": [s["expr"] for s in seeds]}


def make_expr(ctx: dict, rng: random.Random) -> bytes:
    seed = json.loads(json.dumps(rng.choice(ctx["seeds"])))
    m = Mutator(rng, ctx["texts"], EXPR_TOKENS, 8192, deep=400)
    if rng.random() < 0.85:
        seed["expr"] = m.text(seed["expr"])
    if rng.random() < 0.3 and seed["params"]:
        k = rng.choice(sorted(seed["params"]))
        seed["params"][k] = rng.choice((rng.choice(NUMBERS), m.value(), m.text(str(seed["params"][k]))))
    if rng.random() < 0.1:
        seed["scope"] = rng.choice(("gpu", "node", "engine", "cluster", "tp_group", "flow", "bogus"))
    return dumps(seed).encode("utf-8", "surrogatepass")


def run_expr(ctx: dict, data: bytes) -> None:
    from skewd.rules.loader import load_rules

    d = json.loads(data)
    rule = {"id": "FUZZ", "pathology": "custom-fuzz", "scope": d["scope"], "layer": "host",
            "params": d["params"], "expr": d["expr"]}
    doc = {"required_engine_version": 1, "macros": ctx["macros"], "lists": ctx["lists"], "rules": [rule]}
    name = "/fuzz/expr.yaml"
    res = load_rules([name], ctx["eval"].cat, texts={name: dumps(doc)})
    if res.ok:
        ctx["eval"].run(res.ruleset, zlib.crc32(data))


# -- Prometheus text ---------------------------------------------------------------------------
PROM_TOKENS = ["# HELP ", "# TYPE ", " counter\n", " gauge\n", " histogram\n", " summary\n", " untyped\n",
               "{", "}", "=\"", "\",", "le=\"+Inf\"", "le=\"NaN\"", "le=\"abc\"", "_bucket", "_count", "_sum",
               "_total", "_created", "vllm:", "model_name=\"m\"", "engine=\"0\"", " NaN", " +Inf", " -Inf",
               " 1e309", " 1 1700000000000", "\\n", "\\\"", "# EOF\n", "nccl_collective_exec_time_microseconds",
               "rank=\"x\"", "coll_sn=\"-1\"", "message_size=\"2.00GB\"", "DCGM_FI_DEV_GPU_UTIL", "gpu=\"0\""]


def load_prom() -> dict:
    paths = sorted((SHARED / "vllm-metrics").glob("*.prom")) + sorted(FIX.glob("vllm/*/*")) \
        + sorted(FIX.glob("exporter/*/metrics.prom")) + sorted(FIX.glob("nccl/inspector-prom*/**/*.prom"))
    pages = [p.decode("utf-8", "replace") for p in _read_seeds([p for p in paths if p.is_file()], 1 << 20)]
    seeds = list(pages)
    for page in pages:  # families one by one and a few together: most mutants then stay small
        fams = re.split(r"(?m)^(?=# HELP )", page)
        seeds += [f for f in fams if f.strip()]
        seeds += ["".join(fams[i:i + 4]) for i in range(0, len(fams), 4)]
    from skewd.catalogue import full_catalogue
    from skewd.collectors.exporter import mapping as mapping_mod

    cat = full_catalogue()
    mappings = []
    for name in ("dcgm-exporter", "doca-telemetry"):
        try:
            mappings.append(mapping_mod.load(mapping_mod.resolve(name), cat))
        except Exception:  # noqa: BLE001 - a mapping renamed since: fuzz with those that load
            pass
    return {"seeds": seeds, "mappings": mappings}


def run_prom(ctx: dict, data: bytes) -> None:
    from skewd.collectors.exporter.parse import apply
    from skewd.collectors.nccl.parse import parse_textfile
    from skewd.collectors.vllm.parse import derive, parse_page

    text = data.decode("utf-8", "replace")
    k = zlib.crc32(data) % 3
    if k == 0:
        page = parse_page(text)
        prev = None
        for eng in page.values():
            derive(prev, eng, 1.0)
            derive(eng, eng, 0.0)
            prev = eng
    elif k == 1:
        for mp_ in ctx["mappings"]:
            apply(mp_, text)
    else:
        parse_textfile(text)


# -- captures ----------------------------------------------------------------------------------
PCAP_INTS = [0xA1B2C3D4, 0xA1B23C4D, 0x0A0D0D0A, 0x1A2B3C4D, 1, 2, 3, 5, 6, 9, 14, 0x7F, 0x80, 0xFF, 1 << 28,
             (1 << 28) + 1, 65535, 0xFFFFFFF0, 12, 16, 24, 28, 32, 101, 113, 276, 0x0800, 0x86DD, 0x8100, 4791]


def _captures() -> list[Path]:
    files = sorted(p for p in (SHARED / "pcaps").glob("*") if p.suffix in (".pcap", ".cap", ".pcapng"))
    files += sorted(p for p in FIX.glob("pkt/**/*") if p.suffix in (".pcap", ".pcapng", ".cap"))
    return files


def load_pcap() -> dict:
    seeds = _read_seeds(_captures(), 16 << 10)
    zst = SHARED / "pcaps" / "pcapng-example.pcapng.zst"
    if zst.exists():
        try:
            import zstandard

            seeds.append(zstandard.ZstdDecompressor().stream_reader(io.BytesIO(zst.read_bytes())).read(16 << 10))
        except ImportError:
            pass
    return {"seeds": seeds}


def run_pcap(ctx: dict, data: bytes) -> None:
    import numpy as np

    from skewd.collectors.pkt.capfile import parse_capture
    from skewd.collectors.pkt.parse import counts, decode

    cap = parse_capture(np.frombuffer(data, np.uint8), "fuzz.pcap")
    counts(decode(cap.frames))


def load_capfile() -> dict:
    ctx = load_pcap()
    raw = ctx["seeds"][:12]
    seeds = list(raw) + [gzip.compress(s) for s in raw]
    try:
        import zstandard

        seeds += [zstandard.ZstdCompressor().compress(s) for s in raw]
    except ImportError:
        pass
    d = Path(tempfile.mkdtemp(prefix="skewd-fuzz-cap-", dir="/dev/shm" if os.path.isdir("/dev/shm") else None))
    return {"seeds": seeds, "dir": d}


def run_capfile(ctx: dict, data: bytes) -> None:
    from skewd.collectors.pkt.capfile import CaptureLimits, read_capture

    p = ctx["dir"] / "in.cap"
    p.write_bytes(data)
    read_capture(p, limits=CaptureLimits(max_decompressed=16 << 20, ratio_floor=4 << 20))


# -- /proc and sysfs files ---------------------------------------------------------------------
def load_procfs() -> dict:
    """(kind, text) seeds from the recorded trees; the kind picks the parse function."""
    seeds: list[bytes] = []

    def add(kind: str, paths: list[Path]) -> None:
        for p in paths:
            if p.is_file():
                seeds.append(kind.encode() + b"\n" + p.read_bytes()[: 32 << 10])

    for tree in FIX.glob("host/*/proc"):
        add("stat", [tree / "stat"])
        add("softirqs", [tree / "softirqs"])
        add("snmp", [tree / "net" / "snmp"])
        add("loadavg", [tree / "loadavg"])
    rdma = list(FIX.glob("rdma/*/sys/class/infiniband/*/ports/*"))
    for port in rdma:
        for f in port.rglob("*"):
            if f.is_file():
                add("rdma:" + str(f.relative_to(port)), [f])
    add("rdma-resource", list(FIX.glob("rdma/*/*.json")))
    for dev in FIX.glob("pcie/*/sys/bus/pci/devices/*"):
        for name in ("current_link_speed", "max_link_speed", "current_link_width", "max_link_width",
                     "aer_dev_correctable", "aer_dev_nonfatal", "aer_dev_fatal", "numa_node", "class"):
            add("pcie:" + name, [dev / name])
    for speed in FIX.glob("netdev/*/sys/class/net/*/speed"):
        add("netdev-speed", [speed])
    for jf in FIX.glob("nccl/*/*.json*"):
        add("nccl-json", [jf])
    for pf in FIX.glob("nccl/*/*.prom"):
        add("nccl-prom", [pf])
    seeds += [b"pci-class\n0x0302", b"pci-address\n0000:3b:00.0", b"bus-id\n00000000:1B:00.0"]
    return {"seeds": seeds}


def make_procfs(ctx: dict, rng: random.Random) -> bytes:
    seed = rng.choice(ctx["seeds"])
    kind, _, body = seed.partition(b"\n")
    m = Mutator(rng, ctx["seeds"], ["\n", " ", ":", "\t", "N/A (no PMA)", "4: ACTIVE", "100 Gb/sec (4X EDR)",
                                     "Unknown", "-1", "8.0 GT/s PCIe", "16 GT/s", "x16", "TOTAL_ERR_COR ", "cpu",
                                     "cpu99 ", "procs_running ", "Tcp: ", "Udp: ", "NET_RX:", "{", "}",
                                     "\"coll_perf\":", "\"dump_stats\":"], 1 << 15)
    if rng.random() < 0.5:
        new = m.text(body.decode("utf-8", "replace")).encode("utf-8", "surrogatepass")
    else:
        new = m.bytes_(body)
    return kind + b"\n" + new


def run_procfs(ctx: dict, data: bytes) -> None:
    from skewd.collectors.host import parse as host
    from skewd.collectors.nccl import parse as nccl
    from skewd.collectors.netdev import parse as netdev
    from skewd.collectors.nvml_backend import normalise_bus_id
    from skewd.collectors.pcie import parse as pcie
    from skewd.collectors.rdma import parse as rdma

    kind_b, _, body = data.partition(b"\n")
    kind = kind_b.decode("utf-8", "replace")
    text = body.decode("utf-8", "replace")
    if kind == "stat":
        host.parse_stat(text)
    elif kind == "softirqs":
        host.parse_softirqs(text)
    elif kind == "snmp":
        host.parse_snmp(text)
    elif kind == "loadavg":
        host.parse_loadavg(text)
    elif kind.startswith("rdma:"):
        rdma.port_samples("mlx5_0/1", {kind[5:]: text})
    elif kind == "rdma-resource":
        rdma.resource_samples(text)
    elif kind.startswith("pcie:"):
        if kind == "pcie:class":
            pcie.pci_class(text)
        else:
            pcie.device_samples({kind[5:]: text})
    elif kind == "netdev-speed":
        netdev.speed_samples("eth0", text)
    elif kind == "nccl-json":
        stream = nccl.JsonStream()
        for line in body.splitlines():
            try:
                stream.feed(line)
            except nccl.RecordError:
                pass
    elif kind == "nccl-prom":
        nccl.parse_textfile(text)
    elif kind == "pci-class":
        pcie.parse_class_filter(text)
    elif kind == "pci-address":
        pcie.normalise_address(text)
    elif kind == "bus-id":
        normalise_bus_id(text)


# -- wire messages -----------------------------------------------------------------------------
def _sample_messages() -> list[bytes]:
    from skewd import wire
    from skewd.model import Finding, Layer, Scope, Severity, State

    f = Finding(rule_id="EW-1-straggler", pathology="EW-1", severity=Severity.CRITICAL, layer=Layer.NETWORK,
                scope=Scope.NODE, node="n1", entity="", state=State.FIRING, active_at=1_700_000_000.5,
                evaluated_at=1_700_000_010.0, cluster="c1", labels={"model": "m"}, summary="slow",
                evidence={"rate(x, 1m)": 1.5}, mitigation="drain")
    msgs = [wire.encode(f)]
    s = wire.Summary(node="n1", cluster="c1", t=1_700_000_000.0, interval=1.0,
                     signals={"pkt_flow_gap_p99_seconds": {"": 0.01, "udp 10.0.0.1:1>10.0.0.2:2": 0.2},
                              "collective_burst_starts": {"0": 1_699_999_999.5}},
                     clock_sync=wire.ClockSync(True, 0.002), agent_version="0.1.0", labels={"model": "m"})
    msgs.append(wire.encode(s))
    h = wire.Health(node="n1", cluster="c1", t=1_700_000_000.0,
                    collectors={"gpu": wire.CollectorHealth(state="active", reason="")},
                    rules=wire.RulesHealth(active=3, inactive={"X": "no signal"}),
                    last_reload=wire.ReloadStatus(ok=True), spool_depth=2, drops={"spool_full": 1},
                    agent_version="0.1.0")
    msgs.append(wire.encode(h))
    return msgs


def load_wire() -> dict:
    return {"seeds": _sample_messages()}


def make_wire(ctx: dict, rng: random.Random) -> bytes:
    seed = rng.choice(ctx["seeds"])
    m = Mutator(rng, ctx["seeds"], ['"schema": 99', '"kind": "summary"', "NaN", "Infinity", "-Infinity", "1e400",
                                    "[", "{", '"t": ', '"labels": [1, 2]', "\\u0000", "\\ud800"], 1 << 16)
    k = rng.randrange(3)
    if k == 0:
        doc = json.loads(seed)
        for _ in range(rng.choice((1, 1, 2, 3))):
            doc = m.json(doc)
        return dumps(doc).encode("utf-8", "surrogatepass")
    if k == 1:
        return m.text(seed.decode()).encode("utf-8", "surrogatepass")
    return m.bytes_(seed)


def run_wire(ctx: dict, data: bytes) -> None:
    from skewd import wire

    k = zlib.crc32(data) % 4
    if k == 0:
        wire.decode(data)
    elif k == 1:
        wire.decode_finding(data)
    elif k == 2:
        wire.decode_summary(data)
    else:
        wire.decode_health(data)


# -- binary summaries: the reader and the controller's intake ------------------------------------
def _binary_seed_summaries() -> list:
    from skewd import wire

    t = 1_700_000_000.0
    sig = {"summary_gpu_util_mean_ratio": {"": 0.8}, "summary_requests_waiting": {"": None},
           "engine_phase": {"engine0": 1.0, "engine1": 2.0}, "engine_ttft_p50_seconds": {"engine0": 0.2},
           "summary_engine_phase": {"": 1.0}, "summary_kv_cache_usage_ratio": {"": 0.6}}
    starts = {str(k): t - 1 + 0.05 * k for k in range(20)}
    return [
        wire.Summary(node="n1", cluster="c1", t=t, interval=1.0, signals={**sig, "collective_burst_starts": starts},
                     clock_sync=wire.ClockSync(True, 0.002), agent_version="0.1.0", labels={"tp_group": "tp0"}),
        wire.Summary(node="n2", cluster="c1", t=t, interval=1.0,
                     signals={"summary_pcie_rx_bytes_per_second": {"": 1e10}, "collective_burst_starts": starts,
                              "collective_burst_bytes": {k: 6.4e7 for k in starts}},
                     clock_sync=wire.ClockSync(False, None), agent_version="0.1.0"),
    ]


def load_wire_binary() -> dict:
    """Binary summaries with and without their layouts, and an offline controller whose
    intake takes every input (its ``errors`` count must not move: an exception inside the
    intake is a bug even though the callback survives it)."""
    from skewd import wire
    from skewd.controller.config import load_config
    from skewd.controller.offline import CaptureJetStream, MemoryState
    from skewd.controller.service import Controller

    seeds, layouts = [], []
    for s in _binary_seed_summaries():
        enc = wire.SummaryEncoder()
        seeds += [enc.encode(s), enc.encode(s)]
        layouts.append((s.node, wire.make_layout(s.signals)))
    cfg = load_config(None, env={}, overrides={"cluster": "c1", "log": {"level": "error"},
                                              "ingest": {"max_clock_skew": "0s", "max_nodes": 64}})
    ctl = Controller(cfg, wall_clock=lambda: 0.0)
    ctl.state, ctl.js = MemoryState("c1"), CaptureJetStream()
    return {"seeds": seeds, "layouts": layouts, "controller": ctl}


def make_wire_binary(ctx: dict, rng: random.Random) -> bytes:
    import msgspec

    from skewd import wire

    seed = rng.choice(ctx["seeds"])
    m = Mutator(rng, ctx["seeds"])
    k = rng.randrange(4)
    if k == 0:  # bytes as they come
        return m.bytes_(seed)
    fields = list(msgspec.msgpack.decode(seed[4:]))
    for _ in range(rng.choice((1, 1, 2, 3))):
        i = rng.randrange(len(fields) + 1)
        if i == len(fields):
            fields.append(m.value())  # a field a later version might add
        elif isinstance(fields[i], bytes) and fields[i] and rng.random() < 0.7:
            if i == 9 and rng.random() < 0.5:  # the layout: a mutated one, its id made to match
                try:
                    pairs = msgspec.msgpack.decode(fields[i])
                except (msgspec.DecodeError, ValueError):  # mutated before (bad UTF-8 is a ValueError)
                    pairs = []
                lay = m.bytes_(fields[i]) if rng.random() < 0.5 or not isinstance(pairs, list) else \
                    _packed(_mutated_layout(rng, m, pairs))
                fields[8], fields[9] = wire.layout_id(lay), lay
            else:  # values, starts or bytes: odd float64s or a broken run
                a = bytearray(fields[i])
                j = rng.randrange(0, len(a), 8) if rng.random() < 0.8 else rng.randrange(len(a))
                a[j:j + 8] = struct.pack("<d", rng.choice((float("nan"), float("inf"), -float("inf"), 1e308,
                                                            -0.0, 5e-324, 1.7e9, -1.7e9)))
                fields[i] = bytes(a) if rng.random() < 0.9 else bytes(a[:-rng.randrange(1, 9)])
        else:
            fields[i] = m.value()
    body = _packed([f if _packed(f) else None for f in fields])
    return (seed[:4] if rng.random() < 0.95 else bytes([0x93, 0x53, 0x4B, rng.randrange(256)])) + body


def _packed(v: Any) -> bytes:
    """``v`` as MessagePack; empty when it cannot be (an int beyond 64 bits, a lone surrogate)."""
    import msgspec

    try:
        return msgspec.msgpack.encode(v)
    except Exception:  # noqa: BLE001 - MessagePack has neither
        return b""


def _mutated_layout(rng: random.Random, m: Mutator, pairs: list) -> list:
    pairs = [list(p) if isinstance(p, list) else p for p in pairs]
    op = rng.randrange(5)
    if op == 0 and pairs:
        pairs.append(pairs[rng.randrange(len(pairs))])  # a signal twice
    elif op == 1 and pairs:
        p = pairs[rng.randrange(len(pairs))]
        if isinstance(p, list) and len(p) == 2 and isinstance(p[1], list):
            p[1] = p[1] + p[1][:1]  # an entity twice
    elif op == 2:
        pairs.append([rng.choice(("collective_burst_starts", "ctl_x", "engine_phase", "x" * 300)), [""]])
    elif op == 3 and pairs:
        pairs[rng.randrange(len(pairs))] = m.value()
    else:
        rng.shuffle(pairs)
    return pairs


def run_wire_binary(ctx: dict, data: bytes) -> None:
    from skewd import wire

    reader = wire.BinarySummaryReader()
    for node, lay in ctx["layouts"]:
        reader.book.keep(node, lay)
    ctl = ctx["controller"]
    for node, lay in ctx["layouts"]:  # each input on the same state: reproducible from its index alone
        ctl._forget_node(node)
        ctl.feed.flush()
        ctl.layouts.keep(node, lay)
    errors = ctl.stats.errors
    ctl._take_binary("skewd.v1.summary.c1.n1", data)
    ctl._take_binary("skewd.v1.summary.c1.n2", data)
    if ctl.stats.errors != errors:
        raise RuntimeError("the controller's binary intake raised (see its log) on this input")
    reader.read(data)


TARGETS: dict[str, Target] = {t.name: t for t in [
    Target("yaml", "rules/yamlpos.py: YAML with positions, alias and depth budgets", (),
           load_yaml, lambda c, r: make_text(c, r, YAML_TOKENS), run_yaml),
    Target("rules", "rules/loader.py + expr.py: rule files loaded, compiled and evaluated", (),
           load_rules_ctx, lambda c, r: make_text(c, r, YAML_TOKENS + EXPR_TOKENS), run_rules),
    Target("expr", "rules/expr.py: expressions (and params) compiled and evaluated", (),
           load_expr, make_expr, run_expr),
    Target("prometheus", "collectors/vllm, exporter, nccl: Prometheus text pages", (ValueError,),
           load_prom, lambda c, r: make_text(c, r, PROM_TOKENS, 1 << 17), run_prom),
    Target("pcap", "collectors/pkt/capfile.py + parse.py: pcap/pcapng framing and header decode",
           (), load_pcap, lambda c, r: make_bytes(c, r, PCAP_INTS), run_pcap),
    Target("capture-file", "collectors/pkt/capfile.py: files, gzip/zstd under the decompression budget",
           (), load_capfile, lambda c, r: make_bytes(c, r, PCAP_INTS), run_capfile),
    Target("proc-sysfs", "collectors/{host,rdma,pcie,netdev,nccl}/parse.py: /proc, sysfs, Inspector files",
           (ValueError,), load_procfs, make_procfs, run_procfs),
    Target("nvml", "collectors/nvml_backend.py + gpu/pcie parse: NVML answers through the pynvml double",
           (), load_nvml, make_nvml, run_nvml),
    Target("wire", "skewd/wire/decoding.py: decode of findings, summaries, health", (), load_wire, make_wire, run_wire),
    Target("wire-binary", "skewd/wire/binsummary.py + controller/intake.py: binary summaries read and taken in",
           (), load_wire_binary, make_wire_binary, run_wire_binary),
    Target("bundle", "agent/bundle/ + agent/replay (nodes and controller): segments with CRC-consistent tampering",
           (), load_bundle, make_bundle, run_bundle),
]}


def _expected(name: str) -> tuple[type[BaseException], ...]:
    """The documented error types of a target (imported lazily: workers import what they run)."""
    if name == "yaml":
        from skewd.rules.yamlpos import YamlError

        return (YamlError,)
    if name in ("pcap", "capture-file"):
        from skewd.collectors.pkt.capfile import CaptureError

        return (CaptureError,)
    if name in ("wire", "wire-binary"):
        from skewd.wire import WireError

        return (WireError,)
    if name == "bundle":
        from skewd.agent.bundle import BundleError

        return (BundleError,)
    return TARGETS[name].expected
