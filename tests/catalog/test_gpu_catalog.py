"""The cards small RL jobs still run on (issue 26): data-sheet figures, V100's FP16, which rollout
engine runs where, where an uncalibrated GPU's efficiencies come from, and the seed guide's
V100 path in `explain`."""

import json

import pytest

from planner.catalog.engines import engine_problem, training_precision
from planner.catalog.hardware import DetectedGpus, get_gpu, gpu_from_detected
from planner.cli.main import main
from planner.cost.efficiency import efficiency_source, load_efficiency
from planner.errors import PlanInputError

JOB = ["--model", "qwen2.5-7b", "--gpus", "8", "--gpu-type", "v100"]


@pytest.mark.parametrize("alias,name,gib,tflops,fp8_tflops,memory_tb_s,cc", [
    ("v100-16gb", "V100-16GB", 15.8, 125, 0, 0.9, (7, 0)),
    ("v100", "V100-32GB", 31.7, 125, 0, 0.9, (7, 0)),
    ("a10", "A10", 22.5, 125, 0, 0.6, (8, 6)),
    ("a10g", "A10G", 22.5, 70, 0, 0.6, (8, 6)),
    ("l4", "L4", 22.5, 121, 242.5, 0.3, (8, 9)),
    ("l40", "L40", 45.0, 181, 362, 0.864, (8, 9)),
    ("rtx4090", "RTX-4090", 24.0, 165.2, 330.3, 1.008, (8, 9)),
    ("h20-141gb", "H20-141GB", 140.4, 148, 296, 4.8, (9, 0)),
    ("h200-nvl", "H200-NVL", 140.4, 835.5, 1670.5, 4.8, (9, 0)),
])
def test_data_sheet_figures(alias, name, gib, tflops, fp8_tflops, memory_tb_s, cc):
    gpu = get_gpu(alias)
    assert gpu.name == name
    assert gpu.memory_gib == pytest.approx(gib, abs=0.1)
    assert gpu.bf16_flops == pytest.approx(tflops * 1e12)
    assert gpu.fp8_flops == pytest.approx(fp8_tflops * 1e12)
    assert gpu.hbm_bandwidth_bytes_per_s == pytest.approx(memory_tb_s * 1e12)
    assert gpu.compute_capability == cc
    assert gpu.bf16 == (cc >= (8, 0))


@pytest.mark.parametrize("device,memory_gib,name", [
    ("Tesla V100-SXM2-32GB", 32, "V100-32GB"), ("Tesla V100-SXM2-16GB", 16, "V100-16GB"),
    ("NVIDIA A10", 24, "A10"), ("NVIDIA A10G", 24, "A10G"), ("NVIDIA L4", 24, "L4"),
    ("NVIDIA L40", 48, "L40"), ("NVIDIA L40S", 48, "L40S"),
    ("NVIDIA GeForce RTX 4090", 24, "RTX-4090"), ("NVIDIA H200 NVL", 141, "H200-NVL"),
    ("NVIDIA H200", 141, "H200"), ("NVIDIA H20", 96, "H20-96GB"), ("NVIDIA H20", 141, "H20-141GB"),
    ("NVIDIA A100-SXM4-80GB", 80, "A100-80GB"),
])
def test_nvml_names(device, memory_gib, name):
    detected = DetectedGpus(device, 8, memory_gib * 1024**3)
    assert gpu_from_detected(detected).name == name


def test_a_short_nvml_name_is_not_found_inside_a_longer_one():
    """"A10" is not in "A100-PCIE-40GB" (a part the catalog lacks: an input error, not an A10)."""
    with pytest.raises(PlanInputError, match="not in the catalog"):
        gpu_from_detected(DetectedGpus("NVIDIA A100-PCIE-40GB", 8, 40 * 1024**3))


