"""Every architecture verl runs on Megatron, as a list of layer kinds: the config.json key
variants, parameter counts against transformers' meta-device models, FLOPs against verl's
FlopsCounter, and the catalog entries of the 2026 RL models."""

import types

import numpy as np
import pytest

from planner.catalog.layers import LayerSpec, MixerKind, MlpKind
from planner.catalog.models import (
    builtin_config_dict,
    builtin_model,
    catalog_names,
    spec_from_hf_config,
)
from planner.cost.flops import verl_training_flops_per_sequence
from planner.errors import PlanInputError

# transformers' default config of each model type is a real architecture; fewer layers keep the
# meta-device build fast (the layer patterns survive: interval 4, first-k dense, alternation).
FAMILY_CONFIGS = {
    "llama": {}, "mistral": {}, "qwen2": {}, "qwen3": {}, "qwen2_moe": {"num_hidden_layers": 4},
    "qwen3_moe": {"num_hidden_layers": 4}, "mixtral": {"num_hidden_layers": 4},
    "olmoe": {"num_hidden_layers": 4}, "qwen3_next": {"num_hidden_layers": 8},
    "qwen3_5_text": {"num_hidden_layers": 8}, "qwen3_5_moe_text": {"num_hidden_layers": 8},
    "deepseek_v2": {"num_hidden_layers": 4, "num_experts_per_tok": 6,
                    "first_k_dense_replace": 1},
    "deepseek_v3": {"num_hidden_layers": 5}, "glm4_moe": {"num_hidden_layers": 3},
    "glm4_moe_lite": {"num_hidden_layers": 3}, "gpt_oss": {"num_hidden_layers": 4},
    "nemotron_h": {}, "llama4_text": {"num_hidden_layers": 8, "interleave_moe_layer_step": 2},
    "ernie4_5_moe": {"num_hidden_layers": 4},
    # vision-language wrappers: the vision tower counts in the total
    "qwen3_vl": {}, "qwen3_vl_moe": {}, "qwen3_5": {}, "qwen3_5_moe": {}, "qwen2_5_vl": {},
    "llama4": {},
}
NEW_CATALOG = ["Qwen3.5-35B-A3B", "Qwen3-Next-80B-A3B", "NVIDIA-Nemotron-3-Nano-30B-A3B",
               "NVIDIA-Nemotron-3-Super-120B-A12B", "gpt-oss-20b", "gpt-oss-120b", "GLM-4.5",
               "GLM-4.5-Air", "Kimi-K2", "Llama-4-Scout-17B-16E", "Llama-4-Maverick-17B-128E",
               "MiMo-7B", "Qwen3-VL-30B-A3B", "Qwen3.5-397B-A17B", "Qwen3.5-122B-A10B",
               "Qwen3.5-27B", "Qwen3.5-0.8B", "GLM-4.6"]
# Remote-code model types transformers does not know: the same module tree under its own type.
TRANSFORMERS_TYPE = {"kimi_k2": "deepseek_v3", "mimo": "qwen2"}


def _transformers_config(transformers, model_type, overrides):
    config = transformers.AutoConfig.for_model(model_type, **overrides)
    if hasattr(config, "vision_config"):  # shrink the language model, keep its pattern
        text = config.text_config
        text.num_hidden_layers = 4
        for key in ("layer_types", "no_rope_layers"):
            if getattr(text, key, None):
                setattr(text, key, list(getattr(text, key))[:4])
        if model_type == "llama4":
            text.moe_layers = [i for i in text.moe_layers if i < 4]
    return config


def _meta_count(torch, transformers, config) -> int:
    """transformers' parameter count on the meta device (+ the router correction biases that
    transformers 5 keeps as buffers while the checkpoint and Megatron hold them)."""
    auto = (transformers.AutoModelForImageTextToText if hasattr(config, "vision_config")
            else transformers.AutoModelForCausalLM)
    with torch.device("meta"):
        model = auto.from_config(config)
    return (sum(p.numel() for p in model.parameters())
            + sum(b.numel() for name, b in model.named_buffers()
                  if "e_score_correction_bias" in name))


