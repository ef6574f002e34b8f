"""The rule expression language: parsed with ``ast`` from a whitelist, compiled to closures.

Nothing is ever ``eval``-ed. The parser accepts Python expression syntax, then every node is
checked against a whitelist and compiled into a small closure tree that computes one value per
entity with numpy. Names resolve, in order, to rule params, macros, lists, the special
``entity``/``node`` names, and catalogued signals; anything else is a compile error.

Durations are written as literals (``30s``, ``5m``, ``1h30m``, ``250ms``) or as params whose
value is a duration string. A lexical pre-pass turns literals into placeholder names so the
Python parser accepts them; error columns are mapped back to the original text.

Three-valued logic: a comparison with a missing value is *unknown* (NaN); ``and``/``or``/``not``
follow Kleene logic, and a rule fires only where its expression is exactly true, so missing
data never fires a rule through a negation.

This module is the compiler: it checks every node of a parsed expression against the whitelist
and the types, and builds the closures. Parsing the text (``parse``, with its lexical pre-pass in
``lexer``), the three-valued logic and true/false masks the closures compute with (``logic``),
the error codes (``codes``), the function tables (``vocabulary``) and the window evaluation the
closures call (``windows``) are their own modules.
"""
from __future__ import annotations

import ast
import difflib
import re
from dataclasses import dataclass, field
from enum import Enum
from typing import Any, Callable, Mapping

import numpy as np

from skewd.model import Catalogue, Kind, Scope, format_duration, parse_duration

from . import functions
from .codes import Code, ExprError
from .lexer import PLACEHOLDER, map_offset
from .vocabulary import (CONDITION_WINDOW_FUNCTIONS, ELEMENTWISE_FUNCTIONS, FUNCTION_DOCS, FUNCTIONS,
                         PEER_FUNCTIONS, WINDOW_FUNCTIONS)
from .limits import DEFAULT_LIMITS, RuleLimits
from .parse import parse_expr
from .logic import BIN, CMP, CMP_MASKS, kleene_and, kleene_not, kleene_or, mask_and, mask_or, num_cmp, truth
from .windows import BATCHED_KINDS, EvalContext, identity, peer_range, window_vec



class T(str, Enum):
    """The static type of a compiled node: the compiler checks every operand against it."""

    NUM = "number"
    DUR = "duration"
    VEC = "per-entity value"
    STR = "string"
    STRVEC = "per-entity name"
    LIST = "list"


@dataclass
class Compiled:
    """``fn`` computes the expression's exact value per entity (1/0/NaN for a condition) and
    records every function's value as evidence. ``fires`` computes only where that value is
    exactly 1 (a bool mask, or a bool scalar for every entity), short-circuiting ``and``/``or``
    once the outcome is settled for every entity; its evidence is incomplete, so the engine
    re-runs ``fn`` on the rare tick where a transition needs evidence."""

    fn: Callable[[EvalContext], Any]
    signals: set[str]
    max_window: float
    evidence_labels: list[str]
    uses_peers: bool
    fires: Callable[[EvalContext], Any] | None = None
    uses_horizon: bool = False  # age(): looks back over the store's whole horizon
    # rate/increase over a bare signal, which the engine may compute together with others of
    # their kind (see batch_plan): (memo key, signal, function, window, wrap bits)
    windows: list = field(default_factory=list)


@dataclass
class CompileEnv:
    """What names in one rule's expression resolve to: the catalogue, the rule's scope, its
    params, and the pack's macros and lists (the loader builds one per rule)."""

    catalogue: Catalogue
    scope: Scope
    params: Mapping[str, Any] = field(default_factory=dict)  # name → number or duration string
    macros: Mapping[str, str] = field(default_factory=dict)
    lists: Mapping[str, list] = field(default_factory=dict)
    limits: RuleLimits = DEFAULT_LIMITS


@dataclass
class _Node:
    """One compiled sub-expression: its type, its value closure, and for conditions the masks."""

    t: T
    fn: Callable[[EvalContext], Any]
    const: Any = None  # for NUM/DUR/STR/LIST constants
    # Kleene conditions only: masks of where the value is exactly true (pos) / false (neg).
    # Two-valued masks encode the three-valued result exactly: unknown = neither.
    pos: Callable[[EvalContext], Any] | None = None
    neg: Callable[[EvalContext], Any] | None = None
    #: a string param's name: where a duration is needed it is reported as that param's bad duration
    param: str = ""


def _err(code: Code, msg: str, node: ast.AST | None) -> ExprError:
    return ExprError(code, msg, getattr(node, "col_offset", 0) if node is not None else 0)


