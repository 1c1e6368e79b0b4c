"""Search space: every enumerated layout obeys every rule; counts add up; pins work."""

import numpy as np
import pytest
from conftest import cluster

from planner.catalog.models import resolve_model
from planner.catalog.workload import GrpoWorkload
from planner.cost.request import PlanRequest
from planner.plan import choose_rollout, make_plan
from planner.search.batches import update_batches
from planner.search.pipeline import pipeline_split, split_candidates
from planner.search.rules import RULES, violations
from planner.search.space import SearchOptions, build_space

CASES = [("qwen3-30b", 16), ("qwen2.5-7b", 8), ("llama3.1-70b", 32), ("deepseek-v3", 256),
         ("mixtral-8x7b", 8), ("qwen3-0.6b", 1)]


def independent_check(model, world, workload, row) -> list[str]:
    """The constraints, restated one layout at a time without the planner's rule code."""
    broken = []
    tp, pp, vpp, cp, ep, etp, dp = (int(row[k]) for k in ("tp", "pp", "vpp", "cp", "ep", "etp",
                                                          "dp"))
    if tp * pp * cp * dp != world:
        broken.append("world")
    if model.num_attention_heads % tp:
        broken.append("heads")
    g = model.num_query_groups
    if g % tp and tp % g:
        broken.append("groups")
    # megatron-core's get_num_layers_to_build, written out: uneven first/last stages, or the
    # embedding/loss counted as layers (never both), every stage at least one layer
    first, last = int(row["first_stage_layers"]), int(row["last_stage_layers"])
    embedding, loss = bool(row["account_embedding"]), bool(row["account_loss"])
    if embedding or loss:
        total = model.num_layers + embedding + loss
        per_rank = total // pp
        if first or last or total % pp or per_rank - embedding < 0 or per_rank - loss < 0:
            broken.append("split")
        stage_sizes = [per_rank] * pp  # the per-rank count VPP must divide
    else:
        set_ends = (first > 0) + (last > 0)
        others = pp - set_ends
        rest = model.num_layers - first - last
        if pp > 1 and ((others and (rest % others or rest // others < 1))
                       or (not others and rest)):
            broken.append("split")
        middle = rest // others if others else 0
        stage_sizes = ([first or middle] + [middle] * max(pp - 2, 0) + [last or middle]
                       if pp > 1 else [model.num_layers])
    if vpp > 1:
        if pp < 2 or any(size % vpp for size in stage_sizes):
            broken.append("vpp")
        if pp == 2 and first and last:
            broken.append("vpp")
    if model.is_moe:
        if model.num_experts % ep or model.moe_ffn_hidden_size % etp:
            broken.append("experts")
    elif ep != 1 or etp != 1:
        broken.append("dense-ep")
    if world % (etp * ep * pp):
        broken.append("expert-grid")
    # verl's check_mutually_exclusive / _check_batch: micro-batch sizes only bind static batches;
    # dynamic batches (use_dynamic_bsz) pack by token budget
    if workload.sequences_per_step % dp or workload.sequences_per_mini_batch % dp:
        broken.append("batch")
    mbs = int(row["micro_batch"])
    if not row["dynamic_batch"] and ((workload.sequences_per_step % (dp * mbs))
                                     or (workload.sequences_per_mini_batch // dp) % mbs):
        broken.append("micro")
    if row["dynamic_batch"] and row["max_token_len"] * cp < workload.sequence_length:
        broken.append("token-budget")
    rtp, rdp, rep = int(row["rollout_tp"]), int(row["rollout_dp"]), int(row["rollout_ep"])
    if model.num_attention_heads % rtp or world % (rtp * rdp):
        broken.append("rollout")
    if model.is_moe and rep not in (1, rtp * rdp):
        broken.append("rollout-ep")
    if not model.is_moe and (rep != 1 or rdp != 1):
        broken.append("rollout-dense")
    return broken


@pytest.mark.parametrize("name,world", CASES)
def test_every_enumerated_layout_obeys_every_constraint(name, world):
    model, workload = resolve_model(name), GrpoWorkload()
    space = build_space(model, cluster(world), workload)
    assert len(space) > 0
    # the plan's rollout choice; the space carries each candidate's stage split
    cols, _ = choose_rollout(PlanRequest(model, cluster(world), workload), space.columns, space.rollouts, None)
    broken = violations(model, cluster(world), workload, cols)
    assert not any(mask.any() for mask in broken.values())
    rng = np.random.default_rng(0)
    for index in rng.choice(len(space), size=min(400, len(space)), replace=False):
        row = {key: values[index] for key, values in cols.items()}
        assert independent_check(model, world, workload, row) == [], row


@pytest.mark.parametrize("name,world", CASES)
def test_rejection_counts_add_up(name, world):
    space = build_space(resolve_model(name), cluster(world), GrpoWorkload())
    assert space.enumerated == space.valid + sum(space.rejected.values())
    assert set(space.rejected) <= {rule.name for rule in RULES}


def test_rejections_name_the_rules_users_hit():
    space = build_space(resolve_model("qwen2.5-7b"), cluster(8), GrpoWorkload())
    # 28 heads: TP 8 is impossible; 8 GPUs: TP*PP must divide 8.
    assert space.rejected["tp_divides_heads"] > 0
    assert space.rejected["world_size"] > 0
    assert 8 not in set(space.columns["tp"])


def test_pins_restrict_the_space():
    options = SearchOptions(fixed=(("pp", 2), ("tp", 2)))
    space = build_space(resolve_model("qwen3-8b"), cluster(16), GrpoWorkload(), options)
    assert set(space.columns["tp"]) == {2} and set(space.columns["pp"]) == {2}


def test_dense_models_get_no_expert_parallelism():
    space = build_space(resolve_model("llama3.1-8b"), cluster(16), GrpoWorkload())
    assert set(space.columns["ep"]) == {1} and set(space.columns["etp"]) == {1}
    assert set(space.rollouts["rollout_dp"]) == {1} and set(space.rollouts["rollout_ep"]) == {1}


def test_uneven_pipeline_for_prime_layer_count():
    """DeepSeek-V3's 61 layers: no PP but 1 splits them evenly; the search tries uneven first/
    last stages (verl's examples), one uneven end stage (verl's 96 x H20 DeepSeek-V3 job puts 6
    layers on the last of 12 stages) and the embedding/loss counted as layers."""
    pp = np.array([1, 2, 4, 8, 16])
    assert list(pipeline_split(61, pp)[3]) == [True, False, False, False, False]
    for size in (2, 4, 8, 12, 16):
        found = []
        for first, last, embedding, loss in split_candidates(61, size):
            f, middle, l_, ok = (int(np.asarray(part)[0]) for part in pipeline_split(
                61, np.array([size]), [first], [last], [embedding], [loss]))
            if ok:
                found.append((f, middle, l_))
                layers = f + middle * max(size - 2, 0) + l_ + embedding + loss
                assert layers == 61 + embedding + loss
        assert found, size
    f, middle, l_, ok = pipeline_split(61, np.array([12]), [0], [6])
    assert bool(ok[0]) and (int(f[0]), int(middle[0]), int(l_[0])) == (5, 5, 6)
    # 94 layers of Qwen3-235B on PP 8 with the embedding and loss counted: 96 = 8 x 12
    f, middle, l_, ok = pipeline_split(94, np.array([8]), None, None, [True], [True])
    assert bool(ok[0]) and (int(f[0]), int(middle[0]), int(l_[0])) == (11, 12, 11)


def test_explicit_stage_split():
    first, middle, last, valid = pipeline_split(
        28, np.array([4, 4, 2, 1]), np.array([4, 5, 14, 3]), np.array([6, 0, 14, 0]))
    assert list(valid) == [True, False, True, True]  # 28-5=23 over 3 stages does not divide
    assert (int(first[0]), int(middle[0]), int(last[0])) == (4, 9, 6)
    assert int(first[3]) == 28  # PP = 1 ignores the split


def test_interleaving_needs_enough_micro_batches():
    model, workload = resolve_model("qwen3-8b"), GrpoWorkload(mini_batch_size=16, rollout_n=1)
    space = build_space(model, cluster(16), workload)
    cols = space.columns
    m = update_batches(workload, cols).count
    interleaved = cols["vpp"] > 1
    assert interleaved.any()
    assert (m[interleaved] >= cols["pp"][interleaved]).all()
    assert (m[interleaved] % cols["pp"][interleaved] == 0).all()


def test_plan_marks_unwise_layouts_and_ranks_them_lower():
    plan = make_plan(PlanRequest(resolve_model("llama3.1-70b"), cluster(32), GrpoWorkload()))
    frame = plan.candidates
    across = frame[frame["flag_tp_across_nodes"]]
    assert len(across) > 0 and (across["tp"] > 8).all()
    fitting = frame[frame["fits"]]
    # TP across nodes is priced by the network: the best such layout is slower than the best
    # layout keeping TP inside a node, and ranks below it
    inside = fitting[~fitting["flag_tp_across_nodes"]]
    outside = fitting[fitting["flag_tp_across_nodes"]]
    assert len(outside) > 0
    assert outside["step_time_s"].min() > inside["step_time_s"].min()
    assert outside["rank"].min() > inside["rank"].min()


def test_deepseek_v3_on_1024_gpus_produces_a_plan():
    plan = make_plan(PlanRequest(resolve_model("deepseek-v3"), cluster(1024), GrpoWorkload()))
    assert plan.candidates["fits"].any()
    best = plan.candidates.iloc[0]
    assert best["fits"]
    assert best["ep"] > 1 or best["pp"] > 1  # 671B parameters never fit without them


def test_a_space_that_breaks_the_leading_rules_is_empty_and_counted():
    """Combinations that break a rule ahead of the layer split are rejected before the split
    candidates are added; when none is left the space is empty and the counts still add up."""
    space = build_space(resolve_model("qwen3-8b"), cluster(24), GrpoWorkload(),
                        SearchOptions(fixed=(("tp", 3),)))
    assert len(space) == 0
    assert space.enumerated == space.valid + sum(space.rejected.values())
    assert space.rejected["tp_divides_heads"] > 0


def test_counts_add_up_for_a_highly_composite_gpu_count():
    options = SearchOptions(micro_batches=(1,), recompute=("none",), offload=(False,),
                            ref_param_offload=(False,), optimizer_cpu_fraction=(0.0,))
    space = build_space(resolve_model("qwen3-30b"), cluster(120), GrpoWorkload(), options)
    assert len(space) > 0
    assert space.enumerated == space.valid + sum(space.rejected.values())
    # every split candidate of every combination is enumerated once
    assert space.rejected["world_size"] > space.rejected["pipeline_split"] > 0


@pytest.mark.parametrize("name, world, options", [
    ("qwen3-30b", 16, SearchOptions(exhaustive=True)),
    ("qwen2.5-7b", 8, SearchOptions(exhaustive=True, dynamic_batch=False)),
    ("llama3.1-70b", 32, SearchOptions(exhaustive=True, micro_batches=(4, 1, 2))),
])
def test_the_batch_rules_checked_per_micro_batch_match_the_whole_cross_product(name, world,
                                                                                options):
    """build_space checks the batch rules once per (parallel row, micro-batch) and builds the
    cross product by index; the same layouts, columns, order and counts as crossing every
    parallel row with every knob row and checking each."""
    from planner.search.rules import first_violation
    from planner.search.space import (
        BATCH_RULES,
        PARALLEL_RULES,
        _cross,
        _with_batching,
        knob_options,
        parallel_options,
        rollout_options,
    )

    model, workload = resolve_model(name), GrpoWorkload()
    space = build_space(model, cluster(world), workload, options)
    parallel = parallel_options(model, cluster(world), options)
    broken = violations(model, cluster(world), workload, parallel,
                        tuple(rule for rule in RULES if rule.name in PARALLEL_RULES))
    keep = ~np.any(list(broken.values()), axis=0)
    parallel = {key: values[keep] for key, values in parallel.items()}
    every = _with_batching(model, workload, options,
                           _cross(parallel, knob_options(options, workload)))
    order = [rule.name for rule in RULES if rule.name in BATCH_RULES]
    first = first_violation(violations(model, cluster(world), workload, every,
                                       tuple(rule for rule in RULES if rule.name in order)),
                            order)
    rollouts = len(rollout_options(model, cluster(world), options)["rollout_tp"])
    for index, rule in enumerate(order):
        assert space.rejected.get(rule, 0) == int(np.sum(first == index)) * rollouts, rule
    assert list(space.columns) == list(every)
    for key, values in every.items():
        np.testing.assert_array_equal(space.columns[key], values[first < 0], err_msg=key)
        assert space.columns[key].dtype == values.dtype, key


def test_models_with_expert_biases_keep_experts_whole():
    """gpt-oss's experts carry biases (Megatron-Bridge's GPTOSSProvider: add_bias_linear=True),
    which megatron-core supports only with ETP 1; the plan used to pick ETP 2 and write
    add_bias_linear=False, a model without the checkpoint's biases."""
    model = resolve_model("gpt-oss-20b")
    assert model.linear_bias
    space = build_space(model, cluster(8), GrpoWorkload())
    assert set(space.columns["etp"]) == {1}
    assert space.rejected.get("etp_moe_bias", 0) > 0
    assert not resolve_model("qwen3-30b").linear_bias


def test_interleaving_with_dynamic_batches_has_a_sequence_per_micro_batch():
    """With use_dynamic_bsz verl rounds the packed micro-batch count up to a multiple of PP
    (microbatch_group_size_per_vp_stage) and raises when that exceeds the rank's sequences
    (seqlen_balancing.rearrange_micro_batches: 'Requested 4 non-empty micro-batches, but a rank
    has only 1').  16 sequences on 64 GPUs used to be planned as TP1 PP4 VPP3 DP16: one
    sequence per rank, four micro-batches."""
    from planner.search.batches import log_prob_batches

    model = resolve_model("qwen3-8b")
    workload = GrpoWorkload(train_batch_size=16, rollout_n=1, mini_batch_size=16)
    space = build_space(model, cluster(64), workload)
    cols = space.columns
    interleaved = (cols["vpp"] > 1) & cols["dynamic_batch"]
    assert interleaved.any()
    per_rank = workload.sequences_per_mini_batch // cols["dp"]
    assert (update_batches(workload, cols).memory_count[interleaved]
            <= per_rank[interleaved]).all()
    assert (log_prob_batches(workload, cols).memory_count[interleaved]
            <= (workload.sequences_per_step // cols["dp"])[interleaved]).all()
    one_each = {"tp": 1, "pp": 4, "vpp": 3, "dp": 16}
    rows = np.flatnonzero(np.logical_and.reduce([cols[k] == v for k, v in one_each.items()]))
    assert rows.size == 0


@pytest.mark.parametrize("dynamic", [True, False])
def test_constant_columns_hold_one_value(dynamic):
    """The columns the search does not vary are read-only views of one value (no memory per
    row), equal to the full columns they stand for."""
    space = build_space(resolve_model("qwen3-8b"), cluster(16), GrpoWorkload(),
                        SearchOptions(dynamic_batch=dynamic))
    cols, n = space.columns, len(space)
    constant = {"distributed_optimizer": True, "recompute_num_layers": 1,
                "recompute_block": False, "pipeline_layout": "", "dynamic_batch": dynamic,
                "log_prob_max_token_len": 0, "log_prob_micro_batch": 0}
    if not dynamic:
        constant["max_token_len"] = 0
    for name, value in constant.items():
        values = cols[name]
        assert values.strides == (0,) and not values.flags.writeable, name
        full = np.full(n, value)
        assert values.dtype == full.dtype and np.array_equal(values, full), name
        np.testing.assert_array_equal(values[::7], full[::7])
    if dynamic:
        assert cols["max_token_len"].strides != (0,) and (cols["max_token_len"] > 0).all()
