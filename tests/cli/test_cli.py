"""The command line: contract of the JSON output, exit codes, one-line errors, fast start."""

import json
import os
import subprocess
import sys

import pytest
from conftest import cluster
from fixtures.imports import imported_by

from planner.catalog.models import resolve_model
from planner.catalog.workload import GrpoWorkload
from planner.cli.args import SUBCOMMANDS
from planner.cli.main import main
from planner.cost.request import PlanRequest
from planner.plan import make_plan


def run(capsys, *argv):
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def test_plan_table_for_qwen3_30b_on_16_gpus(capsys):
    code, out, err = run(capsys, "--model", "qwen3-30b", "--gpus", "16", "--gpu-type", "h100")
    assert code == 0
    assert "Qwen3-30B-A3B" in out and "16 x H100-80GB" in out and "rejected:" in out
    assert out.count("\n") > 8


def test_plan_json_contract(capsys):
    code, out, _ = run(capsys, "--model", "qwen2.5-7b", "--gpus", "8", "--gpu-type", "h100",
                       "--format", "json", "--top", "3")
    assert code == 0
    data = json.loads(out)
    assert {"model", "cluster", "workload", "candidates", "rejected", "enumerated"} <= set(data)
    assert len(data["candidates"]) == 3
    candidate = data["candidates"][0]
    assert set(candidate["layout"]) >= {"tp", "pp", "vpp", "cp", "ep", "etp", "dp", "micro_batch",
                                        "recompute", "param_offload", "optimizer_offload",
                                        "rollout_tp", "rollout_dp", "rollout_ep",
                                        "gpu_memory_utilization"}
    assert set(candidate["memory_gib"]) == {"generate", "old_log_prob", "ref", "update_actor",
                                            "weight_sync"}
    assert candidate["fits"] is True
    assert candidate["peak_memory_gib"] == max(candidate["memory_gib"].values())
    assert data["enumerated"] == data["valid"] + sum(data["rejected"].values())
    layout = candidate["layout"]
    assert layout["tp"] * layout["pp"] * layout["cp"] * layout["dp"] == 8


def test_plan_csv(capsys):
    code, out, _ = run(capsys, "--model", "qwen3-8b", "--gpus", "8", "--gpu-type", "h20",
                       "--format", "csv", "--top", "5")
    lines = out.strip().splitlines()
    assert code == 0 and len(lines) == 6 and lines[0].startswith("rank,tp,pp")


def test_pins_and_no_offload(capsys):
    code, out, _ = run(capsys, "--model", "qwen3-8b", "--gpus", "8", "--gpu-type", "h100",
                       "--tp", "2", "--no-offload", "--format", "json", "--top", "50")
    candidates = json.loads(out)["candidates"]
    assert code == 0 and candidates
    assert all(c["layout"]["tp"] == 2 and not c["layout"]["param_offload"]
               and not c["layout"]["optimizer_offload"] for c in candidates)


def test_estimate_one_layout(capsys):
    code, out, _ = run(capsys, "estimate", "--model", "qwen2.5-7b", "--gpus", "8",
                       "--gpu-type", "h100", "--tp", "2", "--pp", "2", "--micro-batch", "2",
                       "--format", "json")
    data = json.loads(out)
    assert code == 0 and data["valid"] and data["layout"]["dp"] == 2
    assert data["breakdown_gib"]["weights"] > 0 and data["breakdown_gib"]["kv_cache"] > 0


def test_estimate_invalid_layout_exits_1_with_the_rule(capsys):
    code, out, err = run(capsys, "estimate", "--model", "qwen2.5-7b", "--gpus", "8",
                         "--gpu-type", "h100", "--tp", "8")
    assert code == 1
    assert "tp_divides_heads" in err and "28" in err