def test_precision_on_a_part_without_bf16():
    v100, h100 = get_gpu("v100"), get_gpu("h100")
    assert training_precision(h100, None) == ("bf16", None)
    precision, why = training_precision(v100, None)
    assert precision == "fp16" and "no BF16 tensor cores (sm_70" in why
    assert training_precision(v100, "fp16") == ("fp16", None)
    for asked in ("bf16", "fp8"):
        with pytest.raises(PlanInputError, match=f"--precision {asked}: V100-32GB has no"):
            training_precision(v100, asked)


def test_which_pinned_engine_runs_where():
    for name in ("a10", "l4", "rtx4090", "a100", "h100", "b200"):
        assert engine_problem(get_gpu(name), "vllm") is None
        assert engine_problem(get_gpu(name), "sglang") is None
    assert engine_problem(get_gpu("mi300x"), "vllm") is None  # ROCm builds: no CUDA check
    problem = engine_problem(get_gpu("v100"), "vllm")
    assert "vLLM 0.24.0" in problem and "sm_75+" in problem and "(sm_70)" in problem
    assert "nor does SGLang 0.5.12 (sm_80+)" in problem and "CUDA 12.8" in problem
    assert "SGLang 0.5.12" in engine_problem(get_gpu("v100-16gb"), "sglang")


def test_an_uncalibrated_gpu_borrows_its_donor_and_says_so():
    """A part the calibration file predates takes its donor's efficiencies at load time
    (efficiency.DONORS), not the median; the words say it is uncalibrated."""
    v100, a100, h100 = get_gpu("v100"), get_gpu("a100"), get_gpu("h100")
    assert load_efficiency(v100, "fp16") == load_efficiency(a100, "bf16")
    assert load_efficiency(get_gpu("h20-141gb"), "bf16") == load_efficiency(h100, "bf16")
    assert efficiency_source(v100, "fp16").startswith("uncalibrated: no V100-32GB measurements; "
                                                      "efficiencies of A100-80GB/bf16")
    assert efficiency_source(h100, "bf16").startswith("calibrated: 27 measurements")
    assert "median" in efficiency_source(get_gpu("mi300x"), "bf16")


def test_v100_plan_answers_in_fp16_with_its_notes(capsys):
    code = main(["plan", *JOB, "--top", "1", "--format", "json"])
    out, err = capsys.readouterr()
    assert code == 0
    plan = json.loads(out)
    assert plan["workload"]["precision"] == "fp16"
    notes = [line for line in err.splitlines() if line.startswith("note: ")]
    assert len(notes) == 3 and len(err.splitlines()) == 3
    assert "V100-32GB has no BF16 tensor cores" in notes[0] and "FP16" in notes[0]
    assert "vLLM 0.24.0" in notes[1] and "what can: vLLM built for CUDA 12.8" in notes[1]
    assert "uncalibrated" in notes[2] and "A100-80GB" in notes[2]


def test_bf16_on_v100_is_one_line_and_exit_2(capsys):
    assert main(["plan", *JOB, "--precision", "bf16"]) == 2
    _, err = capsys.readouterr()
    assert err.strip().splitlines() == [
        "plan-parallel: error: --precision bf16: V100-32GB has no BF16 tensor cores (sm_70; "
        "BF16 needs sm_80+, FP8 sm_89+); valid: fp16"]


def test_an_error_drops_the_notes(capsys):
    assert main(["plan", *JOB, "--no-offload", "--param-offload"]) == 2  # after the GPU
    _, err = capsys.readouterr()
    assert len(err.strip().splitlines()) == 1 and "note:" not in err


def test_v100_job_exports_fp16_everywhere(tmp_path, capsys):
    assert main(["plan", *JOB, "--write", str(tmp_path / "job"), "--top", "1"]) == 0
    script = (tmp_path / "job" / "run_grpo.sh").read_text()
    for key in ("actor.megatron.dtype", "ref.megatron.dtype", "rollout.dtype"):
        assert f"actor_rollout_ref.{key}=float16" in script


