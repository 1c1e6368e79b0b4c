"""One helper loads the heavy optional packages (verl, megatron-core, torch, transformers,
optuna, ray, matplotlib, hydra) on first use, and says which extra installs a missing one
(the pattern of ``optuna/_imports.py``)."""

from __future__ import annotations

import importlib
from types import ModuleType

from planner.errors import MissingExtraError

# top-level package -> (distribution, the plan-parallel extra that installs it)
EXTRA_OF = {
    "verl": ("verl", "verl"),
    "hydra": ("hydra-core", "verl"),
    "omegaconf": ("omegaconf", "verl"),
    "megatron": ("megatron-core", "verl"),
    "torch": ("torch", "verl"),
    "transformers": ("transformers", "verl"),
    "optuna": ("optuna", "tune"),
    "sqlalchemy": ("SQLAlchemy", "tune"),
    "psutil": ("psutil", "tune"),
    "scipy": ("scipy", "tune"),
    "ray": ("ray", "tune"),
    "matplotlib": ("matplotlib", "report"),
    "yaml": ("PyYAML", "verl"),
}


def missing_extra(error: ModuleNotFoundError, purpose: str) -> MissingExtraError | None:
    """The project's error for a heavy optional package that failed to import, or None when
    the missing module is not one of them (a real bug, left to surface)."""
    missing = (error.name or "").split(".")[0]
    if missing not in EXTRA_OF:
        return None
    distribution, extra = EXTRA_OF[missing]
    return MissingExtraError(f"{purpose} needs {distribution}, which is not installed; "
                             f"pip install 'plan-parallel[{extra}]'", extra=extra)


def require(module: str, purpose: str) -> ModuleType:
    """Import ``module`` (e.g. ``"verl.utils.config"``) or raise :class:`MissingExtraError`
    naming the extra to install and what it is needed for."""
    try:
        return importlib.import_module(module)
    except ModuleNotFoundError as error:
        top = module.split(".")[0]
        missing = (error.name or top).split(".")[0]
        if missing != top and missing not in EXTRA_OF:
            raise
        distribution, extra = EXTRA_OF.get(missing, (missing, None))
        hint = (f"pip install 'plan-parallel[{extra}]'" if extra
                else f"pip install {distribution}")
        raise MissingExtraError(f"{purpose} needs {distribution}, which is not installed; "
                                f"{hint}", extra=extra) from None


def available(module: str) -> bool:
    """Whether ``module`` can be imported (without importing it)."""
    import importlib.util

    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):
        return False
