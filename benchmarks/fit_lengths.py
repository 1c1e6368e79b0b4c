"""Fit the default response lengths to the published RL runs, by kind of job.

    python benchmarks/fit_lengths.py [--write planner/catalog/response_lengths.json]

Reads every ``rl_step`` row of ``grpo_runs.csv`` (``benchmarks/data``, or
``$PLAN_PARALLEL_REFERENCE_DIR``) that publishes a mean length, turns it into a mean and a
maximum *response* length the way ``benchmarks/rl_data.py`` does, and sorts the rows into kinds
of job with the planner's own rule (:func:`planner.catalog.lengths.job_kind`: models that think
before answering, ``math-reasoning``, and the rest, ``math``; every published run is math RL):

* NeMo RL tables (v0.4, v0.5): ``mean_len_reported`` is the mean *sequence* (prompt + response)
  and ``max_total_len`` the longest one: both less the prompt (``ASSUMED_PROMPT_TOKENS``);
* NeMo RL blog (v0.3) and its rerun: generated tokens per sample; the maximum is
  ``max_total_len`` less the prompt;
* verl sweeps: no mean published; recovered from the actor MFU verl reports
  (:func:`rl_data._derived_mean_sequence`, its ``FlopsCounter`` inverted) less the prompt; the
  maximum is ``max_response_len``.

For each kind two scales are tried, the mean as a fraction of the maximum and the mean in
tokens, and the one whose log spread over the kind's runs is smaller is kept: a model that
thinks stops near the cap whatever it is; one that answers directly stops when its answer is
done, whatever the cap.  A published mean is already cut at its run's maximum, and the planner
cuts a default in tokens at the plan's maximum (:func:`planner.catalog.lengths.default_lengths`,
exponential lengths), so the tokens scale fits each run's *uncut* mean
(:func:`planner.catalog.lengths.uncut_mean_tokens`, m = mu (1 - exp(-max / mu)) solved for mu),
not the cut one: else the cut would be applied twice.  A run whose mean is at its maximum
(saturated: no finite uncut mean) is left out of the tokens scale and counted
(``saturated``); the fraction of the maximum is used as published.  The stored default is a
band from the kind's 10th to its 90th percentile (the start and end of a linear trajectory,
:mod:`planner.catalog.lengths`).
Prints each kind's fit and its source rows.
"""

from __future__ import annotations

import argparse
import csv
import json
import re
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))

from calibration_data import default_path  # noqa: E402
from rl_data import (  # noqa: E402
    ASSUMED_PROMPT_TOKENS,
    CSV_NAME,
    MODELS,
    VERL_PROMISED_FLOPS,
    _derived_mean_sequence,
    _float,
    _int,
)

from planner.catalog.hardware import get_gpu  # noqa: E402
from planner.catalog.lengths import (  # noqa: E402
    DIRECT_KIND,
    REASONING_KIND,
    job_kind,
    uncut_mean_tokens,
)
from planner.catalog.models import resolve_model  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
OUTPUT = REPO / "planner" / "catalog" / "response_lengths.json"
SOURCE = "benchmarks/fit_lengths.py on shared/reference/grpo_runs.csv"
DESCRIBE = {REASONING_KIND: "math RL of models that think before answering",
            DIRECT_KIND: "math RL of instruct and base models"}  # "published ..., N runs"
BAND = (10, 90)  # percentiles: the trajectory's start and end


