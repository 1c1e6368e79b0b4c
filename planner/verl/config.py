"""verl's own view of a job: compose its Hydra config and run its own validation, on the CPU.

Composition follows ``verl.trainer.main_ppo`` (``@hydra.main(config_name="ppo_trainer")``; the
Megatron backend is the ``model_engine=megatron`` choice).  The checks are the ones verl makes
before and while it starts its workers: ``verl.utils.config.validate_config`` (what ``main_ppo``
runs before ``ray.init``) and the dataclass conversions of the actor, rollout and reference
configs (``omega_conf_to_dataclass``, which runs their ``__post_init__`` checks).  Neither needs a
GPU, Ray or the model's files.

Keys the installed verl does not know are reported together rather than one per run: an
override of a missing key is dropped and composition retried; keys a config *file* adds (Hydra
accepts those silently) are found by comparing the result with verl's own defaults.

verl, Hydra, OmegaConf and megatron-core are imported inside the functions: they are heavy.
"""

from __future__ import annotations

import contextlib
import functools
import importlib.util
import io
import os
import re
import warnings
from pathlib import Path
from typing import Any, Sequence

from planner.bounds import MAX_JSON_DEPTH, json_depth, read_text, shown
from planner.errors import MissingExtraError, PlanInputError, ResourceLimitError
from planner.results import COLOCATED_MODE
from planner.verl.export import override_key
from planner.verl.findings import Finding
from planner.verl.keymap import HYDRA_SEARCHPATH, mode_keys
from planner.verl.keys import (
    MODE_CONFIG,
    MODE_ENTRY,
    RETIRED_KEYS,
    ROOT_CONFIG,
    TRANSFORMER_CONFIG_KEY,
    VERL_VERSION,
)


class ComposeError(Exception):
    """verl's config cannot be composed from the input (beyond unknown keys)."""


def installed_verl_version() -> str | None:
    from planner.versions import installed_version

    return installed_version("verl")


def verl_config_dir() -> Path:
    """``verl/trainer/config`` of the installed verl, without importing verl."""
    spec = importlib.util.find_spec("verl")
    if spec is None or not spec.submodule_search_locations:
        raise MissingExtraError(f"composing and checking verl's config needs verl "
                                f"{VERL_VERSION}, which is not installed; pip install "
                                f"'plan-parallel[verl]'", extra="verl")
    return Path(list(spec.submodule_search_locations)[0]) / "trainer" / "config"


MAX_YAML_NODES = 1_000_000  # a Hydra YAML's nodes with every alias expanded (verl's: ~2,000)


def read_yaml_document(path: Path) -> None:
    """A Hydra YAML file checked before Hydra reads it: size and encoding bounded, nesting
    depth and the node count with aliases expanded ("billion laughs") bounded, and the document
    a mapping (not empty, null, a list or a scalar)."""
    import yaml

    text = read_text(path, "Hydra YAML")
    name = str(path)
    if json_depth(text) > MAX_JSON_DEPTH:  # flow-style [[[...]]] nesting, before the parser
        raise ResourceLimitError(f"{name}: YAML nested more than {MAX_JSON_DEPTH} levels deep; "
                                 f"the bound is {MAX_JSON_DEPTH}")
    try:
        root = yaml.compose(text, Loader=yaml.SafeLoader)
    except RecursionError:
        raise ResourceLimitError(f"{name}: YAML nested too deeply to read; the bound is "
                                 f"{MAX_JSON_DEPTH} levels") from None
    except yaml.YAMLError as error:
        first = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
        raise PlanInputError(f"cannot read Hydra YAML {name}: {first}") from None
    if root is None:
        raise PlanInputError(f"{name} is empty; valid: a mapping of verl config keys (e.g. "
                             f"defaults: [ppo_trainer, _self_] and the keys to change)")
    if not isinstance(root, yaml.MappingNode):
        held = "a list" if isinstance(root, yaml.SequenceNode) else f"the scalar {root.value!r:.40}"
        if isinstance(root, yaml.ScalarNode) and root.tag.endswith(":null"):
            held = "null"
        raise PlanInputError(f"{name} holds {held}, not a mapping; valid: a mapping of verl "
                             f"config keys")
    sizes: dict[int, tuple[int, int]] = {}  # id(node) -> (expanded nodes, depth)
    order, stack = [], [root]
    while stack:  # post-order without recursion; shared (aliased) nodes are visited once
        node = stack.pop()
        if id(node) in sizes:
            continue
        sizes[id(node)] = (0, 0)
        order.append(node)
        stack.extend(_children(node))
    for node in reversed(order):
        children = [sizes[id(child)] for child in _children(node)]
        count = 1 + sum(c for c, _ in children)
        depth = 1 + max((d for _, d in children), default=0)
        sizes[id(node)] = (min(count, MAX_YAML_NODES + 1), depth)
    count, depth = sizes[id(root)]
    if count > MAX_YAML_NODES:
        raise ResourceLimitError(f"{name}: YAML expands (aliases included) to more than "
                                 f"{MAX_YAML_NODES:,} nodes; the bound is {MAX_YAML_NODES:,}")
    if depth > MAX_JSON_DEPTH:
        raise ResourceLimitError(f"{name}: YAML nested {depth} levels deep; the bound is "
                                 f"{MAX_JSON_DEPTH}")