@pytest.mark.needs("verl")
def test_validate_refuses_bf16_on_v100(capsys):
    from pathlib import Path

    script = Path(__file__).resolve().parents[1] / "verl_examples" / "run_qwen2-7b_math_megatron.sh"
    code = main(["validate", str(script), "--gpu-type", "v100", "--model", "qwen2-7b"])
    out, _ = capsys.readouterr()
    assert code == 1
    assert "error: [precision] V100-32GB has no BF16 tensor cores" in out
    assert "actor_rollout_ref.rollout.dtype=float16" in out
    assert "warning: [rollout_engine] vLLM 0.24.0" in out


def test_explain_compares_the_seed_guide_path(capsys):
    """`explain` on the seed guide's own job scores its V100 path (TP2 x PP4, FP16, fixed
    micro-batches of 8) with the planner's search and says how the plan compares, and why."""
    code = main(["explain", *JOB, "--format", "json"])
    out, _ = capsys.readouterr()
    assert code == 0
    result = json.loads(out)
    seed = result["rules_of_thumb"][0]
    assert seed["rule"] == "seed guide: 7B -> 8xV100 -> TP x PP 2x4 -> FP16 -> micro-batch 8"
    layout = seed["layout"]
    assert (layout["tp"], layout["pp"], layout["micro_batch"]) == (2, 4, 8)
    assert layout["dynamic_batch"] is False
    assert seed["peak_memory_gib"] < get_gpu("v100").memory_gib  # it fits
    chosen = result["chosen"]["step_time_s"]
    assert seed["step_time_s"] > chosen
    assert seed["verdict"].startswith(f"plan {seed['step_time_s'] / chosen:.2f}x faster")
    assert "update_actor" in seed["verdict"] and "recompute full" in seed["verdict"]
    precision = result["rules_of_thumb"][-1]["verdict"]
    assert precision.startswith("V100-32GB has no BF16 tensor cores, so FP16")
    assert main(["explain", *JOB]) == 0
    text, _ = capsys.readouterr()
    assert "- seed guide: 7B -> 8xV100 -> TP x PP 2x4 -> FP16 -> micro-batch 8: best such " \
           "layout TP2 PP4 EP1 DP1 micro-batch 8" in text


@pytest.mark.parametrize("gpu_type,name,capability", [("a100", "A100-80GB", "sm_80"),
                                                      ("a10g", "A10G", "sm_86")])
def test_fp8_on_a_part_without_fp8_is_one_line_and_exit_2(gpu_type, name, capability, capsys):
    """Transformer Engine trains FP8 from sm_89 only; an A100 plan at --precision fp8 was
    answered at the BF16 rate with FP8-sized weights, a job that cannot run."""
    with pytest.raises(PlanInputError, match=f"--precision fp8: {name} has no FP8"):
        training_precision(get_gpu(gpu_type), "fp8")
    assert training_precision(get_gpu("l4"), "fp8") == ("fp8", None)
    assert main(["plan", "--model", "qwen3-8b", "--gpus", "8", "--gpu-type", gpu_type,
                 "--precision", "fp8"]) == 2
    _, err = capsys.readouterr()
    assert err.strip().splitlines() == [
        f"plan-parallel: error: --precision fp8: {name} has no FP8 tensor cores ({capability}; "
        f"FP8 needs sm_89+); valid: bf16, fp16"]


@pytest.mark.parametrize("asked,gpu_types,name", [("fp8", "h100,a100", "A100-80GB"),
                                                  ("bf16", "h100,v100", "V100-32GB")])
def test_sizing_refuses_a_precision_one_swept_part_lacks(asked, gpu_types, name, capsys):
    """Sizing several GPU types at an explicit --precision sized the part without it silently
    (V100 at 'bf16', A100 at 'fp8'), with no line saying so."""
    assert main(["plan", "--model", "qwen3-8b", "--gpus", "8", "--gpu-type", gpu_types,
                 "--precision", asked]) == 2
    _, err = capsys.readouterr()
    lines = err.strip().splitlines()
    assert len(lines) == 1 and f"--precision {asked}: {name} has no {asked.upper()}" in lines[0]
