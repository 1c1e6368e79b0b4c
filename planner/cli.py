"""The ``plan-parallel`` command line.

The only layer that knows about terminals and exit codes: data goes to stdout (tables, JSON,
CSV), messages to stderr.  Planner modules are imported inside the handlers so that
``plan-parallel --help`` starts instantly.
"""

from __future__ import annotations

import argparse
import enum
import sys
from typing import Sequence


class ExitCode(enum.IntEnum):
    OK = 0
    FAILED = 1  # the answer is "no": an invalid layout, a config that would not launch
    USAGE = 2  # bad input: unknown model or GPU, malformed file, contradictory flags


class UsageError(Exception):
    pass


class _Parser(argparse.ArgumentParser):
    """argparse that reports bad input as one line and exit code 2 (no usage dump)."""

    def error(self, message: str):  # noqa: D401 - argparse API
        raise UsageError(message)


SUBCOMMANDS = ("plan", "estimate", "validate", "tune", "calibrate", "profile", "explain", "fix",
               "diff", "report", "models", "gpus")

# Subcommands that live in their own modules: each module defines
# ``add_arguments(parser)`` and ``run(args) -> int`` (imported only when the command runs,
# except for the argument definitions, which must stay import-light).
EXTERNAL_COMMANDS = {
    "validate": ("planner.validate", "dry-run a verl launch script, Hydra YAML or overrides"),
    "tune": ("trials.cli_tune", "run short real verl GRPO trials with Optuna"),
    "calibrate": ("trials.cli_calibrate", "fit efficiency constants from measured trials"),
    "profile": ("planner.profile", "communication analysis of a PyTorch profiler trace"),
    "explain": ("planner.explain", "the chosen layout next to the rules of thumb, in words"),
    "fix": ("planner.fix", "mitigations for a config that does not fit, cheapest first"),
    "diff": ("planner.diff", "what changes between two configs, its risk and effect"),
    "report": ("planner.sweep_report", "HTML report of a plan or a tuning sweep"),
}


