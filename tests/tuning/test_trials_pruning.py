"""Multi-fidelity trials, tie-aware first trials, the confidence statement and the guided
sampler, piece by piece (the whole study: tests/tuning/test_tuning_regret.py with the simulator,
tests/tuning/test_trials_study.py with the fake verl trainer)."""

import html
import json
from types import SimpleNamespace

import numpy as np
import pytest

optuna = pytest.importorskip("optuna", reason="needs the tune extra: pip install "
                                              "'plan-parallel[tune]'")

from trials.confidence import assess  # noqa: E402
from trials.failures import Category, classify  # noqa: E402
from trials.launchers.launcher import Watchdog  # noqa: E402
from trials.proposals import family, first_trials, tied  # noqa: E402
from trials.pruning import PRUNED, TOLERANCE, StepReporter, make_pruner  # noqa: E402


class FakeTrial:
    """What StepReporter uses of an Optuna trial: report() and should_prune()."""

    def __init__(self, prune_at: int | None = None):
        self.reports: list[tuple[int, float]] = []
        self.prune_at = prune_at

    def report(self, value, step):
        self.reports.append((step, value))

    def should_prune(self):
        return self.prune_at is not None and self.reports[-1][0] >= self.prune_at


def record(step: int, tokens_per_s: float) -> str:
    return json.dumps({"step": step, "data": {"perf/throughput": tokens_per_s,
                                              "timing_s/step": 10.0}}) + "\n"


def test_step_reporter_reports_steady_medians_and_prunes(tmp_path):
    metrics = tmp_path / "metrics.jsonl"
    trial = FakeTrial(prune_at=2)
    reporter = StepReporter(trial, metrics_path=metrics, log_path=tmp_path / "log", steps=5,
                            warmup_steps=1, n_gpus=8)
    assert reporter() is None and trial.reports == []  # nothing written yet
    metrics.write_text(record(1, 50.0))  # the warm-up step is not reported
    assert reporter() is None and trial.reports == []
    with open(metrics, "a") as handle:
        handle.write(record(2, 100.0) + record(3, 80.0)[:20])  # a half-written line waits
    assert reporter() is None and trial.reports == [(1, 100.0)]
    with open(metrics, "a") as handle:
        handle.write(record(3, 80.0)[20:])
    assert reporter() == PRUNED  # steady step 2: the median of 100 and 80
    assert trial.reports == [(1, 100.0), (2, 90.0)] and reporter.pruned_at == 2


def test_step_reporter_reads_the_console_and_never_prunes_the_last_step(tmp_path):
    log = tmp_path / "trainer.log"
    trial = FakeTrial(prune_at=1)
    reporter = StepReporter(trial, metrics_path=None, log_path=log, steps=2, warmup_steps=1,
                            n_gpus=8)
    log.write_text("(TaskRunner pid=7) step:1 - perf/throughput:np.float64(5.0)\n"
                   "(TaskRunner pid=7) step:2 - perf/throughput:np.float64(7.0)\n")
    assert reporter() is None and trial.reports == [(1, 7.0)]


def test_watchdog_asks_the_monitor_only_when_files_grow(tmp_path):
    log = tmp_path / "log"
    log.write_text("")
    calls = []

    def monitor():
        calls.append(1)
        return PRUNED if len(calls) == 2 else None

    dog = Watchdog(100, 100, [log], monitor=monitor)
    assert dog.check() is None and calls == []
    log.write_text("a\n")
    assert dog.check() is None and len(calls) == 1
    assert dog.check() is None and len(calls) == 1  # no growth, no call
    log.write_text("a\nb\n")
    assert dog.check() == PRUNED


def test_a_pruned_trial_is_its_own_category():
    result = classify(["step:1 - x:1"], exit_code=-15, stopped=PRUNED, steps_recorded=2,
                      steps_expected=5)
    assert result.category is Category.PRUNED and result.cause == ""
    assert result.reason.startswith("pruned after 2 of 5 steps")
    done = classify([], exit_code=-15, stopped=PRUNED, steps_recorded=5, steps_expected=5)
    assert done.category is Category.OK  # every step recorded: a success, whatever stopped it


def test_successive_halving_prunes_a_trailing_trial_at_equal_steps():
    study = optuna.create_study(direction="maximize",
                                pruner=make_pruner("successive-halving", 4))
    fast = study.ask()
    fast.report(100.0, 1)
    assert not fast.should_prune()
    study.tell(fast, 100.0)
    slow = study.ask()
    slow.report(80.0, 1)
    assert slow.should_prune()  # trails the study's best at steady step 1
    close = study.ask()
    close.report(97.0, 1)
    assert not close.should_prune()  # within TOLERANCE of the best: a step's noise
    assert TOLERANCE == 0.05
    better = study.ask()
    better.report(101.0, 1)
    assert not better.should_prune()
    for name in ("hyperband", "none"):
        assert isinstance(make_pruner(name, 4), optuna.pruners.BasePruner)
    with pytest.raises(ValueError, match="successive-halving"):
        make_pruner("median", 4)


