"""One row per supported family: parameters against transformers, FLOPs against verl, the rollout
cache of one 8K sequence, and the planner's best layout on 64 x H200 at 1K + 7K tokens.

    python benchmarks/architectures.py [--no-plan] [--json]

* params: the catalog entry's total next to transformers' count of the model built from the
  same config.json on the meta device (``torch.device("meta")``; needs torch + transformers);
* FLOPs: forward + backward of one 8,192-token sequence in verl ``FlopsCounter``'s convention
  (:func:`planner.cost.flops.verl_training_flops_per_sequence`) next to
  ``verl.utils.flops_counter.ESTIMATE_FUNC[model_type]`` (needs verl; "MFU 0" where verl has no
  function for the model type);
* KV/seq: what vLLM keeps for one 8,192-token sequence on one rank without TP, bf16, prefix
  caching on (:func:`planner.cost.layer_kinds.kv_cache_bytes_per_sequence`), and what it would
  be were every layer full attention (what the planner charged before the layer kinds were
  wired);
* best: ``plan-parallel --model M --gpus 64 --gpu-type h200 --prompt-length 1024
  --response-length 7168`` (the first candidate; ``--no-plan`` skips it, minutes in all).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import types
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import numpy as np  # noqa: E402

from planner.catalog.layers import MixerKind  # noqa: E402
from planner.catalog.models import builtin_config_dict, builtin_model  # noqa: E402
from planner.catalog.support import family_of  # noqa: E402
from planner.cost.flops import verl_training_flops_per_sequence  # noqa: E402
from planner.cost.layer_kinds import (  # noqa: E402
    kv_bytes_per_token_layer,
    kv_cache_bytes_per_sequence,
)

# A catalog entry per family (the families without one are listed after the table).
MODELS = ("Llama-3.1-8B", "Qwen2.5-7B", "Qwen3-8B", "Qwen3-30B-A3B", "Qwen3-Next-80B-A3B",
          "Qwen3.5-35B-A3B", "Qwen3-VL-30B-A3B", "DeepSeek-V3", "Kimi-K2", "GLM-4.5-Air",
          "gpt-oss-20b", "gpt-oss-120b", "NVIDIA-Nemotron-3-Nano-30B-A3B",
          "NVIDIA-Nemotron-3-Super-120B-A12B", "MiMo-7B", "Mixtral-8x7B",
          "Llama-4-Scout-17B-16E")
SEQ = 8192
# Remote-code model types transformers does not know: the same module tree under its own type.
TRANSFORMERS_TYPE = {"kimi_k2": "deepseek_v3", "mimo": "qwen2"}
PLAN_ARGS = ("--gpus", "64", "--gpu-type", "h200", "--prompt-length", "1024",
             "--response-length", "7168")


def _config(name: str) -> dict:
    return {k: v for k, v in builtin_config_dict(name).items() if not k.startswith("_")}


def transformers_params(name: str) -> int | None:
    """transformers' meta-device parameter count of the catalog config (+ the router correction
    biases transformers keeps as buffers); None without torch/transformers."""
    try:
        import torch
        import transformers
    except ImportError:
        return None
    raw = _config(name)
    raw["model_type"] = TRANSFORMERS_TYPE.get(raw["model_type"], raw["model_type"])
    text = raw.get("text_config", {})
    if "attn_temperature_tuning" in text:
        text["attn_temperature_tuning"] = bool(text["attn_temperature_tuning"])
    try:
        config = transformers.AutoConfig.for_model(**raw)
    except (KeyError, ValueError):
        return None
    auto = (transformers.AutoModelForImageTextToText if hasattr(config, "vision_config")
            else transformers.AutoModelForCausalLM)
    with torch.device("meta"):
        model = auto.from_config(config)
    return (sum(p.numel() for p in model.parameters())
            + sum(b.numel() for n, b in model.named_buffers() if "e_score_correction_bias" in n))


def verl_flops(name: str) -> float | None:
    """verl's FlopsCounter FLOPs of one SEQ-token sequence; None where verl has no function."""
    try:
        from verl.utils import flops_counter
    except ImportError:
        return None
    raw = _config(name)
    estimate = flops_counter.ESTIMATE_FUNC.get(raw["model_type"])
    if estimate is None:
        return None

    def namespace(d):
        return types.SimpleNamespace(**{k: namespace(v) if isinstance(v, dict) else v
                                        for k, v in d.items()})

    return estimate(namespace(raw), SEQ, [SEQ], 1.0) * 1e12