def _cluster_args(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("model and cluster")
    group.add_argument("--model", required=True,
                       help="catalog name or alias (qwen3-30b, llama3.1-70b, deepseek-v3, ...) "
                            "or a local model directory / config.json")
    group.add_argument("--gpus", type=int, help="number of GPUs (default: the local GPUs NVML "
                                                "reports)")
    group.add_argument("--gpu-type", help="GPU catalog name (h100, h200, h20, b200, ...); "
                                          "default: detected through NVML, else H100-80GB")
    group.add_argument("--gpus-per-node", type=int,
                       help="GPUs per node (default 8, or the detected count)")


def _workload_args(parser: argparse.ArgumentParser) -> None:
    from_defaults = {  # verl GRPO example defaults, see planner/workload.py
        "train_batch_size": 1024, "rollout_n": 5, "prompt_length": 1024,
        "response_length": 1024, "mini_batch_size": 256, "ppo_epochs": 1}
    group = parser.add_argument_group("GRPO workload (verl's data/actor settings)")
    for name, default in from_defaults.items():
        group.add_argument(f"--{name.replace('_', '-')}", type=int, default=default,
                           help=f"default {default}")
    group.add_argument("--mean-response-length", type=int, default=0,
                       help="tokens generated per response on average (time follows it; "
                            "default: half of --response-length)")
    group.add_argument("--precision", default="bf16", choices=("bf16", "fp16", "fp8"))
    group.add_argument("--max-num-seqs", type=int, default=1024,
                       help="rollout engine's max concurrent sequences (default 1024)")
    group.add_argument("--workload", choices=("grpo", "pretrain"), default="grpo",
                       help="grpo (verl) or a plain Megatron pretraining step")
    group.add_argument("--seq-len", type=int, default=4096, help="pretrain: sequence length")
    group.add_argument("--global-batch", type=int, default=1024,
                       help="pretrain: sequences per optimizer step")
    group.add_argument("--calibration", help="efficiency constants fitted for your cluster "
                                             "(JSON from `plan-parallel calibrate`)")


def _layout_args(parser: argparse.ArgumentParser, required: bool) -> None:
    group = parser.add_argument_group(
        "layout" if required else "pin layout values (the search keeps the rest free)")
    for name, text in (("tp", "tensor parallel"), ("pp", "pipeline parallel"),
                       ("vpp", "virtual pipeline stages per rank"), ("cp", "context parallel"),
                       ("ep", "expert parallel"), ("etp", "expert tensor parallel"),
                       ("micro-batch", "micro-batch size per GPU"),
                       ("rollout-tp", "rollout engine tensor parallel"),
                       ("rollout-dp", "rollout engine data parallel (MoE expert parallel)"),
                       ("rollout-ep", "rollout engine expert parallel (1 or TP*DP)"),
                       ("first-stage-layers", "layers on the first pipeline stage (uneven)"),
                       ("last-stage-layers", "layers on the last pipeline stage (uneven)")):
        group.add_argument(f"--{name}", type=int, help=text)
    group.add_argument("--recompute", choices=("none", "selective", "full"))
    for name in ("param-offload", "optimizer-offload", "ref-param-offload"):
        group.add_argument(f"--{name}", action=argparse.BooleanOptionalAction, default=None)
    group.add_argument("--gpu-memory-utilization", type=float,
                       help="rollout engine's memory fraction (default: picked per layout)")


def _output_args(parser: argparse.ArgumentParser, formats: tuple[str, ...]) -> None:
    parser.add_argument("--format", choices=formats, default=formats[0])


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog="plan-parallel",
        description="Find the best parallel layout for verl GRPO training with Megatron: "
                    "memory of every phase for every valid layout, ranked.",
        epilog="Without a subcommand, `plan` runs: plan-parallel --model qwen3-30b --gpus 16")
    sub = parser.add_subparsers(dest="command", parser_class=_Parser)
    plan = sub.add_parser("plan", help="rank every valid layout (the default command)")
    _cluster_args(plan)
    _workload_args(plan)
    _layout_args(plan, required=False)
    _output_args(plan, ("table", "json", "csv"))
    plan.add_argument("--top", type=int, default=10, help="layouts to show (default 10)")
    plan.add_argument("--no-offload", action="store_true",
                      help="leave parameter/optimizer offload out of the search")
    export = plan.add_argument_group("export the chosen layout as a runnable verl job")
    export.add_argument("--write", metavar="DIR", help="write launch script, Hydra config and "
                                                       "plan.json for the chosen layout")
    export.add_argument("--rank", type=int, default=1, help="which ranked layout (default 1)")
    export.add_argument("--force", action="store_true", help="overwrite files in DIR")
    export.add_argument("--model-path", help="HF model directory for the job (default: "
                                              "$MODEL_PATH in the script)")
    export.add_argument("--train-files", help="training parquet (default: $TRAIN_FILES)")
    export.add_argument("--val-files", help="validation parquet (default: $VAL_FILES)")
    export.add_argument("--override", action="append", default=[], metavar="KEY=VALUE",
                        help="extra Hydra override for the job (repeatable)")
    estimate = sub.add_parser("estimate", help="memory of one layout, with its breakdown")
    _cluster_args(estimate)
    _workload_args(estimate)
    _layout_args(estimate, required=True)
    _output_args(estimate, ("table", "json"))
    import importlib

    for name, (module_name, text) in EXTERNAL_COMMANDS.items():
        try:
            module = importlib.import_module(module_name)
        except ModuleNotFoundError as error:
            if error.name not in (module_name, module_name.rsplit(".", 1)[0]):
                raise
            continue  # the command's module is not part of this build
        command = sub.add_parser(name, help=text)
        module.add_arguments(command)
    models = sub.add_parser("models", help="list the built-in model catalog")
    _output_args(models, ("table", "json"))
    gpus = sub.add_parser("gpus", help="list the GPU catalog")
    _output_args(gpus, ("table", "json"))
    return parser


# --- handlers ------------------------------------------------------------------------------


