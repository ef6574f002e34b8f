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


def _pos(file: str, node: yaml.Node) -> Pos:
    return Pos(file, node.start_mark.line + 1, node.start_mark.column + 1)


class _Converter:
    def __init__(self, file: str) -> None:
        self.file = file
        self.dupes: list[YamlError] = []
        self._ctor = yaml.SafeLoader("")

    def convert(self, node: yaml.Node) -> Any:
        if isinstance(node, yaml.MappingNode):
            m = PMap()
            m.pos = _pos(self.file, node)
            m.key_pos, m.val_pos, m.val_style = {}, {}, {}
            for k, v in node.value:
                key = self.convert(k)
                if isinstance(key, (PMap, PList)):
                    self.dupes.append(YamlError("mapping keys must be plain scalars", _pos(self.file, k)))
                    continue
                if key in m:
                    self.dupes.append(YamlError(f"duplicate key {key!r} (first at line {m.key_pos[key].line})",
                                                _pos(self.file, k)))
                    continue
                m[key] = self.convert(v)
                m.key_pos[key] = _pos(self.file, k)
                m.val_pos[key] = _pos(self.file, v)
                m.val_style[key] = getattr(v, "style", None)
            return m
        if isinstance(node, yaml.SequenceNode):
            lst = PList(self.convert(v) for v in node.value)
            lst.pos = _pos(self.file, node)
            lst.item_pos = [_pos(self.file, v) for v in node.value]
            return lst
        return self._ctor.construct_object(node, deep=True)


def load(text: str, file: str) -> tuple[Any, list[YamlError]]:
    """Parse one YAML document; returns (value, duplicate-key errors). Raises YamlError on syntax."""
    try:
        node = yaml.compose(text, Loader=yaml.SafeLoader)
    except yaml.MarkedYAMLError as e:
        mark = e.problem_mark or e.context_mark
        pos = Pos(file, mark.line + 1, mark.column + 1) if mark else Pos(file, 1, 1)
        raise YamlError(f"YAML syntax: {e.problem or e}", pos) from None
    except yaml.YAMLError as e:
        raise YamlError(f"YAML: {e}", Pos(file, 1, 1)) from None
    if node is None:
        return None, []
    conv = _Converter(file)
    try:
        value = conv.convert(node)
    except yaml.constructor.ConstructorError as e:
        mark = e.problem_mark
        raise YamlError(f"YAML: {e.problem}", Pos(file, mark.line + 1, mark.column + 1) if mark else Pos(file, 1, 1)) from None
    return value, conv.dupes


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
