"""How long sizing the cluster takes, and how close its layouts are to full plans.

    python benchmarks/sizing_speed.py [--check] [--repeat 3]

The issue's case: Qwen3-30B-A3B with verl's DAPO workload (512 prompts x 16 responses, 2K
prompt, 8K response, mini-batch 32) on every whole-node count from 8 to 128 GPUs of H100, H200
and H20 (48 counts), the workload read from those flags as the command line reads it
(``plan-parallel --model qwen3-30b --gpus 8-128 --gpu-type h100,h200,h20 ...``): with the
response lengths that move over the run, so every plan is timed at the run's three points.
Prints the sweep's table and marks, its wall and CPU time (median of ``--repeat``), and for
scale the time of one full plan (Qwen3-30B-A3B on 16 H100 with the DAPO workload) -- the
machine is shared, so the ratio is the steadier figure.

``--check`` also runs the full plan at every count (minutes) and reports how often the sweep's
best layout is the plan's best and the largest step-time gap.
"""

from __future__ import annotations

import argparse
import statistics
import time

from planner.catalog.hardware import ClusterSpec, get_gpu
from planner.catalog.models import resolve_model
from planner.cli import inputs
from planner.cli.args import build_parser
from planner.cost.request import PlanRequest
from planner.plan import make_plan
from planner.report.sizing_table import sizing_table
from planner.sizing.counts import parse_counts
from planner.sizing.sweep import SizingRequest, run_length, size_cluster

DAPO_FLAGS = ("--train-batch-size 512 --rollout-n 16 --prompt-length 2048 --response-length 8192 "
              "--mini-batch-size 32")
GPUS = ("h100", "h200", "h20")
RANGE = "8-128"


def timed(function):
    wall, cpu = time.perf_counter(), time.process_time()
    result = function()
    return result, time.perf_counter() - wall, time.process_time() - cpu


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--check", action="store_true", help="compare with full plans")
    args = parser.parse_args()
    model = resolve_model("qwen3-30b")
    flags = build_parser().parse_args(["plan", "--model", "qwen3-30b", *DAPO_FLAGS.split()])
    dapo = inputs.workload(flags, model)  # the command line's workload, lengths included
    gpus = tuple(get_gpu(name) for name in GPUS)
    counts = parse_counts(RANGE, 8)

    def sweep():
        return size_cluster(SizingRequest(model, dapo, gpus, counts, run_length(dapo, 200),
                                          gpus_per_node=8))

    sizing, _, _ = timed(sweep)  # imports and first-call costs out of the measurement
    runs = [timed(sweep)[1:] for _ in range(args.repeat)]
    plans = [timed(lambda: make_plan(PlanRequest(model, ClusterSpec(gpus[0], 16, 8), dapo)))[1:]
             for _ in range(args.repeat)]
    print(sizing_table(sizing))
    wall = statistics.median(r[0] for r in runs)
    cpu = statistics.median(r[1] for r in runs)
    plan_wall = statistics.median(p[0] for p in plans)
    plan_cpu = statistics.median(p[1] for p in plans)
    print(f"\nsweep: {len(sizing.rows)} GPU type x count rows, {sizing.scored:,} layouts scored; "
          f"median of {args.repeat}: {wall:.2f} s wall, {cpu:.2f} s CPU")
    print(f"one full plan (Qwen3-30B-A3B, DAPO, 16 x H100): {plan_wall:.2f} s wall, "
          f"{plan_cpu:.2f} s CPU; the sweep costs {cpu / plan_cpu:.1f} such plans")
    if args.check:
        exact, worst, fits = 0, 0.0, 0
        for row in sizing.rows:
            plan = make_plan(PlanRequest(model, ClusterSpec(get_gpu(row.gpu), row.num_gpus, 8),
                                         dapo))
            fits += row.fits == (len(plan.fitting) > 0)
            if row.fits and len(plan.fitting):
                gap = row.step_time_s / float(plan.fitting["step_time_s"].iloc[0]) - 1
                exact += gap < 1e-9
                worst = max(worst, gap)
        print(f"check: fit agrees at {fits}/{len(sizing.rows)} counts; best layout is the "
              f"plan's best at {exact}/{len(sizing.rows)}, worst step-time gap "
              f"{100 * worst:.2f}%")


if __name__ == "__main__":
    main()
