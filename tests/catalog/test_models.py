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
            "DeepSeek-V3",
            # the models RL runs start from
            "Qwen2.5-Math-1.5B", "Qwen2.5-Math-7B", "DeepSeek-R1-Distill-Qwen-1.5B",
            "DeepSeek-R1-Distill-Qwen-7B", "DeepSeek-R1-Distill-Qwen-14B",
            "DeepSeek-R1-Distill-Qwen-32B", "Qwen3-0.6B-Base", "Qwen3-1.7B-Base", "Qwen3-4B-Base",
            "Qwen3-8B-Base", "Qwen3-14B-Base", "Qwen3-30B-A3B-Base", "Moonlight-16B-A3B"}


def test_catalog_has_every_required_model():
    assert REQUIRED <= set(catalog_names())


@pytest.mark.parametrize("alias,name", [
    ("qwen3-30b", "Qwen3-30B-A3B"), ("qwen3-235b", "Qwen3-235B-A22B"), ("qwen2-7b", "Qwen2-7B"),
    ("llama3.1-70b", "Llama-3.1-70B"), ("deepseek-v3", "DeepSeek-V3"),
    ("Qwen/Qwen2.5-7B-Instruct", "Qwen2.5-7B"), ("meta-llama/Llama-3.1-8B", "Llama-3.1-8B"),
    ("QWEN3_8B", "Qwen3-8B"), ("mixtral-8x22b", "Mixtral-8x22B"),
    # Hugging Face ids of RL starting points resolve to their own config, by exact name
    ("Qwen/Qwen2.5-Math-7B", "Qwen2.5-Math-7B"), ("Qwen/Qwen2.5-Math-1.5B", "Qwen2.5-Math-1.5B"),
    ("Qwen/Qwen2.5-Math-7B-Instruct", "Qwen2.5-Math-7B"),
    ("deepseek-ai/DeepSeek-R1-Distill-Qwen-1.5B", "DeepSeek-R1-Distill-Qwen-1.5B"),
    ("deepseek-ai/DeepSeek-R1-Distill-Qwen-32B", "DeepSeek-R1-Distill-Qwen-32B"),
    ("Qwen/Qwen3-8B-Base", "Qwen3-8B-Base"), ("Qwen/Qwen3-8B", "Qwen3-8B"),
    ("Qwen/Qwen3-30B-A3B-Base", "Qwen3-30B-A3B-Base"),
    ("moonshotai/Moonlight-16B-A3B", "Moonlight-16B-A3B"),
    ("moonshotai/Moonlight-16B-A3B-Instruct", "Moonlight-16B-A3B"),
    # the Qwen3.5 family and GLM-4.6; Qwen3.6-27B and GLM-4.7 publish the same sizes
    ("Qwen/Qwen3.5-397B-A17B", "Qwen3.5-397B-A17B"), ("qwen3.5-122b", "Qwen3.5-122B-A10B"),
    ("Qwen/Qwen3.5-27B", "Qwen3.5-27B"), ("qwen3.6-27b", "Qwen3.5-27B"),
    ("Qwen/Qwen3.5-0.8B", "Qwen3.5-0.8B"), ("Qwen/Qwen3.5-0.8B-Base", "Qwen3.5-0.8B"),
    ("zai-org/GLM-4.6", "GLM-4.6"), ("glm-4.7", "GLM-4.6")])
def test_aliases(alias, name):
    assert resolve_model(alias).name == name


@pytest.mark.parametrize("hf_id", ["Qwen/Qwen2.5-Coder-7B", "deepseek-ai/DeepSeek-R1-Distill-Llama-8B",
                                   "Qwen/Qwen2.5-Math-72B", "Qwen/Qwen3-32B-Math"])
def test_unknown_hf_ids_of_known_architectures_are_an_error_not_a_lookalike(hf_id):
    with pytest.raises(PlanInputError) as error:
        resolve_model(hf_id)
    message = str(error.value)
    assert hf_id in message and "exact name" in message and "config.json" in message


def test_the_new_rl_models_differ_from_their_lookalikes_where_their_configs_do():
    distill, math = resolve_model("DeepSeek-R1-Distill-Qwen-1.5B"), resolve_model("Qwen2.5-Math-1.5B")
    assert not distill.tied_embeddings and math.tied_embeddings  # 1.78B vs 1.54B parameters
    assert round(distill.params.total / 1e9, 2) == 1.78 and round(math.params.total / 1e9, 2) == 1.54
    moon = resolve_model("moonlight")
    assert (moon.num_layers, moon.num_experts, moon.moe_top_k, moon.moe_ffn_hidden_size,
            moon.shared_expert_ffn_hidden_size, moon.num_dense_layers, moon.kv_lora_rank,
            moon.q_lora_rank, moon.vocab_size) == (27, 64, 6, 1408, 2816, 1, 512, 0, 163840)
    assert 15.5e9 < moon.params.total < 16.5e9 and 2.5e9 < moon.params.active < 3.5e9  # "16B-A3B"
    assert builtin_config_dict("Qwen3-8B-Base")["max_position_embeddings"] == 32768


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


