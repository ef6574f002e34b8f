"""Classic BPF capture filters, generated here because fresh hosts have no libpcap.

The kernel runs the filter on every frame before it is copied into the capture ring, so a
good filter is the cheapest way to keep a busy port affordable. Without libpcap there is no
filter compiler, so this module generates programs for the small set of expressions a
skew-detection agent needs (the instruction sequences follow what ``tcpdump -dd`` emits):

    ip | ip6 | tcp | udp | [tcp|udp] [src|dst] port N | host A.B.C.D | roce
    ... joined with "or", e.g.  "udp dst port 4791 or tcp port 8000"

Anything else: compile it where tcpdump exists (``tcpdump -i IF -ddd EXPR``) and pass the
program as ``filter_program`` (the ``-ddd`` text or a list of ``[code, jt, jf, k]``).

Every program accepts with ``ret #snaplen``: the kernel then copies only the headers.
Programs are generated for Ethernet framing (also Linux loopback) and for interfaces that
carry bare IP (``ARPHRD_NONE``: tun, wireguard, ...), where the IP header is at offset 0.
"""
from __future__ import annotations

import ipaddress
import re
import struct
from dataclasses import dataclass
from typing import Sequence, Union

# opcodes (linux/filter.h)
LD_H_ABS, LD_B_ABS, LD_W_ABS = 0x28, 0x30, 0x20
LD_H_IND = 0x48
LDX_B_MSH = 0xB1
JEQ_K, JSET_K = 0x15, 0x45
AND_K = 0x54
RET_K = 0x06
ROCE_PORT = 4791

Insn = tuple[int, int, int, int]


class FilterError(ValueError):
    """The expression is outside the supported set (the message lists what is)."""


SUPPORTED = ("ip", "ip6", "tcp", "udp", "[tcp|udp] [src|dst] port N", "host A.B.C.D", "roce (= udp dst port 4791)")


@dataclass(frozen=True)
class _Prim:
    kind: str  # ip, ip6, proto, port, host
    proto: int | None = None  # 6, 17 or None for both
    port: int | None = None
    dir: str = ""  # "", "src", "dst"
    host: int | None = None


_TOK = re.compile(r"\s+")


def _parse(expr: str) -> list[_Prim]:
    prims: list[_Prim] = []
    for part in re.split(r"\s+or\s+|\s*\|\|\s*", expr.strip()):
        w = [x for x in _TOK.split(part.strip().lower()) if x]
        if not w:
            raise FilterError(f"empty term in filter {expr!r}")
        if w in (["ip"], ["ip6"]):
            prims.append(_Prim(w[0]))
            continue
        if w == ["roce"]:
            prims.append(_Prim("port", 17, ROCE_PORT, "dst"))
            continue
        if w in (["tcp"], ["udp"]):
            prims.append(_Prim("proto", 6 if w[0] == "tcp" else 17))
            continue
        if len(w) == 2 and w[0] == "host":
            try:
                prims.append(_Prim("host", host=int(ipaddress.IPv4Address(w[1]))))
            except ValueError:
                raise FilterError(f"host {w[1]!r}: only IPv4 addresses are supported in generated filters") from None
            continue
        proto = None
        if w and w[0] in ("tcp", "udp"):
            proto = 6 if w[0] == "tcp" else 17
            w = w[1:]
        d = ""
        if w and w[0] in ("src", "dst"):
            d, w = w[0], w[1:]
        if len(w) == 2 and w[0] == "port" and w[1].isdigit() and 0 < int(w[1]) < 65536:
            prims.append(_Prim("port", proto, int(w[1]), d))
            continue
        raise FilterError(f"unsupported filter term {part.strip()!r}: supported are {', '.join(SUPPORTED)} "
                          f"joined with 'or'; for anything else set filter_program to the output of "
                          f"'tcpdump -ddd <expression>' run where libpcap exists")
    return prims


class _Asm:
    """Instructions with symbolic jump targets, resolved to relative offsets at the end."""

    def __init__(self) -> None:
        self.code: list[tuple[int, object, object, int]] = []
        self.labels: dict[str, int] = {}

    def op(self, code: int, k: int = 0, jt: object = 0, jf: object = 0) -> None:
        self.code.append((code, jt, jf, k))

    def label(self, name: str) -> None:
        self.labels[name] = len(self.code)

    def build(self) -> list[Insn]:
        out: list[Insn] = []
        for i, (code, jt, jf, k) in enumerate(self.code):
            rel = []
            for t in (jt, jf):
                if isinstance(t, str):
                    d = self.labels[t] - i - 1
                    if not 0 <= d < 256:
                        raise FilterError("filter too long for classic BPF jumps")
                    rel.append(d)
                else:
                    rel.append(int(t))
            out.append((code, rel[0], rel[1], k))
        return out


def compile_filter(expr: str | None, snaplen: int, link: str = "ethernet") -> list[Insn]:
    """Classic BPF program for ``expr`` (None/"" = accept everything, truncated to snaplen).

    ``link``: "ethernet" (Ethernet or Linux loopback framing) or "raw" (bare IP)."""
    if link not in ("ethernet", "raw"):
        raise FilterError(f"no generated filters for link {link!r}")
    a = _Asm()
    if not expr or not expr.strip():
        a.op(RET_K, snaplen)
        return a.build()
    prims = _parse(expr)
    l2 = 14 if link == "ethernet" else 0
    for i, p in enumerate(prims):
        nxt = f"t{i + 1}" if i + 1 < len(prims) else "reject"
        _prim(a, p, l2, link, nxt, i)
        a.label(f"t{i + 1}")
    a.label("reject")
    a.op(RET_K, 0)
    a.label("accept")
    a.op(RET_K, snaplen)
    return a.build()


