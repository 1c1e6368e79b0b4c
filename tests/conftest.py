import warnings
from dataclasses import replace

import pytest

from planner.catalog.hardware import ClusterSpec, get_gpu
from planner.catalog.lengths import ResponseLengths
from planner.catalog.models import resolve_model
from planner.catalog.workload import GrpoWorkload
from planner.cost.request import PlanRequest
from planner.policy import MemoryPolicy

warnings.filterwarnings("ignore", message=".*Transformer Engine and Apex are not installed.*")


@pytest.fixture
def h100():
    return get_gpu("H100-80GB")


def cluster(num_gpus: int, gpu: str = "H100-80GB", per_node: int = 8) -> ClusterSpec:
    return ClusterSpec(get_gpu(gpu), num_gpus, min(per_node, num_gpus))


@pytest.fixture
def workload():
    return GrpoWorkload()


# a small GRPO batch (fast plans), and the same with a mean response length that moves over
# the run (timed at three points): the scoring tests' jobs
SMALL_GRPO = GrpoWorkload(train_batch_size=64, rollout_n=4, mini_batch_size=16)
MOVING_GRPO = replace(SMALL_GRPO, lengths=ResponseLengths(400.0, 900.0,
                                                          SMALL_GRPO.response_length))

# the timing memo tests' jobs (tests/cost/test_layout_terms.py, test_shared_rows.py): dense, MoE,
# MLA with MTP (on 64 GPUs), Gated DeltaNet
TIMED_MODELS = ["qwen3-8b", "qwen3-30b", "deepseek-v3", "Qwen3-Next-80B-A3B"]


def timed_rows(name: str) -> tuple[PlanRequest, dict]:
    """:data:`SMALL_GRPO` of model ``name`` on H100s (16, DeepSeek-V3 64): every layout with
    its chosen rollout and memory columns, and the request with a mean response length that
    moves 300 -> 900 tokens over the run (timed at three points)."""
    from planner.cost.memory import estimate_memory
    from planner.plan import choose_rollout, evaluate_actors

    plan = PlanRequest(resolve_model(name), cluster(64 if name == "deepseek-v3" else 16),
                       SMALL_GRPO)
    actors = evaluate_actors(plan)
    cols, actor = choose_rollout(plan, actors.space.columns, actors.space.rollouts, None,
                                 actors.memory)
    memory = estimate_memory(plan, cols, pick_utilization=True, actor=actor)
    moving = replace(plan, workload=replace(
        plan.workload, lengths=ResponseLengths(300.0, 900.0, plan.workload.response_length)))
    return moving, {**cols, **memory}


# Tests that need an optional extra are marked ``@pytest.mark.needs("verl")`` (or a module's
# ``pytestmark``); without the extra's packages they are skipped with the reason, and the full
# CI job, which installs everything, runs them.
EXTRAS = {
    "verl": ("verl", "hydra", "omegaconf", "megatron.core", "transformers", "torch"),
    "tune": ("optuna", "psutil", "scipy", "rich"),
    "ray": ("ray",),
    "notebooks": ("nbclient", "nbformat", "ipykernel"),
    "docs": ("mkdocs", "material"),
}


def pytest_configure(config):
    config.addinivalue_line("markers", "needs(*extras): skip unless the plan-parallel extras "
                                       "(verl, tune, ray, notebooks, docs) are installed")


def pytest_runtest_setup(item):
    from planner.extras import available

    for mark in item.iter_markers("needs"):
        for extra in mark.args:
            missing = [name for name in EXTRAS[extra] if not available(name)]
            if missing:
                pytest.skip(f"needs the {extra} extra ({', '.join(missing)} not installed): "
                            f"pip install 'plan-parallel[{extra}]'")


def h100_request(model: str, gpus: int, workload, policy: MemoryPolicy | None = None
                 ) -> PlanRequest:
    """A scoring test's job: ``model`` on ``gpus`` H100s, 8 per node, under ``policy`` (None:
    the default memory band)."""
    return PlanRequest(resolve_model(model), ClusterSpec(get_gpu("h100"), gpus, 8), workload,
                       policy=policy or MemoryPolicy())
