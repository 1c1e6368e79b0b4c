"""Published Megatron training measurements as planner inputs, for calibrating the step-time model.

    python benchmarks/calibration_data.py [--include-fp4] [--path CSV]

Reads ``calibration_layouts.csv`` (see ``shared/reference/README.md``; never edited here) and turns
each row the planner can model into a :class:`CalibrationCase`: the model's :class:`ModelSpec`, the
cluster, the Megatron layout, a :class:`PretrainWorkload` and the measured tokens/s per GPU.  Rows
it cannot model are counted by reason; every CSV row lands in exactly one bucket (a case, or the
first skip reason that applies, in the order of :func:`_case_from_row`).

Assumptions, all recorded per case in ``notes``:

* Recompute: the Megatron-Bridge and DGX Cloud tables do not state it; taken as ``"none"``.
* ``etp`` is blank in every row: 1 (dense rows: ``ep = etp = 1``).
* ``distributed_optimizer`` is True unless the row says ``no``.
* ``sequence_parallel`` is ``tp > 1``, except where the source ran without it: Narayanan et al. 2021
  (before sequence parallelism existed) and Korthikanti et al. 2022's full-recompute baseline rows.
* Narayanan et al. 2021 Table 1 gives neither micro batch nor interleaving: both are taken from the
  authors' reproduction script (NVIDIA/Megatron-LM ``examples/sc21/run_table_1.sh``), and its
  throughput (TFLOP/s per GPU, the paper's Eq. 3 count) is turned into tokens/s exactly by that
  same equation (see :func:`_narayanan_tokens_per_s`).
* NVFP4 rows are left out unless ``include_fp4``; the planner has no FP4 precision, so they then
  carry ``precision="fp4"`` if :data:`planner.catalog.workload.PRECISIONS` has it, else ``"fp8"``.
"""

from __future__ import annotations

import argparse
import csv
import dataclasses
import os
import re
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from planner.catalog.hardware import ClusterSpec, get_gpu
from planner.catalog.models import ModelSpec, resolve_model, spec_from_hf_config
from planner.catalog.workload import PRECISIONS, PretrainWorkload
from planner.search.layout import Layout
from planner.search.pipeline import (
    balanced_layout,
    default_split,
    layout_ranks,
    pipeline_split,
)

REFERENCE_DIR_ENV = "PLAN_PARALLEL_REFERENCE_DIR"
CSV_NAME = "calibration_layouts.csv"
REPO_ROOT = Path(__file__).resolve().parents[1]


DATA_DIR = REPO_ROOT / "benchmarks" / "data"  # the in-repo copy of the published reference data


def default_path(name: str = CSV_NAME) -> Path:
    """``$PLAN_PARALLEL_REFERENCE_DIR/<name>``, else the repository's copy
    ``benchmarks/data/<name>`` (copied unchanged from the shared reference data; see
    ``benchmarks/data/SOURCES.md``), so a clean clone runs everything."""
    env = os.environ.get(REFERENCE_DIR_ENV)
    return (Path(env).expanduser() if env else DATA_DIR) / name


DEFAULT_PATH = default_path()  # as resolved at import; load_cases() re-reads the env var


@dataclass(frozen=True)
class CalibrationCase:
    row_id: int
    source: str  # "megatron-bridge", "dgx-cloud", "narayanan2021", "korthikanti2022"
    group: str  # f"{model}|{gpu}|{num_gpus}|{precision_family}|{seq_len}": rows to rank together
    model: ModelSpec
    cluster: ClusterSpec
    layout: Layout
    workload: PretrainWorkload
    precision_family: str  # "bf16", "fp8" or "fp4"
    tokens_per_s_per_gpu: float  # measured (or derived exactly, see tokens_basis)
    confidence: str
    notes: str
    # Extras for fitting and splits (defaults keep the positional fields above as briefed).
    version: str = ""  # container / release / paper, e.g. "NeMo container 26.04"
    precision_recipe: str = ""  # "bf16", "fp16", "fp8", "fp8-cs", "fp8-blockwise", "mxfp8", "nvfp4"
    tokens_basis: str = "measured"  # "measured", "step_time", "tflops_eq3"
    reported_tflops_per_gpu: float | None = None  # the source's own FLOP count; counting varies
    reported_mfu: float | None = None  # fraction, first figure of the mfu cell


