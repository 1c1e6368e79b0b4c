"""Shell arithmetic, ``$((...))``, as bash evaluates it -- and at bounded cost.

bash computes in 64-bit signed integers that wrap (``intmax_t``), so ``$((9**9**9))`` is a
number at once, not a 370-million-digit integer: every operation here wraps the same way, and
``**`` squares and multiplies under the wrap.  Variables that hold expressions are evaluated
recursively, as bash does (``A=B+1; $((A))``), each at most once per expression (memoised, so
self-doubling chains cost linear time), and no deeper than the bound bash's own "expression
recursion level exceeded" stands for.

Bounds (:mod:`planner.bounds`): the expression's size, the nesting of parentheses and unary
operators, and the depth of variables referring to variables.  A bound that trips raises
:class:`~planner.errors.ResourceLimitError`; an expression bash would refuse raises
``ValueError`` with bash's words (``division by 0``, ``exponent less than 0``).

Supported: decimal, ``0x`` hex, ``0`` octal and ``base#digits`` literals; ``+ - * / % **``,
``<< >> & ^ | ~``, comparisons, ``! && ||``, ``?:`` and ``,``; unary ``+ - ! ~``.  Assignments
and ``++``/``--`` inside ``$((...))`` are refused (launch scripts do not use them).
"""

from __future__ import annotations

import re
from typing import Callable

from planner.bounds import MAX_ARITHMETIC_CHARS, MAX_ARITHMETIC_NESTING
from planner.errors import ResourceLimitError

_BITS = 64
_MASK = (1 << _BITS) - 1


def wrap(value: int) -> int:
    """``value`` as a 64-bit two's-complement integer (what bash's intmax_t holds)."""
    value &= _MASK
    return value - (1 << _BITS) if value >> (_BITS - 1) else value


_TOKEN = re.compile(r"\s*(?:(?P<number>[0-9][0-9A-Za-z@_#]*)|(?P<name>[A-Za-z_][A-Za-z0-9_]*)|"
                    r"(?P<op>\*\*|<<|>>|<=|>=|==|!=|&&|\|\||\+\+|--|[-+*/%<>&^|!~()?:,=]))")
# binary operators by precedence, loosest first (bash's expr.c)
_LEVELS = (("||",), ("&&",), ("|",), ("^",), ("&",), ("==", "!="), ("<", ">", "<=", ">="),
           ("<<", ">>"), ("+", "-"), ("*", "/", "%"))


def _literal(text: str) -> int:
    """A bash integer constant: decimal, 0x hex, 0 octal, or base#digits (base 2..64)."""
    base, digits = 10, text
    if "#" in text:
        base_text, _, digits = text.partition("#")
        base = int(base_text) if base_text.isdigit() and len(base_text) < 4 else 0
        if not 2 <= base <= 64:
            raise ValueError(f"invalid arithmetic base: {text[:40]}")
    elif len(text) > 1 and text[0] == "0" and text[1] in "xX":
        base, digits = 16, text[2:]
    elif len(text) > 1 and text[0] == "0":
        base, digits = 8, text[1:]
    alphabet = "0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ@_"
    if base <= 36:
        digits = digits.lower()
    value = 0
    for char in digits:  # digit by digit under the wrap, as bash's strlong
        digit = alphabet.find(char)
        if digit < 0 or digit >= base:
            raise ValueError(f"value too great for base (error token is \"{text[:40]}\")")
        value = wrap(value * base + digit)
    if not digits:
        raise ValueError(f"invalid number: {text[:40]}")
    return value


def _power(base: int, exponent: int) -> int:
    if exponent < 0:
        raise ValueError("exponent less than 0")
    result = 1
    while exponent:  # square and multiply, wrapped: at most 63 rounds
        if exponent & 1:
            result = wrap(result * base)
        base = wrap(base * base)
        exponent >>= 1
    return result


def _divide(a: int, b: int, op: str) -> int:
    if b == 0:
        raise ValueError("division by 0")
    quotient = abs(a) // abs(b)
    quotient = quotient if (a < 0) == (b < 0) else -quotient  # C truncates toward zero
    return wrap(quotient) if op == "/" else wrap(a - b * quotient)


_BINARY: dict[str, Callable[[int, int], int]] = {
    "+": lambda a, b: wrap(a + b), "-": lambda a, b: wrap(a - b),
    "*": lambda a, b: wrap(a * b), "**": _power,
    "/": lambda a, b: _divide(a, b, "/"), "%": lambda a, b: _divide(a, b, "%"),
    "<<": lambda a, b: wrap(a << (b & 63)), ">>": lambda a, b: a >> (b & 63),
    "&": lambda a, b: a & b, "^": lambda a, b: a ^ b, "|": lambda a, b: a | b,
    "<": lambda a, b: int(a < b), ">": lambda a, b: int(a > b),
    "<=": lambda a, b: int(a <= b), ">=": lambda a, b: int(a >= b),
    "==": lambda a, b: int(a == b), "!=": lambda a, b: int(a != b),
}


