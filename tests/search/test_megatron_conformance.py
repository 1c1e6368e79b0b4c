"""The planner's parallel-layout rules against megatron-core 0.16.1's own code, on CPU.

Every test runs a grid through both sides and compares verdicts; none is a hand-picked pass:

* pipeline split and VPP: ``TransformerConfig`` plus ``get_num_layers_to_build`` /
  ``get_transformer_layer_offset`` for every (pp_rank, vp_stage), layers must tile 0..L-1;
* attention heads and query groups: ``TransformerConfig.__post_init__``;
* world-size rules: the real ``parallel_state.initialize_model_parallel`` under torch's ``fake``
  process group, one subprocess per world size (all started at once);
* every parallel layout the search space enumerates (qwen3-30b on 16 GPUs, qwen2.5-7b on 8) must
  build a megatron-core config, split its layers and initialise its process groups.

See ``/work/notes/megatron_research.md`` for where each megatron-core rule lives.
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
import subprocess
import sys
import warnings

import numpy as np
import pytest

with warnings.catch_warnings():
    warnings.simplefilter("ignore")
    pytest.importorskip("megatron.core")
    import torch
    from megatron.core.transformer.transformer_block import get_num_layers_to_build
    from megatron.core.transformer.transformer_config import TransformerConfig
    from megatron.core.transformer.transformer_layer import get_transformer_layer_offset

from planner.catalog.hardware import ClusterSpec, get_gpu
from planner.catalog.models import resolve_model
from planner.catalog.workload import GrpoWorkload
from planner.search.layout import LAYOUT_FIELDS, RECOMPUTE, Layout
from planner.search.pipeline import split_candidates
from planner.search.rules import RULES, explain, pipeline_split, violations
from planner.search.space import SearchOptions, build_space

pytestmark = [
    pytest.mark.filterwarnings("ignore:Transformer Engine and Apex are not installed"),
    # TransformerConfig's advice (fp32 routing, deprecated cuda-graph scope, SP with EP...) is
    # not what these tests check.
    pytest.mark.filterwarnings("ignore::UserWarning:megatron"),
    pytest.mark.filterwarnings("ignore::DeprecationWarning"),
]

# What megatron-core raises when it refuses a layout (a TypeError would be a bug in this file).
MCORE_ERRORS = (ValueError, AssertionError, ZeroDivisionError, RuntimeError)

LAYER_COUNTS = (12, 16, 28, 36, 48, 61, 94)
PIPELINE_SIZES = range(1, 17)
VPP_SIZES = (1, 2, 3, 4)
WORKLOAD = GrpoWorkload()


# --- helpers ---------------------------------------------------------------------------------


def columns(n: int, **values) -> dict[str, np.ndarray]:
    """Layout columns for ``n`` rows: ``values`` (scalars or arrays), Layout defaults elsewhere."""
    defaults = Layout()
    cols = {}
    for name in LAYOUT_FIELDS:
        value = values.get(name, getattr(defaults, name))
        if name == "recompute" and isinstance(value, str):
            value = RECOMPUTE.index(value)
        cols[name] = np.broadcast_to(np.asarray(value), (n,)).copy()
    return cols


def cluster(num_gpus: int) -> ClusterSpec:
    return ClusterSpec(get_gpu("h100"), num_gpus, min(8, num_gpus))


def with_layers(num_layers: int):
    return dataclasses.replace(resolve_model("qwen3-8b"), num_layers=num_layers)


def planner_stages(first: int, middle: int, last: int, pp: int) -> list[int]:
    """Layers per PP rank as the planner describes the split."""
    if pp == 1:
        return [first]
    return [first] + [middle] * (pp - 2) + [last]


def mcore_pipeline(num_layers: int, pp: int, vpp: int, first: int | None = None,
                   last: int | None = None, embedding: bool = False, loss: bool = False):
    """Build the split in megatron-core: ``(chunks, None)`` or ``(None, error)``.

    ``chunks`` maps (pp_rank, vp_stage) to (layers, offset); the layers must tile 0..L-1 exactly
    once, otherwise megatron-core would build a broken model and that counts as a refusal.
    ``embedding``/``loss``: ``account_for_{embedding,loss}_in_pipeline_split``.
    """
    kwargs = dict(num_layers=num_layers, hidden_size=64, num_attention_heads=8,
                  pipeline_model_parallel_size=pp,
                  account_for_embedding_in_pipeline_split=bool(embedding),
                  account_for_loss_in_pipeline_split=bool(loss))
    if pp > 1:
        kwargs["pipeline_dtype"] = torch.bfloat16
    if vpp > 1:
        kwargs["virtual_pipeline_model_parallel_size"] = vpp
    if first is not None:
        kwargs["num_layers_in_first_pipeline_stage"] = first
    if last is not None:
        kwargs["num_layers_in_last_pipeline_stage"] = last
    try:
        chunks = mcore_chunks(TransformerConfig(**kwargs), pp, vpp)
    except MCORE_ERRORS as exc:
        return None, f"{type(exc).__name__}: {exc}"
    if not tiles(chunks, num_layers):
        return None, f"layers do not tile 0..{num_layers - 1}: {chunks}"
    return chunks, None


def mcore_chunks(config, pp: int, vpp: int) -> dict:
    """(pp_rank, vp_stage) -> (layers, offset) as megatron-core builds them for ``config``."""
    chunks = {}
    for pp_rank in range(pp):
        for vp in range(vpp):
            stage = vp if vpp > 1 else None
            chunks[pp_rank, vp] = (
                get_num_layers_to_build(config, vp_stage=stage, pp_rank=pp_rank),
                get_transformer_layer_offset(config, vp_stage=stage, pp_rank=pp_rank))
    return chunks


def tiles(chunks: dict, num_layers: int) -> bool:
    """The chunks cover layers 0..num_layers-1 exactly once."""
    covered = sorted(i for n, offset in chunks.values() for i in range(offset, offset + n))
    return covered == list(range(num_layers))


def per_rank(chunks: dict, pp: int) -> list[int]:
    return [sum(n for (rank, _), (n, _) in chunks.items() if rank == r) for r in range(pp)]


def auto_split(num_layers: int, pp: int):
    """The split with no split setting: megatron-core's even split (valid when PP divides L)."""
    first, middle, last, valid = pipeline_split(num_layers, np.array([pp]))
    return int(first[0]), int(middle[0]), int(last[0]), bool(valid[0])


