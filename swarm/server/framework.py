"""The web-framework versions the server's fast paths were tested on, and the switch that turns them off.

`swarm.server.lean_route` (FastAPI's route handler and dependency model, Starlette's middleware stack)
and `swarm.server.http_protocol` (uvicorn's httptools protocol) lean on framework internals that no
version promises to keep. ``pyproject.toml`` pins the three packages to the ranges in `TESTED`; where an
installed version lies outside its range anyway (an override, a hand-installed upgrade), `fast_path`
answers ``False`` and the server runs the standard FastAPI route path and uvicorn's own protocol, after
one log line saying which package is outside its range. Nothing here fails at import.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Iterable
from functools import cache
from importlib import metadata

log = logging.getLogger(__name__)

TESTED: dict[str, tuple[str, str]] = {
    "fastapi": ("0.115", "0.166"),
    "starlette": ("0.40", "1.11"),
    "uvicorn": ("0.30", "0.56"),
}
"""Per package, the ``[lowest, first untested)`` versions the fast paths were tested on (the pins of
``pyproject.toml``, checked against it by ``tests/server/test_framework.py``)."""

ROUTES = ("fastapi", "starlette")
"""What the lean and hot routes (`swarm.server.lean_route`, `swarm.server.app.SwarmApp`) lean on."""
PROTOCOL = ("uvicorn",)
"""What the coalescing HTTP protocol (`swarm.server.http_protocol`) leans on."""

_reported: set[str] = set()


def version_tuple(version: str) -> tuple[int, ...]:
    """The leading numeric release of ``version`` (``"0.165.0rc1"`` → ``(0, 165, 0)``)."""
    found = re.match(r"\d+(?:\.\d+)*", version)
    return tuple(int(part) for part in found.group().split(".")) if found else ()


@cache
def installed_version(package: str) -> str | None:
    """The installed version of ``package`` (``None``: not installed)."""
    try:
        return metadata.version(package)
    except metadata.PackageNotFoundError:
        return None


def untested(packages: Iterable[str]) -> list[str]:
    """One phrase per package of ``packages`` whose installed version is outside `TESTED`."""
    out = []
    for package in packages:
        low, high = TESTED[package]
        version = installed_version(package)
        if version is None or not version_tuple(low) <= version_tuple(version) < version_tuple(high):
            out.append(f"{package} {version} (tested: >={low},<{high})")
    return out


def fast_path(packages: Iterable[str], what: str) -> bool:
    """Whether the fast path ``what`` (leaning on ``packages``' internals) may run: every one of them
    is installed in its tested range. When not, logs one warning line per ``what`` and process."""
    outside = untested(packages)
    if not outside:
        return True
    if what not in _reported:
        _reported.add(what)
        log.warning("%s off: %s; the standard path serves instead", what, ", ".join(outside))
    return False
