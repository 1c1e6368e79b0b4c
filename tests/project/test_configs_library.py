"""configs/: the committed recommended configs are what the current planner produces, the index
lists them with their predictions, and every one passes `plan-parallel validate`."""

import json
from pathlib import Path

import pytest

from planner.diagnose.validate import JobInput, dry_run
from planner.policy import DEFAULT_POLICY
from planner.verl.library import (
    ENTRIES,
    INDEX_FILE,
    band_problems,
    differences,
    main,
    render_library,
)

CONFIGS = Path(__file__).resolve().parents[2] / "configs"
REQUIRED_MODELS = {"Qwen2.5-7B", "Qwen3-8B", "Qwen3-32B", "Qwen3-30B-A3B", "Qwen3-235B-A22B",
                   "Llama-3.1-8B", "Llama-3.1-70B", "DeepSeek-V3"}


@pytest.fixture(scope="module")
def rendered():
    return render_library()


def test_committed_configs_are_what_the_planner_produces(rendered):
    problems = differences(CONFIGS, rendered)
    assert problems == [], ("configs/ is stale; run `python -m planner.verl.library`:\n"
                            + "\n".join(problems))


def test_library_covers_the_common_pairs():
    assert {entry.model for entry in ENTRIES} >= REQUIRED_MODELS
    for model in REQUIRED_MODELS:
        assert {entry.gpu for entry in ENTRIES if entry.model == model} == \
            {"H100-80GB", "H20-96GB"}
    assert min(entry.gpus for entry in ENTRIES) == 8 and max(e.gpus for e in ENTRIES) == 256


def test_index_lists_every_config_with_its_predictions(rendered):
    index = rendered[INDEX_FILE]
    rows = [line for line in index.splitlines() if line.startswith("| ") and "---" not in line]
    assert len(rows) == len(ENTRIES) + 1  # header
    for entry, row in zip(ENTRIES, rows[1:]):
        plan = json.loads(rendered[f"{entry.directory}/plan.json"])
        prediction = plan["prediction"]
        assert row.startswith(f"| {entry.model} | {entry.gpus} x {entry.gpu} | TP"
                              f"{plan['layout']['tp']} PP{plan['layout']['pp']}")
        assert f"{prediction['peak_memory_gib']:.1f} GiB" in row
        assert f"{prediction['tokens_per_s_per_gpu']:.0f} tok/s/GPU" in row
        assert f"]({entry.directory}/)" in row
        assert prediction["fits"] and plan["rank"] == 1


def test_check_mode_reports_a_stale_library(rendered, tmp_path, capsys, monkeypatch):
    monkeypatch.setattr("planner.verl.library.render_library", lambda: rendered)
    assert main(["--out", str(tmp_path), "--check"]) == 1
    assert "missing" in capsys.readouterr().err
    assert main(["--out", str(tmp_path)]) == 0
    assert main(["--out", str(tmp_path), "--check"]) == 0
    (tmp_path / ENTRIES[0].directory / "plan.json").write_text("{}\n")
    (tmp_path / "stray").mkdir()
    assert main(["--out", str(tmp_path), "--check"]) == 1
    err = capsys.readouterr().err
    assert "out of date" in err and "not in the library" in err


def test_every_committed_config_sits_inside_the_memory_band():
    """Issue 14: all 16 recommended configs sit inside the default band (none needs a reason
    today), and --check enforces the policy on the committed files."""
    assert band_problems(CONFIGS) == []
    for entry in ENTRIES:
        prediction = json.loads((CONFIGS / entry.directory / "plan.json").read_text())[
            "prediction"]
        assert DEFAULT_POLICY.position(prediction["memory_utilization"]) == "inside", entry


def test_check_rejects_a_config_outside_the_band_without_a_reason(rendered, tmp_path, capsys,
                                                                  monkeypatch):
    monkeypatch.setattr("planner.verl.library.render_library", lambda: rendered)
    assert main(["--out", str(tmp_path)]) == 0
    entry = ENTRIES[0]
    plan_path = tmp_path / entry.directory / "plan.json"
    data = json.loads(plan_path.read_text())
    data["prediction"]["memory_utilization"] = 0.92
    plan_path.write_text(json.dumps(data))
    problems = band_problems(tmp_path)
    assert len(problems) == 1 and "above the 70-85% band" in problems[0]
    assert entry.directory in problems[0]
    # a stated reason in its README row satisfies the policy
    index = tmp_path / INDEX_FILE
    index.write_text(index.read_text().replace(
        f"| inside | {rendered[INDEX_FILE].split(f']({entry.directory}/)')[0].split('| inside | ')[1]}",
        "| above: no layout fits below 85% | " + rendered[INDEX_FILE].split(
            f"]({entry.directory}/)")[0].split("| inside | ")[1], 1))
    assert band_problems(tmp_path) == []


@pytest.mark.needs("verl")
@pytest.mark.parametrize("entry", ENTRIES, ids=lambda entry: entry.directory)
def test_every_config_passes_validate(entry):
    """Each config passes validate, and fix agrees with validate on it: the same nvidia-smi
    peak, inside the band, nothing to fix and no memory warning."""
    from planner.diagnose.fix import fix_job

    plan = json.loads((CONFIGS / entry.directory / "plan.json").read_text())
    fixed = fix_job(JobInput(inputs=(str(CONFIGS / entry.directory / "run_grpo.sh"),),
                             gpu_type=entry.gpu))
    assert fixed.data["in_band"] and fixed.data["mitigations"] == []
    assert fixed.data["current"]["peak_memory_gib"] == plan["prediction"]["peak_memory_gib"]
    for name in ("run_grpo.sh", "grpo.yaml"):
        report = fixed.report if name == "run_grpo.sh" else dry_run(
            JobInput(inputs=(str(CONFIGS / entry.directory / name),), gpu_type=entry.gpu)).report
        assert report["memory"]["memory_band"]["position"] == "inside"
        assert not [f for f in report["findings"] if f["check"] == "memory"]
        assert report["would_launch"], report["findings"]
        assert [f for f in report["findings"] if f["level"] == "error"] == []
        assert report["model"] == entry.model
        assert report["layout"] == plan["layout"]
        assert report["memory"]["peak_memory_gib"] == plan["prediction"]["peak_memory_gib"]
