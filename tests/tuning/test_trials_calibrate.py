"""Calibration from trials: a cluster whose efficiencies differ from the shipped ones."""

import copy
import json

import numpy as np
import pytest
from fixtures.tuning import (
    FAKE_ENV,
    TRAINER_COMMAND,
    job_files,
    load_study,
    sqlite_url,
    write_config,
)

from planner.catalog.hardware import ClusterSpec, get_gpu
from planner.catalog.models import resolve_model
from planner.catalog.workload import GrpoWorkload
from planner.cli.main import main
from planner.cost.calibration import Measurement, mape, predict
from planner.cost.efficiency import RL_SHARED, CostModel, shipped_calibration
from planner.cost.request import PlanRequest
from planner.plan import make_plan
from planner.search.space import SearchOptions
from trials.calibration_fit import study_measurements
from trials.candidates import CandidateSet

pytestmark = pytest.mark.needs("tune")

# A workload where compute matters (the tiny one of the other tests is all fixed overheads).
SETTING = ["--model", "qwen2.5-7b", "--gpus", "8", "--gpu-type", "h100", "--train-batch-size",
           "128", "--rollout-n", "4", "--prompt-length", "1024", "--response-length", "1024",
           "--mini-batch-size", "32", "--no-offload"]


def hidden_calibration() -> dict:
    """The 'real' cluster: slower GEMMs and more memory-bound passes than shipped."""
    calibration = copy.deepcopy(shipped_calibration())
    calibration["by_gpu"]["H100-80GB/bf16"]["gemm"] *= 0.6
    calibration["shared"]["elementwise_passes"] *= 1.5
    return calibration


@pytest.fixture(scope="module")
def study_of_a_slower_cluster(tmp_path_factory):
    """A 12-trial study on a cluster whose real throughput follows ``hidden_calibration``."""
    tmp_path = tmp_path_factory.mktemp("calibration")
    model = resolve_model("qwen2.5-7b")
    cluster = ClusterSpec(get_gpu("h100"), 8, 8)
    workload = GrpoWorkload(train_batch_size=128, rollout_n=4, prompt_length=1024,
                            response_length=1024, mini_batch_size=32)
    candidates = CandidateSet.from_plan(make_plan(PlanRequest(model, cluster, workload, options=SearchOptions(offload=(False,)))))
    measurements = [Measurement(model, cluster, workload, c.layout, 1.0) for c in candidates]
    truth = predict(measurements, CostModel.load(hidden_calibration()))
    table = [{"match": dict(c.params), "value": float(value)}
             for c, value in zip(candidates, truth)]
    config = write_config(tmp_path / "fake.json", step_sleep_s=0.01, throughput={"table": table})
    argv = ["tune", *SETTING, *job_files(tmp_path), "--trainer-command", TRAINER_COMMAND, "--trials", "12",
            "--steps", "2", "--sweep-dir", str(tmp_path / "sweep"), "--study-name", "study",
            "--seed", "3"]
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv(FAKE_ENV, str(config))
        assert main(argv) == 0
    return tmp_path


