"""Open sockets inside a named network namespace without forking.

``setns(CLONE_NEWNET)`` changes only the calling thread's namespace, and a socket keeps the
namespace it was created in for its whole life. So a short-lived thread can enter the
namespace, create the socket and exit: the process never leaves its own namespace, and
nothing has to be restored. Named namespaces live under ``/run/netns`` (``ip netns``).
"""
from __future__ import annotations

import ctypes
import errno
import os
import socket
import threading
from typing import Callable, TypeVar

CLONE_NEWNET = 0x40000000
NETNS_RUN_DIR = "/run/netns"

T = TypeVar("T")

_libc = ctypes.CDLL(None, use_errno=True)


def netns_path(name: str) -> str:
    """Path of a named namespace; absolute paths (``/proc/<pid>/ns/net``) pass through."""
    return name if name.startswith("/") else os.path.join(NETNS_RUN_DIR, name)


def run_in_netns(name: str, fn: Callable[[], T]) -> T:
    """Call ``fn`` on a thread that has joined namespace ``name``; return or raise its result."""
    out: dict[str, object] = {}

    def body() -> None:
        try:
            fd = os.open(netns_path(name), os.O_RDONLY | os.O_CLOEXEC)
            try:
                if _libc.setns(fd, CLONE_NEWNET) != 0:
                    e = ctypes.get_errno()
                    raise OSError(e, f"setns({netns_path(name)}): {os.strerror(e)}")
            finally:
                os.close(fd)
            out["value"] = fn()
        except BaseException as e:  # handed to the caller's thread
            out["error"] = e

    t = threading.Thread(target=body, name=f"netns:{name}", daemon=True)
    t.start()
    t.join()
    if "error" in out:
        raise out["error"]  # type: ignore[misc]
    return out["value"]  # type: ignore[return-value]


def socket_in_netns(name: str, family: int = socket.AF_INET, type: int = socket.SOCK_DGRAM,
                    proto: int = 0) -> socket.socket:
    """A socket that lives in namespace ``name`` (raises FileNotFoundError if it does not exist)."""
    return run_in_netns(name, lambda: socket.socket(family, type, proto))


def netns_exists(name: str) -> bool:
    try:
        os.stat(netns_path(name))
        return True
    except OSError as e:
        if e.errno in (errno.ENOENT, errno.ENOTDIR):
            return False
        raise
