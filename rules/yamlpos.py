"""Stage 1 of loading: YAML → plain values that remember where they came from.

PyYAML's composer keeps a mark (line, column) on every node; we convert the node tree to
``PMap``/``PList``/``PStr``… so every later error can point at ``file:line:col`` (1-based).
Duplicate mapping keys, which PyYAML silently accepts, are reported here.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml


@dataclass(frozen=True)
class Pos:
    file: str
    line: int  # 1-based
    col: int  # 1-based

    def __str__(self) -> str:
        return f"{self.file}:{self.line}:{self.col}"


class PMap(dict):
    """A mapping with the position of itself, of each key and of each value."""

    pos: Pos
    key_pos: dict
    val_pos: dict
    val_style: dict


class PList(list):
    pos: Pos
    item_pos: list


class YamlError(Exception):
    def __init__(self, message: str, pos: Pos) -> None:
        super().__init__(message)
        self.message = message
        self.pos = pos


class YamlLimitError(YamlError):
    """The document exceeds a resource budget (:class:`YamlLimits`): too large, too deep, or
    aliases that expand to far more than the text holds (a "billion laughs"). ``limit`` names
    the budget: ``bytes``, ``depth``, ``nodes`` or ``recursion`` (an anchor inside itself)."""

    def __init__(self, message: str, pos: Pos, limit: str) -> None:
        super().__init__(message, pos)
        self.limit = limit


@dataclass(frozen=True)
class YamlLimits:
    """Budgets for one YAML document, checked while it is parsed, before anything is built.

    Why: PyYAML re-expands every alias and composes recursively, so 600 bytes of nested aliases
    ask for gigabytes and a few hundred open brackets end in a ``RecursionError``. Here the
    document is read as a stream of events (the parser is iterative), aliases share the value
    they name, and these bounds hold for the text *and* for everything a later stage may walk:

    - ``max_bytes``: the text itself;
    - ``max_depth``: nesting of collections, counted through aliases (an alias to a 10-deep
      anchor inside 5 levels is 15 deep), so later recursive walks stay shallow;
    - ``alias_ratio`` / ``min_alias_budget`` / ``max_nodes``: nodes after alias expansion may
      be at most ``alias_ratio`` x the document's own nodes (but never less than
      ``min_alias_budget``, so small files may alias freely) and never more than ``max_nodes``.
    """

    max_bytes: int = 1 << 20
    max_depth: int = 64
    alias_ratio: float = 10.0
    min_alias_budget: int = 10_000
    max_nodes: int = 1_000_000

    def alias_budget(self, own_nodes: int) -> int:
        """How many nodes a document of ``own_nodes`` nodes may expand to through aliases."""
        return int(min(self.max_nodes, max(self.min_alias_budget, self.alias_ratio * own_nodes)))


def _pos(file: str, node: Any) -> Pos:
    """Position (1-based) of a node or event."""
    return Pos(file, node.start_mark.line + 1, node.start_mark.column + 1)


class _Frame:
    """One open collection while the event stream is read."""

    __slots__ = ("value", "anchor", "nodes", "height", "key", "key_pos", "key_node", "skip", "quiet")

    def __init__(self, value: Any, anchor: str | None, quiet: bool) -> None:
        self.value = value
        self.anchor = anchor
        self.nodes = 1  # nodes of this subtree after alias expansion (itself included)
        self.height = 1  # levels of collections in this subtree, through aliases
        self.key: Any = _NO_KEY  # a mapping's pending key (_NO_KEY: the next item is a key)
        self.key_pos: Pos | None = None
        self.key_node: Any = None
        self.skip = False  # the pending key was refused: build its value, do not store it
        self.quiet = quiet  # inside a refused value: its duplicate keys are not reported


_NO_KEY = object()
_STR = "tag:yaml.org,2002:str"


class _Builder:
    """Events → ``PMap``/``PList``/scalars, iteratively, under :class:`YamlLimits`.

    Aliases share the value of their anchor (nothing is copied); what an alias *would* expand
    to is counted against the budget, since every later stage that walks the value pays it."""

    def __init__(self, file: str, limits: YamlLimits) -> None:
        self.file = file
        self.limits = limits
        self.dupes: list[YamlError] = []
        self._ctor = yaml.SafeLoader("")
        self._resolver = yaml.SafeLoader("")
        self._memo: dict[tuple[str, str], Any] = {}
        self.own_nodes = 0
        self.expanded = 0
        self.aliases: list[tuple[int, Pos, str]] = []  # (expanded count after it, where, name)
        self.anchors: dict[str, tuple[Any, int, int, Pos]] = {}  # name → (value, nodes, height, pos)

    def build(self, events: Any) -> Any:
        stack: list[_Frame] = []
        root: Any = None
        have_root = False
        docs = 0
        open_anchors: set[str] = set()
        for ev in events:
            if isinstance(ev, (yaml.StreamStartEvent, yaml.StreamEndEvent, yaml.DocumentEndEvent)):
                continue
            if isinstance(ev, yaml.DocumentStartEvent):
                docs += 1
                if docs > 1:
                    raise YamlError("YAML syntax: expected a single document in the stream", _pos(self.file, ev))
                continue
            if isinstance(ev, (yaml.MappingEndEvent, yaml.SequenceEndEvent)):
                fr = stack.pop()
                if fr.anchor is not None:
                    open_anchors.discard(fr.anchor)
                    self.anchors[fr.anchor] = (fr.value, fr.nodes, fr.height, fr.value.pos)
                value, nodes, height = fr.value, fr.nodes, fr.height
                if stack:
                    stack[-1].nodes += nodes
                    stack[-1].height = max(stack[-1].height, height + 1)
                self._deliver(stack, value, fr.value.pos, None, collection=True)
                if not stack:
                    root, have_root = value, True
                continue
            self.own_nodes += 1
            pos = _pos(self.file, ev)
            if isinstance(ev, yaml.AliasEvent):
                name = ev.anchor
                if name in open_anchors:
                    raise YamlLimitError(f"alias *{name} refers to its own anchor &{name}: recursive structures "
                                         "are not allowed", pos, "recursion")
                if name not in self.anchors:
                    raise YamlError(f"YAML syntax: found undefined alias {name!r}", pos)
                value, nodes, height, _ = self.anchors[name]
                self.expanded += nodes
                self.aliases.append((self.expanded, pos, name))
                if len(stack) + height > self.limits.max_depth:
                    raise YamlLimitError(f"alias *{name} nests collections {len(stack) + height} deep; the "
                                         f"limit is {self.limits.max_depth}", pos, "depth")
                if self.expanded > self.limits.max_nodes:
                    self._too_many()
                if stack:
                    stack[-1].nodes += nodes
                    stack[-1].height = max(stack[-1].height, height + 1)
                self._deliver(stack, value, pos, None, collection=isinstance(value, (PMap, PList)))
                if not stack:
                    root, have_root = value, True
                continue
            anchor = getattr(ev, "anchor", None)
            if anchor is not None and (anchor in self.anchors or anchor in open_anchors):
                first = self.anchors[anchor][3] if anchor in self.anchors else None
                raise YamlError(f"YAML syntax: found duplicate anchor {anchor!r}"
                                + (f" (first at line {first.line})" if first else ""), pos)
            self.expanded += 1
            if isinstance(ev, yaml.ScalarEvent):
                value = self._scalar(ev)
                if anchor is not None:
                    self.anchors[anchor] = (value, 1, 0, pos)
                if stack:
                    stack[-1].nodes += 1
                self._deliver(stack, value, pos, ev.style, collection=False)
                if not stack:
                    root, have_root = value, True
                continue
            # a collection starts
            if len(stack) + 1 > self.limits.max_depth:
                raise YamlLimitError(f"collections nested more than {self.limits.max_depth} deep", pos, "depth")
            quiet = bool(stack) and (stack[-1].quiet or stack[-1].skip)
            if isinstance(ev, yaml.MappingStartEvent):
                m = PMap()
                m.pos = pos
                m.key_pos, m.val_pos, m.val_style = {}, {}, {}
                fr = _Frame(m, anchor, quiet)
            else:
                lst = PList()
                lst.pos = pos
                lst.item_pos = []
                fr = _Frame(lst, anchor, quiet)
            if anchor is not None:
                open_anchors.add(anchor)
            stack.append(fr)
        if self.expanded > self.limits.alias_budget(self.own_nodes):
            self._too_many()
        return root if have_root else None

    def _too_many(self) -> None:
        budget = self.limits.alias_budget(self.own_nodes)
        cap = min(budget, self.limits.max_nodes)
        at = next(((n, p, a) for n, p, a in self.aliases if n > cap), self.aliases[-1] if self.aliases else None)
        pos = at[1] if at else Pos(self.file, 1, 1)
        name = f"*{at[2]}" if at else "aliases"
        raise YamlLimitError(f"aliases expand the document to more than {cap} nodes (it has {self.own_nodes} "
                             f"of its own; {name} passes the budget): write the values out", pos, "nodes")

    def _scalar(self, ev: Any) -> Any:
        tag = ev.tag
        if tag is None or tag == "!":
            tag = self._resolver.resolve(yaml.ScalarNode, ev.value, ev.implicit)
        if tag == _STR:
            return ev.value
        key = (tag, ev.value)
        if key in self._memo:  # repeated numbers and keywords (immutable results only)
            return self._memo[key]
        node = yaml.ScalarNode(tag, ev.value, ev.start_mark, ev.end_mark, style=ev.style)
        try:
            value = self._ctor.construct_object(node, deep=True)
            if isinstance(value, (int, float, bool)) or value is None:
                self._memo[key] = value
            return value
        except yaml.constructor.ConstructorError:
            raise
        except Exception as e:  # noqa: BLE001 - PyYAML's constructors fail in many ways on an explicit
            # tag they cannot honour (!!float abc, !!timestamp 2023-13-45, !!timestamp x)
            raise YamlError(f"YAML: cannot read {ev.value[:40]!r} as {tag.rsplit(':', 1)[-1]} ({e})",
                            _pos(self.file, ev)) from None
        finally:
            self._ctor.constructed_objects.clear()

    def _deliver(self, stack: list[_Frame], value: Any, pos: Pos, style: str | None, collection: bool) -> None:
        """Hand a finished node to the collection that holds it."""
        if not stack:
            return
        fr = stack[-1]
        parent = fr.value
        if isinstance(parent, PList):
            parent.append(value)
            parent.item_pos.append(pos)
            return
        if fr.key is _NO_KEY:
            fr.key, fr.key_pos = value, pos
            fr.skip = False
            if collection or isinstance(value, (PMap, PList)):
                if not fr.quiet:
                    self.dupes.append(YamlError("mapping keys must be plain scalars", pos))
                fr.skip = True
            elif value in parent:
                if not fr.quiet:
                    self.dupes.append(YamlError(f"duplicate key {value!r} (first at line {parent.key_pos[value].line})",
                                                pos))
                fr.skip = True
            return
        key, kpos, skip = fr.key, fr.key_pos, fr.skip
        fr.key, fr.skip = _NO_KEY, False
        if skip:
            return
        parent[key] = value
        parent.key_pos[key] = kpos
        parent.val_pos[key] = pos
        parent.val_style[key] = style


#: libyaml's parser when PyYAML was built with it (the wheels for x86-64 and aarch64 are): 30-40x
#: faster than the pure-Python one on the same events and marks, so a file at the size limit
#: reads in a fraction of a second
_EVENT_LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


def load(text: str, file: str, limits: YamlLimits | None = None) -> tuple[Any, list[YamlError]]:
    """Parse one YAML document; returns (value, duplicate-key errors). Raises YamlError on
    syntax, :class:`YamlLimitError` when the document exceeds ``limits``."""
    limits = limits or YamlLimits()
    size = len(text.encode("utf-8", "surrogatepass")) if len(text) * 4 > limits.max_bytes else len(text)
    if size > limits.max_bytes:
        raise YamlLimitError(f"{size} bytes of YAML; the limit is {limits.max_bytes}", Pos(file, 1, 1), "bytes")
    builder = _Builder(file, limits)
    try:
        value = builder.build(yaml.parse(text, Loader=_EVENT_LOADER))
    except yaml.constructor.ConstructorError as e:
        mark = e.problem_mark
        raise YamlError(f"YAML: {e.problem}", Pos(file, mark.line + 1, mark.column + 1) if mark else Pos(file, 1, 1)) from None
    except yaml.MarkedYAMLError as e:
        mark = e.problem_mark or e.context_mark
        pos = Pos(file, mark.line + 1, mark.column + 1) if mark else Pos(file, 1, 1)
        raise YamlError(f"YAML syntax: {e.problem or e}", pos) from None
    except yaml.reader.ReaderError as e:  # a character YAML does not allow, at a character offset
        before = text[: max(0, e.position)]
        line = before.count("\n") + 1
        raise YamlError(f"YAML: character {e.character!r} is not allowed in YAML ({e.reason})",
                        Pos(file, line, len(before) - before.rfind("\n"))) from None
    except yaml.YAMLError as e:
        raise YamlError(f"YAML: {e}", Pos(file, 1, 1)) from None
    except UnicodeEncodeError as e:  # a lone surrogate: the text did not come from valid UTF-8
        before = text[: e.start]
        raise YamlError("YAML: not valid UTF-8 text (a lone surrogate)",
                        Pos(file, before.count("\n") + 1, len(before) - before.rfind("\n"))) from None
    return value, builder.dupes


def scalar_offset_pos(base: Pos, style: str | None, text: str, offset: int, lines: list[str]) -> Pos:
    """Position of character ``offset`` of a scalar's text, given where the scalar starts.

    Plain and quoted scalars on one line map directly (a quote adds one column); block scalars
    (``|``/``>``) start on the line after the indicator, at the block's indentation, which we
    read from the file's own lines."""
    offset = max(0, min(offset, len(text)))
    before = text[:offset]
    if style in ("|", ">"):
        line_no = before.count("\n")
        col_in_line = offset - (before.rfind("\n") + 1)
        idx = base.line + line_no  # 0-based index of the content line
        indent = 0
        first = next((ln for ln in lines[base.line:] if ln.strip()), "")  # sets the block's indentation
        indent = len(first) - len(first.lstrip(" "))
        return Pos(base.file, idx + 1, indent + col_in_line + 1)
    quote = 1 if style in ("'", '"') else 0
    return Pos(base.file, base.line, base.col + quote + offset)


