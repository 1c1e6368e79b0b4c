"""The planner's version and the verl release it targets, both from package metadata: the
installed ``plan-parallel`` distribution's version and its ``verl`` extra's pin
(``pyproject.toml``).  A source checkout that is not installed reads ``pyproject.toml``.

Installed distributions are read as ``importlib.metadata``'s path finder finds them -- the first
``NAME-VERSION.dist-info`` (or ``.egg-info``) directory of the normalised name on ``sys.path``,
its ``METADATA`` (``PKG-INFO``) headers -- without importing ``importlib.metadata`` (and the
``email`` package it parses with: about 50 ms of every start).  A distribution only a custom
finder knows (a zip import) reads as not installed.
"""

from __future__ import annotations

import os
import re
import sys
from functools import cache
from pathlib import Path

DISTRIBUTION = "plan-parallel"
_PYPROJECT = Path(__file__).resolve().parent.parent / "pyproject.toml"


def _pyproject_text() -> str:
    try:
        return _PYPROJECT.read_text()
    except OSError:
        return ""


def _normalized(name: str) -> str:
    """A project name as the packaging specs compare it (PEP 503; ``_`` as in directory
    names)."""
    return re.sub(r"[-_.]+", "_", name).lower()


def _headers(path: str) -> list[tuple[str, str]]:
    """The ``Key: value`` headers of a core-metadata file (up to its body)."""
    try:
        with open(path, encoding="utf-8", errors="replace") as handle:
            text = handle.read()
    except OSError:
        return []
    headers = []
    for line in text.split("\n\n", 1)[0].splitlines():
        key, colon, value = line.partition(":")
        if colon and not line[:1].isspace():
            headers.append((key.strip().lower(), value.strip()))
    return headers


# directory -> (its mtime, its metadata directories by normalised name, in sorted order)
_LISTINGS: dict[str, tuple[int, dict[str, list[str]]]] = {}


def _distributions(directory: str) -> dict[str, list[str]]:
    """The ``*.dist-info`` and ``*.egg-info`` children of ``directory`` by normalised project
    name, each name's in sorted order; empty when it is not a directory (a zip) or gone.  Kept
    while the directory's mtime stays (an entry added or removed changes it), as importlib's
    path finder keeps a directory's listing: a plan reads four versions, and each listing of
    site-packages and the standard library costs milliseconds."""
    try:
        stamp = os.stat(directory).st_mtime_ns
        kept = _LISTINGS.get(directory)
        if kept is not None and kept[0] == stamp:
            return kept[1]
        children = sorted(os.listdir(directory))
    except OSError:
        return {}
    found: dict[str, list[str]] = {}
    for child in children:
        stem, _, suffix = child.rpartition(".")
        if suffix in ("dist-info", "egg-info"):
            found.setdefault(_normalized(stem.split("-", 1)[0]), []).append(child)
    _LISTINGS[directory] = (stamp, found)
    return found


def _metadata_headers(package: str) -> list[tuple[str, str]] | None:
    """The metadata headers of the installed distribution ``package`` (None: not installed)."""
    wanted = _normalized(package)
    for entry in sys.path:
        directory = entry or "."
        for child in _distributions(directory).get(wanted, ()):
            path = os.path.join(directory, child)
            if os.path.isdir(path):
                path = os.path.join(path, "METADATA" if child.endswith(".dist-info")
                                    else "PKG-INFO")
            headers = _headers(path)
            if any(key == "version" for key, _ in headers):
                return headers
    return None


def installed_version(package: str) -> str | None:
    """The installed version of ``package`` (``importlib.metadata.version``), None when it is
    not installed."""
    headers = _metadata_headers(package)
    return None if headers is None else next(value for key, value in headers
                                             if key == "version")


@cache
def planner_version() -> str:
    found = installed_version(DISTRIBUTION)
    if found is not None:
        return found
    found = re.search(r'^version\s*=\s*"([^"]+)"', _pyproject_text(), re.MULTILINE)
    return found.group(1) if found else "0+unknown"


@cache
def target_verl_version() -> str:
    """The ``verl==X`` pin of the ``verl`` extra: the release exports and checks target."""
    headers = _metadata_headers(DISTRIBUTION)
    if headers is not None:
        requirements = [value for key, value in headers if key == "requires-dist"]
    else:
        requirements = re.findall(r'"(verl==[^"]+)"', _pyproject_text())
    for requirement in requirements:
        found = re.match(r"\s*verl\s*==\s*([\w.]+)", requirement)
        if found:
            return found.group(1)
    return "unknown"
