"""The planning commands' heap setting (planner.cli.heap): set in the CLI's process on glibc
Linux, left alone where a user tuned malloc, off Linux, and by a program importing the
planner."""

from __future__ import annotations

import importlib
import platform
import subprocess
import sys

import pytest

from planner.cli import heap

cli_main = importlib.import_module("planner.cli.main")  # the module (planner.cli.main is also
# the function's name in planner.cli)
GLIBC = sys.platform.startswith("linux") and platform.libc_ver()[0] == "glibc"

PROBE = ("from planner.cli.heap import keep_freed_heap; "
         "print(keep_freed_heap())")


@pytest.mark.skipif(not GLIBC, reason="mallopt is glibc's")
def test_the_thresholds_are_set_on_glibc():
    # in a fresh process, as a command's: both mallopt calls succeed
    out = subprocess.run([sys.executable, "-c", PROBE], capture_output=True, text=True,
                         check=True, env={"PATH": "/usr/bin:/bin", "PYTHONPATH": ":".join(
                             sys.path)})
    assert out.stdout.strip() == "True"


@pytest.mark.parametrize("name", heap.USER_SETTINGS)
def test_a_users_malloc_setting_is_left_alone(monkeypatch, name):
    monkeypatch.setenv(name, "1")
    assert heap.keep_freed_heap() is False


def test_nothing_is_set_off_linux(monkeypatch):
    monkeypatch.setattr(sys, "platform", "darwin")
    assert heap.keep_freed_heap() is False


def test_planning_commands_set_it_and_importing_the_planner_does_not(monkeypatch, capsys):
    calls = []
    monkeypatch.setattr(cli_main, "keep_freed_heap", lambda: calls.append(1) or True)
    import planner.plan  # noqa: F401 -- importing the planner sets nothing

    assert calls == []
    assert cli_main.main(["--model", "qwen3-8b", "--gpus", "8", "--gpu-type", "h100",
                          "--top", "1"]) == 0
    assert calls == [1]
    capsys.readouterr()
