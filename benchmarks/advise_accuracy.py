"""How well one run predicts the job's other layouts, and how often the default length band
holds the published steps.

    python benchmarks/advise_accuracy.py [--loo] [--band] [--mape]   (all by default)

``--loo`` -- leave one layout out on the verl sweeps of ``grpo_runs.csv``: for every job run
with several layouts, fit this cluster's constants from one layout's published step
(:func:`trials.calibration_fit.calibrate_run`, what ``advise`` does with a run) and predict the step
time of the job's other layouts; MAPE over every (source, target) pair.  A *job* is one sweep
(source file), on one GPU count, with one set of kernel switches (the sweep's ``other=`` column:
``apply_rope_fusion``, fused kernels -- settings a job keeps while its layout changes; a looser
grouping across them is reported too).  The targets' lengths are either their own (recovered
from their MFU, as the calibration does) or the source run's (what a user's run gives).  Rows
whose micro-batches ``grpo_runs.csv`` does not state (rows 96-98 of the Qwen2.5-7B sweep, fixed
micro-batches; ``benchmarks/rl_data.py`` reads 2/4 from the launch script the rows name) count in
the headline MAPE and are reported without too; and the job is re-run over the plausible settings
(``MICRO_BATCH_SETTINGS``, the script's 2/4 among them; ``--loo``'s last lines): with
fixed micro-batches the host's floor per micro-batch (``host_layer_s``) makes their count
matter.

``--band`` -- every published colocated step (``rl_data.load_rl_cases``) planned with no lengths
given: the default trajectory for the model's kind (:func:`planner.catalog.lengths.
default_lengths`) gives a step time at its start and at its end; how many measured steps fall
inside that band (and inside it widened by the model's own error on these steps, the shipped
``rl_fit`` MAPE).

``--mape`` -- the same steps, step-time MAPE by the lengths a plan assumes: each run's published
mean (what ``--response-lengths`` or ``--lengths-from`` give), the default trajectory for its
kind (expected over the run, what a plan with no lengths given ranks by), half the maximum (the
old default) and the maximum (lengths never stated).
"""

from __future__ import annotations

import argparse
import csv
import re
import sys
from collections import defaultdict
from dataclasses import replace
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))

from calibration_data import default_path  # noqa: E402
from rl_data import CSV_NAME, load_rl_cases, phase_measurement  # noqa: E402

from planner.catalog.lengths import default_lengths  # noqa: E402
from planner.cost.calibration import predict_phases  # noqa: E402
from planner.cost.efficiency import CostModel, shipped_calibration  # noqa: E402
from planner.cost.trajectory import step_time_band, workload_at  # noqa: E402
from trials.calibration_fit import calibrate_run  # noqa: E402

UNSTATED = "micro-batches not stated"
# (update, log-prob) micro-batches per GPU to try on the rows that do not state them: rl_data's
# assumption, the sweep script's own (GRPO_7B/qwen2.5_7b_megatron_vllm_benchmark.sh:
# ppo_micro_batch_size_per_gpu=2, log_prob_micro_batch_size_per_gpu=4), and the corners
MICRO_BATCH_SETTINGS = ((4, 10), (2, 4), (1, 1), (1, 10), (4, 4))


def _kernels(notes: str) -> str:
    found = re.search(r"other='([^']*)'", notes)
    return found.group(1) if found else ""


def sweep_jobs(strict: bool = True) -> dict[tuple, list]:
    """The verl sweep cases grouped into jobs (see the module docstring)."""
    rows = {}
    with open(default_path(CSV_NAME), newline="") as handle:
        for row in csv.DictReader(handle):
            rows[int(row["row_id"])] = row
    groups = defaultdict(list)
    cases, _ = load_rl_cases()
    for case in cases:
        if case.framework != "verl":
            continue
        row = rows[case.row_id]
        key = (row["source_url"].rsplit("/", 1)[-1], case.cluster.num_gpus)
        groups[key + ((_kernels(row["notes"]),) if strict else ())].append(case)
    return {key: members for key, members in groups.items() if len(members) > 1}


def _step(case, calibration, workload=None) -> float:
    item = phase_measurement(case if workload is None else replace(case, workload=workload))
    return predict_phases([item], CostModel.load(calibration))[0]["step"]


def _with_micro_batches(case, micro_batches: tuple[int, int] | None):
    """``case`` with (update, log-prob) micro-batches where its row does not state them."""
    if micro_batches is None or UNSTATED not in case.notes:
        return case
    update, log_prob = micro_batches
    return replace(case, layout=replace(case.layout, micro_batch=update,
                                        log_prob_micro_batch=log_prob))


