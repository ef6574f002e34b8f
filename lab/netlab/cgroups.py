"""The lab's CPU cgroups: which hierarchy this host offers, and removing the lab's groups.

The ``straggler_cpu`` fault (:mod:`.faults`) puts a rank in a quota-limited group; the topology's
cleanup (:mod:`.topology`) removes every group of the lab's prefix with its namespaces. Both sit
above this module, which knows nothing of either.
"""
from __future__ import annotations

import os
from pathlib import Path

CGROUP_ROOT = Path(os.environ.get("SKEWD_LAB_CGROUP_ROOT", "/sys/fs/cgroup"))


def cgroup_cpu_mode(root: Path = CGROUP_ROOT) -> tuple[str, Path] | None:
    """("v2", dir) when the unified hierarchy at ``root`` (or ``root/unified``) offers the cpu
    controller, ("v1", root/cpu) for a v1 cpu hierarchy, None when neither is usable."""
    for d in (root, root / "unified"):
        ctl = d / "cgroup.controllers"
        try:
            if "cpu" in ctl.read_text().split():
                return "v2", d
        except OSError:
            continue
    if (root / "cpu" / "cpu.cfs_quota_us").exists():
        return "v1", root / "cpu"
    return None


def cleanup_cgroups(prefix: str) -> list[str]:
    """Remove the lab's cgroups named with ``prefix`` (their processes go back to the root)."""
    mode = cgroup_cpu_mode()
    if mode is None:
        return []
    _, base = mode
    gone = []
    for d in sorted(base.glob(prefix + "*")):
        if not d.is_dir():
            continue
        try:
            for pid in (d / "cgroup.procs").read_text().split():
                try:
                    (base / "cgroup.procs").write_text(pid)
                except OSError:
                    pass
            d.rmdir()
            gone.append(str(d))
        except OSError:
            pass
    return gone
