"""docs/plan.schema.json is the contract of ``--format json``: the real output of plan,
estimate (valid and invalid), sizing and the training modes validates against it, and output
that breaks it (a key added, a key missing, a wrong type) does not."""

import copy
import json
from pathlib import Path

import pytest

from planner.cli.main import main

jsonschema = pytest.importorskip("jsonschema", reason="the schema test needs jsonschema (the "
                                 "`test` extra; the base CI install lacks it)")

SCHEMA = json.loads((Path(__file__).resolve().parents[2] / "docs" / "plan.schema.json")
                    .read_text())
QWEN = ["--model", "qwen3-8b", "--gpu-type", "h100"]


def errors(data, name: str) -> list[str]:
    """The ways ``data`` breaks the schema's ``$defs[name]`` (and its root, which allows every
    output)."""
    validator = jsonschema.validators.validator_for(SCHEMA)
    validator.check_schema(SCHEMA)
    part = {"$schema": SCHEMA["$schema"], "$defs": SCHEMA["$defs"], "$ref": f"#/$defs/{name}"}
    found = [f"{list(e.absolute_path)}: {e.message}" for e in validator(part).iter_errors(data)]
    if not validator(SCHEMA).is_valid(data):
        found.append("the root schema refuses it")
    return found


def output(capsys, *argv: str, code: int = 0) -> dict:
    assert main([*argv, "--format", "json"]) == code
    return json.loads(capsys.readouterr().out)


def test_plan_json_follows_the_schema(capsys):
    data = output(capsys, *QWEN, "--gpus", "8", "--top", "5")
    assert data["candidates"] and errors(data, "plan") == []


def test_pretraining_plan_json_follows_the_schema(capsys):
    data = output(capsys, "--workload", "pretrain", "--model", "qwen3-8b", "--gpu-type", "h100",
                  "--gpus", "8", "--seq-len", "4096", "--global-batch", "64", "--top", "3")
    assert "tflops_per_gpu" in data["candidates"][0] and errors(data, "plan") == []
    # the update is the one phase it runs: no generate / weight_sync memory (they were listed,
    # generate above the peak), no rollout engine, no KV cache
    best = data["candidates"][0]
    assert best["memory_gib"] == {"update_actor": best["peak_memory_gib"]}
    assert set(best["working_set_gib"]) == {"update_actor"} and "rollout" not in best
    assert not {"ref_weights", "rollout_weights", "kv_cache"} & set(best["breakdown_gib"])


def test_json_and_csv_list_the_memory_of_the_phases_the_step_runs(capsys):
    """No KL loss and the rollout's log-probs: verl runs neither ref nor old_log_prob."""
    skipped = ["--no-kl-loss", "--bypass-old-log-prob"]
    data = output(capsys, "estimate", *QWEN, "--gpus", "8", "--tp", "2", *skipped)
    runs = {"generate", "update_actor", "weight_sync"}
    assert set(data["memory_gib"]) == set(data["working_set_gib"]) == runs
    assert errors(data, "estimate") == []
    assert main([*QWEN, "--gpus", "8", "--top", "2", "--format", "csv", *skipped]) == 0
    header = capsys.readouterr().out.splitlines()[0].split(",")
    assert {name[4:-4] for name in header if name.startswith("mem_")} == runs


def test_estimate_json_follows_the_schema(capsys):
    data = output(capsys, "estimate", *QWEN, "--gpus", "8", "--tp", "2", "--micro-batch", "4")
    assert data["valid"] and errors(data, "estimate") == []
    invalid = output(capsys, "estimate", *QWEN, "--gpus", "8", "--tp", "3", code=1)
    assert not invalid["valid"] and errors(invalid, "invalidEstimate") == []


@pytest.mark.parametrize("mode", ["one-step-off", "fully-async"])
def test_mode_plans_and_estimates_follow_the_schema(capsys, mode):
    plan = output(capsys, *QWEN, "--gpus", "16", "--mode", mode, "--trainer-gpus", "8")
    assert plan["candidates"] and errors(plan, "modePlan") == []
    estimate = output(capsys, "estimate", *QWEN, "--gpus", "16", "--mode", mode, "--tp", "2",
                      "--trainer-gpus", "8")
    assert errors(estimate, "splitEstimate") == []


def test_best_and_sync_mode_plans_follow_the_schema(capsys):
    best = output(capsys, *QWEN, "--gpus", "16", "--mode", "best", "--trainer-gpus", "8")
    assert len(best["modes"]) == 3 and errors(best, "bestPlan") == []
    sync = output(capsys, *QWEN, "--gpus", "8", "--mode", "sync", "--top", "2")
    assert errors(sync, "plan") == []  # sync's plan is the plain plan


def test_sizing_json_follows_the_schema(capsys):
    data = output(capsys, *QWEN, "--gpus", "1-8", "--price", "h100=2.5")
    assert [row["num_gpus"] for row in data["rows"]] == [1, 2, 4, 8]
    assert errors(data, "sizing") == []


def test_output_that_breaks_the_contract_is_refused(capsys):
    data = output(capsys, *QWEN, "--gpus", "8", "--top", "1")
    added = copy.deepcopy(data)
    added["candidates"][0]["surprise"] = 1
    missing = copy.deepcopy(data)
    del missing["candidates"][0]["peak_memory_gib"]
    wrong = copy.deepcopy(data)
    wrong["candidates"][0]["layout"]["tp"] = "2"
    renamed = copy.deepcopy(data)
    renamed["candidates"][0]["memory_gib"]["rollout"] = renamed["candidates"][0][
        "memory_gib"].pop("generate")
    for broken in (added, missing, wrong, renamed):
        assert errors(broken, "plan"), broken["candidates"][0].keys()


def test_a_starved_pipeline_estimate_follows_the_schema(capsys):
    data = output(capsys, "estimate", *QWEN, "--gpus", "16", "--train-batch-size", "2",
                  "--mini-batch-size", "2", "--rollout-n", "1", "--tp", "2", "--pp", "4")
    assert data["pipeline_starved"]["pipeline_stages"] == 4 and errors(data, "estimate") == []


def test_a_pool_that_counts_bytes_follows_the_schema(capsys, tmp_path):
    # every layer sliding (window 4096) and sequences of 8192 tokens: no K/V grows per token,
    # so the pool is given in GiB and its token count is null (plan and a split mode's pools)
    config = {"model_type": "mistral", "sliding_window": 4096, "num_hidden_layers": 32,
              "hidden_size": 4096, "num_attention_heads": 32, "num_key_value_heads": 8,
              "head_dim": 128, "vocab_size": 32000, "intermediate_size": 14336}
    (tmp_path / "config.json").write_text(json.dumps(config))
    lengths = ("--prompt-length", "4096", "--response-length", "4096")
    data = output(capsys, "--model", str(tmp_path), "--gpu-type", "h100", "--gpus", "16",
                  *lengths, "--top", "2")
    rollout = data["candidates"][0]["rollout"]
    assert rollout["kv_cache_tokens_per_gpu"] is None and rollout["kv_cache_gib"] > 0
    assert errors(data, "plan") == []
    data = output(capsys, "--model", str(tmp_path), "--gpu-type", "h100", "--gpus", "32",
                  *lengths, "--mode", "one-step-off", "--top", "1")
    pool = data["candidates"][0]["pools"]["rollout"]
    assert pool["kv_cache_tokens_per_gpu"] is None and pool["kv_cache_gib"] > 0
    assert errors(data, "modePlan") == []