def leave_one_layout_out(strict: bool = True, skip_unstated: bool = False,
                         micro_batches: tuple[int, int] | None = None) -> dict:
    """``micro_batches``: the (update, log-prob) micro-batches of the rows that do not state
    them (None: rl_data's assumption)."""
    errors = {"shipped": [], "fitted": [], "fitted_source_lengths": []}
    per_job = {}
    predicted = defaultdict(list)
    for key, members in sorted(sweep_jobs(strict).items()):
        if skip_unstated:
            members = [case for case in members if UNSTATED not in case.notes]
        members = [_with_micro_batches(case, micro_batches) for case in members]
        if len(members) < 2:
            continue
        job = {"shipped": [], "fitted": []}
        for source in members:
            fitted = calibrate_run([phase_measurement(source)], None,
                                   source=f"row {source.row_id}").calibration
            for target in members:
                if target is source:
                    continue
                measured = target.measured["step"]
                shipped = abs(_step(target, None) / measured - 1)
                step = _step(target, fitted)
                own = abs(step / measured - 1)
                if UNSTATED in target.notes:
                    predicted[target.row_id].append((step, measured))
                lengths = replace(target.workload,
                                  mean_response_length=source.workload.mean_response_length)
                theirs = abs(_step(target, fitted, lengths) / measured - 1)
                errors["shipped"].append(shipped)
                errors["fitted"].append(own)
                errors["fitted_source_lengths"].append(theirs)
                job["shipped"].append(shipped)
                job["fitted"].append(own)
        per_job[" | ".join(str(part) for part in key)] = {
            "rows": [case.row_id for case in members], "pairs": len(job["fitted"]),
            "shipped": float(np.mean(job["shipped"])), "fitted": float(np.mean(job["fitted"]))}
    return {"pairs": len(errors["fitted"]),
            **{name: float(np.mean(values)) for name, values in errors.items()},
            "jobs": per_job, "unstated": dict(predicted)}


def band_coverage() -> dict:
    cases, _ = load_rl_cases()
    widen = float(shipped_calibration().get("rl_fit", {}).get("mape", 0.0))
    inside = near = 0
    rows = []
    for case in cases:
        lengths = default_lengths(case.workload.response_length, case.model.name)

        def at(mean, case=case):
            return _step(case, None, workload_at(case.workload, mean))

        band = step_time_band(lengths, at)
        low, high = float(band.low_s), float(band.high_s)
        measured = case.measured["step"]
        inside += low <= measured <= high
        near += low * (1 - widen) <= measured <= high * (1 + widen)
        rows.append((case.row_id, case.model.name, lengths.kind, low, high, measured))
    return {"steps": len(cases), "inside": inside, "inside_widened": near, "widen": widen,
            "rows": rows}


def length_mape() -> dict:
    """Step-time MAPE over the published colocated steps by the lengths assumed (docstring)."""
    cases, _ = load_rl_cases()
    errors = defaultdict(list)
    for case in cases:
        measured = case.measured["step"]
        lengths = default_lengths(case.workload.response_length, case.model.name)

        def at(mean, case=case):
            return _step(case, None, workload_at(case.workload, mean))

        maximum = case.workload.response_length
        predicted = {"published mean": _step(case, None),
                     "default (expected over the run)": float(step_time_band(lengths, at)
                                                              .expected_s),
                     "half the max": at(maximum / 2), "the max": at(maximum)}
        for name, value in predicted.items():
            errors[name].append(abs(value / measured - 1))
    return {"steps": len(cases), **{name: float(np.mean(values))
                                    for name, values in errors.items()}}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--loo", action="store_true", help="leave one layout out only")
    parser.add_argument("--band", action="store_true", help="the default band only")
    parser.add_argument("--mape", action="store_true", help="step MAPE by the lengths assumed")
    args = parser.parse_args()
    both = not (args.loo or args.band or args.mape)
    if args.loo or both:
        for strict, skip in ((True, False), (True, True), (False, False)):
            result = leave_one_layout_out(strict, skip)
            jobs = "sweep x GPUs x kernel switches" if strict else "sweep x GPUs"
            print(f"leave one layout out (jobs = {jobs}"
                  f"{', rows with unstated micro-batches left out' if skip else ''}): "
                  f"{result['pairs']} pairs, step-time MAPE shipped {result['shipped']:.1%}, "
                  f"fitted from one run {result['fitted']:.1%} (targets' own lengths), "
                  f"{result['fitted_source_lengths']:.1%} (the source run's lengths)")
            for job, entry in result["jobs"].items():
                print(f"  {job}: rows {entry['rows']}, {entry['pairs']} pairs, shipped "
                      f"{entry['shipped']:.1%}, fitted {entry['fitted']:.1%}")
        print("rows with unstated micro-batches, over the plausible (update, log-prob) settings "
              "(all rows kept; the fit from each other layout of the job):")
        for setting in MICRO_BATCH_SETTINGS:
            result = leave_one_layout_out(True, False, setting)
            rows = "; ".join(
                f"row {row}: {min(p for p, _ in pairs):.0f}-{max(p for p, _ in pairs):.0f} s "
                f"(measured {pairs[0][1]:.0f})"
                for row, pairs in sorted(result["unstated"].items()))
            print(f"  {setting[0]}/{setting[1]}: MAPE {result['fitted']:.1%}; predicted {rows}")
    if args.band or both:
        result = band_coverage()
        print(f"default length band (no lengths given): {result['inside']} of {result['steps']} "
              f"published steps inside the predicted start/end step-time band; "
              f"{result['inside_widened']} inside it widened by the model's RL error "
              f"({result['widen']:.0%})")
        for row_id, model, kind, low, high, measured in result["rows"]:
            mark = "in " if low <= measured <= high else "out"
            print(f"  {mark} row {row_id:>3} {model[:18]:18} {kind:15} band {low:7.1f}-"
                  f"{high:7.1f} s, measured {measured:7.1f} s")
    if args.mape or both:
        result = length_mape()
        print(f"step-time MAPE over {result['steps']} published colocated steps, by the lengths "
              f"assumed: " + ", ".join(f"{name} {value:.1%}" for name, value in result.items()
                                       if name != "steps"))


if __name__ == "__main__":
    main()