def best_layout(name: str) -> dict:
    out = subprocess.run([sys.executable, "-m", "planner", "--model", name, *PLAN_ARGS,
                          "--format", "json", "--top", "1"], capture_output=True, text=True,
                         cwd=ROOT, check=False)
    if out.returncode not in (0, 1):
        return {"error": (out.stderr.strip().splitlines() or ["?"])[-1]}
    data = json.loads(out.stdout)
    if not data["candidates"]:
        return {"error": "no layout fits"}
    c = data["candidates"][0]
    lay = c["layout"]
    text = (f"TP{lay['tp']} PP{lay['pp']} CP{lay['cp']} EP{lay['ep']} DP{lay['dp']} "
            f"{lay['recompute']}; rollout TP{lay['rollout_tp']}/DP{lay['rollout_dp']}/"
            f"EP{lay['rollout_ep']}")
    return {"layout": text, "step_s": c["step_time_s"], "peak_gib": c["peak_memory_gib"],
            "concurrent_seqs": c["rollout"].get("concurrent_seqs")}


def row(name: str, plan: bool) -> dict:
    model = builtin_model(name)
    # what the planner charged before the layer kinds were wired: every layer full attention
    every_layer = model.num_layers * float(kv_bytes_per_token_layer(
        model, MixerKind.MLA if model.is_mla else MixerKind.FULL)) * SEQ
    family = family_of(model.architecture, model.model_type)
    ours_flops = float(np.sum(verl_training_flops_per_sequence(model, [SEQ])))
    theirs = verl_flops(name)
    out = {"model": name, "family": family.name if family else "?",
           "layers": model.layer_summary, "params": model.params.total,
           "transformers_params": transformers_params(name),
           "train_tflops_per_seq": ours_flops / 1e12,
           "verl_tflops_per_seq": None if theirs is None else theirs / 1e12,
           "kv_mib_per_seq": float(kv_cache_bytes_per_sequence(model, SEQ)) / 2**20,
           "kv_mib_if_full_attention": every_layer / 2**20}
    if plan:
        out["best"] = best_layout(name)
    return out


def _fmt_params(ours: int, theirs: int | None) -> str:
    if theirs is None:
        return f"{ours / 1e9:.2f}B (transformers: n/a)"
    return f"{ours / 1e9:.2f}B ({'=' if ours == theirs else f'{theirs / 1e9:.2f}B'})"


def table(rows: list[dict]) -> str:
    lines = ["| model | layers | params (= transformers) | train TFLOPs/8K seq (verl) | "
             "KV MiB/8K seq (all-full) | best on 64 x H200, 1K+7K |",
             "|---|---|---|---|---|---|"]
    for r in rows:
        verl = ("MFU 0" if r["verl_tflops_per_seq"] is None else
                "=" if np.isclose(r["verl_tflops_per_seq"], r["train_tflops_per_seq"],
                                  rtol=1e-9) else f"{r['verl_tflops_per_seq']:.1f}")
        best = r.get("best")
        best_text = ("-" if best is None else best.get("error") or
                     f"{best['layout']}: {best['step_s']:.0f} s, {best['peak_gib']:.0f} GiB")
        lines.append(f"| {r['model']} | {r['layers']} | "
                     f"{_fmt_params(r['params'], r['transformers_params'])} | "
                     f"{r['train_tflops_per_seq']:.1f} ({verl}) | "
                     f"{r['kv_mib_per_seq']:.0f} ({r['kv_mib_if_full_attention']:.0f}) | "
                     f"{best_text} |")
    return "\n".join(lines)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--no-plan", action="store_true", help="skip the 64 x H200 plans")
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--models", default=",".join(MODELS))
    args = parser.parse_args(argv)
    rows = [row(name, not args.no_plan) for name in args.models.split(",")]
    print(json.dumps(rows, indent=2) if args.json else table(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
