"""Handlers of ``plan``, ``estimate`` (``--mode M``: the layout as a training mode runs it,
:mod:`planner.modes`), ``models`` and ``gpus``: arguments in, printed answer and exit code
out."""

from __future__ import annotations

import math
import sys
from dataclasses import replace
from pathlib import Path

from planner.catalog.hardware import GPU_CATALOG
from planner.catalog.models import builtin_model, catalog_names, resolve_model
from planner.cli import inputs
from planner.cli.args import UsageError
from planner.cli.codes import ExitCode
from planner.errors import InvalidLayoutError, NoFitError
from planner.modes import BEST, get_mode, mode_names, off_policy_note
from planner.no_fit import remedy
from planner.output import estimate_json, plan_json, split_estimate_json
from planner.placement import SplitEstimate, pool_layout
from planner.plan import PlanReads, make_plan
from planner.policy import FILL_POLICY
from planner.report.text import estimate_text, format_table, plan_csv, plan_table, to_json
from planner.search.layout import Layout, modules_mask
from planner.search.pipeline import default_split, layout_vpp, split_problems
from planner.search.space import SearchOptions


def cmd_plan(args) -> int:
    inputs.check_mode_flags(args)
    if inputs.sizing_requested(args):
        from planner.cli.sizing import cmd_size

        return cmd_size(args)
    if not inputs.baseline_mode(args):
        from planner.cli.modes import cmd_plan_mode

        return cmd_plan_mode(args)
    if args.write:
        from planner.verl.export import check_overrides

        check_overrides(args.override or ())  # before any planning: Hydra's own parser
    model = resolve_model(args.model)
    cluster = inputs.resolve_cluster(args)
    workload = inputs.workload(args, model)
    request = inputs.request(args, model, cluster, workload)
    # the text table reads the plan's first rows, its fastest layout inside the memory band and
    # counts: only what it reads is ranked (JSON, CSV and --write read every layout)
    table = args.format not in ("json", "csv") and not args.write
    # the same search were the GPU filled prices the band's headroom (a second search, after
    # the table's when a layout fits)
    filled_next = table and not request.policy.fills_gpu and workload.has_rollout
    plan = make_plan(request, tie_tolerance=args.tie_tolerance,
                     reads=PlanReads.text_table(args.top, filled_next) if table
                     else PlanReads())
    inputs.note_versions(args, request.cost, request.workload)
    fitting = plan.fitting_count
    if args.write:
        if not fitting:
            raise NoFitError(f"no layout of {model.name} fits on {cluster.num_gpus} x "
                             f"{cluster.gpu.name}; nothing written ({remedy(plan)})")
        if not 1 <= args.rank <= fitting:
            raise UsageError(f"--rank {args.rank} is outside the {fitting} layouts that fit "
                             f"(valid: 1..{fitting})")
        from planner.verl.files import write_plan_job

        written = write_plan_job(plan, rank=args.rank, directory=Path(args.write),
                                 force=args.force, model_path=inputs.job_model_path(args),
                                 train_files=args.train_files, val_files=args.val_files,
                                 extra_overrides=args.override)
        for path in written:
            print(f"wrote {path}", file=sys.stderr)
    if args.format == "json":
        print(to_json(plan_json(plan, args.top)))
    elif args.format == "csv":
        print(plan_csv(plan, args.top), end="")
    else:
        # the table reads the filled-GPU plan's best layout's step and peak alone, not that
        # layout's own headroom nor counts (bounded by the first plan's step times)
        fill_plan = (None if not filled_next or not fitting else
                     make_plan(replace(request, policy=FILL_POLICY), tie_tolerance=0.0,
                               actors=plan.actors, reads=PlanReads.first_rows(1)))
        print(plan_table(plan, args.top, fill_plan))
    return ExitCode.OK if fitting else ExitCode.NO


ROLLOUT_FLAGS = ("rollout_tp", "rollout_dp", "rollout_ep")  # the rollout layout's flags (dests)
# layout field -> the estimate flag that sets it (for messages)
FIELD_FLAGS = {"pipeline_layout": "--pipeline-layout",
               "first_stage_layers": "--first-stage-layers",
               "last_stage_layers": "--last-stage-layers",
               "account_embedding": "--account-for-embedding-in-pipeline-split",
               "account_loss": "--account-for-loss-in-pipeline-split",
               "max_token_len": "--max-token-len-per-gpu"}


