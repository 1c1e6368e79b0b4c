"""The planner's version and the verl release it targets, both from package metadata: the
installed ``plan-parallel`` distribution's version and its ``verl`` extra's pin
(``pyproject.toml``).  A source checkout that is not installed reads ``pyproject.toml``."""

from __future__ import annotations

import re
from functools import cache
from importlib import metadata
from pathlib import Path

DISTRIBUTION = "plan-parallel"
_PYPROJECT = Path(__file__).resolve().parent.parent / "pyproject.toml"


def _pyproject_text() -> str:
    try:
        return _PYPROJECT.read_text()
    except OSError:
        return ""


@cache
def planner_version() -> str:
    try:
        return metadata.version(DISTRIBUTION)
    except metadata.PackageNotFoundError:
        found = re.search(r'^version\s*=\s*"([^"]+)"', _pyproject_text(), re.MULTILINE)
        return found.group(1) if found else "0+unknown"


@cache
def target_verl_version() -> str:
    """The ``verl==X`` pin of the ``verl`` extra: the release exports and checks target."""
    try:
        requirements = metadata.requires(DISTRIBUTION) or []
    except metadata.PackageNotFoundError:
        requirements = re.findall(r'"(verl==[^"]+)"', _pyproject_text())
    for requirement in requirements:
        found = re.match(r"\s*verl\s*==\s*([\w.]+)", requirement)
        if found:
            return found.group(1)
    return "unknown"
