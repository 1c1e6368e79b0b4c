"""Size the cluster: GPU counts and types to sweep (:mod:`.counts`), what a GPU-hour costs
(:mod:`.prices`), the best layout per count (:mod:`.search`) and the sweep with its run time,
GPU-hours, cost and marked points (:mod:`.sweep`).  Layered above :mod:`planner.plan`."""
