"""Rule expression text → a Python expression tree the compiler may trust about its shape.

The rule language borrows Python's expression syntax, so ``ast`` parses it; what this module
adds is what makes that safe and the errors readable: the size limit is checked before any
parsing, duration literals (``30s``, ``1h30m``) are turned into placeholder names first (the
``lexer``), comments are refused, and the text is flattened to one line of the same length so
that every column ``ast`` reports is a column of the rule's own text. Nothing here decides what
a name or call means - that is the compiler's (``expr``) whitelist - and nothing is evaluated.
"""
from __future__ import annotations

import ast
import warnings
from dataclasses import dataclass

from .codes import Code, ExprError
from .lexer import map_offset, rewrite_durations, split_strings
from .limits import RuleLimits


@dataclass
class Parsed:
    """One expression's tree with what the compiler needs to label and place its parts:
    ``src`` (the rewritten one-line text the tree's columns index), the ``durations`` its
    placeholders stand for, and the ``spans`` that map rewritten columns back to the original."""

    tree: ast.Expression
    src: str
    durations: list[float]
    spans: list


def parse_expr(text: str, limits: RuleLimits) -> Parsed:
    """Parse one rule expression (or raise ``ExprError`` with its code and the offset into
    ``text``)."""
    if not isinstance(text, str) or not text.strip():
        raise ExprError(Code.EXPR_SYNTAX, "empty expression", 0)
    limit = limits.expr_chars
    if len(text) > limit:
        raise ExprError(Code.LIMIT, f"expression of {len(text)} characters; the limit is {limit} "
                                    "(rule_limits.expr_chars)", 0)
    try:
        src, durs, spans = rewrite_durations(text, limits)
    except ValueError as e:
        raise ExprError(Code.BAD_DURATION, str(e), 0) from None
    try:
        tree, src = _parse_rewritten(src)
    except ExprError as e:
        e.offset = max(0, min(map_offset(e.offset, spans), len(text)))
        raise
    return Parsed(tree, src, durs, spans)


def _parse_rewritten(src: str) -> tuple[ast.Expression, str]:
    """(tree, the one-line text its column offsets index) of the duration-free text ``src``;
    error offsets index ``src``."""
    for a, b, is_str in split_strings(src):
        if not is_str and "#" in src[a:b]:
            raise ExprError(Code.EXPR_SYNTAX, "comments are not allowed inside expr (use a YAML comment)",
                            a + src[a:b].index("#"))
    # one line, same length: AST column offsets are then offsets into the original text
    src = src.replace("\r", " ").replace("\n", " ").replace("\t", " ")
    body = src.lstrip()
    lead = len(src) - len(body)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # SyntaxWarning for e.g. "1if": we report our own errors
            tree = ast.parse(body, mode="eval")
    except SyntaxError as e:
        raise ExprError(Code.EXPR_SYNTAX, f"syntax error: {e.msg}", (e.offset or 1) - 1 + lead) from None
    except (RecursionError, MemoryError, ValueError, OverflowError) as e:
        raise ExprError(Code.EXPR_SYNTAX, f"expression cannot be parsed: {type(e).__name__}", 0) from None
    if lead:
        for n in ast.walk(tree):
            if hasattr(n, "col_offset"):
                n.col_offset += lead
                if getattr(n, "end_col_offset", None) is not None:
                    n.end_col_offset += lead
    return tree, " " * lead + body
