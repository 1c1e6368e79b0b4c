"""Which calibration an answer used, what it was fitted on, and whether this machine's verl and
vLLM are the releases it was fitted on.

``benchmarks/calibrate.py`` records, under ``"provenance"`` in the calibration file, each source
of the fit: the framework and its releases (verl or NeMo RL with vLLM for the RL constants;
Megatron-Core through Megatron-Bridge's NeMo containers, or Megatron-LM, for the training ones)
and the fit's error on that source.  A calibration fitted from a user's trials or run carries its
own ``fit`` / ``run_fit`` source instead.
"""

from __future__ import annotations

import re

from planner import versions

SHIPPED_FILE = "planner/cost/calibration.json"
SHIPPED_LABEL = f"the shipped one ({SHIPPED_FILE})"


def _releases(versions) -> set[str]:
    """``major.minor`` of every release a text names (``v0.4.x-v0.5 era`` -> 0.4, 0.5)."""
    found = set()
    for text in versions:
        for major, minor in re.findall(r"v?(\d+)\.(\d+)", str(text)):
            found.add(f"{int(major)}.{int(minor)}")
    return found


def _span(versions) -> str:
    """Releases named in ``versions`` as ``v0.4-v0.5`` (or the texts, when none parse)."""
    releases = sorted(_releases(versions), key=lambda text: tuple(map(int, text.split("."))))
    if not releases:
        return "; ".join(versions)
    return f"v{releases[0]}" if len(releases) == 1 else f"v{releases[0]}-v{releases[-1]}"


def calibration_summary(calibration: dict, label: str) -> str:
    """One line: which calibration (``label``: the shipped file or a path), fitted on what, and
    its error on each framework it was fitted on."""
    parts = []
    prov = calibration.get("provenance") or {}
    training = (prov.get("training") or {}).get("by_source") or {}
    fit = calibration.get("fit") or {}
    if training:
        rows = sum(entry.get("measurements", 0) for entry in training.values())
        parts.append(f"training constants on {rows} Megatron measurements from "
                     f"{len(training)} sources"
                     + (f" (MAPE {fit['mape']:.0%})" if isinstance(fit.get("mape"), float)
                        else ""))
    elif fit:
        parts.append(f"fitted by {fit.get('source', 'an unnamed fit')}")
    rl = (prov.get("rl") or {}).get("by_source") or {}
    frameworks: dict[str, list] = {}
    for entry in rl.values():
        frameworks.setdefault(entry.get("framework", "?"), []).append(entry)
    if frameworks:
        texts = []
        for name, entries in sorted(frameworks.items()):
            steps = sum(entry.get("steps", 0) for entry in entries)
            phases = sum(entry.get("phases", 0) for entry in entries)
            error = sum(entry.get("mape", 0.0) * entry.get("phases", 0) for entry in entries)
            engines = sorted({engine for entry in entries for engine in entry.get("rollout", [])})
            versions = [v for entry in entries for v in entry.get("versions", [])]
            texts.append(f"{steps} {name} {_span(versions)} + {'/'.join(engines)} steps "
                         f"(MAPE {error / max(phases, 1):.0%})")
        parts.append("RL constants on " + ", ".join(texts))
    run = calibration.get("run_fit")
    if isinstance(run, dict):
        parts.append(f"refitted on {run.get('source', 'a run')}")
    return f"calibration: {label}: " + ("; ".join(parts) if parts else "no provenance recorded")


def installed_version(package: str) -> str | None:
    return versions.installed_version(package)


def version_notes(calibration: dict, installed: dict[str, str | None] | None = None
                  ) -> list[str]:
    """A note for each of verl and vLLM installed here in a release the calibration's RL
    sources were not measured with (``installed``: package -> version, default: what
    :func:`planner.versions.installed_version` finds).  None when nothing is recorded to
    compare with."""
    installed = installed if installed is not None else {
        name: installed_version(name) for name in ("verl", "vllm")}
    rl = ((calibration.get("provenance") or {}).get("rl") or {}).get("by_source") or {}
    notes = []
    verl_versions = sorted({v for entry in rl.values() if entry.get("framework") == "verl"
                            for v in entry.get("versions", [])})
    have = installed.get("verl")
    if have and verl_versions and _releases([have]) - _releases(verl_versions):
        notes.append(f"note: installed verl {have} is not a release the RL constants were "
                     f"measured with (verl {_span(verl_versions)}); generation and weight-sync "
                     f"times carry that gap (`plan-parallel advise` on a run of yours refits "
                     f"them)")
    engine = installed.get("vllm")
    if engine and rl:
        stated = sorted({v for entry in rl.values() for v in entry.get("vllm_versions", [])})
        if not stated:
            notes.append(f"note: installed vLLM {engine}; the published RL runs behind the "
                         f"calibration do not state their vLLM release")
        elif _releases([engine]) - _releases(stated):
            notes.append(f"note: installed vLLM {engine} is not a release the RL constants were "
                         f"measured with ({_span(stated)})")
    return notes


def cost_model_label(cost) -> str:
    """How an answer names the calibration of ``cost`` (a
    :class:`~planner.cost.efficiency.CostModel`): the shipped one, or the file it was read
    from."""
    from planner.cost.efficiency import SHIPPED_SOURCE

    return SHIPPED_LABEL if cost.source == SHIPPED_SOURCE else cost.source


def cost_model_summary(cost) -> str:
    """The one line every answer prints about its calibration (:func:`calibration_summary` of
    the cost model's calibration, named by :func:`cost_model_label`)."""
    return calibration_summary(dict(cost.calibration), cost_model_label(cost))
