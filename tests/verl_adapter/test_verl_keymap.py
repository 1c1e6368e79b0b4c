"""The verl key map (planner/verl/keymap.py): one row per key drives both the export and the
job reader, so a layout written out reads back as itself; the defaults the table claims are
verl's own (composed from verl's YAML) and megatron-core's."""

from __future__ import annotations

import dataclasses
import math

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from planner.catalog.hardware import ClusterSpec, get_gpu
from planner.catalog.models import builtin_model
from planner.catalog.workload import GrpoWorkload
from planner.search.layout import RECOMPUTE_MODULES, Layout, applicable_modules
from planner.verl import keymap
from planner.verl.export import job_overrides, override_key, override_value
from planner.verl.job import layout_of, read_job, workload_of
from planner.verl.keymap import ABSENT, KEYS, MEGATRON_CORE, VERL, Computed, Follows, get

PROPERTY = settings(max_examples=150, deadline=None, derandomize=True,
                    suppress_health_check=[HealthCheck.too_slow])
MODELS = ("Qwen3-8B", "Qwen3-30B-A3B", "DeepSeek-V3")  # dense GQA, MoE, MoE with MLA
# GrpoWorkload fields that are not verl keys: the time model's mean lengths (and their
# trajectory over the run), NeMo RL's sync
NOT_IN_VERL = {"mean_response_length", "mean_prompt_length", "weight_sync", "lengths",
               "acceptance_length"}  # the planner's assumption, not a verl key
PATHS = dict(model_path="/models/m", train_files="/data/t.parquet", val_files="/data/v.parquet")


def job_rows():
    return [row for row in KEYS if row.modes is None]


# --- the table's shape ------------------------------------------------------------------------


def test_every_layout_and_workload_field_is_read_from_exactly_one_key():
    readers: dict[str, list[str]] = {}
    for row in keymap.READ_KEYS:
        if row.read is not None:
            readers.setdefault(row.field, []).append(row.key)
    layout = {f"layout.{f.name}" for f in dataclasses.fields(Layout)} - {"layout.dp"}
    workload = {f"workload.{f.name}" for f in dataclasses.fields(GrpoWorkload)
                if f.name not in NOT_IN_VERL}
    assert layout | workload | {"cluster.num_nodes", "cluster.gpus_per_node"} == set(readers)
    assert {field: keys for field, keys in readers.items() if len(keys) > 1} == {}


def test_every_key_is_one_row_per_mode_and_every_field_names_a_real_attribute():
    job_keys = [row.key for row in job_rows()]
    assert len(job_keys) == len(set(job_keys))
    for mode in keymap.ASYNC_MODES:
        mode_keys = [row.key for row in keymap.mode_keys(mode)]
        assert len(mode_keys) == len(set(mode_keys))
    holders = {"layout": Layout, "workload": GrpoWorkload, "cluster": ClusterSpec,
               "paths": keymap.Paths}
    for row in KEYS:
        target, _, name = row.field.partition(".")
        if target in holders:
            assert name in {f.name for f in dataclasses.fields(holders[target])} or \
                hasattr(holders[target], name), row.key
        assert row.kind in (int, float, bool, str, list), row.key
        assert not (row.required and row.default is ABSENT), row.key


def string_parts(path) -> list[str]:
    """The text of every string literal of a module (f-strings' literal parts), docstrings
    left out."""
    import ast

    tree = ast.parse(path.read_text())
    docs = {id(node.body[0].value) for node in ast.walk(tree)
            if isinstance(node, (ast.Module, ast.FunctionDef, ast.ClassDef)) and node.body
            and isinstance(node.body[0], ast.Expr)}
    return [node.value for node in ast.walk(tree) if isinstance(node, ast.Constant)
            and isinstance(node.value, str) and id(node) not in docs]


def test_the_exporter_and_the_reader_spell_no_key():
    """Only the table spells verl keys: no string of export.py or job.py names one."""
    import re
    from pathlib import Path

    from planner.verl import export, job

    leaves = {row.key.rsplit(".", 1)[-1] for row in KEYS if "." in row.key}
    roots = {row.key.split(".", 1)[0] for row in KEYS if "." in row.key}
    dotted = re.compile(rf"\.({'|'.join(leaves)})(?!\w)|(?<!\w)({'|'.join(roots)})\.")
    for module in (export, job):
        spelled = {text for text in string_parts(Path(module.__file__)) if dotted.search(text)}
        assert spelled == set(), module.__name__


