"""Predicted vs measured steady-state steps of the published 1-step-off-policy GRPO runs.

    python benchmarks/async_accuracy.py

The non-colocated rows of ``grpo_runs.csv`` (NeMo RL v0.4/v0.5 ``*-async-1off`` recipes, their
generation/training split in ``colocated``: "no (16 gen / 16 train)") are read with
:mod:`rl_data`'s parsing (the row as a colocated case on the training GPUs), then predicted with
planner/cost/pool_time.py: generation on the rollout pool, training on the trainer pool, the
parameter sync between them, ``max(G, T) + S``.  Each is paired with the colocated row of the
same release, model, GPU and workload; the predicted async/sync speed-up is printed next to the
measured one (target: within 20%).  Nothing is fitted here: the time model's constants are
planner/cost/calibration.json's.
"""

from __future__ import annotations

import csv
import re
import sys
from dataclasses import replace
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from calibration_data import default_path  # noqa: E402
from rl_data import CSV_NAME, Skip, case_from_row, predict_rl  # noqa: E402

from planner.cost.memory import rollout_memory  # noqa: E402
from planner.cost.pool_time import (  # noqa: E402
    overlapped_steady_state,
    pool_sync_s,
    streaming_generate_s,
)
from planner.cost.request import PlanRequest  # noqa: E402
from planner.errors import InvalidLayoutError  # noqa: E402
from planner.placement import (  # noqa: E402
    ROLLOUT_RESIDENT_BYTES,
    pool_cluster,
    pool_layout,
    split_layout_problems,
    trainer_memory,
    trainer_times,
)

SPLIT = re.compile(r"(\d+)\s*gen\s*/\s*(\d+)\s*train")
TARGET = 0.20
# What every NeMo RL ``*-async-1off.yaml`` performance recipe sets (examples/configs/recipes/llm/
# performance/): ``policy.generation.vllm_cfg.gpu_memory_utilization: 0.8`` on the generation
# pool, and ``grpo.async_grpo.in_flight_weight_updates: true`` -- the refit does not wait for
# the generations in flight and the collector starts the next step's prompt groups as soon as
# the new weights land, so the rollout pool streams (no per-step long tail), as verl's
# fully-async partial rollout does.
NEMO_ASYNC_UTILIZATION = 0.8


def is_async(row: dict) -> bool:
    return (row["category"] == "rl_step" and row["colocated"].lower().startswith("no")
            and "off-policy" in row["sync_mode"])


def pair_key(row: dict) -> tuple:
    return (row["framework_version"], row["model"], row["gpu_type"], row["train_batch_prompts"],
            row["n_per_prompt"], row["max_total_len"], "fp8" in row["source_section"].lower())


def async_case(row: dict):
    """The row as (case on the training GPUs, generation GPUs); raises Skip.  The Megatron
    settings an async row leaves unstated are its base recipe's (every ``*-async-1off.yaml``
    starts ``defaults: ./grpo-<model>-<nodes>.yaml``; rl_data.NEMO_RECIPE_CHECKPOINTING)."""
    split = SPLIT.search(row["colocated"])
    if not split:
        raise Skip(f"split not stated ({row['colocated']})")
    generation, training = int(split.group(1)), int(split.group(2))
    colocated = {**row, "colocated": "yes", "sync_mode": "on-policy (sync)",
                 "gpu_count": str(training)}
    case = case_from_row(colocated)
    if "fp8" in row["source_section"].lower():  # "FP8 (gen FP8, train FP8)" tables
        case = replace(case, workload=replace(case.workload, precision="fp8",
                                              rollout_precision="fp8"))
    return case, generation


def predict_async(case, generation_gpus: int, trainer_gpus: int | None = None) -> dict:
    """Steady-state step of a 1-step-off run: its parts and the total.  ``trainer_gpus``
    (default: the run's own) moves the split of the run's GPUs, the actor's data parallelism
    following it."""
    published = case.cluster
    whole = replace(published, num_gpus=published.num_gpus + generation_gpus)
    trainer_gpus = trainer_gpus or published.num_gpus
    trainer = pool_cluster(whole, trainer_gpus)
    rollout = pool_cluster(whole, whole.num_gpus - trainer_gpus)
    # on its own pool the policy keeps its state resident (NeMo RL: "not recommended to enable
    # cpu_offload when using non-colocated generation"), as planner/placement.py assumes
    layout = replace(case.layout, param_offload=False, optimizer_offload=False,
                     ref_param_offload=False)
    request = PlanRequest(case.model, whole, case.workload)
    problems = split_layout_problems(request, trainer, rollout, layout, pin_rollout=False)
    if problems:
        raise InvalidLayoutError(problems)
    layout = pool_layout(layout, trainer_gpus)
    cols = layout.to_columns()
    on_trainer = request.on(trainer)
    train = float(trainer_times(on_trainer, cols, trainer_memory(on_trainer, cols))["train_s"][0])
    memory = rollout_memory(request.on(rollout), cols, np.array([ROLLOUT_RESIDENT_BYTES]),
                            np.array([NEMO_ASYNC_UTILIZATION]))
    generate = float(streaming_generate_s(request.on(rollout), cols, memory)["total_s"][0])
    parts = pool_sync_s(request, trainer, cols)
    sync = float(parts["total_s"][0])
    state = overlapped_steady_state(generate, train, sync)
    return {"step": float(state["step_time_s"]), "generate": generate, "train": float(train),
            "sync": sync, "sync_parts": {k: round(float(v[0]), 1) for k, v in parts.items()},
            "bottleneck": "rollout" if bool(state["rollout_bound"]) else "trainer"}


