"""`plan-parallel explain`: the plan beside the rules of thumb, scored like for like."""

import json

from planner.cli.main import main


def test_explain_dense_7b(capsys):
    assert main(["explain", "--model", "qwen2.5-7b", "--gpus", "8", "--gpu-type", "h100",
                 "--format", "json"]) == 0
    data = json.loads(capsys.readouterr().out)
    rules = {entry["rule"]: entry for entry in data["rules_of_thumb"]}
    thumb = rules["7B: TP2 x PP2"]
    assert thumb["layout"]["tp"] == 2 and thumb["layout"]["pp"] == 2
    # the plan's layout is the fastest or a simpler one within the model's ranking uncertainty
    # of the fastest, so never slower than the best TP2 x PP2 one beyond that uncertainty
    from planner.cost.efficiency import ranking_uncertainty

    tolerance = float(ranking_uncertainty()["relative"])
    assert data["chosen"]["step_time_s"] <= thumb["step_time_s"] * (1 + tolerance)
    assert ("faster" in thumb["verdict"] or "as fast" in thumb["verdict"]
            or "within the model's ranking uncertainty" in thumb["verdict"])
    assert "breaks a rule" in rules["TP = GPUs per node (8)"]["verdict"]  # 28 heads, TP 8
    assert "FP32 would double weights" in rules["BF16, not FP32"]["verdict"]


def test_explain_moe_uses_expert_parallel_rule(capsys):
    assert main(["explain", "--model", "qwen3-30b", "--gpus", "16", "--gpu-type", "h100"]) == 0
    out = capsys.readouterr().out
    assert "100B+/MoE: TP4 x EP8" in out and "dominates the step" in out


def test_explain_with_no_fitting_layout_answers_no(capsys):
    assert main(["explain", "--model", "llama3.1-405b", "--gpus", "8", "--gpu-type", "h100"]) == 1
    assert "no layout of Llama-3.1-405B fits" in capsys.readouterr().err


def test_explain_rule_that_cannot_apply(capsys):
    assert main(["explain", "--model", "qwen3-0.6b", "--gpus", "4", "--gpus-per-node", "8",
                 "--gpu-type", "h100", "--format", "json"]) == 0
    rules = {e["rule"]: e for e in json.loads(capsys.readouterr().out)["rules_of_thumb"]}
    assert rules["TP = GPUs per node (8)"]["verdict"].startswith("not applicable")