def _family(a: _Asm, link: str, v4: object, v6: object, other: object) -> None:
    """Branch on the network protocol: to ``v4``/``v6``/``other``."""
    if link == "ethernet":
        a.op(LD_H_ABS, 12)
        a.op(JEQ_K, 0x0800, v4, 0)
        a.op(JEQ_K, 0x86DD, v6, other)
    else:
        a.op(LD_B_ABS, 0)
        a.op(AND_K, 0xF0)
        a.op(JEQ_K, 0x40, v4, 0)
        a.op(JEQ_K, 0x60, v6, other)


def _prim(a: _Asm, p: _Prim, l2: int, link: str, nxt: str, i: int) -> None:
    v4, v6 = f"p{i}v4", f"p{i}v6"
    if p.kind == "ip":
        _family(a, link, "accept", nxt, nxt)
        return
    if p.kind == "ip6":
        _family(a, link, nxt, "accept", nxt)
        return
    if p.kind == "host":
        _family(a, link, v4, nxt, nxt)
        a.label(v4)
        a.op(LD_W_ABS, l2 + 12)
        a.op(JEQ_K, p.host or 0, "accept", 0)
        a.op(LD_W_ABS, l2 + 16)
        a.op(JEQ_K, p.host or 0, "accept", nxt)
        return
    protos = [p.proto] if p.proto else [6, 17]
    _family(a, link, v4, v6, nxt)
    # IPv6: next header must be the transport protocol (no extension headers), ports at l2+40
    a.label(v6)
    a.op(LD_B_ABS, l2 + 6)
    for j, pr in enumerate(protos):
        last = j == len(protos) - 1
        a.op(JEQ_K, pr, f"p{i}v6ports" if p.kind == "port" else "accept", 0 if not last else nxt)
    if p.kind == "port":
        a.label(f"p{i}v6ports")
        _ports(a, p, lambda off: a.op(LD_H_ABS, l2 + 40 + off), nxt)
    # IPv4: protocol, not a later fragment, ports after the variable-length header
    a.label(v4)
    a.op(LD_B_ABS, l2 + 9)
    for j, pr in enumerate(protos):
        last = j == len(protos) - 1
        a.op(JEQ_K, pr, f"p{i}v4frag" if p.kind == "port" else "accept", 0 if not last else nxt)
    if p.kind == "port":
        a.label(f"p{i}v4frag")
        a.op(LD_H_ABS, l2 + 6)
        a.op(JSET_K, 0x1FFF, nxt, 0)
        a.op(LDX_B_MSH, l2)
        _ports(a, p, lambda off: a.op(LD_H_IND, l2 + off), nxt)


def _ports(a: _Asm, p: _Prim, load, nxt: str) -> None:
    checks = {"": (0, 2), "src": (0,), "dst": (2,)}[p.dir]
    for j, off in enumerate(checks):
        load(off)
        a.op(JEQ_K, p.port or 0, "accept", 0 if j < len(checks) - 1 else nxt)


FilterProgram = Union[str, Sequence[Sequence[int]]]


def parse_program(prog: FilterProgram, snaplen: int) -> list[Insn]:
    """A user-supplied program: ``tcpdump -ddd`` text or ``[[code, jt, jf, k], ...]``.

    Accepting ``ret`` values are capped at ``snaplen`` so the capture stays header-only."""
    if isinstance(prog, str):
        nums = [int(x) for x in prog.split()]
        if not nums or nums[0] != (len(nums) - 1) // 4 or (len(nums) - 1) % 4:
            raise FilterError("filter_program text must be 'tcpdump -ddd' output: a count, then "
                              "'code jt jf k' per instruction")
        insns = [tuple(nums[1 + 4 * i: 5 + 4 * i]) for i in range(nums[0])]
    else:
        insns = [tuple(int(x) for x in ins) for ins in prog]
    out: list[Insn] = []
    for i, ins in enumerate(insns):
        if len(ins) != 4:
            raise FilterError(f"filter_program instruction {i}: need [code, jt, jf, k], got {list(ins)}")
        code, jt, jf, k = ins
        if not (0 <= code < 1 << 16 and 0 <= jt < 256 and 0 <= jf < 256 and 0 <= k < 1 << 32):
            raise FilterError(f"filter_program instruction {i} out of range: {list(ins)}")
        if code == RET_K and k > 0:
            k = min(k, snaplen)
        out.append((code, jt, jf, k))
    if not out or out[-1][0] & 0x07 != 0x06:
        raise FilterError("filter_program must end with a ret instruction")
    if len(out) > 4096:
        raise FilterError("filter_program longer than the kernel's 4096-instruction limit")
    return out


def pack(insns: Sequence[Insn]) -> bytes:
    """``struct sock_filter[]`` bytes."""
    return b"".join(struct.pack("HBBI", c, jt, jf, k) for c, jt, jf, k in insns)


def to_text(insns: Sequence[Insn]) -> str:
    """The program in ``tcpdump -ddd`` form (what ``filter_program`` accepts)."""
    return "\n".join([str(len(insns))] + [f"{c} {jt} {jf} {k}" for c, jt, jf, k in insns])
