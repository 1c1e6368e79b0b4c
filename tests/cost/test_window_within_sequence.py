"""Windowed layers whose window holds the whole sequence are full attention (vLLM frees none of
their pages, the kernel masks no key); a model that still keeps no K/V growing per token prints
its rollout pool in GiB, never bytes called tokens (text and JSON)."""

import json
from dataclasses import replace

import pytest
from conftest import cluster

from planner.catalog.layers import MixerKind
from planner.catalog.models import (
    builtin_config_dict,
    model_at_length,
    spec_from_hf_config,
    windows_within,
)
from planner.catalog.workload import GrpoWorkload
from planner.cli.main import main
from planner.cost.flops import kv_grows_only
from planner.cost.request import PlanRequest
from planner.units import GIB

# Mistral-7B-v0.1's config.json (every layer sliding, window 4096)
MISTRAL = {"architectures": ["MistralForCausalLM"], "model_type": "mistral",
           "sliding_window": 4096, "num_hidden_layers": 32, "hidden_size": 4096,
           "num_attention_heads": 32, "num_key_value_heads": 8, "head_dim": 128,
           "vocab_size": 32000, "intermediate_size": 14336, "max_position_embeddings": 32768,
           "rms_norm_eps": 1e-05, "rope_theta": 10000.0, "tie_word_embeddings": False,
           "torch_dtype": "bfloat16", "hidden_act": "silu"}
