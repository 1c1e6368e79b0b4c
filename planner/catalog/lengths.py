"""Response lengths as a distribution over the run: what the time model cannot know in advance.

A GRPO step's time follows the mean response length far more than the maximum
(``data.max_response_length``), and the mean moves during a run: reasoning models often double
it.  :class:`ResponseLengths` holds the mean at the first and the last step of the run (a
trajectory), optionally the 90th percentile within a step, and where the figures came from:

* ``given`` -- ``--response-lengths MEAN[,P90]`` or ``START:END`` (tokens, or percent of the
  maximum with ``%``), or ``--mean-response-length``;
* ``run`` -- read from a previous verl run's metrics (``--lengths-from RUN``,
  :mod:`trials.runs`);
* ``default`` -- nothing given: the published runs' lengths for the kind of job
  (:data:`KINDS`), fitted by ``benchmarks/fit_lengths.py`` to ``grpo_runs.csv`` and stored
  with their source rows in ``planner/catalog/response_lengths.json``.

Shape of the trajectory: linear in steps.  DeepSeek-R1-Zero's training-set mean response length
rises about linearly over ~8k RL steps (Guo et al. 2025, Nature 645, Fig. 1b); replications
also report U-shaped and falling lengths (Liu et al. 2025, arXiv 2503.20783, "Understanding
R1-Zero-like training"), and no published shape is better supported for an unseen job, so a
straight line between the two ends it is.  The default band is not a claim that lengths grow:
it spans the spread of the published runs of the kind (start: their 10th percentile, end:
their 90th), so that both growth and uncertainty land inside it.

The 90th percentile is carried (and shown) but the time model does not use it: its generation
tail follows the mean (roughly exponential lengths, :func:`planner.cost.timing.longest_response`).
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import asdict, dataclass, replace
from functools import cache
from pathlib import Path

from planner.bounds import MAX_TOKENS, check_number, check_text, shown
from planner.errors import PlanInputError

LENGTH_SOURCES = ("given", "default", "run")
DEFAULTS_FILE = "response_lengths.json"
FLAG = "--response-lengths"
MEAN_FLAG = "--mean-response-length"
MAX_SPEC_CHARS = 64  # "START:END" or "MEAN,P90" with room for percentages
SCALES = ("fraction_of_max", "tokens")

# Models that think before answering (a long chain of thought, R1-style), by name: Qwen3's hybrid
# models think by default (enable_thinking) unless they are the Base or Instruct-2507 variants;
# DeepSeek-R1 and its distillations, QwQ, the *-Thinking releases, gpt-oss.
REASONING_MODEL = re.compile(r"qwen3(?!.*(base|instruct))|deepseek-r1|r1-distill|qwq|thinking|"
                             r"gpt-oss", re.IGNORECASE)
REASONING_KIND = "math-reasoning"
DIRECT_KIND = "math"


def job_kind(model_name: str) -> str:
    """The kind of job whose published lengths a plan assumes for ``model_name`` when none are
    given: ``math-reasoning`` for models that think before answering, ``math`` otherwise.
    Every published run behind the defaults is math RL (``grpo_runs.csv``)."""
    return REASONING_KIND if REASONING_MODEL.search(model_name or "") else DIRECT_KIND


@cache
def _defaults() -> dict:
    path = Path(__file__).parent / DEFAULTS_FILE  # as planner.catalog.models._catalog_dir
    return json.loads(path.read_text())


def length_defaults() -> dict:
    """The fitted defaults (a copy): ``{"source": ..., "kinds": {kind: {...}}}``."""
    return json.loads(json.dumps(_defaults()))


def kinds() -> tuple[str, ...]:
    return tuple(sorted(_defaults()["kinds"]))


@dataclass(frozen=True)
class ResponseLengths:
    """Mean response length (tokens) at the first and the last step of a run, linear in steps
    between them, for responses of at most ``max_tokens``."""

    start_tokens: float
    end_tokens: float
    max_tokens: int
    p90_tokens: float = 0.0  # 90th percentile of one step's responses; 0: not given
    source: str = "given"  # given, default, run (LENGTH_SOURCES)
    basis: str = ""  # where the figures come from, in words
    kind: str = ""  # the kind of job a default was taken for

    def __post_init__(self) -> None:
        check_number("--response-length", self.max_tokens, 1, MAX_TOKENS, integer=True)
        for name in ("start_tokens", "end_tokens"):
            value = check_number(f"{FLAG} ({name.split('_')[0]})", getattr(self, name), 0,
                                 MAX_TOKENS)
            if not 1 <= value <= self.max_tokens:
                raise PlanInputError(f"mean response length {value:g} tokens "
                                     f"({name.split('_')[0]}) is outside 1..{self.max_tokens}, "
                                     f"the maximum (--response-length)")
        p90 = check_number(f"{FLAG} (p90)", self.p90_tokens, 0, MAX_TOKENS)
        if p90 and not max(self.start_tokens, self.end_tokens) <= p90 <= self.max_tokens:
            raise PlanInputError(f"{FLAG}: p90 {p90:g} must lie between the mean "
                                 f"({max(self.start_tokens, self.end_tokens):g}) and the maximum "
                                 f"({self.max_tokens}, --response-length)")
        if self.source not in LENGTH_SOURCES:
            raise PlanInputError(f"lengths source {self.source!r} is not one of "
                                 f"{', '.join(LENGTH_SOURCES)}")

    @property
    def mean_tokens(self) -> float:
        """The mean over the run (a straight line's mean is its midpoint)."""
        return (self.start_tokens + self.end_tokens) / 2

    @property
    def constant(self) -> bool:
        return self.start_tokens == self.end_tokens

    def at(self, fraction: float) -> float:
        """The mean response length ``fraction`` (0..1) of the way through the run."""
        return self.start_tokens + (self.end_tokens - self.start_tokens) * float(fraction)

    def describe(self) -> str:
        """The lengths in words, e.g. ``1500->6000 tokens, linear over the run``."""
        if self.constant:
            text = f"{self.start_tokens:.0f} tokens"
        else:
            text = f"{self.start_tokens:.0f}->{self.end_tokens:.0f} tokens, linear over the run"
        if self.p90_tokens:
            text += f", p90 {self.p90_tokens:.0f}"
        return text

    def sentence(self, flags: bool = True) -> str:
        """The line a plan prints about its lengths (and, with ``flags``, the flags that change
        a default)."""
        share = (f"{100 * self.start_tokens / self.max_tokens:.0f}%"
                 if self.constant else
                 f"{100 * self.start_tokens / self.max_tokens:.0f}%->"
                 f"{100 * self.end_tokens / self.max_tokens:.0f}%")
        if self.source == "default":
            return (f"assumed mean response {share} of max ({self.describe()}; "
                    f"{self.basis})" + (f"; pass --lengths-from RUN, {FLAG} or "
                                        f"--mean-response-length" if flags else ""))
        where = "given" if self.source == "given" else f"read from {self.basis}"
        return f"mean response {self.describe()}, {share} of max ({where})"

    def to_dict(self) -> dict:
        return {**asdict(self), "mean_tokens": round(self.mean_tokens, 1)}

    @classmethod
    def fixed(cls, mean_tokens: float, max_tokens: int, basis: str = MEAN_FLAG
              ) -> "ResponseLengths":
        """One mean for the whole run, as given (``--mean-response-length``)."""
        return cls(float(mean_tokens), float(mean_tokens), max_tokens, source="given",
                   basis=basis)

    @classmethod
    def from_dict(cls, data, where: str = "lengths") -> "ResponseLengths":
        """The lengths a JSON output recorded (:meth:`to_dict`; ``mean_tokens`` is derived and
        dropped); a malformed record is one :class:`PlanInputError` naming ``where``."""
        if isinstance(data, cls):
            return data
        if not isinstance(data, dict):
            raise PlanInputError(f"{where} must be a JSON object of response lengths "
                                 f"(start_tokens, end_tokens, max_tokens, ...), not "
                                 f"{type(data).__name__}")
        known = {name: data[name] for name in cls.__dataclass_fields__ if name in data}
        missing = [name for name in ("start_tokens", "end_tokens", "max_tokens")
                   if name not in known]
        if missing:
            raise PlanInputError(f"{where} lacks {', '.join(missing)}")
        for name in ("source", "basis", "kind"):
            if name in known:
                known[name] = check_text(f"{where}.{name}", known[name], max_chars=400,
                                         allow_empty=True)
        return cls(**known)


# --- the documented default ------------------------------------------------------------------


def truncated_mean_tokens(mean_tokens: float, max_tokens: int) -> float:
    """Mean response length once responses are cut at ``max_tokens``, for lengths roughly
    exponential with mean ``mean_tokens`` (the time model's assumption,
    :func:`planner.cost.timing.longest_response`): E[min(L, M)] = mean * (1 - exp(-M / mean)).
    A mean in tokens (the ``math`` kind's) under a maximum near or below it is not the maximum:
    that would be every response cut, which no published run shows (the highest mean is 60% of
    its maximum, DeepSeek-V3 at 1,336 tokens in grpo_runs.csv)."""
    return float(mean_tokens) * -math.expm1(-float(max_tokens) / float(mean_tokens))


def uncut_mean_tokens(cut_mean_tokens: float, max_tokens: int) -> float | None:
    """The mean of the exponential lengths whose cut at ``max_tokens`` has mean
    ``cut_mean_tokens``: the inverse of :func:`truncated_mean_tokens`, solving
    m = mu * (1 - exp(-M / mu)) for mu.  With x = M / mu the cut share m / M = (1 - exp(-x)) / x
    falls monotonically from 1 (x -> 0) to 0, so a share in (0, 1) has one root, found by
    bisection on log x.  ``None`` when ``cut_mean_tokens >= max_tokens`` (saturated: every
    response at the cap, no finite mean explains it)."""
    share = float(cut_mean_tokens) / float(max_tokens)
    if not 0 < share < 1:
        return None
    low, high = -40.0, 40.0  # log x: share(x) ~ 1 at e^-40, ~ e^-40 at e^40
    for _ in range(100):  # 80 / 2^100: exact to double precision
        middle = (low + high) / 2
        x = math.exp(middle)
        if -math.expm1(-x) / x > share:
            low = middle
        else:
            high = middle
    return float(max_tokens) / math.exp((low + high) / 2)


def recut_lengths(lengths: ResponseLengths, run_cap: int | None, max_tokens: int
                  ) -> ResponseLengths:
    """A run's means under a maximum ``max_tokens`` below the longest responses it logged: its
    longer responses would be cut, so each mean is uncut at the run's own cap where it cut some
    (``run_cap``, :func:`uncut_mean_tokens`; as measured where it cut none) and cut at
    ``max_tokens`` as exponential lengths are (:func:`truncated_mean_tokens`), the model
    :func:`default_lengths` applies to the published runs."""
    def cut(mean: float) -> float:
        uncut = uncut_mean_tokens(mean, run_cap) if run_cap else None
        tokens = truncated_mean_tokens(uncut or mean, max_tokens)
        return float(min(max(round(tokens, 1), 1.0), max_tokens))

    return replace(lengths, start_tokens=cut(lengths.start_tokens),
                   end_tokens=cut(lengths.end_tokens), max_tokens=int(max_tokens),
                   p90_tokens=min(lengths.p90_tokens, float(max_tokens)),
                   basis=f"{lengths.basis}; its {lengths.start_tokens:.0f}->"
                         f"{lengths.end_tokens:.0f} tokens cut at this maximum "
                         f"({max_tokens} tokens) as exponential lengths are")


def default_lengths(max_tokens: int, model_name: str = "", kind: str | None = None
                    ) -> ResponseLengths:
    """The published runs' lengths for the kind of job (``kind``, else :func:`job_kind` of the
    model), as a band from their 10th to their 90th percentile; a mean in tokens (fitted uncut,
    :func:`uncut_mean_tokens` of each run's published mean at its own maximum) is cut at
    ``max_tokens`` as exponential lengths are (:func:`truncated_mean_tokens`)."""
    table = _defaults()["kinds"]
    kind = kind or job_kind(model_name)
    if kind not in table:
        raise PlanInputError(f"kind of job {kind!r} is not one of {', '.join(kinds())}")
    entry = table[kind]
    relative = entry["scale"] == "fraction_of_max"

    def tokens(value: float) -> float:
        mean = value * max_tokens if relative else truncated_mean_tokens(value, max_tokens)
        return float(min(max(round(mean), 1), max_tokens))

    basis = f"published {entry['describe']}, {entry['runs']} runs in {_defaults()['source_short']}"
    if not relative and tokens(entry["end"]) < min(entry["end"], max_tokens):
        basis += f"; their {entry['start']:.0f}->{entry['end']:.0f} tokens cut at this maximum"
    return ResponseLengths(start_tokens=tokens(entry["start"]), end_tokens=tokens(entry["end"]),
                           max_tokens=max_tokens, source="default", basis=basis, kind=kind)


# --- --response-lengths ----------------------------------------------------------------------

VALID = ("MEAN[,P90] or START:END in tokens (1..the --response-length) or percent of it "
         "(35%), or a kind of job")


def _tokens(part: str, max_tokens: int, text: str) -> float:
    cleaned = part.strip().replace("_", "")
    percent = cleaned.endswith("%")
    number = cleaned[:-1].strip() if percent else cleaned
    if not re.fullmatch(r"\d{1,9}(\.\d{1,6})?", number):
        raise PlanInputError(f"{FLAG} {shown(text)} is not valid: {shown(part.strip())} is not "
                             f"a number; valid: {VALID} ({', '.join(kinds())})")
    value = float(number) * (max_tokens / 100.0 if percent else 1.0)
    if not 1 <= value <= max_tokens:
        raise PlanInputError(f"{FLAG} {shown(text)}: {part.strip()} is "
                             f"{'%g tokens, ' % value if percent else ''}outside "
                             f"1..{max_tokens} tokens (the --response-length)")
    return value


def parse_response_lengths(text: str, max_tokens: int, model_name: str = ""
                           ) -> ResponseLengths:
    """``--response-lengths``: ``MEAN``, ``MEAN,P90``, ``START:END`` (tokens, or ``N%`` of
    ``max_tokens``), or a kind of job (:func:`kinds`) for its published default.  Bad text is
    one :class:`PlanInputError` naming the flag, the value and what is valid."""
    check_text(FLAG, text, max_chars=MAX_SPEC_CHARS, what=VALID)
    spec = text.strip()
    if spec.lower() in kinds():
        return default_lengths(max_tokens, model_name, kind=spec.lower())
    if spec.count(":") > 1 or spec.count(",") > 1 or (":" in spec and "," in spec):
        raise PlanInputError(f"{FLAG} {shown(text)} is not valid; valid: {VALID} "
                             f"({', '.join(kinds())})")
    if ":" in spec:
        start, end = (_tokens(part, max_tokens, text) for part in spec.split(":"))
        return ResponseLengths(start, end, max_tokens, source="given", basis=FLAG)
    parts = spec.split(",")
    mean = _tokens(parts[0], max_tokens, text)
    p90 = _tokens(parts[1], max_tokens, text) if len(parts) == 2 else 0.0
    if p90 and p90 < mean:
        raise PlanInputError(f"{FLAG} {shown(text)}: p90 {p90:g} is below the mean {mean:g}; "
                             f"the 90th percentile of lengths is at least their mean here "
                             f"(response lengths skew long)")
    return ResponseLengths(mean, mean, max_tokens, p90_tokens=p90, source="given", basis=FLAG)