def _children(node) -> list:
    import yaml

    if isinstance(node, yaml.MappingNode):
        return [item for pair in node.value for item in pair]
    if isinstance(node, yaml.SequenceNode):
        return list(node.value)
    return []
def mode_config_dir(mode: str) -> Path:
    """The config directory of a training mode's entry point (``keys.MODE_CONFIG``)."""
    package = MODE_CONFIG[mode][0]
    return verl_config_dir().parents[1] / Path(*package.split(".")[1:])


def verl_trainer_dir() -> Path:
    """Where Hydra resolves a relative ``--config-path`` given to ``-m verl.trainer.main_ppo``."""
    return entry_dir(COLOCATED_MODE)


def _package_dir(package: str) -> Path:
    """A package's folder; verl's found by path arithmetic (nothing of verl is imported)."""
    if package == "verl" or package.startswith("verl."):
        return verl_config_dir().parents[2] / Path(*package.split("."))
    spec = importlib.util.find_spec(package.split(".")[0])
    if spec is None or not spec.submodule_search_locations:
        raise PlanInputError(f"--config-path pkg://{package}: no installed package "
                             f"{package.split('.')[0]!r}")
    return Path(list(spec.submodule_search_locations)[0]).parent / Path(*package.split("."))


def entry_dir(mode: str) -> Path:
    """The folder of a training mode's entry module (``keys.MODE_ENTRY``), the file that
    declares ``@hydra.main``: Hydra resolves a relative ``--config-path`` against it."""
    return _package_dir(MODE_ENTRY[mode].rpartition(".")[0])


def resolve_config_path(mode: str, config_path: str | None) -> Path:
    """The primary config folder of a launch, as Hydra computes it
    (``hydra/_internal/utils.py::compute_search_path_dir``): none given, the entry point's own
    ``config_path="config"``; an absolute path as it is; ``pkg://a.b`` that package's folder;
    anything else relative to the entry module's folder, ``../`` climbing out of it (so
    ``-m verl.experimental.fully_async_policy.fully_async_main --config-path=config`` is
    ``verl/experimental/fully_async_policy/config``).  A script that names the entry point
    by file (``python3 verl/trainer/main_ppo.py``) resolves against the installed verl's copy."""
    if config_path is None:
        return mode_config_dir(mode)
    if config_path.startswith("pkg://"):
        return _package_dir(config_path[len("pkg://"):].strip("/").replace("/", "."))
    if os.path.isabs(config_path):
        return Path(os.path.normpath(config_path))
    return Path(os.path.normpath(entry_dir(mode) / config_path))


def resolve_config_dir(config_dir: str, cwd: Path | None = None) -> Path:
    """``--config-dir``/``-cd``: Hydra takes ``os.path.abspath`` of it (relative to the folder
    the command runs in) and searches it before the primary config folder
    (``hydra/_internal/utils.py::_run_hydra``, ``add_conf_dir``)."""
    return Path(os.path.normpath(Path(cwd or os.getcwd()) / config_dir))


def root_cause(error: BaseException) -> str:
    """The innermost exception's message, one line; a bare assert names its place."""
    while error.__cause__ is not None or error.__context__ is not None:
        error = error.__cause__ or error.__context__
    text = str(error).strip().splitlines()[0] if str(error).strip() else ""
    if text:
        return text
    import traceback

    frames = traceback.extract_tb(error.__traceback__)
    where = f" at {Path(frames[-1].filename).name}:{frames[-1].lineno}" if frames else ""
    return f"{type(error).__name__}{where}"