KV_BYTES_PER_TOKEN_TP4 = 32 * 2 * (8 // 4) * 128 * 2  # layers, K+V, KV heads per rank, bf16


@pytest.fixture(scope="module")
def mistral():
    return spec_from_hf_config(MISTRAL, "mistral-test")


@pytest.fixture
def mistral_dir(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps(MISTRAL))
    return str(tmp_path)


def test_a_window_holding_the_sequence_is_full_attention(mistral):
    assert {layer.mixer for layer in mistral.layers} == {MixerKind.SLIDING}
    within = model_at_length(mistral, 4096)  # the window holds 4096 tokens: all of them
    assert {layer.mixer for layer in within.layers} == {MixerKind.FULL}
    assert kv_grows_only(within) and within.kv_layers == 32
    assert windows_within(mistral, within) == "32 sliding_attention(4096)"
    assert model_at_length(mistral, 4097) is mistral  # one token more: windowed again
    # the same model without a window: nothing else differs
    full = spec_from_hf_config({k: v for k, v in MISTRAL.items() if k != "sliding_window"},
                               "mistral-test")
    assert within == full


def test_request_costs_the_model_its_sequences_see_and_windows_again_when_longer(mistral):
    short = PlanRequest(mistral, cluster(8), GrpoWorkload(prompt_length=1024,
                                                          response_length=1024))
    assert short.model.kv_layers == 32 and short.given_model is mistral
    longer = replace(short, workload=GrpoWorkload(prompt_length=4096, response_length=4096))
    assert longer.model is mistral and longer.given_model is None
    back = replace(longer, workload=short.workload)
    assert back.model == short.model and back.given_model is mistral
    another = replace(mistral, name="another")  # a variant with a new model: its own windows
    other = replace(short, model=another, workload=longer.workload)
    assert other.model is another and other.given_model is None


def _estimate(capsys, model_dir, prompt, response, *extra):
    code = main(["estimate", "--model", model_dir, "--gpus", "8", "--gpu-type", "h100",
                 "--prompt-length", str(prompt), "--response-length", str(response),
                 "--rollout-tp", "4", *extra])
    out, err = capsys.readouterr()
    assert code == 0, err
    return out, err


def test_mistral_within_its_window_prints_real_kv_tokens(capsys, mistral_dir):
    out, err = _estimate(capsys, mistral_dir, 1024, 1024, "--format", "json")
    rollout = json.loads(out)["rollout"]
    kv_bytes = json.loads(out)["breakdown_gib"]["kv_cache"] * GIB
    # the pool over 32 layers' K/V per token (was 2,834,456,166 "tokens": the pool in bytes)
    assert rollout["kv_cache_tokens_per_gpu"] == pytest.approx(
        kv_bytes / KV_BYTES_PER_TOKEN_TP4, rel=1e-3)
    assert 80_000 < rollout["kv_cache_tokens_per_gpu"] < 90_000
    assert "kv_cache_gib" not in rollout
    assert "note: 32 sliding_attention(4096) layers of " in err
    assert "every 2,048-token sequence (prompt + response) fits in the window" in err
    text, _ = _estimate(capsys, mistral_dir, 1024, 1024)
    assert f"rollout:            {rollout['kv_cache_tokens_per_gpu']:,} KV tokens per GPU" in text


def test_windowed_only_model_beyond_its_window_prints_the_pool_in_gib(capsys, mistral_dir):
    out, err = _estimate(capsys, mistral_dir, 4096, 4096, "--tp", "2", "--format", "json")
    data = json.loads(out)
    rollout, fill = data["rollout"], data["fill_gpu"]
    assert rollout["kv_cache_tokens_per_gpu"] is None  # no K/V grows per token: no tokens
    assert rollout["kv_cache_gib"] == data["breakdown_gib"]["kv_cache"] > 1
    assert fill["kv_cache_tokens_per_gpu"] is None and fill["kv_cache_gib"] > rollout[
        "kv_cache_gib"]
    assert "sliding_attention(4096) layers" not in err  # nothing costed as full attention
    text, _ = _estimate(capsys, mistral_dir, 4096, 4096, "--tp", "2")
    line = next(row for row in text.splitlines() if row.startswith("rollout:"))
    assert line.startswith(f"rollout:            {rollout['kv_cache_gib']:.2f} GiB KV cache "
                           f"per GPU, {rollout['concurrent_seqs']} sequences at once")
    assert f"{fill['kv_cache_gib']:.2f} GiB KV cache per GPU, nvidia-smi peak" in text
    assert "KV tokens" not in text


def test_a_sizing_sweep_notes_the_windows_it_costs_as_full_attention(capsys, mistral_dir):
    assert main(["--model", mistral_dir, "--gpus", "8-16", "--gpu-type", "h100"]) == 0
    err = capsys.readouterr().err
    assert err.count("32 sliding_attention(4096) layers of ") == 1  # once, not per count


def test_an_attention_free_model_prints_its_state_pool_in_gib(capsys, tmp_path):
    # Nemotron-3-Nano with its six attention layers made Mamba-2: only state pages
    config = {key: value for key, value in builtin_config_dict(
        "NVIDIA-Nemotron-3-Nano-30B-A3B").items() if key != "_source"}
    config["hybrid_override_pattern"] = config["hybrid_override_pattern"].replace("*", "M")
    (tmp_path / "config.json").write_text(json.dumps(config))
    argv = ["--model", str(tmp_path), "--gpus", "16", "--gpu-type", "h100", "--top", "1"]
    assert main([*argv, "--format", "json"]) == 0
    best = json.loads(capsys.readouterr().out)["candidates"][0]
    assert best["rollout"]["kv_cache_tokens_per_gpu"] is None
    assert best["rollout"]["kv_cache_gib"] == best["breakdown_gib"]["kv_cache"] > 1
    assert main(argv) == 0
    text = capsys.readouterr().out
    assert f"holds {best['rollout']['kv_cache_gib']:.2f} GiB KV cache/GPU" in text
    assert "KV tokens" not in text


def test_validate_findings_of_a_pool_of_bytes_speak_gib(mistral):
    from planner.diagnose.validate import memory_findings
    from planner.plan import estimate_layout
    from planner.search.layout import Layout
    from planner.verl.pools import Pools, pool_memory

    request = PlanRequest(mistral, cluster(8), GrpoWorkload(prompt_length=4096,
                                                            response_length=4096))
    layout = Layout(tp=2, dp=4, rollout_tp=4, gpu_memory_utilization=0.06)  # no room left
    found = [f.message for f in memory_findings(estimate_layout(request, layout))]
    # one sequence: 32 layers x (4096 / 16 + 1) pages x 16 tokens x 2 KV heads x 2 x 128 x 2 B
    assert ("rollout KV cache holds 0.00 GiB per GPU, less than one sequence's 0.13 GiB of "
            "pages") in found[0]
    report, findings = pool_memory(request, Pools(cluster(8), cluster(8)), layout)
    assert report["rollout"]["kv_cache_tokens_per_gpu"] is None
    assert "holds 0.00 GiB KV cache per GPU (one sequence needs 0.13 GiB of pages)" in \
        findings[-1].message