@pytest.mark.needs("verl")
@pytest.mark.parametrize("model_type", sorted(FAMILY_CONFIGS))
def test_family_params_equal_transformers_meta_count(model_type):
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    config = _transformers_config(transformers, model_type, FAMILY_CONFIGS[model_type])
    spec = spec_from_hf_config(config.to_dict(), model_type)
    assert spec.params.total == _meta_count(torch, transformers, config)


@pytest.mark.needs("verl")
@pytest.mark.parametrize("name", NEW_CATALOG)
def test_catalog_entry_total_equals_transformers_meta_count(name):
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    raw = {k: v for k, v in builtin_config_dict(name).items() if not k.startswith("_")}
    raw["model_type"] = TRANSFORMERS_TYPE.get(raw["model_type"], raw["model_type"])
    text = raw.get("text_config", {})
    if "attn_temperature_tuning" in text:  # Llama-4 publishes 4; transformers 5 wants a bool
        text["attn_temperature_tuning"] = bool(text["attn_temperature_tuning"])
    config = transformers.AutoConfig.for_model(**raw)
    assert builtin_model(name).params.total == _meta_count(torch, transformers, config)


def test_every_catalog_entry_is_checked_against_transformers():
    """A catalog file joins NEW_CATALOG here or REQUIRED in test_models.py, whose tests compare
    its parameter total with transformers' meta-device build; none ships unchecked."""
    from test_models import REQUIRED  # the sibling module pytest imported by its basename

    assert set(catalog_names()) <= set(NEW_CATALOG) | REQUIRED


def test_qwen35_family_and_glm46_entries_have_their_published_shapes():
    """The sizes in each name ("397B-A17B") and the layer patterns of the published configs."""
    big = builtin_model("Qwen3.5-397B-A17B")
    assert big.layer_counts == {"linear_attention": 45, "full_attention": 15}
    assert (big.num_experts, big.moe_top_k, big.moe_ffn_hidden_size,
            big.shared_expert_ffn_hidden_size, big.shared_expert_gate) == (512, 10, 1024, 1024, True)
    assert big.linear_attention.num_value_heads == 64 and big.vision is not None
    assert 396e9 < big.params.total < 398e9 and 16.5e9 < big.params.active < 17.5e9
    mid = builtin_model("Qwen3.5-122B-A10B")
    assert mid.layer_counts == {"linear_attention": 36, "full_attention": 12}
    assert (mid.num_experts, mid.moe_top_k, mid.hidden_size) == (256, 8, 3072)
    assert 122e9 < mid.params.total < 123e9 and 9.5e9 < mid.params.active < 10.5e9
    dense = builtin_model("Qwen3.5-27B")
    assert dense.layer_counts == {"linear_attention": 48, "full_attention": 16}
    assert not dense.is_moe and dense.count(mlp="dense") == 64 and dense.mtp_layers == 1
    assert 27e9 < dense.params.total < 28e9 and dense.kv_layers == 16
    small = builtin_model("Qwen3.5-0.8B")
    assert small.layer_counts == {"linear_attention": 18, "full_attention": 6}
    assert small.tied_embeddings and small.linear_attention.state_dtype == "float32"
    assert 0.8e9 < small.params.total < 0.9e9 and small.vision is not None
    glm46, glm45 = builtin_model("GLM-4.6"), builtin_model("GLM-4.5")
    assert glm46.params == glm45.params and glm46.mtp_layers == 1  # 4.6 changed no size
    assert builtin_config_dict("GLM-4.6")["max_position_embeddings"] == 202752
    assert builtin_config_dict("GLM-4.5")["max_position_embeddings"] == 131072


