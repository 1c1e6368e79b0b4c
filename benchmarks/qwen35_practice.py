"""Qwen3.5-35B-A3B and Qwen3.5-122B-A10B: the planner's prediction next to verl's core contributors'
published Megatron runs (ISEEKYAN/verl_megatron_practice, ``qwen3_5_megatron.csv``: Megatron only,
H100-80GB, 128K-token sequences x global batch 64; 35B on 32 GPUs, 122B on 128 GPUs with the whole
optimizer on the CPU, ``optimizer_cpu_offload_fraction=1``, as its notes column says).

    python benchmarks/qwen35_practice.py [--json]

Each row: the published layout (TP*CP / PP*EP / recompute), its TFLOP/s per GPU and peak GB,
and the planner's ``estimate --workload pretrain`` of the same layout: model TFLOP/s per GPU,
the nvidia-smi peak and the allocated working set (GB = 1e9 bytes, as the CSV's figures).

The published runs use context parallelism on Gated DeltaNet layers, which megatron-core 0.16.1
(the pinned release) refuses (``cp_linear_attention``; GDN CP is NVIDIA/Megatron-LM PR 2642 and
ISEEKYAN's own fork): the layouts are scored here past that rule, with the cost model's CP
treatment of attention applied to every layer.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from planner.catalog.hardware import ClusterSpec, get_gpu  # noqa: E402
from planner.catalog.models import resolve_model  # noqa: E402
from planner.catalog.workload import PretrainWorkload  # noqa: E402
from planner.cost.request import PlanRequest  # noqa: E402
from planner.plan import score_columns  # noqa: E402
from planner.search.layout import DEFAULT_SELECTIVE_MODULES, Layout, modules_mask  # noqa: E402

# (model, GPUs, tp, cp, pp, ep, recompute, recompute modules, optimizer CPU fraction)
#   -> published TFLOP/s per GPU, peak GB (the CSV's rows with figures; empty rows are failed runs)
PUBLISHED = (
    (("Qwen3.5-35B-A3B", 32, 2, 4, 2, 16, "full", None, 0.0), 81, 38),
    (("Qwen3.5-35B-A3B", 32, 2, 2, 4, 8, "full", None, 0.0), 128, 43),
    (("Qwen3.5-35B-A3B", 32, 2, 8, 2, 16, "selective", ("moe",), 0.0), 77, 58),
    (("Qwen3.5-122B-A10B", 128, 2, 2, 8, 8, "full", None, 1.0), 117, 72),
    (("Qwen3.5-122B-A10B", 128, 2, 4, 4, 8, "full", None, 1.0), 142, 65),
)
SEQ_LEN, GLOBAL_BATCH = 131072, 64


def predict(name, gpus, tp, cp, pp, ep, recompute, modules, cpu_fraction) -> dict:
    model = resolve_model(name)
    cluster = ClusterSpec(get_gpu("h100"), gpus, 8)
    workload = PretrainWorkload(seq_len=SEQ_LEN, global_batch=GLOBAL_BATCH)
    dp = gpus // (tp * cp * pp)
    layout = Layout(tp=tp, cp=cp, pp=pp, ep=ep, dp=dp, micro_batch=1, recompute=recompute,
                    sequence_parallel=tp > 1, optimizer_cpu_fraction=cpu_fraction,
                    recompute_modules=modules_mask(modules) if modules else (
                        DEFAULT_SELECTIVE_MODULES if recompute == "selective" else 0))
    scored = score_columns(PlanRequest(model, cluster, workload), layout.to_columns(),
                           pick_utilization=False)
    return {"tflops_per_gpu": float(scored["tflops_per_gpu"][0]),
            "peak_gb": float(scored["peak_bytes"][0]) / 1e9,
            "allocated_gb": float(scored["alloc_update_actor_bytes"][0]) / 1e9,
            "activations_gb": float(scored["train_activations_bytes"][0]) / 1e9}


def rows() -> list[dict]:
    out = []
    for (name, gpus, tp, cp, pp, ep, recompute, modules, cpu_fraction), tflops, peak in PUBLISHED:
        ours = predict(name, gpus, tp, cp, pp, ep, recompute, modules, cpu_fraction)
        size = name.split("-")[1]
        out.append({"layout": f"{size} x {gpus}: TP{tp}*CP{cp} / PP{pp}*EP{ep} / "
                              f"{recompute}{'_' + '+'.join(modules) if modules else ''}"
                              f"{' / CPU optimizer' if cpu_fraction else ''}",
                    "published_tflops": tflops, "published_peak_gb": peak, **ours})
    return out


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    data = rows()
    if args.json:
        print(json.dumps(data, indent=2))
        return 0
    print("| layout | published TFLOP/s/GPU | predicted | published peak GB | "
          "predicted nvidia-smi / allocated GB (activations) |")
    print("|---|---|---|---|---|")
    for r in data:
        print(f"| {r['layout']} | {r['published_tflops']} | {r['tflops_per_gpu']:.0f} | "
              f"{r['published_peak_gb']} | {r['peak_gb']:.0f} / {r['allocated_gb']:.0f} "
              f"({r['activations_gb']:.0f}) |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