def estimate_layout_from_args(args, model, cluster, workload) -> Layout:
    """The layout ``estimate`` scores: the flags given, 1 (or none) for the rest; without split
    flags, the first split megatron-core accepts (even, the embedding and loss counted, or
    uneven end stages).  Contradictory split or batch flags are input errors."""

    def given(value, default):
        return default if value is None else value

    tp, pp, cp = given(args.tp, 1), given(args.pp, 1), given(args.cp, 1)
    vpp = given(args.vpp, layout_vpp(args.pipeline_layout, pp) if args.pipeline_layout else 1)
    first, last = given(args.first_stage_layers, 0), given(args.last_stage_layers, 0)
    embedding = args.account_for_embedding_in_pipeline_split
    loss = args.account_for_loss_in_pipeline_split
    if not (first or last or embedding or loss or args.pipeline_layout):
        first, last, embedding, loss = default_split(model.num_layers, pp, vpp)
    for field, message in split_problems(model.num_layers, pp, vpp, first, last, embedding, loss,
                                         args.pipeline_layout or ""):
        raise UsageError(f"{FIELD_FLAGS.get(field, field)}: {message}")
    dynamic = bool(args.dynamic_batch) or args.max_token_len_per_gpu is not None
    budget = args.max_token_len_per_gpu or 0
    if dynamic and not workload.has_rollout:
        raise UsageError("--dynamic-batch is verl's; --workload pretrain has fixed micro-batches")
    if dynamic and not budget:
        budget = given(args.micro_batch, 1) * -(-workload.sequence_length // cp)
    log_prob_budget = args.log_prob_max_token_len_per_gpu or 0
    for flag, value in (("--max-token-len-per-gpu", budget),
                        ("--log-prob-max-token-len-per-gpu", log_prob_budget)):
        if dynamic and value and value * cp < workload.sequence_length:
            raise UsageError(f"{flag} {value} x CP {cp} is below the longest sequence, "
                             f"{workload.sequence_length} tokens (--prompt-length + "
                             f"--response-length); valid: >= "
                             f"{-(-workload.sequence_length // cp)}")
    if args.log_prob_max_token_len_per_gpu and not dynamic:
        raise UsageError("--log-prob-max-token-len-per-gpu needs --dynamic-batch")
    fraction = inputs.cpu_optimizer_fraction(args)
    modules = modules_mask(args.recompute_modules.split(",")) if args.recompute_modules else 0
    if (modules or args.recompute_method) and args.recompute is None:
        raise UsageError("--recompute-modules/--recompute-method need --recompute "
                         "selective/full")
    _check_recompute_flags(args)
    layout = Layout(tp=tp, pp=pp, vpp=vpp, cp=cp, ep=given(args.ep, 1),
                  etp=given(args.etp, 1), dp=max(cluster.num_gpus // (tp * pp * cp), 1),
                  micro_batch=given(args.micro_batch, 1), recompute=args.recompute or "none",
                  recompute_modules=modules,
                  recompute_num_layers=given(args.recompute_num_layers, 1),
                  recompute_block=args.recompute_method == "block",
                  param_offload=bool(args.param_offload),
                  optimizer_offload=bool(args.optimizer_offload),
                  ref_param_offload=bool(args.ref_param_offload), sequence_parallel=tp > 1,
                  first_stage_layers=first, last_stage_layers=last,
                  account_embedding=embedding, account_loss=loss,
                  pipeline_layout=args.pipeline_layout or "",
                  optimizer_cpu_fraction=fraction or 0.0,
                  dynamic_batch=dynamic, max_token_len=budget,
                  log_prob_max_token_len=log_prob_budget,
                  log_prob_micro_batch=given(args.log_prob_micro_batch, 0),
                  rollout_tp=given(args.rollout_tp, tp if args.workload == "grpo" else 1),
                  rollout_dp=given(args.rollout_dp, 1), rollout_ep=given(args.rollout_ep, 1),
                  gpu_memory_utilization=given(args.gpu_memory_utilization, 0.6))
    _check_uniform_chunk(args, model, layout)
    return layout


def _check_recompute_flags(args) -> None:
    """The recompute flags megatron-core refuses or ignores at the granularity asked, refused
    here rather than dropped: ``recompute_num_layers`` with selective recompute
    (TransformerConfig: "recompute_num_layers must be None"), ``recompute_method`` outside full
    recompute, and ``recompute_modules`` under full recompute (whole layers are recomputed)."""
    full = args.recompute == "full"
    if args.recompute_num_layers is not None and not full:
        raise UsageError(f"--recompute-num-layers {args.recompute_num_layers} needs --recompute "
                         f"full (megatron-core refuses recompute_num_layers with selective "
                         f"recompute; --recompute {args.recompute or 'none'} was given)")
    if args.recompute_method and not full:
        raise UsageError(f"--recompute-method {args.recompute_method} needs --recompute full "
                         f"(selective recompute has no method: megatron-core ignores it)")
    if args.recompute_modules and full:
        raise UsageError(f"--recompute-modules {args.recompute_modules} picks what --recompute "
                         f"selective recomputes; --recompute full recomputes whole layers")


def _check_uniform_chunk(args, model, layout: Layout) -> None:
    """Full uniform recompute in chunks of ``--recompute-num-layers`` that do not divide a
    model chunk's layers: megatron-core indexes past the chunk (validate's same check)."""
    from planner.verl.checks import uniform_chunk_misfit

    chunk = args.recompute_num_layers
    if chunk is None or layout.recompute_block:
        return
    sizes = uniform_chunk_misfit(model, layout, chunk)
    if sizes:
        raise UsageError(f"--recompute-num-layers {chunk} with --recompute-method uniform does "
                         f"not divide the {sizes} layers of each model chunk; megatron-core "
                         f"indexes past the chunk (valid: a divisor of {math.gcd(*sizes)}, or "
                         f"--recompute-method block)")


def print_invalid(args, layout: Layout, error: InvalidLayoutError) -> int:
    """A layout that breaks rules: every rule on stderr (and JSON on stdout), exit code 1."""
    if args.format == "json":
        print(to_json({"valid": False, "layout": layout.to_dict(),
                       "violations": [{"rule": name, "message": message}
                                      for name, message in error.violations]}))
    for name, message in error.violations:
        print(f"invalid layout [{name}]: {message}", file=sys.stderr)
    return ExitCode.NO


def _either(names) -> str:
    return f"{', '.join(names[:-1])} or {names[-1]}" if len(names) > 1 else names[0]


def cmd_estimate(args) -> int:
    """``estimate [--mode M]``: one layout as the mode runs it -- on every GPU (the baseline,
    ``sync``), or the actor layout on the trainer pool with the rollout flags (or the best
    rollout layout, said on stderr) on the rollout pool, on the split ``--trainer-gpus`` gives
    or the fastest legal split.  ``--mode best`` is refused: it compares the modes' best
    plans, which a single layout has not got."""
    from planner.cli.modes import async_options

    inputs.check_mode_flags(args)
    if args.mode == BEST:
        raise UsageError(f"--mode best compares each mode's best plan: use it with plan or "
                         f"explain; estimate takes --mode {_either(mode_names())}")
    mode = get_mode(args.mode, async_options(args))
    model = resolve_model(args.model)
    cluster = inputs.resolve_cluster(args)
    workload = inputs.workload(args, model)
    if not mode.colocated and not workload.has_rollout:
        raise UsageError(f"--mode {args.mode} estimates GRPO; --workload pretrain has no "
                         f"rollout")
    layout = estimate_layout_from_args(args, model, cluster, workload)
    pin = any(getattr(args, name) is not None for name in ROLLOUT_FLAGS)
    request = inputs.request(args, model, cluster, workload, SearchOptions(
        gpu_memory_utilization=args.gpu_memory_utilization))
    trainer_gpus = mode.settings.trainer_gpus
    try:
        estimate = mode.estimate(request, layout, pin)
    except InvalidLayoutError as error:
        shown = pool_layout(layout, trainer_gpus[0]) \
            if not mode.colocated and len(trainer_gpus) == 1 else layout
        return print_invalid(args, shown, error)
    inputs.note_versions(args, request.cost, request.workload)
    if isinstance(estimate, SplitEstimate):
        return _print_split_estimate(args, estimate)
    # No rollout flag: the rollout layout and budget the plan would give this actor layout.
    if workload.has_rollout and not pin:
        print(f"note: {estimate.rollout_text()} chosen as the plan would for "
              f"this actor layout (pin it with --rollout-tp/--rollout-dp/--rollout-ep"
              f"{'' if args.gpu_memory_utilization is not None else ', --gpu-memory-utilization'}"
              f")", file=sys.stderr)
    print(to_json({"valid": True, **estimate_json(estimate)}) if args.format == "json"
          else estimate_text(estimate))
    return ExitCode.OK if estimate.candidate.fits else ExitCode.NO


def _print_split_estimate(args, estimate: SplitEstimate) -> int:
    from planner.report.mode_tables import split_estimate_text

    candidate = estimate.candidate
    placement, lay = candidate.placement, candidate.layout
    trainer_gpus = estimate.async_options.trainer_gpus
    if not trainer_gpus or len(trainer_gpus) > 1:
        print(f"note: {placement.trainer_gpus} trainer + {placement.rollout_gpus} rollout "
              f"GPUs is the fastest of the {len(estimate.splits)} split(s) scored for this "
              f"layout{'' if candidate.fits else ' (none fits)'} (pin one with "
              f"--trainer-gpus)", file=sys.stderr)
    if estimate.rollout_chosen:
        print(f"note: rollout TP{lay.rollout_tp} DP{lay.rollout_dp} EP{lay.rollout_ep} "
              f"at gpu_memory_utilization {lay.gpu_memory_utilization:.2f} chosen as the plan "
              f"would for the {placement.rollout_gpus}-GPU rollout pool (pin it with "
              f"--rollout-tp/--rollout-dp/--rollout-ep"
              f"{'' if args.gpu_memory_utilization is not None else ', --gpu-memory-utilization'}"
              f")", file=sys.stderr)
    print(to_json(split_estimate_json(estimate, off_policy_note())) if args.format == "json"
          else split_estimate_text(estimate, inputs.policy(args)))
    return ExitCode.OK if candidate.fits else ExitCode.NO


def cmd_models(args) -> int:
    if getattr(args, "supported", False):
        return _supported_models(args)
    specs = [builtin_model(name) for name in catalog_names()]
    if args.format == "json":
        print(to_json([{**spec.to_dict(), "params": spec.params.to_dict()} for spec in specs]))
        return ExitCode.OK
    rows = [{"name": s.name, "type": s.model_type, "params": f"{s.params.total / 1e9:.2f}B",
             "active": f"{s.params.active / 1e9:.2f}B", "layers": s.num_layers,
             "hidden": s.hidden_size, "heads": f"{s.num_attention_heads}/{s.num_query_groups}",
             "experts": f"{s.num_experts} top-{s.moe_top_k}" if s.is_moe else "-",
             "kinds": s.layer_summary if s.is_hybrid or s.vision else "-"}
            for s in specs]
    print(format_table(rows, [("model", "name"), ("type", "type"), ("params", "params"),
                              ("active", "active"), ("layers", "layers"), ("hidden", "hidden"),
                              ("heads/kv", "heads"), ("experts", "experts"),
                              ("layer kinds", "kinds")]))
    return ExitCode.OK


def _supported_models(args) -> int:
    """``models --supported``: every architecture verl runs on Megatron, planned or not."""
    from planner.catalog.support import registries, supported_rows

    rows = supported_rows()
    if args.format == "json":
        print(to_json({"sources": registries().sources, "architectures": rows}))
        return ExitCode.OK
    table = [{**row, "planned": "yes" if row["planned"] else "no",
              "vanilla": str(row.get("vanilla_mbridge", "-")).lower()} for row in rows]
    print(format_table(table, [("architecture", "architecture"), ("family", "family"),
                               ("planned", "planned"), ("built by", "route"),
                               ("vanilla_mbridge", "vanilla"), ("note", "note")]))
    print("every route needs actor_rollout_ref.actor.megatron.use_mbridge=true (verl 0.9.1's "
          "Megatron engine asserts it)", file=sys.stderr)
    for route, source in registries().sources.items():
        print(f"{route}: {source}", file=sys.stderr)
    return ExitCode.OK


def cmd_gpus(args) -> int:
    if args.format == "json":
        from dataclasses import asdict

        print(to_json([asdict(g) for g in GPU_CATALOG]))
        return ExitCode.OK
    rows = [{"name": g.name, "memory": f"{g.memory_gib:.1f}",
             "bf16": f"{g.bf16_flops / 1e12:.0f}" + ("" if g.bf16 else "*"),
             "sm": "-" if g.compute_capability is None else
             f"{g.compute_capability[0]}.{g.compute_capability[1]}",
             "fp8": f"{g.fp8_flops / 1e12:.0f}" if g.fp8_flops else "-",
             "hbm": f"{g.hbm_bandwidth_bytes_per_s / 1e12:.2f}",
             "nvlink": f"{g.nvlink_bandwidth_bytes_per_s / 1e9:.0f}",
             "net": f"{g.inter_node_bandwidth_bytes_per_s / 1e9:.1f}",
             "domain": g.nvlink_domain_gpus} for g in GPU_CATALOG]
    print(format_table(rows, [("gpu", "name"), ("GiB", "memory"), ("BF16 TF/s", "bf16"),
                              ("FP8 TF/s", "fp8"), ("HBM TB/s", "hbm"),
                              ("NVLink GB/s", "nvlink"), ("net GB/s", "net"),
                              ("NVLink GPUs", "domain"), ("sm", "sm")]))
    if not all(g.bf16 for g in GPU_CATALOG):
        print("* FP16: no BF16 tensor cores (plans for it train in FP16)")
    return ExitCode.OK
