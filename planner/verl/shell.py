"""Read shell text the way bash does, without running it: the words of each simple command.

What verl's launch scripts use: line continuations, comments, quoting (single, double,
backslash), variable assignments (``A=1``, ``export A=...``, ``A+=...``), ``$VAR``, ``${VAR}``,
``${VAR:-default}`` / ``-`` / ``:=`` / ``=`` / ``:+`` / ``+`` / ``:?``, ``$((arithmetic))``,
``$@``, word splitting of unquoted expansions, pipes, ``;``/``&&``/``||``, redirections and
here-documents.  Assignments apply in order, as in bash.

Nothing runs: a word remembers what it depends on that is unknown (an unset variable, a command
substitution, a ``${VAR/pattern/...}`` form) so the caller decides whether that matters.
"""

from __future__ import annotations

import re

from planner.bounds import (
    MAX_ARITHMETIC_CHARS,
    MAX_EXPANDED_CHARS,
    MAX_EXPANSION_DEPTH,
    MAX_VARIABLE_CHARS,
    shown,
)
from planner.errors import PlanInputError, ResourceLimitError
from planner.verl.arith import Arithmetic

NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_ASSIGNMENT = re.compile(r"([A-Za-z_][A-Za-z0-9_]*)(\+?=)")
_DECLARE = ("export", "declare", "local", "readonly", "typeset")
_WORD_END = set(" \t\n;&|<>()")


class Word:
    """One shell word while it is read: its fields after splitting, whether each was quoted
    (an empty quoted field is still a word), and what it depends on that is unknown: unset
    variables ("NAME"), unrun commands ("$(...)"), unevaluated expansions ("${...}")."""

    def __init__(self) -> None:
        self.fields: list[str] = [""]
        self.quoted: list[bool] = [False]
        self.taint: set[str] = set()
        self.raw_digits = False  # an all-digit word right before a redirection (2>&1)

    def values(self) -> list[str]:
        return [f for f, q in zip(self.fields, self.quoted) if f or q]