class SettingsFileError(Exception):
    """A settings file that cannot be used at all (unreadable, not YAML, not a mapping)."""

    def __init__(self, problems: list[str]) -> None:
        super().__init__("\n".join(problems))
        self.problems = problems


def read_settings(path: str | Path, what: str) -> tuple[dict, dict[tuple, Pos], list[str]]:
    """Read a YAML settings file keeping positions: (mapping, position of every key path,
    problems such as duplicate keys). Shared by the agent's and the controller's configs."""
    where = str(path)
    try:
        text = Path(path).read_text()
    except OSError as e:
        raise SettingsFileError([f"{path}: cannot read config: {e.strerror or e}"]) from None
    try:
        doc, dupes = load(text, where)
    except YamlError as e:
        raise SettingsFileError([f"{e.pos}: {e.message}"]) from None
    doc = {} if doc is None else doc
    if not isinstance(doc, dict):
        raise SettingsFileError([f"{where}:1:1: the {what} config is a mapping of settings"])
    positions: dict[tuple, Pos] = {}
    _key_positions(doc, (), positions)
    return doc, positions, [f"{d.pos}: {d.message}" for d in dupes]


def _key_positions(m: Any, prefix: tuple, out: dict[tuple, Pos]) -> None:
    if isinstance(m, PMap):
        for k, v in m.items():
            out[prefix + (k,)] = m.key_pos[k]
            _key_positions(v, prefix + (k,), out)


def deep_merge(base: dict, over: Any, atomic: tuple[str, ...] = ()) -> dict:
    """``over`` on top of ``base``, recursing into mappings except the ``atomic`` keys."""
    import copy

    out = copy.deepcopy(base)
    for k, v in over.items():
        if isinstance(v, dict) and isinstance(out.get(k), dict) and k not in atomic:
            out[k] = deep_merge(out[k], v, atomic)
        else:
            out[k] = v
    return out
