"""Subject naming: where each message travels on NATS, and the way back from a subject.

Every subject is ``skewd.v1.<kind>.<tokens...>`` (the layout is in :mod:`skewd.wire`'s docstring),
built from raw names through :func:`token`, an injective escaping into NATS-safe tokens, so a
publisher, a subscriber's filter and an ACL built from the same name agree, and
:func:`parse_subject` gives the raw names back (the controller checks a message's body against
its subject). Summaries may also carry a placement token and be rewritten by the server into
partitions for the scaled-out controller (:func:`partition_mappings`).
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Mapping

from .base import SUBJECT_PREFIX, MessageKind, WireError

#: The variable tokens after ``skewd.v1.<kind>`` for each kind, in subject order.
SUBJECT_TOKENS: dict[MessageKind, tuple[str, ...]] = {
    MessageKind.FINDING: ("cluster", "node", "rule"),
    MessageKind.SUMMARY: ("cluster", "node"),
    MessageKind.HEALTH: ("cluster", "node"),
    MessageKind.REMAP: ("cluster",),
    MessageKind.PHASE: ("cluster", "node", "engine"),
}


_SAFE = re.compile(r"[A-Za-z0-9_-]")
_SAFE_TOKEN = re.compile(r"[A-Za-z0-9_-]+")
_ESCAPED = re.compile(r"(?:%[0-9A-F]{2}|[A-Za-z0-9_-])+")

#: The token that stands for the empty string (a NATS token cannot be empty).
EMPTY_TOKEN = "%"


def token(value: str) -> str:
    """Map any string to one safe NATS subject token, reversibly (:func:`untoken`).

    NATS splits subjects on ``.``, treats ``*`` and ``>`` as wildcards, forbids whitespace and
    reserves a leading ``$``; tools and ACLs are happiest with ``[A-Za-z0-9_-]``. So those
    characters pass through unchanged (``GPU-2-kv-saturation``, ``node-17``, ``gpu_0``) and
    every other character is percent-encoded as the ``%XX`` (upper-case hex) of each of its
    UTF-8 bytes, ``%`` itself included: ``node.1`` → ``node%2E1``,
    ``meta-llama/Llama-3-8B/0`` → ``meta-llama%2FLlama-3-8B%2F0``. The empty string becomes a
    lone ``%`` (no encoding produces it otherwise).

    The mapping is deterministic and injective: equal inputs give equal tokens, different
    inputs different tokens, so a subscriber can build a filter from a raw name with the same
    function. Case is preserved (NATS subjects are case-sensitive).
    """
    if not isinstance(value, str):
        raise TypeError(f"subject token must be a str, got {type(value).__name__}")
    if value == "":
        return EMPTY_TOKEN
    if _SAFE_TOKEN.fullmatch(value):
        return value
    out = []
    for ch in value:
        if _SAFE.fullmatch(ch):
            out.append(ch)
        else:
            out.extend(f"%{b:02X}" for b in ch.encode("utf-8"))
    return "".join(out)


def untoken(tok: str) -> str:
    """Inverse of :func:`token`. Raises :class:`WireError` on a token :func:`token` cannot produce."""
    if tok == EMPTY_TOKEN:
        return ""
    if not _ESCAPED.fullmatch(tok):
        raise WireError(f"subject token {tok!r} is not in skewd's escaped form ([A-Za-z0-9_-] and %XX)")
    if "%" not in tok:
        return tok
    raw = bytearray()
    i = 0
    while i < len(tok):
        if tok[i] == "%":
            raw.append(int(tok[i + 1:i + 3], 16))
            i += 3
        else:
            raw.extend(tok[i].encode("ascii"))
            i += 1
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        raise WireError(f"subject token {tok!r} does not decode to UTF-8: {e}") from None
    if token(text) != tok:  # e.g. '%41' for 'A': not what token() emits, so not canonical
        raise WireError(f"subject token {tok!r} is not canonical (token() would write {token(text)!r})")
    return text


def _subject(kind: MessageKind, *values: str) -> str:
    return ".".join((SUBJECT_PREFIX, kind.value, *(token(v) for v in values)))


def finding_subject(cluster: str, node: str, rule_id: str) -> str:
    """``skewd.v1.finding.<cluster>.<node>.<rule>``: per rule, so a consumer can filter on it."""
    return _subject(MessageKind.FINDING, cluster, node, rule_id)


def summary_subject(cluster: str, node: str, placement: str | None = None) -> str:
    """``skewd.v1.summary.<cluster>.<node>``, or ``...<node>.<placement>`` when the node
    belongs to a TP group or pipeline (:func:`placement_of`): the token the server's partition
    mapping hashes, so every member of a group reaches the same controller worker."""
    if placement is None:
        return _subject(MessageKind.SUMMARY, cluster, node)
    return _subject(MessageKind.SUMMARY, cluster, node, placement)


# ---- partitions (controller scale-out) -----------------------------------------------------
#
# The server rewrites every summary subject to ``skewd.v1.psummary.<cluster>.<partition>.<node>.
# <placement>`` with its deterministic ``partition(N, token)`` mapping function
# (:func:`partition_mappings`; nats-server >= 2.8): a controller worker owns partitions and
# subscribes to theirs only. The partition is a hash of the *placement* token alone: the
# pipeline a node serves in, else its TP group, else the node itself, so a group's members
# share one. :func:`partition_of` computes the server's function (FNV-1a, 32 bit, of the token
# text, modulo N) so the controller can say which partition a node belongs in.

#: kind token of a summary subject after the server's partition mapping
PARTITIONED_SUMMARY = "psummary"


def placement_of(labels: Mapping[str, str] | None) -> str | None:
    """The group a node's summaries are placed by: its ``pp_group`` label, else ``tp_group``,
    else None (a node alone: its own name places it)."""
    if not labels:
        return None
    return labels.get("pp_group") or labels.get("tp_group") or None


def partition_of(placement: str, partitions: int) -> int:
    """The partition nats-server's ``{{partition(N, k)}}`` gives the token of ``placement``."""
    h = 0x811C9DC5
    for b in token(placement).encode():
        h = ((h ^ b) * 0x01000193) & 0xFFFFFFFF
    return h % partitions