def test_calibrate_reduces_the_prediction_error(study_of_a_slower_cluster, capsys):
    tmp_path = study_of_a_slower_cluster
    sweep = tmp_path / "sweep"
    capsys.readouterr()
    assert main(["calibrate", str(sweep)]) == 0
    out, err = capsys.readouterr()
    assert "12 successful trials" in out
    # what moved is said, and that a study's step times leave generation and sync as they were
    assert ("fitted: the training constants (GEMM efficiency of H100-80GB/bf16, and the shared "
            "ones: gemm_half_rows, attention") in err
    assert "the generation and weight-sync constants are the shipped calibration's" in err
    before, after = (float(x) for x in
                     __import__("re").findall(r"([\d.]+)%", out.splitlines()[-1])[:2])
    assert after < 0.8 * before
    fitted = json.loads((sweep / "calibration.json").read_text())
    assert set(fitted) >= {"shared", "by_gpu", "fit"}
    assert fitted["by_gpu"]["H100-80GB/bf16"]["measurements"] == 12
    # the RL constants it started from (the shipped ones) are carried unchanged
    shipped = shipped_calibration()
    assert {k: fitted["shared"][k] for k in RL_SHARED} == {k: shipped["shared"][k] for k in RL_SHARED}
    assert fitted["by_gpu"]["H100-80GB/bf16"]["decode_hbm"] == \
        shipped["by_gpu"]["H100-80GB/bf16"]["decode_hbm"]

    # the same error, computed here from the study itself
    measurements = study_measurements(load_study(sqlite_url(tmp_path)))
    measured = np.array([m.tokens_per_s_per_gpu for m in measurements])
    assert mape(predict(measurements, CostModel.load(fitted)), measured) == pytest.approx(after / 100, abs=5e-4)
    assert mape(predict(measurements, CostModel.load()), measured) == pytest.approx(before / 100, abs=5e-4)

    # `plan-parallel --calibration FILE` takes the file, and with it the planner predicts what
    # the cluster measures for the best measured layout (scored as the plan scores it)
    from planner.plan import estimate_layout

    assert main([*SETTING, "--format", "json", "--top", "1", "--calibration",
                 str(sweep / "calibration.json")]) == 0
    capsys.readouterr()
    best = max(measurements, key=lambda m: m.tokens_per_s_per_gpu)
    errors = []
    for calibration in (None, fitted):
        row = estimate_layout(PlanRequest(best.model, best.cluster, best.workload, cost=CostModel.load(calibration)), best.layout).row
        errors.append(abs(row["tokens_per_s_per_gpu"] / best.tokens_per_s_per_gpu - 1))
    assert errors[1] < 0.8 * errors[0]


def test_calibrate_from_a_storage_url(study_of_a_slower_cluster, tmp_path, capsys):
    storage = sqlite_url(study_of_a_slower_cluster)
    output = tmp_path / "cal.json"
    assert main(["calibrate", "--storage", storage, "-o", str(output)]) == 0
    assert json.loads(output.read_text())["fit"]["measurements"] == 12
    capsys.readouterr()
    assert main(["calibrate", str(tmp_path / "nowhere")]) == 2
    assert "not a plan-parallel sweep directory" in capsys.readouterr().err
    assert main(["calibrate", "--storage", storage, "--study-name", "other"]) == 2
    assert "no study 'other'" in capsys.readouterr().err


def _state(folder):
    return {str(p.relative_to(folder)): (p.stat().st_size, p.stat().st_mtime_ns, p.read_bytes())
            for p in sorted(folder.rglob("*")) if p.is_file()}


def test_report_and_calibrate_never_write_the_study(study_of_a_slower_cluster, tmp_path,
                                                   capsys):
    """Readers never write: the study database (and its folder) are byte-for-byte unchanged
    after `report` and `calibrate` read them; SQLite is opened with mode=ro."""
    sweep = study_of_a_slower_cluster / "sweep"
    before = _state(sweep)
    assert main(["report", str(sweep), "--html", str(tmp_path / "r.html")]) == 0
    assert main(["calibrate", str(sweep), "-o", str(tmp_path / "c.json")]) == 0
    assert main(["calibrate", "--storage", sqlite_url(study_of_a_slower_cluster),
                 "-o", str(tmp_path / "d.json")]) == 0
    assert _state(sweep) == before
    # an empty file named study.db stays empty: no Optuna schema is created in it
    empty = tmp_path / "empty.db"
    empty.touch()
    capsys.readouterr()
    assert main(["calibrate", "--storage", f"sqlite:///{empty}", "-o",
                 str(tmp_path / "e.json")]) == 2
    assert empty.stat().st_size == 0 and not (tmp_path / "e.json").exists()
    assert "cannot read" in capsys.readouterr().err


def test_calibrate_never_overwrites_its_output_without_force(study_of_a_slower_cluster,
                                                             tmp_path, capsys):
    storage = sqlite_url(study_of_a_slower_cluster)
    output = tmp_path / "mine.json"
    output.write_text('{"mine": true}\n')
    assert main(["calibrate", "--storage", storage, "-o", str(output)]) == 2
    err = capsys.readouterr().err
    assert f"{output} exists; pass --force" in err and len(err.strip().splitlines()) == 1
    assert output.read_text() == '{"mine": true}\n'
    assert main(["calibrate", "--storage", storage, "-o", str(output), "--force"]) == 0
    assert json.loads(output.read_text())["fit"]["measurements"] == 12
