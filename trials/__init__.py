"""Real verl GRPO trials driven by Optuna: launchers, metric parsing, failure categories.

The home of Optuna and process launching (see the trials issue); the planner never imports it.
"""