def partition_mappings(partitions: int) -> dict[str, str]:
    """The subject mappings (server or account ``mappings``) that partition summaries: with a
    placement token the partition hashes it, without one the node token (the node is then its
    own placement, and the mapped subject says so)."""
    if partitions < 1:
        raise ValueError("partitions must be at least 1")
    base = f"{SUBJECT_PREFIX}.{MessageKind.SUMMARY.value}"
    dest = f"{SUBJECT_PREFIX}.{PARTITIONED_SUMMARY}"
    return {f"{base}.*.*": f"{dest}.{{{{wildcard(1)}}}}.{{{{partition({partitions},2)}}}}.{{{{wildcard(2)}}}}"
                           f".{{{{wildcard(2)}}}}",
            f"{base}.*.*.*": f"{dest}.{{{{wildcard(1)}}}}.{{{{partition({partitions},3)}}}}.{{{{wildcard(2)}}}}"
                             f".{{{{wildcard(3)}}}}"}


def partition_mapping_conf(partitions: int, indent: str = "") -> str:
    """The ``mappings { ... }`` block of a nats-server config (server level: the global
    account; inside an account block: that account) for :func:`partition_mappings`."""
    rows = [f'{indent}  "{k}": "{v}"' for k, v in partition_mappings(partitions).items()]
    return "\n".join([f"{indent}mappings {{", *rows, f"{indent}}}"]) + "\n"


