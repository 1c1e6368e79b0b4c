"""The set of architectures plan-parallel plans: what the pinned verl runs on Megatron.

verl 0.9.1's Megatron engine builds every model through a bridge (``use_mbridge`` must be true:
``verl/workers/engine/megatron/transformer_impl.py`` asserts it):

* by default Megatron-Bridge's ``AutoBridge`` (``vanilla_mbridge: false``), which dispatches on
  ``config.json``'s ``architectures[0]`` to a bridge registered with
  ``@MegatronModelBridge.register_bridge(source=...)``;
* with ``vanilla_mbridge: true``, the older ``mbridge`` package, which dispatches on
  ``model_type`` (``@register_model("...")``).

verl's own registry (``verl/models/mcore/registry.py``, ``SupportedModel``) lists the
architectures its legacy converters know.  The union of the three is the set verl runs; each
registry is read from the installed package when present (by parsing its source, without
importing it) and otherwise from the lists recorded below for the pinned versions, which a test
checks against the installed packages.  Of that set, plan-parallel plans the families in
:data:`FAMILIES`; any other architecture is refused by name (exit 2), never planned as a
lookalike.
"""

from __future__ import annotations

import ast
import importlib.util
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any, Iterable, Mapping

from planner.catalog.hf_config import architecture_of
from planner.errors import PlanInputError

VERL_VERSION = "0.9.1"
MEGATRON_BRIDGE_VERSION = "0.6.2"  # megatron-bridge on PyPI needs Python 3.12: recorded here
MBRIDGE_VERSION = "0.15.1"

# Megatron-Bridge 0.6.2: every architecture passed to @MegatronModelBridge.register_bridge
# (megatron/bridge/models/*/*_bridge.py), read from the published wheel.
MEGATRON_BRIDGE_ARCHITECTURES = frozenset({
    "BailingMoeV2ForCausalLM", "DeciLMForCausalLM", "DeepseekV2ForCausalLM",
    "DeepseekV3ForCausalLM", "DeepseekV4ForCausalLM", "Ernie4_5_MoeForCausalLM",
    "Ernie4_5_VLMoeForConditionalGeneration", "Exaone4ForCausalLM",
    "Exaone4_5_ForConditionalGeneration", "ExaoneMoEForCausalLM", "ExaoneMoeForCausalLM",
    "FalconH1ForCausalLM", "Gemma2ForCausalLM", "Gemma3ForCausalLM",
    "Gemma3ForConditionalGeneration", "Gemma4ForCausalLM", "Gemma4ForConditionalGeneration",
    "GemmaForCausalLM", "Glm4MoeForCausalLM", "Glm4MoeLiteForCausalLM",
    "Glm4vMoeForConditionalGeneration", "GlmMoeDsaForCausalLM", "GptOssForCausalLM",
    "HYV3ForCausalLM", "KimiK25ForConditionalGeneration", "KimiK2ForCausalLM",
    "LlamaForCausalLM", "MiMoForCausalLM", "MiMoV2FlashForCausalLM", "MiniMaxM2ForCausalLM",
    "MiniMaxM3SparseForConditionalGeneration", "Mistral3ForConditionalGeneration",
    "MistralForCausalLM", "NemotronForCausalLM", "NemotronHForCausalLM",
    "NemotronH_Nano_Omni_Reasoning_V3", "NemotronH_Nano_VL_V2", "OlmoeForCausalLM",
    "Qwen2AudioForConditionalGeneration", "Qwen2ForCausalLM",
    "Qwen2_5OmniForConditionalGeneration", "Qwen2_5_VLForConditionalGeneration",
    "Qwen3ASRForConditionalGeneration", "Qwen3ForCausalLM", "Qwen3MoeForCausalLM",
    "Qwen3NextForCausalLM", "Qwen3OmniMoeForConditionalGeneration",
    "Qwen3VLForConditionalGeneration", "Qwen3VLMoeForConditionalGeneration",
    "Qwen3_5ForCausalLM", "Qwen3_5ForConditionalGeneration", "Qwen3_5MoeForCausalLM",
    "Qwen3_5MoeForConditionalGeneration", "SarvamMLAForCausalLM", "SarvamMoEForCausalLM",
    "Step3p5ForCausalLM", "Step3p7ForConditionalGeneration",
})
# mbridge 0.15.1: every model_type passed to @register_model (mbridge/models/).
MBRIDGE_MODEL_TYPES = frozenset({
    "deepseek_v3", "gemma3", "glm4_moe", "glm4v", "glm4v_moe", "internvl_chat", "llama", "mimo",
    "mixtral", "qwen2", "qwen2_5_vl", "qwen2_moe", "qwen3", "qwen3_moe",
})
# verl 0.9.1: the values of SupportedModel (verl/models/mcore/registry.py).
VERL_REGISTRY_ARCHITECTURES = frozenset({
    "LlamaForCausalLM", "Qwen2ForCausalLM", "Qwen2MoeForCausalLM", "DeepseekV3ForCausalLM",
    "MixtralForCausalLM", "Qwen2_5_VLForConditionalGeneration", "Llama4ForConditionalGeneration",
    "Qwen3ForCausalLM", "Qwen3MoeForCausalLM", "Qwen3_5MoeForCausalLM", "Glm4MoeForCausalLM",
    "Qwen3ForTokenClassification", "LlamaForTokenClassification",
    "Qwen3VLMoeForConditionalGeneration", "Qwen3VLForConditionalGeneration",
    "GptOssForCausalLM", "MiMoForCausalLM",
})