def test_mode_config_keys_and_launch_variables_come_from_the_table():
    assert list(keymap.MODE_CONFIG_KEYS["one-step-off"]) == [
        keymap.FREE_CACHE_ENGINE.key, keymap.CALCULATE_LOG_PROBS.key,
        keymap.CHECKPOINT_BACKEND.key, keymap.BYPASS_MODE.key, keymap.POOL_NNODES.key,
        keymap.POOL_GPUS_PER_NODE.key]
    assert keymap.MODE_CONFIG_KEYS["fully-async"][keymap.TRIGGER_SYNC.key] == 4
    assert dict(keymap.LAUNCH_VARIABLES)["NNODES"] == "trainer.nnodes"
    assert keymap.PARALLEL_KEYS["vpp"] == "virtual_pipeline_model_parallel_size"


# --- conversions the table states ---------------------------------------------------------------


def plain_config(overrides, base=None) -> dict:
    """``overrides`` applied to ``base`` (default: the table's own defaults of the keys verl's
    YAML has) as plain data, the way Hydra sets them."""
    config = table_defaults() if base is None else base
    for item in overrides:
        key = override_key(item)
        if key == "model_engine" or key.startswith("hydra."):
            continue
        node = config
        *parents, leaf = key.split(".")
        for part in parents:
            node = node.setdefault(part, {})
        node[leaf] = override_value(item.split("=", 1)[1])
    return config


def table_defaults() -> dict:
    """The config the table says verl composes: each key's default, interpolations resolved
    to the followed key's, keys verl's YAML lacks left out (test_defaults_are_verls checks
    these against verl itself)."""
    config: dict = {}

    def value(row):
        return value(row.default.row) if isinstance(row.default, Follows) else row.default

    for row in job_rows():
        if row.new or row.default is ABSENT or isinstance(row.default, Computed):
            continue
        node = config
        *parents, leaf = row.key.split(".")
        for part in parents:
            node = node.setdefault(part, {})
        node[leaf] = value(row)
    return config


def test_a_cpu_optimizer_without_a_fraction_offloads_nothing():
    """megatron-core's OptimizerConfig.optimizer_offload_fraction defaults to 0.0 (and verl
    passes override_optimizer_config through), so the HybridDeviceOptimizer keeps every
    parameter's optimizer state on the GPU."""
    model = builtin_model("Qwen3-8B")
    layout = Layout(tp=2, dp=4, optimizer_cpu_fraction=0.5)
    overrides = job_overrides(model, ClusterSpec(get_gpu("H100-80GB"), 8, 8), GrpoWorkload(),
                              layout, **PATHS)
    fraction = f"+{keymap.CPU_FRACTION.key}="
    assert f"{fraction}0.5" in overrides
    job, problems = read_job(plain_config(overrides))
    assert problems == [] and layout_of(job, False).optimizer_cpu_fraction == 0.5
    without = [item for item in overrides if not item.startswith(fraction)]
    job, problems = read_job(plain_config(without))
    assert problems == [] and layout_of(job, False).optimizer_cpu_fraction == 0.0


def test_a_value_the_table_cannot_read_is_a_finding_naming_the_key():
    model = builtin_model("Qwen3-8B")
    overrides = job_overrides(model, ClusterSpec(get_gpu("H100-80GB"), 8, 8), GrpoWorkload(),
                              Layout(tp=2, dp=4), **PATHS)
    for key, value, message in (
            (keymap.MAX_NUM_BATCHED_TOKENS.key, "many", "='many' is not an integer"),
            (keymap.DTYPE.key, "float32", "='float32': verl's Megatron engine trains in bfloat16 or float16"),
            (keymap.TP.key, 0, "=0 must be >= 1")):
        config = plain_config(overrides)
        *parents, leaf = key.split(".")
        node = config
        for part in parents:
            node = node[part] if part in node else node.setdefault(part, {})
        node[leaf] = value
        job, problems = read_job(config)
        assert job is None and [(p.keys, p.message) for p in problems] == \
            [((key,), f"{key}{message}")]
    config = plain_config(overrides)
    config["actor_rollout_ref"]["actor"]["megatron"]["override_ddp_config"] = "fp32"
    assert read_job(config)[1] == []  # a malformed section reads as absent, never a crash


# --- round trip: any valid layout, written out and read back, is itself -------------------------


