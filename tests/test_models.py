"""Model catalog: lookup, local config.json files, and parameter counts vs transformers."""

import json

import pytest

from planner.catalog.models import (
    builtin_config_dict,
    builtin_model,
    catalog_names,
    param_counts,
    resolve_model,
)
from planner.errors import PlanInputError

REQUIRED = {"Qwen2-7B", "Qwen2.5-0.5B", "Qwen2.5-1.5B", "Qwen2.5-3B", "Qwen2.5-7B",
            "Qwen2.5-14B", "Qwen2.5-32B", "Qwen2.5-72B", "Qwen3-0.6B", "Qwen3-1.7B", "Qwen3-4B",
            "Qwen3-8B", "Qwen3-14B", "Qwen3-32B", "Qwen3-30B-A3B", "Qwen3-235B-A22B",
            "Llama-3.1-8B", "Llama-3.1-70B", "Llama-3.1-405B", "Mixtral-8x7B", "Mixtral-8x22B",
            "DeepSeek-V3"}


def test_catalog_has_every_required_model():
    assert REQUIRED <= set(catalog_names())


@pytest.mark.parametrize("alias,name", [
    ("qwen3-30b", "Qwen3-30B-A3B"), ("qwen3-235b", "Qwen3-235B-A22B"), ("qwen2-7b", "Qwen2-7B"),
    ("llama3.1-70b", "Llama-3.1-70B"), ("deepseek-v3", "DeepSeek-V3"),
    ("Qwen/Qwen2.5-7B-Instruct", "Qwen2.5-7B"), ("meta-llama/Llama-3.1-8B", "Llama-3.1-8B"),
    ("QWEN3_8B", "Qwen3-8B"), ("mixtral-8x22b", "Mixtral-8x22B")])
def test_aliases(alias, name):
    assert resolve_model(alias).name == name


def test_unknown_model_names_closest_matches():
    with pytest.raises(PlanInputError) as error:
        resolve_model("qwen3-31b")
    message = str(error.value)
    assert "qwen3-31b" in message and "Qwen3-32B" in message and "\n" not in message


def test_architecture_facts_match_reference_csv():
    """Spot-check the shipped configs against ../shared/reference/model_arch.csv values."""
    dsv3 = resolve_model("deepseek-v3")
    assert (dsv3.num_layers, dsv3.hidden_size, dsv3.num_experts, dsv3.moe_top_k,
            dsv3.num_dense_layers, dsv3.kv_lora_rank, dsv3.q_lora_rank) == (61, 7168, 256, 8, 3,
                                                                            512, 1536)
    moe = resolve_model("qwen3-30b")
    assert (moe.num_layers, moe.num_experts, moe.moe_top_k, moe.moe_ffn_hidden_size,
            moe.num_query_groups, moe.head_dim) == (48, 128, 8, 768, 4, 128)
    assert resolve_model("qwen3-0.6b").tied_embeddings
    assert resolve_model("qwen2.5-7b").qkv_bias and not resolve_model("llama3.1-8b").qkv_bias


def test_local_config_json_is_read_with_transformers(tmp_path):
    config = builtin_config_dict("Qwen3-8B")
    config["num_hidden_layers"] = 12
    folder = tmp_path / "my-model"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps(config))
    spec = resolve_model(str(folder))
    assert spec.name == "my-model" and spec.num_layers == 12
    assert resolve_model(str(folder / "config.json")).num_layers == 12


@pytest.mark.parametrize("content,needle", [
    ("{not json", "cannot read"),
    pytest.param(json.dumps({"model_type": "no-such-arch", "hidden_size": 8,
                             "num_attention_heads": 2, "num_hidden_layers": 2,
                             "vocab_size": 10}), "transformers cannot read",
                 marks=pytest.mark.needs("verl")),
    (json.dumps([1, 2]), "not a JSON object"),
    (json.dumps({"hidden_size": 8, "num_attention_heads": 2, "num_hidden_layers": 2,
                 "vocab_size": 10}), "no model_type"),
    # a missing size is an error naming it, never transformers' class default
    (json.dumps({"model_type": "llama", "num_attention_heads": 2, "num_hidden_layers": 2,
                 "vocab_size": 10}), "lacks 'hidden_size'"),
])
def test_malformed_config_json(tmp_path, content, needle):
    path = tmp_path / "config.json"
    path.write_text(content)
    with pytest.raises(PlanInputError, match=needle):
        resolve_model(str(path))


def test_directory_without_config_json(tmp_path):
    with pytest.raises(PlanInputError, match="no config.json"):
        resolve_model(str(tmp_path))


def test_moe_active_params_are_top_k_experts():
    model = resolve_model("qwen3-30b")
    p = param_counts(model)
    per_expert = 3 * model.hidden_size * model.moe_ffn_hidden_size
    assert p.total - p.active == (model.num_experts - model.moe_top_k) * per_expert * 48
    assert 3.3e9 < p.active < 3.4e9  # the "A3B" in the name


# --- against the real module tree -----------------------------------------------------------

def _hf_component(name: str) -> str:
    if "embed_tokens" in name:
        return "embedding"
    if name.startswith("lm_head"):
        return "output_layer"
    if ".self_attn." in name:
        return "attention"  # projections, biases and the attention's own norms
    if "norm" in name:
        return "norms"
    if ".mlp.gate.weight" in name or "e_score_correction_bias" in name:
        return "router"
    if ".mlp.experts." in name:
        return "experts"
    if ".mlp.shared_expert" in name:
        return "shared_experts"
    if ".mlp." in name:
        return "dense_mlp"
    raise AssertionError(f"unclassified parameter {name}")


@pytest.fixture(scope="module")
def hf_counts():
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    counts = {}
    for name in catalog_names():
        config = transformers.AutoConfig.for_model(**builtin_config_dict(name))
        with torch.device("meta"):
            model = transformers.AutoModelForCausalLM.from_config(config)
        parts = dict.fromkeys(["embedding", "output_layer", "attention", "dense_mlp", "router",
                               "experts", "shared_experts", "norms"], 0)
        for param_name, param in model.named_parameters():
            parts[_hf_component(param_name)] += param.numel()
        # DeepSeek-V3's router correction bias is a buffer in transformers 5, a parameter in
        # the checkpoint and in Megatron: count it.
        for buffer_name, buffer in model.named_buffers():
            if "e_score_correction_bias" in buffer_name:
                parts["router"] += buffer.numel()
        parts["total"] = sum(parts.values())
        counts[name] = parts
    return counts


@pytest.mark.parametrize("name", sorted(REQUIRED))
def test_param_counts_match_transformers_exactly(name, hf_counts):
    """Every component and the total agree exactly with transformers' module tree on meta."""
    ours = param_counts(builtin_model(name)).to_dict()
    theirs = hf_counts[name]
    for component in ("embedding", "output_layer", "attention", "dense_mlp", "router",
                      "experts", "shared_experts", "norms", "total"):
        assert ours[component] == theirs[component], component