def test_probe_stops_every_trial_after_one_step_unless_it_is_near_the_best():
    study = optuna.create_study(direction="maximize", pruner=make_pruner("probe", 4))
    first = study.ask()
    first.report(100.0, 1)
    assert not first.should_prune()  # the only value at its step is the best one
    for step, value in ((2, 100.0), (3, 101.0)):
        first.report(value, step)
        assert not first.should_prune()
    study.tell(first, 100.0)
    slow = study.ask()
    slow.report(94.0, 1)
    assert slow.should_prune()  # 6% behind the best at steady step 1
    study.tell(slow, state=optuna.trial.TrialState.PRUNED)
    close = study.ask()
    close.report(96.0, 1)
    assert not close.should_prune()  # within TOLERANCE: it goes on ...
    close.report(90.0, 2)
    assert close.should_prune()  # ... while it stays near the best at its step
    study.tell(close, state=optuna.trial.TrialState.PRUNED)
    faster = study.ask()
    faster.report(120.0, 1)
    assert not faster.should_prune()
    study.tell(faster, 120.0)
    again = study.ask()
    again.report(110.0, 1)
    assert again.should_prune()  # the bar is the best value any trial reached at the step


def candidate(index, tp, pp, ep=1, tokens=1000.0, mb=1):
    params = {"tp": tp, "pp": pp, "ep": ep, "micro_batch": mb}
    return SimpleNamespace(index=index, key=f"c{index}", params=params,
                           predicted={"tokens_per_s_per_gpu": tokens})


def test_spread_takes_one_layout_per_tp_ep_pp_family_first():
    candidates = [candidate(0, 1, 1, tokens=1000, mb=1), candidate(1, 1, 1, tokens=990, mb=2),
                  candidate(2, 2, 1, tokens=980), candidate(3, 1, 1, tokens=970, mb=4),
                  candidate(4, 2, 2, tokens=960), candidate(5, 4, 1, tokens=500)]
    assert tied(candidates, 0.16) == [0, 1, 2, 3, 4]  # 500 is not within 16% of 1000
    assert first_trials(candidates, 3, "simplest", 0.16) == [0, 1, 2]
    assert first_trials(candidates, 3, "spread", 0.16) == [0, 2, 4]
    # the second of each family next, then the rest in rank order
    assert first_trials(candidates, 6, "spread", 0.16) == [0, 2, 4, 1, 3, 5]
    assert family(candidates[4]) == (None, None, 2, 1, 2)


def test_ucb_first_trials_take_the_best_predicted_layout_of_each_family():
    """Before a measurement every bound is the prediction plus one width: the best-predicted
    member of each TP/EP/PP family, families in the order of it, ties or not."""
    candidates = [candidate(0, 1, 1, tokens=900, mb=1), candidate(1, 1, 1, tokens=990, mb=2),
                  candidate(2, 2, 1, tokens=950), candidate(3, 2, 2, tokens=1000),
                  candidate(4, 4, 1, tokens=500), candidate(5, 2, 1, tokens=960, mb=2)]
    assert first_trials(candidates, 3, "ucb", 0.16) == [3, 1, 5]
    assert first_trials(candidates, 6, "ucb", 0.16) == [3, 1, 5, 4, 0, 2]
    assert first_trials(candidates, 6, "spread", 0.16)[:3] == [0, 2, 3]  # plan order instead


def test_confidence_says_how_many_untried_layouts_could_beat_the_best():
    predicted = np.array([1000.0, 950.0, 900.0, 700.0])
    untried = np.array([False, False, True, True])
    # measured 20% above prediction (the job's scale) and 10% above the scale at the best
    successes = [(0, 1200.0), (1, 1254.0)]
    result = assess(predicted, untried, successes, ("c1", 1254.0), 0.16)
    assert result.scale == pytest.approx((1.2 + 1.32) / 2)
    # bounds: 900 * 1.26 * 1.16 = 1315 (could beat 1254), 700 * 1.26 * 1.16 = 1023 (could not)
    assert result.could_beat == 1 and result.untried == 2 and not result.confident
    assert "1 of 2 untried layouts could beat" in result.statement()
    sure = assess(predicted, np.array([False, False, False, True]), successes, ("c1", 1254.0),
                  0.16)
    assert sure.confident and sure.statement().startswith(
        "no untried layout is predicted to beat the best measured one by more than the "
        "model's error (16%")
    assert assess(predicted, untried, [], ("c1", 1.0), 0.16) is None


def test_guided_posterior_moves_a_measured_layouts_family():
    from trials.guided import ErrorModel

    frame = SimpleNamespace(candidates=[
        SimpleNamespace(params={"tp": tp, "pp": pp, "ep": 1, "micro_batch": mb},
                        predicted={"tokens_per_s_per_gpu": 1000.0})
        for tp in (1, 2) for pp in (1, 2) for mb in (1, 2)])
    model = ErrorModel(frame, 0.16)
    # measured: TP1 PP1 mb1 at 1,300 (30% above its prediction)
    mean, sd = model.posterior(np.array([0]), np.array([1300.0]), np.array([1e-4]))
    gain = np.exp(mean) / 1000.0
    assert gain[0] == pytest.approx(1.3, rel=0.01)
    same_family = gain[1]  # TP1 PP1 mb2
    other_tp = gain[4]  # TP2 PP1 mb1
    other_both = gain[7]  # TP2 PP2 mb2
    assert same_family > other_tp > other_both > 1.0  # sharing more, erring more alike
    assert sd[0] < sd[1] < sd[7]