def test_new_catalog_entries_are_there_with_their_layer_kinds():
    assert set(NEW_CATALOG) <= set(catalog_names())
    q35 = builtin_model("Qwen3.5-35B-A3B")
    assert q35.layer_counts == {"linear_attention": 30, "full_attention": 10}
    assert q35.kv_layers == 10 and q35.linear_attention.state_dtype == "float32"
    assert q35.vision is not None and q35.mtp_layers == 1
    assert 34e9 < q35.params.total < 36e9 and 3e9 < q35.params.active < 4e9  # "35B-A3B"
    oss = builtin_model("gpt-oss-120b")
    assert oss.layers[0] == LayerSpec(MixerKind.SLIDING, MlpKind.MOE, 128)
    assert oss.layers[1] == LayerSpec(MixerKind.FULL, MlpKind.MOE)
    nano = builtin_model("NVIDIA-Nemotron-3-Nano-30B-A3B")
    assert nano.layer_counts == {"mamba2": 23, "none": 23, "full_attention": 6}
    assert nano.count(mlp=MlpKind.MOE) == 23 and nano.mamba.ssm_state_dtype == "float32"
    scout = builtin_model("Llama-4-Scout-17B-16E")
    assert scout.layer_counts == {"chunked_attention": 36, "full_attention": 12}
    maverick = builtin_model("Llama-4-Maverick-17B-128E")
    assert maverick.count(mlp="dense") == 24 and maverick.count(mlp="moe") == 24


# --- every key variant --------------------------------------------------------------------

def _moe_config(**extra):
    return {"model_type": "qwen3_moe", "architectures": ["Qwen3MoeForCausalLM"],
            "hidden_size": 256, "num_attention_heads": 4, "num_key_value_heads": 2,
            "num_hidden_layers": 6, "vocab_size": 1000, "intermediate_size": 512,
            "moe_intermediate_size": 128, "num_experts": 8, "num_experts_per_tok": 2, **extra}


@pytest.mark.parametrize("model_type,keys,top_k", [
    ("ernie4_5_moe", {"moe_num_experts": 64, "moe_k": 6}, 6),
    ("hunyuan_v1_moe", {"num_experts": 64, "moe_topk": [8, 8, 8, 8, 8, 8]}, 8),
    ("dots1", {"n_routed_experts": 128, "num_experts_per_tok": 6, "n_shared_experts": 2,
               "first_k_dense_replace": 1}, 6),
])
def test_moe_top_k_keys_of_every_family_are_read(model_type, keys, top_k):
    config = _moe_config(model_type=model_type, **keys)
    del config["num_experts"], config["num_experts_per_tok"]
    config.update(keys)
    spec = spec_from_hf_config(config, model_type)
    assert spec.is_moe and spec.moe_top_k == top_k


def test_longcat_top_k_is_read_and_its_layout_refused_by_name():
    from planner.catalog import hf_config

    config = _moe_config(model_type="longcat_flash", moe_topk=12, n_routed_experts=512,
                         zero_expert_num=256)
    del config["num_experts_per_tok"], config["num_experts"]
    assert hf_config.experts_per_token(config, "longcat") == 12
    with pytest.raises(PlanInputError, match="zero_expert_num"):
        spec_from_hf_config(config, "longcat")


def test_dots_llm1_reads_as_moe_with_dense_first_layer():
    config = _moe_config(model_type="dots1", n_routed_experts=128, num_experts_per_tok=6,
                         n_shared_experts=2, first_k_dense_replace=1)
    del config["num_experts"]
    spec = spec_from_hf_config(config, "dots.llm1")
    assert spec.num_experts == 128 and spec.count(mlp="dense") == 1
    assert spec.shared_expert_ffn_hidden_size == 2 * 128


def test_moe_intermediate_size_zero_is_an_input_error_naming_the_field():
    with pytest.raises(PlanInputError, match="moe_intermediate_size 0 for an MoE model"):
        spec_from_hf_config(_moe_config(moe_intermediate_size=0), "bad")


def test_mlp_only_layers_and_sparse_step_are_read_not_refused():
    spec = spec_from_hf_config(_moe_config(mlp_only_layers=[0, 3], decoder_sparse_step=1), "m")
    assert [layer.mlp.value for layer in spec.layers] == ["dense", "moe", "moe", "dense", "moe",
                                                          "moe"]
    spec = spec_from_hf_config(_moe_config(decoder_sparse_step=2), "m")
    assert [layer.mlp.value for layer in spec.layers] == ["dense", "moe"] * 3
    deepseek = spec_from_hf_config(_moe_config(first_k_dense_replace=2, moe_layer_freq=2), "d")
    assert [layer.mlp.value for layer in deepseek.layers][:5] == ["dense", "dense", "moe",
                                                                 "dense", "moe"]


