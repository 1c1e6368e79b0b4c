"""The supported set: what verl runs on Megatron (Megatron-Bridge, mbridge, verl's registry),
read from the installed packages or the recorded lists, and the refusals by name."""

import json

import pytest

from planner.catalog import support
from planner.catalog.models import builtin_config_dict, catalog_names, resolve_model
from planner.cli.main import main
from planner.errors import PlanInputError


def test_recorded_verl_registry_matches_the_installed_verl():
    root = support._package_dir("verl")
    if root is None:
        pytest.skip("verl is not installed")
    installed = support.read_verl_registry(root / "models" / "mcore" / "registry.py")
    assert installed == support.VERL_REGISTRY_ARCHITECTURES


def test_recorded_mbridge_registry_matches_the_installed_mbridge():
    root = support._package_dir("mbridge")
    if root is None:
        pytest.skip("mbridge is not installed (requirements-ci.txt pins 0.15.1)")
    assert support.read_mbridge_model_types(root / "models") == support.MBRIDGE_MODEL_TYPES


def test_recorded_megatron_bridge_registry_matches_an_installed_megatron_bridge():
    root = support._package_dir("megatron.bridge")
    if root is None:
        pytest.skip("megatron-bridge 0.6.x needs Python 3.12: the recorded list is used")
    assert support.read_megatron_bridge_architectures(root / "models") == \
        support.MEGATRON_BRIDGE_ARCHITECTURES


def test_the_bridge_reader_resolves_constants_and_class_names(tmp_path):
    models = tmp_path / "models" / "fam"
    models.mkdir(parents=True)
    (models / "fam_bridge.py").write_text(
        'from transformers import LlamaForCausalLM\n_NAME = "FooForCausalLM"\n'
        '@MegatronModelBridge.register_bridge(source=_NAME, target=GPTModel)\nclass A: ...\n'
        '@MegatronModelBridge.register_bridge(source=LlamaForCausalLM, target=GPTModel)\n'
        'class B: ...\n'
        'register_bridge_implementation(source="BarForCausalLM", target=GPTModel, '
        'bridge_class=B)\n'
        'def helper(source):\n    return register_bridge_implementation(source=source)\n')
    assert support.read_megatron_bridge_architectures(tmp_path / "models") == {
        "FooForCausalLM", "LlamaForCausalLM", "BarForCausalLM"}


@pytest.mark.parametrize("name", sorted(catalog_names()))
def test_every_catalog_entry_is_in_the_supported_set(name):
    route = support.check_supported(builtin_config_dict(name), name)
    assert route.verl_settings["use_mbridge"] is True


def test_routes_and_the_verl_settings_they_need():
    def route(name):
        return support.check_supported(builtin_config_dict(name), name)

    assert route("Qwen3.5-35B-A3B").route == support.MEGATRON_BRIDGE
    mixtral = route("Mixtral-8x7B")  # only mbridge builds Mixtral
    assert mixtral.route == support.MBRIDGE and mixtral.verl_settings["vanilla_mbridge"] is True
    assert route("Llama-4-Scout-17B-16E").route == support.VERL_REGISTRY
    assert route("Kimi-K2").family.name == "DeepSeek-V3/Kimi-K2"


def _write(tmp_path, config):
    path = tmp_path / "m" / "config.json"
    path.parent.mkdir()
    path.write_text(json.dumps(config))
    return str(path)


@pytest.mark.needs("verl")
def test_jamba_is_refused_naming_the_set(tmp_path, capsys):
    transformers = pytest.importorskip("transformers")
    config = transformers.AutoConfig.for_model("jamba", num_hidden_layers=4).to_dict()
    config["architectures"] = ["JambaForCausalLM"]
    path = _write(tmp_path, config)
    with pytest.raises(PlanInputError) as error:
        resolve_model(path)
    message = str(error.value)
    assert "JambaForCausalLM" in message and "'jamba'" in message and "Qwen3.5/3.6" in message
    assert "models --supported" in message and "\n" not in message
    assert main(["plan", "--model", path, "--gpus", "8"]) == 2
    assert "JambaForCausalLM" in capsys.readouterr().err


@pytest.mark.needs("verl")
@pytest.mark.parametrize("model_type,architecture", [
    ("hunyuan_v1_moe", "HunYuanMoEV1ForCausalLM"), ("dots1", "Dots1ForCausalLM")])
def test_families_verl_cannot_run_are_refused_after_their_keys_are_read(tmp_path, model_type,
                                                                       architecture):
    config = {"model_type": model_type, "architectures": [architecture], "hidden_size": 256,
              "num_attention_heads": 4, "num_key_value_heads": 4, "num_hidden_layers": 2,
              "vocab_size": 1000, "intermediate_size": 512, "moe_intermediate_size": 128,
              "num_experts": 8, "n_routed_experts": 8, "num_experts_per_tok": 2, "moe_topk": 2,
              "head_dim": 64}
    with pytest.raises(PlanInputError, match=architecture):
        resolve_model(_write(tmp_path, config))


def test_runs_on_verl_but_not_modelled_is_its_own_refusal():
    config = {"model_type": "gemma3_text", "architectures": ["Gemma3ForCausalLM"]}
    with pytest.raises(PlanInputError, match="does not model that architecture yet"):
        support.check_supported(config, "gemma")


def test_a_config_without_architectures_is_matched_by_model_type():
    assert support.check_supported({"model_type": "qwen3"}, "m").family.name == "Qwen3"
    with pytest.raises(PlanInputError, match="no architectures"):
        support.check_supported({"model_type": "falcon"}, "m")


def test_models_supported_lists_the_set(capsys):
    assert main(["models", "--supported"]) == 0
    out = capsys.readouterr().out
    for arch in ("Qwen3_5MoeForConditionalGeneration", "NemotronHForCausalLM",
                 "MixtralForCausalLM", "Gemma3ForCausalLM"):
        assert arch in out
    assert main(["models", "--supported", "--format", "json"]) == 0
    data = json.loads(capsys.readouterr().out)
    rows = {row["architecture"]: row for row in data["architectures"]}
    assert rows["MixtralForCausalLM"]["vanilla_mbridge"] is True
    assert rows["GptOssForCausalLM"]["planned"] and not rows["Gemma3ForCausalLM"]["planned"]
    assert set(data["sources"]) == {"megatron-bridge", "mbridge", "verl-registry"}


def test_models_table_prints_layer_kinds(capsys):
    assert main(["models"]) == 0
    out = capsys.readouterr().out
    assert "30 linear_attention + 10 full_attention" in out
