"""The input checks of issues 16 and 17: what a dry run may execute (nothing of the user's),
bash-exact arithmetic at bounded cost, exports that cannot be injected into, CRLF scripts,
every command with every workload, and one exit code for "no layout fits"."""

from __future__ import annotations

import shutil
import subprocess
import time
from pathlib import Path

import pytest

from planner.catalog.hardware import ClusterSpec, get_gpu
from planner.catalog.models import resolve_model
from planner.catalog.workload import GrpoWorkload
from planner.cli.main import main
from planner.cost.request import PlanRequest
from planner.errors import PlanInputError, ResourceLimitError
from planner.plan import make_plan
from planner.verl.arith import Arithmetic
from planner.verl.script import parse_launch_script

EXAMPLES = Path(__file__).resolve().parents[1] / "verl_examples"
V = ["--model", "qwen2.5-7b", "--gpu-type", "h100"]
HEAD = ("hydra:\n  searchpath: [pkg://verl.trainer.config]\ndefaults:\n  - ppo_trainer\n"
        "  - _self_\nmodel_engine: megatron\n")


def run(capsys, *argv):
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


# --- a dry run never instantiates a _target_ the user named (issue 17, P1 item 1) ----------

PAYLOADS = [
    ("builtins.open", "evil: {_target_: builtins.open, file: '%s', mode: w}"),
    ("pathlib.Path.write_text", "evil: {_target_: pathlib.Path.write_text, _args_: ['%s', "
                                "'import os']}"),
]


@pytest.mark.needs("verl")
@pytest.mark.parametrize("target,node", PAYLOADS)
def test_target_payload_in_yaml_writes_nothing(tmp_path, capsys, target, node):
    victim = tmp_path / "pwned.pth"
    job = tmp_path / "job.yaml"
    job.write_text(HEAD + "actor_rollout_ref:\n  actor:\n    " + node % victim + "\n")
    code, out, _ = run(capsys, "validate", str(job), *V)
    assert not victim.exists()
    assert code == 1 and "[unsafe_target] actor_rollout_ref.actor.evil._target_" in out
    assert target in out


@pytest.mark.needs("verl")
@pytest.mark.parametrize("command", ["validate", "fix"])
@pytest.mark.parametrize("target,node", PAYLOADS)
def test_target_payload_in_overrides_writes_nothing(tmp_path, capsys, command, target, node):
    victim = tmp_path / "pwned.pth"
    key, _, value = (node % victim).partition(": ")
    code, out, err = run(capsys, command, *V, "--", "model_engine=megatron",
                         f"+actor_rollout_ref.rollout.{key}={value}")
    assert not victim.exists()
    assert code in (1, 2) and "actor_rollout_ref.rollout.evil._target_" in out + err
    # replacing a verl node's own target is refused too
    code, out, err = run(capsys, command, *V, "--", f"actor_rollout_ref.actor._target_={target}",
                         f"+actor_rollout_ref.actor.file={victim}")
    assert not victim.exists() and "actor_rollout_ref.actor._target_" in out + err


@pytest.mark.needs("verl")
def test_verl_targets_are_allowed_and_real_jobs_still_check(capsys):
    from planner.verl.config import verl_targets

    targets = verl_targets()
    assert "verl.workers.config.McoreActorConfig" in targets
    assert "verl.workers.config.RolloutConfig" in targets
    assert not {t for t in targets if not t.startswith("verl.")}
    code, out, _ = run(capsys, "validate", str(EXAMPLES / "run_qwen2-7b_math_megatron.sh"),
                       "--gpu-type", "h100", "--model", "qwen2-7b")
    assert "unsafe_target" not in out and "[verl_" not in out


# --- shell arithmetic: bash's answers, at once (issue 16) ----------------------------------

BASH_ANSWERS = {  # `bash -c 'echo $((...))'`, bash 5.2
    "9**9**9": -2123029214124047543, "2**63": -9223372036854775808, "-2**2": 4,
    "7/-2": -3, "-7%3": -1, "1<<65": 2, "~0": -1, "0x10+010+2#101": 29,
    "99999999999999999999": 7766279631452241919, "1 ? 2 : 3": 2, "0 && 1/0": 0,
    "(1024 * 4) / 3": 1365,
}


@pytest.mark.parametrize("expression,answer", BASH_ANSWERS.items())
def test_arithmetic_matches_bash(expression, answer):
    assert Arithmetic(lambda name: "").evaluate(expression) == answer


@pytest.mark.skipif(shutil.which("bash") is None, reason="no bash")
def test_arithmetic_table_is_what_bash_prints():
    for expression, answer in BASH_ANSWERS.items():
        printed = subprocess.run(["bash", "-c", f"echo $(({expression}))"], capture_output=True,
                                 text=True, check=True).stdout.strip()
        assert int(printed) == answer, expression


@pytest.mark.parametrize("script,needle", [
    ("A=1\n" + "A=\"$A+$A\"\n" * 40 + "python3 -m verl.trainer.main_ppo x=$((A))\n",
     "the bound is 1,048,576"),
    ("V0=1\n" + "".join(f"V{i}=V{i - 1}+V{i - 1}\n" for i in range(1, 80))
     + "python3 -m verl.trainer.main_ppo x=$((V79))\n", "the bound is 32"),
    ("python3 -m verl.trainer.main_ppo x=$((" + "1+" * 100_000 + "1))\n",
     "the bound is 10,000"),
    ("python3 -m verl.trainer.main_ppo x=" + "${X:-" * 3000 + "1" + "}" * 3000 + "\n",
     "the bound is 64"),
])
def test_shell_bounds_trip_at_once(script, needle):
    start = time.monotonic()
    with pytest.raises(ResourceLimitError, match=needle.replace("(", r"\(")):
        parse_launch_script(script, {}, "t.sh")
    assert time.monotonic() - start < 10