def check_chunks(chunks: dict, expected: list[int], pp: int, vpp: int, embedding: bool = False,
                 loss: bool = False) -> str | None:
    """None when megatron-core's per-rank layers equal the planner's, each chunk an equal share
    of the rank's layers -- counting the embedding (loss) as a layer of the first (last) chunk
    when it is accounted for in the split."""
    got = per_rank(chunks, pp)
    if got != expected:
        return f"layers per PP rank: megatron-core {got}, planner {expected}"
    for (rank, vp), (n, _) in chunks.items():
        extra_first = bool(embedding) and rank == 0 and pp > 1
        extra_last = bool(loss) and rank == pp - 1 and pp > 1
        rank_total = expected[rank] + extra_first + extra_last
        counted = n + (extra_first and vp == 0) + (extra_last and vp == vpp - 1)
        if counted * vpp != rank_total:
            return (f"chunk (pp_rank {rank}, vp_stage {vp}) has {n} layers, not "
                    f"{rank_total}/{vpp} less the accounted embedding/loss")
    return None


def fail_if(disagreements: list[str], what: str) -> None:
    if disagreements:
        shown = "\n  ".join(disagreements[:40])
        more = f"\n  ... and {len(disagreements) - 40} more" if len(disagreements) > 40 else ""
        pytest.fail(f"{len(disagreements)} {what}:\n  {shown}{more}")


# --- 1. pipeline split and virtual pipeline stages -----------------------------------------


def candidate_split(num_layers: int, pp: int, candidate) -> tuple[int, int, int, bool]:
    f, l, embedding, loss = candidate
    first, middle, last, valid = pipeline_split(num_layers, np.array([pp]), [f], [l],
                                                [embedding], [loss])
    return int(first[0]), int(middle[0]), int(last[0]), bool(valid[0])


def test_every_split_candidate_matches_get_num_layers_to_build():
    """Every split the search tries (even; embedding and/or loss counted as layers; uneven
    first/last) gets the same verdict and the same layers per stage as megatron-core."""
    disagreements = []
    checked = {"valid": 0, "invalid": 0}
    for num_layers in LAYER_COUNTS:
        for pp in PIPELINE_SIZES:
            for candidate in split_candidates(num_layers, pp):
                f, l, embedding, loss = candidate
                first, middle, last, valid = candidate_split(num_layers, pp, candidate)
                checked["valid" if valid else "invalid"] += 1
                chunks, error = mcore_pipeline(num_layers, pp, 1, f or None, l or None,
                                               embedding, loss)
                label = f"L={num_layers} pp={pp} split {candidate}"
                if valid and error:
                    disagreements.append(f"{label}: planner valid, megatron-core refuses: "
                                         f"{error}")
                elif not valid and chunks is not None:
                    disagreements.append(f"{label}: planner invalid, megatron-core builds "
                                         f"{per_rank(chunks, pp)}")
                elif valid:
                    problem = check_chunks(chunks, planner_stages(first, middle, last, pp), pp,
                                           1, embedding, loss)
                    if problem:
                        disagreements.append(f"{label}: {problem}")
    fail_if(disagreements, "pipeline-split disagreements")
    assert checked["valid"] > 100 and checked["invalid"] > 50  # both verdicts exercised


