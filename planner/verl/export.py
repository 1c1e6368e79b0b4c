"""A planned layout as a runnable verl GRPO job for the Megatron backend.

Targets **verl 0.9.1** (the release CI installs, ``requirements-ci.txt``): the backend is chosen
with ``model_engine=megatron`` on verl's ``ppo_trainer`` config, and only keys that release has
are written (no ``grad_offload``; ``num_layers_in_first/last_pipeline_stage`` are new keys of
``override_transformer_config`` and take Hydra's ``+``).

One function, :func:`job_overrides`, turns (model, cluster, workload, layout) into the Hydra
overrides of ``python3 -m verl.trainer.main_ppo``: the rows of the key map
(:mod:`planner.verl.keymap`) in its order, each converted from its planner field.  The launch
script, the Hydra config file, ``plan-parallel validate``'s round trip and the trials package
all use that list.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any, Sequence

from planner.bounds import check_text
from planner.catalog.hardware import ClusterSpec
from planner.catalog.models import ModelSpec
from planner.catalog.workload import GrpoWorkload
from planner.errors import NoFitError, PlanInputError
from planner.extras import available
from planner.output import colocated_json
from planner.search.layout import Layout
from planner.verl.keymap import (
    ACTOR,
    DTYPE,
    JOB_KEYS,
    PRECISION_DTYPES,
    TOTAL_EPOCHS,
    Paths,
    Source,
    written,
)
from planner.verl.keys import VERL_VERSION

# Environment for the job: why each helps (written into the script as comments).
ENVIRONMENT = (
    ("CUDA_DEVICE_MAX_CONNECTIONS", "1", False,
     "Megatron overlaps TP/SP communication with compute only with one CUDA connection "
     "(verl sets it too on Hopper/Ampere)"),
    ("NCCL_NVLS_ENABLE", "0", True,
     "NVLink SHARP buffers take GPU memory that the actor and vLLM share"),
    ("TORCH_NCCL_AVOID_RECORD_STREAMS", "1", False,
     "free NCCL tensors when the collective ends, not when the stream next syncs"),
    ("HYDRA_FULL_ERROR", "1", False, "full stack traces from Hydra"),
)


@dataclass(frozen=True)
class Setting:
    """One verl config value; ``new`` when verl's config lacks the key (Hydra needs ``+``)."""

    key: str
    value: Any
    new: bool = False
    quoted: bool = False  # a path: always a Hydra quoted string (see hydra_quoted)

    def override(self) -> str:
        value = hydra_quoted(self.value) if self.quoted else hydra_value(self.value)
        return f"{'+' if self.new else ''}{self.key}={value}"


_PLAIN = re.compile(r"^[A-Za-z0-9_./:@~\-][A-Za-z0-9_./:@~\-+]*$")


