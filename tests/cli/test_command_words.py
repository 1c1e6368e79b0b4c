"""The first word of the command line: a command, `help`, options for the default `plan`, or a
mistyped command refused by name."""

import pytest

from planner.cli.main import main


def test_help_alone_prints_the_commands(capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(["help"])
    assert exit_info.value.code == 0
    assert "advise" in capsys.readouterr().out


def test_help_with_a_command_prints_that_commands_help(capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(["help", "tune"])
    assert exit_info.value.code == 0
    assert capsys.readouterr().out.startswith("usage: plan-parallel tune")


def test_a_mistyped_command_is_refused_with_the_closest(capsys):
    assert main(["estimat", "--model", "qwen3-8b"]) == 2
    err = capsys.readouterr().err
    assert "unknown command 'estimat' (did you mean 'estimate'?)" in err
    assert err.count("\n") == 1