def test_accounted_split_with_vpp_matches_megatron_core():
    """The embedding/loss counted as layers, interleaved: the rank's count (embedding
    included) must divide by VPP, and the first/last chunk builds one layer fewer."""
    disagreements = []
    for num_layers in LAYER_COUNTS:
        model = with_layers(num_layers)
        grid = [(pp, vpp, e, lo) for pp in range(2, 13) for vpp in (2, 3, 4)
                for e in (False, True) for lo in (False, True) if e or lo]
        cols = columns(len(grid), pp=np.array([g[0] for g in grid]),
                       vpp=np.array([g[1] for g in grid]),
                       account_embedding=np.array([g[2] for g in grid]),
                       account_loss=np.array([g[3] for g in grid]))
        broken = violations(model, cluster(16), WORKLOAD, cols)
        for i, (pp, vpp, e, lo) in enumerate(grid):
            planner_ok = not (broken["pipeline_split"][i] or broken["vpp_divides_stage_layers"][i])
            chunks, error = mcore_pipeline(num_layers, pp, vpp, None, None, e, lo)
            label = f"L={num_layers} pp={pp} vpp={vpp} embedding={e} loss={lo}"
            if planner_ok and error:
                disagreements.append(f"{label}: planner valid, megatron-core refuses: {error}")
            elif not planner_ok and chunks is not None:
                disagreements.append(f"{label}: planner refuses, megatron-core builds "
                                     f"{per_rank(chunks, pp)}")
            elif planner_ok:
                first, middle, last, _ = candidate_split(num_layers, pp, (0, 0, e, lo))
                problem = check_chunks(chunks, planner_stages(first, middle, last, pp), pp, vpp,
                                       e, lo)
                if problem:
                    disagreements.append(f"{label}: {problem}")
    fail_if(disagreements, "accounted VPP disagreements")


def test_vpp_rule_matches_megatron_core():
    """``vpp_needs_pp``/``vpp_divides_stage_layers`` against a real interleaved split."""
    disagreements = []
    verdicts = {True: 0, False: 0}
    for num_layers in LAYER_COUNTS:
        model = with_layers(num_layers)
        grid = [(pp, vpp) for pp in PIPELINE_SIZES for vpp in VPP_SIZES]
        pp_col = np.array([g[0] for g in grid])
        vpp_col = np.array([g[1] for g in grid])
        broken = violations(model, cluster(16), WORKLOAD,
                            columns(len(grid), pp=pp_col, vpp=vpp_col))
        for i, (pp, vpp) in enumerate(grid):
            if broken["pipeline_split"][i]:
                continue  # no split to interleave (checked above)
            planner_ok = not (broken["vpp_needs_pp"][i] or broken["vpp_divides_stage_layers"][i])
            if pp == 1:
                # megatron-core's config ignores VPP at PP=1; parallel_state refuses it (test 3).
                assert planner_ok == (vpp == 1), (num_layers, pp, vpp)
                continue
            first, middle, last, _ = auto_split(num_layers, pp)
            chunks, error = mcore_pipeline(num_layers, pp, vpp)
            verdicts[chunks is not None] += 1
            label = (f"L={num_layers} pp={pp} vpp={vpp} first/middle/last="
                     f"{first}/{middle}/{last}")
            if planner_ok and error:
                disagreements.append(f"{label}: planner valid, megatron-core refuses: {error}")
            elif not planner_ok and chunks is not None:
                disagreements.append(f"{label}: planner refuses, megatron-core builds "
                                     f"{per_rank(chunks, pp)}")
            elif planner_ok:
                problem = check_chunks(chunks, planner_stages(first, middle, last, pp), pp, vpp)
                if problem:
                    disagreements.append(f"{label}: {problem}")
    fail_if(disagreements, "VPP disagreements")
    assert verdicts[True] > 30 and verdicts[False] > 30


@pytest.mark.parametrize("num_layers,first,last,vpp", [
    (12, 4, 8, 2), (16, 8, 8, 2), (24, 12, 12, 4), (12, 6, 6, 3)])