MEGATRON_BRIDGE = "megatron-bridge"
MBRIDGE = "mbridge"
VERL_REGISTRY = "verl-registry"
# verl's McoreEngineConfig keys each route needs (``verl/workers/config/engine.py``).
ROUTE_SETTINGS = {
    MEGATRON_BRIDGE: {"use_mbridge": True, "vanilla_mbridge": False},
    MBRIDGE: {"use_mbridge": True, "vanilla_mbridge": True},
    VERL_REGISTRY: {"use_mbridge": True, "vanilla_mbridge": False},
}


@dataclass(frozen=True)
class Family:
    """A family plan-parallel plans: the architectures and model types that name it."""

    name: str
    architectures: tuple[str, ...]
    model_types: tuple[str, ...]
    note: str = ""


FAMILIES = (
    Family("Llama", ("LlamaForCausalLM",), ("llama",)),
    Family("Mistral", ("MistralForCausalLM",), ("mistral",)),
    Family("Qwen2/2.5", ("Qwen2ForCausalLM",), ("qwen2",)),
    Family("Qwen2-MoE", ("Qwen2MoeForCausalLM",), ("qwen2_moe",)),
    Family("Qwen3", ("Qwen3ForCausalLM",), ("qwen3",)),
    Family("Qwen3-MoE", ("Qwen3MoeForCausalLM",), ("qwen3_moe",)),
    Family("Qwen3-Next", ("Qwen3NextForCausalLM",), ("qwen3_next",)),
    Family("Qwen3.5/3.6", ("Qwen3_5ForCausalLM", "Qwen3_5MoeForCausalLM",
                           "Qwen3_5ForConditionalGeneration",
                           "Qwen3_5MoeForConditionalGeneration"),
           ("qwen3_5", "qwen3_5_moe", "qwen3_5_text", "qwen3_5_moe_text")),
    Family("Qwen2.5-VL", ("Qwen2_5_VLForConditionalGeneration",), ("qwen2_5_vl",)),
    Family("Qwen3-VL", ("Qwen3VLForConditionalGeneration", "Qwen3VLMoeForConditionalGeneration"),
           ("qwen3_vl", "qwen3_vl_moe")),
    Family("DeepSeek-V2", ("DeepseekV2ForCausalLM",), ("deepseek_v2",)),
    Family("DeepSeek-V3/Kimi-K2", ("DeepseekV3ForCausalLM", "KimiK2ForCausalLM"),
           ("deepseek_v3", "kimi_k2")),
    Family("GLM-4.5/4.6/4.7", ("Glm4MoeForCausalLM",), ("glm4_moe",)),
    Family("GLM-4.7-Flash", ("Glm4MoeLiteForCausalLM",), ("glm4_moe_lite",)),
    Family("GPT-OSS", ("GptOssForCausalLM",), ("gpt_oss",)),
    Family("Nemotron-H/Nemotron-3", ("NemotronHForCausalLM",), ("nemotron_h",)),
    Family("MiMo", ("MiMoForCausalLM",), ("mimo",)),
    Family("Mixtral", ("MixtralForCausalLM",), ("mixtral",)),
    Family("OLMoE", ("OlmoeForCausalLM",), ("olmoe",)),
    Family("ERNIE-4.5-MoE", ("Ernie4_5_MoeForCausalLM",), ("ernie4_5_moe",)),
    Family("Llama-4", ("Llama4ForConditionalGeneration",), ("llama4",),
           note="listed in verl's legacy mcore registry only: no bridge verl 0.9.1's Megatron "
                "engine uses builds it"),
)


