"""Defects a user hit (bug hunt 5): each test failed before its fix."""

import json

import pytest

from planner.cli.main import main

ESTIMATE = ["estimate", "--model", "qwen3-8b", "--gpus", "8", "--gpu-type", "h100", "--tp", "2"]


def one_error_line(capsys) -> str:
    out, err = capsys.readouterr()
    lines = err.strip().splitlines()
    assert out == "" and len(lines) == 1, err
    return lines[0]


@pytest.mark.parametrize("flags,message", [
    # megatron-core TransformerConfig: "When using recompute_granularity: selective
    # recompute_num_layers must be None."; with no recompute the flag did nothing
    (["--recompute", "selective", "--recompute-num-layers", "3"],
     "--recompute-num-layers 3 needs --recompute full"),
    (["--recompute-num-layers", "3"], "--recompute-num-layers 3 needs --recompute full"),
    (["--recompute", "selective", "--recompute-method", "block"],
     "--recompute-method block needs --recompute full"),
    # full recompute keeps no module list: the modules were dropped without a word
    (["--recompute", "full", "--recompute-modules", "core_attn"],
     "--recompute-modules core_attn picks what --recompute selective recomputes"),
    # uniform chunks of 5 over 36 layers: megatron-core indexes past the chunk
    (["--recompute", "full", "--recompute-num-layers", "5"],
     "--recompute-num-layers 5 with --recompute-method uniform does not divide the [36] "
     "layers of each model chunk"),
])
def test_estimate_refuses_recompute_flags_megatron_refuses_or_ignores(capsys, flags, message):
    assert main([*ESTIMATE, *flags]) == 2
    assert message in one_error_line(capsys)


@pytest.mark.parametrize("flags", [["--recompute", "full", "--recompute-num-layers", "4"],
                                   ["--recompute", "full", "--recompute-method", "block",
                                    "--recompute-num-layers", "5"],
                                   ["--recompute", "selective", "--recompute-modules",
                                    "core_attn"]])
def test_estimate_keeps_the_recompute_flags_megatron_runs(capsys, flags):
    assert main([*ESTIMATE, *flags, "--format", "json"]) in (0, 1)
    assert "error" not in capsys.readouterr().err


PRETRAIN = ["--model", "qwen3-8b", "--gpus", "8", "--gpu-type", "h100", "--workload", "pretrain",
            "--seq-len", "4096", "--global-batch", "64"]


@pytest.mark.parametrize("command", [["estimate", "--tp", "2"], ["plan"]])
@pytest.mark.parametrize("flags,named", [
    (["--rollout-n", "8"], "--rollout-n"),
    (["--no-kl-loss", "--response-length", "100"], "--response-length, --no-kl-loss"),
    (["--adam-moments", "bf16"], "--adam-moments"),
    (["--overlap-grad-reduce"], "--overlap-grad-reduce"),
])
def test_pretrain_refuses_the_grpo_flags_it_does_not_read(capsys, command, flags, named):
    """A pretraining step read --seq-len, --global-batch and --precision only: the GRPO and
    verl flags beside them were dropped without a word."""
    assert main([*command, *PRETRAIN, *flags]) == 2
    line = one_error_line(capsys)
    assert f"--workload pretrain does not read {named}" in line


@pytest.mark.parametrize("flags,named", [(["--seq-len", "4096"], "--seq-len"),
                                         (["--global-batch", "64"], "--global-batch")])
def test_grpo_refuses_the_pretrain_flags(capsys, flags, named):
    """--seq-len/--global-batch shape --workload pretrain only; a GRPO plan dropped them."""
    assert main([*ESTIMATE, *flags]) == 2
    line = one_error_line(capsys)
    assert f"{named} is --workload pretrain's" in line


@pytest.mark.parametrize("flag", ["--first-stage-layers", "--last-stage-layers"])
def test_uneven_stages_need_a_pipeline(capsys, flag):
    """An uneven first/last stage at PP 1 was dropped; megatron-core raises 'Mismatch: 19
    middle layers remaining but 0 middle PP stages available'."""
    assert main([*ESTIMATE, flag, "17"]) == 2
    assert one_error_line(capsys) == (
        f"plan-parallel: error: {flag}: num_layers_in_first/last_pipeline_stage needs "
        f"pipeline_model_parallel_size > 1 (got 1; megatron-core finds the other layers no "
        f"middle stage)")


@pytest.mark.needs("verl")
@pytest.mark.parametrize("gpu_flags,line", [
    (["--gpu-type", "h200"], "predicted on H200:"),
    ([], "predicted on H100-80GB (pass --gpu-type to choose):"),
])
def test_diff_asks_for_gpu_type_only_when_it_was_not_given(tmp_path, capsys, monkeypatch,
                                                          gpu_flags, line):
    """diff said '(pass --gpu-type to choose)' after --gpu-type h200 was passed."""
    monkeypatch.setenv("PLAN_PARALLEL_NO_NVML", "1")
    job = tmp_path / "job"
    assert main(["plan", "--model", "qwen3-8b", "--gpus", "8", "--gpu-type", "h100", "--top",
                 "1", "--write", str(job)]) == 0
    capsys.readouterr()
    script = str(job / "run_grpo.sh")
    assert main(["diff", script, script, *gpu_flags]) == 0
    out = capsys.readouterr().out
    assert line in out.splitlines()