def test_pp2_vpp_with_first_and_last_is_rejected(num_layers, first, last, vpp):
    """megatron-core 0.16.1 accepts the config, then divides by zero middle stages."""
    model = with_layers(num_layers)
    broken = violations(model, cluster(16), WORKLOAD,
                        columns(1, pp=2, vpp=vpp, first_stage_layers=first,
                                last_stage_layers=last))
    assert broken["pipeline_split"][0] or broken["vpp_divides_stage_layers"][0]
    with pytest.raises(ZeroDivisionError):
        config = TransformerConfig(
            num_layers=num_layers, hidden_size=64, num_attention_heads=8,
            pipeline_model_parallel_size=2, pipeline_dtype=torch.bfloat16,
            virtual_pipeline_model_parallel_size=vpp, num_layers_in_first_pipeline_stage=first,
            num_layers_in_last_pipeline_stage=last)
        for vp in range(vpp):
            get_transformer_layer_offset(config, vp_stage=vp, pp_rank=1)


def test_odd_layers_over_pp2_split_only_with_one_accounted_end():
    """Odd L over PP=2: no even split; counting both the embedding and the loss keeps L + 2 odd;
    counting one of them makes it even -- the planner and megatron-core agree each time."""
    for num_layers in (13, 25, 61, 95):
        model = with_layers(num_layers)
        cases = [(False, False), (True, True), (True, False), (False, True)]
        cols = columns(4, pp=2, account_embedding=np.array([c[0] for c in cases]),
                       account_loss=np.array([c[1] for c in cases]))
        refused = violations(model, cluster(16), WORKLOAD, cols)["pipeline_split"]
        assert refused.tolist() == [True, True, False, False], num_layers
        for (embedding, loss), planner_refuses in zip(cases, refused):
            chunks, _ = mcore_pipeline(num_layers, 2, 1, None, None, embedding, loss)
            assert (chunks is None) == bool(planner_refuses), (num_layers, embedding, loss)


def test_explicit_first_last_stages_match_megatron_core():
    """User-given first/last stage layers (0 = not given) over a grid, VPP included."""
    disagreements = []
    values = (0, 1, 2, 3, 4, 6, 8)
    for num_layers in (12, 16, 28):
        model = with_layers(num_layers)
        grid = [(pp, vpp, f, l) for pp in range(2, 7) for vpp in (1, 2, 3)
                for f in values for l in values if f or l]
        cols = columns(len(grid), pp=np.array([g[0] for g in grid]),
                       vpp=np.array([g[1] for g in grid]),
                       first_stage_layers=np.array([g[2] for g in grid]),
                       last_stage_layers=np.array([g[3] for g in grid]))
        broken = violations(model, cluster(16), WORKLOAD, cols)
        first_col, middle_col, last_col, _ = pipeline_split(
            num_layers, cols["pp"], cols["first_stage_layers"], cols["last_stage_layers"])
        for i, (pp, vpp, f, l) in enumerate(grid):
            planner_ok = not (broken["pipeline_split"][i] or broken["vpp_needs_pp"][i]
                              or broken["vpp_divides_stage_layers"][i])
            chunks, error = mcore_pipeline(num_layers, pp, vpp, f or None, l or None)
            label = f"L={num_layers} pp={pp} vpp={vpp} first={f} last={l}"
            if planner_ok and error:
                disagreements.append(f"{label}: planner valid, megatron-core refuses: {error}")
            elif not planner_ok and chunks is not None:
                rule = next(name for name in ("pipeline_split", "vpp_needs_pp",
                                              "vpp_divides_stage_layers") if broken[name][i])
                disagreements.append(f"{label}: planner refuses ({rule}), megatron-core builds "
                                     f"{per_rank(chunks, pp)}")
            elif planner_ok:
                expected = planner_stages(int(first_col[i]), int(middle_col[i]),
                                          int(last_col[i]), pp)
                problem = check_chunks(chunks, expected, pp, vpp)
                if problem:
                    disagreements.append(f"{label}: {problem}")
    fail_if(disagreements, "explicit first/last disagreements")


def parse_pp_list(message: str) -> tuple[list[int], bool]:
    """The PP sizes a message names after its last ';' ("1..N" or "1, 2, 4 ..."), truncated?"""
    tail = message.rsplit(";", 1)[-1]
    sizes = []
    for low, high, single in re.findall(r"(\d+)\.\.(\d+)|(\d+)", tail):
        sizes += list(range(int(low), int(high) + 1)) if low else [int(single)]
    return sizes, tail.rstrip().endswith("...")