class Arithmetic:
    """One ``$((...))`` evaluation.  ``lookup(name)`` gives a variable's text (``""`` when
    unset); variables holding expressions are evaluated recursively, each once."""

    def __init__(self, lookup: Callable[[str], str], max_depth: int = MAX_ARITHMETIC_NESTING):
        self.lookup = lookup
        self.max_depth = max_depth
        self.nesting = 0  # parentheses, unary operators, ?:, ** and variables, all together
        self.memo: dict[str, int] = {}
        self.active: set[str] = set()

    def evaluate(self, expression: str) -> int:
        if len(expression) > MAX_ARITHMETIC_CHARS:
            raise ResourceLimitError(f"arithmetic expression of {len(expression):,} characters;"
                                     f" the bound is {MAX_ARITHMETIC_CHARS:,}")
        tokens = self._tokens(expression)
        parser = _Parser(tokens, self)
        value = parser.comma(True)
        if parser.at < len(tokens):
            raise ValueError(f"syntax error in expression (error token is "
                             f"\"{' '.join(tokens[parser.at:parser.at + 3])[:40]}\")")
        return value

    @staticmethod
    def _tokens(expression: str) -> list[str]:
        tokens, at = [], 0
        text = expression.rstrip()
        while at < len(text):
            found = _TOKEN.match(text, at)
            if not found or found.end() == at:
                raise ValueError(f"syntax error: operand expected (error token is "
                                 f"\"{text[at:at + 20].strip()}\")")
            tokens.append(found.group(found.lastgroup))
            at = found.end()
        return tokens

    def variable(self, name: str) -> int:
        if name in self.memo:
            return self.memo[name]
        if name in self.active or self.nesting >= self.max_depth:
            raise ResourceLimitError(f"$(({name})): variables refer to variables more than "
                                     f"{self.max_depth} deep (bash: expression recursion level "
                                     f"exceeded); the bound is {self.max_depth}")
        text = self.lookup(name).strip()
        self.active.add(name)
        self.nesting += 1
        try:
            value = self.evaluate(text) if text else 0
        finally:
            self.active.discard(name)
            self.nesting -= 1
        self.memo[name] = value
        return value


class _Parser:
    """Precedence climbing that evaluates as it parses; ``live=False`` parses the side of
    ``&&``/``||``/``?:`` bash skips, without evaluating it (no division-by-zero there)."""

    def __init__(self, tokens: list[str], owner: Arithmetic):
        self.tokens, self.at, self.owner = tokens, 0, owner

    def peek(self) -> str | None:
        return self.tokens[self.at] if self.at < len(self.tokens) else None

    def take(self) -> str:
        token = self.peek()
        if token is None:
            raise ValueError("syntax error: operand expected")
        self.at += 1
        return token

    def nest(self):
        self.owner.nesting += 1
        if self.owner.nesting > self.owner.max_depth:
            raise ResourceLimitError(f"arithmetic nested more than {self.owner.max_depth} "
                                     f"levels deep; the bound is {self.owner.max_depth}")

    def comma(self, live: bool) -> int:
        value = self.ternary(live)
        while self.peek() == ",":
            self.take()
            value = self.ternary(live)
        return value

    def ternary(self, live: bool) -> int:
        condition = self.binary(0, live)
        if self.peek() != "?":
            if self.peek() == "=":
                raise ValueError("assignment inside $((...)) is not read")
            return condition
        self.take()
        self.nest()
        yes = self.comma(live and condition != 0)
        if self.take() != ":":
            raise ValueError("`:' expected for conditional expression")
        no = self.ternary(live and condition == 0)
        self.owner.nesting -= 1
        return (yes if condition else no) if live else 0

    def binary(self, level: int, live: bool) -> int:
        if level == len(_LEVELS):
            return self.power(live)
        left = self.binary(level + 1, live)
        while self.peek() in _LEVELS[level]:
            op = self.take()
            if op == "&&":
                right = self.binary(level + 1, live and left != 0)
                left = int(bool(left) and bool(right)) if live else 0
            elif op == "||":
                right = self.binary(level + 1, live and left == 0)
                left = int(bool(left) or bool(right)) if live else 0
            else:
                right = self.binary(level + 1, live)
                left = _BINARY[op](left, right) if live else 0
        return left

    def power(self, live: bool) -> int:
        base = self.unary(live)
        if self.peek() != "**":
            return base
        self.take()
        self.nest()
        exponent = self.power(live)  # right-associative
        self.owner.nesting -= 1
        return _power(base, exponent) if live else 0

    def unary(self, live: bool) -> int:
        token = self.peek()
        if token in ("-", "+", "!", "~"):
            self.take()
            self.nest()
            value = self.unary(live)
            self.owner.nesting -= 1
            return {"-": lambda v: wrap(-v), "+": lambda v: v, "!": lambda v: int(v == 0),
                    "~": lambda v: ~v}[token](value)
        if token in ("++", "--"):
            raise ValueError(f"{token} inside $((...)) is not read")
        return self.primary(live)

    def primary(self, live: bool) -> int:
        token = self.take()
        if token == "(":
            self.nest()
            value = self.comma(live)
            if self.take() != ")":
                raise ValueError("missing `)'")
            self.owner.nesting -= 1
            return value
        if token[0].isdigit():
            return _literal(token)
        if token[0].isalpha() or token[0] == "_":
            return self.owner.variable(token) if live else 0
        raise ValueError(f"syntax error: operand expected (error token is \"{token}\")")
