"""A fourth training mode is one class registered: the CLI (``plan``, ``estimate``,
``explain``, ``--mode best``), the reports and ``tune``'s candidates find it through the
registry, and no product module names it.

The sketch: a *colocated one-step-off* -- verl's hybrid engine, samples one version stale.  On
shared GPUs generation and training take turns, so its step is sync's; it only adds the
staleness (why the planner does not offer it).  Registered here only, for the test's length.
"""

import json

import pytest

from planner.cli.main import main
from planner.modes import (
    BEST,
    SyncMode,
    get_mode,
    mode_choices,
    mode_names,
    off_policy_note,
    register,
    unregister,
)
from planner.results import Staleness

QWEN = ["--model", "qwen3-8b", "--gpu-type", "h100", "--gpus", "8"]


class ColocatedOneStepOff(SyncMode):
    """Sync's layouts, one parameter version stale."""

    name = "colocated-one-step-off"
    summary = "colocated hybrid engine, samples one version stale (a sketch)"
    off_policy = True

    def staleness(self) -> Staleness:
        return Staleness(max_versions_behind=1, stale_sample_fraction=1.0, off_policy=True)


@pytest.fixture
def fourth_mode():
    register(ColocatedOneStepOff)
    yield ColocatedOneStepOff.name
    unregister(ColocatedOneStepOff.name)


def run(capsys, *argv):
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def test_registering_a_mode_makes_it_a_choice(fourth_mode):
    assert mode_names()[-1] == fourth_mode and mode_choices()[-1] == BEST
    assert isinstance(get_mode(fourth_mode), ColocatedOneStepOff)
    assert off_policy_note().startswith("one-step-off and fully-async and "
                                        "colocated-one-step-off train on samples")
    with pytest.raises(ValueError):
        register(ColocatedOneStepOff)  # one name, one mode


def test_the_cli_plans_estimates_and_explains_the_new_mode(fourth_mode, capsys):
    code, out, _ = run(capsys, *QWEN, "--mode", fourth_mode, "--top", "2", "--format", "json")
    data = json.loads(out)
    assert code == 0 and data["mode"] == fourth_mode
    assert [c["staleness"]["max_versions_behind"] for c in data["candidates"]] == [1, 1]
    assert all(c["placement"]["colocated"] for c in data["candidates"])
    code, out, _ = run(capsys, *QWEN, "--mode", fourth_mode, "--top", "2")
    assert code == 0 and f"mode     {fourth_mode}: {ColocatedOneStepOff.summary}" in out
    assert out.rstrip().endswith(off_policy_note())
    code, out, _ = run(capsys, "estimate", *QWEN, "--mode", fourth_mode, "--tp", "2",
                       "--format", "json")
    assert code == 0 and json.loads(out)["valid"]
    code, out, _ = run(capsys, "explain", *QWEN, "--mode", fourth_mode, "--format", "json")
    assert code == 0 and json.loads(out)["rules_of_thumb"]
    code, _, err = run(capsys, *QWEN, "--mode", fourth_mode, "--trainer-gpus", "4")
    assert code == 2 and "colocated-one-step-off colocates both on every GPU" in err


def test_best_compares_the_new_mode_too(fourth_mode, capsys):
    code, out, _ = run(capsys, *QWEN, "--gpus", "16", "--mode", "best", "--trainer-gpus", "8",
                       "--format", "json")
    data = json.loads(out)
    modes = [entry["mode"] for entry in data["modes"]]
    assert code == 0 and modes == ["sync", "one-step-off", "fully-async", fourth_mode]
    sync, fourth = data["modes"][0], data["modes"][-1]
    assert fourth["best"]["step_time_s"] == sync["best"]["step_time_s"]  # turns: sync's step
    assert fourth["speedup_vs_sync"] == 1.0


def test_a_tune_study_of_the_new_mode_draws_its_candidates(fourth_mode):
    from planner.catalog.hardware import ClusterSpec, get_gpu
    from planner.catalog.models import resolve_model
    from planner.catalog.workload import GrpoWorkload
    from planner.cost.request import PlanRequest
    from trials.candidates import SEARCH_FIELDS, CandidateSet, mode_plans, study_fields

    request = PlanRequest(resolve_model("qwen3-8b"), ClusterSpec(get_gpu("h100"), 8, 8),
                          GrpoWorkload())
    plans = mode_plans(request, fourth_mode)
    candidates = CandidateSet.from_modes(plans, limit=5, mode=fourth_mode)
    assert study_fields(fourth_mode) == SEARCH_FIELDS
    assert len(candidates) == 5 and {c.mode for c in candidates} == {fourth_mode}


def test_the_built_in_modes_are_named_in_their_own_modules_only():
    """Modules outside planner/modes/ that hold a mode's name: the verl tables of entry points
    and configs (verl's names), the CLI's help texts, and tune's bookkeeping."""
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    sys.path.insert(0, str(root))
    from benchmarks import code_shape

    named = code_shape.mode_modules(root)
    assert not {"planner/placement.py", "planner/cost/pool_time.py", "planner/report/mode_tables.py",
                "planner/diagnose/explain_modes.py", "planner/cli/modes.py",
                "planner/cli/commands.py", "planner/cli/inputs.py",
                "trials/candidates.py"} & set(named), named


@pytest.mark.parametrize("first", ["planner.modes.fully_async", "planner.modes.one_step_off",
                                   "planner.modes.split", "planner.modes"])
def test_the_built_in_modes_keep_their_order_whichever_is_imported_first(first):
    # the split modes register when the registry is first read beyond the baseline, or when
    # their module is imported: in the same order either way
    import subprocess
    import sys

    code = (f"import {first}, planner.modes as m; print(m.baseline_name(), 'split' in "
            f"str(sorted(__import__('sys').modules)), m.mode_names())")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True).stdout.split(" ", 2)
    assert out[0] == "sync"
    assert out[2].strip() == "('sync', 'one-step-off', 'fully-async')"
