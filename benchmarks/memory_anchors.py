"""Memory anchors: the planner's predicted peak next to what real verl jobs measured or did.

    python benchmarks/memory_anchors.py [--json]

Anchors (sources in ``tests/verl_examples/`` and ``tests/data/``):

* verl's own example jobs (test copies of ``examples/grpo_trainer/*_megatron_96gb.sh`` and the
  Qwen2-7B math example) on the hardware their headers name: they launch;
* verl's DeepSeek-V3 benchmark (``docs/perf/dpsk.md``): 96 x H20, 66 GB of GPU memory and
  about 1.5 TB of host memory per node measured;
* the OOM / no-OOM outcomes of verl's Qwen2.5-7B sweep on 8 x H100
  (``tests/data/verl_qwen2.5_7b_8xh100_outcomes.csv``; rows 95-101 of grpo_runs.csv and the
  rest of the published table).

Prints, per anchor, the predicted peak, the phase and stage that set it, and the error or
whether the fit/OOM verdict matches.  ``anchors()`` is what ``tests/cost/test_memory_anchors.py``
checks.
"""

from __future__ import annotations

import argparse
import csv
import json
import sys
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from planner.catalog.hardware import ClusterSpec, get_gpu  # noqa: E402
from planner.catalog.models import resolve_model  # noqa: E402
from planner.catalog.workload import GrpoWorkload  # noqa: E402
from planner.cost.memory import STAGES  # noqa: E402
from planner.cost.request import PlanRequest  # noqa: E402
from planner.phases import PHASES  # noqa: E402
from planner.plan import estimate_layout  # noqa: E402
from planner.search.layout import Layout  # noqa: E402
from planner.units import GIB  # noqa: E402

OUTCOMES = ROOT / "tests" / "data" / "verl_qwen2.5_7b_8xh100_outcomes.csv"
TOLERANCE = 0.15  # the target for measured peaks


@dataclass(frozen=True)
class Anchor:
    name: str
    source: str
    model: str
    gpu: str
    gpus: int
    workload: GrpoWorkload
    layout: Layout
    expect_fits: bool = True
    measured_gib: float | None = None  # peak GPU memory measured, when published
    measured_host_gib_per_node: float | None = None


def _dapo(**values) -> GrpoWorkload:
    return GrpoWorkload(prompt_length=2048, response_length=9632, rollout_n=8,
                        use_kl_loss=True, enforce_eager=True, **values)


def example_anchors() -> list[Anchor]:
    """verl's example jobs as the test copies state them (tests/verl_examples/)."""
    examples = "tests/verl_examples/"
    return [
        Anchor("Qwen3-30B-A3B DAPO on 8 x H20 (run_qwen3moe-30b_megatron_96gb.sh)",
               examples + "run_qwen3moe-30b_megatron_96gb.sh", "qwen3-30b", "h20", 8,
               GrpoWorkload(train_batch_size=512, rollout_n=16, mini_batch_size=128,
                            prompt_length=2048, response_length=8192, use_kl_loss=False,
                            enforce_eager=True, max_num_batched_tokens=10240),
               Layout(tp=1, ep=8, dp=8, micro_batch=2, param_offload=True,
                      optimizer_offload=True, ref_param_offload=True, sequence_parallel=False,
                      optimizer_cpu_fraction=1.0, dynamic_batch=True, max_token_len=10240,
                      rollout_tp=4, gpu_memory_utilization=0.7)),
        Anchor("Qwen3-235B-A22B DAPO on 32 x H20 (run_qwen3-235b_megatron_96gb.sh)",
               examples + "run_qwen3-235b_megatron_96gb.sh", "qwen3-235b", "h20", 32,
               _dapo(train_batch_size=32, mini_batch_size=16, fused_kernels=True,
                     max_num_batched_tokens=11680),
               Layout(tp=4, pp=8, ep=4, dp=1, micro_batch=2, account_embedding=True,
                      account_loss=True, param_offload=True, optimizer_offload=True,
                      ref_param_offload=True, optimizer_cpu_fraction=1.0,
                      dynamic_batch=True, max_token_len=11680, rollout_tp=8,
                      gpu_memory_utilization=0.85)),
        Anchor("DeepSeek-V3 DAPO on 96 x H20 (run_deepseek671b_math_megatron_96gb.sh, "
               "docs/perf/dpsk.md)", examples + "run_deepseek671b_math_megatron_96gb.sh",
               "deepseek-v3", "h20", 96,
               _dapo(train_batch_size=96, mini_batch_size=32, fused_kernels=True,
                     max_num_batched_tokens=11680, mean_response_length=1960),
               Layout(tp=8, pp=12, ep=8, dp=1, micro_batch=2, last_stage_layers=6,
                      recompute="full", param_offload=True, optimizer_offload=True,
                      ref_param_offload=True, optimizer_cpu_fraction=1.0,
                      dynamic_batch=True, max_token_len=11680, rollout_tp=32,
                      gpu_memory_utilization=0.6),
               measured_gib=66.0, measured_host_gib_per_node=1500.0),
        Anchor("Qwen2-7B GRPO on 8 x H100 (run_qwen2-7b_math_megatron.sh)",
               examples + "run_qwen2-7b_math_megatron.sh", "qwen2-7b", "h100", 8,
               GrpoWorkload(train_batch_size=1024, rollout_n=5, mini_batch_size=256,
                            prompt_length=1024, response_length=1024, fused_kernels=True),
               Layout(tp=2, pp=2, dp=2, micro_batch=4, rollout_tp=2,
                      gpu_memory_utilization=0.6)),
    ]