def test_pipeline_split_message_names_the_valid_pp_sizes():
    """``explain`` tells the user which PP sizes work: each one it names must split in
    megatron-core with the planner's split, and (unless cut short) it names them all."""
    disagreements = []
    for num_layers in LAYER_COUNTS:
        model = with_layers(num_layers)
        accepted = []
        for pp in range(1, num_layers + 2):
            first, middle, last, valid = auto_split(num_layers, pp)
            if valid and mcore_pipeline(num_layers, pp, 1)[0]:
                accepted.append(pp)
        for rejected_pp in [pp for pp in range(1, num_layers + 2) if pp not in accepted][:3]:
            messages = dict(explain(model, cluster(16), WORKLOAD,
                                    Layout(pp=rejected_pp).to_dict()))
            assert "pipeline_split" in messages, (num_layers, rejected_pp)
            claimed, truncated = parse_pp_list(messages["pipeline_split"])
            refused = sorted(set(claimed) - set(accepted))
            missing = [] if truncated else sorted(set(accepted) - set(claimed))
            if not claimed or refused or missing:
                disagreements.append(
                    f"L={num_layers} pp={rejected_pp}: message names PP {claimed}; megatron-core"
                    f" refuses the planner's split of {refused}, message omits {missing}; "
                    f"message: {messages['pipeline_split']!r}")
    fail_if(disagreements, "pipeline_split messages naming the wrong PP sizes")


# --- 2. attention heads and query groups -----------------------------------------------------


def test_heads_and_query_group_rules_match_transformer_config():
    disagreements = []
    verdicts = {True: 0, False: 0}
    base = resolve_model("qwen3-8b")
    tps = np.array([1, 2, 4, 8, 16])
    for heads in (8, 14, 28, 32, 40, 64):
        for kv in sorted({1, 2, 4, 7, 8, heads}):
            if heads % kv:
                continue
            model = dataclasses.replace(base, num_attention_heads=heads, num_query_groups=kv)
            broken = violations(model, cluster(16), WORKLOAD, columns(len(tps), tp=tps))
            for i, tp in enumerate(tps.tolist()):
                planner_rules = [name for name in ("tp_divides_heads", "tp_divides_query_groups")
                                 if broken[name][i]]
                try:
                    TransformerConfig(num_layers=4, hidden_size=heads * 64,
                                      num_attention_heads=heads, num_query_groups=kv,
                                      tensor_model_parallel_size=tp)
                    error = None
                except ValueError as exc:
                    error = str(exc)
                verdicts[error is None] += 1
                label = f"heads={heads} kv={kv} tp={tp}"
                if bool(planner_rules) != bool(error):
                    disagreements.append(f"{label}: planner breaks {planner_rules}, "
                                         f"megatron-core: {error or 'accepts'}")
                elif error:
                    # megatron-core checks heads first, then groups: the same first rule.
                    expected = ("tp_divides_heads" if error.startswith("num_attention_heads")
                                else "tp_divides_query_groups")
                    if planner_rules[0] != expected:
                        disagreements.append(f"{label}: planner's first rule {planner_rules[0]}, "
                                             f"megatron-core: {error}")
                    explained = dict(explain(model, cluster(16), WORKLOAD,
                                             Layout(tp=tp).to_dict()))
                    if expected not in explained:
                        disagreements.append(f"{label}: explain() omits {expected}")
    fail_if(disagreements, "head/query-group disagreements")
    assert verdicts[True] > 20 and verdicts[False] > 20


# --- 3. world-size rules against parallel_state ----------------------------------------------

FAKE_PG_SCRIPT = r"""
import json, sys, warnings
warnings.filterwarnings("ignore")
import torch.distributed as dist
from torch.testing._internal.distributed.fake_pg import FakeStore
from megatron.core import parallel_state as ps

with open(sys.argv[1]) as f:
    request = json.load(f)
results = []
for tp, pp, cp, ep, etp, vpp in request["layouts"]:
    # A fresh fake world per layout: torch keeps every group ever made in its registry, which
    # makes each later initialize_model_parallel slower.
    dist.init_process_group("fake", store=FakeStore(), rank=0, world_size=request["world"])
    try:
        ps.initialize_model_parallel(
            tensor_model_parallel_size=tp, pipeline_model_parallel_size=pp,
            virtual_pipeline_model_parallel_size=vpp if vpp > 1 else None,
            context_parallel_size=cp, expert_model_parallel_size=ep,
            expert_tensor_parallel_size=etp, create_gloo_process_groups=False)
        results.append({
            "ok": True,
            "tp": ps.get_tensor_model_parallel_world_size(),
            "pp": ps.get_pipeline_model_parallel_world_size(),
            "cp": ps.get_context_parallel_world_size(),
            "dp": ps.get_data_parallel_world_size(),
            "dp_cp": ps.get_data_parallel_world_size(with_context_parallel=True),
            "ep": ps.get_expert_model_parallel_world_size(),
            "etp": ps.get_expert_tensor_parallel_world_size(),
            "edp": ps.get_expert_data_parallel_world_size(),
        })
    except (RuntimeError, AssertionError, ValueError) as exc:
        results.append({"ok": False, "error": f"{type(exc).__name__}: {exc}"})
    finally:
        ps.destroy_model_parallel()
        dist.destroy_process_group()
json.dump(results, sys.stdout)
"""