def published_lengths(path: Path | None = None) -> list[dict]:
    """``{row_id, model, kind, mean, max, how}`` of every RL step row with a mean length."""
    out = []
    with open(path or default_path(CSV_NAME), newline="") as handle:
        for row in csv.DictReader(handle):
            if row["category"] != "rl_step":
                continue
            reported = re.match(r"\s*(\d+)", row["mean_len_reported"])
            version = row["framework_version"]
            if row["framework"].startswith("verl"):
                mfu, update = _float(row["mfu"]), _float(row["update_time_s"])
                gpu = "H100-80GB" if row["gpu_type"].strip() == "H100" else ""
                if mfu is None or update is None or gpu not in VERL_PROMISED_FLOPS \
                        or row["model"] not in MODELS:
                    continue
                model = resolve_model(MODELS[row["model"]])
                sequence = _derived_mean_sequence(model, get_gpu(gpu).name,
                                                  _int(row["gpu_count"]),
                                                  _int(row["train_batch_prompts"])
                                                  * _int(row["n_per_prompt"]), mfu, update)
                maximum = _int(row["max_response_len"])
                mean = sequence - ASSUMED_PROMPT_TOKENS
                how = f"verl MFU {mfu} inverted"
            elif reported:
                maximum = _int(row["max_total_len"]) - ASSUMED_PROMPT_TOKENS
                generated = "generated" in row["mean_len_reported"]
                mean = int(reported.group(1)) - (0 if generated else ASSUMED_PROMPT_TOKENS)
                how = "generated tokens" if generated else "sequence less the prompt"
            else:
                continue
            out.append({"row_id": int(row["row_id"]), "model": row["model"],
                        "framework": f"{row['framework'].split(' (')[0]} {version}".strip(),
                        "kind": job_kind(row["model"]), "mean": float(min(mean, maximum)),
                        "max": int(maximum), "how": how})
    return out


def fit_kind(rows: list[dict]) -> dict:
    fractions = np.array([row["mean"] / row["max"] for row in rows])
    uncut = [uncut_mean_tokens(row["mean"], row["max"]) for row in rows]
    tokens = np.array([value for value in uncut if value is not None])
    saturated = len(rows) - len(tokens)
    spread = {"fraction_of_max": float(np.std(np.log(fractions))),
              "tokens": float(np.std(np.log(tokens)))}
    scale = min(spread, key=spread.get)
    values = fractions if scale == "fraction_of_max" else tokens
    digits = 3 if scale == "fraction_of_max" else 0
    start, end = (round(float(np.percentile(values, q)), digits) for q in BAND)
    return {"scale": scale, "start": start, "end": end,
            "median": round(float(np.median(values)), digits), "runs": len(values),
            "saturated": saturated,
            "log_spread": {name: round(value, 3) for name, value in spread.items()},
            "rows": sorted(row["row_id"] for row in rows),
            "models": sorted({row["model"] for row in rows})}


def fit(rows: list[dict]) -> dict:
    kinds = {}
    for kind in (REASONING_KIND, DIRECT_KIND):
        members = [row for row in rows if row["kind"] == kind]
        kinds[kind] = {"describe": DESCRIBE[kind], **fit_kind(members)}
    return {"source": SOURCE, "source_short": "grpo_runs.csv",
            "band": f"start = {BAND[0]}th, end = {BAND[1]}th percentile of the kind's runs",
            "shape": "linear in steps (DeepSeek-R1-Zero, Guo et al. 2025, Nature 645, Fig. 1b)",
            "kinds": kinds}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--write", type=Path, default=None,
                        help=f"write the defaults (the planner's file is "
                             f"{OUTPUT.relative_to(REPO)})")
    args = parser.parse_args()
    rows = published_lengths()
    fitted = fit(rows)
    for kind, entry in fitted["kinds"].items():
        unit = "of max" if entry["scale"] == "fraction_of_max" else "tokens uncut"
        print(f"{kind}: {entry['describe']}: {entry['runs']} runs, mean response "
              f"{entry['start']}->{entry['end']} {unit} (p{BAND[0]}->p{BAND[1]}; median "
              f"{entry['median']}); log spread {entry['log_spread']} -> scale {entry['scale']}; "
              f"{entry['saturated']} saturated (mean at the maximum) left out of tokens")
        for row in sorted((r for r in rows if r["kind"] == kind), key=lambda r: r["row_id"]):
            print(f"  row {row['row_id']:>3} {row['framework'][:22]:22} {row['model'][:24]:24} "
                  f"mean {row['mean']:6.0f} / max {row['max']:6d} = {row['mean'] / row['max']:.3f}"
                  f", uncut {uncut_mean_tokens(row['mean'], row['max']) or float('inf'):6.0f}"
                  f"  ({row['how']})")
    if args.write:
        args.write.write_text(json.dumps(fitted, indent=2) + "\n")
        print(f"wrote {args.write}")


if __name__ == "__main__":
    main()