class _Skip(Exception):
    """A row the planner cannot model; ``args[0]`` is the reason (a key of the skip counts)."""


# ---------------------------------------------------------------------------------------------
# Models

# CSV names of catalog models (variant suffixes such as "(tokendrop)" are stripped first).
CATALOG_MODELS = {
    "LLAMA3_8B": "Llama-3.1-8B",
    "Llama3.1-8B": "Llama-3.1-8B",
    "LLAMA3_70B": "Llama-3.1-70B",
    "Llama3.1-70B": "Llama-3.1-70B",
    "LLAMA3.1_405B": "Llama-3.1-405B",
    "Qwen3_30B_a3B": "Qwen3-30B-A3B",
    "Qwen3_235B_a22B": "Qwen3-235B-A22B",
    "DeepSeekV3": "DeepSeek-V3",
}
LLAMA3_NOTE = ("Llama 3 modelled as Llama 3.1 (same layers, widths and 128256 vocab; only RoPE "
               "scaling/context differ)")

# gpt-oss-120b config.json (openai/gpt-oss-120b): 36 layers, hidden 2880, 64 query heads of 64,
# 8 KV heads, 128 experts top-4 with expert FFN 2880 (SwiGLU), vocab 201088, untied, qkv bias.
# Attention sinks and the alternating 128-token sliding window are ignored (full causal attention
# counted on every layer), as are the expert biases.
GPT_OSS_120B_CONFIG = {
    "model_type": "gpt_oss", "num_hidden_layers": 36, "hidden_size": 2880,
    "intermediate_size": 2880, "num_attention_heads": 64, "num_key_value_heads": 8,
    "head_dim": 64, "num_local_experts": 128, "num_experts_per_tok": 4, "vocab_size": 201088,
    "tie_word_embeddings": False, "attention_bias": True, "hidden_act": "silu",
}
# Kimi K2 config.json (moonshotai/Kimi-K2-*, model_type kimi_k2; DeepseekV3 architecture):
# 61 layers, hidden 7168, 64 heads, MLA as DeepSeek-V3 (q_lora 1536, kv_lora 512, qk 128+64,
# v 128), 384 routed experts top-8 of width 2048 + 1 shared, first layer dense (18432), vocab
# 163840, untied, sigmoid noaux_tc router, no MTP layers.
KIMI_K2_CONFIG = {
    "model_type": "kimi_k2", "num_hidden_layers": 61, "hidden_size": 7168,
    "intermediate_size": 18432, "moe_intermediate_size": 2048, "num_attention_heads": 64,
    "num_key_value_heads": 64, "q_lora_rank": 1536, "kv_lora_rank": 512,
    "qk_nope_head_dim": 128, "qk_rope_head_dim": 64, "v_head_dim": 128, "n_routed_experts": 384,
    "n_shared_experts": 1, "num_experts_per_tok": 8, "first_k_dense_replace": 1,
    "topk_method": "noaux_tc", "num_nextn_predict_layers": 0, "vocab_size": 163840,
    "tie_word_embeddings": False, "hidden_act": "silu",
}
HF_CONFIG_MODELS = {
    "GPT OSS 120B": ("GPT-OSS-120B", GPT_OSS_120B_CONFIG,
                     "gpt-oss: attention sinks and alternating sliding window (128) ignored; "
                     "full causal attention counted on all layers"),
    "Kimi_K2": ("Kimi-K2", KIMI_K2_CONFIG, ""),
}