@st.composite
def jobs(draw):
    """A model, a cluster whose size the layout fills, a valid layout in the one form a verl
    config can spell (sequence parallelism only with TP > 1, pipeline-split settings only with
    PP > 1, recompute detail only where its granularity uses it, the log-prob settings of the
    batching in use), and a workload."""
    model = builtin_model(draw(st.sampled_from(MODELS)))
    tp, pp, cp, dp = (draw(st.sampled_from(values)) for values in
                      ((1, 2, 4, 8), (1, 2, 4), (1, 2), (1, 2, 4, 8)))
    moe = model.is_moe
    recompute = draw(st.sampled_from(("none", "selective", "full")))
    applicable = applicable_modules((1 << len(RECOMPUTE_MODULES)) - 1, moe, model.is_mla)
    modules = draw(st.integers(1, applicable).filter(lambda m: m & ~applicable == 0)) \
        if recompute == "selective" else 0
    dynamic = draw(st.booleans())
    budget = draw(st.integers(1, 1 << 17)) if dynamic else 0
    pipeline_layout = draw(st.sampled_from(("", "Et*3|(tt|)*29,m|L"))) if pp > 1 else ""
    uneven = pp > 1 and not pipeline_layout
    layout = Layout(
        tp=tp, pp=pp, vpp=draw(st.sampled_from((1, 2))) if pp > 1 else 1, cp=cp,
        ep=draw(st.sampled_from((1, 2, 4))) if moe else 1,
        etp=draw(st.sampled_from((1, 2))) if moe else 1, dp=dp,
        micro_batch=draw(st.integers(1, 16)), recompute=recompute,
        param_offload=draw(st.booleans()), optimizer_offload=draw(st.booleans()),
        ref_param_offload=draw(st.booleans()),
        sequence_parallel=draw(st.booleans()) and tp > 1,
        distributed_optimizer=draw(st.booleans()),
        first_stage_layers=draw(st.integers(0, 4)) if uneven else 0,
        last_stage_layers=draw(st.integers(0, 4)) if uneven else 0,
        account_embedding=draw(st.booleans()) if uneven else False,
        account_loss=draw(st.booleans()) if uneven else False, pipeline_layout=pipeline_layout,
        recompute_modules=modules,
        recompute_num_layers=draw(st.integers(1, 8)) if recompute == "full" else 1,
        recompute_block=draw(st.booleans()) if recompute == "full" else False,
        optimizer_cpu_fraction=draw(st.integers(0, 10_000)) / 10_000,
        dynamic_batch=dynamic, max_token_len=budget,
        log_prob_max_token_len=draw(st.integers(0, 1 << 17)) if dynamic else 0,
        log_prob_micro_batch=0 if dynamic else draw(st.integers(0, 16)),
        rollout_tp=draw(st.sampled_from((1, 2, 4, 8))), rollout_dp=draw(st.integers(1, 8)),
        rollout_ep=draw(st.sampled_from((1, 2, 8, 16))),
        gpu_memory_utilization=draw(st.integers(5, 99)) / 100)
    mini = draw(st.sampled_from((1, 4, 16, 64)))
    # MTP: speculative decoding with k drafted tokens, training the MTP layers; verl turns
    # fused kernels off with MTP (the workload refuses the pair)
    speculative = draw(st.sampled_from(("off", "mtp")))
    train_mtp = draw(st.booleans())
    mtp = speculative == "mtp" or train_mtp
    workload = GrpoWorkload(
        speculative=speculative, train_mtp=train_mtp,
        speculative_tokens=draw(st.integers(1, 4)) if speculative == "mtp" else 1,
        train_batch_size=mini * draw(st.integers(1, 8)), rollout_n=draw(st.integers(1, 16)),
        prompt_length=draw(st.integers(1, 8192)), response_length=draw(st.integers(1, 32768)),
        mini_batch_size=mini, ppo_epochs=draw(st.integers(1, 4)),
        precision=draw(st.sampled_from(("bf16", "fp16"))), use_kl_loss=draw(st.booleans()),
        max_num_seqs=draw(st.integers(1, 1024)), use_kl_in_reward=draw(st.booleans()),
        bypass_old_log_prob=draw(st.booleans()),
        fused_kernels=draw(st.booleans()) and not mtp,
        entropy_chunk_tokens=draw(st.sampled_from((0, 512, 2048, 4096))),
        grad_reduce_in_fp32=draw(st.booleans()), adam_moment_bytes=draw(st.sampled_from((2, 4))),
        overlap_grad_reduce=draw(st.booleans()),
        rollout_engine=draw(st.sampled_from(("vllm", "sglang"))),
        rollout_precision=draw(st.sampled_from(("bf16", "fp8"))),
        enforce_eager=draw(st.booleans()), free_cache_engine=draw(st.booleans()),
        max_num_batched_tokens=draw(st.integers(1, 1 << 16)), prefix_caching=draw(st.booleans()))
    world = tp * pp * cp * dp
    per_node = math.gcd(world, 8)
    cluster = ClusterSpec(get_gpu("H100-80GB"), world, per_node)
    return model, cluster, workload, layout


