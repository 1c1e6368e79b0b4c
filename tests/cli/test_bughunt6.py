"""Defects a user hit (bug hunt 6): each test failed before its fix."""

import json

from planner.catalog.models import builtin_config_dict
from planner.cli.main import main


def test_a_job_planned_from_a_local_model_directory_launches_from_it(tmp_path, capsys):
    """plan --model DIR --write: the script's MODEL_PATH defaulted to $HOME/models/<DIR's name>,
    not DIR whose config.json was planned, so the check its header names (`plan-parallel
    validate run_grpo.sh`) could not read the model (exit 2), and a launch pointed verl at a
    path that need not exist.  DIR is the default now (a --model-path or $MODEL_PATH wins)."""
    model = tmp_path / "my-qwen3"
    model.mkdir()
    config = {k: v for k, v in builtin_config_dict("Qwen3-8B").items() if not k.startswith("_")}
    (model / "config.json").write_text(json.dumps(config))
    job = tmp_path / "job"
    assert main(["plan", "--model", str(model), "--gpus", "8", "--gpu-type", "h100", "--top", "1",
                 "--write", str(job)]) == 0
    capsys.readouterr()
    script = (job / "run_grpo.sh").read_text()
    assert f'MODEL_PATH="${{MODEL_PATH:-{model}}}"' in script
    assert main(["validate", str(job / "run_grpo.sh"), "--gpu-type", "h100"]) == 0
    assert "my-qwen3 on 8 x H100-80GB" in capsys.readouterr().out
    # a config.json path: its folder
    assert main(["plan", "--model", str(model / "config.json"), "--gpus", "8", "--gpu-type",
                 "h100", "--top", "1", "--write", str(job), "--force"]) == 0
    assert f'MODEL_PATH="${{MODEL_PATH:-{model}}}"' in (job / "run_grpo.sh").read_text()
    # --model-path still wins
    assert main(["plan", "--model", str(model), "--gpus", "8", "--gpu-type", "h100", "--top", "1",
                 "--write", str(job), "--force", "--model-path", "/data/ckpt"]) == 0
    assert 'MODEL_PATH="${MODEL_PATH:-/data/ckpt}"' in (job / "run_grpo.sh").read_text()
