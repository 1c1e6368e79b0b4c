"""A launch script's ``--config-path``/``--config-dir`` resolved as Hydra resolves them (issue 26):
relative to the entry module's folder, for every entry point; absolute and ``pkg://`` paths as
they are; ``--config-dir`` searched before the primary folder."""

from pathlib import Path

import pytest

from planner.cli.main import main
from planner.diagnose.validate import read_input
from planner.errors import PlanInputError

EXAMPLES = Path(__file__).resolve().parents[1] / "verl_examples"
FULLY_ASYNC = EXAMPLES / "grpo_30b_a3b_base_math_megatron_96_32.sh"

pytestmark = pytest.mark.needs("verl")


def verl_root() -> Path:
    from planner.verl.config import verl_config_dir

    return verl_config_dir().parents[1]


def script(tmp_path, head: str, *overrides: str, name="run.sh") -> Path:
    path = tmp_path / name
    path.write_text(f"{head} \\\n" + "".join(f"    {item} \\\n" for item in overrides) + "\n")
    return path


def test_fully_async_example_validates(capsys):
    """verl's own fully-async Megatron example: `--config-path=config` is the entry module's
    config folder, where fully_async_ppo_megatron_trainer.yaml is (was: "no Hydra config ... in
    verl/trainer/config", exit 2)."""
    code = main(["validate", str(FULLY_ASYNC), "--gpu-type", "h20", "--gpus", "128"])
    out, err = capsys.readouterr()
    assert code == 0, out + err
    expected = verl_root() / "experimental" / "fully_async_policy" / "config"
    assert f"config {expected}/fully_async_ppo_megatron_trainer" in out
    assert "mode fully-async: trainer pool 32 GPUs" in out and "rollout pool 96 GPUs" in out
    assert "would launch" in out


@pytest.mark.parametrize("module,config_path,expected", [
    ("verl.trainer.main_ppo", "config", "trainer/config"),
    ("verl.experimental.one_step_off_policy.main_ppo", "config",
     "experimental/one_step_off_policy/config"),
    ("verl.experimental.fully_async_policy.fully_async_main", "config",
     "experimental/fully_async_policy/config"),
    # `../` climbs out of the entry module's package (Hydra's compute_search_path_dir)
    ("verl.experimental.fully_async_policy.fully_async_main", "../../trainer/config",
     "trainer/config"),
    ("verl.experimental.one_step_off_policy.main_ppo", "pkg://verl.trainer.config",
     "trainer/config"),
    # the entry point named by its file resolves against the installed verl's copy
    ("verl/experimental/fully_async_policy/fully_async_main.py", "config",
     "experimental/fully_async_policy/config"),
])
def test_relative_config_path_is_the_entry_modules(tmp_path, module, config_path, expected):
    runner = "python3 -m" if "/" not in module else "python3"
    path = script(tmp_path, f"{runner} {module} --config-path={config_path}")
    kind, _, config_dir, *_ = read_input([str(path)], {})
    assert kind == "script"
    assert config_dir == verl_root() / expected


def test_absolute_config_path_and_config_dir(tmp_path, monkeypatch, capsys):
    """An absolute `--config-path` is taken as it is; `--config-dir` (relative to the folder the
    command runs in) is searched before it, so a job config there composes on verl's defaults."""
    jobs = tmp_path / "jobs"
    jobs.mkdir()
    (jobs / "my_job.yaml").write_text(
        "defaults:\n  - ppo_megatron_trainer\n  - _self_\n"
        "trainer:\n  project_name: from_config_dir\n")
    trainer_config = verl_root() / "trainer" / "config"
    path = script(tmp_path, "python3 -m verl.trainer.main_ppo", f"--config-path={trainer_config}",
                  "--config-dir jobs", "--config-name=my_job")
    monkeypatch.chdir(tmp_path)
    kind, _, config_dir, name, _, notes, _, extra = read_input([str(path)], {})
    assert config_dir == trainer_config and name == "my_job"
    assert extra == (jobs,)
    assert any("--config-dir jobs" in note for note in notes)
    code = main(["validate", str(path), "--gpu-type", "h100", "--model", "qwen2.5-7b",
                 "--format", "json"])
    out, err = capsys.readouterr()
    assert code in (0, 1), err
    assert "no Hydra config" not in out + err
    assert f"{trainer_config}/my_job" in out


@pytest.mark.parametrize("flag,value,needle", [
    ("--config-path", "no_such_folder", "fully_async_policy"),
    ("--config-dir", "no_such_folder", "Additional config directory"),
])
def test_missing_folders_name_where_hydra_looked(tmp_path, flag, value, needle):
    path = script(tmp_path, "python3 -m verl.experimental.fully_async_policy.fully_async_main",
                  f"{flag}={value}")
    with pytest.raises(PlanInputError, match=needle):
        read_input([str(path)], {})