@pytest.mark.parametrize("command", [["doctor"], ["plan", "--model", "qwen3-8b"]])
def test_no_gpu_and_no_gpus_is_one_line(capsys, monkeypatch, command):
    """Without NVML and --gpus the error came after a note saying it was 'planning for
    H100-80GB': two lines for one refusal."""
    monkeypatch.setenv("PLAN_PARALLEL_NO_NVML", "1")
    assert main(command) == 2
    assert one_error_line(capsys) == ("plan-parallel: error: --gpus is required when no local "
                                      "GPU is detected")


@pytest.mark.parametrize("argv,flag", [
    (["explain", "--model", "qwen3-8b", "--gpus", "8", "--gpu-type", "h100", "--pp", "2"],
     "--pp 2"),  # was read as --ppo-epochs 2
    (["report", "--model", "qwen3-8b", "--gpus", "8", "--gpu-type", "h100", "--mode", "best"],
     "--mode best"),  # was read as --model best: "unknown model 'best'"
    (["report", "--model", "qwen3-8b", "--gpus", "8", "--gpu-type", "h100", "--ep", "8"],
     "--ep 8"),  # was read as --epochs 8
])
def test_an_option_of_another_command_is_never_read_as_a_longer_one(capsys, argv, flag):
    """argparse's prefix matching read an option this command lacks as the one it starts:
    explain --pp 2 planned two PPO epochs, report --mode best looked up model 'best'."""
    assert main(argv) == 2
    assert one_error_line(capsys).startswith(
        f"plan-parallel: error: unrecognized arguments: {flag.split()[0]}")


@pytest.mark.parametrize("value,text", [(-0.0, "+0%"), (0.0, "+0%"), (-0.004, "+0%"),
                                        (-0.006, "-1%"), (0.1, "+10%")])
def test_advise_never_prints_minus_zero_percent(value, text):
    """advise's re-plan line read 'best layout: <the job's own layout>: 355.2 s per step (-0%)'
    (a gain of zero, negated)."""
    from planner.diagnose.advice import _signed

    assert _signed(value) == text


@pytest.mark.needs("verl")
def test_validate_and_diff_round_each_memory_figure_once(capsys):
    """validate printed its per-phase GiB at one decimal from the JSON's two (ref 45.15x ->
    45.15 -> '45.1' where the exact 45.15x reads 45.2); diff did the same with the peak, the
    step time and the throughput.  The JSON keeps its two decimals."""
    job = "configs/Qwen2.5-7B_8xH100-80GB/run_grpo.sh"
    assert main(["validate", job, "--gpu-type", "h100", "--format", "json"]) == 0
    memory = json.loads(capsys.readouterr().out)["memory"]
    assert memory["memory_gib"]["ref"] == 45.15 and memory["working_set_gib"]["ref"] == 43.15
    assert main(["validate", job, "--gpu-type", "h100"]) == 0
    lines = capsys.readouterr().out.splitlines()
    peak = next(line for line in lines if line.startswith("nvidia-smi peak per phase"))
    working = next(line for line in lines if line.startswith("allocated working set per"))
    assert "ref 45.2 " in peak and "ref 43.2 " in working


def test_a_plan_that_fails_on_host_memory_says_so(capsys):
    """With --host-memory-gib 64 every layout's GPU peak fits but no node holds its host
    state: the plan said 'no layout fits in GPU memory' and 'closest: 59.8 GiB ... vs 79.6 GiB
    per GPU; add GPUs or use a larger GPU'."""
    assert main(["plan", "--model", "qwen3-8b", "--gpus", "8", "--gpu-type", "h100",
                 "--host-memory-gib", "64", "--top", "1"]) == 1
    out = capsys.readouterr().out
    assert "no layout fits in GPU memory" not in out
    assert "no layout fits in host memory" in out
    closest = next(line for line in out.splitlines() if line.startswith("closest:"))
    assert "GiB of host memory per node, over the 64.0 GiB per node (--host-memory-gib)" \
        in closest and "larger GPU" not in closest


@pytest.mark.parametrize("command", [["explain"], ["explain", "--mode", "best"],
                                     ["plan", "--write", "WRITE"], ["report", "--html", "HTML"]])
def test_every_no_fit_error_names_host_memory_when_that_is_the_cause(command, tmp_path, capsys):
    """explain, plan --write and report said 'add GPUs or use a larger GPU' where the plan's
    own table says host memory (planner.no_fit.remedy)."""
    command = [str(tmp_path / "out.html") if word == "HTML" else
               str(tmp_path / "job") if word == "WRITE" else word for word in command]
    assert main([*command, "--model", "qwen3-8b", "--gpus", "8", "--gpu-type", "h100",
                 "--host-memory-gib", "64"]) == 1
    err = capsys.readouterr().err
    assert "GiB of host memory per node, over the 64.0 GiB per node (--host-memory-gib): " \
           "raise it, or add GPUs" in err and "larger GPU" not in err
    assert not (tmp_path / "job").exists() and not (tmp_path / "out.html").exists()