class Shell:
    """A reader over one text (a script, or a fragment of one) sharing its variables."""

    def __init__(self, text: str, env: dict[str, str], taint: dict[str, set[str]],
                 source: str, line: int = 1, depth: int = 0, expanded: list[int] | None = None):
        self.text, self.i, self.line = text, 0, line
        self.env, self.taint, self.source = env, taint, source
        self.heredocs: list[tuple[str, bool]] = []
        self.positional = False
        self.depth = depth  # expansions inside expansions (${X:-${Y:-...}})
        self.expanded = [0] if expanded is None else expanded  # characters expanded, shared

    # --- errors and helpers ---------------------------------------------------------------

    def fail(self, message: str):
        raise PlanInputError(f"{self.source} line {self.line}: {message}")

    def peek(self, offset: int = 0) -> str:
        j = self.i + offset
        return self.text[j] if j < len(self.text) else ""

    def bound(self, message: str):
        raise ResourceLimitError(f"{self.source} line {self.line}: {message}")

    def child(self, text: str) -> "Shell":
        if self.depth >= MAX_EXPANSION_DEPTH:
            self.bound(f"expansions nested more than {MAX_EXPANSION_DEPTH} deep "
                       f"(${{X:-${{Y:-...}}}}); the bound is {MAX_EXPANSION_DEPTH}")
        return Shell(text, self.env, self.taint, self.source, self.line, self.depth + 1,
                     self.expanded)

    def lookup(self, name: str) -> tuple[str, set[str]]:
        if name in self.env:
            value = self.env[name]
            self.expanded[0] += len(value)
            if self.expanded[0] > MAX_EXPANDED_CHARS:
                self.bound(f"variables expand to more than {MAX_EXPANDED_CHARS:,} characters "
                           f"in all; the bound is {MAX_EXPANDED_CHARS:,}")
            return value, set(self.taint.get(name, ()))
        return "", {name}

    def assign(self, name: str, value: str, taint: set[str]) -> None:
        if len(value) > MAX_VARIABLE_CHARS:
            self.bound(f"${name} would hold {len(value):,} characters; the bound is "
                       f"{MAX_VARIABLE_CHARS:,}")
        self.env[name] = value
        if taint:
            self.taint[name] = set(taint)
        else:
            self.taint.pop(name, None)

    # --- expansions ------------------------------------------------------------------------

    def _matching(self, open_char: str, close_char: str, start: int) -> int:
        """Index of the bracket closing the one before ``start`` (quotes respected)."""
        depth, j, quote = 1, start, ""
        while j < len(self.text):
            c = self.text[j]
            if quote:
                if c == "\\" and quote == '"':
                    j += 1
                elif c == quote:
                    quote = ""
            elif c == "\\":
                j += 1
            elif c in "'\"":
                quote = c
            elif c == open_char:
                depth += 1
                if depth > MAX_EXPANSION_DEPTH:  # found on the first scan, not level by level
                    self.bound(f"{open_char!r} nested more than {MAX_EXPANSION_DEPTH} deep "
                               f"(e.g. ${{X:-${{Y:-...}}}}); the bound is "
                               f"{MAX_EXPANSION_DEPTH}")
            elif c == close_char:
                depth -= 1
                if depth == 0:
                    return j
            j += 1
        self.fail(f"unterminated {open_char!r} in {self.text[start - 2:start + 30]!r}")

    def fragment(self) -> tuple[str, set[str]]:
        """The whole text as one word: quotes removed, expansions done, no splitting."""
        out, taint = [], set()
        while self.i < len(self.text):
            c = self.peek()
            if c == "\\":
                out.append(self.peek(1))
                self.i += 2
            elif c == "'":
                end = self.text.find("'", self.i + 1)
                if end < 0:
                    self.fail("unterminated single quote")
                out.append(self.text[self.i + 1:end])
                self.i = end + 1
            elif c == '"':
                value, more = self.double_quoted()
                out.append(value)
                taint |= more
            elif c == "$":
                value, more = self.dollar()
                out.append(value)
                taint |= more
            else:
                out.append(c)
                self.i += 1
        return "".join(out), taint

    def double_quoted(self) -> tuple[str, set[str]]:
        self.i += 1
        out, taint = [], set()
        while True:
            c = self.peek()
            if not c:
                self.fail('unterminated double quote')
            if c == '"':
                self.i += 1
                return "".join(out), taint
            if c == "\\" and self.peek(1) in ('"', "\\", "$", "`", "\n"):
                if self.peek(1) == "\n":
                    self.line += 1
                else:
                    out.append(self.peek(1))
                self.i += 2
            elif c == "$":
                value, more = self.dollar()
                out.append(value)
                taint |= more
            elif c == "`":
                value, more = self.backquote()
                out.append(value)
                taint |= more
            else:
                if c == "\n":
                    self.line += 1
                out.append(c)
                self.i += 1

    def backquote(self) -> tuple[str, set[str]]:
        end = self.text.find("`", self.i + 1)
        if end < 0:
            self.fail("unterminated backquote")
        command = self.text[self.i:end + 1]
        self.i = end + 1
        return command, {command}

    def dollar(self) -> tuple[str, set[str]]:
        """Expand the ``$...`` at the cursor."""
        nxt = self.peek(1)
        if nxt == "(" and self.peek(2) == "(":
            end = self._matching("(", ")", self.i + 3)
            if self.text[end + 1:end + 2] != ")":
                self.fail("malformed $((...))")
            expression = self.text[self.i + 3:end]
            if len(expression) > MAX_ARITHMETIC_CHARS:  # before any expansion of it
                self.bound(f"arithmetic expression of {len(expression):,} characters; the "
                           f"bound is {MAX_ARITHMETIC_CHARS:,}")
            self.i = end + 2
            return self.arithmetic(expression)
        if nxt == "(":
            end = self._matching("(", ")", self.i + 2)
            command = self.text[self.i:end + 1]
            self.i = end + 1
            return command, {command}
        if nxt == "{":
            end = self._matching("{", "}", self.i + 2)
            inner = self.text[self.i + 2:end]
            self.i = end + 1
            return self.braced(inner)
        found = NAME.match(self.text, self.i + 1)
        if found:
            self.i = found.end()
            return self.lookup(found.group())
        if nxt and nxt in "@*#?$!-0123456789":
            self.i += 2
            self.positional = self.positional or nxt in "@*"
            return {"#": "0", "0": self.source}.get(nxt, ""), set()
        self.i += 1
        return "$", set()

    def braced(self, inner: str) -> tuple[str, set[str]]:
        if inner.startswith("#") and NAME.fullmatch(inner[1:]):
            value, taint = self.lookup(inner[1:])
            return str(len(value)), taint
        found = NAME.match(inner) or re.match(r"[@*#?$!\-0-9]", inner)
        if not found:
            self.fail(f"bad substitution ${{{inner}}}")
        name, rest = found.group(), inner[found.end():]
        if not NAME.fullmatch(name):
            return ("0" if name == "#" else ""), set()
        value, taint = self.lookup(name)
        if not rest:
            return value, taint
        op = re.match(r":?[-=+?]", rest)
        if not op:
            # ${VAR/pattern/repl}, ${VAR:0:3}, ...: not evaluated; an error if the command uses it
            return f"${{{inner}}}", {f"${{{inner}}}"}
        word_text = rest[op.end():]
        is_set = name in self.env and (bool(self.env[name]) or not op.group().startswith(":"))
        kind = op.group()[-1]
        if kind == "+":
            return self.child(word_text).fragment() if is_set else ("", set())
        if is_set:
            return value, taint
        if kind == "?":
            return "", {name}
        default, default_taint = self.child(word_text).fragment()
        if kind == "=":
            self.assign(name, default, default_taint)
        return default, default_taint

    def arithmetic(self, expression: str) -> tuple[str, set[str]]:
        """``$((...))`` as bash computes it (64-bit, wrapping), at bounded cost
        (:mod:`planner.verl.arith`)."""
        text, taint = self.child(expression).fragment()

        def variable(name: str) -> str:
            value, more = self.lookup(name)
            taint.update(more)
            return value

        try:
            return str(Arithmetic(variable).evaluate(text)), taint
        except ResourceLimitError as error:
            if str(error).startswith(self.source):
                raise
            self.bound(str(error))
        except ValueError as error:
            if taint:
                return "0", taint
            self.fail(f"cannot evaluate $(({shown(expression, 80)[1:-1]})): {error}")

    # --- words and commands ------------------------------------------------------------------

    def word(self, assignment_position: bool) -> Word | None:
        word = Word()
        start = self.i
        self.positional = False  # "$@" with no arguments is no word at all
        assignment = _ASSIGNMENT.match(self.text, self.i) if assignment_position else None
        split = assignment is None

        def add(value: str, quoted: bool, splittable: bool) -> None:
            if splittable and split:
                pieces = re.split(r"[ \t\n]+", value)
                word.fields[-1] += pieces[0]
                for piece in pieces[1:]:
                    word.fields.append(piece)
                    word.quoted.append(False)
            else:
                word.fields[-1] += value
                word.quoted[-1] = word.quoted[-1] or quoted

        while self.i < len(self.text):
            c = self.peek()
            if c in _WORD_END:
                if c in "<>" and self.text[start:self.i].isdigit():
                    word.raw_digits = True
                break
            if c == "\\":
                if self.peek(1) == "\n":
                    self.line += 1
                else:
                    add(self.peek(1), True, False)
                self.i += 2
            elif c == "'":
                end = self.text.find("'", self.i + 1)
                if end < 0:
                    self.fail("unterminated single quote")
                self.line += self.text.count("\n", self.i, end)
                add(self.text[self.i + 1:end], True, False)
                self.i = end + 1
            elif c == '"':
                value, taint = self.double_quoted()
                add(value, True, False)
                word.taint |= taint
            elif c == "$":
                value, taint = self.dollar()
                add(value, False, True)
                word.taint |= taint
            elif c == "`":
                value, taint = self.backquote()
                add(value, False, True)
                word.taint |= taint
            else:
                add(c, False, False)
                self.i += 1
        if self.positional and word.fields == [""]:
            word.quoted = [False]
        return None if word.raw_digits else word

    def skip_heredocs(self) -> None:
        """After a newline: skip the bodies of here-documents opened on the line."""
        for delimiter, strip_tabs in self.heredocs:
            while self.i < len(self.text):
                end = self.text.find("\n", self.i)
                end = len(self.text) if end < 0 else end
                line = self.text[self.i:end]
                self.i = end + 1
                self.line += 1
                if (line.lstrip("\t") if strip_tabs else line) == delimiter:
                    break
        self.heredocs = []

    def redirection(self) -> None:
        j = self.i
        while j < len(self.text) and self.text[j] in "<>&|-":
            j += 1
        operator_text = self.text[self.i:j]
        self.i = j
        if operator_text.endswith("&") and (self.peek().isdigit() or self.peek() == "-"):
            self.i += 1  # >&2, <&-
            return
        while self.peek() in (" ", "\t"):
            self.i += 1
        target = self.word(False)
        if operator_text.startswith("<<") and target is not None:
            self.heredocs.append(("".join(target.fields), operator_text.endswith("-")))

    def commands(self):
        """Yield ``(line, words)`` for each simple command, applying assignments as it goes.

        Assignments take effect at once, also those prefixed to a command (``A=1 cmd``; bash
        would give them to ``cmd`` only), which does not change how verl's arguments read."""
        words: list[Word] = []
        line = self.line
        started = declaring = False  # a command word was read / it was `export` and the like

        def finish():
            nonlocal words, started, declaring
            done, words, started, declaring = words, [], False, False
            return done

        while self.i < len(self.text):
            c = self.peek()
            if c in " \t":
                self.i += 1
            elif c == "\\" and self.peek(1) == "\n":
                self.i += 2
                self.line += 1
            elif c == "#":  # words swallow a '#' inside them, so this one starts a comment
                end = self.text.find("\n", self.i)
                self.i = len(self.text) if end < 0 else end
            elif c in "\n;&|":
                while self.peek() in ("&", "|") and c in "&|":
                    self.i += 1
                if c in "\n;":
                    self.i += 1
                if c == "\n":
                    self.line += 1
                    self.skip_heredocs()
                if words:
                    yield line, finish()
                started = declaring = False
                line = self.line
            elif c in "<>":
                self.redirection()
            elif c in "()":
                self.i += 1
            else:
                if not words:
                    line = self.line
                start = self.i
                position = not started or declaring
                word = self.word(position)
                assignment = _ASSIGNMENT.match(self.text, start) if position else None
                if word is None:
                    continue
                if assignment:
                    value = "".join(word.fields)[len(assignment.group()):]
                    if assignment.group(2) == "+=":
                        value = self.env.get(assignment.group(1), "") + value
                    self.assign(assignment.group(1), value, word.taint)
                    continue
                if not started:
                    started = True
                    declaring = bool(word.values()) and word.values()[0] in _DECLARE
                words.append(word)
        if words:
            yield line, finish()
