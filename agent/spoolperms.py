"""Private files for the spool: its directory 0700 and every file 0600, whatever the umask.

Findings name nodes, rules and what is wrong with them, so what waits for NATS is readable by
the agent only; an existing spool directory and its files written by an older skewd are
tightened when opened, and a shared directory (sticky bit, such as /tmp) is left alone with a
warning. Apart from :mod:`.spool` because it is about the host's file system, not the queue.
"""
from __future__ import annotations

import logging
import os
import stat
from pathlib import Path

log = logging.getLogger("skewd.agent.spool")

FILE_MODE = 0o600
DIR_MODE = 0o700


def make_private_dir(path: Path) -> None:
    """Create ``path`` and any missing parent as 0700 (whatever the umask); tighten an existing
    spool directory that others could read."""
    missing = []
    p = path
    while not p.exists():
        missing.append(p)
        if p.parent == p:
            break
        p = p.parent
    for d in reversed(missing):
        try:
            os.mkdir(d, DIR_MODE)
        except FileExistsError:
            pass
        os.chmod(d, DIR_MODE)  # mkdir's mode is filtered by the umask; this one is not widened by it
    try:
        st = os.stat(path)
    except OSError:
        return
    if st.st_uid == os.geteuid() and not st.st_mode & stat.S_ISVTX:  # never a shared dir such as /tmp
        tighten(path, DIR_MODE)
    elif st.st_mode & 0o077:
        log.warning("spool directory %s is shared (mode %o, owner uid %d): give the agent a directory of its "
                    "own; its files stay 0600", path, stat.S_IMODE(st.st_mode), st.st_uid)


def tighten(path: Path, mode: int) -> None:
    """chmod ``path`` to ``mode`` if it grants more (a spool written by an older skewd)."""
    try:
        st = os.stat(path)
    except OSError:
        return
    if st.st_mode & 0o777 & ~mode:
        try:
            os.chmod(path, mode)
        except OSError as e:
            log.warning("spool: cannot restrict %s to %o: %s", path, mode, e.strerror or e)