def test_a_wider_ucb_width_prefers_the_unmeasured_family():
    """``--ucb-width``: with one layout of the TP1 family measured 20% above its prediction,
    a narrow bound takes its family's other layout, a wide one the unmeasured TP2 family."""
    from trials import study_state as attrs
    from trials.guided import GuidedSampler

    frame = SimpleNamespace(candidates=[
        SimpleNamespace(index=i, key=f"c{i}", params={"tp": tp, "pp": 1, "ep": 1,
                                                     "micro_batch": mb},
                        predicted={"tokens_per_s_per_gpu": tokens})
        for i, (tp, mb, tokens) in enumerate([(1, 1, 1000.0), (1, 2, 1000.0),
                                              (2, 1, 900.0)])], distributions=dict)
    frame.index = {c.key: c.index for c in frame.candidates}
    measured = SimpleNamespace(user_attrs={
        attrs.CATEGORY: "ok", attrs.KEY: "c0",
        attrs.MEASURED: {"tokens_per_s_per_gpu": 1200.0, "steady_steps": 4}})
    study = SimpleNamespace(get_trials=lambda deepcopy=False: [measured])
    mask = np.array([False, True, True])
    chosen = {width: GuidedSampler(frame, lambda s: mask, 0.16, seed=0, kappa=width,
                                   inner=optuna.samplers.RandomSampler(seed=0))
              .choose(study, None, {}, mask) for width in (0.5, 3.0)}
    assert chosen == {0.5: 1, 3.0: 2}


def test_tune_with_the_fake_verl_trainer_prunes_a_slow_trial(tmp_path, monkeypatch, capsys):
    """A real ``tune`` run: the second layout runs at half the first's speed, so at its first
    steady step it trails the study's best and the pruner stops it; its process group is
    stopped (no "end" event) and it is recorded PRUNED with what it measured."""
    pytest.importorskip("psutil", reason="needs the tune extra")
    from fixtures.tuning import (
        events,
        fake_trainer,
        layout_key_of,
        load_study,
        sqlite_url,
        top_candidates,
        tune_argv,
    )

    from planner.cli.main import main
    from trials import study_state as attrs

    argv = tune_argv(tmp_path, "--first-trials", "simplest", "--top-k", "2", "--pruner",
                     "successive-halving", "--warmup-steps", "1", trials=2, steps=4)
    fast, slow = top_candidates(argv, 2)
    layout = {name: fast.params[name] for name in ("tp", "pp", "micro_batch", "recompute",
                                                   "rollout_tp", "gpu_memory_utilization")}
    record = fake_trainer(tmp_path, monkeypatch)(
        step_sleep_s=0.5, throughput={"base": 1000.0, "table": [{"match": layout,
                                                                  "value": 2000.0}]})
    assert main(argv) == 0
    out = capsys.readouterr().out
    study = load_study(sqlite_url(tmp_path))
    first, second = sorted(study.get_trials(), key=lambda t: t.number)
    assert first.user_attrs[attrs.KEY] == fast.key and first.state.name == "COMPLETE"
    assert second.user_attrs[attrs.KEY] == slow.key
    assert second.state.name == "PRUNED" and second.user_attrs[attrs.CATEGORY] == "pruned"
    assert second.user_attrs[attrs.REASON].startswith("pruned after")
    measured = second.user_attrs[attrs.MEASURED]
    assert 2 <= measured["steps_recorded"] < 4  # stopped early, with what it measured
    assert measured["tokens_per_s_per_gpu"] == pytest.approx(1000.0)
    assert second.intermediate_values and min(second.intermediate_values) == 1
    ends = [layout_key_of(e) for e in events(record) if e["event"] == "end"]
    assert ends == [fast.key]  # the slow trainer was stopped before its end
    assert "2 trials measured" in out and "confidence:" in out
    # `report` shows what the study says about its untried layouts
    statement = study.user_attrs[attrs.CONFIDENCE]["statement"]
    assert f"confidence: {statement}" in out
    assert main(["report", str(tmp_path / "sweep")]) == 0
    page = (tmp_path / "sweep" / "report.html").read_text()
    assert f"Confidence: {html.escape(statement)}." in page


def test_a_pruner_with_several_objectives_is_refused(tmp_path, capsys):
    from fixtures.tuning import tune_argv

    from planner.cli.main import main

    assert main(tune_argv(tmp_path, "--multi-objective", "--pruner", "hyperband")) == 2
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert "--pruner hyperband needs one objective" in err


def test_a_bad_ucb_width_is_refused_by_name(tmp_path, capsys):
    from fixtures.tuning import tune_argv

    from planner.cli.main import main

    assert main(tune_argv(tmp_path, "--ucb-width", "11")) == 2
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert "--ucb-width" in err and "11" in err and "0..10" in err