def _quiet():
    stack = contextlib.ExitStack()
    stack.enter_context(warnings.catch_warnings())
    warnings.simplefilter("ignore")
    stack.enter_context(contextlib.redirect_stdout(io.StringIO()))
    return stack


def _compose_once(overrides: Sequence[str], config_dir: Path, config_name: str,
                  extra_dirs: Sequence[Path] = ()):
    from hydra import compose, initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra

    GlobalHydra.instance().clear()
    if not extra_dirs:
        with _quiet(), initialize_config_dir(config_dir=str(config_dir), version_base=None):
            return compose(config_name=config_name, overrides=list(overrides))
    # --config-dir: the search path Hydra's own command line builds (hydra/_internal/utils.py
    # ::_run_hydra): the primary folder, and each extra folder searched before it
    from hydra import version
    from hydra._internal.hydra import Hydra
    from hydra._internal.utils import create_config_search_path
    from hydra.core.config_search_path import SearchPathQuery

    version.setbase(None)  # as initialize_config_dir(version_base=None)
    search_path = create_config_search_path(str(config_dir))
    for extra in extra_dirs:
        search_path.prepend(provider="command-line", path=f"file://{extra}",
                            anchor=SearchPathQuery(provider="schema"))
    try:
        with _quiet():
            Hydra.create_main_hydra2(task_name="app", config_search_path=search_path)
            return compose(config_name=config_name, overrides=list(overrides))
    finally:
        GlobalHydra.instance().clear()


def _bad_syntax(overrides: Sequence[str]) -> str:
    from hydra.core.override_parser.overrides_parser import OverridesParser

    parser = OverridesParser.create()
    for item in overrides:
        try:
            parser.parse_overrides([item])
        except Exception as error:  # noqa: BLE001 - Hydra's parse errors vary
            key, _, value = item.partition("=")
            hint = ""
            if not value.isascii() and not value.startswith(("'", '"')):
                # Hydra's lexer (and so verl's command line) takes non-ASCII text only quoted
                hint = (f"; verl's Hydra takes non-ASCII values quoted: "
                        f"{key}='{value}'")
            return (f"override {shown(item, 200)} is not valid Hydra syntax "
                    f"({root_cause(error)}){hint}")
    return "an override is not valid Hydra syntax"


_KEY_ERRORS = (
    (re.compile(r"Could not override '([^']+)'"), "verl {version} has no key {key}{hint}"),
    (re.compile(r"Could not append to config\. An item is already at '([^']+)'"),
     "{key} already exists in verl's config: set it without the '+'"),
    (re.compile(r"Could not delete from config\. '([^']+)' does not exist"),
     "~{key} deletes a key verl {version} does not have"),
)


def _unknown_key(text: str, version: str) -> Finding | None:
    """The finding for Hydra's "no such key" errors, None for other composition errors."""
    for pattern, template in _KEY_ERRORS:
        found = pattern.search(text)
        if found:
            key = found.group(1)
            return Finding("unknown_key", template.format(version=version, key=key,
                                                          hint=_retired_hint(key)), (key,))
    return None


def _retired_hint(key: str) -> str:
    for suffix, hint in RETIRED_KEYS.items():
        if key.endswith(suffix):
            return f" ({hint})"
    return ""


def compose(overrides: Sequence[str], config_dir: Path | None = None,
            config_name: str = ROOT_CONFIG, extra_dirs: Sequence[Path] = ()):
    """Compose as ``main_ppo`` would; returns ``(config, problems)``.

    Overrides of keys verl does not have are dropped (each one a problem) and composition is
    retried, so every unknown key is reported at once.  Raises :class:`PlanInputError` for
    input Hydra cannot read and :class:`ComposeError` when no config results.
    """
    from hydra.errors import (
        ConfigCompositionException,
        MissingConfigException,
        OverrideParseException,
    )

    config_dir = Path(config_dir) if config_dir else verl_config_dir()
    remaining = list(overrides)
    problems: list[Finding] = []
    version = installed_verl_version() or VERL_VERSION
    for _ in range(len(remaining) + 1):
        try:
            return _compose_once(remaining, config_dir, config_name,
                                 extra_dirs), problems
        except OverrideParseException:
            raise PlanInputError(_bad_syntax(remaining)) from None
        except MissingConfigException as error:
            text = str(error)
            if "primary config" in text.lower():
                where = ", ".join(str(d) for d in (*extra_dirs, config_dir))
                raise PlanInputError(f"no Hydra config {config_name!r} in {where}: "
                                     f"{text.splitlines()[0]}") from None
            raise ComposeError(text.splitlines()[0]) from None
        except ConfigCompositionException as error:
            finding = _unknown_key(str(error), version)
            dropped = [item for item in remaining
                       if finding and override_key(item) == finding.keys[0]]
            if not dropped:
                raise ComposeError(root_cause(error)) from None
            remaining = [item for item in remaining if item not in dropped]
            problems.append(finding)
        except Exception as error:  # noqa: BLE001 - a file Hydra cannot parse (YAML, encoding)
            raise PlanInputError(f"cannot read Hydra config {config_name!r} in {config_dir}: "
                                 f"{root_cause(error)}") from None
    raise ComposeError("composition did not converge")