def test_unknown_layer_type_is_an_error_naming_it():
    config = _moe_config(layer_types=["full_attention"] * 5 + ["lightning_attention"])
    with pytest.raises(PlanInputError, match="'lightning_attention'"):
        spec_from_hf_config(config, "m")


def test_layer_type_interval_and_windows_are_read():
    nxt = spec_from_hf_config(builtin_config_dict("Qwen3-Next-80B-A3B")
                              | {"layer_types": None}, "next")
    assert nxt.layer_counts == {"linear_attention": 36, "full_attention": 12}
    assert [layer.mixer.value for layer in nxt.layers[:4]] == ["linear_attention"] * 3 + [
        "full_attention"]
    qwen2 = spec_from_hf_config(_moe_config(use_sliding_window=True, sliding_window=4096,
                                            max_window_layers=4), "w")
    assert [layer.window for layer in qwen2.layers] == [0, 0, 0, 0, 4096, 4096]


def test_nemotron_pattern_pipeline_cuts_and_unknown_blocks():
    config = dict(builtin_config_dict("NVIDIA-Nemotron-3-Nano-30B-A3B"))
    config["hybrid_override_pattern"] = config["hybrid_override_pattern"][:26] + "|" + \
        config["hybrid_override_pattern"][26:]
    assert spec_from_hf_config(config, "n").layers == builtin_model(
        "NVIDIA-Nemotron-3-Nano-30B-A3B").layers
    config["hybrid_override_pattern"] = "MEM*X" + config["hybrid_override_pattern"][5:]
    with pytest.raises(PlanInputError, match="'X'"):
        spec_from_hf_config(config, "n")


@pytest.mark.needs("verl")
def test_dense_nemotron_h_config_is_not_read_as_moe(tmp_path):
    """A Nemotron-H without MoE blocks (no 'E' in hybrid_override_pattern, no MoE keys, as the
    dense Nemotron-H releases publish it): transformers' NemotronHConfig fills n_routed_experts=8
    and num_experts_per_tok=2 as class defaults, but no layer holds an expert -- a dense model,
    on which megatron-core refuses expert parallelism ('num_moe_experts must be non None to use
    expert-parallel')."""
    import json

    from planner.catalog.hardware import ClusterSpec, get_gpu
    from planner.catalog.models import load_model_config_path
    from planner.catalog.workload import GrpoWorkload
    from planner.search.rules import explain

    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    moe_keys = ("n_routed_experts", "num_experts_per_tok", "moe_intermediate_size",
                "moe_shared_expert_intermediate_size", "n_shared_experts", "n_group",
                "topk_group", "routed_scaling_factor", "norm_topk_prob")
    raw = {key: value for key, value in builtin_config_dict("NVIDIA-Nemotron-3-Nano-30B-A3B")
           .items() if not key.startswith("_") and key not in moe_keys}
    raw |= {"hybrid_override_pattern": "M-M-M*-M-M*-", "num_hidden_layers": 12}
    (tmp_path / "config.json").write_text(json.dumps(raw))
    spec = load_model_config_path(tmp_path)
    assert (spec.is_moe, spec.num_experts, spec.moe_top_k) == (False, 0, 0)
    assert spec.layer_counts == {"mamba2": 5, "full_attention": 2, "none": 5}
    config = transformers.AutoConfig.for_model(**raw)
    assert spec.params.total == _meta_count(torch, transformers, config)
    layout = {"tp": 1, "pp": 1, "vpp": 1, "cp": 1, "ep": 2, "etp": 1, "dp": 8, "micro_batch": 1,
              "rollout_tp": 1, "rollout_dp": 8, "rollout_ep": 1}
    broken = dict(explain(spec, ClusterSpec(get_gpu("h100"), 8, 8), GrpoWorkload(), layout))
    assert "dense_model_has_no_experts" in broken


def test_jamba_is_not_read_as_full_attention():
    config = _moe_config(model_type="jamba", attn_layer_period=8, attn_layer_offset=4,
                         expert_layer_period=2, mamba_d_state=16, mamba_expand=2)
    with pytest.raises(PlanInputError, match="Jamba"):
        spec_from_hf_config(config, "jamba")