# ---------------------------------------------------------------------------------------------
# Reading the registries from installed packages (source parsed, never imported)


def _package_dir(name: str) -> Path | None:
    try:
        spec = importlib.util.find_spec(name)
    except (ImportError, ValueError):
        return None
    if spec is None or not spec.submodule_search_locations:
        return None
    return Path(next(iter(spec.submodule_search_locations)))


def _constants(tree: ast.Module) -> dict[str, str]:
    return {target.id: node.value.value for node in tree.body if isinstance(node, ast.Assign)
            and isinstance(node.value, ast.Constant) and isinstance(node.value.value, str)
            for target in node.targets if isinstance(target, ast.Name)}


def _calls(tree: ast.Module, name: str) -> Iterable[ast.Call]:
    for node in ast.walk(tree):
        if isinstance(node, ast.Call):
            func = node.func
            called = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", "")
            if called == name:
                yield node


def _argument(call: ast.Call, keyword: str) -> ast.expr | None:
    for item in call.keywords:
        if item.arg == keyword:
            return item.value
    return call.args[0] if call.args else None


def read_megatron_bridge_architectures(models_dir: Path) -> frozenset[str]:
    """The ``source=`` of every ``register_bridge`` / ``register_bridge_implementation`` call
    under ``megatron/bridge/models`` (a string, a module constant or a transformers class)."""
    found = set()
    for path in sorted(models_dir.rglob("*.py")):
        tree = ast.parse(path.read_text(encoding="utf-8"))
        constants = _constants(tree)
        for call_name in ("register_bridge", "register_bridge_implementation"):
            for call in _calls(tree, call_name):
                source = _argument(call, "source")
                if isinstance(source, ast.Constant) and isinstance(source.value, str):
                    found.add(source.value)
                elif isinstance(source, ast.Name):
                    value = constants.get(source.id, source.id)
                    if value[:1].isupper():  # a class name, not a helper's parameter
                        found.add(value)
    return frozenset(found)


def read_mbridge_model_types(models_dir: Path) -> frozenset[str]:
    """Every ``@register_model("...")`` under ``mbridge/models``."""
    found = set()
    for path in sorted(models_dir.rglob("*.py")):
        tree = ast.parse(path.read_text(encoding="utf-8"))
        for call in _calls(tree, "register_model"):
            arg = call.args[0] if call.args else None
            values = arg.elts if isinstance(arg, (ast.List, ast.Tuple)) else [arg]
            found.update(v.value for v in values
                         if isinstance(v, ast.Constant) and isinstance(v.value, str))
    return frozenset(found)


def read_verl_registry(registry_file: Path) -> frozenset[str]:
    """The values of verl's ``SupportedModel`` enum."""
    tree = ast.parse(registry_file.read_text(encoding="utf-8"))
    for node in tree.body:
        if isinstance(node, ast.ClassDef) and node.name == "SupportedModel":
            return frozenset(item.value.value for item in node.body
                             if isinstance(item, ast.Assign)
                             and isinstance(item.value, ast.Constant))
    raise ValueError(f"{registry_file}: no SupportedModel enum")


@dataclass(frozen=True)
class Registries:
    """The three registries and where each was read from (``installed`` or ``recorded``)."""

    megatron_bridge: frozenset[str]
    mbridge: frozenset[str]
    verl: frozenset[str]
    sources: dict[str, str]


