"""How long a full plan (search space + memory model + ranking) takes.

    python benchmarks/search_speed.py [--repeat 5] [--lengths default|fixed]

Prints the median wall time per case; the target is about a second for DeepSeek-V3 on 1024
GPUs on a 2-core machine.  ``--lengths default`` (what a plan with no lengths given does) times
each layout that fits at the three nodes of the published default's trajectory
(planner.cost.trajectory); ``fixed`` at one mean (half the maximum), as before.
"""

from __future__ import annotations

import argparse
import statistics
import time

from planner.catalog.hardware import ClusterSpec, get_gpu
from planner.catalog.lengths import default_lengths
from planner.catalog.models import resolve_model
from planner.catalog.workload import GrpoWorkload
from planner.cost.request import PlanRequest
from planner.plan import make_plan

CASES = (("qwen3-30b", 16), ("qwen2.5-7b", 8), ("llama3.1-70b", 64), ("deepseek-v3", 256),
         ("deepseek-v3", 1024))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--lengths", choices=("default", "fixed"), default="default")
    args = parser.parse_args()
    print(f"{'model':>14} {'GPUs':>5} {'enumerated':>15} {'scored':>10} "
          f"{'fit':>10} {'median s':>9} {'min s':>7}")
    for name, gpus in CASES:
        model, cluster = resolve_model(name), ClusterSpec(get_gpu("h100"), gpus, 8)
        workload = GrpoWorkload()
        if args.lengths == "default":
            workload = GrpoWorkload(lengths=default_lengths(workload.response_length, model.name))
        times = []
        for _ in range(args.repeat):
            start = time.perf_counter()
            plan = make_plan(PlanRequest(model, cluster, workload))
            times.append(time.perf_counter() - start)
        print(f"{name:>14} {gpus:>5} {plan.enumerated:>15,} {plan.scored:>10,} "
              f"{int(plan.candidates['fits'].sum()):>10,} {statistics.median(times):>9.3f} "
              f"{min(times):>7.3f}")


if __name__ == "__main__":
    main()
