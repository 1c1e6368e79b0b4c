"""The verl command of a launch script: its Hydra overrides, as bash would hand them over.

verl's example scripts (``examples/grpo_trainer/run_*_megatron.sh``) set shell variables and
then run ``python3 -m verl.trainer.main_ppo`` with one ``key=value`` per continued line.  The
script is read with :mod:`planner.verl.shell` (nothing runs); this module finds the one verl
command, splits Hydra's own flags (``--config-path``/``--config-name``/``--config-dir``) from the
overrides, and decides what unknown values matter: a variable that is not set is an error only
when the verl command uses it (directly or through another variable), and the error names it;
command substitutions (``$(date +%s)``) are kept as text and reported.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Mapping

from planner.bounds import read_text
from planner.errors import PlanInputError
from planner.verl.keys import ENTRY_FILE, ENTRY_MODULE, MODE_ENTRY
from planner.verl.shell import NAME, Shell


@dataclass(frozen=True)
class LaunchCommand:
    """The verl command of a script: its Hydra arguments, with where they came from."""

    overrides: tuple[str, ...]
    config_path: str | None = None
    config_name: str | None = None
    config_dir: str | None = None  # --config-dir/-cd: searched before the primary folder
    line: int = 0
    notes: tuple[str, ...] = ()  # what was not run or not understood, for the report
    problems: tuple[str, ...] = ()  # why bash itself would fail (a CRLF file), errors
    mode: str = "sync"  # the training mode its entry point runs (keys.MODE_ENTRY)


ENTRY_FILES = {mode: module.replace(".", "/") + ".py" for mode, module in MODE_ENTRY.items()}
assert ENTRY_FILES["sync"] == ENTRY_FILE


def _entry(words: list[str]) -> tuple[int, str] | None:
    """Where the verl command's entry point is and the mode it runs: ``-m`` a module of
    ``MODE_ENTRY`` (main_ppo, or the asynchronous trainers), or a path to its file."""
    for index, word in enumerate(words):
        for mode, module in MODE_ENTRY.items():
            if word == module and index > 0 and words[index - 1] == "-m":
                return index, mode
            if word.endswith(ENTRY_FILES[mode]):
                return index, mode
    return None


def _entry_index(words: list[str]) -> int | None:
    found = _entry(words)
    return None if found is None else found[0]


_VALUE_FLAGS = {"--config-path": "config_path", "-cp": "config_path",
                "--config-name": "config_name", "-cn": "config_name",
                "--config-dir": "config_dir", "-cd": "config_dir",
                "--cfg": "cfg", "-c": "cfg", "--package": "package", "-p": "package"}


def command_arguments(arguments: list[str]) -> tuple[list[str], dict[str, str], list[str]]:
    """Split ``main_ppo``'s arguments into overrides, Hydra's flags and ignored arguments."""
    overrides, flags, ignored = [], {}, []
    index = 0
    while index < len(arguments):
        argument = arguments[index]
        name, equals, inline = argument.partition("=")
        if name in _VALUE_FLAGS:
            if equals:
                flags[_VALUE_FLAGS[name]] = inline
            elif index + 1 < len(arguments):
                index += 1
                flags[_VALUE_FLAGS[name]] = arguments[index]
        elif argument.startswith("-"):
            ignored.append(argument)
        else:
            overrides.append(argument)
        index += 1
    return overrides, flags, ignored


def parse_launch_script(text: str, environ: Mapping[str, str],
                        source: str = "script") -> LaunchCommand:
    """The verl command of a launch script's text (see the module docstring)."""
    env = dict(environ)
    taint: dict[str, set[str]] = {}
    shell = Shell(text, env, taint, source)
    found, modes = [], []
    for line, words in shell.commands():
        values = [value for word in words for value in word.values()]
        entry = _entry(values)
        if entry is None:
            continue
        index, mode = entry
        arguments, taints = [], []
        for word in words:
            for value in word.values():
                arguments.append(value)
                taints.append(word.taint)
        found.append((line, arguments[index + 1:], taints[index + 1:]))
        modes.append(mode)
    if not found:
        raise PlanInputError(f"{source} has no `python3 -m {ENTRY_MODULE}` command (nor "
                             f"{' / '.join(MODE_ENTRY[m] for m in MODE_ENTRY if m != 'sync')}); "
                             f"validate reads verl launch scripts, Hydra YAML files or "
                             f"`-- key=value ...` overrides")
    if len(found) > 1:
        lines = ", ".join(str(line) for line, _, _ in found)
        raise PlanInputError(f"{source} runs {ENTRY_MODULE} {len(found)} times (lines "
                             f"{lines}); validate one command at a time")
    line, arguments, taints = found[0]
    notes: list[str] = []
    for argument, names in zip(arguments, taints):
        unset = sorted(name for name in names if NAME.fullmatch(name))
        if unset:
            raise PlanInputError(
                f"{source} line {line}: ${unset[0]} is not set (used by {argument.split('=')[0]});"
                f" export it or pass --set {unset[0]}=VALUE")
        unevaluated = sorted(name for name in names if name.startswith("${"))
        if unevaluated:
            raise PlanInputError(f"{source} line {line}: {unevaluated[0]} (used by "
                                 f"{argument.split('=')[0]}) is bash syntax validate does not "
                                 f"evaluate; write the value or pass it with --set")
        notes += [f"{argument.split('=')[0]} uses {name}, which validate does not run (the "
                  f"text is kept)" for name in sorted(names) if name.startswith(("$(", "`"))]
    overrides, flags, ignored = command_arguments(arguments)
    notes += [f"argument {item} of {ENTRY_MODULE} ignored" for item in ignored]
    notes += [f"{ENTRY_MODULE} argument --{name.replace('_', '-')} {value} ignored"
              for name, value in flags.items() if name in ("cfg", "package")]
    return LaunchCommand(overrides=tuple(overrides), config_path=flags.get("config_path"),
                         config_name=flags.get("config_name"), config_dir=flags.get("config_dir"),
                         line=line, notes=tuple(notes), mode=modes[0])


