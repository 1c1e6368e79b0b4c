"""The tuning simulator (benchmarks/tuning_regret.py): its noise model, and the real Tuner
against a hidden truth on three small jobs with fixed seeds -- the pruner stops trailing trials,
a study whose first trials all run out of memory still writes a success back, and the default
strategy beats the one before it."""

import dataclasses
import json
import math
import sys
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("optuna", reason="needs the tune extra: pip install 'plan-parallel[tune]'")

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from benchmarks import tuning_regret as sim  # noqa: E402
from planner.cost.efficiency import ranking_uncertainty  # noqa: E402
from trials.defaults import TUNE_DEFAULTS  # noqa: E402
from trials.guided import family_codes  # noqa: E402
from trials.proposals import first_trials  # noqa: E402

JOBS = {job.name: job for job in sim.JOBS}
MEMORY_SD = 0.09  # memory_error_sd()'s fit, pinned so the studies below need not refit it


@pytest.fixture(scope="module")
def prepared():
    return {name: sim.prepare(JOBS[name]) for name in sim.SMALL_JOBS}


def strategy(name):
    return next(s for s in sim.STRATEGIES if s.name == name)


def default_strategy():
    """The strategy ``tune`` runs by default (trials.defaults), as the simulator names it."""
    return next(s for s in sim.STRATEGIES
                if (s.sampler, s.pruner, s.first_trials, s.top_k, s.stop_when_confident,
                    s.ucb_width, s.phase_model)
                == (TUNE_DEFAULTS["sampler"], TUNE_DEFAULTS["pruner"],
                    TUNE_DEFAULTS["first_trials"], TUNE_DEFAULTS["top_k"],
                    TUNE_DEFAULTS["stop_when_confident"], TUNE_DEFAULTS["ucb_width"],
                    TUNE_DEFAULTS["phase_model"]))


def test_the_benchmark_has_twenty_jobs_of_every_kind():
    assert len(sim.JOBS) >= 20
    assert {job.kind for job in sim.JOBS} == {"dense", "moe", "mla"}
    assert min(job.gpus for job in sim.JOBS) == 8 and max(job.gpus for job in sim.JOBS) == 256


def test_noise_matches_the_measured_ranking_uncertainty(prepared):
    """Over many draws, the median error of the true throughput ratio of two layouts that
    differ in TP, EP or PP is the model's measured ranking uncertainty; layouts of one TP/EP/PP
    family err alike (their ratio errs much less)."""
    target = math.log1p(ranking_uncertainty()["relative"])
    rng = np.random.default_rng(5)
    for job in prepared.values():
        candidates = job.candidates.candidates
        predicted = np.array([c.predicted["tokens_per_s_per_gpu"] for c in candidates])
        codes = family_codes([c.params for c in candidates], sim.FAMILIES)
        a, b = rng.integers(0, len(candidates), (2, 20_000))
        differ = np.zeros(len(a), dtype=bool)
        for name in ("tp", "ep", "pp"):
            differ |= codes[name][a] != codes[name][b]
        same = ~differ & (a != b)
        across, within = [], []
        for seed in range(30):
            error = np.log(sim.hidden_truth(job, seed, MEMORY_SD).tokens_per_s_per_gpu
                           / predicted)
            across.append(np.median(np.abs(error[a[differ]] - error[b[differ]])))
            within.append(np.median(np.abs(error[a[same]] - error[b[same]])))
        # sigma is solved as if every pair drew its own family terms; a job's pairs share a few
        # family draws per seed, which biases the median by the candidate set's mix of families:
        # 0-11% over these jobs (moonlight-8 11% since the host floor reshaped its candidates)
        assert np.mean(across) == pytest.approx(target, rel=0.12), job.job.name
        assert np.mean(within) < 0.7 * np.mean(across), job.job.name