@pytest.mark.parametrize("argv,needle", [
    (["--model", "qwen9", "--gpus", "8"], "unknown model 'qwen9'"),
    (["--model", "qwen3-8b", "--gpus", "0", "--gpu-type", "h100"], "--gpus: '0' is outside 1.."),
    (["--model", "qwen3-8b", "--gpus", "12", "--gpu-type", "h100"], "multiple of --gpus-per-node"),
    (["--model", "qwen3-8b", "--gpus", "8", "--gpu-type", "h300"], "unknown GPU type 'h300'"),
    (["--model", "qwen3-8b", "--gpus", "8", "--top", "0", "--gpu-type", "h100"], "--top"),
    (["--model", "qwen3-8b", "--gpus", "8", "--no-offload", "--param-offload",
      "--gpu-type", "h100"], "contradicts"),
    (["--model", "qwen3-8b", "--gpus", "eight"], "'eight' is not an integer"),
    (["--model", "qwen3-8b", "--gpus", "8", "--format", "xml"], "invalid choice"),
    (["estimate", "--model", "qwen3-8b", "--gpus", "8", "--gpu-type", "h100",
      "--recompute", "some"], "invalid choice"),
    (["--model", "qwen3-8b", "--gpus", "8", "--gpu-type", "h100", "--train-batch-size", "16",
      "--mini-batch-size", "32"], "exceeds --train-batch-size"),
    (["--model", "qwen3-8b", "--gpus", "8", "--gpu-type", "h100", "--workload", "pretrain",
      "--rollout-tp", "2"], "drop --rollout-tp"),
    (["--model", "qwen3-8b", "--gpus", "8", "--gpu-type", "h100", "--mean-response-length",
      "5000"], "--mean-response-length 5000"),
    # 0 was read as "not given": the default lengths, silently
    (["--model", "qwen3-8b", "--gpus", "8", "--gpu-type", "h100", "--mean-response-length",
      "0"], "--mean-response-length: '0' is outside 1.."),
    (["estimate", "--model", "qwen3-8b", "--gpus", "8", "--gpu-type", "h100",
      "--mean-prompt-length", "0"], "--mean-prompt-length: '0' is outside 1.."),
])
def test_bad_input_is_one_line_exit_2(capsys, argv, needle):
    code, out, err = run(capsys, *argv)
    assert code == 2
    error_lines = [line for line in err.splitlines() if not line.startswith("note:")]
    assert len(error_lines) == 1 and needle in error_lines[0], err
    assert "Traceback" not in err


def test_bad_input_in_a_real_process_has_no_traceback(tmp_path):
    bad = tmp_path / "config.json"
    bad.write_text("{broken")
    result = subprocess.run([sys.executable, "-m", "planner", "--model", str(bad), "--gpus", "8",
                             "--gpu-type", "h100"], capture_output=True, text=True)
    assert result.returncode == 2
    assert "Traceback" not in result.stderr and "cannot read" in result.stderr


def test_help_does_not_import_heavy_packages():
    heavy, output = imported_by(["--help"], ("torch", "verl", "optuna", "transformers",
                                             "pandas", "numpy", "megatron"))
    assert heavy == [], output
    assert "plan-parallel" in output


def test_a_plain_plan_imports_neither_pandas_nor_importlib_metadata():
    # the text table reads the plan's numpy columns; versions are read off the dist-info
    heavy, output = imported_by(["--model", "qwen3-8b", "--gpus", "8", "--gpu-type", "h100",
                                 "--top", "2"],
                                ("pandas", "pyarrow", "importlib.metadata", "email",
                                 # what the text plan does not use: export, sizing, split tables
                                 "planner.verl.export", "planner.verl.files",
                                 "planner.report.mode_tables", "planner.sizing.sweep",
                                 "planner.cli.sizing", "numpy.ma",
                                 # the split modes and the verl tables they read
                                 "planner.modes.split", "planner.modes.one_step_off",
                                 "planner.modes.fully_async", "planner.verl.keymap",
                                 "zipfile", "gzip"))
    assert heavy == [], output
    assert "fit in memory" in output and "\n2  " in output and "\n3  " not in output


_BLAS_THREADS = """
import os, sys
from planner.cli.main import main
code = main({argv!r})
print("THREADS", len(os.listdir("/proc/self/task")), os.environ.get("OPENBLAS_NUM_THREADS"))
"""