def read_launch_script(path: Path, environ: Mapping[str, str]) -> LaunchCommand:
    """A launch script from a file (size bounded, UTF-8).  Windows line endings are an error
    bash would meet at once (``$'\r': command not found``, every value ending in ``\r``);
    the script is read without them so the rest is still checked."""
    name = Path(path).name
    text = read_text(Path(path), "launch script")
    if "\0" in text:
        raise PlanInputError(f"{name} holds NUL bytes; not a shell script (bash: cannot "
                             f"execute binary file)")
    problems = ()
    if "\r\n" in text:
        lines = text.count("\r\n")
        text = text.replace("\r\n", "\n")
        problems = (f"{name} has Windows (CRLF) line endings on {lines} line(s): bash reads the "
                    f"carriage return as part of each word and the script fails at once; "
                    f"convert it with `dos2unix {name}` (or `sed -i 's/\\r$//' {name}`)",)
    command = parse_launch_script(text, environ, source=name)
    return replace(command, problems=command.problems + problems)


def expand_override(text: str, environ: Mapping[str, str]) -> str:
    """``$VAR``/``${VAR...}`` in an override given on validate's command line (the shell did
    not expand it, e.g. it was quoted).  Braces holding a lower-case name or a dotted path are
    Hydra interpolations (``${data.train_files}``, ``${oc.env:X}``) and stay as they are."""
    out, position = [], 0
    for match in re.finditer(r"\$(\{[^}]*\}|[A-Za-z_][A-Za-z0-9_]*)", text):
        body = match.group(1)
        if body.startswith("{"):
            name = NAME.match(body[1:])
            if not name or body[1:].startswith(("oc.", "hydra:")) or "." in body \
                    or (body[1:-1] == name.group() and name.group().islower()):
                continue
        out.append(text[position:match.start()])
        shell = Shell(match.group(), dict(environ), {}, "override")
        value, taint = shell.dollar()
        unset = sorted(name for name in taint if NAME.fullmatch(name))
        if unset:
            raise PlanInputError(f"override {text!r}: ${unset[0]} is not set; export it or "
                                 f"pass --set {unset[0]}=VALUE")
        out.append(value)
        position = match.end()
    out.append(text[position:])
    return "".join(out)