# Megatron-LM paper GPTs whose dims the CSV name does not carry: (layers, hidden, heads).
# Narayanan et al. 2021 Table 2 (174.6B, 529.6B) and Korthikanti et al. 2022 Table 3 (530B).
PAPER_GPT_DIMS = {
    "GPT-174.6B": (96, 12288, 96),
    "GPT-529.6B": (105, 20480, 128),
    "GPT-530B (MT-NLG)": (105, 20480, 128),
}
GPT_DIMS_IN_NAME = re.compile(r"heads (\d+), hidden (\d+), layers (\d+)")
PAPER_GPT_VOCAB = 51200  # GPT-2 BPE padded to 51200, as both papers state

NOT_MODELLED = (
    (re.compile(r"^Nemotron_3"), "architecture not modelled: Nemotron 3 (hybrid Mamba-MoE)"),
    (re.compile(r"^DeepSeekV4"), "architecture not modelled: DeepSeek-V4 Flash"),
)
# Hybrid Mamba rows the fit leaves out (NOT_MODELLED) and benchmarks/nemotron_holdout.py scores
# as a held-out check with the layer kinds wired: CSV name -> catalog entry.
HELD_OUT_MODELS = {"Nemotron_3_Nano": "NVIDIA-Nemotron-3-Nano-30B-A3B",
                   "Nemotron_3_Super": "NVIDIA-Nemotron-3-Super-120B-A12B"}
VARIANT = re.compile(r"^(.*?)\s*\((tokendrop|dropless|w/o MTP|w/ MTP)\)$")


def _paper_gpt(name: str, layers: int, hidden: int, heads: int, source: str) -> ModelSpec:
    # GPT-2/3 style as in the Megatron-LM papers: MHA (KV heads = heads, head_dim h/a), a plain
    # GeLU MLP of width 4h (not gated), 51200 vocab with tied input/output embeddings, biases on
    # the linear layers (only the QKV bias is counted).  LayerNorm (vs RMSNorm), the learned
    # position embedding (2048 x h) and the non-QKV biases are ignored: < 0.1 % of parameters.
    return dataclasses.replace(
        resolve_model("llama3.1-8b"), name=name, model_type="gpt", num_layers=layers,
        hidden_size=hidden, num_attention_heads=heads, num_query_groups=heads,
        head_dim=hidden // heads, ffn_hidden_size=4 * hidden, gated_mlp=False,
        vocab_size=PAPER_GPT_VOCAB, tied_embeddings=True, qkv_bias=True, qk_norm=False,
        source=source)


def model_for(csv_name: str, held_out: bool = False) -> tuple[ModelSpec, str]:
    """The ModelSpec for a CSV model name, and a note (variant, assumptions); raises _Skip.
    ``held_out``: only the :data:`HELD_OUT_MODELS` rows, which the fit skips."""
    name = csv_name.strip()
    if held_out:
        if name not in HELD_OUT_MODELS:
            raise _Skip("not a held-out row")
        return resolve_model(HELD_OUT_MODELS[name]), "held out of the fit"
    for pattern, reason in NOT_MODELLED:
        if pattern.search(name):
            raise _Skip(reason)
    notes = []
    base, variant = name, ""
    match = VARIANT.match(name)
    if match:
        base, variant = match.group(1), match.group(2)
        notes.append(f"variant '{variant}' (same architecture)")
    if base in CATALOG_MODELS:
        spec = resolve_model(CATALOG_MODELS[base])
        if base.startswith("LLAMA3_"):
            notes.append(LLAMA3_NOTE)
        if spec.name == "DeepSeek-V3":
            if variant == "w/o MTP":
                spec = dataclasses.replace(spec, mtp_layers=0)
            notes.append(f"DeepSeek-V3 mtp_layers={spec.mtp_layers} (the source's TFLOP/s count "
                         f"implies MTP was trained unless 'w/o MTP')")
        return spec, "; ".join(notes)
    if base in HF_CONFIG_MODELS:
        spec_name, config, note = HF_CONFIG_MODELS[base]
        spec = spec_from_hf_config(config, spec_name, source="benchmarks/calibration_data.py")
        return spec, "; ".join(notes + ([note] if note else []))
    if base.startswith("GPT-"):
        dims = GPT_DIMS_IN_NAME.search(base)
        if dims:
            heads, hidden, layers = map(int, dims.groups())
        elif base in PAPER_GPT_DIMS:
            layers, hidden, heads = PAPER_GPT_DIMS[base]
        else:
            raise _Skip("architecture not known")
        short = re.match(r"GPT-[\d.]+[BT]", base)
        spec = _paper_gpt(short.group(0) if short else base, layers, hidden, heads,
                          source="Megatron-LM papers (Narayanan 2021 / Korthikanti 2022)")
        return spec, "; ".join(notes)
    raise _Skip("architecture not known")


