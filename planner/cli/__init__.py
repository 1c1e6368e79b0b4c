"""The ``plan-parallel`` command line: argument parsing, and the one place that maps errors to
exit codes and prints.  It may import every other layer; nothing imports it."""

from planner.cli.codes import ExitCode
from planner.cli.main import entry_point, main

__all__ = ["ExitCode", "entry_point", "main"]