def _pos_of(n: _Node) -> Callable[[EvalContext], Any]:
    """Where a value is exactly true in a boolean context (``truth`` == 1)."""
    if n.pos is not None:
        return n.pos
    if n.const is not None:
        c = float(n.const)
        val = bool(c == c and c != 0)
        return lambda ctx: val
    f = n.fn

    def pos(ctx):
        x = np.asarray(f(ctx), dtype=float)
        return (x != 0) & ~np.isnan(x)

    return pos


def _neg_of(n: _Node) -> Callable[[EvalContext], Any]:
    """Where a value is exactly false in a boolean context (``truth`` == 0)."""
    if n.neg is not None:
        return n.neg
    if n.const is not None:
        c = float(n.const)
        val = bool(c == 0)
        return lambda ctx: val
    f = n.fn
    return lambda ctx: np.asarray(f(ctx), dtype=float) == 0


class Compiler:
    """Compiles one expression (and, through sub-compilers, its macros) into a ``Compiled``; owns
    what the expression reads (signals, windows, evidence labels) as it goes. ``compile_expr``
    calls it for the loader."""

    def __init__(self, env: CompileEnv, text: str) -> None:
        self.env = env
        self.text = text
        self.signals: set[str] = set()
        self.max_window = 0.0
        self.evidence_labels: list[str] = []
        self.uses_peers = False
        self.uses_horizon = False
        self.windows: list = []
        self._macro_stack: list[str] = []
        self._nodes = [0]  # syntax nodes compiled, macros included (shared with macro compilers)
        #: reads of a per-entity signal in a rule over many entities (shared with macro compilers):
        #: what tells a node-wide guard from a per-entity part of an and/or (see _dispatch)
        self._wide_reads = [0]
        self._durs: list[float] = []
        self._spans: list = []
        self._src = ""

    # -- entry -------------------------------------------------------------------------------
    def compile(self) -> Compiled:
        try:
            tree = self._parse(self.text)
            node = self._expr(tree.body, 0)
            if node.t not in (T.VEC, T.NUM):
                raise _err(Code.WRONG_TYPE, f"the expression must be a condition, not a {node.t.value}", tree.body)
        except ExprError as e:
            e.offset = max(0, min(map_offset(e.offset, self._spans), len(self.text)))
            raise
        fn = node.fn
        if node.pos is not None:
            fires = node.pos
        else:  # a plain value fires where it is exactly 1, as the engine always tested
            fires = lambda ctx, fn=fn: np.asarray(fn(ctx), dtype=float) == 1.0
        return Compiled(fn, self.signals, self.max_window, self.evidence_labels, self.uses_peers, fires,
                        self.uses_horizon, self.windows)

    def _parse(self, text: str) -> ast.Expression:
        parsed = parse_expr(text, self.env.limits)
        self._src, self._durs, self._spans = parsed.src, parsed.durations, parsed.spans
        return parsed.tree

    @staticmethod
    def _fix(e: ExprError) -> ExprError:
        """Offsets are mapped back to the original text once, in compile()."""
        return e

    def _label(self, node: ast.AST) -> str:
        seg = ast.get_source_segment(self._src, node) or ""
        for i, d in enumerate(self._durs):
            seg = seg.replace(PLACEHOLDER.format(i), format_duration(d))
        return " ".join(seg.split())

    # -- nodes -------------------------------------------------------------------------------
    def _expr(self, node: ast.AST, depth: int) -> _Node:
        lim = self.env.limits
        if depth > lim.expr_depth:
            raise self._fix(_err(Code.LIMIT, f"expression nested deeper than {lim.expr_depth} "
                                             "(rule_limits.expr_depth)", node))
        self._nodes[0] += 1
        if self._nodes[0] > lim.expr_nodes:
            raise self._fix(_err(Code.LIMIT, f"expression has more than {lim.expr_nodes} parts with its macros "
                                             "expanded (rule_limits.expr_nodes)", node))
        try:
            return self._dispatch(node, depth + 1)
        except ExprError:
            raise
        except RecursionError:
            raise ExprError(Code.EXPR_SYNTAX, "expression nested too deeply", 0) from None

    def _dispatch(self, node: ast.AST, depth: int) -> _Node:
        if isinstance(node, ast.BoolOp):
            parts, wide = [], []
            for v in node.values:
                before = self._wide_reads[0]
                parts.append(self._need(self._expr(v, depth), (T.VEC, T.NUM), v, "and/or"))
                wide.append(self._wide_reads[0] > before)
            op = kleene_and if isinstance(node.op, ast.And) else kleene_or
            fns = [p.fn for p in parts]

            def boolop(ctx, fns=fns, op=op):
                acc = fns[0](ctx)
                for f in fns[1:]:
                    acc = op(acc, f(ctx))
                return acc

            # the masks settle the outcome from the parts in any order (true and false masks are
            # exact, ``and``/``or`` commute on them): parts that read only node-wide values (one
            # row) go first, so a node-wide guard that fails skips the per-entity windows after it
            # (a healthy node's missing RDMA wait spares EW-5's 984 flows). Otherwise in the
            # author's order; ``fn`` (the value and its evidence) keeps the author's order always.
            order = sorted(range(len(parts)), key=lambda i: wide[i])
            pos = [_pos_of(parts[i]) for i in order]
            neg = [_neg_of(parts[i]) for i in order]
            if op is kleene_and:  # true where all are true; false where any is false
                return _Node(T.VEC, boolop, pos=mask_and(pos), neg=mask_or(neg))
            return _Node(T.VEC, boolop, pos=mask_or(pos), neg=mask_and(neg))
        if isinstance(node, ast.UnaryOp):
            inner = self._expr(node.operand, depth)
            if isinstance(node.op, ast.Not):
                self._need(inner, (T.VEC, T.NUM), node.operand, "not")
                f = inner.fn
                return _Node(T.VEC, lambda ctx: kleene_not(f(ctx)), pos=_neg_of(inner), neg=_pos_of(inner))
            if isinstance(node.op, (ast.USub, ast.UAdd)):
                self._need(inner, (T.VEC, T.NUM, T.DUR), node.operand, "unary minus")
                sign = -1.0 if isinstance(node.op, ast.USub) else 1.0
                if inner.const is not None:
                    return _Node(inner.t, lambda ctx, c=sign * inner.const: c, sign * inner.const)
                f = inner.fn
                return _Node(inner.t, lambda ctx: sign * f(ctx))
            raise self._fix(_err(Code.FORBIDDEN_SYNTAX, "operator not allowed (use and/or/not, + - * / % **)", node))
        if isinstance(node, ast.BinOp):
            op = BIN.get(type(node.op))
            if op is None:
                raise self._fix(_err(Code.FORBIDDEN_SYNTAX, f"operator {type(node.op).__name__} not allowed", node))
            a = self._need(self._expr(node.left, depth), (T.VEC, T.NUM, T.DUR), node.left, "arithmetic")
            b = self._need(self._expr(node.right, depth), (T.VEC, T.NUM, T.DUR), node.right, "arithmetic")
            t = T.VEC if T.VEC in (a.t, b.t) else (T.DUR if T.DUR in (a.t, b.t) else T.NUM)
            if a.const is not None and b.const is not None:
                with np.errstate(all="ignore"):
                    try:
                        c = float(op(float(a.const), float(b.const)))
                    except (OverflowError, ZeroDivisionError):
                        c = float("nan")
                return _Node(t, lambda ctx, c=c: c, c)
            fa, fb = a.fn, b.fn

            def binop(ctx, fa=fa, fb=fb, op=op):
                return op(np.asarray(fa(ctx), dtype=float), fb(ctx))

            return _Node(t, binop)
        if isinstance(node, ast.Compare):
            return self._compare(node, depth)
        if isinstance(node, ast.Call):
            return self._call(node, depth)
        if isinstance(node, ast.Name):
            return self._name(node, depth)
        if isinstance(node, ast.Constant):
            v = node.value
            if isinstance(v, bool) or not isinstance(v, (int, float, str)):
                raise self._fix(_err(Code.FORBIDDEN_SYNTAX, f"literal {v!r} not allowed; use numbers and strings", node))
            if isinstance(v, str):
                return _Node(T.STR, lambda ctx, v=v: v, v)
            why = self.env.limits.number_problem(v)
            if why:
                raise self._fix(_err(Code.OUT_OF_RANGE, why, node))
            fv = float(v)
            return _Node(T.NUM, lambda ctx, fv=fv: fv, fv)
        if isinstance(node, (ast.Tuple, ast.List)):
            items = []
            for elt in node.elts:
                sub = self._expr(elt, depth)
                if sub.const is None or sub.t not in (T.NUM, T.STR):
                    raise self._fix(_err(Code.WRONG_TYPE, "list items must be numbers or strings", elt))
                items.append(sub.const)
            return _Node(T.LIST, lambda ctx, items=items: items, items)
        raise self._fix(_err(Code.FORBIDDEN_SYNTAX,
                             f"{type(node).__name__} is not part of the rule language "
                             "(no attributes, indexing, lambdas, comprehensions or keywords)", node))

    def _need(self, n: _Node, types: tuple[T, ...], node: ast.AST, what: str) -> _Node:
        if n.param and n.t is T.STR and T.DUR in types and T.STR not in types:
            raise self._fix(self._bad_duration_param(n, node))
        if n.t not in types:
            raise self._fix(_err(Code.WRONG_TYPE, f"{what} needs a {' or '.join(t.value for t in types)}, "
                                                  f"got a {n.t.value}", node))
        return n

    def _compare(self, node: ast.Compare, depth: int) -> _Node:
        left = self._expr(node.left, depth)
        parts: list[Callable] = []
        poss: list[Callable] = []
        negs: list[Callable] = []
        prev = left
        prev_node = node.left
        for op, comp in zip(node.ops, node.comparators):
            right = self._expr(comp, depth)
            fn, pos, neg = self._cmp_one(op, prev, right, prev_node, comp)
            parts.append(fn)
            if pos is None:
                pos, neg = _pos_of(_Node(T.VEC, fn)), _neg_of(_Node(T.VEC, fn))
            poss.append(pos)
            negs.append(neg)
            prev, prev_node = right, comp

        def compare(ctx, parts=parts):
            acc = parts[0](ctx)
            for p in parts[1:]:
                acc = kleene_and(acc, p(ctx))
            return acc

        return _Node(T.VEC, compare, pos=mask_and(poss), neg=mask_or(negs))

    def _cmp_one(self, op: ast.cmpop, a: _Node, b: _Node, an: ast.AST,
                 bn: ast.AST) -> tuple[Callable, Callable | None, Callable | None]:
        """(exact value, true mask, false mask); masks None where derived from the value."""
        if isinstance(op, (ast.In, ast.NotIn)):
            if b.t is not T.LIST:
                raise self._fix(_err(Code.WRONG_TYPE, "'in' needs a list on the right (a lists: name or (a, b))", bn))
            self._need(a, (T.VEC, T.NUM, T.STRVEC, T.STR), an, "'in'")
            items = b.const
            neg = isinstance(op, ast.NotIn)
            fa = a.fn
            if a.t in (T.STRVEC, T.STR):
                sitems = [str(i) for i in items]

                def member(ctx):
                    r = np.isin(np.asarray(fa(ctx), dtype=object), sitems).astype(float)
                    return 1.0 - r if neg else r
            else:
                nitems = np.array([i for i in items if isinstance(i, (int, float))], dtype=float)

                def member(ctx):
                    x = np.asarray(fa(ctx), dtype=float)
                    r = np.where(np.isnan(x), np.nan, np.isin(x, nitems).astype(float))
                    return np.where(np.isnan(r), np.nan, 1.0 - r) if neg else r
            return member, None, None
        cmp = CMP.get(type(op))
        if cmp is None:
            raise self._fix(_err(Code.FORBIDDEN_SYNTAX, f"comparison {type(op).__name__} not allowed", an))
        if a.t in (T.STRVEC, T.STR) or b.t in (T.STRVEC, T.STR):
            if not (a.t in (T.STRVEC, T.STR) and b.t in (T.STRVEC, T.STR)) or type(op) not in (ast.Eq, ast.NotEq):
                sp = a if a.param else b
                if sp.param and sp.t is T.STR:
                    raise self._fix(_err(Code.WRONG_TYPE, f"param {sp.param} is the string {sp.const!r}, not a "
                                                          "number: compare it to entity or node with == or !=", an))
                raise self._fix(_err(Code.WRONG_TYPE, "names compare only with == or != against strings", an))
            fa, fb = a.fn, b.fn
            return lambda ctx: cmp(np.asarray(fa(ctx), dtype=object), fb(ctx)).astype(float), None, None
        self._need(a, (T.VEC, T.NUM, T.DUR), an, "comparison")
        self._need(b, (T.VEC, T.NUM, T.DUR), bn, "comparison")
        fa, fb = a.fn, b.fn
        mpos, mneg = CMP_MASKS[type(op)]
        return (lambda ctx: num_cmp(cmp, fa(ctx), fb(ctx)),
                lambda ctx: mpos(fa(ctx), fb(ctx)),
                lambda ctx: mneg(fa(ctx), fb(ctx)))

    # -- names -------------------------------------------------------------------------------
    def _name(self, node: ast.Name, depth: int) -> _Node:
        name = node.id
        m = re.fullmatch(r"_d(\d+)_", name)
        if m and int(m.group(1)) < len(self._durs):
            d = self._durs[int(m.group(1))]
            return _Node(T.DUR, lambda ctx, d=d: d, d)
        if name.startswith("_"):
            raise self._fix(_err(Code.FORBIDDEN_SYNTAX, f"names starting with '_' are not allowed: {name}", node))
        env = self.env
        if name in env.params:
            v = env.params[name]
            if isinstance(v, bool):
                raise self._fix(_err(Code.WRONG_TYPE, f"param {name} must be a number or a duration", node))
            if isinstance(v, (int, float)):
                why = env.limits.number_problem(v)
                if why:
                    raise self._fix(_err(Code.OUT_OF_RANGE, f"param {name}: {why}", node))
                fv = float(v)
                return _Node(T.NUM, lambda ctx, fv=fv: fv, fv)
            if isinstance(v, list):
                self._check_items(v, f"param {name}", node)
                return _Node(T.LIST, lambda ctx, v=v: v, list(v))
            try:  # a string that reads as a duration (30s, 5) is one; any other string is a string
                d = parse_duration(str(v))
            except ValueError:
                sv = str(v)
                return _Node(T.STR, lambda ctx, sv=sv: sv, sv, param=name)
            why = env.limits.duration_problem(d)
            if why:
                raise self._fix(_err(Code.OUT_OF_RANGE, f"param {name}: {why}", node))
            return _Node(T.DUR, lambda ctx, d=d: d, d)
        if name in env.macros:
            if name in self._macro_stack:
                cyc = " -> ".join(self._macro_stack + [name])
                raise self._fix(_err(Code.MACRO_CYCLE, f"macro cycle: {cyc}", node))
            self._macro_stack.append(name)
            try:
                sub = Compiler(self.env, env.macros[name])
                sub._macro_stack = list(self._macro_stack)
                sub._nodes = self._nodes
                sub._wide_reads = self._wide_reads
                tree = sub._parse(env.macros[name])
                res = sub._expr(tree.body, depth)
            except ExprError as e:
                raise ExprError(e.code, f"in macro {name}: {e.message}", node.col_offset) from None
            finally:
                self._macro_stack.pop()
            self.signals |= sub.signals
            self.max_window = max(self.max_window, sub.max_window)
            self.uses_peers |= sub.uses_peers
            self.evidence_labels += sub.evidence_labels
            self.windows += sub.windows
            return res
        if name in env.lists:
            items = list(env.lists[name])
            self._check_items(items, f"list {name}", node)
            return _Node(T.LIST, lambda ctx, items=items: items, items)
        if name == "entity":
            return _Node(T.STRVEC, lambda ctx: ctx.names)
        if name == "node":
            return _Node(T.STRVEC, lambda ctx: ctx.nodes)
        if name in env.catalogue:
            self._signal_ok(name, node)
            label = name
            self.evidence_labels.append(label)
            key = ("last", name)

            def instant(ctx, name=name, key=key, label=label):
                v = window_vec(ctx, name, ctx.lookback, key, lambda t, W: functions.last(t, W))
                ctx.evidence.append((label, v))
                return v

            return _Node(T.VEC, instant)
        if name in FUNCTIONS:
            raise self._fix(_err(Code.WRONG_TYPE, f"{name} is a function: call it, e.g. {FUNCTION_DOCS.get(name, name)}", node))
        raise self._fix(self._unknown_name(name, node))

    def _check_items(self, items: list, what: str, node: ast.AST) -> None:
        """List items are numbers or strings, within the number limits (``in`` holds them as float64)."""
        for i in items:
            if isinstance(i, bool) or not isinstance(i, (int, float, str)):
                raise self._fix(_err(Code.WRONG_TYPE, f"{what}: items must be numbers or strings", node))
            why = self.env.limits.number_problem(i)
            if why:
                raise self._fix(_err(Code.OUT_OF_RANGE, f"{what}: {why}", node))

    def _unknown_name(self, name: str, node: ast.AST) -> ExprError:
        collectors = {s.collector for s in self.env.catalogue.values()}
        looks_like_signal = "_" in name and name.split("_", 1)[0] in collectors
        pool = list(self.env.catalogue) if looks_like_signal else list(self.env.params) + list(self.env.macros) + list(self.env.lists)
        hint = difflib.get_close_matches(name, pool, n=1)
        hint_s = f"; did you mean {hint[0]}?" if hint else ""
        if looks_like_signal:
            return _err(Code.UNCATALOGUED_SIGNAL, f"{name} is not a catalogued signal{hint_s} "
                                                  "(skewd signals lists them)", node)
        return _err(Code.UNKNOWN_PARAM, f"unknown name {name}: not a param, macro, list or signal{hint_s}", node)

    def _signal_ok(self, name: str, node: ast.AST) -> None:
        spec = self.env.catalogue[name]
        rs = self.env.scope
        ok = spec.scope == rs or (spec.scope == Scope.NODE) or (rs in (Scope.TP_GROUP, Scope.CLUSTER) and spec.scope == Scope.NODE)
        if not ok:
            raise self._fix(_err(Code.SCOPE_MISMATCH,
                                 f"{name} is per {spec.scope.value}, but this rule's scope is {rs.value}: "
                                 f"use scope: {spec.scope.value}", node))
        if spec.scope != Scope.NODE:
            self._wide_reads[0] += 1
        self.signals.add(name)

    # -- calls -------------------------------------------------------------------------------
    def _call(self, node: ast.Call, depth: int) -> _Node:
        if not isinstance(node.func, ast.Name):
            raise self._fix(_err(Code.FORBIDDEN_SYNTAX, "only plain function names can be called", node))
        if node.keywords:
            raise self._fix(_err(Code.FORBIDDEN_SYNTAX, "keyword arguments are not allowed", node))
        if any(isinstance(a, ast.Starred) for a in node.args):
            raise self._fix(_err(Code.FORBIDDEN_SYNTAX, "*args are not allowed", node))
        name = node.func.id
        args = node.args
        if name in WINDOW_FUNCTIONS or name in CONDITION_WINDOW_FUNCTIONS or name in ("quantile", "last"):
            return self._window_call(node, name, args, depth)
        if name == "age":
            if len(args) != 1:
                raise self._fix(_err(Code.WRONG_TYPE, "age(x) takes one signal", node))
            sig = self._series_signal(args[0])
            label = self._label(node)
            self.evidence_labels.append(label)
            self.max_window = max(self.max_window, 0.0)
            self.uses_horizon = True

            def age_fn(ctx, sig=sig, label=label):
                v = window_vec(ctx, sig, ctx.store.horizon, ("age", sig),
                                lambda t, W: functions.age(t, W, ctx.now))
                ctx.evidence.append((label, v))
                return v

            return _Node(T.VEC, age_fn)
        if name in PEER_FUNCTIONS:
            if len(args) != 1:
                raise self._fix(_err(Code.WRONG_TYPE, f"{name}(v) takes one argument", node))
            inner = self._need(self._expr(args[0], depth), (T.VEC,), args[0], name)
            self.uses_peers = True
            f, kernel = inner.fn, PEER_FUNCTIONS[name]
            label = self._label(node)
            self.evidence_labels.append(label)

            def peer(ctx, f=f, kernel=kernel, label=label):
                if ctx.ticks is not None:
                    v = peer_range(ctx, np.asarray(f(ctx), dtype=float), kernel)
                    ctx.evidence.append((label, v))
                    return v
                v = kernel(np.asarray(f(ctx), dtype=float), ctx.groups)
                ctx.evidence.append((label, v))
                return v

            return _Node(T.VEC, peer)
        if name in ELEMENTWISE_FUNCTIONS:
            return self._elementwise(node, name, args, depth)
        hint = difflib.get_close_matches(name, FUNCTIONS, n=1)
        extra = ""
        if name in ("min", "max"):
            extra = " (window min/max need a duration; for two values use least/greatest)"
        raise self._fix(_err(Code.UNKNOWN_FUNCTION, f"unknown function {name}()"
                             + (f"; did you mean {hint[0]}()?" if hint else "") + extra, node))

    def _elementwise(self, node: ast.Call, name: str, args: list, depth: int) -> _Node:
        subs = [self._need(self._expr(a, depth), (T.VEC, T.NUM, T.DUR), a, f"{name}()") for a in args]
        fns = [s.fn for s in subs]
        if name == "abs":
            if len(subs) != 1:
                raise self._fix(_err(Code.WRONG_TYPE, "abs(v) takes one argument", node))
            f = fns[0]
            return _Node(T.VEC, lambda ctx: np.abs(f(ctx)))
        if name in ("greatest", "least"):
            if len(subs) < 2:
                raise self._fix(_err(Code.WRONG_TYPE, f"{name}(a, b, ...) takes at least two arguments", node))
            red = np.fmax if name == "greatest" else np.fmin

            def gl(ctx, fns=fns, red=red):
                acc = np.asarray(fns[0](ctx), dtype=float)
                for f in fns[1:]:
                    acc = red(acc, f(ctx))
                return acc

            return _Node(T.VEC, gl)
        if name == "default":
            if len(subs) != 2 or subs[1].t is not T.NUM:
                raise self._fix(_err(Code.WRONG_TYPE, "default(v, number) takes a value and a number", node))
            f, d = fns[0], subs[1].const

            def default(ctx, f=f, d=d):
                x = np.asarray(f(ctx), dtype=float)
                if not functions.has_nan(x):  # the usual case: nothing to fill, no new array
                    return x
                return np.where(np.isnan(x), d, x)

            return _Node(T.VEC, default)
        # bitand
        if len(subs) != 2 or subs[1].t is not T.NUM:
            raise self._fix(_err(Code.WRONG_TYPE, "bitand(v, mask) takes a value and an integer mask", node))
        mask_v = subs[1].const
        if not (mask_v == mask_v and 0 <= mask_v < 2.0 ** 62 and float(mask_v).is_integer()):
            raise self._fix(_err(Code.OUT_OF_RANGE, f"bitand() mask must be an integer in 0..2**62, got {mask_v:g}",
                                 args[1]))
        f, mask = fns[0], int(mask_v)

        def bitand(ctx):
            x = np.asarray(f(ctx), dtype=float)
            ok = ~np.isnan(x) & (x >= 0) & (x < 2.0 ** 62)
            xi = np.where(ok, x, 0).astype(np.int64)
            return np.where(ok, (xi & mask).astype(float), np.nan)

        return _Node(T.VEC, bitand)

    def _series_signal(self, arg: ast.AST) -> str:
        if not isinstance(arg, ast.Name):
            raise self._fix(_err(Code.WRONG_TYPE, "expected a signal name", arg))
        if arg.id not in self.env.catalogue:
            if arg.id in self.env.params or arg.id in self.env.macros or arg.id.startswith("_"):
                raise self._fix(_err(Code.WRONG_TYPE, f"expected a signal name, got {arg.id}", arg))
            raise self._fix(self._unknown_name(arg.id, arg))
        self._signal_ok(arg.id, arg)
        return arg.id

    def _series_expr(self, arg: ast.AST, depth: int) -> tuple[str, Callable[[np.ndarray], np.ndarray], str]:
        """A window function's first argument: one signal, optionally inside an elementwise
        expression with constants (``x > 0.9``). Returns (signal, transform(W), cache key)."""
        names = [n for n in ast.walk(arg) if isinstance(n, ast.Name)]
        sigs = {n.id for n in names if n.id in self.env.catalogue}
        if isinstance(arg, ast.Name):
            return self._series_signal(arg), identity, ""
        if len(sigs) != 1:
            raise self._fix(_err(Code.WRONG_TYPE, "a window function's first argument must use exactly one "
                                                 "signal (e.g. x or x > 0.9)", arg))
        sig = next(iter(sigs))
        self._signal_ok(sig, arg)
        fn = self._series_fn(arg, sig, depth)
        return sig, fn, self._label(arg)

    def _series_fn(self, node: ast.AST, sig: str, depth: int) -> Callable[[np.ndarray], np.ndarray]:
        if depth > self.env.limits.expr_depth:
            raise self._fix(_err(Code.LIMIT, f"expression nested deeper than {self.env.limits.expr_depth} "
                                             "(rule_limits.expr_depth)", node))
        if isinstance(node, ast.Name) and node.id == sig:
            return lambda W: W
        if isinstance(node, ast.Compare):
            if len(node.ops) != 1 or type(node.ops[0]) not in CMP:
                raise self._fix(_err(Code.WRONG_TYPE, "only one <, <=, >, >=, ==, != per window condition", node))
            a = self._series_fn(node.left, sig, depth + 1)
            b = self._series_fn(node.comparators[0], sig, depth + 1)
            cmp = CMP[type(node.ops[0])]
            return lambda W: num_cmp(cmp, a(W), b(W))
        if isinstance(node, ast.BinOp) and type(node.op) in BIN:
            a = self._series_fn(node.left, sig, depth + 1)
            b = self._series_fn(node.right, sig, depth + 1)
            op = BIN[type(node.op)]

            def binop(W):
                return op(a(W), b(W))

            return binop
        if isinstance(node, ast.BoolOp):
            parts = [self._series_fn(v, sig, depth + 1) for v in node.values]
            op = kleene_and if isinstance(node.op, ast.And) else kleene_or

            def boolop(W):
                acc = parts[0](W)
                for p in parts[1:]:
                    acc = op(acc, p(W))
                return acc

            return boolop
        if isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.USub, ast.Not)):
            a = self._series_fn(node.operand, sig, depth + 1)
            return (lambda W: -a(W)) if isinstance(node.op, ast.USub) else (lambda W: kleene_not(a(W)))
        sub = self._expr(node, depth + 1)
        if sub.const is None or sub.t not in (T.NUM, T.DUR):
            raise self._fix(_err(Code.WRONG_TYPE, "inside a window function only the signal, numbers, params "
                                                 "and arithmetic/comparisons are allowed", node))
        c = float(sub.const)
        return lambda W: c

    def _bad_duration_param(self, n: _Node, node: ast.AST) -> ExprError:
        try:
            parse_duration(n.const)
        except ValueError as e:
            return _err(Code.BAD_DURATION, f"param {n.param}: {e}", node)
        raise AssertionError("a string param that parses is a duration")

    def _duration_arg(self, arg: ast.AST, fname: str, depth: int) -> float:
        sub = self._expr(arg, depth)
        if sub.param and sub.t is T.STR:
            raise self._fix(self._bad_duration_param(sub, arg))
        if sub.t is not T.DUR:
            raise self._fix(_err(Code.WRONG_TYPE if sub.t is not T.NUM else Code.BAD_DURATION,
                                 f"{fname}() needs a duration here (e.g. 30s, 5m), got a {sub.t.value}", arg))
        if not sub.const or not sub.const > 0:
            raise self._fix(_err(Code.BAD_DURATION, f"{fname}() window must be longer than 0s", arg))
        why = self.env.limits.duration_problem(float(sub.const))
        if why:
            raise self._fix(_err(Code.OUT_OF_RANGE, f"{fname}() window: {why}", arg))
        return float(sub.const)

    def _window_call(self, node: ast.Call, name: str, args: list, depth: int) -> _Node:
        want = 3 if name == "quantile" else 2
        if len(args) != want:
            usage = FUNCTION_DOCS.get(name, name)
            raise self._fix(_err(Code.WRONG_TYPE, f"{name}() takes {want} arguments: {usage}", node))
        dur = self._duration_arg(args[-1], name, depth)
        self.max_window = max(self.max_window, dur)
        label = self._label(node)
        self.evidence_labels.append(label)
        if name in CONDITION_WINDOW_FUNCTIONS:
            sig, tf, tkey = self._series_expr(args[0], depth)
            key = (name, sig, tf, dur)

            def cond_win(ctx, sig=sig, key=key, tf=tf, name=name, label=label):
                if name == "gaps":
                    k = lambda t, W: functions.gaps(t, truth(tf(W)))
                else:
                    k = lambda t, W: functions.longest_gap(t, truth(tf(W)), ctx.now - dur, ctx.now)
                v = window_vec(ctx, sig, dur, key, k)
                ctx.evidence.append((label, v))
                return v

            return _Node(T.VEC, cond_win)
        if name == "quantile":
            q = self._expr(args[1], depth)
            if q.t is not T.NUM or not (0.0 <= q.const <= 1.0):
                raise self._fix(_err(Code.WRONG_TYPE, "quantile(x, q, 1m): q must be a number in [0, 1]", args[1]))
            qq = float(q.const)
            kernel = lambda t, W, qq=qq: functions.quantile(t, W, qq)
            need = None
        elif name == "last":
            kernel, need = functions.last, None
        else:
            kernel, need = WINDOW_FUNCTIONS[name]
        sig, tf, tkey = self._series_expr(args[0], depth)
        spec = self.env.catalogue[sig]
        if need == "counter" and spec.kind is not Kind.COUNTER:
            raise self._fix(_err(Code.WRONG_TYPE, f"{name}() needs a counter, but {sig} is a gauge: "
                                                 "use delta(), avg() or max()", args[0]))
        if need == "gauge" and spec.kind is Kind.COUNTER:
            raise self._fix(_err(Code.WRONG_TYPE, f"{name}() needs a gauge, but {sig} is a counter: "
                                                 "use increase() or rate()", args[0]))
        if need == "counter" and tkey:
            raise self._fix(_err(Code.WRONG_TYPE, f"{name}() takes the counter itself, not an expression", args[0]))
        if name in ("rate", "increase"):
            wb = spec.wrap_bits
            base = kernel
            kernel = lambda t, W, base=base, wb=wb: base(t, W, wb)
        if tkey:
            inner = kernel
            kernel = lambda t, W, inner=inner, tf=tf: inner(t, tf(W))
        key = (name, sig, tf, dur) if name != "quantile" else (name, sig, tf, dur, qq)
        if not tkey and name in BATCHED_KINDS:
            self.windows.append((key, sig, name, dur, spec.wrap_bits))

        def win(ctx, sig=sig, key=key, kernel=kernel, dur=dur, label=label):
            v = window_vec(ctx, sig, dur, key, kernel)
            ctx.evidence.append((label, v))
            return v

        return _Node(T.VEC, win)


def compile_expr(text: str, env: CompileEnv) -> Compiled:
    """Compile one rule expression (or raise ``ExprError`` with its code and offset)."""
    return Compiler(env, text).compile()