def _resolve_cluster(args):
    from planner.hardware import (DEFAULT_GPU, DEFAULT_GPUS_PER_NODE, ClusterSpec,
                                  detect_local_gpus, get_gpu, gpu_from_detected)

    detected = None
    if args.gpu_type:
        gpu = get_gpu(args.gpu_type)
    else:
        detected = detect_local_gpus()
        if detected is None:
            print(f"note: no GPU visible through NVML; planning for {DEFAULT_GPU} "
                  f"(pass --gpu-type to choose)", file=sys.stderr)
            gpu = get_gpu(DEFAULT_GPU)
        else:
            gpu = gpu_from_detected(detected)
    gpus = args.gpus if args.gpus is not None else (detected.count if detected else None)
    if gpus is None:
        raise UsageError("--gpus is required when no local GPU is detected")
    if args.gpus_per_node is not None and args.gpus_per_node < 1:
        raise UsageError(f"--gpus-per-node must be a positive integer, got {args.gpus_per_node}")
    if getattr(args, "gpu_memory_utilization", None) is not None and \
            not 0.05 <= args.gpu_memory_utilization <= 0.99:
        raise UsageError(f"--gpu-memory-utilization {args.gpu_memory_utilization} is outside "
                         f"0.05..0.99")
    per_node = args.gpus_per_node or (detected.count if detected else DEFAULT_GPUS_PER_NODE)
    if args.gpus is not None and args.gpus < per_node and not args.gpus_per_node:
        per_node = max(args.gpus, 1)
    return ClusterSpec(gpu=gpu, num_gpus=gpus, gpus_per_node=per_node)


def _workload(args):
    from planner.workload import GrpoWorkload, PretrainWorkload

    if args.workload == "pretrain":
        return PretrainWorkload(seq_len=args.seq_len, global_batch=args.global_batch,
                                precision=args.precision)
    return GrpoWorkload(mean_response_length=args.mean_response_length,
                        train_batch_size=args.train_batch_size, rollout_n=args.rollout_n,
                        prompt_length=args.prompt_length, response_length=args.response_length,
                        mini_batch_size=args.mini_batch_size, ppo_epochs=args.ppo_epochs,
                        precision=args.precision, max_num_seqs=args.max_num_seqs)


def _calibration(args):
    if not args.calibration:
        return None
    from pathlib import Path

    from planner.timing import read_calibration

    return read_calibration(Path(args.calibration))


PIN_FIELDS = {"tp": "tp", "pp": "pp", "vpp": "vpp", "cp": "cp", "ep": "ep", "etp": "etp",
              "micro_batch": "micro_batch", "rollout_tp": "rollout_tp",
              "rollout_dp": "rollout_dp", "rollout_ep": "rollout_ep",
              "param_offload": "param_offload", "optimizer_offload": "optimizer_offload",
              "ref_param_offload": "ref_param_offload"}


def _pins(args) -> dict:
    pins = {field: getattr(args, attr) for attr, field in PIN_FIELDS.items()
            if getattr(args, attr) is not None}
    for name in ("first_stage_layers", "last_stage_layers"):
        if getattr(args, name) is not None:
            raise UsageError(f"--{name.replace('_', '-')} is for `estimate`; the search "
                             f"chooses the stage split")
    for name, value in pins.items():
        if not isinstance(value, bool) and value < 1:
            raise UsageError(f"--{name.replace('_', '-')} must be a positive integer, got "
                             f"{value}")
    return pins


def cmd_plan(args) -> int:
    from planner.layout import RECOMPUTE
    from planner.models import resolve_model
    from planner.plan import make_plan
    from planner.report import plan_csv, plan_dict, plan_table, to_json
    from planner.space import SearchOptions

    if args.top < 1:
        raise UsageError(f"--top must be a positive integer, got {args.top}")
    model = resolve_model(args.model)
    cluster = _resolve_cluster(args)
    workload = _workload(args)
    pins = _pins(args)
    if args.no_offload and any(pins.get(name) for name in ("param_offload",
                                                            "optimizer_offload")):
        raise UsageError("--no-offload contradicts --param-offload/--optimizer-offload")
    grpo_only = [name for name in ("rollout_tp", "rollout_dp", "rollout_ep", "param_offload",
                                   "optimizer_offload", "ref_param_offload") if name in pins]
    if workload.kind == "pretrain" and (grpo_only or args.gpu_memory_utilization):
        raise UsageError(f"--workload pretrain has no rollout, reference or verl offload; drop "
                         f"{', '.join('--' + n.replace('_', '-') for n in grpo_only) or '--gpu-memory-utilization'}")
    options = SearchOptions(
        offload=(False,) if args.no_offload else (False, True),
        recompute=(args.recompute,) if args.recompute else RECOMPUTE,
        gpu_memory_utilization=args.gpu_memory_utilization,
        fixed=tuple(sorted(pins.items())))
    plan = make_plan(model, cluster, workload, options, _calibration(args))
    if args.write:
        if not 1 <= args.rank <= int(plan.candidates["fits"].sum()):
            raise UsageError(f"--rank {args.rank} is outside the {int(plan.candidates['fits'].sum())}"
                             f" layouts that fit")
        from pathlib import Path

        from planner.verl_export import write_plan_job

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
    return ExitCode.OK