def test_spec_round_trips_through_its_dict():
    from planner.catalog.models import ModelSpec

    for name in ("Qwen3.5-35B-A3B", "NVIDIA-Nemotron-3-Super-120B-A12B", "gpt-oss-20b",
                 "Llama-4-Scout-17B-16E", "Qwen3-8B"):
        spec = builtin_model(name)
        assert ModelSpec(**spec.to_dict()) == spec


def test_homogeneous_specs_keep_their_old_meaning():
    dense = builtin_model("Qwen3-8B")
    assert dense.layer_counts == {"full_attention": 36} and not dense.is_hybrid
    dsv3 = builtin_model("DeepSeek-V3")
    assert dsv3.num_moe_layers == 58 and dsv3.num_dense_layers == 3 and dsv3.kv_layers == 61
    assert dsv3.mtp_params > 0 and dsv3.params.total == 671026419200  # MTP outside the total


# --- FLOPs in verl's convention -----------------------------------------------------------

VERL_FAMILIES = ["llama", "qwen2", "qwen3", "mistral", "qwen2_moe", "qwen3_moe", "deepseek_v3",
                 "gpt_oss", "qwen3_vl", "qwen3_vl_moe", "qwen3_5", "qwen3_5_moe", "qwen2_5_vl"]
SEQLENS = [77, 300, 2048, 4100]


def _verl_flops(flops_counter, config) -> float:
    return flops_counter.ESTIMATE_FUNC[config.model_type](config, sum(SEQLENS), SEQLENS,
                                                          1.0) * 1e12


@pytest.mark.needs("verl")
@pytest.mark.parametrize("model_type", VERL_FAMILIES)
def test_flops_equal_verls_flops_counter_for_every_family_it_has(model_type):
    transformers = pytest.importorskip("transformers")
    flops_counter = pytest.importorskip("verl.utils.flops_counter")
    config = transformers.AutoConfig.for_model(model_type, **{
        k: v for k, v in FAMILY_CONFIGS.get(model_type, {}).items()})
    spec = spec_from_hf_config(config.to_dict(), model_type)
    ours = float(np.sum(verl_training_flops_per_sequence(spec, SEQLENS)))
    assert ours == pytest.approx(_verl_flops(flops_counter, config), rel=1e-12)


@pytest.mark.needs("verl")
@pytest.mark.parametrize("name", ["Qwen3.5-35B-A3B", "gpt-oss-120b", "gpt-oss-20b",
                                  "Qwen3-VL-30B-A3B", "MiMo-7B", "Qwen3.5-397B-A17B",
                                  "Qwen3.5-122B-A10B", "Qwen3.5-27B", "Qwen3.5-0.8B"])
def test_catalog_flops_equal_verls_flops_counter(name):
    pytest.importorskip("transformers")
    flops_counter = pytest.importorskip("verl.utils.flops_counter")

    def namespace(d):  # verl reads attributes; a plain namespace of the published file
        return types.SimpleNamespace(**{k: namespace(v) if isinstance(v, dict) else v
                                        for k, v in d.items()})

    config = namespace(builtin_config_dict(name))
    ours = float(np.sum(verl_training_flops_per_sequence(builtin_model(name), SEQLENS)))
    assert ours == pytest.approx(_verl_flops(flops_counter, config), rel=1e-12)


def test_hybrid_flops_charge_attention_only_on_full_layers():
    """verl's Qwen3.5 convention, restated by hand: quadratic terms on the 10 full layers, the
    Gated DeltaNet recurrence 15 * d_k * d_v * n_v per token on the 30 linear ones."""
    model = builtin_model("Qwen3.5-35B-A3B")
    s = np.array([4096.0])
    quadratic = verl_training_flops_per_sequence(model, s) - 2 * \
        verl_training_flops_per_sequence(model, s / 2)  # linear terms cancel
    heads, d = model.num_attention_heads, model.head_dim
    assert float(quadratic[0]) == pytest.approx(10 * 6 * (4096 ** 2 - 2 * 2048 ** 2) * d * heads)
