"""The cost model: memory and time of every GRPO phase, FLOP counts, the fitted efficiency
constants (and their fit), and the result schema.  Imports ``search``, ``catalog`` and the base."""