def cmd_estimate(args) -> int:
    from planner.errors import InvalidLayoutError
    from planner.layout import Layout
    from planner.models import resolve_model
    from planner.plan import estimate_layout
    from planner.report import estimate_dict, estimate_text, to_json

    model = resolve_model(args.model)
    cluster = _resolve_cluster(args)
    workload = _workload(args)
    for name in ("tp", "pp", "vpp", "cp", "ep", "etp", "micro_batch", "rollout_tp",
                 "rollout_dp", "rollout_ep"):
        value = getattr(args, name)
        if value is not None and value < 1:
            raise UsageError(f"--{name.replace('_', '-')} must be a positive integer, got {value}")

    def given(value, default):
        return default if value is None else value

    tp, pp, cp = given(args.tp, 1), given(args.pp, 1), given(args.cp, 1)
    values = dict(tp=tp, pp=pp, vpp=given(args.vpp, 1), cp=cp, ep=given(args.ep, 1),
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
    layout = Layout(**values)
    try:
        estimate = estimate_layout(model, cluster, workload, layout,
                                   pick_utilization=args.gpu_memory_utilization is None,
                                   calibration=_calibration(args))
    except InvalidLayoutError as error:
        if args.format == "json":
            print(to_json({"valid": False, "layout": layout.to_dict(),
                           "violations": [{"rule": name, "message": message}
                                          for name, message in error.violations]}))
        for name, message in error.violations:
            print(f"invalid layout [{name}]: {message}", file=sys.stderr)
        return ExitCode.FAILED
    print(to_json({"valid": True, **estimate_dict(estimate)}) if args.format == "json"
          else estimate_text(estimate))
    return ExitCode.OK


def cmd_models(args) -> int:
    from planner.models import builtin_model, catalog_names
    from planner.report import format_table, to_json

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
    from planner.hardware import GPU_CATALOG
    from planner.report import format_table, to_json

    rows = [{"name": g.name, "memory": f"{g.memory_gib:.1f}", "bf16": f"{g.bf16_flops / 1e12:.0f}",
             "fp8": f"{g.fp8_flops / 1e12:.0f}" if g.fp8_flops else "-",
             "hbm": f"{g.hbm_bandwidth_bytes_per_s / 1e12:.2f}",
             "nvlink": f"{g.nvlink_bandwidth_bytes_per_s / 1e9:.0f}",
             "net": f"{g.inter_node_bandwidth_bytes_per_s / 1e9:.1f}",
             "domain": g.nvlink_domain_gpus} for g in GPU_CATALOG]
    if args.format == "json":
        from dataclasses import asdict

        print(to_json([asdict(g) for g in GPU_CATALOG]))
        return ExitCode.OK
    print(format_table(rows, [("gpu", "name"), ("GiB", "memory"), ("BF16 TF/s", "bf16"),
                              ("FP8 TF/s", "fp8"), ("HBM TB/s", "hbm"),
                              ("NVLink GB/s", "nvlink"), ("net GB/s", "net"),
                              ("NVLink GPUs", "domain")]))
    return ExitCode.OK


HANDLERS = {"plan": cmd_plan, "estimate": cmd_estimate, "models": cmd_models, "gpus": cmd_gpus}


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv and argv[0] not in SUBCOMMANDS and argv[0] not in ("-h", "--help"):
        argv.insert(0, "plan")  # `plan-parallel --model ... --gpus ...`
    if not argv:
        argv = ["--help"]
    try:
        args = build_parser().parse_args(argv)
        if args.command in EXTERNAL_COMMANDS:
            import importlib

            return int(importlib.import_module(EXTERNAL_COMMANDS[args.command][0]).run(args))
        return int(HANDLERS[args.command](args))
    except UsageError as error:
        print(f"plan-parallel: error: {error}", file=sys.stderr)
        return ExitCode.USAGE
    except Exception as error:  # noqa: BLE001 - map the planner's own errors to exit codes
        from planner.errors import PlanInputError

        if isinstance(error, PlanInputError):
            print(f"plan-parallel: error: {error}", file=sys.stderr)
            return ExitCode.USAGE
        raise


def entry_point() -> None:
    sys.exit(main())
