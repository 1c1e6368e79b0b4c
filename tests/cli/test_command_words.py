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


@pytest.mark.parametrize("argv", [["help", "help"], ["help", "--model", "x"]])
def test_help_with_no_command_after_it_prints_the_commands(argv, capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(argv)
    assert exit_info.value.code == 0
    assert capsys.readouterr().out.startswith("usage: plan-parallel [-h]")


def test_help_with_a_mistyped_command_names_the_closest(capsys):
    assert main(["help", "tun"]) == 2
    assert "unknown command 'tun' (did you mean 'tune'?)" in capsys.readouterr().err