def best_split(case, generation_gpus: int) -> dict:
    """The whole-node split of the run's GPUs that the model predicts fastest, with the run's
    own actor and rollout layouts (the actor's DP follows the trainer pool)."""
    gpus_per_node = case.cluster.gpus_per_node
    total = case.cluster.num_gpus + generation_gpus
    steps = {}
    for trainer_gpus in range(gpus_per_node, total, gpus_per_node):
        try:
            steps[trainer_gpus] = predict_async(case, generation_gpus, trainer_gpus)["step"]
        except InvalidLayoutError:
            continue
    if case.cluster.num_gpus not in steps:  # the published split itself is not legal here
        raise Skip(f"published split of {case.cluster.num_gpus} trainer GPUs not scorable")
    best = min(steps, key=steps.get)
    return {"trainer_gpus": best, "step": steps[best],
            "published_step": steps[case.cluster.num_gpus],
            "nodes_off": abs(best - case.cluster.num_gpus) // gpus_per_node,
            "splits": len(steps)}


def evaluate(path: str | Path | None = None) -> tuple[list[dict], dict[str, int]]:
    """Every published 1-step-off row: its prediction, its error, its colocated twin's measured
    and predicted speed-up (``None`` without a twin) and the best whole-node split; and
    {reason: count} of the rows skipped (as ``rl_data.load_rl_cases``), a row whose layout is
    not legal on its pools among them."""
    with open(path or default_path(CSV_NAME), newline="") as handle:
        rows = list(csv.DictReader(handle))
    sync_rows = {}
    for row in rows:
        if row["category"] == "rl_step" and row["colocated"].lower().startswith("yes") \
                and "off-policy" not in row["sync_mode"]:
            sync_rows.setdefault(pair_key(row), row)
    results, skipped = [], {}
    for row in rows:
        if not is_async(row):
            continue
        try:
            case, generation = async_case(row)
            try:
                predicted = predict_async(case, generation)
            except InvalidLayoutError as error:  # e.g. ETP*EP*PP does not divide the trainer pool
                raise Skip(f"published layout not legal on its pools ({error})") from None
            split = best_split(case, generation)
        except Skip as reason:
            skipped[str(reason)] = skipped.get(str(reason), 0) + 1
            continue
        measured = float(row["step_time_s"])
        result = {"row": row, "case": case, "generation": generation, "predicted": predicted,
                  "measured": measured, "error": predicted["step"] / measured - 1,
                  "best_split": split, "partner": None}
        partner = sync_rows.get(pair_key(row))
        try:
            sync_case = case_from_row(partner) if partner is not None else None
        except Skip:
            sync_case = None
        if sync_case is not None:
            measured_x = float(partner["step_time_s"]) / measured
            predicted_x = predict_rl([sync_case])[0]["step"] / predicted["step"]
            result.update(partner=partner, measured_speedup=measured_x,
                          predicted_speedup=predicted_x,
                          speedup_error=predicted_x / measured_x - 1)
        results.append(result)
    return results, skipped


def main() -> None:
    results, skipped = evaluate()
    print(f"{'row':>4} {'model':16} {'GPU':9} {'gen+train':>9} {'measured':>8} {'predicted':>9} "
          f"{'error':>6}  {'gen':>6} {'train':>6} {'sync':>5} bound   | {'sync row':>8} "
          f"{'meas x':>6} {'pred x':>6} {'x err':>6}")
    for r in results:
        row, case, predicted = r["row"], r["case"], r["predicted"]
        line = (f"{row['row_id']:>4} {case.model.name[:16]:16} {case.cluster.gpu.name[:9]:9} "
                f"{r['generation']:>4}+{case.cluster.num_gpus:<4} {r['measured']:8.1f} "
                f"{predicted['step']:9.1f} {100 * r['error']:+5.0f}%  "
                f"{predicted['generate']:6.1f} {predicted['train']:6.1f} "
                f"{predicted['sync']:5.1f} {predicted['bottleneck']:7}")
        if r["partner"] is not None:
            line += (f" | {r['partner']['row_id']:>8} {r['measured_speedup']:6.2f} "
                     f"{r['predicted_speedup']:6.2f} {100 * r['speedup_error']:+5.0f}%")
        print(line)
    errors = np.abs([r["error"] for r in results])
    ratio_errors = np.abs([r["speedup_error"] for r in results if r["partner"] is not None])
    print(f"\n{len(errors)} async rows: step MAPE {100 * errors.mean():.1f}%, "
          f"within 20%: {int((errors <= TARGET).sum())}/{len(errors)}")
    print(f"{len(ratio_errors)} async/sync pairs: speed-up MAPE {100 * ratio_errors.mean():.1f}%, "
          f"within ±20%: {int((ratio_errors <= TARGET).sum())}/{len(ratio_errors)}")
    print(f"skipped: {skipped}")
    print(f"\nbest whole-node split with each run's own layouts ({'row':>4}: published trainer "
          f"GPUs -> the model's best, predicted steps)")
    near = 0
    for r in results:
        row, case, best = r["row"], r["case"], r["best_split"]
        near += best["nodes_off"] <= 1
        print(f"{row['row_id']:>4} {case.model.name[:16]:16} {case.cluster.gpu.name[:9]:9} "
              f"trainer {case.cluster.num_gpus:>3} -> {best['trainer_gpus']:>3} of "
              f"{case.cluster.num_gpus + r['generation']:<3} ({best['nodes_off']} nodes off, "
              f"{best['splits']} legal splits): "
              f"{best['published_step']:6.1f} -> {best['step']:6.1f} s")
    print(f"best split within one node of the published one: {near}/{len(results)}; the others "
          f"are faster by the model's own prediction")


if __name__ == "__main__":
    main()
