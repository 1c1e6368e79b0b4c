"""The Workload protocol: GRPO and pretraining each state what the planner reads, honestly;
nothing outside planner/catalog/workload.py asks which kind a workload is."""

import sys
import typing
from pathlib import Path

import numpy as np
import pytest
from conftest import cluster

from planner.catalog.models import resolve_model
from planner.catalog.workload import GrpoWorkload, PretrainWorkload, RolloutEngine, Workload
from planner.cost.memory import NOMINAL_ENGINE, engine_of
from planner.cost.request import PlanRequest
from planner.plan import make_plan

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from benchmarks import code_shape  # noqa: E402

MEMBERS = sorted(set(typing.get_type_hints(Workload)) | {
    name for name, value in vars(Workload).items()
    if isinstance(value, property) or (callable(value) and not name.startswith("_"))})


@pytest.mark.parametrize("workload", [GrpoWorkload(), PretrainWorkload()],
                         ids=["grpo", "pretrain"])
def test_both_workloads_implement_the_protocol(workload):
    missing = [name for name in MEMBERS if not hasattr(workload, name)]
    assert not missing
    assert set(workload.phases) <= {"generate", "old_log_prob", "ref", "update_actor",
                                    "weight_sync"}
    assert workload.has_rollout == ("generate" in workload.phases)
    assert (workload.engine is not None) == workload.has_rollout
    assert workload.sequences_per_step >= workload.sequences_per_mini_batch >= 1
    assert workload.mean_sequence_length <= workload.sequence_length


def test_pretraining_does_not_imitate_grpo():
    """No rollout_n = 1 or max_num_seqs = 1 standing in for a rollout it does not have."""
    pretrain = PretrainWorkload(seq_len=4096, global_batch=256)
    for name in ("rollout_n", "max_num_seqs", "mean_response_length", "ppo_epochs",
                 "use_kl_loss", "train_batch_size", "mini_batch_size", "prompt_length"):
        assert not hasattr(pretrain, name), name
    assert pretrain.engine is None and not pretrain.has_rollout
    assert pretrain.dataset_rows_per_step == pretrain.sequences_per_step == 256
    assert pretrain.mean_sequence_length == pretrain.sequence_length == 4096


def test_the_grpo_engine_states_verls_rollout_settings():
    work = GrpoWorkload(rollout_n=8, max_num_seqs=64, enforce_eager=True, prefix_caching=True,
                        rollout_precision="fp8")
    assert work.engine == RolloutEngine(precision="fp8", max_num_seqs=64, enforce_eager=True,
                                        kv_sharing=8)
    assert GrpoWorkload(prefix_caching=False).engine.kv_sharing == 1
    assert work.dataset_rows_per_step == work.train_batch_size
    assert work.mean_sequence_length == 1024 + 512  # mean prompt (the maximum) + half of 1024


def test_phases_a_pretraining_step_does_not_run_never_set_its_peak():
    """The schema's columns for the phases a plain training step does not run come from the
    nominal engine (one sequence at a time), stated in one place, and never set the peak."""
    assert engine_of(PretrainWorkload()) is NOMINAL_ENGINE and NOMINAL_ENGINE.max_num_seqs == 1
    plan = make_plan(PlanRequest(resolve_model("qwen3-8b"), cluster(8),
                                 PretrainWorkload(seq_len=4096, global_batch=64)))
    frame = plan.fitting
    assert len(frame) and set(frame["peak_phase"].astype(str)) == {"update_actor"}
    assert np.allclose(frame["peak_bytes"], frame["mem_update_actor_bytes"])


def test_no_kind_checks_outside_the_workload_module():
    assert code_shape.kind_checks(ROOT) == []