@pytest.mark.skipif(not os.path.isdir("/proc/self/task"), reason="reads /proc/self/task")
@pytest.mark.parametrize("user", [None, "2"])
def test_a_plan_loads_numpys_blas_with_one_thread_and_leaves_the_environment(user):
    # the planner calls no BLAS routine: OpenBLAS's per-core threads (started as numpy loads)
    # are left out while the command's modules import, and the variable is gone after; a
    # user's own setting stays, and with it OpenBLAS's threads (on a machine of 2+ cores)
    env = {k: v for k, v in os.environ.items() if k != "OPENBLAS_NUM_THREADS"}
    if user:
        env["OPENBLAS_NUM_THREADS"] = user
    argv = ["--model", "qwen3-8b", "--gpus", "8", "--gpu-type", "h100", "--top", "1"]
    result = subprocess.run([sys.executable, "-c", _BLAS_THREADS.format(argv=argv)],
                            capture_output=True, text=True, env=env)
    line = [x for x in result.stdout.splitlines() if x.startswith("THREADS ")]
    assert line, result.stdout + result.stderr
    _, threads, setting = line[-1].split()
    assert setting == str(user)
    if user is None:
        assert threads == "1"
    elif (os.cpu_count() or 1) > 1:
        assert int(threads) > 1


def test_models_and_gpus_listings(capsys):
    code, out, _ = run(capsys, "models")
    assert code == 0 and "DeepSeek-V3" in out and "671.03B" in out
    code, out, _ = run(capsys, "gpus", "--format", "json")
    assert code == 0 and any(g["name"] == "GB300" for g in json.loads(out))


@pytest.mark.parametrize("argv,needle", [
    (["estimate", "--model", "qwen3-8b", "--gpus", "8", "--gpu-type", "h100", "--tp", "0"],
     "--tp: '0' is outside 1.."),
    (["estimate", "--model", "qwen3-8b", "--gpus", "8", "--gpu-type", "h100",
      "--gpu-memory-utilization", "0"], "--gpu-memory-utilization: '0' is outside 0.05..0.99"),
    (["--model", "qwen3-8b", "--gpus", "8", "--gpu-type", "h100", "--gpu-memory-utilization",
      "5"], "--gpu-memory-utilization: '5' is outside 0.05..0.99"),
    (["--model", "qwen3-8b", "--gpus", "8", "--gpu-type", "h100", "--gpus-per-node", "0"],
     "--gpus-per-node: '0' is outside 1.."),
])
def test_zero_and_out_of_range_values_are_refused(capsys, argv, needle):
    assert main(argv) == 2
    assert needle in capsys.readouterr().err


def test_config_json_with_a_non_numeric_size(tmp_path, capsys):
    path = tmp_path / "config.json"
    path.write_text(json.dumps({"model_type": "llama", "hidden_size": "abc"}))
    assert main(["--model", str(path), "--gpus", "8", "--gpu-type", "h100"]) == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err and len(err.strip().splitlines()) == 1


@pytest.mark.parametrize("content", ['{"shared": {"nvlink": "x"}}', '{"shared": {"gemm": -1}}',
                                     '{"by_gpu": {"H100-80GB/bf16": {"gemm": 7}}}'])
def test_bad_calibration_values(tmp_path, capsys, content):
    path = tmp_path / "cal.json"
    path.write_text(content)
    assert main(["estimate", "--model", "qwen3-8b", "--gpus", "8", "--gpu-type", "h100",
                 "--calibration", str(path)]) == 2
    assert "is not a number in" in capsys.readouterr().err


def test_closest_layout_is_the_smallest_when_nothing_fits(capsys):
    # "no layout fits" is a "no" answer: exit 1, as for every command
    assert main(["--model", "llama3.1-405b", "--gpus", "16", "--gpu-type", "h100"]) == 1
    out = capsys.readouterr().out
    assert "no layout fits" in out
    closest = float(out.split("closest: ")[1].split(" GiB")[0])
    # the smallest peak of any layout (full recompute, every offload, the CPU optimizer), not
    # the fastest misfit
    plan = make_plan(PlanRequest(resolve_model("llama3.1-405b"), cluster(16), GrpoWorkload()))
    assert closest == pytest.approx(plan.candidates["peak_memory_gib"].min(), abs=0.05)
    assert plan.candidates.iloc[0]["recompute"] == "full"


ESTIMATE_8B = ["estimate", "--model", "qwen3-8b", "--gpus", "8", "--gpu-type", "h100", "--tp",
               "2", "--micro-batch", "4", "--rollout-tp", "2"]