def test_memory_error_fits_the_anchors_and_ooms_nearer_capacity(prepared):
    sd = sim.memory_error_sd()
    assert 0.05 <= sd <= 0.15  # the anchors: 0 of 13 predicted fits ran out, 1 of 4 OOMs ran
    job = prepared["qwen3-30b-8"]
    peak = np.array([c.predicted["peak_gib"] for c in job.candidates.candidates])
    share = peak * (2 ** 30) / job.plan.cluster.gpu.memory_bytes
    ooms = np.mean([sim.hidden_truth(job, seed, sd).oom_need > 1 for seed in range(200)],
                   axis=0)
    order = np.argsort(share)
    low, high = order[:len(order) // 10], order[-len(order) // 10:]
    assert ooms[high].mean() > 3 * ooms[low].mean()
    # each layout's OOM rate is Phi(ln(peak / capacity) / sd)
    nearest = order[-1]
    expected = 0.5 * (1 + math.erf(math.log(share[nearest]) / (sd * math.sqrt(2))))
    assert ooms[nearest] == pytest.approx(expected, abs=0.08)


def test_pruner_stops_trailing_trials_early(prepared, tmp_path):
    job = prepared["qwen3-30b-8"]
    truth = sim.hidden_truth(job, 11, MEMORY_SD)
    pruned = sim.run_study(job, truth, strategy("guided+sh"), 8, 0, tmp_path)
    full = sim.run_study(job, truth, strategy("guided"), 8, 0, tmp_path)
    stopped = [t for t in pruned.trials if t["category"] == "pruned"]
    assert stopped, pruned.trials
    best = max(t["value"] for t in pruned.trials if t["value"] is not None)
    for trial in stopped:
        assert trial["value"] is None and trial["true"] < best  # it trailed, it is not a best
        # a full trial: the launch, the half-speed warm-up step (2 steps' time) and 4 steps; a
        # stopped one ran at most 3 of them (5 steps' time, half a step for the steps' noise)
        step_s = float(truth.step_time_s[job.candidates.index[trial["key"]]])
        assert trial["duration_s"] < sim.LAUNCH_S + 5.5 * step_s
    assert sim.at_budget(pruned, 8)["gpu_hours"] < sim.at_budget(full, 8)["gpu_hours"]


def test_probe_runs_one_steady_step_of_a_trailing_trial(prepared, tmp_path):
    """``--pruner probe``: a trial that is not near the best after its first steady step stops
    there -- the launch, the half-speed warm-up (two steps' time) and one step -- and the
    study still writes back a layout that ran all its steps."""
    job = prepared["moonlight-8"]
    truth = sim.hidden_truth(job, 5, MEMORY_SD)
    run = sim.run_study(job, truth, strategy("guided-w2+probe"), 10, 0, tmp_path)
    stopped = [t for t in run.trials if t["category"] == "pruned"]
    assert len(stopped) >= 3, [t["category"] for t in run.trials]
    for trial in stopped:
        step_s = float(truth.step_time_s[job.candidates.index[trial["key"]]])
        assert trial["duration_s"] == pytest.approx(sim.LAUNCH_S + 3 * step_s, rel=0.15)
    ok = [t for t in run.trials if t["category"] == "ok"]
    best = max(ok, key=lambda t: t["value"])
    assert all(t["true"] < best["true"] * 1.05 for t in stopped)  # none was clearly better
    assert run.trials[0]["category"] == "ok"  # the first trial is the best at its step


def test_a_study_whose_first_trials_all_oom_still_writes_back_a_success(prepared, tmp_path):
    job = prepared["qwen2.5-7b-8"]
    chosen = default_strategy()
    first = first_trials(job.candidates.candidates, chosen.top_k, chosen.first_trials,
                         ranking_uncertainty()["relative"])
    truth = sim.hidden_truth(job, 3, MEMORY_SD)
    need = truth.oom_need.copy()
    need[first] = 1.2  # every first trial needs 20% more than the GPU has
    truth = dataclasses.replace(truth, oom_need=need)
    run = sim.run_study(job, truth, chosen, 8, 0, tmp_path, write_dir=tmp_path / "out")
    categories = [t["category"] for t in run.trials]
    assert categories.count("oom") >= len(first) and "ok" in categories
    tuned = json.loads((tmp_path / "out" / "tuned.json").read_text())
    written = next(t for t in run.trials if t["key"] == tuned["layout_key"])
    assert written["category"] == "ok" and tuned["measured"]["tokens_per_s_per_gpu"] > 0
    assert (tmp_path / "out" / "run_grpo.sh").is_file()
    assert "confidence" in tuned and tuned["confidence"]["statement"]


def test_default_strategy_beats_the_one_before_on_three_jobs(prepared, tmp_path):
    """Fixed seeds, budget 12: the default's regret is lower on average and it spends fewer
    GPU-hours; the same seeds give the same numbers."""
    runs = []
    for job in prepared.values():
        truth = sim.hidden_truth(job, 7, MEMORY_SD)
        for chosen in (strategy("default (before)"), default_strategy()):
            runs.append(sim.run_study(job, truth, chosen, 12, 0, tmp_path))
    rows = {row["strategy"]: row for row in sim.summarise(runs, (12,))}
    before, now = rows["default (before)"], rows[default_strategy().name]
    assert 0.0 <= now["mean_regret"] < before["mean_regret"] <= 1.0
    assert now["gpu_hours"] < 0.9 * before["gpu_hours"]
    again = sim.run_study(prepared["moonlight-8"], sim.hidden_truth(prepared["moonlight-8"], 7,
                                                                      MEMORY_SD),
                          default_strategy(), 12, 0, tmp_path / "again")
    assert [t["key"] for t in again.trials] == [t["key"] for t in runs[-1].trials]


def test_equal_gpu_hours_counts_whole_trials_pruned_ones_too():
    """A study may spend what the reference's study of the same job and draw spent on
    ``budget`` trials; a trial that would end past that is not counted, a cheap pruned one
    is."""
    def trial(key, category, value, true, hours):
        return {"key": key, "category": category, "value": value, "true": true,
                "duration_s": hours * 3600.0 / 8}

    before = sim.StudyRun("job", 0, "default (before)",
                          [trial("a", "ok", 90.0, 90.0, 1.0), trial("b", "ok", 95.0, 95.0, 1.0)],
                          "", 100.0, 8)
    probe = sim.StudyRun("job", 0, "probe",
                         [trial("a", "ok", 90.0, 90.0, 1.0), trial("c", "pruned", None, 80.0, 0.5),
                          trial("d", "pruned", None, 99.0, 0.4), trial("e", "ok", 98.0, 98.0, 1.0)],
                         "", 100.0, 8)
    assert sim.trials_within(probe, 2.0) == 3 and sim.trials_within(probe, 2.9) == 4
    assert sim.trials_within(before, 0.99) == 0
    rows = {(r["strategy"], r["budget"]): r
            for r in sim.summarise_hours([before, probe], (1, 2))}
    assert rows[("probe", 1)]["median_regret"] == pytest.approx(0.10)
    assert rows[("probe", 1)]["trials_run"] == 1
    assert rows[("probe", 2)]["trials_run"] == 3  # 1 + 0.5 + 0.4 GPU-h; the next would pass 2
    assert rows[("probe", 2)]["median_regret"] == pytest.approx(0.10)  # d was pruned
    assert rows[("default (before)", 2)]["median_regret"] == pytest.approx(0.05)
    assert rows[("probe", 2)]["capped"] == 0.0


def test_the_ucb_width_reaches_the_study_sampler(prepared, tmp_path):
    """``TuneSettings.ucb_width`` is the guided sampler's bound: a wider one explores other
    layouts after the same first trials."""
    job = prepared["qwen3-30b-8"]
    truth = sim.hidden_truth(job, 2, MEMORY_SD)
    keys = {width: [t["key"] for t in sim.run_study(
        job, truth, dataclasses.replace(strategy("guided"), ucb_width=width), 8, 0,
        tmp_path / str(width)).trials] for width in (1.0, 3.0)}
    assert keys[1.0][:3] == keys[3.0][:3] and keys[1.0] != keys[3.0]


def test_the_tuner_sees_nothing_of_the_hidden_truth_it_did_not_measure(prepared, tmp_path):
    """No leak from the simulator: scrambling the hidden throughput and memory of every layout
    the default study did not run leaves its trials -- which layouts, in which order, what they
    measured -- exactly as they were."""
    job = prepared["moonlight-8"]
    truth = sim.hidden_truth(job, 9, MEMORY_SD)
    first = sim.run_study(job, truth, default_strategy(), 10, 0, tmp_path / "a")
    ran = np.array([job.candidates.index[t["key"]] for t in first.trials])
    rng = np.random.default_rng(1)
    untried = np.ones(len(truth.tokens_per_s_per_gpu), dtype=bool)
    untried[ran] = False
    factor = np.where(untried, np.exp(rng.normal(0.0, 0.3, len(untried))), 1.0)
    scrambled = dataclasses.replace(
        truth, tokens_per_s_per_gpu=truth.tokens_per_s_per_gpu * factor,
        step_time_s=truth.step_time_s / factor,
        oom_need=np.where(untried, rng.uniform(0.5, 1.2, len(untried)), truth.oom_need))
    second = sim.run_study(job, scrambled, default_strategy(), 10, 0, tmp_path / "b")
    assert [(t["key"], t["category"], t["value"]) for t in second.trials] == \
        [(t["key"], t["category"], t["value"]) for t in first.trials]


def _row(job, truth, index, category="ok", value=None):
    """A trial row of ``run_study``'s shape for candidate ``index``."""
    true = float(truth.tokens_per_s_per_gpu[index])
    return {"key": job.candidates[int(index)].key, "category": category,
            "value": (true if value is None else value) if category == "ok" else None,
            "true": true, "duration_s": 600.0}


def test_diagnose_names_why_a_study_missed_the_best_layout(prepared):
    """Each of the diagnosis' cases, from trial rows built on one hidden table: the best
    layout written back; no family with a layout within 3% tried; such a family tried with
    only slower members; the best layout stopped by the pruner; the best layout ran all its
    steps but a slower one measured higher."""
    job = prepared["qwen2.5-7b-8"]
    truth = sim.hidden_truth(job, 4, MEMORY_SD)
    true = truth.tokens_per_s_per_gpu
    family_of = sim.families(job)
    best = int(np.argmax(true))
    near = true >= 0.97 * truth.best
    good = {family_of[i] for i in np.flatnonzero(near)}
    outside = next(i for i in np.argsort(-true) if family_of[i] not in good)
    member = next(i for i in np.argsort(-true) if family_of[i] in good and not near[i])

    def case(*rows):
        run = sim.StudyRun("job", 0, "s", list(rows), "", truth.best, 8)
        return sim.diagnose(job, truth, run, len(rows))

    assert case(_row(job, truth, outside), _row(job, truth, best)) == "found"
    assert case(_row(job, truth, outside)) == "family never tried"
    assert case(_row(job, truth, outside), _row(job, truth, member)) == \
        "worse members of a best family"
    assert case(_row(job, truth, outside), _row(job, truth, best, "pruned")) == \
        "best layout stopped by the pruner"
    assert case(_row(job, truth, best, value=100.0),
                _row(job, truth, outside, value=200.0)) == \
        "best layout ran, another measured higher"
    # only the budget's first trials count
    run = sim.StudyRun("job", 0, "s", [_row(job, truth, outside), _row(job, truth, best)], "",
                       truth.best, 8)
    assert sim.diagnose(job, truth, run, 1) == "family never tried"


def test_noise_parts_split_family_and_member_errors(prepared):
    """The simulator's tables put part of the error on the members of a TP/EP/PP family
    (their micro-batch, recompute, rollout ... terms); a table whose error is one value per
    family has none there, and the counts of families and near-best layouts add up."""
    job = prepared["qwen3-30b-8"]
    truth = sim.hidden_truth(job, 2, MEMORY_SD)
    parts = sim.noise_parts(job, truth)
    assert 0.0 < parts["within_sd"] < truth.sigma and parts["family_sd"] > 0.0
    assert parts["families"] >= parts["tie_families"] >= 1
    assert parts["near_layouts"] >= parts["near_families"] >= 1
    predicted = np.array([c.predicted["tokens_per_s_per_gpu"] for c in job.candidates])
    family_of = sim.families(job)
    shift = {f: 0.1 * i for i, f in enumerate(dict.fromkeys(family_of))}
    flat = dataclasses.replace(truth, tokens_per_s_per_gpu=predicted * np.exp(
        [shift[f] for f in family_of]))
    parts = sim.noise_parts(job, flat)
    assert parts["within_sd"] == pytest.approx(0.0, abs=1e-12) and parts["family_sd"] > 0.1


def test_the_bound_studies_the_best_family_alone(prepared, tmp_path):
    """``--bound``: the job cut to the true best layout's TP/EP/PP family, with the same
    hidden values and the same best; a study of it runs only that family's layouts."""
    job = prepared["moonlight-8"]
    truth = sim.hidden_truth(job, 3, MEMORY_SD)
    cut_job, cut = sim.best_family_job(job, truth)
    family_of = sim.families(job)
    best = family_of[int(np.argmax(truth.tokens_per_s_per_gpu))]
    assert 1 <= len(cut_job.candidates) < len(job.candidates)
    assert set(sim.families(cut_job)) == {best} and cut.best == truth.best
    for position, candidate in enumerate(cut_job.candidates.candidates):
        assert candidate.index == position and cut_job.candidates.index[candidate.key] == position
        assert cut.tokens_per_s_per_gpu[position] == \
            truth.tokens_per_s_per_gpu[job.candidates.index[candidate.key]]
    run = sim.run_study(cut_job, cut, sim.default_strategy(), 4, 0, tmp_path)
    assert len(run.trials) == min(4, len(cut_job.candidates))
    assert all(family_of[job.candidates.index[t["key"]]] == best for t in run.trials)


def test_run_all_diagnoses_every_study_and_adds_the_bound(prepared, monkeypatch):
    monkeypatch.setattr(sim, "memory_error_sd", lambda: MEMORY_SD)
    runs, info = sim.run_all([JOBS["qwen3-30b-8"]], [sim.default_strategy()], 1, (3, 5),
                             bound=True)
    assert [r.strategy for r in runs] == [sim.default_strategy().name, sim.BOUND]
    assert all(set(r.cases) == {3, 5} and set(r.cases.values()) <= set(sim.CASES)
               for r in runs)
    assert [n["job"] for n in info["noise"]] == ["qwen3-30b-8"]
    rows = sim.summarise_cases(runs, (3, 5))
    assert all(sum(row[case] for case in sim.CASES) == 1 for row in rows)
    assert "family never tried" in sim.format_cases(rows)


def test_a_stated_ranking_uncertainty_reaches_the_plan_the_truth_and_the_sampler(
        prepared, monkeypatch, tmp_path):
    """``--ranking-uncertainty``: the job is planned with ties within it, the hidden tables
    match it (the median pair error of layouts differing in TP/EP/PP is ln(1 + u)) and the
    study's sampler assumes it (``TuneSettings.model_error``), as ``tune`` with a calibration
    stating it would; the shipped figure changes nothing."""
    from trials import study

    name = "qwen3-30b-8"
    shipped = prepared[name]
    assert shipped.uncertainty == ranking_uncertainty()["relative"]
    accurate = sim.prepare(JOBS[name], uncertainty=0.08)
    assert accurate.uncertainty == 0.08 and accurate.plan.tie_tolerance == 0.08
    assert shipped.plan.tie_tolerance == shipped.uncertainty
    seen = []
    tuner = study.Tuner

    def recording(**kwargs):
        seen.append(kwargs["settings"].model_error)
        return tuner(**kwargs)

    monkeypatch.setattr(study, "Tuner", recording)
    runs = {}
    for label, job in (("shipped", shipped), ("accurate", accurate)):
        truth = sim.hidden_truth(job, 4, MEMORY_SD, truth="phases")
        runs[label] = sim.run_study(job, truth, sim.default_strategy(), 6, 0,
                                    tmp_path / label)
    assert seen == [shipped.uncertainty, 0.08]
    assert [t["key"] for t in runs["shipped"].trials] != \
        [t["key"] for t in runs["accurate"].trials]
    # the per-phase tables' pair error follows u (scalar: sigma solved to it, ratio ~ u)
    candidates = accurate.candidates.candidates
    codes = family_codes([c.params for c in candidates], sim.FAMILIES)
    a, b = np.random.default_rng(5).integers(0, len(candidates), (2, 20_000))
    differ = np.zeros(len(a), dtype=bool)
    for field in ("tp", "ep", "pp"):
        differ |= codes[field][a] != codes[field][b]
    predicted = np.array([c.predicted["tokens_per_s_per_gpu"] for c in candidates])
    medians = {}
    for label, job in (("shipped", shipped), ("accurate", accurate)):
        errors = [np.log(sim.hidden_truth(job, seed, MEMORY_SD, truth="phases")
                         .tokens_per_s_per_gpu / predicted) for seed in range(12)]
        medians[label] = np.mean([np.median(np.abs(e[a[differ]] - e[b[differ]]))
                                  for e in errors])
    assert medians["accurate"] == pytest.approx(math.log1p(0.08), rel=0.15)
    assert medians["shipped"] == pytest.approx(math.log1p(shipped.uncertainty), rel=0.15)


def test_first_draw_runs_the_later_hidden_tables(monkeypatch):
    """``--first-draw N``: the studies of draws N .. N + draws - 1, each the very study a run
    from draw 0 makes of that table."""
    monkeypatch.setattr(sim, "memory_error_sd", lambda: MEMORY_SD)
    job, strategy_ = [JOBS["moonlight-8"]], [sim.default_strategy()]
    every, _ = sim.run_all(job, strategy_, 3, (4,))
    later, info = sim.run_all(job, strategy_, 1, (4,), first_draw=2)
    assert [r.draw for r in later] == [every[2].draw]  # the table's seed
    assert len({r.draw for r in every}) == 3
    assert info["first_draw"] == 2 and [n["draw"] for n in info["noise"]] == [2]
    assert later[0].trials == every[2].trials and later[0].best_true == every[2].best_true


@pytest.mark.parametrize("option", [["--ranking-uncertainty", "1.5"],
                                    ["--ranking-uncertainty", "0"], ["--first-draw", "-1"]])
def test_bad_options_exit_2_with_one_line(option, capsys):
    with pytest.raises(SystemExit) as exit_:
        sim.main(option)
    assert exit_.value.code == 2
    error = capsys.readouterr().err.strip()
    assert len(error.splitlines()) == 1 and option[0] in error
