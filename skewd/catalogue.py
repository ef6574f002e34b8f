"""The full signal catalogue: every collector's signals plus the agent's node summaries.

Rules are checked against this; ``skewd signals`` prints it.
"""
from __future__ import annotations

import importlib

from skewd.model import Catalogue


def full_catalogue() -> Catalogue:
    from skewd.collectors import registry

    cat = registry.catalogue()
    for mod, attr in (("skewd.agent.summary", "CATALOGUE"), ("skewd.controller.catalogue", "CATALOGUE")):
        try:
            m = importlib.import_module(mod)
        except ModuleNotFoundError as e:
            if e.name == mod:
                continue
            raise
        cat = cat.merge(getattr(m, attr))
    return cat