# ---------------------------------------------------------------------------------------------
# Rows

# Narayanan et al. 2021 Table 1 as the authors ran it (NVIDIA/Megatron-LM examples/sc21/
# run_table_1.sh): (layers, hidden) -> (tp, pp, micro batch, global batch, vpp).  VPP from
# --num-layers-per-virtual-pipeline-stage: 76B 15/5, 145B 10/5, 310B 6/3, 530B 3/1 layers.
NARAYANAN_TABLE1_RUNS = {
    (24, 2304): (1, 1, 16, 512, 1),
    (30, 3072): (2, 1, 16, 512, 1),
    (36, 4096): (4, 1, 16, 512, 1),
    (40, 6144): (8, 1, 8, 1024, 1),
    (48, 8192): (8, 2, 4, 1536, 1),
    (60, 10240): (8, 4, 2, 1792, 3),
    (80, 12288): (8, 8, 2, 2304, 2),
    (96, 16384): (8, 16, 1, 2160, 2),
    (105, 20480): (8, 35, 1, 2520, 3),
    (128, 25600): (8, 64, 1, 3072, 1),
}

GPUS = {"H100": "H100-80GB", "A100-80GB": "A100-80GB", "B200": "B200", "B300": "B300",
        "GB200": "GB200", "GB300": "GB300"}
NVL72_GPUS = ("GB200", "GB300")  # 4 GPUs per compute tray; NVLink domain of 72 from GpuSpec


def _source_key(source: str) -> str:
    if source.startswith("Megatron-Bridge"):
        return "megatron-bridge"
    if source.startswith("NVIDIA DGX Cloud"):
        return "dgx-cloud"
    if "Narayanan 2021" in source:
        return "narayanan2021"
    if "Korthikanti 2022" in source:
        return "korthikanti2022"
    return re.sub(r"[^a-z0-9]+", "-", source.lower()).strip("-")[:40]


def _precision(raw: str) -> tuple[str, str, str]:
    """(family, recipe, workload precision) for a CSV precision cell."""
    text = raw.strip().upper()
    if text.startswith("NVFP4"):
        return "fp4", "nvfp4", "fp4" if "fp4" in PRECISIONS else "fp8"
    if text.startswith("MXFP8"):
        return "fp8", "mxfp8", "fp8"
    if text.startswith("FP8-CS"):
        return "fp8", "fp8-cs", "fp8"
    if text.startswith("FP8-BLOCKWISE"):
        return "fp8", "fp8-blockwise", "fp8"
    if text.startswith("FP8"):
        return "fp8", "fp8", "fp8"
    if text.startswith("BF16") or text.startswith("FP16/BF16") or text == "MIXED":
        return "bf16", "bf16", "bf16"
    if text.startswith("FP16"):
        return "bf16", "fp16", "fp16"
    raise _Skip("precision not known")


def _int(value: str, default: int | None = None) -> int | None:
    match = re.match(r"\s*(\d+)", value or "")
    return int(match.group(1)) if match else default


def _float(value: str) -> float | None:
    match = re.match(r"\s*([\d.]+)", value or "")
    return float(match.group(1)) if match else None


def _narayanan_tokens_per_s(tflops_per_gpu: float, model: ModelSpec, seq_len: int) -> float:
    """Narayanan et al. 2021 Eq. 3 counts F = 96 B s l h^2 (1 + s/(6h) + V/(16 l h)) FLOPs per
    iteration (with full recompute) for B sequences of s tokens, so tokens/s per GPU =
    TFLOP/s per GPU / (F / (B s)).  Exact up to the table's three significant figures."""
    layers, h, vocab = model.num_layers, model.hidden_size, model.vocab_size
    flops_per_token = 96 * layers * h * h * (1 + seq_len / (6 * h) + vocab / (16 * layers * h))
    return tflops_per_gpu * 1e12 / flops_per_token


