"""Handlers of ``plan``, ``estimate``, ``models`` and ``gpus``: arguments in, printed answer and
exit code out."""

from __future__ import annotations

import sys
from pathlib import Path

from planner.catalog.hardware import GPU_CATALOG
from planner.catalog.models import builtin_model, catalog_names, resolve_model
from planner.cli import inputs
from planner.cli.args import UsageError
from planner.cli.codes import ExitCode
from planner.errors import InvalidLayoutError
from planner.plan import estimate_layout, make_plan
from planner.report.text import (
    estimate_dict,
    estimate_text,
    format_table,
    plan_csv,
    plan_dict,
    plan_table,
    to_json,
)
from planner.search.layout import Layout
from planner.verl.files import write_plan_job


def cmd_plan(args) -> int:
    model = resolve_model(args.model)
    cluster = inputs.resolve_cluster(args)
    workload = inputs.workload(args)
    options = inputs.search_options(args, workload)
    plan = make_plan(model, cluster, workload, options, inputs.calibration(args),
                     inputs.policy(args))
    fitting = int(plan.candidates["fits"].sum())
    if args.write:
        if not 1 <= args.rank <= fitting:
            raise UsageError(f"--rank {args.rank} is outside the {fitting} layouts that fit"
                             if fitting else "no layout fits in GPU memory; nothing to write")
        written = write_plan_job(plan, rank=args.rank, directory=Path(args.write),
                                 force=args.force, model_path=args.model_path,
                                 train_files=args.train_files, val_files=args.val_files,
                                 extra_overrides=args.override)
        for path in written:
            print(f"wrote {path}", file=sys.stderr)
    if args.format == "json":
        print(to_json(plan_dict(plan, args.top)))
    elif args.format == "csv":
        print(plan_csv(plan, args.top), end="")
    else:
        print(plan_table(plan, args.top))
    return ExitCode.OK if fitting else ExitCode.NO


def estimate_layout_from_args(args, cluster) -> Layout:
    """The layout ``estimate`` scores: the flags given, 1 (or none) for the rest."""

    def given(value, default):
        return default if value is None else value

    tp, pp, cp = given(args.tp, 1), given(args.pp, 1), given(args.cp, 1)
    return Layout(tp=tp, pp=pp, vpp=given(args.vpp, 1), cp=cp, ep=given(args.ep, 1),
                  etp=given(args.etp, 1), dp=max(cluster.num_gpus // (tp * pp * cp), 1),
                  micro_batch=given(args.micro_batch, 1), recompute=args.recompute or "none",
                  param_offload=bool(args.param_offload),
                  optimizer_offload=bool(args.optimizer_offload),
                  ref_param_offload=bool(args.ref_param_offload), sequence_parallel=tp > 1,
                  first_stage_layers=given(args.first_stage_layers, 0),
                  last_stage_layers=given(args.last_stage_layers, 0),
                  rollout_tp=given(args.rollout_tp, tp if args.workload == "grpo" else 1),
                  rollout_dp=given(args.rollout_dp, 1), rollout_ep=given(args.rollout_ep, 1),
                  gpu_memory_utilization=given(args.gpu_memory_utilization, 0.6))


def cmd_estimate(args) -> int:
    model = resolve_model(args.model)
    cluster = inputs.resolve_cluster(args)
    workload = inputs.workload(args)
    layout = estimate_layout_from_args(args, cluster)
    try:
        estimate = estimate_layout(model, cluster, workload, layout,
                                   pick_utilization=args.gpu_memory_utilization is None,
                                   calibration=inputs.calibration(args),
                                   policy=inputs.policy(args))
    except InvalidLayoutError as error:
        if args.format == "json":
            print(to_json({"valid": False, "layout": layout.to_dict(),
                           "violations": [{"rule": name, "message": message}
                                          for name, message in error.violations]}))
        for name, message in error.violations:
            print(f"invalid layout [{name}]: {message}", file=sys.stderr)
        return ExitCode.NO
    print(to_json({"valid": True, **estimate_dict(estimate)}) if args.format == "json"
          else estimate_text(estimate))
    return ExitCode.OK if estimate.row["fits"] else ExitCode.NO


def cmd_models(args) -> int:
    specs = [builtin_model(name) for name in catalog_names()]
    if args.format == "json":
        print(to_json([{**spec.to_dict(), "params": spec.params.to_dict()} for spec in specs]))
        return ExitCode.OK
    rows = [{"name": s.name, "type": s.model_type, "params": f"{s.params.total / 1e9:.2f}B",
             "active": f"{s.params.active / 1e9:.2f}B", "layers": s.num_layers,
             "hidden": s.hidden_size, "heads": f"{s.num_attention_heads}/{s.num_query_groups}",
             "experts": f"{s.num_experts} top-{s.moe_top_k}" if s.is_moe else "-"}
            for s in specs]
    print(format_table(rows, [("model", "name"), ("type", "type"), ("params", "params"),
                              ("active", "active"), ("layers", "layers"), ("hidden", "hidden"),
                              ("heads/kv", "heads"), ("experts", "experts")]))
    return ExitCode.OK


def cmd_gpus(args) -> int:
    if args.format == "json":
        from dataclasses import asdict

        print(to_json([asdict(g) for g in GPU_CATALOG]))
        return ExitCode.OK
    rows = [{"name": g.name, "memory": f"{g.memory_gib:.1f}", "bf16": f"{g.bf16_flops / 1e12:.0f}",
             "fp8": f"{g.fp8_flops / 1e12:.0f}" if g.fp8_flops else "-",
             "hbm": f"{g.hbm_bandwidth_bytes_per_s / 1e12:.2f}",
             "nvlink": f"{g.nvlink_bandwidth_bytes_per_s / 1e9:.0f}",
             "net": f"{g.inter_node_bandwidth_bytes_per_s / 1e9:.1f}",
             "domain": g.nvlink_domain_gpus} for g in GPU_CATALOG]
    print(format_table(rows, [("gpu", "name"), ("GiB", "memory"), ("BF16 TF/s", "bf16"),
                              ("FP8 TF/s", "fp8"), ("HBM TB/s", "hbm"),
                              ("NVLink GB/s", "nvlink"), ("net GB/s", "net"),
                              ("NVLink GPUs", "domain")]))
    return ExitCode.OK