@cache
def registries() -> Registries:
    sources = {}
    bridge_dir = _package_dir("megatron.bridge")
    if bridge_dir is not None and (bridge_dir / "models").is_dir():
        bridge = read_megatron_bridge_architectures(bridge_dir / "models")
        sources[MEGATRON_BRIDGE] = f"installed {bridge_dir}"
    else:
        bridge = MEGATRON_BRIDGE_ARCHITECTURES
        sources[MEGATRON_BRIDGE] = f"recorded for megatron-bridge {MEGATRON_BRIDGE_VERSION}"
    mbridge_dir = _package_dir("mbridge")
    if mbridge_dir is not None and (mbridge_dir / "models").is_dir():
        mbridge = read_mbridge_model_types(mbridge_dir / "models")
        sources[MBRIDGE] = f"installed {mbridge_dir}"
    else:
        mbridge = MBRIDGE_MODEL_TYPES
        sources[MBRIDGE] = f"recorded for mbridge {MBRIDGE_VERSION}"
    verl_dir = _package_dir("verl")
    registry_file = verl_dir / "models" / "mcore" / "registry.py" if verl_dir else None
    if registry_file is not None and registry_file.is_file():
        verl = read_verl_registry(registry_file)
        sources[VERL_REGISTRY] = f"installed {registry_file}"
    else:
        verl = VERL_REGISTRY_ARCHITECTURES
        sources[VERL_REGISTRY] = f"recorded for verl {VERL_VERSION}"
    return Registries(bridge, mbridge, verl, sources)


# ---------------------------------------------------------------------------------------------
# The check


@dataclass(frozen=True)
class Support:
    """How verl builds a planned model on Megatron."""

    family: Family
    architecture: str
    model_type: str
    route: str  # MEGATRON_BRIDGE, MBRIDGE or VERL_REGISTRY

    @property
    def verl_settings(self) -> dict[str, bool]:
        """``actor_rollout_ref.actor.megatron.{use_mbridge, vanilla_mbridge}`` this model needs
        (export writes them; phase B)."""
        return dict(ROUTE_SETTINGS[self.route])


def family_of(architecture: str, model_type: str) -> Family | None:
    for family in FAMILIES:
        if architecture in family.architectures or (
                not architecture and model_type in family.model_types):
            return family
    return None


def route_of(architecture: str, model_type: str, regs: Registries | None = None) -> str | None:
    """How verl builds this architecture on Megatron, or None when it cannot.  A config without
    ``architectures`` is matched by its family's architectures."""
    regs = regs or registries()
    names = [architecture] if architecture else list(getattr(
        family_of("", model_type), "architectures", ()))
    if any(name in regs.megatron_bridge for name in names):
        return MEGATRON_BRIDGE
    if model_type in regs.mbridge:
        return MBRIDGE
    if any(name in regs.verl for name in names):
        return VERL_REGISTRY
    return None


def planned_families_text() -> str:
    return ", ".join(family.name for family in FAMILIES)


def check_supported(config: Mapping[str, Any], name: str) -> Support:
    """The route of a config.json verl runs on Megatron and plan-parallel plans, or a
    :class:`PlanInputError` naming the architecture read and the set."""
    model_type = str(config.get("model_type", ""))
    architecture = architecture_of(config)
    read = f"{architecture or '(no architectures)'} (model_type {model_type!r})"
    route = route_of(architecture, model_type)
    family = family_of(architecture, model_type)
    if route is None:
        raise PlanInputError(
            f"model {name!r}: architecture {read} is not one verl {VERL_VERSION} runs on "
            f"Megatron (Megatron-Bridge {MEGATRON_BRIDGE_VERSION} bridges, mbridge "
            f"{MBRIDGE_VERSION}, verl's mcore registry); plan-parallel plans: "
            f"{planned_families_text()} (`plan-parallel models --supported` lists them)")
    if family is None:
        raise PlanInputError(
            f"model {name!r}: verl {VERL_VERSION} runs {read} on Megatron ({route}), but "
            f"plan-parallel does not model that architecture yet; it plans: "
            f"{planned_families_text()} (`plan-parallel models --supported`)")
    return Support(family, architecture, model_type, route)


def supported_rows() -> list[dict[str, Any]]:
    """One row per architecture verl runs on Megatron: family planned (or not), route, the
    verl settings it needs, and where the registry was read from."""
    regs = registries()
    architectures = regs.megatron_bridge | regs.verl | {
        arch for family in FAMILIES for arch in family.architectures
        if any(t in regs.mbridge for t in family.model_types)}
    rows = []
    for arch in sorted(architectures):
        family = family_of(arch, "")
        model_type = family.model_types[0] if family else ""
        route = route_of(arch, model_type, regs)
        rows.append({"architecture": arch, "family": family.name if family else "",
                     "planned": family is not None, "route": route,
                     **(ROUTE_SETTINGS[route] if route else {}),
                     "note": family.note if family else "not modelled by plan-parallel"})
    return rows