def _check_layout(model: ModelSpec, num_gpus: int, layout: Layout, global_batch: int) -> list[str]:
    """Raises _Skip for a layout megatron-core would reject; returns soft warnings.  The layout
    carries its pipeline split (see :func:`_with_split`)."""
    tp, pp, cp, dp = layout.tp, layout.pp, layout.cp, layout.dp
    if tp * pp * cp * dp != num_gpus:
        raise _Skip("invalid layout: tp*pp*cp*dp != num_gpus")
    if model.num_attention_heads % tp:
        raise _Skip("invalid layout: tp does not divide attention heads")
    if model.num_query_groups % tp and tp % model.num_query_groups:
        raise _Skip("invalid layout: tp vs KV heads")
    first, middle, last, valid = pipeline_split(
        model.num_layers, np.array([pp]), [layout.first_stage_layers], [layout.last_stage_layers],
        [layout.account_embedding], [layout.account_loss])
    if layout.pipeline_layout:
        layout_ranks(layout.pipeline_layout, pp, model.num_layers)  # raises when it is wrong
        return []
    if not bool(valid[0]):
        raise _Skip("invalid layout: pipeline split")
    if layout.vpp > 1 and pp < 2:
        raise _Skip("invalid layout: vpp needs pp > 1")
    if model.is_moe:
        if model.num_experts % layout.ep:
            raise _Skip("invalid layout: ep does not divide experts")
        if (tp * cp * dp) % (layout.ep * layout.etp):
            raise _Skip("invalid layout: ep*etp does not divide tp*cp*dp")
    if global_batch % (layout.micro_batch * dp):
        raise _Skip("invalid layout: gbs not a multiple of mbs*dp")
    warnings = []
    stages = {int(first[0]) + layout.account_embedding, int(middle[0]),
              int(last[0]) + layout.account_loss}
    if pp <= 2:
        stages.discard(int(middle[0]))
    if layout.vpp > 1 and any(n % layout.vpp for n in stages):
        warnings.append(f"vpp {layout.vpp} does not divide stage layers {sorted(stages)} of the "
                        f"automatic split (source presumably used a custom pipeline layout)")
    return warnings


