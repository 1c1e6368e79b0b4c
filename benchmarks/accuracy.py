"""How well the step-time model predicts published Megatron training throughput.

    python benchmarks/accuracy.py [--calibration planner/cost/calibration.json] [--write]

For the published layouts of ``benchmarks/data/calibration_layouts.csv`` (the in-repo copy of
the shared reference data; ``$PLAN_PARALLEL_REFERENCE_DIR`` points elsewhere; FP4 rows
excluded) it prints, for the calibrated model and for a constant-MFU baseline
(``6 * N_active * tokens`` at one fitted MFU):

* MAPE of predicted tokens/s/GPU, in sample and per source held out (leave-one-source-out:
  both models refitted without that source, then scored on it);
* Spearman rank correlation of predicted vs measured throughput within groups of the same
  model, GPU type, GPU count, precision and sequence length that hold at least two distinct
  layouts (the baseline predicts one value per group, so it cannot rank: correlation 0);
* top-3 hit rate: the measured-best layout of each group is among the model's 3 best-predicted
  distinct layouts;
* the ranking uncertainty: over every pair of distinct layouts of one group, the error of the
  predicted throughput ratio, ``|ln(pred_a / pred_b) - ln(meas_a / meas_b)|``; its median is
  how far apart two layouts' predictions must be for the model to tell them apart.  ``--write``
  stores it in the calibration file as ``ranking_uncertainty`` (plans treat layouts within it
  of the best as ties).

With ``--rl`` it reports the RL steps of ``grpo_runs.csv`` (colocated, on-policy; see
``benchmarks/rl_data.py``) instead:

* step-time MAPE in sample and leave-one-source-out (NeMo RL tables / NeMo RL blog / verl sweeps:
  the RL constants refitted without the source, then scored on it);
* per-phase MAPE (generate, log-prob, update, weight sync) where the source publishes phases;
* the same for a naive baseline: training at one constant MFU (fitted) plus decode at the HBM
  roofline (every step streams the replica's weights once, ``max_num_seqs`` sequences at once);
* Spearman of predicted vs measured step time within groups of the same model, GPUs and
  workload.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections import defaultdict
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))

from calibrate import fit, predict  # noqa: E402
from calibration_data import CalibrationCase, load_cases  # noqa: E402
from rl_data import RlCase, fit_rl, load_rl_cases, predict_rl  # noqa: E402


def model_predictions(cases: list[CalibrationCase], calibration: dict) -> np.ndarray:
    return predict(cases, calibration)


def ideal_tokens_per_s(case: CalibrationCase) -> float:
    """Tokens/s/GPU at 100% of peak with 6 * N_active FLOPs per token (no attention)."""
    flops_per_token = 6 * case.model.params.active
    return case.cluster.gpu.peak_flops(case.workload.precision) / flops_per_token


def fit_constant_mfu(cases: list[CalibrationCase]) -> float:
    ratios = [case.tokens_per_s_per_gpu / ideal_tokens_per_s(case) for case in cases]
    return float(np.exp(np.mean(np.log(ratios))))  # least squares in log space


def baseline_predictions(cases: list[CalibrationCase], mfu: float) -> np.ndarray:
    return np.array([mfu * ideal_tokens_per_s(case) for case in cases])


def mape(predicted: np.ndarray, measured: np.ndarray) -> float:
    return float(np.mean(np.abs(predicted / measured - 1)))


def _ranks(values: np.ndarray) -> np.ndarray:
    order = values.argsort(kind="stable")
    ranks = np.empty(len(values))
    ranks[order] = np.arange(len(values))
    for value in np.unique(values):  # average ranks over ties
        tied = values == value
        ranks[tied] = ranks[tied].mean()
    return ranks


def spearman(a: np.ndarray, b: np.ndarray) -> float:
    ra, rb = _ranks(a), _ranks(b)
    if ra.std() == 0 or rb.std() == 0:
        return 0.0
    return float(np.corrcoef(ra, rb)[0, 1])


def layout_key(case: CalibrationCase) -> tuple:
    layout = case.layout
    return (layout.tp, layout.pp, layout.vpp, layout.cp, layout.ep, layout.etp,
            layout.micro_batch, layout.recompute, case.workload.global_batch)


def ranking_scores(cases, predicted) -> tuple[float, float, float, int]:
    """Mean within-group Spearman, top-3 and top-1 hit rates, number of groups."""
    groups = defaultdict(list)
    for index, case in enumerate(cases):
        groups[case.group].append(index)
    correlations, hits, firsts = [], [], []
    for indices in groups.values():
        by_layout = defaultdict(list)
        for i in indices:
            by_layout[layout_key(cases[i])].append(i)
        if len(by_layout) < 2:
            continue
        keys = list(by_layout)
        measured = np.array([np.mean([cases[i].tokens_per_s_per_gpu for i in by_layout[k]])
                             for k in keys])
        guessed = np.array([np.mean(predicted[by_layout[k]]) for k in keys])
        correlations.append(spearman(guessed, measured))
        best = int(measured.argmax())
        top3 = np.argsort(-guessed, kind="stable")[:3]
        hits.append(best in top3 if guessed.std() > 0 else False)
        firsts.append(best == int(np.argmax(guessed)) if guessed.std() > 0 else False)
    if not correlations:
        return float("nan"), float("nan"), float("nan"), 0
    return (float(np.mean(correlations)), float(np.mean(hits)), float(np.mean(firsts)),
            len(correlations))


UNCERTAINTY_SOURCE = ("benchmarks/accuracy.py: median error of the predicted throughput ratio "
                      "of two layouts of one job")


def ranking_uncertainty(cases, predicted) -> dict:
    """The median, over pairs of distinct layouts of one group, of the error of the predicted
    throughput ratio (natural log, reported as a fraction: ``exp(median) - 1``)."""
    groups = defaultdict(lambda: defaultdict(list))
    for index, case in enumerate(cases):
        groups[case.group][layout_key(case)].append(index)
    errors = []
    for by_layout in groups.values():
        keys = list(by_layout)
        measured = np.log([np.mean([cases[i].tokens_per_s_per_gpu for i in by_layout[k]])
                           for k in keys])
        guessed = np.log([np.mean(predicted[by_layout[k]]) for k in keys])
        for a in range(len(keys)):
            for b in range(a + 1, len(keys)):
                errors.append(abs((guessed[a] - guessed[b]) - (measured[a] - measured[b])))
    if not errors:
        return {"relative": 0.0, "pairs": 0, "source": UNCERTAINTY_SOURCE}
    return {"relative": round(float(np.expm1(np.median(errors))), 4), "pairs": len(errors),
            "groups": sum(len(v) >= 2 for v in groups.values()), "source": UNCERTAINTY_SOURCE}


def report(cases: list[CalibrationCase], calibration: dict) -> dict:
    measured = np.array([case.tokens_per_s_per_gpu for case in cases])
    ours = model_predictions(cases, calibration)
    mfu = fit_constant_mfu(cases)
    naive = baseline_predictions(cases, mfu)
    rho, top3, top1, groups = ranking_scores(cases, ours)
    rho_naive, top3_naive, top1_naive, _ = ranking_scores(cases, naive)
    result = {"cases": len(cases), "groups_ranked": groups, "baseline_mfu": mfu,
              "in_sample": {"model_mape": mape(ours, measured),
                            "baseline_mape": mape(naive, measured),
                            "model_spearman": rho, "baseline_spearman": rho_naive,
                            "model_top3": top3, "baseline_top3": top3_naive,
                            "model_top1": top1, "baseline_top1": top1_naive},
              "dense_mape": mape(ours[[not c.model.is_moe for c in cases]],
                                 measured[[not c.model.is_moe for c in cases]]),
              "moe_mape": mape(ours[[c.model.is_moe for c in cases]],
                               measured[[c.model.is_moe for c in cases]]),
              "ranking_uncertainty": ranking_uncertainty(cases, ours),
              "held_out": {}}
    for source in sorted({case.source for case in cases}):
        train = [case for case in cases if case.source != source]
        test = [case for case in cases if case.source == source]
        held_cal = fit(train)
        held_measured = np.array([case.tokens_per_s_per_gpu for case in test])
        held_ours = model_predictions(test, held_cal)
        held_naive = baseline_predictions(test, fit_constant_mfu(train))
        rho_held, top3_held, top1_held, n_groups = ranking_scores(test, held_ours)
        result["held_out"][source] = {
            "cases": len(test), "model_mape": mape(held_ours, held_measured),
            "baseline_mape": mape(held_naive, held_measured),
            "model_spearman": rho_held, "model_top3": top3_held, "model_top1": top1_held,
            "groups": n_groups}
    return result


def _fmt(value: float, spec: str) -> str:
    return "-" if value != value else format(value, spec)  # NaN: no group to rank


def print_report(result: dict) -> None:
    s = result["in_sample"]
    print(f"{result['cases']} measured layouts, {result['groups_ranked']} groups with >= 2 "
          f"layouts; constant-MFU baseline fitted at MFU {result['baseline_mfu']:.3f}")
    print()
    print(f"{'':28}{'model':>10}{'baseline':>10}")
    print(f"{'MAPE tokens/s/GPU':28}{s['model_mape']:>10.1%}{s['baseline_mape']:>10.1%}")
    print(f"{'  dense / MoE (model)':28}{result['dense_mape']:>10.1%}{result['moe_mape']:>10.1%}")
    print(f"{'Spearman within groups':28}{s['model_spearman']:>10.2f}"
          f"{s['baseline_spearman']:>10.2f}")
    print(f"{'measured best in top 3':28}{s['model_top3']:>10.0%}{s['baseline_top3']:>10.0%}")
    print(f"{'measured best ranked first':28}{s['model_top1']:>10.0%}{s['baseline_top1']:>10.0%}")
    u = result["ranking_uncertainty"]
    print(f"ranking uncertainty: {u['relative']:.1%} (median error of the predicted throughput "
          f"ratio of two layouts of one job, {u['pairs']} pairs); plans treat layouts within "
          f"it of the best as ties")
    print()
    print("leave-one-source-out (refitted without the source, scored on it):")
    print(f"{'source':18}{'cases':>6}{'model MAPE':>12}{'baseline':>10}{'groups':>8}"
          f"{'Spearman':>10}{'top 1':>7}")
    for source, h in result["held_out"].items():
        print(f"{source:18}{h['cases']:>6}{h['model_mape']:>12.1%}{h['baseline_mape']:>10.1%}"
              f"{h['groups']:>8}{_fmt(h['model_spearman'], '.2f'):>10}"
              f"{_fmt(h['model_top1'], '.0%'):>7}")


# --- RL steps ----------------------------------------------------------------------------------


def naive_rl(case: RlCase, mfu: float) -> dict[str, float]:
    """Constant-MFU training (update = 6 N tokens, each log-prob pass 2 N tokens) plus decode at
    the HBM roofline; no latencies, no communication, no sync."""
    model, gpus, w = case.model, case.cluster.num_gpus, case.workload
    prompt = w.mean_prompt_length or w.prompt_length
    response = w.mean_response_length or w.response_length / 2
    tokens = w.sequences_per_step * (prompt + response)
    peak = case.cluster.gpu.peak_flops(w.precision)
    update = 6 * model.params.active * tokens / (mfu * peak * gpus)
    passes = len([p for p in w.phases if p in ("old_log_prob", "ref")])
    log_prob = passes * 2 * model.params.active * tokens / (mfu * peak * gpus)
    rtp = case.layout.rollout_tp
    replicas = max(gpus // rtp, 1)
    steps = w.sequences_per_step / replicas / w.max_num_seqs * response
    weights_per_gpu = 2 * model.params.total / rtp
    generate = steps * weights_per_gpu / case.cluster.gpu.hbm_bandwidth_bytes_per_s
    return {"step": update + log_prob + generate, "generate": generate, "update": update,
            "log_prob": log_prob, "weight_sync": 0.0}


def fit_naive_mfu(cases: list[RlCase]) -> float:
    """The MFU that makes the baseline's step times right on average (in log space)."""
    from scipy.optimize import minimize_scalar

    def loss(log_mfu):
        mfu = float(np.exp(log_mfu))
        return sum(np.log(naive_rl(c, mfu)["step"] / c.measured["step"]) ** 2 for c in cases)
    return float(np.exp(minimize_scalar(loss, bounds=(np.log(0.01), np.log(0.9)),
                                        method="bounded").x))