def hydra_value(value: Any) -> str:
    """A Python value in Hydra's override grammar."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "True" if value else "False"
    if isinstance(value, (int, float)):
        return repr(value)
    if isinstance(value, (list, tuple)):
        return "[" + ",".join(hydra_value(item) for item in value) + "]"
    text = str(value)
    if _PLAIN.match(text) and text.lower() not in ("null", "true", "false"):
        return text
    if "${" in text and "'" not in text:
        return text  # an interpolation Hydra resolves itself
    return hydra_quoted(text)


# Hydra's quoted strings (hydra.cc, "Escaped characters in quoted values"): a quote is
# escaped with a backslash, backslashes are escaped (doubled) only right before a quote or at
# the end of the string; any other backslash is literal.
_BACKSLASHES_BEFORE_QUOTE_OR_END = re.compile(r"(\\+)(?='|$)")


def hydra_quoted(text: str) -> str:
    """``text`` as a single-quoted string of Hydra's override grammar: spaces, commas, ``=``,
    brackets and non-ASCII characters are all kept as they are (``${...}`` still
    interpolates, as anywhere in OmegaConf)."""
    body = _BACKSLASHES_BEFORE_QUOTE_OR_END.sub(lambda m: m.group(1) * 2, str(text))
    return "'" + body.replace("'", "\\'") + "'"


def _unquoted(text: str) -> str:
    """The inverse of :func:`hydra_quoted` for a ``'...'`` or ``"..."`` string."""
    quote, body = text[0], text[1:-1]
    return re.sub(r"(\\+)(" + quote + "|$)",
                  lambda m: "\\" * (len(m.group(1)) // 2) + m.group(2), body)


_INT = re.compile(r"^[+-]?\d+$")
_FLOAT = re.compile(r"^[+-]?(\d+\.\d*|\.\d+|\d+)([eE][+-]?\d+)?$|^[+-]?(inf|nan)$", re.IGNORECASE)


def _split_top_level(text: str) -> list[str]:
    """Comma-separated items of a Hydra list body, commas inside quotes or brackets kept."""
    items, depth, quote, start = [], 0, "", 0
    for i, char in enumerate(text):
        if quote:
            if char == quote and text[i - 1] != "\\":
                quote = ""
        elif char in "'\"":
            quote = char
        elif char in "[{(":
            depth += 1
        elif char in "]})":
            depth -= 1
        elif char == "," and depth == 0:
            items.append(text[start:i])
            start = i + 1
    items.append(text[start:])
    return [item.strip() for item in items if item.strip()]


def override_value(text: str) -> Any:
    """A Hydra override's value as Python data: Hydra's own parser when it is installed, else
    the same reading of the grammar's common forms (null, booleans, numbers, quoted strings,
    lists) -- the inverse of :func:`hydra_value`, so exports need no Hydra."""
    if available("hydra"):
        from hydra.core.override_parser.overrides_parser import OverridesParser

        return OverridesParser.create().parse_override(f"key={text}").value()
    text = text.strip()
    if text.lower() == "null":
        return None
    if text.lower() in ("true", "false"):
        return text.lower() == "true"
    if _INT.match(text):
        return int(text)
    if _FLOAT.match(text):
        return float(text)
    if len(text) >= 2 and text[0] == text[-1] and text[0] in "'\"":
        return _unquoted(text)
    if text.startswith("[") and text.endswith("]"):
        return [override_value(item) for item in _split_top_level(text[1:-1])]
    return text


def job_settings(model: ModelSpec, cluster: ClusterSpec, workload: GrpoWorkload,
                 layout: Layout, *, model_path: str, train_files: str,
                 val_files: str) -> list[Setting]:
    """Every verl setting of the GRPO job, in the order the launch script lists them: the rows
    of :data:`planner.verl.keymap.JOB_KEYS` the layout and workload write."""
    if not workload.has_rollout:
        raise PlanInputError("a verl job needs a GRPO workload, not --workload "
                             f"{workload.kind}")
    if workload.precision not in PRECISION_DTYPES:
        raise PlanInputError(f"--precision {workload.precision} cannot be exported: verl "
                             f"{VERL_VERSION}'s Megatron engine trains in bf16 or fp16 "
                             f"({DTYPE.key[len(ACTOR) + 1:]})")
    source = Source(model=model, cluster=cluster, workload=workload, layout=layout,
                    paths=Paths(model_path, train_files, val_files))
    return settings(JOB_KEYS, source)


def settings(rows, source: Source) -> list[Setting]:
    """The settings ``rows`` of the key map write for ``source``."""
    return [Setting(row.key, value, new=row.new, quoted=row.quoted)
            for row, value in written(rows, source)]


def override_key(override: str) -> str:
    """The config key an override sets (``+a.b=1`` -> ``a.b``)."""
    text = override.lstrip("+~")
    return text.split("=", 1)[0].strip()


def check_overrides(overrides: Sequence[str]) -> list[str]:
    """``--override`` values: KEY=VALUE, and (Hydra installed) each one parsed by Hydra's own
    override parser, so a value verl's command line would refuse (``$(oops)``, unbalanced
    quotes) is refused here, before any planning or trial -- every bad one named."""
    for item in overrides:  # a newline would end the launch script's line: its own message
        check_text("--override", item, max_chars=1 << 16, what="KEY=VALUE")
    bad = [item for item in overrides
           if not re.match(r"^(\+{0,2}|~)[A-Za-z_][\w.@/\-]*(=|$)", item)
           or (not item.startswith("~") and "=" not in item)]
    if bad:
        raise PlanInputError(f"--override {bad[0]!r} is not KEY=VALUE (Hydra override syntax, "
                             f"e.g. {TOTAL_EPOCHS.key}=5 or +key.new=1)")
    problems = hydra_syntax_problems(overrides)
    if problems:
        raise PlanInputError("; ".join(problems) + " (quote values with spaces or shell "
                                                   "characters: key='a b')")
    return list(overrides)


# Hydra 1.3's override lexer in value mode (hydra/grammar/OverrideLexer.g4): quoted values,
# ``${...}`` interpolations, escapes, whitespace, the grammar's punctuation and the characters
# it allows in unquoted strings.  Anything else is the lexer's "token recognition error".
_HYDRA_VALUE_TOKEN = re.compile(
    r"""'(?:\\\\)*'|'.*?[^\\](?:\\\\)*'"""          # single-quoted
    r'''|"(?:\\\\)*"|".*?[^\\](?:\\\\)*"'''         # double-quoted
    r"|\$\{[^}]+\}"                                 # interpolation
    r"|(?:\\\\|\\[()\[\]{}:=, \t])+"                # escapes
    r"|[A-Za-z0-9_/\-\\+.$%*@?|]+|[ \t]+|[\[\]{}(),:=]")
# the functions Hydra's grammar may call in a value (hydra/_internal/grammar/grammar_functions)
_HYDRA_FUNCTIONS = ("choice", "range", "interval", "sort", "shuffle", "tag", "glob",
                    "str", "int", "float", "bool", "extend_list")


def _hydra_lexer_problem(override: str) -> str | None:
    """Without Hydra installed: the first thing Hydra's lexer or grammar would refuse in
    ``override``'s value (a character outside the grammar, an unbalanced quote, a call of a
    function Hydra does not define), in Hydra's own words; None when it reads."""
    value = override.split("=", 1)[1] if "=" in override else ""
    position = 0
    while position < len(value):
        token = _HYDRA_VALUE_TOKEN.match(value, position)
        if token is None:
            rest = value[position:] if value[position] in "'\"" else value[position]
            return f"token recognition error at: {rest[:40]!r}"
        if token.group() == "(":
            called = re.search(r"([A-Za-z_]\w*)[ \t]*$", value[:position])
            if called is None or called.group(1) not in _HYDRA_FUNCTIONS:
                return "mismatched input '(' expecting <EOF>"
        position = token.end()
    return None