def test_mode_best_table_says_why_no_mode_fits(capsys):
    """``plan --mode best`` with no mode fitting printed a table of 'no fit' rows and no
    reason; it names the colocated plan's remedy (here host memory, not more GPUs)."""
    assert main(["plan", "--model", "qwen3-8b", "--gpus", "8", "--gpu-type", "h100",
                 "--host-memory-gib", "64", "--mode", "best"]) == 1
    out = capsys.readouterr().out
    line = next(line for line in out.splitlines() if line.startswith("no plan fits"))
    assert line == ("no plan fits in any mode: its offloaded state needs 179.1 GiB of host "
                    "memory per node, over the 64.0 GiB per node (--host-memory-gib): raise it, "
                    "or add GPUs")


def test_mode_table_cells_round_once():
    """The split modes' table and estimate printed the JSON's 3-decimal seconds at one decimal
    (16.0496 s -> 16.05 -> '16.1'; once: '16.0'), and idle shares and rates likewise."""
    from types import SimpleNamespace

    from planner.report.mode_tables import _exact, _percent, _step_cell

    assert _step_cell(SimpleNamespace(timed=True), 16.0496) == "16.0"
    assert _step_cell(SimpleNamespace(timed=False), 16.0496) == "-"
    assert _step_cell(SimpleNamespace(timed=True), float("inf")) == "-"
    assert _percent(_exact(0.12495, 4)) == "12%"  # 0.1250 -> '13%' when rounded twice


def test_estimate_text_rounds_each_time_once(monkeypatch):
    """estimate printed its times at two decimals from the JSON's three (Qwen3-8B TP2 on 8
    H100s: weight_sync comm 0.0249x s -> 0.025 -> '0.03', generate compute 87.005x -> '87.00');
    every figure now reads its exact value rounded once."""
    from planner.catalog.models import resolve_model
    from planner.cli import inputs
    from planner.cli.args import build_parser
    from planner.cli.commands import estimate_layout_from_args
    from planner.modes import get_mode
    from planner.report.text import estimate_text
    from planner.search.space import SearchOptions

    monkeypatch.setenv("PLAN_PARALLEL_NO_NVML", "1")
    args = build_parser().parse_args([*ESTIMATE, "--micro-batch", "4", "--rollout-tp", "2"])
    model = resolve_model(args.model)
    cluster = inputs.resolve_cluster(args)
    workload = inputs.workload(args, model)
    layout = estimate_layout_from_args(args, model, cluster, workload)
    request = inputs.request(args, model, cluster, workload, SearchOptions())
    estimate = get_mode("sync").estimate(request, layout, True)
    text = estimate_text(estimate).splitlines()
    c = estimate.candidate
    for phase, parts in c.times.parts.items():
        line = next(row for row in text if row.startswith(f"  {phase}:"))
        for part, value in parts.items():
            if f"{value:.2f}" != "0.00":
                assert f"{part[:-2]} {value:.2f}" in line, (phase, part, value, line)
    time_line = next(row for row in text if row.startswith("time (s):"))
    assert f"-> step {c.step_time_s:.2f} s, {c.tokens_per_s_per_gpu:.0f} tokens/s/GPU" \
        in time_line


def test_explain_best_won_by_sync_claims_no_speed_up(capsys):
    """explain --mode best said 'sync wins, 671.8 s per step, a 1.00x speed-up over sync
    (671.8 s)' when sync itself won."""
    assert main(["explain", "--model", "qwen3-0.6b", "--gpus", "1", "--gpu-type", "h100",
                 "--mode", "best"]) == 0
    head = capsys.readouterr().out.splitlines()[0]
    assert "sync wins" in head and "speed-up over sync" not in head
    assert head.endswith("no other mode is faster")


@pytest.mark.parametrize("flags,message", [
    (["--trainer-gpus", "8", "--trainer-gpus", "8"], "--trainer-gpus 8 is given twice"),
    (["--trainer-gpus", "9999"],
     "--trainer-gpus 9999 leaves no rollout GPU of --gpus 16; valid: 1..15"),
])
def test_trainer_gpus_bad_values_are_named(capsys, flags, message):
    """A repeated --trainer-gpus planned the same split twice (#1 and #2 identical); one above
    the cluster said 'pools of 9999 trainer and -9983 rollout GPUs ... rollout pool of -9983
    GPUs is not whole nodes of 8'."""
    assert main(["plan", "--model", "qwen3-8b", "--gpus", "16", "--gpu-type", "h100",
                 "--mode", "one-step-off", *flags]) == 2
    assert message in one_error_line(capsys)