def phase_mape(cases: list[RlCase], predicted: list[dict]) -> dict[str, tuple[float, int]]:
    errors: dict[str, list[float]] = defaultdict(list)
    for case, guess in zip(cases, predicted):
        for phase, measured in case.measured.items():
            ratio = guess[phase] / measured
            errors[phase].append(abs(ratio - 1) if np.isfinite(ratio) else 9.0)
    return {phase: (float(np.mean(values)), len(values)) for phase, values in errors.items()}


def rl_spearman(cases: list[RlCase], predicted: list[dict]) -> tuple[float, int]:
    groups = defaultdict(list)
    for i, case in enumerate(cases):
        groups[case.group].append(i)
    rhos = [spearman(np.array([predicted[i]["step"] for i in idx]),
                     np.array([cases[i].measured["step"] for i in idx]))
            for idx in groups.values() if len(idx) >= 3]
    return (float(np.mean(rhos)) if rhos else float("nan")), len(rhos)


def rl_report(calibration: dict, held_out: bool = True) -> dict:
    cases, skipped = load_rl_cases()
    ours = predict_rl(cases, calibration)
    mfu = fit_naive_mfu(cases)
    naive = [naive_rl(case, mfu) for case in cases]
    rho, groups = rl_spearman(cases, ours)
    result = {"cases": len(cases), "skipped": skipped, "baseline_mfu": mfu,
              "in_sample": {"model": phase_mape(cases, ours),
                            "baseline": phase_mape(cases, naive)},
              "spearman_within_groups": rho, "groups": groups, "held_out": {}}
    if held_out:
        for source in sorted({case.source for case in cases}):
            train = [case for case in cases if case.source != source]
            test = [case for case in cases if case.source == source]
            refit = fit_rl(train, calibration)
            result["held_out"][source] = {
                "cases": len(test), "model": phase_mape(test, predict_rl(test, refit)),
                "baseline": phase_mape(test, [naive_rl(c, fit_naive_mfu(train)) for c in test])}
    return result


