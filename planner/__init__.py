"""plan-parallel: parallel layouts for verl GRPO training with the Megatron backend.

The planning path (catalogs -> search space -> cost model -> ranking) imports numpy and, for
tables, pandas; never torch, verl or optuna.  Public entry points::

    from planner.catalog.models import resolve_model
    from planner.catalog.hardware import ClusterSpec, get_gpu
    from planner.catalog.workload import GrpoWorkload
    from planner.plan import make_plan, estimate_layout

Layers: each imports only from those below it.  The list lives in one place,
``LAYERS`` of ``benchmarks/import_graph.py`` (``python benchmarks/import_graph.py --layers``
prints it; ``tests/project/test_import_graph.py`` checks the graph against it).
"""

from planner.versions import planner_version

__version__ = planner_version()
