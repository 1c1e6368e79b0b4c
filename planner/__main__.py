from planner.cli import entry_point

entry_point()