def _case_from_row(row: dict[str, str], include_fp4: bool,
                   held_out: bool = False) -> CalibrationCase:
    """One CSV row as a case; raises _Skip(reason).  Reasons are checked in this order."""
    notes: list[str] = []
    source = _source_key(row["source"])
    workload_kind = row["workload"].strip()
    if workload_kind == "lora":
        raise _Skip("workload lora (frozen base weights, not a pretrain step)")
    if workload_kind == "sft":
        raise _Skip("workload sft (fine-tuning recipe, not a pretrain step)")
    if workload_kind != "pretrain":
        raise _Skip(f"workload {workload_kind or '?'}")
    model, model_note = model_for(row["model"], held_out)
    if model_note:
        notes.append(model_note)
    family, recipe, precision = _precision(row["precision"])
    if family == "fp4" and not include_fp4:
        raise _Skip("precision NVFP4 (include_fp4=False)")
    if family == "fp4":
        notes.append(f"NVFP4 run; workload precision '{precision}' (planner has no FP4 peak)")
    if row["precision"].strip().upper() not in ("BF16", "FP8", "MXFP8", "NVFP4"):
        notes.append(f"precision cell '{row['precision'].strip()}'")

    fsdp = _int(row["fsdp"], 0)
    dist_opt = row["dist_optimizer"].strip()
    if fsdp or dist_opt.startswith("Megatron-FSDP"):
        raise _Skip("Megatron-FSDP (fsdp set)")
    if dist_opt.startswith("ZeRO-3") or "DeepSpeed" in row["framework"]:
        raise _Skip("DeepSpeed ZeRO-3 (not a Megatron layout)")
    if not row["tp"].strip() or not row["pp"].strip():
        raise _Skip("tp/pp split not published (only the model-parallel size)")
    if "CONSISTENCY-FLAG" in row["notes"]:
        raise _Skip("CONSISTENCY-FLAG in source (table does not add up)")

    num_gpus = int(row["num_gpus"])
    seq_len = int(row["seq_len"])
    tp, pp = int(row["tp"]), int(row["pp"])
    vpp, cp = _int(row["vpp"], 1), _int(row["cp"], 1)
    mbs, gbs = _int(row["mbs"]), _int(row["gbs"])
    if source == "narayanan2021" and model.model_type == "gpt":
        run = NARAYANAN_TABLE1_RUNS.get((model.num_layers, model.hidden_size))
        if run is not None and mbs is None:
            run_tp, run_pp, run_mbs, run_gbs, run_vpp = run
            if (run_tp, run_pp, run_gbs) != (tp, pp, gbs):
                notes.append(f"sc21 script has tp{run_tp} pp{run_pp} gbs{run_gbs}, row differs")
            mbs, vpp = run_mbs, run_vpp
            notes.append(f"mbs {mbs} and vpp {vpp} from Megatron-LM examples/sc21/run_table_1.sh")
    if mbs is None or gbs is None:
        raise _Skip("micro/global batch not published")
    if row["vpp"].strip() and not row["vpp"].strip().isdigit():
        notes.append(f"vpp cell '{row['vpp'].strip()}'")

    dp = _int(row["dp"])
    if dp is None:
        if num_gpus % (tp * pp * cp):
            raise _Skip("invalid layout: tp*pp*cp*dp != num_gpus")
        dp = num_gpus // (tp * pp * cp)
    ep, etp = (_int(row["ep"], 1), _int(row["etp"], 1)) if model.is_moe else (1, 1)
    if not model.is_moe and (_int(row["ep"], 1) > 1 or _int(row["etp"], 1) > 1):
        raise _Skip("invalid layout: ep/etp on a dense model")

    recompute_text = row["recompute"].lower()
    if "full" in recompute_text:
        recompute = "full"
    elif "selective" in recompute_text:
        recompute = "selective"
    else:
        recompute = "none"
        notes.append("recompute not stated; assumed none")
    sequence_parallel = tp > 1
    if source == "narayanan2021" or (source == "korthikanti2022" and "baseline" in recompute_text):
        sequence_parallel = False  # 2021: before SP existed; 2022 baseline: full recompute, no SP
    distributed_optimizer = re.match(r"no\b", dist_opt.lower()) is None  # not "not stated"

    # The sources do not state the split: the first one megatron-core accepts (NVIDIA's recipes
    # count the embedding and loss as layers where that makes PP and VPP divide).
    first, last, embedding, loss = default_split(model.num_layers, pp, vpp)
    layout_string = ""
    if pp > 1 and not (first or last or embedding or loss) and model.num_layers % (pp * vpp):
        layout_string = balanced_layout(model.num_layers, pp, vpp)  # custom layout recipes
        notes.append(f"pipeline layout {layout_string!r} (the source's split is not published)")
    layout = Layout(tp=tp, pp=pp, vpp=vpp, cp=cp, ep=ep, etp=etp, dp=dp, micro_batch=mbs,
                    recompute=recompute, sequence_parallel=sequence_parallel,
                    distributed_optimizer=distributed_optimizer, first_stage_layers=first,
                    last_stage_layers=last, account_embedding=embedding, account_loss=loss,
                    pipeline_layout=layout_string)
    notes.extend(_check_layout(model, num_gpus, layout, gbs))

    tokens = _float(row["tokens_per_s_per_gpu"])
    step_time = _float(row["step_time_s"])
    tflops = _float(row["tflops_per_gpu"])
    basis = "measured"
    if tokens is None and step_time:
        tokens = gbs * seq_len / (step_time * num_gpus)
        basis = "step_time"
        notes.append("tokens/s derived as gbs*seq_len/(step_time_s*num_gpus)")
    elif tokens is None and tflops and source == "narayanan2021":
        tokens = _narayanan_tokens_per_s(tflops, model, seq_len)
        basis = "tflops_eq3"
        notes.append("tokens/s derived from TFLOP/s per GPU by Narayanan 2021 Eq. 3")
    if not tokens or tokens <= 0:
        raise _Skip("no throughput (tokens/s, step time or exact TFLOP/s conversion)")
    if model.name == "Kimi-K2" and "Muon" in row["notes"]:
        notes.append("trained with the Muon optimizer (planner assumes Adam)")
    if "MoE token-drop benchmark" in row["notes"]:
        notes.append("MoE token-drop benchmark")
    if "force-balanced routing" in row["notes"]:
        notes.append("force-balanced MoE routing (per source)")

    gpu = get_gpu(GPUS.get(row["gpu"].strip(), row["gpu"].strip()))
    per_node = 4 if gpu.name in NVL72_GPUS else 8
    cluster = ClusterSpec(gpu, num_gpus, min(per_node, num_gpus))
    workload = PretrainWorkload(seq_len=seq_len, global_batch=gbs, precision=precision)
    mfu = _float(row["mfu"])
    return CalibrationCase(
        row_id=int(row["row_id"]), source=source,
        group=f"{model.name}|{gpu.name}|{num_gpus}|{family}|{seq_len}",
        model=model, cluster=cluster, layout=layout, workload=workload,
        precision_family=family, tokens_per_s_per_gpu=float(tokens),
        confidence=row["confidence"].strip(), notes="; ".join(notes),
        version=row["version"].strip(), precision_recipe=recipe, tokens_basis=basis,
        reported_tflops_per_gpu=tflops, reported_mfu=None if mfu is None else mfu / 100)


