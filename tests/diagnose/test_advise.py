"""``plan-parallel advise``: measured vs predicted per phase, the fit from one run, the re-plan,
the best change and the drift line, on runs written in verl's formats from published timings
(grpo_runs.csv row 62, the DAPO Qwen2.5-Math-7B job on 8 x H100), and the calibration's
provenance."""

from __future__ import annotations

import hashlib
import json
import sys
from importlib import resources
from pathlib import Path

import pytest
from fixtures.verl_runs import run_records, write_console, write_jsonl

from planner.cli.main import main
from planner.cost.efficiency import CostModel, load_efficiency, shipped_calibration
from planner.cost.provenance import calibration_summary, version_notes
from planner.diagnose.advice import JobSetting, advise, advise_text, measured_seconds

ROOT = Path(__file__).resolve().parents[2]
JOB = ROOT / "tests" / "data" / "runs" / "dapo_qwen2.5_math_7b_8xh100.sh"
pytestmark = pytest.mark.needs("tune")  # the fit needs scipy


@pytest.fixture(scope="module")
def setting():
    sys.path.insert(0, str(ROOT / "benchmarks"))
    from rl_data import load_rl_cases

    case = next(case for case in load_rl_cases()[0] if case.row_id == 62)
    return JobSetting(case.model, case.cluster, case.workload, case.layout, source="row 62")


def _run(tmp_path, writer=write_jsonl, name="run.jsonl", **kwargs):
    from trials.runs import read_run

    return read_run(writer(tmp_path / name, run_records(62, steps=12, mean=1322, **kwargs)))


@pytest.mark.parametrize("slow", ["update_actor", "gen", "old_log_prob"])
def test_advise_names_the_phase_slowest_against_its_prediction(slow, setting, tmp_path):
    # the published timings with one phase 2.5x slower: a cluster where that phase lags
    advice = advise(_run(tmp_path, scale={slow: 2.5}), setting)
    phase = {"gen": "generate"}.get(slow, slow)
    assert advice.largest.phase == phase and advice.largest.gap_s > 0
    assert f"largest gap: {phase}," in advise_text(advice)


def test_measured_phases_follow_verls_timers():
    medians = {"timing_s/gen": 150.0, "timing_s/old_log_prob": 60.0,
               "timing_s/update_actor": 170.0, "timing_s/update_weights": 3.0,
               "timing_s/reward": 4.0, "timing_s/step": 390.0}
    seconds, inside = measured_seconds(medians)
    assert not inside and seconds == {"generate": 150.0, "old_log_prob": 60.0,
                                      "update_actor": 170.0, "weight_sync": 10.0}
    del medians["timing_s/update_weights"]  # verl before 0.6: the reshard inside gen
    seconds, inside = measured_seconds(medians)
    assert inside and seconds["step"] == 390.0 and "weight_sync" not in seconds


def test_a_fit_from_one_run_leaves_the_shipped_calibration_untouched(setting, tmp_path):
    path = resources.files("planner.cost") / "calibration.json"
    digest = hashlib.sha256(path.read_bytes()).hexdigest()
    before = shipped_calibration()
    gpu = setting.cluster.gpu
    efficiency = load_efficiency(gpu, "bf16")
    given = shipped_calibration()
    advice = advise(_run(tmp_path, scale={"update_actor": 2.0}), setting,
                    cost=CostModel.load(given))
    fitted = advice.fit.calibration
    # the fit moved this cluster's GEMM efficiency (the update is twice as slow) ...
    assert fitted["by_gpu"]["H100-80GB/bf16"]["gemm"] < 0.8 * before["by_gpu"][
        "H100-80GB/bf16"]["gemm"]
    assert advice.fit.mape_after < advice.fit.mape_before
    # ... in a new dict: the given one, the shipped one and the file are as they were
    assert given == before and shipped_calibration() == before
    assert load_efficiency(gpu, "bf16") == efficiency
    assert hashlib.sha256(path.read_bytes()).hexdigest() == digest
    assert fitted["run_fit"]["source"].startswith("plan-parallel advise")


