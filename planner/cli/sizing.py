"""Sizing the cluster from the command line: ``plan-parallel --model M --gpus 8-256
--gpu-type h100,h200,h20 [--price h100=2.5,...] [--steps N]`` (and ``report`` with the same
flags for the HTML figure)."""

from __future__ import annotations

import sys
from pathlib import Path

from planner.catalog.hardware import (
    DEFAULT_GPU,
    DEFAULT_GPUS_PER_NODE,
    detect_local_gpus,
    get_gpu,
    gpu_from_detected,
)
from planner.catalog.models import resolve_model
from planner.cli import inputs
from planner.cli.args import UsageError
from planner.cli.codes import ExitCode
from planner.cli.inputs import SIZING_FLAGS, sizing_requested  # noqa: F401  (re-exported)
from planner.search.space import SearchOptions
from planner.sizing.counts import GpuCounts, parse_counts, parse_gpu_types, skipped_ends
from planner.sizing.prices import PriceTable, parse_prices, read_prices
from planner.sizing.sweep import Sizing, SizingRequest, run_length, size_cluster


def prices_from_args(args) -> PriceTable | None:
    if args.price is not None:
        return parse_prices(args.price)
    if args.prices is not None:
        return read_prices(Path(args.prices))
    return None


def _gpu_types(args, prices: PriceTable | None):
    if args.gpu_type is not None:
        return parse_gpu_types(args.gpu_type), None
    if prices is not None:
        return tuple(get_gpu(name) for name in prices.gpu_names), None
    detected = detect_local_gpus()
    if detected is None:
        print(f"note: no GPU visible through NVML; sizing for {DEFAULT_GPU} (pass --gpu-type "
              f"h100,h200,... to compare types)", file=sys.stderr)
        return (get_gpu(DEFAULT_GPU),), None
    return (gpu_from_detected(detected),), detected


def sizing_from_args(args, options: SearchOptions | None = None) -> Sizing:
    model = resolve_model(args.model)
    workload = inputs.workload(args, model)
    run = run_length(workload, args.steps, args.epochs, args.dataset_prompts)
    prices = prices_from_args(args)
    gpus, detected = _gpu_types(args, prices)
    per_node = args.gpus_per_node or (detected.count if detected else DEFAULT_GPUS_PER_NODE)
    counts = (GpuCounts(auto=True, text="auto") if args.gpus is None
              else parse_counts(str(args.gpus), per_node))
    skipped = skipped_ends(counts, per_node)
    if skipped:
        print(f"note: {skipped}", file=sys.stderr)
    if options is None:
        options = inputs.search_options(args, workload)
    return size_cluster(SizingRequest(
        model=model, workload=workload, gpus=gpus, counts=counts, run=run,
        gpus_per_node=per_node, prices=prices, min_scaling=args.min_scaling, options=options,
        cost=inputs.cost_model(args), policy=inputs.policy(args),
        host_memory_gib=getattr(args, "host_memory_gib", None)))


def cmd_size(args) -> int:
    from planner.output import sizing_json
    from planner.report.sizing_table import sizing_csv, sizing_table
    from planner.report.text import to_json

    if getattr(args, "write", None):
        raise UsageError("--write exports one layout; give one --gpus count and one "
                         "--gpu-type (sizing compares several)")
    sizing = sizing_from_args(args)
    inputs.note_versions(args, sizing.cost, sizing.workload)
    if args.format == "json":
        print(to_json(sizing_json(sizing)))
    elif args.format == "csv":
        print(sizing_csv(sizing), end="")
    else:
        print(sizing_table(sizing))
    return ExitCode.OK if any(row.fits for row in sizing.rows) else ExitCode.NO
