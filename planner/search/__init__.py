"""Layouts, the rules megatron-core, vLLM and verl enforce on them, and the search space of every
valid layout.  Imports ``planner.catalog`` and the base modules."""
