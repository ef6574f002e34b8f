"""JSON Schema of rule files, for editors (yaml-language-server) and CI linters.

The loader is the authority (it also checks expressions and signals); this schema gives
editors completion and early red squiggles for keys, enums and durations.
"""
from __future__ import annotations

from typing import Any

from skewd.model import Layer, Scope, Severity

from .engine import ENGINE_VERSION
from .loader import MATURITY, OVERRIDABLE
from .pathologies import PATHOLOGIES
from .vocabulary import FUNCTION_DOCS

DURATION = {"type": "string", "pattern": r"^((\d+(\.\d+)?)(ms|s|m|h|d))+$",
            "description": "a duration such as 30s, 5m, 1h30m, 250ms"}


def rule_file_schema(signals: list[str] | None = None) -> dict[str, Any]:
    signal_name: dict[str, Any] = {"type": "string", "pattern": "^[a-z][a-z0-9_]*$"}
    if signals:
        signal_name = {"type": "string", "enum": sorted(signals)}
    rule = {
        "type": "object",
        "additionalProperties": False,
        "required": ["id"],
        "properties": {
            "id": {"type": "string", "pattern": r"^[A-Za-z][A-Za-z0-9_.:-]*$"},
            "pathology": {"anyOf": [{"enum": sorted(PATHOLOGIES)}, {"type": "string", "pattern": "^custom"}]},
            "desc": {"type": "string"},
            "scope": {"enum": [s.value for s in Scope]},
            "requires": {"type": "array", "items": signal_name},
            "params": {"type": "object", "propertyNames": {"pattern": "^[a-z][a-z0-9_]*$"},
                       "additionalProperties": {"anyOf": [{"type": "number"}, DURATION, {"type": "array"}]}},
            "expr": {"type": "string", "description": "functions: " + "; ".join(FUNCTION_DOCS.values())},
            "for": DURATION,
            "keep_firing_for": DURATION,
            "severity": {"enum": [s.value for s in Severity]},
            "layer": {"enum": [s.value for s in Layer]},
            "mitigation": {"type": "string"},
            "summary": {"type": "string"},
            "labels": {"type": "object", "additionalProperties": {"type": "string"}},
            "tags": {"type": "array", "items": {"type": "string"},
                     "description": "include one maturity tag: " + ", ".join(MATURITY)},
            "enabled": {"type": "boolean"},
            "peers_by": {"type": "array", "minItems": 1,
                         "items": {"type": "string", "pattern": "^[A-Za-z_][A-Za-z0-9_]*$"},
                         "description": "group scopes: node labels that split the peers (peers share their values)"},
            "override": {"type": "object", "additionalProperties": False,
                         "properties": {k: {"enum": list(v)} for k, v in OVERRIDABLE.items()}},
        },
    }
    return {
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        "title": "skewd rule file",
        "type": "object",
        "additionalProperties": False,
        "required": ["required_engine_version"],
        "properties": {
            "required_engine_version": {"type": "integer", "minimum": 1, "maximum": ENGINE_VERSION},
            "rules": {"type": "array", "items": rule},
            "macros": {"type": "array", "items": {
                "type": "object", "additionalProperties": False, "required": ["name", "expr"],
                "properties": {"name": {"type": "string", "pattern": "^[a-z][a-z0-9_]*$"},
                               "expr": {"type": "string"}, "desc": {"type": "string"}}}},
            "lists": {"type": "array", "items": {
                "type": "object", "additionalProperties": False, "required": ["name", "items"],
                "properties": {"name": {"type": "string", "pattern": "^[a-z][a-z0-9_]*$"},
                               "items": {"type": "array", "items": {"type": ["number", "string"]}},
                               "desc": {"type": "string"}}}},
        },
    }