def load_cases(path: str | Path | None = None, include_fp4: bool = False,
               held_out: bool = False) -> tuple[list[CalibrationCase], dict[str, int]]:
    """Cases the planner can model, and {reason: count} for the rows it skips (``held_out``:
    the :data:`HELD_OUT_MODELS` rows alone).

    ``path`` defaults to :func:`default_path` (``$PLAN_PARALLEL_REFERENCE_DIR`` honoured at call
    time).  ``len(cases) + sum(skipped.values())`` is the CSV's row count."""
    path = Path(path) if path is not None else default_path()
    cases: list[CalibrationCase] = []
    skipped: Counter[str] = Counter()
    with open(path, newline="", encoding="utf-8") as handle:
        for row in csv.DictReader(handle):
            try:
                cases.append(_case_from_row(row, include_fp4, held_out))
            except _Skip as skip:
                skipped[skip.args[0]] += 1
    return cases, dict(skipped)


def summary(cases: list[CalibrationCase], skipped: dict[str, int]) -> str:
    lines = [f"{len(cases)} cases, {sum(skipped.values())} rows skipped"]
    by_gpu = Counter((c.cluster.gpu.name, c.precision_family) for c in cases)
    lines.append("cases per (gpu, precision family):")
    lines += [f"  {gpu:10} {fam:5} {n:4}" for (gpu, fam), n in sorted(by_gpu.items())]
    lines.append("cases per source:")
    lines += [f"  {src:16} {n:4}" for src, n in Counter(c.source for c in cases).most_common()]
    lines.append("cases per model:")
    lines += [f"  {m:16} {n:4}" for m, n in Counter(c.model.name for c in cases).most_common()]
    groups = Counter(c.group for c in cases)
    lines.append(f"groups: {len(groups)} ({sum(1 for n in groups.values() if n > 1)} with >1 row)")
    lines.append("skipped rows by reason:")
    lines += [f"  {n:4}  {reason}" for reason, n in sorted(skipped.items(), key=lambda x: -x[1])]
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--path", default=None, help=f"CSV (default {default_path()})")
    parser.add_argument("--include-fp4", action="store_true")
    args = parser.parse_args()
    print(summary(*load_cases(args.path, include_fp4=args.include_fp4)))


if __name__ == "__main__":
    main()
