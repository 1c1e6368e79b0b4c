"""Tuning regret: how close ``plan-parallel tune`` gets to the truly fastest layout, and at what
cost in GPU-hours, measured against a hidden truth.

    python benchmarks/tuning_regret.py [--draws 3] [--budgets 4,8,12,20] [--json]
                                       [--jobs NAME,...] [--strategies NAME,...]
                                       [--study-trials N] [--diagnose] [--bound]
                                       [--truth phases|scalar] [--first-draw N]
                                       [--ranking-uncertainty U]

No process is started: every job is planned through the planner's public functions
(:func:`planner.plan.make_plan`, :meth:`trials.candidates.CandidateSet.from_plan`), each
candidate gets a hidden true throughput, and the real :class:`trials.study.Tuner` -- the same
:class:`~trials.sampler.LayoutSampler`, memory margins, OOM relief, pruner, first trials and
confidence stop as ``tune`` -- runs its study with :class:`SimulatedLauncher`, a launcher that
answers from the hidden table: it writes verl's metric records (and PyTorch's OOM message) to
the trial's files, as the trainer would, and advances a simulated clock by the time the steps
it ran would take.  The trial runner, the metric parsing, the failure classification and
Optuna's storage are the product's.

Noise model (docs/tuning/regret.md):

* **throughput**: true tokens/s/GPU = predicted x exp(e), with
  e = sigma * (sqrt(w_tp) z_TP + sqrt(w_ep) z_EP + sqrt(w_pp) z_PP + sqrt(w_layout) z_layout),
  one standard normal z per distinct TP, EP and PP value of the job (layouts sharing a value
  share its term: the same communication, pipeline and expert-dispatch terms err alike) and one
  per layout (micro-batch, recompute, rollout, ...).  The shares ``FAMILY_SHARES`` split the
  variance; sigma is solved per job so that the median over pairs of the job's candidates of
  |e_a - e_b| -- the error of the predicted throughput ratio of two layouts -- equals the
  model's measured ranking uncertainty (``ranking_uncertainty`` of planner/cost/calibration.json,
  ln(1.162) = 0.150).  A job-wide factor is left out: regret, pruning and the confidence rule
  use ratios and measured values only, so it would change nothing but the absolute GPU-hours.
* **throughput per phase** (``--truth phases``, the default; ``scalar`` is the model above):
  each phase group's true time (generation; old + ref log-prob; the update; the weight sync)
  is its predicted time x exp(e_g), e_g a sum of standard normal terms shared by the layouts
  with the same value of each field the phase reads (:data:`PHASE_FIELDS`) plus the layout's
  own, with sd c x s_g: s_g the measured per-phase MAPE of ``benchmarks/accuracy.py --rl`` as a
  log sd (:func:`trials.guided.mape_log_sd`), c solved per job so that the step's error meets
  the same ranking uncertainty (:func:`phase_calibration`).  The step is the phases' sum; the
  launcher writes verl's ``timing_s/*`` timers of each phase.
* **memory**: a layout predicted to fit runs out of memory when its predicted peak x exp(m)
  exceeds the GPU, m = s (sqrt(1/2) z_job + sqrt(1/2) z_layout); s is the maximum-likelihood
  fit to ``benchmarks/memory_anchors.py`` (the fit/OOM outcomes of verl's example jobs and of
  verl's Qwen2.5-7B sweep, and DeepSeek-V3's measured peak): P(OOM) = Phi(ln(peak/capacity)/s),
  so the nearer a layout's predicted peak is to capacity the likelier its OOM.  It fails in its
  predicted peak phase during the first step, with PyTorch's message (the measured need).
* **steps**: each step's throughput is the layout's true one x exp(N(0, ``--step-noise``)),
  the warm-up step runs at half speed, and a trial costs ``--launch-s`` (Ray, model load, vLLM
  start) plus its steps' time on all the job's GPUs (``--steps`` 5 with ``--warmup-steps`` 1, as
  ``tune`` runs by default).  A pruned trial costs the steps it ran.

Every study of a (job, draw) pair sees the same hidden table and the same step noise per layout
and the same sampler seed, so strategies are compared on equal terms.  Regret of a budget of
``b`` trials: 1 - true(layout the study writes back after b trials) / max true over the study's
candidates (100% when none of the b trials succeeded).  At equal GPU-hours (the second table):
each study may spend what ``default (before)``'s study of the same job and draw spent on ``b``
trials, whole trials only, pruned ones at what they cost (``--study-trials`` lets studies of
cheap trials run long enough to spend it).  ``--diagnose``: why each study missed the best
layout (:func:`diagnose`) and how each hidden table's error splits between TP/EP/PP families
and their members (:func:`noise_parts`); ``--bound``: ``tune``'s default strategy on the true
best family's layouts alone (:func:`best_family_job`), what knowing the family would reach.
``--ranking-uncertainty U`` (a fraction; default the shipped calibration's 0.1621): the
simulator and ``tune`` as if the cost model's measured ranking uncertainty were ``U`` -- the
hidden tables' sigma is solved to ln(1 + U), the plan ties layouts within ``U`` (its candidate
set's order; :meth:`planner.cost.efficiency.CostModel` with that ``uncertainty``, as ``tune
--calibration`` with a file stating it would plan), and the study's ``TuneSettings.model_error``
is ``U`` (the guided sampler's prior, the first trials' ties, the confidence rule), as ``tune``
takes it from that cost model.  ``--first-draw N``: the hidden tables N .. N + draws - 1 (fresh
tables no earlier run saw).
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import hashlib
import json
import math
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Mapping, Sequence

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from planner.catalog.hardware import ClusterSpec, get_gpu  # noqa: E402
from planner.catalog.models import resolve_model  # noqa: E402
from planner.catalog.workload import GrpoWorkload  # noqa: E402
from planner.cost.efficiency import shipped_cost_model  # noqa: E402
from planner.cost.request import PlanRequest  # noqa: E402
from planner.plan import make_plan  # noqa: E402
from planner.units import GIB  # noqa: E402
from trials.launchers.launcher import Launcher, LaunchOutcome  # noqa: E402

# The error terms: the fields whose value a term is shared by, and its share of the variance of
# e.  TP, EP and PP carry most of it; the other knobs a little each; one small term per layout.
FAMILIES = {"tp": ("tp",), "ep": ("ep", "etp"), "pp": ("pp",), "vpp": ("vpp",), "cp": ("cp",),
            "micro_batch": ("micro_batch",), "recompute": ("recompute",),
            "offload": ("param_offload", "optimizer_offload", "ref_param_offload"),
            "rollout": ("rollout_tp", "rollout_dp", "rollout_ep", "gpu_memory_utilization")}
FAMILY_SHARES = {"tp": 0.25, "ep": 0.20, "pp": 0.25, "vpp": 0.03, "cp": 0.03,
                 "micro_batch": 0.06, "recompute": 0.06, "offload": 0.04, "rollout": 0.06,
                 "layout": 0.02}
# Per phase (--truth phases): the fields each phase group's error terms are shared by
# (generation: the rollout layout and its KV pool; log-prob and update: the training layout, the
# update its offload too; the sync: both), their shares the ones above restricted to those
# fields plus the layout's own, renormalised (phase_truth_shares).
PHASE_FIELDS = {"generate": ("rollout",),
                "log_prob": ("tp", "ep", "pp", "vpp", "cp", "micro_batch", "recompute"),
                "update": ("tp", "ep", "pp", "vpp", "cp", "micro_batch", "recompute", "offload"),
                "sync": ("tp", "ep", "pp", "rollout")}
TRUTHS = ("phases", "scalar")
CALIBRATION_DRAWS = 24  # reference draws the per-phase scale is solved over
MEMORY_JOB_SHARE = 0.5  # of the memory error's variance, shared by the job's layouts
STEPS, WARMUP_STEPS = 5, 1  # tune's defaults
LAUNCH_S = 180.0  # assumed: Ray start, model and reference load, vLLM engine start
STEP_NOISE = 0.03  # assumed: step-to-step spread of a step's tokens/s/GPU (log sd)
BUDGETS = (4, 8, 12, 16, 20)
SIM_KEY_ENV = "PLAN_PARALLEL_SIMULATED_LAYOUT"  # the request names its layout ...
SIM_STEPS_ENV = "PLAN_PARALLEL_SIMULATED_STEPS"  # ... and its steps (the trainer's horizon)


# --- jobs --------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Job:
    name: str
    model: str
    gpus: int
    gpu: str = "h100"
    workload: Mapping[str, int] = field(default_factory=dict)
    kind: str = "dense"  # dense, moe or mla (MLA models are MoE too)

    def setting(self):
        return (resolve_model(self.model), ClusterSpec(get_gpu(self.gpu), self.gpus,
                                                       min(8, self.gpus)),
                GrpoWorkload(**self.workload))


LONG = {"train_batch_size": 512, "rollout_n": 8, "response_length": 4096,
        "mini_batch_size": 128}
JOBS = (
    Job("qwen2.5-7b-8", "qwen2.5-7b", 8),
    Job("qwen3-8b-8", "qwen3-8b", 8),
    Job("qwen3-8b-16-long", "qwen3-8b", 16, workload=LONG),
    Job("llama3.1-8b-16", "llama3.1-8b", 16),
    Job("qwen3-14b-16", "qwen3-14b", 16),
    Job("qwen2.5-32b-32", "qwen2.5-32b", 32),
    Job("qwen3-32b-32-h200-long", "qwen3-32b", 32, "h200", LONG),
    Job("llama3.1-70b-32", "llama3.1-70b", 32),
    Job("llama3.1-70b-64-long", "llama3.1-70b", 64, workload=LONG),
    Job("qwen2.5-72b-64-h200", "qwen2.5-72b", 64, "h200"),
    Job("qwen3-30b-8", "qwen3-30b", 8, kind="moe"),
    Job("qwen3-30b-16", "qwen3-30b", 16, kind="moe"),
    Job("qwen3-30b-32-h200-long", "qwen3-30b", 32, "h200", LONG, kind="moe"),
    Job("mixtral-8x7b-16", "mixtral-8x7b", 16, kind="moe"),
    Job("mixtral-8x22b-64", "mixtral-8x22b", 64, kind="moe"),
    Job("qwen3-235b-64", "qwen3-235b", 64, kind="moe"),
    Job("qwen3-235b-128-h200", "qwen3-235b", 128, "h200", kind="moe"),
    Job("moonlight-8", "moonlight", 8, kind="mla"),
    Job("moonlight-16-long", "moonlight", 16, workload=LONG, kind="mla"),
    Job("deepseek-v3-128-h200", "deepseek-v3", 128, "h200", kind="mla"),
    Job("deepseek-v3-256", "deepseek-v3", 256, kind="mla"),
)
SMALL_JOBS = ("qwen2.5-7b-8", "qwen3-30b-8", "moonlight-8")  # the tests' three


@dataclass
class PreparedJob:
    job: Job
    plan: object
    candidates: object  # trials.candidates.CandidateSet
    plan_s: float
    sigmas: dict = field(default_factory=dict)  # target -> solved sigma (hidden_truth)
    # the cost model's ranking uncertainty (fraction) the job was planned with, the hidden
    # tables match and the study's sampler assumes (TuneSettings.model_error)
    uncertainty: float = field(default_factory=lambda: float(shipped_cost_model().uncertainty))


def cost_model(uncertainty: float | None = None):
    """The shipped cost model, or the same stating ranking uncertainty ``uncertainty`` (what
    ``tune --calibration`` reads from a calibration file with that ``ranking_uncertainty``)."""
    shipped = shipped_cost_model()
    if uncertainty is None:
        return shipped
    return dataclasses.replace(shipped, uncertainty=float(uncertainty),
                               uncertainty_source="--ranking-uncertainty")


def prepare(job: Job, max_candidates: int = 5000,
            uncertainty: float | None = None) -> PreparedJob:
    """Plan ``job`` as ``tune`` does (the study's candidate set), with the cost model's
    ranking uncertainty ``uncertainty`` (None: the shipped calibration's)."""
    from trials.candidates import CandidateSet

    start = time.perf_counter()
    model, cluster, workload = job.setting()
    cost = cost_model(uncertainty)
    plan = make_plan(PlanRequest(model, cluster, workload, cost=cost))
    candidates = CandidateSet.from_plan(plan, 0.0, max_candidates)
    return PreparedJob(job, plan, candidates, time.perf_counter() - start,
                       uncertainty=float(cost.uncertainty))


# --- the hidden truth --------------------------------------------------------------------------

def _normal_cdf(x: float) -> float:
    return 0.5 * (1.0 + math.erf(x / math.sqrt(2.0)))


def memory_error_sd() -> float:
    """Maximum-likelihood log-sd of the peak-memory error from benchmarks/memory_anchors.py:
    each anchor's fit/OOM outcome has probability Phi(+-ln(predicted peak / capacity) / s), a
    measured peak adds the normal density of ln(predicted / measured)."""
    from benchmarks.memory_anchors import anchors, evaluate

    rows = []
    for anchor in anchors():
        result = evaluate(anchor)
        capacity_gib = get_gpu(anchor.gpu).memory_bytes / GIB
        measured = result.get("measured_gib")
        rows.append((math.log(result["peak_gib"] / capacity_gib), anchor.expect_fits,
                     math.log(result["peak_gib"] / measured) if measured else None))

    def log_likelihood(s: float) -> float:
        total = 0.0
        for ratio, fits, error in rows:
            oom = _normal_cdf(ratio / s)
            total += math.log(max(1 - oom if fits else oom, 1e-300))
            if error is not None:
                total += -0.5 * (error / s) ** 2 - math.log(s * math.sqrt(2 * math.pi))
        return total

    grid = np.arange(0.01, 0.5, 0.0025)
    return float(grid[int(np.argmax([log_likelihood(s) for s in grid]))])


@dataclass(frozen=True)
class Truth:
    """The hidden table of one (job, draw): per candidate index."""

    tokens_per_s_per_gpu: np.ndarray  # true throughput
    step_time_s: np.ndarray  # true step time
    oom_need: np.ndarray  # true peak / GPU memory of the predicted peak phase (>1: OOM)
    sigma: float
    seed: int
    # per candidate and planner phase (planner.phases.PHASES order), under --truth phases
    phase_time_s: np.ndarray | None = None

    @property
    def best(self) -> float:
        return float(self.tokens_per_s_per_gpu.max())

    def step_noise(self, key: str, steps: int, sd: float) -> np.ndarray:
        """This layout's step-to-step noise (the same in every study of this draw)."""
        digest = hashlib.sha256(f"{self.seed}:{key}".encode()).digest()
        return np.exp(np.random.default_rng(int.from_bytes(digest[:8], "little"))
                      .normal(0.0, sd, steps))


def phase_truth_shares(group: str) -> dict[str, float]:
    """:data:`FAMILY_SHARES` restricted to the fields ``group`` reads and the layout's own."""
    keep = {name: FAMILY_SHARES[name] for name in (*PHASE_FIELDS[group], "layout")}
    return {name: value / sum(keep.values()) for name, value in keep.items()}


def phase_unit_errors(codes: Mapping[str, np.ndarray], rng: np.random.Generator
                      ) -> dict[str, np.ndarray]:
    """Per phase group, each candidate's error in units of the group's sd: one standard normal
    term per distinct value of each field the group reads, shared by the layouts with that
    value, and one of the layout's own (the groups' terms independent of each other)."""
    n = len(next(iter(codes.values())))
    out = {}
    for group in PHASE_FIELDS:
        shares = phase_truth_shares(group)
        e = math.sqrt(shares["layout"]) * rng.normal(size=n)
        for name in PHASE_FIELDS[group]:
            e += math.sqrt(shares[name]) * rng.normal(size=int(codes[name].max()) + 1)[
                codes[name]]
        out[group] = e
    return out


def step_log_error(times: Mapping[str, np.ndarray], errors: Mapping[str, np.ndarray],
                   sds: Mapping[str, float], scale: float) -> np.ndarray:
    """ln(true step / predicted step) when each phase group's time is its prediction x
    exp(scale x sd_g x its unit error)."""
    total = sum(times.values())
    true = sum(times[g] * np.exp(scale * sds[g] * errors[g]) for g in times)
    return np.log(true / np.maximum(total, 1e-12))


def phase_calibration(prepared: PreparedJob, target: float) -> dict:
    """The per-phase truth's sds: relative sizes the measured per-phase MAPEs as log sds
    (:func:`trials.guided.mape_log_sd`), the common ``scale`` solved so that over
    :data:`CALIBRATION_DRAWS` reference draws the median over pairs differing in TP/EP/PP of
    |e_a - e_b| of the step's log error is ``target`` on average (the scalar model's
    constraint, solved on the exact sum of lognormals rather than analytically)."""
    from trials.guided import PHASE_MAPE, family_codes, mape_log_sd, parallel_pairs, phase_fractions

    candidates = prepared.candidates.candidates
    codes = family_codes([c.params for c in candidates], FAMILIES)
    times = phase_fractions([c.predicted for c in candidates])
    sds = {g: mape_log_sd(PHASE_MAPE[g]) for g in PHASE_FIELDS}
    a, b = parallel_pairs(codes, np.random.default_rng(0))
    draws = [phase_unit_errors(codes, np.random.default_rng(10_000 + r))
             for r in range(CALIBRATION_DRAWS)]

    def median_pair(scale: float) -> float:  # the mean over the draws of each one's median
        return float(np.mean([np.median(np.abs(e[a] - e[b])) for e in (
            step_log_error(times, d, sds, scale) for d in draws)]))

    low, high = 1e-3, 10.0
    for _ in range(50):
        middle = math.sqrt(low * high)
        low, high = (middle, high) if median_pair(middle) < target else (low, middle)
    scale = math.sqrt(low * high)
    return {"scale": scale, "sds": {g: scale * sd for g, sd in sds.items()}}


def hidden_truth(prepared: PreparedJob, seed: int, memory_sd: float,
                 target: float | None = None, truth: str = "scalar") -> Truth:
    """The hidden table of ``prepared`` for ``seed``: ``truth`` "scalar" (one log error per
    layout, the first rounds' model) or "phases" (one per phase group; the step their sum)."""
    from planner.phases import PHASES
    from trials.guided import PHASE_GROUPS, family_codes, pair_weights, phase_fractions, solve_sigma

    candidates = prepared.candidates.candidates
    codes = family_codes([c.params for c in candidates], FAMILIES)
    target = target if target is not None else math.log1p(prepared.uncertainty)
    if target not in prepared.sigmas:
        prepared.sigmas[target] = solve_sigma(
            pair_weights(codes, FAMILY_SHARES, np.random.default_rng(0)), target)
    sigma = prepared.sigmas[target]
    rng = np.random.default_rng(seed)
    e = np.zeros(len(candidates))
    for name in FAMILIES:
        terms = rng.normal(size=int(codes[name].max()) + 1)
        e += math.sqrt(FAMILY_SHARES[name]) * terms[codes[name]]
    e += math.sqrt(FAMILY_SHARES["layout"]) * rng.normal(size=len(candidates))
    predicted = np.array([c.predicted["tokens_per_s_per_gpu"] for c in candidates])
    step = np.array([c.predicted["step_time_s"] for c in candidates])
    true = predicted * np.exp(sigma * e)
    m = memory_sd * (math.sqrt(MEMORY_JOB_SHARE) * rng.normal()
                     + math.sqrt(1 - MEMORY_JOB_SHARE) * rng.normal(size=len(candidates)))
    capacity = float(prepared.plan.cluster.gpu.memory_bytes)
    peak = np.array([c.predicted["peak_gib"] * GIB for c in candidates])
    oom_need = peak * np.exp(m) / capacity
    if truth == "scalar":
        return Truth(tokens_per_s_per_gpu=true, step_time_s=step * predicted / true,
                     oom_need=oom_need, sigma=sigma, seed=seed)
    # per phase: the same memory draw, the phases' terms from a stream of their own
    key = ("phases", target)
    if key not in prepared.sigmas:
        prepared.sigmas[key] = phase_calibration(prepared, target)
    calibration = prepared.sigmas[key]
    errors = phase_unit_errors(codes, np.random.default_rng([seed, 1]))
    groups = phase_fractions([c.predicted for c in candidates])
    phase_time = np.zeros((len(candidates), len(PHASES)))
    for g, members in PHASE_GROUPS.items():
        factor = np.exp(calibration["sds"][g] * errors[g])
        for phase in members:
            phase_time[:, PHASES.index(phase)] = np.array(
                [float((c.predicted.get("time_s") or {}).get(phase, 0.0)) for c in candidates]
            ) * factor
    rest = np.maximum(step - sum(groups.values()), 0.0)  # none in a colocated step
    step_true = phase_time.sum(axis=1) + rest
    return Truth(tokens_per_s_per_gpu=predicted * step / step_true, step_time_s=step_true,
                 oom_need=oom_need, sigma=calibration["scale"], seed=seed,
                 phase_time_s=phase_time)


# --- the simulated launcher --------------------------------------------------------------------

PHASE_FRAME = {  # a traceback line that names the phase (trials.failures.PHASE_MARKERS)
    "generate": "  File \"vllm/v1/worker/gpu_model_runner.py\", line 1, in generate_sequences",
    "old_log_prob": "  File \"verl/workers/engine_workers.py\", line 705, in compute_log_prob",
    "ref": "  File \"verl/workers/engine_workers.py\", line 698, in compute_ref_log_prob",
    "update_actor": "  File \"verl/workers/engine_workers.py\", line 300, in train_mini_batch",
    "weight_sync": "  File \"verl/workers/engine_workers.py\", line 790, in update_weights",
}


@dataclass
class Launch:
    key: str
    index: int
    outcome: str  # ok, oom or the launcher's stop reason (pruned)
    steps: int
    duration_s: float


class SimulatedLauncher(Launcher):
    """A :class:`trials.launchers.launcher.Launcher` answering from a :class:`Truth`: it writes the
    step records verl's file logger and console would (or PyTorch's OOM message), calls the
    ``monitor`` after each step as a real launcher does when the files grow, and advances
    :attr:`clock_s` by the simulated time instead of sleeping."""

    name = "simulated"
    shares_filesystem = True

    def __init__(self, prepared: PreparedJob, truth: Truth, *, launch_s: float = LAUNCH_S,
                 step_noise: float = STEP_NOISE):
        self.prepared = prepared
        self.truth = truth
        self.launch_s = launch_s
        self.step_noise = step_noise
        self.n_gpus = prepared.plan.cluster.num_gpus
        self.capacity_gib = prepared.plan.cluster.gpu.memory_bytes / GIB
        self.clock_s = 0.0
        self.launches: list[Launch] = []

    def describe(self) -> str:
        return "simulated (no processes)"

    def phase_timers(self, index: int, factor: float) -> dict:
        """verl's per-phase timers of a step ``factor`` times the layout's true step (each
        phase scaled alike), under the per-phase truth; none under the scalar one."""
        from planner.phases import PHASES
        from trials.guided import VERL_TIMERS

        if self.truth.phase_time_s is None:
            return {}
        row = self.truth.phase_time_s[index]
        return {f"timing_s/{timer}": float(row[PHASES.index(phase)] * factor)
                for timer, phase in VERL_TIMERS.items()}

    def abandon(self, handle) -> str:
        return "a simulated trial leaves nothing running"

    def run(self, request, on_start: Callable | None = None,
            monitor: Callable[[], str | None] | None = None):
        key = request.env[SIM_KEY_ENV]
        index = self.prepared.candidates.index[key]
        candidate = self.prepared.candidates[index]
        handle = {"launcher": self.name, "key": key}
        if on_start:
            on_start(handle)
        duration = self.launch_s
        need = float(self.truth.oom_need[index])
        steps, outcome, code, stopped = 0, "ok", 0, None
        with open(request.log_path, "a") as log, open(request.metrics_path, "a") as metrics:
            if need > 1.0:
                phase = str(candidate.predicted["peak_phase"])
                duration += 0.5 * float(self.truth.step_time_s[index])
                total = self.capacity_gib
                requested = max(2.0, need * total - total + 0.5)
                free = total - need * total + requested
                log.write("Traceback (most recent call last):\n"
                          f"{PHASE_FRAME.get(phase, PHASE_FRAME['update_actor'])}\n"
                          f"torch.OutOfMemoryError: CUDA out of memory. Tried to allocate "
                          f"{requested:.2f} GiB. GPU 0 has a total capacity of {total:.2f} GiB "
                          f"of which {free:.2f} GiB is free.\n")
                outcome, code = "oom", 1
            else:
                steps_asked = int(request.env.get(SIM_STEPS_ENV, STEPS))
                noise = self.truth.step_noise(key, steps_asked, self.step_noise)
                true_tps = float(self.truth.tokens_per_s_per_gpu[index])
                step_s = float(self.truth.step_time_s[index])
                tokens = true_tps * step_s * self.n_gpus
                for step in range(1, steps_asked + 1):
                    warm = 0.5 if step <= WARMUP_STEPS else 1.0
                    tps = true_tps * warm * noise[step - 1]
                    seconds = tokens / (tps * self.n_gpus)
                    duration += seconds
                    data = {"training/global_step": step, "timing_s/step": seconds,
                            "perf/total_num_tokens": tokens, "perf/throughput": tps,
                            **self.phase_timers(index, seconds / step_s)}
                    metrics.write(json.dumps({"step": step, "data": data}) + "\n")
                    metrics.flush()
                    steps = step
                    stopped = monitor() if monitor is not None else None
                    if stopped:
                        outcome, code = stopped, -15
                        break
                log.write("Training finished.\n" if not stopped else "Terminated\n")
        self.clock_s += duration
        self.launches.append(Launch(key, index, outcome, steps, duration))
        return LaunchOutcome(exit_code=code, stopped=stopped, duration_s=duration,
                             handle=handle)


def simulated_jobs(prepared: PreparedJob, study_name: str, steps: int = STEPS):
    """The study's :class:`trials.trial_job.TrialJobs`, whose requests name the layout for
    :class:`SimulatedLauncher` instead of exporting a verl command."""
    from trials.launchers.launcher import LaunchRequest
    from trials.trial_job import LOG_FILE, METRICS_FILE, TrialJobs

    class SimulatedJobs(TrialJobs):
        def request(self, sweep_dir, number, candidate, shares_filesystem, inherited_env):
            workdir = self.workdir(sweep_dir, number, candidate)
            return LaunchRequest(argv=("simulated-verl", candidate.key), workdir=workdir,
                                 log_path=workdir / LOG_FILE,
                                 metrics_path=workdir / METRICS_FILE,
                                 wall_timeout_s=self.wall_timeout_s,
                                 hang_timeout_s=self.hang_timeout_s,
                                 env={SIM_KEY_ENV: candidate.key,
                                      SIM_STEPS_ENV: str(self.steps)},
                                 name=f"{study_name}-{number:04d}")

    plan = prepared.plan
    return SimulatedJobs(model=plan.model, cluster=plan.cluster, workload=plan.workload,
                         trainer_command=("simulated-verl",), model_path="-", train_files="-",
                         val_files="-", steps=steps, wall_timeout_s=1e9, hang_timeout_s=1e9,
                         study_name=study_name)


# --- strategies and studies --------------------------------------------------------------------

@dataclass(frozen=True)
class Strategy:
    name: str
    first_trials: str = "simplest"
    pruner: str = "none"
    stop_when_confident: bool = False
    top_k: int = 5
    sampler: str = "tpe"
    ucb_width: float = 1.0
    phase_model: str = "off"
    exploit_last: int = 0
    acquisition: str = "ucb"
    acquisition_trials: int = 0
    note: str = ""


STRATEGIES = (
    Strategy("default (before)", note="top-5 simplest ties, then TPE; every trial runs 5 steps"),
    Strategy("spread", first_trials="spread"),
    Strategy("spread+sh", first_trials="spread", pruner="successive-halving"),
    Strategy("guided-top5", first_trials="spread", sampler="guided"),
    Strategy("guided", first_trials="spread", sampler="guided", top_k=3),
    Strategy("guided+sh", first_trials="spread", sampler="guided", top_k=3,
             pruner="successive-halving"),
    Strategy("guided+hyperband", first_trials="spread", sampler="guided", top_k=3,
             pruner="hyperband"),
    Strategy("guided+sh+stop", first_trials="spread", sampler="guided", top_k=3,
             pruner="successive-halving", stop_when_confident=True),
    Strategy("guided-w2+hyperband", first_trials="spread", sampler="guided", top_k=3,
             ucb_width=2.0, pruner="hyperband"),
    Strategy("guided+probe", first_trials="spread", sampler="guided", top_k=3,
             pruner="probe"),
    Strategy("guided-w2+probe", first_trials="spread", sampler="guided", top_k=3,
             ucb_width=2.0, pruner="probe"),
    Strategy("guided-w2+probe+ucb1", first_trials="ucb", sampler="guided", top_k=1,
             ucb_width=2.0, pruner="probe"),
    Strategy("guided+probe+ucb1", first_trials="ucb", sampler="guided", top_k=1,
             pruner="probe"),
    Strategy("guided-w3+probe+ucb1", first_trials="ucb", sampler="guided", top_k=1,
             ucb_width=3.0, pruner="probe"),
    Strategy("guided-w2+probe+ucb1+phases", first_trials="ucb", sampler="guided", top_k=1,
             ucb_width=2.0, pruner="probe", phase_model="on"),
    Strategy("guided-w3+probe+ucb1+phases", first_trials="ucb", sampler="guided", top_k=1,
             ucb_width=3.0, pruner="probe", phase_model="on"),
    *(Strategy(f"guided-w{width:g}+probe+ucb1+phases", first_trials="ucb", sampler="guided",
               top_k=1, ucb_width=width, pruner="probe", phase_model="on") for width in (1.0, 1.5)),
    Strategy("guided-w2+probe+ucb1+phases+exploit1", first_trials="ucb", sampler="guided",
             top_k=1, ucb_width=2.0, pruner="probe", phase_model="on", exploit_last=1),
    Strategy("guided-w2+probe+ucb1+phases+exploit2", first_trials="ucb", sampler="guided",
             top_k=1, ucb_width=2.0, pruner="probe", phase_model="on", exploit_last=2),
    Strategy("guided-w2+probe+ucb1+phases+design4", first_trials="ucb", sampler="guided",
             top_k=1, ucb_width=2.0, pruner="probe", phase_model="on", acquisition="design",
             acquisition_trials=4),
    Strategy("guided-w2+probe+ucb1+phases+info", first_trials="ucb", sampler="guided",
             top_k=1, ucb_width=2.0, pruner="probe", phase_model="on", acquisition="info"),
    Strategy("guided-w2+probe+ucb1+phases+info6", first_trials="ucb", sampler="guided",
             top_k=1, ucb_width=2.0, pruner="probe", phase_model="on", acquisition="info",
             acquisition_trials=6),
    Strategy("guided-w2+probe+ucb1+phases+design3", first_trials="ucb", sampler="guided",
             top_k=1, ucb_width=2.0, pruner="probe", phase_model="on", acquisition="design",
             acquisition_trials=3),
    Strategy("guided-w2+probe+ucb1+phases+design6", first_trials="ucb", sampler="guided",
             top_k=1, ucb_width=2.0, pruner="probe", phase_model="on", acquisition="design",
             acquisition_trials=6),
    Strategy("guided-w2+probe+ucb1+phases+knobs", first_trials="ucb", sampler="guided",
             top_k=1, ucb_width=2.0, pruner="probe", phase_model="on", acquisition="knobs"),
    *(Strategy(f"guided-w{width:g}+probe+ucb1+phases+additive", first_trials="ucb",
               sampler="guided", top_k=1, ucb_width=width, pruner="probe", phase_model="on",
               acquisition="additive") for width in (0.25, 0.5, 1.0, 2.0)),
)


def default_strategy() -> Strategy:
    """The strategy ``tune`` runs by default (:data:`trials.defaults.TUNE_DEFAULTS`)."""
    from trials.defaults import TUNE_DEFAULTS

    fields = ("sampler", "pruner", "first_trials", "top_k", "stop_when_confident", "ucb_width",
              "phase_model", "exploit_last", "acquisition")
    return next(s for s in STRATEGIES
                if all(getattr(s, name) == TUNE_DEFAULTS[name] for name in fields))


class _Quiet:
    """A :class:`trials.progress.Progress` that shows nothing."""

    def started(self, status, number, key):
        pass

    def finished(self, status, row):
        pass

    def note(self, text):
        pass

    def close(self):
        pass


@dataclass
class StudyRun:
    job: str
    draw: int
    strategy: str
    trials: list[dict]  # in order: key, category, value (measured), true, duration_s
    stop_reason: str
    best_true: float
    n_gpus: int
    cases: dict = field(default_factory=dict)  # budget -> diagnose()'s case (run_all)


@contextlib.contextmanager
def quiet_outputs():
    """Skip the study's trials.csv (a file for people, rewritten after every trial; it decides
    nothing): most of a simulated trial's time otherwise."""
    from trials import study

    saved = study.write_trials_csv
    study.write_trials_csv = lambda study_, directories: []
    try:
        yield
    finally:
        study.write_trials_csv = saved


def run_study(prepared: PreparedJob, truth: Truth, strategy: Strategy, trials: int, seed: int,
              workdir: Path, *, launch_s: float = LAUNCH_S, step_noise: float = STEP_NOISE,
              steps: int = STEPS, write_dir: Path | None = None) -> StudyRun:
    """One ``tune`` study of ``prepared`` against ``truth`` with the real Tuner (``write_dir``:
    where it writes the best layout back as a verl job, as ``tune --write`` does)."""
    from trials import study_state as attrs
    from trials.storage import resolve_storage
    from trials.study import Tuner, TuneSettings, study_info

    name = f"{prepared.job.name}-{truth.seed}-{strategy.name}".replace(" ", "_")
    name = "".join(ch if ch.isalnum() or ch in "-_." else "-" for ch in name)
    sweep = workdir / name
    launcher = SimulatedLauncher(prepared, truth, launch_s=launch_s, step_noise=step_noise)
    settings = TuneSettings(trials=trials, warmup_steps=WARMUP_STEPS, top_k=strategy.top_k,
                            seed=seed, first_trials=strategy.first_trials,
                            pruner=strategy.pruner,
                            stop_when_confident=strategy.stop_when_confident, fail_fast=0,
                            sampler=strategy.sampler, ucb_width=strategy.ucb_width,
                            phase_model=strategy.phase_model,
                            exploit_last=strategy.exploit_last,
                            acquisition=strategy.acquisition,
                            acquisition_trials=strategy.acquisition_trials,
                            model_error=prepared.uncertainty, heartbeat_interval=3600,
                            grace_period=7200)
    storage = resolve_storage(f"journal:{sweep / 'study.journal'}", sweep)
    tuner = Tuner(plan=prepared.plan, candidates=prepared.candidates,
                  jobs=simulated_jobs(prepared, name, steps), launcher=launcher,
                  storage=storage, study_name=name, sweep_dir=sweep, write_dir=write_dir,
                  settings=settings, progress=_Quiet(),
                  study_info=study_info(prepared.job.model, prepared.plan, settings, launcher,
                                        steps))
    with quiet_outputs():
        result = tuner.run()
    study = tuner.open_study()
    snap = attrs.read_snapshot(study)
    rows = []
    for trial in snap.finished:
        key = trial.user_attrs[attrs.KEY]
        index = prepared.candidates.index[key]
        rows.append({"key": key, "category": trial.user_attrs[attrs.CATEGORY],
                     "value": attrs.measured_value(trial),
                     "true": float(truth.tokens_per_s_per_gpu[index]),
                     "duration_s": float(trial.user_attrs.get(attrs.DURATION) or 0.0)})
    return StudyRun(prepared.job.name, truth.seed, strategy.name, rows, result.stop_reason,
                    truth.best, prepared.plan.cluster.num_gpus)


# --- diagnosis: why a study misses the best layout -------------------------------------------

CASES = ("found", "family never tried", "worse members of a best family",
         "best layout stopped by the pruner", "best layout ran, another measured higher")
NEAR = 0.03  # a layout within 3% of the best true throughput is "a best layout" (the target)


def families(prepared: PreparedJob) -> list[tuple]:
    """Each candidate's TP/EP/PP family (:func:`trials.proposals.family`)."""
    from trials.proposals import family

    return [family(c) for c in prepared.candidates.candidates]


def diagnose(prepared: PreparedJob, truth: Truth, run: StudyRun, budget: int,
             near: float = NEAR) -> str:
    """Why the study's first ``budget`` trials wrote back a layout more than ``near`` below
    the best true throughput (one of :data:`CASES`; ``found`` when it did not):

    * ``family never tried`` -- no trial ran a layout of a TP/EP/PP family that has a layout
      within ``near`` of the best;
    * ``worse members of a best family`` -- it did, but none of the layouts it ran is within
      ``near`` (the family is right, its micro-batch, recompute, offload, rollout ... are not);
    * ``best layout stopped by the pruner`` -- one it ran is within ``near``, but the pruner
      stopped it (or it failed), so it could not be written back;
    * ``best layout ran, another measured higher`` -- one within ``near`` ran all its steps,
      and a truly slower one measured faster (step noise)."""
    trials = run.trials[:budget]
    ok = [t for t in trials if t["value"] is not None]
    if ok and max(ok, key=lambda t: t["value"])["true"] >= (1 - near) * truth.best:
        return CASES[0]
    family_of = families(prepared)
    good = truth.tokens_per_s_per_gpu >= (1 - near) * truth.best
    good_families = {family_of[i] for i in np.flatnonzero(good)}
    ran = [prepared.candidates.index[t["key"]] for t in trials]
    if not {family_of[i] for i in ran} & good_families:
        return CASES[1]
    near_ran = [t for t, i in zip(trials, ran) if good[i]]
    if not near_ran:
        return CASES[2]
    if all(t["value"] is None for t in near_ran):
        return CASES[3]
    return CASES[4]


def noise_parts(prepared: PreparedJob, truth: Truth, model_error: float | None = None,
                near: float = NEAR) -> dict:
    """How the hidden table's log error splits between TP/EP/PP families and their members,
    and how many families the plan's tie set and the layouts within ``near`` of the best
    span: ``family_sd`` (sd of the families' mean log error), ``within_sd`` (sd of a layout's
    log error about its family's mean), ``families``, ``tie_families`` (families with a layout
    predicted within the model's uncertainty of the best), ``near_layouts`` and
    ``near_families`` (layouts within ``near`` of the best true throughput, and their
    families)."""
    from trials.proposals import tied

    model_error = model_error if model_error is not None else prepared.uncertainty
    candidates = prepared.candidates.candidates
    predicted = np.array([c.predicted["tokens_per_s_per_gpu"] for c in candidates])
    error = np.log(truth.tokens_per_s_per_gpu / predicted)
    family_of = families(prepared)
    members: dict[tuple, list[int]] = {}
    for i, f in enumerate(family_of):
        members.setdefault(f, []).append(i)
    means = {f: float(error[ix].mean()) for f, ix in members.items()}
    within = error - np.array([means[f] for f in family_of])
    near_layouts = np.flatnonzero(truth.tokens_per_s_per_gpu >= (1 - near) * truth.best)
    return {"family_sd": float(np.std(list(means.values()))),
            "within_sd": float(np.std(within)), "families": len(members),
            "tie_families": len({family_of[i] for i in tied(candidates, model_error)}),
            "near_layouts": int(len(near_layouts)),
            "near_families": len({family_of[i] for i in near_layouts})}


def summarise_cases(runs: Sequence[StudyRun], budgets: Sequence[int]) -> list[dict]:
    """Per strategy and budget: how many studies fall in each of :data:`CASES`."""
    rows = []
    for strategy in dict.fromkeys(r.strategy for r in runs):
        mine = [r for r in runs if r.strategy == strategy]
        for budget in budgets:
            if not all(budget in r.cases for r in mine):
                continue
            rows.append({"strategy": strategy, "budget": budget, "studies": len(mine),
                         **{case: sum(r.cases[budget] == case for r in mine)
                            for case in CASES}})
    return rows


def format_cases(rows: Sequence[dict]) -> str:
    lines = ["| strategy | trials | " + " | ".join(CASES) + " |",
             "|---|---:|" + "---:|" * len(CASES)]
    for r in rows:
        lines.append(f"| {r['strategy']} | {r['budget']} | "
                     + " | ".join(str(r[case]) for case in CASES) + " |")
    return "\n".join(lines)


BOUND = "best family known (bound)"  # the default strategy on the true best family's layouts


def best_family_job(prepared: PreparedJob, truth: Truth) -> tuple[PreparedJob, Truth]:
    """The job and hidden table cut to the layouts of the TP/EP/PP family of the truly
    fastest layout: a study of it shows what a strategy would reach if the family were known
    (an upper bound, not something ``tune`` can do; its regret is still against the best
    layout of the whole job, which is in the family)."""
    from trials.candidates import CandidateSet

    family_of = families(prepared)
    best = family_of[int(np.argmax(truth.tokens_per_s_per_gpu))]
    keep = np.array([i for i, f in enumerate(family_of) if f == best], dtype=np.int64)
    full = prepared.candidates
    subset = CandidateSet([dataclasses.replace(full[int(i)], index=j)
                           for j, i in enumerate(keep)], full.memory[keep],
                          full.capacity_bytes, full.fields)
    cut = dataclasses.replace(truth, tokens_per_s_per_gpu=truth.tokens_per_s_per_gpu[keep],
                              step_time_s=truth.step_time_s[keep],
                              oom_need=truth.oom_need[keep],
                              phase_time_s=(None if truth.phase_time_s is None
                                            else truth.phase_time_s[keep]))
    return PreparedJob(prepared.job, prepared.plan, subset, prepared.plan_s,
                       uncertainty=prepared.uncertainty), cut


def at_budget(run: StudyRun, budget: int) -> dict:
    """What the study had after ``budget`` trials (all, when it stopped earlier)."""
    trials = run.trials[:budget]
    ok = [t for t in trials if t["value"] is not None]
    best = max(ok, key=lambda t: t["value"]) if ok else None
    first = next((i + 1 for i, t in enumerate(trials) if t["value"] is not None), None)
    return {"regret": 1.0 - best["true"] / run.best_true if best else 1.0,
            "gpu_hours": sum(t["duration_s"] for t in trials) * run.n_gpus / 3600.0,
            "trials": len(trials), "first_success": first,
            "pruned": sum(t["category"] == "pruned" for t in trials),
            "oom": sum(t["category"] == "oom" for t in trials)}


def trials_within(run: StudyRun, gpu_hours: float) -> int:
    """How many of the study's first trials fit in ``gpu_hours`` together (a trial counts
    whole: one that would end past the budget is not started)."""
    spent = np.cumsum([t["duration_s"] for t in run.trials]) * run.n_gpus / 3600.0
    return int(np.searchsorted(spent, gpu_hours * (1 + 1e-9), side="right"))


def summarise_hours(runs: Sequence[StudyRun], budgets: Sequence[int],
                    reference: str = STRATEGIES[0].name) -> list[dict]:
    """One row per strategy and budget at equal GPU-hours: each study may spend what the
    ``reference`` strategy's study of the same job and draw spent on ``budget`` trials.
    ``capped``: the share of studies that ran out of trials (the study's ``--trials``) before
    the GPU-hours, so their regret is an upper bound."""
    by_study = {(r.job, r.draw, r.strategy): r for r in runs}
    rows = []
    for strategy in dict.fromkeys(r.strategy for r in runs):
        mine = [r for r in runs if r.strategy == strategy and (r.job, r.draw, reference)
                in by_study]
        for budget in budgets:
            points, capped = [], 0
            for run in mine:
                hours = at_budget(by_study[(run.job, run.draw, reference)], budget)["gpu_hours"]
                count = trials_within(run, hours)
                capped += count == len(run.trials) and not run.stop_reason.startswith(
                    "no untried")
                points.append(at_budget(run, count))
            if not points:
                continue
            regret = np.array([p["regret"] for p in points])
            rows.append({"strategy": strategy, "budget": budget, "studies": len(points),
                         "median_regret": float(np.median(regret)),
                         "p90_regret": float(np.percentile(regret, 90)),
                         "trials_run": float(np.mean([p["trials"] for p in points])),
                         "capped": capped / len(points)})
    return rows


def format_hours_table(rows: Sequence[dict], reference: str = STRATEGIES[0].name) -> str:
    lines = [f"| strategy | GPU-h of {reference}'s trials | median regret | p90 regret | "
             "trials run | out of trials |", "|---|---:|---:|---:|---:|---:|"]
    for r in rows:
        lines.append(f"| {r['strategy']} | {r['budget']} | {r['median_regret']:.1%} | "
                     f"{r['p90_regret']:.1%} | {r['trials_run']:.1f} | {r['capped']:.0%} |")
    return "\n".join(lines)


def summarise(runs: Sequence[StudyRun], budgets: Sequence[int],
              reference: str = STRATEGIES[0].name) -> list[dict]:
    """One row per strategy and budget: median and p90 regret, GPU-hours (total, and the
    median per-study ratio to ``reference`` at the same budget), trials to the first success,
    the share of studies that stopped confident before the budget."""
    by_study = {(r.job, r.draw, r.strategy): r for r in runs}
    rows = []
    for strategy in dict.fromkeys(r.strategy for r in runs):
        mine = [r for r in runs if r.strategy == strategy]
        for budget in budgets:
            points = [at_budget(r, budget) for r in mine]
            regret = np.array([p["regret"] for p in points])
            hours = np.array([p["gpu_hours"] for p in points])
            base = [at_budget(by_study[(r.job, r.draw, reference)], budget)["gpu_hours"]
                    for r in mine if (r.job, r.draw, reference) in by_study]
            first = [p["first_success"] for p in points if p["first_success"] is not None]
            rows.append({
                "strategy": strategy, "budget": budget, "studies": len(mine),
                "median_regret": float(np.median(regret)),
                "p90_regret": float(np.percentile(regret, 90)),
                "mean_regret": float(np.mean(regret)),
                "gpu_hours": float(hours.sum()),
                "gpu_hours_vs_reference": (float(np.median(hours / np.array(base)))
                                           if len(base) == len(mine) else None),
                "trials_run": float(np.mean([p["trials"] for p in points])),
                "first_success_median": float(np.median(first)) if first else None,
                "no_success": int(sum(p["first_success"] is None for p in points)),
                "pruned": float(np.mean([p["pruned"] for p in points])),
                "oom": float(np.mean([p["oom"] for p in points])),
                "stopped_confident": float(np.mean([r.stop_reason.startswith("no untried")
                                                    and len(r.trials) < budget
                                                    for r in mine]))})
    return rows


def format_table(rows: Sequence[dict]) -> str:
    lines = ["| strategy | trials | median regret | p90 regret | GPU-h (all studies) | "
             "GPU-h vs before | trials to 1st success | pruned | OOM | stopped early |",
             "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for r in rows:
        ratio = r["gpu_hours_vs_reference"]
        first = r["first_success_median"]
        lines.append(
            f"| {r['strategy']} | {r['budget']} | {r['median_regret']:.1%} | "
            f"{r['p90_regret']:.1%} | {r['gpu_hours']:,.0f} | "
            f"{'-' if ratio is None else f'{ratio:.2f}'} | "
            f"{'-' if first is None else f'{first:.0f}'} | "
            f"{r['pruned']:.1f} | {r['oom']:.1f} | {r['stopped_confident']:.0%} |")
    return "\n".join(lines)


@contextlib.contextmanager
def scratch_dir():
    """A temporary directory for the studies' storage and trial files, in memory where the
    system has /dev/shm (Optuna's journal fsyncs every write)."""
    shm = Path("/dev/shm")
    with tempfile.TemporaryDirectory(prefix="tuning-regret-",
                                     dir=shm if shm.is_dir() else None) as tmp:
        yield Path(tmp)


def same_regret(rows: Sequence[dict], reference: str = STRATEGIES[0].name) -> list[str]:
    """Per strategy: the fewest trials whose median regret is at most the reference's at its
    largest budget, and the GPU-hours spent there against the reference's."""
    mine = [r for r in rows if r["strategy"] == reference]
    if not mine:  # the reference was not run
        return []
    ref = max(mine, key=lambda r: r["budget"])
    lines = []
    for strategy in dict.fromkeys(r["strategy"] for r in rows):
        if strategy == reference:
            continue
        hit = next((r for r in sorted((r for r in rows if r["strategy"] == strategy),
                                      key=lambda r: r["budget"])
                    if r["median_regret"] <= ref["median_regret"]), None)
        lines.append(f"{strategy}: " + (
            f"median regret {hit['median_regret']:.1%} after {hit['budget']} trials with "
            f"{hit['gpu_hours']:,.0f} GPU-h, {1 - hit['gpu_hours'] / ref['gpu_hours']:.0%} fewer "
            f"than {reference} after {ref['budget']} ({ref['median_regret']:.1%}, "
            f"{ref['gpu_hours']:,.0f} GPU-h)" if hit else
            f"never reaches {reference}'s {ref['median_regret']:.1%}"))
    return lines


def run_all(jobs: Sequence[Job], strategies: Sequence[Strategy], draws: int,
            budgets: Sequence[int], *, launch_s: float = LAUNCH_S,
            step_noise: float = STEP_NOISE, progress: Callable[[str], None] | None = None,
            study_trials: int | None = None, bound: bool = False, truth: str = "phases",
            first_draw: int = 0, uncertainty: float | None = None
            ) -> tuple[list[StudyRun], dict]:
    """Every strategy's study of every job and draw, each ``study_trials`` trials long
    (default the largest budget), with :func:`diagnose`'s case at each budget; ``bound``:
    also ``tune``'s default strategy's study of the best family's layouts alone (:data:`BOUND`,
    :func:`best_family_job`).  ``info["noise"]``: :func:`noise_parts` of every hidden table;
    ``truth``: the hidden tables' noise model (:func:`hidden_truth`); ``first_draw``: the first
    hidden table's number (draws ``first_draw`` .. ``first_draw + draws - 1``);
    ``uncertainty``: the cost model's ranking uncertainty (None: the shipped one; see
    :func:`prepare`)."""
    memory_sd = memory_error_sd()
    runs: list[StudyRun] = []
    info = {"memory_error_sd": memory_sd, "truth": truth, "jobs": {}, "noise": [],
            "first_draw": first_draw,
            "ranking_uncertainty": float(cost_model(uncertainty).uncertainty)}
    with scratch_dir() as tmp:
        for job in jobs:
            prepared = prepare(job, uncertainty=uncertainty)
            for draw in range(first_draw, first_draw + draws):
                seed = int.from_bytes(hashlib.sha256(f"{job.name}:{draw}".encode())
                                      .digest()[:4], "little")
                hidden = hidden_truth(prepared, seed, memory_sd, truth=truth)
                info["jobs"].setdefault(job.name, {
                    "candidates": len(prepared.candidates), "kind": job.kind,
                    "gpus": job.gpus, "sigma": round(hidden.sigma, 4),
                    "plan_s": round(prepared.plan_s, 2),
                    "predicted_oom_share": round(float(np.mean(hidden.oom_need > 1)), 3)})
                info["noise"].append({"job": job.name, "draw": draw,
                                      **noise_parts(prepared, hidden)})
                studies = [(prepared, hidden, strategy) for strategy in strategies]
                if bound:
                    studies.append((*best_family_job(prepared, hidden),
                                    dataclasses.replace(default_strategy(), name=BOUND)))
                for on, table, strategy in studies:
                    started = time.perf_counter()
                    runs.append(run_study(on, table, strategy,
                                          max(study_trials or 0, max(budgets)), draw,
                                          Path(tmp), launch_s=launch_s,
                                          step_noise=step_noise))
                    runs[-1].cases = {b: diagnose(on, table, runs[-1], b) for b in budgets}
                    if progress:
                        progress(f"{job.name} draw {draw} {strategy.name}: "
                                 f"{len(runs[-1].trials)} trials, "
                                 f"{time.perf_counter() - started:.1f} s")
    return runs, info


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--draws", type=int, default=3, help="hidden tables per job")
    parser.add_argument("--budgets", default=",".join(map(str, BUDGETS)))
    parser.add_argument("--jobs", help="comma-separated job names (default: all)")
    parser.add_argument("--strategies", help="comma-separated strategy names (default: all)")
    parser.add_argument("--launch-s", type=float, default=LAUNCH_S)
    parser.add_argument("--step-noise", type=float, default=STEP_NOISE)
    parser.add_argument("--study-trials", type=int, default=None,
                        help="trials each study runs (default: the largest budget); more "
                             "lets cheap trials use all of an equal-GPU-hours budget")
    parser.add_argument("--diagnose", action="store_true",
                        help="also print why studies miss the best layout (diagnose()) and "
                             "how the hidden tables' error splits (noise_parts())")
    parser.add_argument("--bound", action="store_true",
                        help=f"also run tune's default strategy on the true best TP/EP/PP "
                             f"family's layouts alone ({BOUND!r}: what knowing the family "
                             "would reach)")
    parser.add_argument("--truth", choices=TRUTHS, default=TRUTHS[0],
                        help="the hidden tables' noise model: phases (one error per GRPO phase "
                             "group, the step their sum; the default) or scalar (one per "
                             "layout: the first three rounds' tables)")
    parser.add_argument("--first-draw", type=int, default=0,
                        help="the first hidden table's number: draws N .. N + --draws - 1 "
                             "(default 0; fresh tables: a number no earlier run reached)")
    parser.add_argument("--ranking-uncertainty", type=float, default=None, metavar="U",
                        help="the cost model's ranking uncertainty as a fraction (default: the "
                             "shipped calibration's): the hidden tables match it, the plan ties "
                             "layouts within it and the studies' sampler assumes it, as tune "
                             "with a calibration stating it would")
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--quiet", action="store_true")
    args = parser.parse_args(argv)
    if args.ranking_uncertainty is not None and not 0.0 < args.ranking_uncertainty < 1.0:
        parser.exit(2, f"tuning_regret.py: --ranking-uncertainty {args.ranking_uncertainty:g} "
                       "is not a fraction in (0, 1)\n")
    if args.first_draw < 0:
        parser.exit(2, f"tuning_regret.py: --first-draw {args.first_draw} is negative\n")
    budgets = tuple(int(b) for b in args.budgets.split(","))
    jobs = [j for j in JOBS if not args.jobs or j.name in args.jobs.split(",")]
    strategies = [s for s in STRATEGIES
                  if not args.strategies or s.name in args.strategies.split(",")]
    say = None if args.quiet else (lambda text: print(text, file=sys.stderr, flush=True))
    started = time.perf_counter()
    runs, info = run_all(jobs, strategies, args.draws, budgets, launch_s=args.launch_s,
                         step_noise=args.step_noise, progress=say,
                         study_trials=args.study_trials, bound=args.bound, truth=args.truth,
                         first_draw=args.first_draw, uncertainty=args.ranking_uncertainty)
    rows = summarise(runs, budgets)
    case_rows = summarise_cases(runs, budgets)
    hour_rows = summarise_hours(runs, budgets)
    if args.json:
        studies = [{"job": r.job, "draw": r.draw, "strategy": r.strategy,
                    "stop_reason": r.stop_reason, "cases": r.cases,
                    **{f"at_{b}": at_budget(r, b) for b in budgets}} for r in runs]
        print(json.dumps({"info": info, "rows": rows, "equal_gpu_hours": hour_rows,
                          "same_regret": same_regret(rows), "cases": case_rows,
                          "studies": studies}, indent=2))
        return 0
    print(f"{len(jobs)} jobs x {args.draws} hidden tables (draws {args.first_draw}-"
          f"{args.first_draw + args.draws - 1}, {args.truth} truth, ranking uncertainty "
          f"{info['ranking_uncertainty']:.1%}), {len(strategies)} strategies; "
          f"memory error sd {info['memory_error_sd']:.3f}; launch {args.launch_s:g} s, step "
          f"noise {args.step_noise:.0%}; {time.perf_counter() - started:.0f} s\n")
    print(format_table(rows))
    if hour_rows:
        print(f"\nAt equal GPU-hours (each study spends what {STRATEGIES[0].name}'s study of "
              "the same job and draw spent on that many trials):\n")
        print(format_hours_table(hour_rows))
    if args.diagnose:
        print(f"\nWhy studies miss a layout within {NEAR:.0%} of the best (studies per "
              "case):\n")
        print(format_cases(case_rows))
        print("\nThe hidden tables (median over them): " + ", ".join(
            f"{name} {np.median([n[name] for n in info['noise']]):.3g}"
            for name in ("family_sd", "within_sd", "families", "tie_families",
                         "near_layouts", "near_families")))
    print("\nAt the same regret:")
    for line in same_regret(rows):
        print(f"- {line}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
