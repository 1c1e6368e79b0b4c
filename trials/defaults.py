"""What a ``tune`` study does unless told otherwise: the strategy ``benchmarks/tuning_regret.py``
measured best (docs/tuning/regret.md has the table).  Standard library only: the command-line
parser reads it."""

SAMPLERS = ("guided", "tpe", "random")  # trials.guided; Optuna's TPE or random over the fields
PRUNERS = ("none", "successive-halving", "hyperband", "probe")  # trials.pruning
FIRST_TRIALS = ("simplest", "spread", "ucb")  # trials.proposals
PHASE_MODELS = ("on", "off")  # trials.guided: fit the error per GRPO phase, or the step's
# trials.guided, trials.acquisition: how the guided sampler picks the next layout -- its upper
# bound, the tie of the largest posterior sd (a design of the first trials), the layout that
# tells most about which contender is fastest, the additive bound (each term's sd counted), or
# of the near-highest bounds the one varying most knob terms (docs/tuning/regret.md, sixth round)
ACQUISITIONS = ("ucb", "design", "info", "additive", "knobs")
TUNE_DEFAULTS = {"top_k": 1, "first_trials": "ucb", "sampler": "guided",
                 "pruner": "probe", "stop_when_confident": False,
                 "ucb_width": 2.0, "phase_model": "on", "exploit_last": 0,
                 "acquisition": "ucb"}