def carried(workload: GrpoWorkload) -> dict:
    return {key: value for key, value in workload.to_dict().items() if key not in NOT_IN_VERL}


def assert_round_trip(model, cluster, workload, layout, config):
    job, problems = read_job(config)
    assert problems == []
    assert layout_of(job, model.is_moe) == layout
    assert carried(workload_of(job)) == carried(workload)
    assert (job.nnodes, job.gpus_per_node) == (cluster.num_nodes, cluster.gpus_per_node)


@PROPERTY
@given(jobs())
def test_any_valid_layout_written_out_reads_back_as_itself(job):
    model, cluster, workload, layout = job
    overrides = job_overrides(model, cluster, workload, layout, **PATHS)
    assert_round_trip(model, cluster, workload, layout, plain_config(overrides))


@pytest.mark.needs("verl")
@settings(max_examples=6, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.too_slow])
@given(jobs())
def test_the_round_trip_holds_through_verls_own_config(job):
    from planner.verl.config import compose, to_plain

    model, cluster, workload, layout = job
    config, unknown = compose(job_overrides(model, cluster, workload, layout, **PATHS))
    assert unknown == []
    assert_round_trip(model, cluster, workload, layout, to_plain(config))


# --- the defaults the table claims are verl's and megatron-core's ------------------------------


def megatron_defaults(row) -> dict:
    from megatron.core.optimizer import OptimizerConfig
    from megatron.core.transformer.transformer_config import MLATransformerConfig

    for section, config in ((keymap.TRANSFORMER, MLATransformerConfig),
                            (keymap.OPTIMIZER_OVERRIDE, OptimizerConfig)):
        if row.key.startswith(section + "."):
            return {f.name: f.default for f in dataclasses.fields(config)}
    raise AssertionError(f"{row.key}: no megatron-core config for its section")


@pytest.mark.needs("verl")
def test_defaults_are_verls_and_megatron_cores():
    from omegaconf import OmegaConf

    from planner.verl.config import base_config, compose, mode_base_config, to_plain

    # model_engine is the choice of ppo_trainer's defaults list; the Megatron sections exist
    # only with model_engine=megatron, the config every other row is checked against
    assert to_plain(compose([])[0])["model_engine"] == keymap.MODEL_ENGINE.default
    composed = base_config("megatron")
    plain = to_plain(composed)
    checked = 0
    for row in job_rows() + [row for row in KEYS if row.modes]:
        if row.origin == "Hydra" or row is keymap.MODEL_ENGINE:
            continue
        value = get(plain, row.key, ABSENT)
        if row.new or row.default is ABSENT:
            assert value is ABSENT, f"{row.key} is in verl's config: not new, default {value!r}"
        if row.origin == MEGATRON_CORE:
            assert megatron_defaults(row)[row.key.rsplit(".", 1)[1]] == row.default, row.key
            checked += 1
        elif row.origin == VERL and row.default is not ABSENT:
            assert value is not ABSENT, f"{row.key} is not in verl's config: mark it new"
            if isinstance(row.default, Follows):
                raw = OmegaConf.select(composed, row.key, throw_on_missing=False)
                node = composed
                for part in row.key.split(".")[:-1]:
                    node = node[part]
                text = node._get_node(row.key.rsplit(".", 1)[1])._value()
                assert text.startswith(f"${{oc.select:{row.default.row.key},"), (row.key, raw)
            else:
                assert value == row.default, f"{row.key}: verl says {value!r}"
                assert value is None or value == "???" or isinstance(value, row.kind) or \
                    row.kind is float and isinstance(value, int), (row.key, value)
            checked += 1
    assert checked > 60
    for mode in keymap.ASYNC_MODES:
        mode_plain = to_plain(mode_base_config("megatron", mode))
        for row in KEYS:
            if row.mode_default and mode in row.mode_default:
                assert get(mode_plain, row.key, ABSENT) == row.mode_default[mode], (mode, row.key)
        for row in keymap.mode_keys(mode):
            if row.origin != "Hydra":
                assert get(mode_plain, row.key, ABSENT) is not ABSENT, (mode, row.key)