def test_the_drift_line_uses_the_planned_length_and_the_ranking_uncertainty(setting, tmp_path):
    planned = JobSetting(setting.model, setting.cluster, setting.workload, setting.layout,
                         planned_tokens=661.0, planned_source="plan.json")
    advice = advise(_run(tmp_path), planned)
    assert advice.drift == pytest.approx(advice.now_tokens / 661 - 1)
    assert advice.uncertainty == pytest.approx(0.1621)  # the shipped ranking uncertainty
    assert advice.replan_pays == (advice.replan_gain > advice.uncertainty)
    text = advise_text(advice)
    assert "planned (+100%; plan.json)" in text and "the model can resolve" in text
    data = advice.to_dict()
    assert data["drift"]["planned_from"] == "plan.json"
    assert data["largest_gap"]["phase"] in {"generate", "old_log_prob", "update_actor",
                                            "weight_sync"}
    assert json.dumps(data)  # plain data


def test_a_best_change_is_faster_fits_and_comes_with_its_overrides(setting, tmp_path):
    advice = advise(_run(tmp_path, writer=write_console, name="trainer.log"), setting)
    current = advice.current.step_time_s
    for change in advice.changes:
        assert change.candidate.fits and change.step_time_s <= 0.98 * current
    if advice.changes:
        best = advice.changes[0]
        assert best.overrides and all("=" in item for item in best.overrides)
        assert advice.to_dict()["best_change"]["band_position"] in ("inside", "below", "above")


def test_the_calibration_knows_its_provenance():
    shipped = shipped_calibration()
    rl = shipped["provenance"]["rl"]["by_source"]
    assert rl["verl-sweeps"]["framework"] == "verl" and rl["verl-sweeps"]["rollout"] == ["vLLM"]
    assert {entry["framework"] for entry in rl.values()} == {"verl", "nemo-rl"}
    assert all(0 < entry["mape"] < 1 for entry in rl.values())
    training = shipped["provenance"]["training"]["by_source"]
    assert "NeMo container 26.08" in training["megatron-bridge"]["versions"]
    line = calibration_summary(shipped, "the shipped one")
    assert "verl v0.4-v0.5 + vLLM" in line and "nemo-rl v0.3-v0.5" in line
    assert version_notes(shipped, {"verl": "0.9.1", "vllm": None})[0].startswith(
        "note: installed verl 0.9.1 is not a release the RL constants were measured with")
    assert version_notes(shipped, {"verl": "0.5.0", "vllm": None}) == []
    assert "do not state their vLLM release" in version_notes(
        shipped, {"verl": None, "vllm": "0.11.0"})[0]


@pytest.mark.needs("verl")
def test_the_command_end_to_end(tmp_path, capsys):
    run = write_jsonl(tmp_path / "run.jsonl",
                      run_records(62, steps=12, mean=1322, scale={"update_actor": 2.0}))
    written = tmp_path / "cluster.json"
    argv = ["advise", str(run), "--job", str(JOB), "--gpu-type", "h100", "--format", "json",
            "--write-calibration", str(written)]
    assert main(argv) == 0
    out, err = capsys.readouterr()
    data = json.loads(out)
    assert data["largest_gap"]["phase"] == "update_actor"
    assert data["model"] == "Qwen2.5-Math-7B" and data["layout"]["tp"] == 4
    assert data["fit"]["mape_after"] < data["fit"]["mape_before"]
    assert "run_fit" in json.loads(written.read_text()) and "wrote" in err
    assert main(argv) == 2  # never overwrites without --force
    assert "exists; pass --force" in capsys.readouterr().err


def test_bad_runs_and_a_missing_job_exit_2(tmp_path, capsys):
    run = write_jsonl(tmp_path / "run.jsonl", run_records(62, steps=4))
    assert main(["advise", str(run)]) == 2
    assert "pass --job SCRIPT" in capsys.readouterr().err
    stripped = tmp_path / "nolen.jsonl"
    stripped.write_text('{"step": 1, "data": {"timing_s/step": 3.0}}\n')
    assert main(["advise", str(stripped), "--job", str(JOB)]) == 2
    assert "has no" in capsys.readouterr().err


def test_a_run_whose_steady_steps_lost_their_timer_is_refused(setting, tmp_path):
    from trials.runs import read_run

    records = run_records(62, steps=3, mean=1322)
    for _, data in records[1:]:
        del data["timing_s/step"]
    run = read_run(write_jsonl(tmp_path / "run.jsonl", records))
    with pytest.raises(Exception, match="no steady step logs both timing_s/step"):
        advise(run, setting)