def test_a_bad_value_transformers_filled_in_is_named_as_its_class_default(tmp_path):
    # Qwen2Config's num_key_value_heads defaults to 32 when config.json sets none: a 16-head
    # model would have 32 KV heads, a model transformers cannot build either
    pytest.importorskip("transformers")
    config = {"model_type": "qwen2", "hidden_size": 2048, "intermediate_size": 5504,
              "num_hidden_layers": 24, "num_attention_heads": 16, "vocab_size": 151936}
    (tmp_path / "config.json").write_text(json.dumps(config))
    with pytest.raises(PlanInputError) as error:
        resolve_model(str(tmp_path))
    assert "num_key_value_heads 32 (num_key_value_heads=32: transformers' class default for " \
           "model_type 'qwen2'" in str(error.value) and "does not set; set it there" in str(
               error.value)
    config["num_key_value_heads"] = 16  # set in the file: read as given
    (tmp_path / "config.json").write_text(json.dumps(config))
    assert resolve_model(str(tmp_path)).num_query_groups == 16


def test_a_local_directory_named_like_a_catalog_model_is_read_from_its_file(tmp_path):
    """A Hugging Face download is a folder named after the model (``~/models/Qwen3-8B``): its
    own config.json is what gets planned, not the catalog entry of the same name (which used
    to win, silently ignoring a changed context, layer count or fine-tune's config)."""
    config = builtin_config_dict("Qwen3-8B")
    config["num_hidden_layers"] = 12
    folder = tmp_path / "Qwen3-8B"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps(config))
    assert resolve_model(str(folder)).num_layers == 12
    assert resolve_model(str(folder / "config.json")).num_layers == 12
    # a path that is not here (the cluster's) still names the catalog model
    assert resolve_model(str(tmp_path / "elsewhere" / "Qwen3-8B")).num_layers == 36
    # ... and so does a folder of that name without a config.json
    (tmp_path / "empty" / "Qwen3-8B").mkdir(parents=True)
    assert resolve_model(str(tmp_path / "empty" / "Qwen3-8B")).num_layers == 36


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


@pytest.mark.needs("verl")
def test_a_config_transformers_refuses_is_one_line_with_its_reason(tmp_path):
    """transformers' validation error is a heading whose reason is on the next line; the one-line
    error keeps both (without transformers the planner's own check names layer_types too)."""
    config = {"architectures": ["Qwen3NextForCausalLM"],
              "model_type": "qwen3_next",
              "hidden_size": 2048,
              "intermediate_size": 5120,
              "num_attention_heads": 16,
              "num_key_value_heads": 2,
              "head_dim": 256,
              "num_hidden_layers": 24,
              "vocab_size": 151936,
              "max_position_embeddings": 65536,
              "num_experts": 128,
              "num_experts_per_tok": 8,
              "moe_intermediate_size": 512,
              "shared_expert_intermediate_size": 512,
              "decoder_sparse_step": 1,
              "mlp_only_layers": [],
              "full_attention_interval": 4,
              "linear_num_key_heads": 16,
              "linear_num_value_heads": 32,
              "linear_key_head_dim": 128,
              "linear_value_head_dim": 128,
              "linear_conv_kernel_dim": 4}
    # ten layer types for 24 layers
    config["layer_types"] = (["linear_attention"] * 3 + ["full_attention"]) * 2 \
        + ["linear_attention"] * 2
    path = tmp_path / "config.json"
    path.write_text(json.dumps(config))
    with pytest.raises(PlanInputError) as error:
        resolve_model(str(path))
    message = str(error.value)
    assert "\n" not in message
    assert "transformers cannot read it" in message
    assert "`num_hidden_layers` (24) must be equal to the number of `layer_types` (10)" in message


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
    for name in sorted(REQUIRED):  # the newer families: tests/catalog/test_architectures.py
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


def test_difflib_is_imported_by_an_unknown_name_alone():
    """The closest-name hints import difflib when a name is unknown, not at every start."""
    import subprocess
    import sys

    code = ("import sys; import planner.plan, planner.cli.commands, planner.report.text; "
            "print('difflib' in sys.modules)")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert result.stdout.strip() == "False", result.stdout + result.stderr
    with pytest.raises(PlanInputError, match="Qwen3-32B"):
        resolve_model("qwen3-31b")