def digest_subject(cluster: str, partition: int | str) -> str:
    """``skewd.v1.digest.<cluster>.<partition>``: what a controller worker hands the leader
    about its partition at each evaluation (controller/scaleout.py); controller to controller."""
    return f"{SUBJECT_PREFIX}.digest.{token(cluster)}.{partition}"


def summary_filters(cluster: str, partition: int | None = None) -> list[str]:
    """What to subscribe to for ``cluster``'s summaries: every partition's mapped subjects (or
    one partition's), and, for all of them, the unmapped forms a server without the mapping
    delivers."""
    c = token(cluster)
    mapped = f"{SUBJECT_PREFIX}.{PARTITIONED_SUMMARY}.{c}.{'*' if partition is None else partition}.*.*"
    if partition is not None:
        return [mapped]
    return [f"{SUBJECT_PREFIX}.{MessageKind.SUMMARY.value}.{c}.>", mapped]


def health_subject(cluster: str, node: str) -> str:
    """``skewd.v1.health.<cluster>.<node>``."""
    return _subject(MessageKind.HEALTH, cluster, node)


def remap_subject(cluster: str) -> str:
    """``skewd.v1.remap.<cluster>``: the controller's remap actions for one cluster."""
    return _subject(MessageKind.REMAP, cluster)


def phase_subject(cluster: str, node: str, engine: str) -> str:
    """``skewd.v1.phase.<cluster>.<node>.<engine>``: per-step phase records from the vLLM plugin."""
    return _subject(MessageKind.PHASE, cluster, node, engine)


def subject_filter(kind: MessageKind | str, **values: str | None) -> str:
    """A subscription filter for ``kind``: named tokens given are pinned (raw names, escaped
    here), the rest are ``*``. ``subject_filter("finding", cluster="prod")`` →
    ``skewd.v1.finding.prod.*.*``. Unknown token names are an error, not a silent wildcard.
    """
    kind = MessageKind(kind)
    names = SUBJECT_TOKENS[kind]
    unknown = set(values) - set(names)
    if unknown:
        raise WireError(f"{kind.value} subjects have tokens {names}, not {sorted(unknown)}")
    parts = [SUBJECT_PREFIX, kind.value]
    parts += ["*" if values.get(n) is None else token(values[n]) for n in names]  # type: ignore[arg-type]
    return ".".join(parts)


@dataclass(frozen=True)
class ParsedSubject:
    """A skewd subject split back into its kind and raw (unescaped) token values."""

    kind: MessageKind
    tokens: dict[str, str]

    def __getitem__(self, name: str) -> str:
        return self.tokens[name]


def parse_subject(subject: str) -> ParsedSubject:
    """Split ``skewd.v1.<kind>.<tokens...>`` into kind and raw values. Raises :class:`WireError`
    for anything that is not a concrete skewd v1 subject."""
    parts = subject.split(".")
    prefix = SUBJECT_PREFIX.split(".")
    if parts[:len(prefix)] != prefix or len(parts) < len(prefix) + 1:
        raise WireError(f"subject {subject!r} is not under {SUBJECT_PREFIX}.")
    rest = parts[len(prefix) + 1:]
    word = parts[len(prefix)]
    if word == PARTITIONED_SUMMARY:  # a summary as the partition mapping delivers it
        kind, names = MessageKind.SUMMARY, ("cluster", "partition", "node", "placement")
    else:
        try:
            kind = MessageKind(word)
        except ValueError:
            raise WireError(f"subject {subject!r}: unknown message kind {word!r}") from None
        names = SUBJECT_TOKENS[kind]
        if kind is MessageKind.SUMMARY and len(rest) == 3:
            names = ("cluster", "node", "placement")
    if len(rest) != len(names):
        raise WireError(f"subject {subject!r}: {kind.value} subjects have {len(names)} tokens "
                        f"({'.'.join(names)}), got {len(rest)}")
    return ParsedSubject(kind, {n: untoken(v) for n, v in zip(names, rest)})
