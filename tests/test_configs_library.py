"""configs/: the committed recommended configs are what the current planner produces, the index
lists them with their predictions, and every one passes `plan-parallel validate`."""

import json
from pathlib import Path

import pytest

from planner.diagnose.validate import JobInput, dry_run
from planner.verl.library import ENTRIES, INDEX_FILE, differences, main, render_library

CONFIGS = Path(__file__).resolve().parents[1] / "configs"
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


@pytest.mark.needs("verl")
@pytest.mark.parametrize("entry", ENTRIES, ids=lambda entry: entry.directory)
def test_every_config_passes_validate(entry):
    plan = json.loads((CONFIGS / entry.directory / "plan.json").read_text())
    for name in ("run_grpo.sh", "grpo.yaml"):
        report = dry_run(JobInput(inputs=(str(CONFIGS / entry.directory / name),),
                                  gpu_type=entry.gpu))
        assert report["would_launch"], report["findings"]
        assert [f for f in report["findings"] if f["level"] == "error"] == []
        assert report["model"] == entry.model
        assert report["layout"] == plan["layout"]
        assert report["memory"]["peak_memory_gib"] == plan["prediction"]["peak_memory_gib"]