GRID_WORLDS = (8, 16, 24, 48)
SPACE_CASES = (("qwen3-30b", 16), ("qwen2.5-7b", 8))
PARALLEL_KEYS = ("tp", "pp", "cp", "ep", "etp", "vpp")


def world_grid() -> list[tuple[int, ...]]:
    """(tp, pp, cp, ep, etp, vpp): every combination of small sizes, VPP on the dense subset."""
    grid = [(tp, pp, cp, ep, etp, 1) for tp in (1, 2, 4, 8) for pp in (1, 2, 3) for cp in (1, 2)
            for ep in (1, 2, 3, 4, 8) for etp in (1, 2, 4)]
    grid += [(tp, pp, cp, 1, 1, 2) for tp in (1, 2, 4, 8) for pp in (1, 2, 3) for cp in (1, 2)]
    return grid


@pytest.fixture(scope="module")
def spaces():
    return {(name, world): build_space(resolve_model(name), cluster(world), WORKLOAD,
                                       SearchOptions())
            for name, world in SPACE_CASES}


def space_parallel_rows(space) -> list[tuple[int, ...]]:
    cols = space.columns
    return sorted(set(zip(*[cols[k].tolist() for k in PARALLEL_KEYS])))


@pytest.fixture(scope="module")
def fake_pg(spaces, tmp_path_factory):
    """``{world: {(tp, pp, cp, ep, etp, vpp): result}}`` from one subprocess per world size."""
    requests = {world: set(world_grid()) for world in GRID_WORLDS}
    for (_, world), space in spaces.items():
        requests.setdefault(world, set()).update(space_parallel_rows(space))
    directory = tmp_path_factory.mktemp("fake_pg")
    env = {**os.environ, "PYTHONWARNINGS": "ignore", "OMP_NUM_THREADS": "1"}
    procs = {}
    for world, layouts in requests.items():
        layouts = sorted(layouts)
        path = directory / f"world{world}.json"
        path.write_text(json.dumps({"world": world, "layouts": layouts}))
        procs[world] = (layouts, subprocess.Popen(
            [sys.executable, "-c", FAKE_PG_SCRIPT, str(path)], stdout=subprocess.PIPE,
            stderr=subprocess.PIPE, text=True, env=env))
    results = {}
    for world, (layouts, proc) in procs.items():
        out, err = proc.communicate(timeout=300)
        assert proc.returncode == 0, f"world {world} subprocess failed:\n{err[-3000:]}"
        answers = json.loads(out)
        assert len(answers) == len(layouts)
        results[world] = dict(zip(layouts, answers))
    return results


