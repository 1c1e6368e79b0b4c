"""plan-parallel: parallel layouts for verl GRPO training with the Megatron backend.

The planning path (catalogs -> search space -> cost model -> ranking) imports numpy and, for
tables, pandas; never torch, verl or optuna.  Public entry points::

    from planner.models import resolve_model
    from planner.hardware import ClusterSpec, get_gpu
    from planner.workload import GrpoWorkload
    from planner.plan import make_plan, estimate_layout
"""

__version__ = "0.1.0"
