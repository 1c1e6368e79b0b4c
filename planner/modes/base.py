"""The contract of a training mode: how verl runs a GRPO step on a cluster, as a plug-in.

A :class:`TrainingMode` is to ``plan-parallel`` what a sampler is to Optuna: an abstract base
whose methods state when they are called and what they return, one module per mode, and a
registry (:mod:`planner.modes.registry`) the CLI, the reports, ``explain`` and ``tune`` loop
over -- none of them names a mode.  The built-in modes are ``sync`` (:mod:`planner.modes.sync`:
verl's hybrid engine, rollout and training take turns on every GPU), ``one-step-off``
(:mod:`planner.modes.one_step_off`) and ``fully-async`` (:mod:`planner.modes.fully_async`),
both on separate pools (:mod:`planner.modes.split`).

A mode object carries the run's settings (:class:`~planner.placement.AsyncOptions`: the
``async_training`` values and the trainer pool sizes to try), is immutable, and is safe to share
between threads; nothing it returns is shared mutable state.
"""

from __future__ import annotations

import abc
from dataclasses import dataclass
from typing import TYPE_CHECKING, ClassVar, Sequence

from planner.cost.request import PlanRequest
from planner.placement import AsyncOptions, ModePlan
from planner.results import Candidate, Staleness
from planner.search.layout import Layout

if TYPE_CHECKING:  # a job is exported on --write only: its modules wait until then
    from planner.verl.export import ExportedJob


@dataclass(frozen=True)
class Launch:
    """What an exported job is launched with: the model and data paths (None: the script reads
    ``$MODEL_PATH``, ``$TRAIN_FILES``, ``$VAL_FILES``) and the user's extra overrides."""

    model_path: str | None = None
    train_files: str | None = None
    val_files: str | None = None
    extra_overrides: Sequence[str] = ()


class TrainingMode(abc.ABC):
    """One way verl runs GRPO training, as the planner plans, estimates, explains and exports
    it.

    Class attributes state what the mode is: :attr:`name` (the ``--mode`` value), a one-line
    :attr:`summary` (how it runs and verl's entry point), whether rollout and training share
    the GPUs (:attr:`colocated`), whether samples lag the policy (:attr:`off_policy`), and the
    parameters a ``tune`` study of it adds to the layout's (:attr:`study_fields`), and the
    settings it reads (:attr:`settings_used`: a ``--mode`` flag for another is refused).

    Methods, each called with a :class:`~planner.cost.request.PlanRequest` (the whole cluster,
    the workload as the user gave it):

    * :meth:`plan` -- ``plan --mode``: every candidate the mode's search finds, best first;
    * :meth:`estimate` -- ``estimate --mode``: one given layout scored as the mode runs it;
    * :meth:`explain` -- ``explain --mode``: the mode's choice in words (a report dict);
    * :meth:`job` -- ``--write``: a candidate of the mode's plan as a runnable verl job;
    * :meth:`staleness`, :meth:`settings_lines`, :meth:`study_variants` -- what reports and
      studies show of it.
    """

    name: ClassVar[str]
    summary: ClassVar[str]
    colocated: ClassVar[bool]
    off_policy: ClassVar[bool]
    study_fields: ClassVar[tuple[str, ...]] = ()
    # the AsyncOptions fields (--mode flags) the mode reads; the CLI refuses the others
    settings_used: ClassVar[tuple[str, ...]] = ()

    def __init__(self, settings: AsyncOptions = AsyncOptions()) -> None:
        self.settings = settings

    def with_settings(self, settings: AsyncOptions) -> "TrainingMode":
        """The same mode with other settings."""
        return type(self)(settings)

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.settings!r})"

    # --- planning -------------------------------------------------------------------------

    @abc.abstractmethod
    def plan(self, request: PlanRequest, top: int | None = None,
             cache: dict | None = None) -> ModePlan:
        """The mode's candidates for ``request``, best first (``top``: at most that many where
        the mode has a long list; ``cache``: pool searches shared with the other modes' plans
        of the same request, as ``--mode best`` plans them).  Raises
        :class:`~planner.errors.PlanInputError` for a workload the mode cannot run."""

    @abc.abstractmethod
    def estimate(self, request: PlanRequest, layout: Layout, pin_rollout: bool):
        """``layout`` scored as the mode runs it (``pin_rollout``: keep its rollout fields, else
        the plan's choice).  Raises :class:`~planner.errors.InvalidLayoutError` listing every
        rule it breaks."""

    @abc.abstractmethod
    def staleness(self) -> Staleness:
        """How many parameter versions a sample can lag the policy it trains."""

    def settings_lines(self, workload) -> list[str]:
        """Lines a report prints under the mode's name (its settings); none by default."""
        return []

    def study_variants(self, grid: Sequence[float]) -> list["TrainingMode"]:
        """The mode objects a ``tune`` study plans (one per value of a setting it tunes, e.g.
        the staleness threshold over ``grid``); the mode itself by default."""
        return [self]

    def study_values(self, candidate: Candidate) -> dict:
        """The :attr:`study_fields` values of one candidate (``trainer_gpus``, ...)."""
        return {}

    # --- explaining -----------------------------------------------------------------------

    @abc.abstractmethod
    def explain(self, request: PlanRequest, plan: ModePlan | None = None) -> dict:
        """``explain --mode``: the mode's choice for ``request`` (with the default search) in
        figures and words, as the report ``--format json`` prints (``plan``: the mode's plan of
        that search, when already made)."""

    @abc.abstractmethod
    def explain_text(self, report: dict) -> str:
        """The report of :meth:`explain` as text."""

    # --- reading a job back (validate) ------------------------------------------------------

    def reads_config(self, config: dict) -> bool:
        """Whether a composed verl config runs this mode (the baseline is the fallback)."""
        return False

    def step_config(self, config: dict) -> dict:
        """The config with ``data.train_batch_size`` = what one step trains (a mode that
        streams sets it otherwise); the config itself by default."""
        return config

    # --- export ---------------------------------------------------------------------------

    @abc.abstractmethod
    def job(self, plan: ModePlan, rank: int, launch: Launch) -> ExportedJob:
        """The candidate ranked ``rank`` among those of ``plan`` that fit, as a runnable verl
        job.  Raises :class:`~planner.errors.PlanInputError` for a rank outside them."""
