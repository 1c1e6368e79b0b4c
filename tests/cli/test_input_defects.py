"""Issue 26, section 3: what the hostile-input corpus (tests/data/bad_inputs) cannot say by a
substring -- a message that must not repeat itself, a password that must not appear, the
calibration schema checked the same way by every reader, and Hydra's override parser."""

import json

import pytest

from planner.cli.main import main
from planner.cost.efficiency import read_calibration, shipped_calibration
from planner.errors import PlanInputError


def test_an_unreadable_trace_says_cannot_read_once(tmp_path, capsys):
    (tmp_path / "t.json").write_text("{not json")
    assert main(["profile", str(tmp_path / "t.json")]) == 2
    err = capsys.readouterr().err
    assert err.count("cannot read") == 1 and "cannot read trace" in err


def test_a_zero_second_step_is_never_targets_met(tmp_path, capsys):
    kernel = {"ph": "X", "cat": "kernel", "name": "gemm", "ts": 0, "dur": 10, "tid": 1}
    step = {"ph": "X", "cat": "user_annotation", "name": "ProfilerStep#1", "ts": 3, "dur": 0}
    (tmp_path / "t.json").write_text(json.dumps({"traceEvents": [kernel, step]}))
    assert main(["profile", str(tmp_path / "t.json")]) == 2
    out, err = capsys.readouterr()
    assert "targets" not in out and "lasts 0 s" in err


def test_the_shipped_calibration_passes_its_own_schema(tmp_path):
    path = tmp_path / "c.json"
    path.write_text(json.dumps(shipped_calibration()))
    assert read_calibration(path) == shipped_calibration()


@pytest.mark.parametrize("data,needle", [
    ({"shared": [1]}, "shared is a list"),
    ({"shared": {}, "by_gpu": "x"}, "by_gpu is a string"),
    ({"by_gpu": {"H100-80GB/bf16": [0.7]}}, "by_gpu.H100-80GB/bf16 is a list"),
    ({"by_gpu": {"H100-80GB/bf16": {"gemm": True}}}, "gemm = True is not a number in 0.2..0.95"),
    ({"shared": {"sync_fixed_s": -1}}, "sync_fixed_s = -1 is not a number in 0.1..20"),
    # the RL constants are bounded by their priors' bounds, as the training ones by BOUNDS
    ({"shared": {"host_layer_s": 5.0}}, "shared.host_layer_s = 5.0 is not a number in 0.0001..0.02"),
    ({"by_gpu": {"H100-80GB/bf16": {"decode_hbm": 1.5}}},
     "by_gpu.H100-80GB/bf16.decode_hbm = 1.5 is not a number in 0.2..0.95"),
    ({"shared": {"hbm": -1}}, "hbm = -1 is not a finite number >= 0"),
])
def test_calibration_schema(tmp_path, data, needle):
    path = tmp_path / "c.json"
    path.write_text(json.dumps(data))
    with pytest.raises(PlanInputError, match=needle.replace(".", r"\.")):
        read_calibration(path)


def test_overrides_go_through_hydras_parser():
    pytest.importorskip("hydra", reason="Hydra (the verl extra) parses overrides")
    from planner.verl.export import check_overrides

    assert check_overrides(["trainer.total_epochs=5", "+a.b='x y'", "~c.d"])
    with pytest.raises(PlanInputError) as error:
        check_overrides(["trainer.x=$(oops)", "trainer.ok=1", "trainer.baz='a b'\"c"])
    message = str(error.value)
    assert message.count("is not valid Hydra syntax") == 2  # each bad value named, once
    assert "trainer.x=$(oops)" in message and "trainer.baz=" in message
    assert "trainer.ok" not in message


def test_an_unreachable_database_names_the_cause_and_masks_the_password(tmp_path, capsys):
    pytest.importorskip("optuna", reason="needs the tune extra")
    pytest.importorskip("psycopg", reason="PostgreSQL's driver")
    code = main(["calibrate", "--storage", "postgresql://user:sekret-pw@127.0.0.1:1/db",
                 "--output", str(tmp_path / "c.json")])
    err = capsys.readouterr().err
    assert code == 2 and "Connection refused" in err and "sekret-pw" not in err
    assert "An exception is raised during the commit" not in err


def test_tune_checks_its_output_paths_before_the_first_trial(tmp_path, capsys):
    """`--write` at a plain file used to fail only after the trial had run and written
    study.db; now nothing runs and nothing is written."""
    pytest.importorskip("optuna", reason="needs the tune extra")
    (tmp_path / "afile").write_text("x")
    argv = ["tune", "--model", "qwen2.5-0.5b", "--gpus", "2", "--gpu-type", "h100",
            "--model-path", "/m", "--train-files", "/t", "--val-files", "/v",
            "--sweep-dir", str(tmp_path / "sweep"), "--write", str(tmp_path / "afile"),
            "--skip-checks", "--trainer-command", "true"]
    assert main(argv) == 2
    assert "--write" in capsys.readouterr().err
    assert not (tmp_path / "sweep").exists()



def test_a_config_whose_context_covers_the_sequence_is_planned(tmp_path, capsys):
    """The context check reads the config.json it plans: Qwen2.5-Math-7B with its
    max_position_embeddings raised (as long-response runs do) is planned at 2048 + 8192."""
    from pathlib import Path

    import planner.catalog

    shipped = Path(planner.catalog.__file__).parent / "models_data" / "Qwen2.5-Math-7B.json"
    config = json.loads(shipped.read_text())
    config["max_position_embeddings"] = 32768
    (tmp_path / "config.json").write_text(json.dumps(config))
    argv = ["estimate", "--model", str(tmp_path / "config.json"), "--gpus", "8", "--gpu-type",
            "h100", "--prompt-length", "2048", "--response-length", "8192", "--tp", "2",
            "--rollout-tp", "2", "--micro-batch", "1"]
    assert main(argv) in (0, 1)
    assert "max_position_embeddings" not in capsys.readouterr().err
    config["max_position_embeddings"] = 4096
    (tmp_path / "config.json").write_text(json.dumps(config))
    assert main(argv) == 2
    assert "2048 + --response-length 8192 = 10240 tokens exceeds" in capsys.readouterr().err
