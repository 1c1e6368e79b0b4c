"""Real verl GRPO trials driven by Optuna (``plan-parallel tune`` and ``calibrate``).

The home of Optuna and process launching; the planner never imports it.  One direction of flow:

* :mod:`trials.candidates` — the plan's layouts predicted to fit, as a study's search space
  (with ``tune --mode``, the mode plans' pool splits and staleness thresholds too);
* :mod:`trials.trial_job` — a layout's exported verl job cut to a short horizon;
* :mod:`trials.launchers` — where it runs (a local process group, a Ray job), with limits;
* :mod:`trials.processes` — process groups, the recorded process tree of each trial, and
  what a killed tuner left running;
* :mod:`trials.metrics`, :mod:`trials.failures`, :mod:`trials.logscan`,
  :mod:`trials.gpu_monitor` — what it measured (every metric checked) and how it failed (the
  log read once, in bounded memory); :mod:`trials.runner` puts one trial together;
* :mod:`trials.preflight` — whether this machine can run verl trials at all (``doctor``, and
  ``tune`` before its first trial);
* :mod:`trials.sampler`, :mod:`trials.study_state`, :mod:`trials.storage`, :mod:`trials.study`
  — the Optuna study shared by any number of tuner processes;
* :mod:`trials.defaults`, :mod:`trials.proposals`, :mod:`trials.guided`,
  :mod:`trials.acquisition`, :mod:`trials.pruning`, :mod:`trials.confidence` — its strategy:
  which layouts run first, which next (the cost model corrected by the measurements), stopping
  trailing trials early, and whether an untried layout could still beat the best
  (``benchmarks/tuning_regret.py`` measures them against a hidden truth:
  docs/tuning/regret.md);
* :mod:`trials.progress`, :mod:`trials.study_outputs` — what a study shows and leaves behind;
* :mod:`trials.calibration_fit` — the time model fitted to measured trials;
* :mod:`planner.cli.tune`, :mod:`planner.cli.calibrate`, :mod:`planner.cli.doctor` — the
  subcommands.
"""