def test_memoised_variables_answer_in_linear_time():
    script = ("V0=1\n" + "".join(f"V{i}='V{i - 1}+V{i - 1}'\n" for i in range(1, 30))
              + "python3 -m verl.trainer.main_ppo x=$((V29))\n")
    assert list(parse_launch_script(script, {}, "t.sh").overrides) == [f"x={2 ** 29}"]


# --- CRLF launch scripts (issue 17, P2) ----------------------------------------------------


@pytest.mark.needs("verl")
def test_crlf_script_would_not_launch_and_names_the_fix(tmp_path, capsys):
    text = (EXAMPLES / "run_qwen2-7b_math_megatron.sh").read_text()
    crlf = tmp_path / "run.sh"
    crlf.write_bytes(text.replace("\n", "\r\n").encode())
    code, out, _ = run(capsys, "validate", str(crlf), "--gpu-type", "h100", "--model",
                       "qwen2-7b")
    assert code == 1 and "[launch_script]" in out and "dos2unix run.sh" in out


# --- exports quote what they write (issue 17, P2) ------------------------------------------


@pytest.fixture(scope="module")
def small_plan():
    return make_plan(PlanRequest(resolve_model("qwen2.5-0.5b"), ClusterSpec(get_gpu("h100"), 2, 2), GrpoWorkload(train_batch_size=8, rollout_n=2, prompt_length=64,
                                  response_length=64, mini_batch_size=4)))


@pytest.mark.parametrize("field,value", [
    ("model_path", "/models/q\nrm -rf ~"), ("train_files", "/d/t.parquet\r\ntouch x"),
    ("val_files", "/d/v\x1b[2J"), ("extra_overrides", ("trainer.project_name=a\nreboot",))])
def test_export_refuses_control_characters(small_plan, field, value):
    from planner.verl.export import job_from_plan

    with pytest.raises(PlanInputError, match="control characters"):
        job_from_plan(small_plan, **{field: value})


@pytest.mark.needs("verl")
def test_export_quotes_hostile_but_printable_names(small_plan, tmp_path):
    import yaml

    from planner.verl.files import write_plan_job

    path = "/models/$(touch pwned)`id`;\"x\" && y $HOME"
    written = write_plan_job(small_plan, directory=tmp_path / "job", model_path=path,
                             extra_overrides=["trainer.project_name='a;b $(c)'"])
    script = written[0].read_text()
    command = parse_launch_script(script, {"HOME": "/h", "MODEL_PATH": "/m"}, "run_grpo.sh")
    assert "trainer.project_name='a;b $(c)'" in command.overrides
    assert not any("$(" in note for note in command.notes)  # nothing would run
    if shutil.which("bash"):  # what bash itself makes of the exported default: the text, run
        line = next(line for line in script.splitlines() if line.startswith("MODEL_PATH="))
        printed = subprocess.run(["bash", "-c", f'{line}\nprintf %s "$MODEL_PATH"'],
                                 cwd=tmp_path, capture_output=True, text=True, check=True,
                                 env={"HOME": "/h", "PATH": "/usr/bin:/bin"}).stdout
        assert printed == path  # the path itself, nothing expanded (Hydra-quoted where used)
        assert not (tmp_path / "pwned").exists()
    config = yaml.safe_load(written[1].read_text())
    assert path in config["actor_rollout_ref"]["model"]["path"]


# --- every command with every workload (issue 17, P1 item 5) --------------------------------

PAIRS = [
    (["plan", "--top", "2"], 0, 0), (["estimate", "--tp", "2"], 0, 0),
    (["explain"], 0, 2), (["report", "--html", "{tmp}/r.html"], 0, 0),
    (["tune", "--model-path", "/m", "--train-files", "/t", "--val-files", "/v",
      "--trainer-command", "definitely-not-a-command-xyz"], 2, 2),
]


@pytest.mark.parametrize("argv,grpo_code,pretrain_code", PAIRS,
                         ids=[argv[0] for argv, _, _ in PAIRS])
@pytest.mark.parametrize("workload", ["grpo", "pretrain"])
def test_every_command_with_every_workload(tmp_path, capsys, argv, grpo_code, pretrain_code,
                                           workload):
    if argv[0] == "tune":
        pytest.importorskip("optuna", reason="plan-parallel[tune] is not installed")
    argv = [a.replace("{tmp}", str(tmp_path)) for a in argv]
    code, out, err = run(capsys, *argv, "--model", "qwen3-8b", "--gpus", "8", "--gpu-type",
                         "h100", "--workload", workload)
    assert code == (grpo_code if workload == "grpo" else pretrain_code), err
    assert "Traceback" not in err
    if code == 2:
        assert len(err.strip().splitlines()) == 1
    if argv[0] == "tune" and workload == "pretrain":
        assert "--workload pretrain has no trials" in err
    if argv[0] == "explain" and workload == "pretrain":
        assert "explain compares GRPO layouts" in err
    if argv[0] == "report":
        assert (tmp_path / "r.html").stat().st_size > 10_000


@pytest.mark.parametrize("argv", [
    ["plan"], ["plan", "--write", "{tmp}/job"], ["explain"], ["report", "--html", "{tmp}/r.html"],
    ["estimate", "--tp", "1"]])
def test_no_layout_fits_is_exit_1_for_every_command(tmp_path, capsys, argv):
    argv = [a.replace("{tmp}", str(tmp_path)) for a in argv]
    code, out, err = run(capsys, *argv, "--model", "llama3.1-405b", "--gpus", "8",
                         "--gpu-type", "h100")
    assert code == 1 and "Traceback" not in err
    assert not list(tmp_path.iterdir())  # nothing written when nothing fits
