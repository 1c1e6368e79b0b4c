"""The inputs a plan is made for: model architectures (and their parameter counts), GPUs,
clusters and workloads.  Imports only the base modules (``planner.errors``, ``planner.units``)."""