def test_estimate_of_a_rollout_pool_below_its_weights(capsys):
    """Qwen3-30B at TP1 on 8 GPUs holds 275 GiB of trainer state: the picked
    gpu_memory_utilization fell to its 0.05 floor, the generate phase's peak left out the
    rollout's 57 GiB of weights (below its own allocated working set), and '0 KV tokens' went
    unexplained.  vLLM loads its weights before it sizes the cache and then stops."""
    code, out, _ = run(capsys, "estimate", "--model", "qwen3-30b", "--gpus", "8", "--gpu-type",
                       "h100", "--tp", "1", "--rollout-tp", "1")
    assert code == 1
    lines = out.splitlines()

    def per_phase(prefix):
        line = next(line for line in lines if line.startswith(prefix))
        return float(line.split("generate ")[1].split()[0])

    assert per_phase("nvidia-smi peak per phase") >= per_phase("allocated working set per phase")
    rollout = next(line for line in lines if line.startswith("rollout:"))
    assert "gpu_memory_utilization 0.05 = 4.0 GiB, is below the rollout's weights" in rollout
    assert "No available memory for the cache blocks" in rollout
    assert "no gpu_memory_utilization leaves room" in rollout
    code, out, _ = run(capsys, "estimate", "--model", "qwen3-30b", "--gpus", "8", "--gpu-type",
                       "h100", "--tp", "1", "--rollout-tp", "1", "--gpu-memory-utilization",
                       "0.3")
    rollout = next(line for line in out.splitlines() if line.startswith("rollout:"))
    assert "0.30 = 23.9 GiB, is below" in rollout and "leaves room" not in rollout


def test_estimate_names_why_a_layout_inside_the_band_does_not_fit(capsys):
    """'fits: NO' used to quote a peak inside the band and stop there: a rollout pool too small
    for one sequence, or offloaded state beyond the host's memory, went unsaid."""
    code, out, _ = run(capsys, *ESTIMATE_8B, "--gpu-memory-utilization", "0.08")
    assert code == 1
    fits = next(line for line in out.splitlines() if line.startswith("fits:"))
    assert "gpu_memory_utilization 0.08 holds 0 KV tokens per GPU" in fits
    assert "2,048-token sequence" in fits
    code, out, _ = run(capsys, *ESTIMATE_8B, "--param-offload", "--optimizer-offload",
                       "--host-memory-gib", "16")
    assert code == 1
    fits = next(line for line in out.splitlines() if line.startswith("fits:"))
    assert "host memory" in fits and "16.0 GiB per node (--host-memory-gib)" in fits


def test_estimate_json_is_strict_json_when_the_pool_holds_no_sequence(capsys):
    """The filled-GPU step of a layout whose own generation cannot run was NaN (inf - inf),
    which strict JSON readers (jq, JavaScript) refuse; the text said 'step inf -> nan s'."""
    code, out, _ = run(capsys, *ESTIMATE_8B, "--gpu-memory-utilization", "0.08",
                       "--format", "json")
    data = json.loads(out, parse_constant=lambda name: pytest.fail(f"{name} in JSON"))
    fill = data["fill_gpu"]
    assert fill["generate_s"] > 0 and 0 < fill["step_time_s"] < 10_000
    _, text, _ = run(capsys, *ESTIMATE_8B, "--gpu-memory-utilization", "0.08")
    assert "nan" not in text


@pytest.mark.needs("verl")
def test_validate_takes_overrides_after_its_options(capsys):
    """`validate PATH --gpu-type h100 -- KEY=VALUE` (the order README's example invites) was
    refused with 'unrecognized arguments: -- KEY=VALUE': argparse takes a positional list
    once, before the options."""
    script = "configs/Qwen3-8B_8xH100-80GB/run_grpo.sh"
    override = "actor_rollout_ref.rollout.gpu_memory_utilization=0.97"
    late = run(capsys, "validate", script, "--gpu-type", "h100", "--format", "json", "--",
               override)
    early = run(capsys, "validate", "--gpu-type", "h100", "--format", "json", script, "--",
                override)
    assert late[0] == early[0] and "unrecognized" not in late[2]
    assert json.loads(late[1]) == json.loads(early[1])
    code, _, err = run(capsys, "validate", script, "--gpu-type", "h100", "--no-such-flag")
    assert code == 2 and "unrecognized arguments: --no-such-flag" in err