def hydra_syntax_problems(overrides: Sequence[str]) -> list[str]:
    """One message per override Hydra's parser refuses.  Without Hydra installed (the base
    install), the same refusals from its lexer's rules (:func:`_hydra_lexer_problem`)."""
    if not available("hydra"):
        return [f"--override {item[:120]!r} is not valid Hydra syntax ({problem})"
                for item in overrides
                if (problem := _hydra_lexer_problem(item)) is not None]
    from hydra.core.override_parser.overrides_parser import OverridesParser

    parser, out = OverridesParser.create(), []
    for item in overrides:
        try:
            parser.parse_override(item)
        except Exception as error:  # noqa: BLE001 - Hydra's parse errors vary in type
            text = str(error).strip().splitlines()
            out.append(f"--override {item[:120]!r} is not valid Hydra syntax "
                       f"({text[0][:120] if text else type(error).__name__})")
    return out


def merge_overrides(base: Sequence[str], extra: Sequence[str]) -> list[str]:
    """``base`` with ``extra`` applied: an extra override of a key already set replaces it in
    place (Hydra would take the last one anyway); new keys are appended."""
    out = list(base)
    index = {override_key(item): i for i, item in enumerate(out)}
    for item in check_overrides(extra):
        key = override_key(item)
        if key in index:
            out[index[key]] = item
        else:
            index[key] = len(out)
            out.append(item)
    return out


