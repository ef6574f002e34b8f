"""A plain HTTP GET of a Prometheus text page with urllib (no extra dependency).

Shared by the ``vllm`` and ``exporter`` collectors. Errors become :class:`ScrapeError` with a
short reason an operator can act on ("connection refused", "timed out after 0.5 s", "HTTP 404").
"""
from __future__ import annotations

import socket
import urllib.error
import urllib.request
from typing import Any, Mapping
from urllib.parse import urlsplit

from skewd.model import parse_duration

#: ask for the classic text format: prometheus_client servers negotiate OpenMetrics otherwise
ACCEPT = "text/plain;version=0.0.4;q=1,*/*;q=0.1"
#: a /metrics page larger than this is refused rather than held in memory
MAX_BYTES = 32 * 1024 * 1024

# Proxies from the environment are never right for scraping a local or in-cluster endpoint.
_OPENER = urllib.request.build_opener(urllib.request.ProxyHandler({}))


def sample_value(v: float | int) -> float:
    """A parsed sample's value as a float. prometheus_client's text parser returns an int for a
    value written as an integer, and an integer past float range (a 400-digit counter) cannot
    become a float: it reads as +-inf, which is what Prometheus itself makes of it."""
    try:
        return float(v)
    except OverflowError:
        return float("inf") if v > 0 else float("-inf")


class ScrapeError(Exception):
    """The page could not be fetched; ``str(e)`` is the reason."""


def fetch(url: str, timeout: float) -> str:
    """GET ``url`` and return the body as text. Raises ScrapeError."""
    req = urllib.request.Request(url, headers={"Accept": ACCEPT, "User-Agent": "skewd"})
    try:
        with _OPENER.open(req, timeout=timeout) as resp:
            body = resp.read(MAX_BYTES + 1)
            charset = resp.headers.get_content_charset() or "utf-8"
    except urllib.error.HTTPError as e:
        raise ScrapeError(f"HTTP {e.code} {e.reason}") from None
    except urllib.error.URLError as e:
        reason = e.reason
        if isinstance(reason, ConnectionRefusedError):
            raise ScrapeError("connection refused") from None
        if isinstance(reason, (socket.timeout, TimeoutError)):
            raise ScrapeError(f"timed out after {timeout:g} s") from None
        raise ScrapeError(str(reason)) from None
    except (socket.timeout, TimeoutError):
        raise ScrapeError(f"timed out after {timeout:g} s") from None
    except (OSError, ValueError) as e:  # reset mid-body, bad URL
        raise ScrapeError(str(e) or type(e).__name__) from None
    if len(body) > MAX_BYTES:
        raise ScrapeError(f"page larger than {MAX_BYTES} bytes")
    return body.decode(charset, errors="replace")


def check_url(url: Any, where: str) -> str:
    """Validate an http(s) URL from config; raise ValueError naming the config key."""
    if not isinstance(url, str) or not url:
        raise ValueError(f"{where}: expected an http:// URL, got {url!r}")
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.netloc:
        raise ValueError(f"{where}: {url!r} is not an http:// or https:// URL")
    return url


def scrape_timeout(config: Mapping[str, Any], interval: float, collector: str) -> float:
    """``timeout`` from config (seconds or a duration string); must be shorter than the interval
    so a hanging endpoint cannot make ticks pile up. Default: half the interval, at most 2 s."""
    raw = config.get("timeout")
    if raw is None:
        return min(2.0, interval / 2)
    try:
        t = parse_duration(raw)
    except ValueError as e:
        raise ValueError(f"collectors.{collector}.timeout: {e}") from None
    if not 0 < t < interval:
        raise ValueError(f"collectors.{collector}.timeout: {t:g} s must be > 0 and shorter than "
                         f"the interval ({interval:g} s)")
    return t
