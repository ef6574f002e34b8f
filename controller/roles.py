"""What a :class:`~skewd.controller.service.Controller` instance does (docs/controller.md,
"Scale-out"): everything (one process, the default), one summary partition's share (a
worker's), or the cluster-wide rest (the leader).

A module of its own because every part of the controller branches on the role and the
scale-out worker (:mod:`skewd.controller.scaleout`) chooses it, while none of them may import
the service that assembles them.
"""
from __future__ import annotations

ROLE_ALL, ROLE_PARTITION, ROLE_LEADER = "all", "partition", "leader"
