"""Error codes of the rule-loading stages (reader, loader, expression compiler, rule tests).

Each problem a stage reports carries one of these codes, so an operator can look it up and a
test can assert the exact failure; the slug (``unknown-key``) is the code's readable name.
``ExprError`` is the one exception type the expression compiler raises: a code, a message and
the offset into the expression's original text, which the loader turns into file:line:col.
"""
from __future__ import annotations

from enum import Enum


class Code(str, Enum):
    YAML_SYNTAX = "E001"
    UNKNOWN_KEY = "E002"
    MISSING_KEY = "E003"
    DUPLICATE_ID = "E004"
    UNCATALOGUED_SIGNAL = "E005"
    EXPR_SYNTAX = "E006"
    UNKNOWN_FUNCTION = "E007"
    WRONG_TYPE = "E008"
    BAD_DURATION = "E009"
    UNKNOWN_PARAM = "E010"
    BAD_VALUE = "E011"
    ENGINE_VERSION = "E012"
    MACRO_CYCLE = "E013"
    OVERRIDE_TARGET = "E014"
    FORBIDDEN_SYNTAX = "E015"
    SCOPE_MISMATCH = "E016"
    REQUIRES_MISMATCH = "E017"
    IO = "E018"
    LIMIT = "E019"
    OUT_OF_RANGE = "E020"

    @property
    def slug(self) -> str:
        return self.name.lower().replace("_", "-")


class ExprError(Exception):
    """A compile error inside an expression. ``offset`` is 0-based into the original text."""

    def __init__(self, code: Code, message: str, offset: int = 0) -> None:
        super().__init__(message)
        self.code = code
        self.message = message
        self.offset = offset