@pytest.mark.parametrize("world", GRID_WORLDS)
def test_world_size_rules_match_initialize_model_parallel(world, fake_pg):
    model = resolve_model("qwen3-30b")
    layouts = world_grid()
    arr = {key: np.array([layout[i] for layout in layouts]) for i, key in enumerate(PARALLEL_KEYS)}
    dp = world // (arr["tp"] * arr["pp"] * arr["cp"])
    compared = ("world_size", "expert_grid", "vpp_needs_pp")
    broken = violations(model, cluster(world), WORKLOAD, columns(len(layouts), dp=dp, **arr),
                        tuple(rule for rule in RULES if rule.name in compared))
    disagreements = []
    verdicts = {True: 0, False: 0}
    for i, layout in enumerate(layouts):
        planner_rules = [name for name in compared if broken[name][i]]
        result = fake_pg[world][layout]
        verdicts[result["ok"]] += 1
        label = f"world={world} " + " ".join(f"{k}={v}" for k, v in zip(PARALLEL_KEYS, layout))
        if bool(planner_rules) == result["ok"]:
            disagreements.append(f"{label}: planner breaks {planner_rules}, megatron-core "
                                 f"{result.get('error', 'accepts')}")
            continue
        if result["ok"]:
            tp, pp, cp, ep, etp, _ = layout
            expected = dict(tp=tp, pp=pp, cp=cp, ep=ep, etp=etp, dp=int(dp[i]),
                            dp_cp=int(dp[i]) * cp, edp=world // (etp * ep * pp))
            got = {key: result[key] for key in expected}
            if got != expected:
                disagreements.append(f"{label}: group sizes {got}, planner expects {expected}")
    fail_if(disagreements, "world-size disagreements")
    assert verdicts[True] > 20 and verdicts[False] > 20


# --- 4. every enumerated layout builds in megatron-core --------------------------------------


def mcore_config_for(model, row: dict) -> TransformerConfig:
    """megatron-core's config for a search-space row, with the row's pipeline split settings."""
    pp, vpp = row["pp"], row["vpp"]
    first_arg = int(row["first_stage_layers"]) or None
    last_arg = int(row["last_stage_layers"]) or None
    kwargs = dict(
        num_layers=model.num_layers, hidden_size=model.hidden_size,
        ffn_hidden_size=model.ffn_hidden_size, num_attention_heads=model.num_attention_heads,
        num_query_groups=model.num_query_groups, kv_channels=model.head_dim,
        add_bias_linear=False, add_qkv_bias=model.qkv_bias, qk_layernorm=model.qk_norm,
        gated_linear_unit=model.gated_mlp, bf16=True, params_dtype=torch.bfloat16,
        tensor_model_parallel_size=row["tp"], pipeline_model_parallel_size=pp,
        context_parallel_size=row["cp"], sequence_parallel=bool(row["sequence_parallel"]),
        expert_model_parallel_size=row["ep"], expert_tensor_parallel_size=row["etp"],
        num_layers_in_first_pipeline_stage=first_arg,
        num_layers_in_last_pipeline_stage=last_arg,
        account_for_embedding_in_pipeline_split=bool(row["account_embedding"]),
        account_for_loss_in_pipeline_split=bool(row["account_loss"]))
    if pp > 1:
        kwargs["pipeline_dtype"] = torch.bfloat16
    if vpp > 1:
        kwargs["virtual_pipeline_model_parallel_size"] = vpp
    if model.is_moe:
        kwargs.update(num_moe_experts=model.num_experts, moe_router_topk=model.moe_top_k,
                      moe_ffn_hidden_size=model.moe_ffn_hidden_size,
                      moe_router_pre_softmax=model.moe_top_k == 1,
                      moe_token_dispatcher_type="alltoall")
    return TransformerConfig(**kwargs)


@pytest.mark.parametrize("name,world", SPACE_CASES)
def test_every_enumerated_layout_builds_in_megatron_core(name, world, spaces, fake_pg):
    model = resolve_model(name)
    cols = spaces[name, world].columns
    keys = PARALLEL_KEYS + ("dp", "first_stage_layers", "last_stage_layers", "account_embedding",
                            "account_loss", "sequence_parallel")
    rows = sorted(set(zip(*[cols[k].tolist() for k in keys])))
    assert len(rows) >= 20  # the space is not trivially small
    disagreements = []
    for values in rows:
        row = dict(zip(keys, values))
        label = f"{name} on {world}: " + " ".join(f"{k}={v}" for k, v in row.items())
        try:
            config = mcore_config_for(model, row)
        except MCORE_ERRORS as exc:
            disagreements.append(f"{label}: TransformerConfig refuses: "
                                 f"{type(exc).__name__}: {exc}")
            continue
        pp, vpp = row["pp"], row["vpp"]
        try:
            chunks = mcore_chunks(config, pp, vpp)
        except MCORE_ERRORS as exc:
            disagreements.append(f"{label}: layer split fails: {type(exc).__name__}: {exc}")
            continue
        if not tiles(chunks, model.num_layers):
            disagreements.append(f"{label}: layers do not tile: {chunks}")
        split = (row["first_stage_layers"], row["last_stage_layers"], row["account_embedding"],
                 row["account_loss"])
        first, middle, last, _ = candidate_split(model.num_layers, pp, split)
        problem = check_chunks(chunks, planner_stages(first, middle, last, pp), pp, vpp,
                               row["account_embedding"], row["account_loss"])
        if problem:
            disagreements.append(f"{label}: {problem}")
        # Checked only when the layers are built (moe_layer.py, experts.py / divide()).
        if model.is_moe:
            if model.num_experts % row["ep"]:
                disagreements.append(f"{label}: {model.num_experts} experts % EP != 0")
            if model.moe_ffn_hidden_size % row["etp"]:
                disagreements.append(f"{label}: moe_ffn_hidden_size "
                                     f"{model.moe_ffn_hidden_size} % ETP != 0")
        else:
            if row["ep"] != 1 or row["etp"] != 1:
                disagreements.append(f"{label}: dense model with EP/ETP > 1")
        if model.ffn_hidden_size % row["tp"]:
            disagreements.append(f"{label}: ffn_hidden_size % TP != 0")
        # The process groups: parallel_state must accept it with the planner's DP.
        result = fake_pg[world][tuple(row[k] for k in PARALLEL_KEYS)]
        if not result["ok"]:
            disagreements.append(f"{label}: initialize_model_parallel refuses: "
                                 f"{result['error']}")
        elif result["dp"] != row["dp"]:
            disagreements.append(f"{label}: megatron-core DP {result['dp']}, planner "
                                 f"{row['dp']}")
    fail_if(disagreements, "enumerated layouts megatron-core refuses")



def test_gated_deltanet_rules_match_transformer_config():
    """The Gated DeltaNet head and CP rules against ``TransformerConfig.__post_init__`` with
    ``experimental_attention_variant="gated_delta_net"``."""
    base = resolve_model("Qwen3.5-35B-A3B")
    names = ("tp_divides_linear_attention_heads", "cp_linear_attention")
    disagreements, verdicts = [], {True: 0, False: 0}
    tps = np.array([1, 2, 4, 8, 16, 1, 2, 4])
    cps = np.array([1, 1, 1, 1, 1, 2, 2, 4])
    for key_heads, value_heads in ((16, 32), (8, 16), (6, 12), (4, 4), (12, 48)):
        gdn = dataclasses.replace(base.linear_attention, num_key_heads=key_heads,
                                  num_value_heads=value_heads)
        model = dataclasses.replace(base, linear_attention=gdn, num_attention_heads=16,
                                    num_query_groups=16)
        broken = violations(model, cluster(64), WORKLOAD,
                            columns(len(tps), tp=tps, cp=cps))
        for i, (tp, cp) in enumerate(zip(tps.tolist(), cps.tolist())):
            planner_rules = [name for name in names if broken[name][i]]
            try:
                TransformerConfig(num_layers=4, hidden_size=2048, num_attention_heads=16,
                                  num_query_groups=16, tensor_model_parallel_size=tp,
                                  context_parallel_size=cp,
                                  experimental_attention_variant="gated_delta_net",
                                  linear_attention_freq=4, linear_conv_kernel_dim=4,
                                  linear_key_head_dim=128, linear_value_head_dim=128,
                                  linear_num_key_heads=key_heads,
                                  linear_num_value_heads=value_heads)
                error = None
            except MCORE_ERRORS as exc:
                error = str(exc) or type(exc).__name__
            verdicts[error is None] += 1
            if bool(planner_rules) != bool(error):
                disagreements.append(f"k={key_heads} v={value_heads} tp={tp} cp={cp}: planner "
                                     f"breaks {planner_rules}, megatron-core: "
                                     f"{error or 'accepts'}")
    assert not disagreements, "\n".join(disagreements)
    assert verdicts[True] and verdicts[False]


def test_moe_bias_rule_matches_transformer_config():
    """``Bias in Moe is only supported when ETP==1``: the planner refuses ETP > 1 exactly where
    megatron-core's ``TransformerConfig`` does, with the ``add_bias_linear`` each model's bridge
    sets (True for gpt-oss, Megatron-Bridge's GPTOSSProvider; False for Qwen3-MoE)."""
    disagreements, verdicts = [], {True: 0, False: 0}
    etps = np.array([1, 2, 4])
    for name in ("gpt-oss-20b", "qwen3-30b"):
        model = resolve_model(name)
        broken = violations(model, cluster(16), WORKLOAD, columns(len(etps), etp=etps))
        for i, etp in enumerate(etps.tolist()):
            try:
                TransformerConfig(num_layers=4, hidden_size=1024, num_attention_heads=16,
                                  num_moe_experts=model.num_experts, moe_router_topk=2,
                                  add_bias_linear=model.linear_bias,
                                  expert_tensor_parallel_size=etp)
                error = None
            except MCORE_ERRORS as exc:
                error = str(exc) or type(exc).__name__
            verdicts[error is None] += 1
            if bool(broken["etp_moe_bias"][i]) != bool(error):
                disagreements.append(f"{name} etp={etp}: planner breaks "
                                     f"{bool(broken['etp_moe_bias'][i])}, megatron-core: "
                                     f"{error or 'accepts'}")
    assert not disagreements, "\n".join(disagreements)
    assert verdicts[True] and verdicts[False]
