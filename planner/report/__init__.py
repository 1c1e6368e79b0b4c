"""Rendering for people: plan tables, JSON and CSV, the HTML report and its plots.  Imports
``trials`` (sweep folders through its API), ``verl``, ``plan`` and below, never ``cli``."""