def print_rl_report(result: dict) -> None:
    print(f"{result['cases']} colocated on-policy RL steps (skipped: "
          + ", ".join(f"{reason} {n}" for reason, n in result["skipped"].items())
          + f"); baseline MFU {result['baseline_mfu']:.3f}")
    print()
    print(f"{'in sample':24}{'n':>4}{'model':>9}{'baseline':>10}")
    model, naive = result["in_sample"]["model"], result["in_sample"]["baseline"]
    for phase in ("step", "generate", "log_prob", "update", "weight_sync"):
        if phase in model:
            print(f"{'MAPE ' + phase:24}{model[phase][1]:>4}{model[phase][0]:>9.1%}"
                  f"{naive[phase][0]:>10.1%}")
    print(f"{'Spearman within groups':24}{result['groups']:>4}"
          f"{_fmt(result['spearman_within_groups'], '.2f'):>9}")
    if result["held_out"]:
        print()
        print("leave-one-source-out (RL constants refitted without the source):")
        print(f"{'source':16}{'n':>4}{'step':>8}{'base':>8}{'gen':>8}{'base':>8}"
              f"{'update':>8}{'logp':>8}{'sync':>8}")
        for source, h in result["held_out"].items():
            m, b = h["model"], h["baseline"]

            def cell(table, phase):
                return f"{table[phase][0]:>8.1%}" if phase in table else f"{'-':>8}"
            print(f"{source:16}{h['cases']:>4}{cell(m, 'step')}{cell(b, 'step')}"
                  f"{cell(m, 'generate')}{cell(b, 'generate')}{cell(m, 'update')}"
                  f"{cell(m, 'log_prob')}{cell(m, 'weight_sync')}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--calibration", type=Path,
                        default=Path(__file__).resolve().parents[1] / "planner" / "cost"
                        / "calibration.json")
    parser.add_argument("--json", action="store_true", help="print the figures as JSON")
    parser.add_argument("--rl", action="store_true",
                        help="report the RL steps of grpo_runs.csv instead of Megatron training")
    parser.add_argument("--no-held-out", action="store_true",
                        help="with --rl: in-sample figures only (no refits)")
    parser.add_argument("--write", action="store_true",
                        help="store the ranking uncertainty in the --calibration file")
    args = parser.parse_args()
    if args.rl:
        result = rl_report(json.loads(args.calibration.read_text()), not args.no_held_out)
        print(json.dumps(result, indent=2) if args.json else "", end="")
        if not args.json:
            print_rl_report(result)
        return
    cases, _ = load_cases()
    calibration = json.loads(args.calibration.read_text())
    result = report(cases, calibration)
    if args.write:
        calibration["ranking_uncertainty"] = result["ranking_uncertainty"]
        args.calibration.write_text(json.dumps(calibration, indent=2) + "\n")
        print(f"wrote ranking_uncertainty to {args.calibration}", file=sys.stderr)
    if args.json:
        print(json.dumps(result, indent=2))
    else:
        print_report(result)


if __name__ == "__main__":
    main()
