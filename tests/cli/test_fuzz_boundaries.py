"""Property tests, one per input boundary: whatever is generated, the reader either answers or
raises the planner's input error (the CLI: exit 2, one line), never another exception, and
within a time bound.  Small example counts keep the suite fast on a shared 2-core machine;
the checked-in corpus (tests/cli/test_bad_inputs.py) holds the nastiest cases found."""

from __future__ import annotations

import json
import time
import unicodedata

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from planner.errors import PlanInputError

FAST = settings(max_examples=40, deadline=None, derandomize=True,
                suppress_health_check=[HealthCheck.too_slow,
                                       HealthCheck.function_scoped_fixture])
FEW = settings(max_examples=12, deadline=None, derandomize=True,
               suppress_health_check=[HealthCheck.too_slow,
                                      HealthCheck.function_scoped_fixture])
TIME_BOUND_S = 20.0  # per example; the bounds answer in milliseconds, this allows a busy CPU

JSON_LEAF = st.one_of(st.none(), st.booleans(), st.integers(-2**70, 2**70),
                      st.floats(allow_nan=True, allow_infinity=True), st.text(max_size=20))
JSON = st.recursive(JSON_LEAF, lambda inner: st.one_of(
    st.lists(inner, max_size=4), st.dictionaries(st.text(max_size=12), inner, max_size=4)),
    max_leaves=20)


@pytest.fixture(scope="module", autouse=True)
def warm_imports():
    """Heavy imports once, so the time bound measures the input, not a cold import."""
    from planner.catalog.models import resolve_model
    from planner.extras import available

    for name in ("transformers", "yaml", "optuna", "pandas"):
        if available(name):
            __import__(name)
    resolve_model("qwen2.5-0.5b")


def answers_or_input_error(function, *args, **kwargs):
    start = time.monotonic()
    try:
        result = function(*args, **kwargs)
    except PlanInputError as error:
        assert str(error).strip(), "an input error without a message"
        result = error
    assert time.monotonic() - start < TIME_BOUND_S
    return result


def one_line_exit(capsys, argv) -> int:
    from planner.cli.main import main

    start = time.monotonic()
    code = main(argv)
    out, err = capsys.readouterr()
    assert time.monotonic() - start < TIME_BOUND_S
    assert "Traceback" not in out + err
    assert code in (0, 1, 2), code
    if code == 2:
        assert len([line for line in err.splitlines() if line.strip()]) == 1, err
    return code


# --- CLI numbers and names -------------------------------------------------------------------

NUMBER_TEXT = st.one_of(st.integers(-2**80, 2**80).map(str),
                        st.floats(allow_nan=True, allow_infinity=True).map(repr),
                        st.text(max_size=30))


@FEW
@given(flag=st.sampled_from(["--gpus", "--tp", "--pp", "--train-batch-size", "--rollout-n",
                             "--response-length", "--micro-batch", "--gpus-per-node",
                             "--host-memory-gib", "--gpu-memory-utilization", "--top"]),
       value=NUMBER_TEXT)
def test_cli_numbers(capsys, flag, value):
    argv = ["plan", "--model", "qwen2.5-0.5b", "--gpus", "2", "--gpu-type", "h100", "--top",
            "1", flag, value]
    one_line_exit(capsys, argv)


@FAST
@given(value=st.text(max_size=60))
def test_cli_names(capsys, value):
    from planner.cli.args import build_parser
    from planner.errors import PlanInputError as InputError

    for flag in ("--model", "--gpu-type", "--memory-band"):
        try:
            args = build_parser().parse_args(["plan", flag, value, "--model", "x", "--gpus", "1"]
                                             if flag != "--model" else ["plan", flag, value])
        except InputError as error:
            assert "\n" not in str(error)
            continue
        got = getattr(args, flag[2:].replace("-", "_"))
        # taken: as given, not blank, and no control character (it may reach a script)
        assert got == value and value.strip()
        assert not any(unicodedata.category(c) == "Cc" for c in value)


@FAST
@given(value=st.text(max_size=30))
def test_tune_durations(value):
    pytest.importorskip("optuna", reason="plan-parallel[tune] is not installed")
    from planner.cli.tune import parse_duration

    result = answers_or_input_error(parse_duration, value, "--stop-grace", limit_s=600)
    if not isinstance(result, PlanInputError):
        assert 0 < result <= 600


# --- config.json -----------------------------------------------------------------------------

BASE = {"model_type": "llama", "hidden_size": 256, "num_attention_heads": 4,
        "num_hidden_layers": 2, "vocab_size": 1000, "intermediate_size": 512}


@FAST
@given(changes=st.dictionaries(st.sampled_from(sorted(BASE) + [
    "num_key_value_heads", "head_dim", "num_experts", "num_experts_per_tok", "text_config",
    "moe_intermediate_size", "kv_lora_rank"]), JSON, max_size=3))
def test_config_json(tmp_path_factory, changes):
    from planner.catalog.models import resolve_model

    path = tmp_path_factory.mktemp("cfg") / "config.json"
    path.write_text(json.dumps({**BASE, **changes}))
    answers_or_input_error(resolve_model, str(path))