def outcome_anchors() -> list[Anchor]:
    """verl's Qwen2.5-7B sweep on 8 x H100: which layouts ran and which ran out of memory."""
    lines = [line for line in OUTCOMES.read_text().splitlines() if not line.startswith("#")]
    out = []
    for row in csv.DictReader(lines):
        tp, cp = int(row["tp"]), int(row["cp"])
        dynamic = row["dynamic"] == "True"
        offload = row["offload"] == "True"
        workload = GrpoWorkload(train_batch_size=512, rollout_n=16, mini_batch_size=32,
                                prompt_length=2048, response_length=8192, fused_kernels=True,
                                enforce_eager=row["enforce_eager"] == "True",
                                max_num_batched_tokens=10240)
        layout = Layout(tp=tp, cp=cp, dp=8 // (tp * cp), micro_batch=2,
                        log_prob_micro_batch=0 if dynamic else 4, recompute=row["recompute"],
                        param_offload=offload, optimizer_offload=offload,
                        dynamic_batch=dynamic, max_token_len=10240 if dynamic else 0,
                        log_prob_max_token_len=int(row["log_prob_budget"]), rollout_tp=1,
                        gpu_memory_utilization=float(row["gpu_memory_utilization"]))
        out.append(Anchor(f"Qwen2.5-7B on 8 x H100, table row {row['row']}: TP{tp} CP{cp} "
                          f"offload {offload} recompute {row['recompute']} dynamic {dynamic} "
                          f"util {row['gpu_memory_utilization']}", str(OUTCOMES.name),
                          "qwen2.5-7b", "h100", 8, workload, layout,
                          expect_fits=row["outcome"] == "ran"))
    return out


def anchors() -> list[Anchor]:
    return example_anchors() + outcome_anchors()


def evaluate(anchor: Anchor) -> dict:
    model = resolve_model(anchor.model)
    cluster = ClusterSpec(get_gpu(anchor.gpu), anchor.gpus, min(8, anchor.gpus))
    row = estimate_layout(PlanRequest(model, cluster, anchor.workload), anchor.layout).row
    peak = row["peak_bytes"] / GIB
    out = {"anchor": anchor.name, "source": anchor.source, "fits": bool(row["fits"]),
           "expect_fits": anchor.expect_fits, "verdict_right": bool(row["fits"]) ==
           anchor.expect_fits, "peak_gib": round(peak, 2),
           "phase": PHASES[int(row["peak_phase"])], "stage": STAGES[int(row["peak_stage"])],
           "host_gib_per_node": round(row["host_bytes_per_node"] / GIB, 1)}
    if anchor.measured_gib is not None:
        out["measured_gib"] = anchor.measured_gib
        out["error"] = round(peak / anchor.measured_gib - 1, 4)
    if anchor.measured_host_gib_per_node is not None:
        out["measured_host_gib_per_node"] = anchor.measured_host_gib_per_node
        out["host_error"] = round(out["host_gib_per_node"] / anchor.measured_host_gib_per_node
                                  - 1, 4)
    return out


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    results = [evaluate(anchor) for anchor in anchors()]
    if args.json:
        print(json.dumps(results, indent=2))
        return 0
    for r in results:
        verdict = "fits" if r["fits"] else "OOM"
        expected = "fits" if r["expect_fits"] else "OOM"
        line = (f"{'ok ' if r['verdict_right'] else 'XX '} {r['anchor']}\n"
                f"    predicted {r['peak_gib']:.1f} GiB in {r['phase']} ({r['stage']} stage): "
                f"{verdict} (real: {expected})")
        if "measured_gib" in r:
            line += f"; measured {r['measured_gib']:.0f} GB, error {r['error']:+.1%}"
        if "measured_host_gib_per_node" in r:
            line += (f"; host {r['host_gib_per_node']:.0f} GiB/node vs "
                     f"{r['measured_host_gib_per_node']:.0f} GB measured "
                     f"({r['host_error']:+.1%})")
        print(line)
    right = sum(r["verdict_right"] for r in results)
    print(f"\n{right}/{len(results)} fit/OOM verdicts right")
    return 0


if __name__ == "__main__":
    sys.exit(main())