def test_estimate_warns_of_a_pipeline_starved_of_micro_batches(capsys):
    """One sequence per DP rank through four pipeline stages: the bubble is 75% of the update,
    and estimate said only 'unwise: pipeline_starved'.  It now names the numbers and the fixes,
    in text and in JSON; a fed pipeline gets neither."""
    starved = ["estimate", "--model", "qwen3-8b", "--gpus", "16", "--gpu-type", "h100",
               "--train-batch-size", "2", "--mini-batch-size", "2", "--rollout-n", "1",
               "--tp", "2", "--pp", "4", "--micro-batch", "1"]
    _, out, _ = run(capsys, *starved)
    warning = next(line for line in out.splitlines() if line.startswith("warning: the pipeline"))
    assert "1 micro-batch(es) per optimizer step on each DP rank (1 sequences)" in warning
    assert "4 pipeline stages" in warning and "75% of the update is pipeline bubble" in warning
    assert "PP 1" in warning and "--mini-batch-size >= 8" in warning  # 4 stages x DP2 / n 1
    _, out, _ = run(capsys, *starved, "--format", "json")
    assert json.loads(out)["pipeline_starved"] == {
        "micro_batches_per_step": 1, "pipeline_stages": 4, "sequences_per_dp_rank": 1.0,
        "bubble_fraction": 0.75, "fixes": ["PP 1", "--mini-batch-size >= 8", "fewer DP ranks"]}
    fed = [*starved[:7], "--train-batch-size", "8", "--mini-batch-size", "8", *starved[11:]]
    _, out, _ = run(capsys, *fed)
    assert "warning: the pipeline" not in out
    _, out, _ = run(capsys, *fed, "--format", "json")
    assert json.loads(out)["pipeline_starved"] is None


def test_estimate_names_a_picked_utilization_without_room_as_such(capsys):
    """Qwen3-30B at TP1 on 8 GPUs: no gpu_memory_utilization leaves vLLM room beside 275 GiB of
    trainer state, and estimate showed 'at gpu_memory_utilization 0.05' as if it were a setting,
    with a fits line that said only the peak.  Header and note now say none leaves room (the
    0.05 floor is what is scored), and the fits line says why."""
    code, out, err = run(capsys, "estimate", "--model", "qwen3-30b", "--gpus", "8",
                         "--gpu-type", "h100", "--tp", "1")
    assert code == 1
    header, fits = out.splitlines()[:2]
    shown = "with no gpu_memory_utilization that leaves room (scored at the floor, 0.05)"
    assert shown in header and "at gpu_memory_utilization" not in header
    assert shown in err
    assert fits.startswith("fits: NO") and fits.endswith(
        "; no gpu_memory_utilization leaves the rollout room for its weights and workspace "
        "beside the trainer's state (see rollout:)")
    # a utilization the user pinned is theirs: shown as given
    _, out, _ = run(capsys, "estimate", "--model", "qwen3-30b", "--gpus", "8", "--gpu-type",
                    "h100", "--tp", "1", "--gpu-memory-utilization", "0.3")
    assert "at gpu_memory_utilization 0.30" in out.splitlines()[0]


@pytest.mark.parametrize("command", SUBCOMMANDS)
def test_a_commands_own_parser_is_the_full_parsers(command):
    # main() builds the parser of the command it runs alone: the same help, defaults and
    # parsed values as under the full parser
    from planner.cli.args import build_parser

    def sub(parser):
        action = next(a for a in parser._actions if a.dest == "command")
        return action.choices[command]

    alone, full = build_parser(command), build_parser()
    assert set(next(a for a in alone._actions if a.dest == "command").choices) <= \
        {command, "models", "gpus"}
    assert sub(alone).format_help() == sub(full).format_help()
    assert [(a.dest, a.option_strings, a.default, a.required) for a in sub(alone)._actions] == \
        [(a.dest, a.option_strings, a.default, a.required) for a in sub(full)._actions]
    if command == "plan":
        argv = ["plan", "--model", "qwen3-8b", "--gpus", "8", "--top", "3"]
        assert vars(alone.parse_known_args(argv)[0]) == vars(full.parse_known_args(argv)[0])