@FAST
@given(text=st.text(alphabet='{}[]":,0123456789 aeNIf-.\\', max_size=200))
def test_config_json_text(tmp_path_factory, text):
    from planner.catalog.models import load_model_config_path

    path = tmp_path_factory.mktemp("cfg") / "config.json"
    path.write_text(text)
    answers_or_input_error(load_model_config_path, path)


# --- launch scripts and shell arithmetic ----------------------------------------------------

SHELL = st.text(alphabet="AB=$(){}:-+*/%!~<>?&|;'\"\\#\n\t 019x_", max_size=120)


@FAST
@given(body=SHELL)
def test_launch_scripts(body):
    from planner.verl.script import parse_launch_script

    answers_or_input_error(parse_launch_script,
                           body + "\npython3 -m verl.trainer.main_ppo x=$((A)) y=${B:-1}\n",
                           {"A": "2"}, "t.sh")


@FAST
@given(expression=st.text(alphabet="0123456789ABx#()+-*/%<>=!&|^~?:, ", max_size=80),
       a=st.text(alphabet="0123456789AB+*()", max_size=12),
       b=st.text(alphabet="0123456789AB+*()", max_size=12))
def test_arithmetic(expression, a, b):
    from planner.verl.arith import Arithmetic

    env = {"A": a, "B": b}
    start = time.monotonic()
    try:
        value = Arithmetic(lambda name: env.get(name, "")).evaluate(expression)
    except ValueError:  # bash's own errors, and the bounds (ResourceLimitError)
        value = None
    assert time.monotonic() - start < TIME_BOUND_S
    if value is not None:
        assert -2**63 <= value < 2**63


# --- Hydra YAML ------------------------------------------------------------------------------


@FAST
@given(text=st.one_of(st.text(alphabet="ab: -[]{}&*!\n'\"#,|>", max_size=120),
                      JSON.map(json.dumps)))
def test_yaml_documents(tmp_path_factory, text):
    pytest.importorskip("yaml")
    from planner.verl.config import read_yaml_document

    path = tmp_path_factory.mktemp("yaml") / "job.yaml"
    path.write_text(text)
    answers_or_input_error(read_yaml_document, path)


# --- profiler traces -------------------------------------------------------------------------

EVENT = st.fixed_dictionaries(
    {"ph": st.sampled_from(["X", "B", 1]), "cat": st.sampled_from(["kernel", "user_annotation",
                                                                   None]),
     "name": st.one_of(st.sampled_from(["ncclKernel_AllReduce", "gemm", "ProfilerStep#3"]),
                       JSON_LEAF),
     "ts": st.one_of(st.integers(-10, 10**6), st.floats(allow_nan=False), JSON_LEAF),
     "dur": st.one_of(st.integers(-10, 10**4), JSON_LEAF),
     "tid": st.one_of(st.integers(0, 4), JSON_LEAF)})


@FAST
@given(events=st.lists(EVENT, max_size=8), info=st.one_of(st.none(), JSON))
def test_traces(tmp_path_factory, events, info):
    from planner.diagnose.profile import profile_traces

    path = tmp_path_factory.mktemp("trace") / "t.json"
    data = {"traceEvents": events}
    if info is not None:
        data["distributedInfo"] = info
    path.write_text(json.dumps(data))
    result = answers_or_input_error(profile_traces, [str(path)])
    if isinstance(result, dict):
        for step in result["steps"]:
            assert step["step_s"] >= 0 and 0 <= step["comm_share"] and step["overlap"] >= 0


# --- sweep folders ---------------------------------------------------------------------------


@FEW
@given(sweep=st.one_of(JSON, st.fixed_dictionaries({"storage": JSON_LEAF,
                                                    "study_name": JSON_LEAF})),
       plan=st.one_of(st.none(), JSON, st.fixed_dictionaries(
           {"model": st.sampled_from(["Qwen2.5-0.5B", 5, None]),
            "cluster": st.one_of(JSON, st.fixed_dictionaries(
                {"gpu_type": st.sampled_from(["H100-80GB", "nope"]),
                 "num_gpus": st.one_of(st.integers(-2, 2**70), JSON_LEAF),
                 "gpus_per_node": st.sampled_from([1, 2, 0])})),
            "workload": st.one_of(JSON, st.fixed_dictionaries(
                {"train_batch_size": st.one_of(st.integers(-5, 2**66), JSON_LEAF),
                 "rollout_n": st.sampled_from([1, 2]), "prompt_length": st.just(64),
                 "response_length": st.just(64), "mini_batch_size": st.just(1)}))})))
def test_sweep_folders(tmp_path_factory, sweep, plan):
    pytest.importorskip("optuna")
    from planner.report.html import plan_from_sweep

    folder = tmp_path_factory.mktemp("sweep")
    (folder / "sweep.json").write_text(json.dumps(sweep))
    if plan is not None:
        (folder / "plan.json").write_text(json.dumps(plan))
    before = sorted(p.name for p in folder.iterdir())
    answers_or_input_error(plan_from_sweep, folder)
    assert sorted(p.name for p in folder.iterdir()) == before  # readers never write
