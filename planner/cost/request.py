"""What a plan is asked, in one frozen value: :class:`PlanRequest`.

Calculon's three nouns -- the application (model, workload), the system (cluster) and the
execution (the layouts, as columns) -- plus how to search and judge them: the search options,
the cost model (a calibration read once, :class:`~planner.cost.efficiency.CostModel`) and the
memory policy.  The CLI builds one request from its flags; every function below it takes the
request and the columns it transforms.  A variant is a new request
(``dataclasses.replace(request, cluster=pool)`` for one pool of a split), never a loose
argument.

The model a request costs is the model as its workload's sequences run it
(:func:`~planner.catalog.models.model_at_length`): a sliding window or chunk that holds the
longest sequence (prompt + response) is full attention for every cost, as vLLM keeps it.
``given_model`` keeps the model as named, so that a variant with a longer workload windows
again.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

from planner.catalog.hardware import ClusterSpec
from planner.catalog.models import ModelSpec, model_at_length
from planner.catalog.workload import Workload
from planner.cost.efficiency import CostModel, Efficiency, shipped_cost_model
from planner.cost.speculative import check_mtp
from planner.policy import DEFAULT_POLICY, MemoryPolicy
from planner.search.space import SearchOptions

ONE_TOKEN = 1  # every window holds it: model_at_length(model, ONE_TOKEN) has no window left


@dataclass(frozen=True)
class PlanRequest:
    """The model, the cluster, the workload, the search options, the cost model and the memory
    policy of one plan (or estimate, or sizing step)."""

    model: ModelSpec
    cluster: ClusterSpec
    workload: Workload
    options: SearchOptions = SearchOptions()
    cost: CostModel = field(default_factory=shipped_cost_model)
    policy: MemoryPolicy = DEFAULT_POLICY
    # the model as named, where ``model`` turned windows that hold every sequence to full
    # attention (None: nothing turned); carried by dataclasses.replace, read by __post_init__
    given_model: ModelSpec | None = field(default=None, compare=False, repr=False)

    def __post_init__(self) -> None:
        given = self.given_model
        if given is None or model_at_length(given, ONE_TOKEN) \
                != model_at_length(self.model, ONE_TOKEN):
            given = self.model  # a new model (not this request's given one windowed)
        costed = model_at_length(given, self.workload.sequence_length)
        object.__setattr__(self, "model", costed)
        object.__setattr__(self, "given_model", None if costed is given else given)
        # what needs both the model and the workload: MTP on a model without MTP layers
        check_mtp(self.model, self.workload)

    @property
    def efficiency(self) -> Efficiency:
        """The cost model's constants for this cluster's GPU type and the workload's
        precision: how every cost function receives the calibration."""
        return self.cost.efficiency(self.cluster.gpu, self.workload.precision)

    def on(self, cluster: ClusterSpec) -> "PlanRequest":
        """The same request on other GPUs (one pool of a split, one count of a sweep)."""
        return replace(self, cluster=cluster)


class OfRequest:
    """What a result that keeps its ``request`` answers for: the request's model, cluster,
    workload and memory policy, as its own attributes."""

    request: PlanRequest

    @property
    def model(self) -> ModelSpec:
        return self.request.model

    @property
    def cluster(self) -> ClusterSpec:
        return self.request.cluster

    @property
    def workload(self) -> Workload:
        return self.request.workload

    @property
    def policy(self) -> MemoryPolicy:
        return self.request.policy