@functools.cache
def base_config(model_engine: str = "megatron"):
    """verl's defaults for the backend, the reference for keys a config file adds."""
    return _compose_once([f"model_engine={model_engine}"], verl_config_dir(), ROOT_CONFIG)


@functools.cache
def mode_base_config(model_engine: str, mode: str):
    """The defaults of a training mode's root config (``keys.MODE_CONFIG``)."""
    if mode == COLOCATED_MODE:
        return base_config(model_engine)
    overrides = [f"model_engine={model_engine}"]
    if HYDRA_SEARCHPATH in mode_keys(mode):
        # one-step-off's searchpath is file://verl/trainer/config (verl's checkout)
        overrides.append("hydra.searchpath=[pkg://verl.trainer.config]")
    return _compose_once(overrides, mode_config_dir(mode), MODE_CONFIG[mode][1])


def _target_fields(target: str) -> set[str] | None:
    import dataclasses
    import importlib

    module_name, _, name = target.rpartition(".")
    try:
        cls = getattr(importlib.import_module(module_name), name)
    except (ImportError, AttributeError):
        return None
    return {f.name for f in dataclasses.fields(cls)} if dataclasses.is_dataclass(cls) else None


def transformer_config_fields() -> set[str]:
    import dataclasses

    with _quiet():
        from megatron.core.transformer.transformer_config import MLATransformerConfig
    return {f.name for f in dataclasses.fields(MLATransformerConfig)}


def added_keys(config, base) -> list[Finding]:
    """Keys in ``config`` that verl's defaults (``base``) lack, judged by where they sit:
    under a verl dataclass node they must be a field of it; under ``override_transformer_config``
    a megatron-core TransformerConfig field (else a warning); under an empty mapping anything
    goes (``env_vars``, ``engine_kwargs``...); elsewhere verl would ignore them."""
    from omegaconf import OmegaConf

    mine = OmegaConf.to_container(config, resolve=False)
    theirs = OmegaConf.to_container(base, resolve=False)
    version = installed_verl_version() or VERL_VERSION
    problems: list[Finding] = []

    def walk(node: dict, reference: dict, path: str) -> None:
        for key, value in node.items():
            full = f"{path}.{key}" if path else str(key)
            if key in reference:
                if isinstance(value, dict) and isinstance(reference[key], dict):
                    walk(value, reference[key], full)
                continue
            if not reference:
                continue  # a free-form mapping
            if path.endswith(TRANSFORMER_CONFIG_KEY):
                if key not in transformer_config_fields():
                    problems.append(Finding(
                        "unknown_key", f"{full}: megatron-core's TransformerConfig has no field "
                        f"{key!r}; verl passes it on and it has no effect or fails at model "
                        f"build", (full,), "warning"))
                continue
            target = reference.get("_target_")
            fields = _target_fields(target) if isinstance(target, str) else None
            if fields is not None and key in fields:
                continue
            where = f" ({target.rsplit('.', 1)[-1]} has no field {key!r})" if target else ""
            problems.append(Finding("unknown_key", f"verl {version} has no key {full}{where}"
                                    f"{_retired_hint(full)}", (full,)))

    walk(mine, theirs, "")
    return problems


def _reference_view(config):
    """The reference config as ``ActorRolloutRefWorker.init_model`` hands it to its engine."""
    from omegaconf import OmegaConf, open_dict

    ref = OmegaConf.create(OmegaConf.to_container(config.actor_rollout_ref, resolve=True)).ref
    with open_dict(ref):
        ref.ppo_mini_batch_size = config.actor_rollout_ref.actor.ppo_mini_batch_size
        ref.ppo_micro_batch_size = ref.pop("log_prob_micro_batch_size", None)
        ref.ppo_micro_batch_size_per_gpu = ref.pop("log_prob_micro_batch_size_per_gpu", None)
        ref.use_dynamic_bsz = ref.pop("log_prob_use_dynamic_bsz", False)
        ref.ppo_max_token_len_per_gpu = ref.pop("log_prob_max_token_len_per_gpu", None)
    return ref