def job_overrides(model: ModelSpec, cluster: ClusterSpec, workload: GrpoWorkload,
                  layout: Layout, *, model_path: str, train_files: str, val_files: str,
                  extra: Sequence[str] = ()) -> list[str]:
    """The Hydra overrides of ``python3 -m verl.trainer.main_ppo`` for this layout (verl 0.9.1,
    Megatron backend), ``extra`` applied last."""
    job = job_settings(model, cluster, workload, layout, model_path=model_path,
                       train_files=train_files, val_files=val_files)
    return merge_overrides([setting.override() for setting in job], extra)


# --- the exported job ---------------------------------------------------------------------


@dataclass(frozen=True)
class ExportedJob:
    """Everything the three exported files say, from one planned layout."""

    model: ModelSpec
    cluster: ClusterSpec
    workload: GrpoWorkload
    layout: Layout
    prediction: dict  # what plan.json records (planner.output.prediction_json)
    rank: int = 1
    model_path: str | None = None  # None: $MODEL_PATH, default $HOME/models/<model>
    train_files: str | None = None
    val_files: str | None = None
    extra: tuple[str, ...] = field(default_factory=tuple)
    # training mode (planner/placement.py): "sync" is verl.trainer.main_ppo; the asynchronous
    # modes run on the trainer pool (``cluster``) with ``mode_overrides`` (pools, async keys)
    mode: str = "sync"
    mode_overrides: tuple[str, ...] = field(default_factory=tuple)

    def __post_init__(self) -> None:
        # Every name written into run_grpo.sh (also in its comments) and grpo.yaml: a newline
        # or other control character would become a live line of the script.  Refused here,
        # whatever the value came from (a flag, $MODEL_PATH, a job's model.path).
        check_text("the model name", self.model.name, what="a model name")
        for flag, value in (("--model-path", self.model_path),
                            ("--train-files", self.train_files),
                            ("--val-files", self.val_files)):
            if value is not None:
                check_text(flag, value, what="a path")
        for item in self.extra:
            check_text("--override", item, max_chars=1 << 16, what="KEY=VALUE")

    def overrides(self, values: dict[str, str]) -> list[str]:
        """The job's overrides with ``values`` for MODEL_PATH, TRAIN_FILES and VAL_FILES."""
        return job_overrides(self.model, self.cluster, self.workload, self.layout,
                             model_path=values["MODEL_PATH"], train_files=values["TRAIN_FILES"],
                             val_files=values["VAL_FILES"],
                             extra=(*self.mode_overrides, *self.extra))


def job_from_plan(plan, rank: int = 1, *, model_path: str | None = None,
                  train_files: str | None = None, val_files: str | None = None,
                  extra_overrides: Sequence[str] = ()) -> ExportedJob:
    fitting = int(plan.candidates["fits"].sum())  # of the ranked layouts the plan keeps
    if not fitting:
        raise NoFitError("no layout fits in GPU memory; nothing to export")
    if not 1 <= rank <= fitting:
        kept = (f" (the plan keeps the first {fitting} of its {plan.fitting_count})"
                if plan.fitting_count > fitting else "")
        raise PlanInputError(f"--rank {rank} is outside the {fitting} layouts that fit{kept} "
                             f"(valid: 1..{fitting})")
    candidate = plan.candidate(rank - 1)
    return ExportedJob(model=plan.model, cluster=plan.cluster, workload=plan.workload,
                       layout=candidate.layout, prediction=colocated_json(candidate), rank=rank,
                       model_path=model_path, train_files=train_files, val_files=val_files,
                       extra=tuple(check_overrides(extra_overrides)))