_TARGET_LINE = re.compile(r"^\s*_target_\s*:\s*['\"]?([A-Za-z_][\w.]*)['\"]?\s*(?:#.*)?$",
                          re.MULTILINE)


@functools.cache
def verl_targets() -> frozenset[str]:
    """Every ``_target_`` the installed verl's own YAML config tree declares: the only classes
    a dry run lets verl's config checks instantiate."""
    found: set[str] = set()
    for path in sorted(verl_config_dir().rglob("*.yaml")):
        found.update(_TARGET_LINE.findall(path.read_text(errors="replace")))
    return frozenset(found)


def target_findings(plain: dict) -> list[Finding]:
    """Every ``_target_`` in the resolved config that verl's own config tree does not declare.

    verl's checks hand ``_target_`` nodes to Hydra's ``instantiate``; a config (or an override)
    naming ``builtins.open`` or ``pathlib.Path.write_text`` would write files during a dry run.
    A dry run instantiates nothing the user named: any other target is an error naming the
    key, and verl's checks are not run on such a config."""
    allowed = verl_targets()
    problems: list[Finding] = []
    stack: list[tuple[str, Any]] = [("", plain)]
    while stack:
        path, node = stack.pop()
        if isinstance(node, dict):
            items = [(str(key), value) for key, value in node.items()]
        elif isinstance(node, list):
            items = [(str(index), value) for index, value in enumerate(node)]
        else:
            continue
        for key, value in items:
            full = f"{path}.{key}" if path else key
            if key == "_target_" and (not isinstance(value, str) or value not in allowed):
                problems.append(Finding(
                    "unsafe_target", f"{full} = {shown(value, 80)}: verl's config declares no "
                    f"such target, and a dry run never instantiates a class or function a "
                    f"config names; valid: one of the {len(allowed)} _target_ values of verl "
                    f"{installed_verl_version() or VERL_VERSION}'s own config tree (e.g. "
                    f"verl.workers.config.McoreActorConfig), or no _target_", (full,)))
            else:
                stack.append((full, value))
    return sorted(problems, key=lambda finding: finding.keys)


def verl_checks(config) -> list[Finding]:
    """verl's own checks, each run on its own so every failure is reported."""
    from verl.trainer.ppo.utils import need_critic, need_reference_policy
    from verl.utils.config import omega_conf_to_dataclass, validate_config

    problems: list[Finding] = []
    seen: set[str] = set()

    def attempt(check: str, what: str, action) -> None:
        try:
            with _quiet():
                action()
        except Exception as error:  # noqa: BLE001 - verl raises many kinds
            message = root_cause(error)
            if message not in seen:
                seen.add(message)
                problems.append(Finding(check, f"verl {what}: {message}"))

    with _quiet():
        use_ref = bool(need_reference_policy(config))
        use_critic = bool(need_critic(config))
    attempt("verl_validate_config", "validate_config",
            lambda: validate_config(config, use_reference_policy=use_ref, use_critic=use_critic))
    attempt("verl_actor_config", "actor config",
            lambda: omega_conf_to_dataclass(config.actor_rollout_ref.actor))
    attempt("verl_rollout_config", "rollout config",
            lambda: omega_conf_to_dataclass(config.actor_rollout_ref.rollout))
    if use_ref:
        attempt("verl_ref_config", "reference config",
                lambda: omega_conf_to_dataclass(_reference_view(config)))
    return problems


def to_plain(config) -> dict[str, Any]:
    """The composed config with every interpolation resolved, as plain Python data."""
    from omegaconf import OmegaConf

    try:
        return OmegaConf.to_container(config, resolve=True)
    except Exception as error:  # noqa: BLE001 - OmegaConf's resolution errors
        message = root_cause(error)
        found = re.search(r"Environment variable '([^']+)' not found", message)
        if found:
            name = found.group(1)
            raise PlanInputError(f"${{oc.env:{name}}} is unresolved: environment variable "
                                 f"{name} is not set; export it or pass --set {name}=VALUE") \
                from None
        raise PlanInputError(f"the config does not resolve: {message}") from None
