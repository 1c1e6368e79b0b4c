"""What a plan is asked, in one frozen value: :class:`PlanRequest`.

Calculon's three nouns -- the application (model, workload), the system (cluster) and the
execution (the layouts, as columns) -- plus how to search and judge them: the search options,
the cost model (a calibration read once, :class:`~planner.cost.efficiency.CostModel`) and the
memory policy.  The CLI builds one request from its flags; every function below it takes the
request and the columns it transforms.  A variant is a new request
(``dataclasses.replace(request, cluster=pool)`` for one pool of a split), never a loose
argument.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

from planner.catalog.hardware import ClusterSpec
from planner.catalog.models import ModelSpec
from planner.catalog.workload import Workload
from planner.cost.efficiency import CostModel, Efficiency, shipped_cost_model
from planner.cost.speculative import check_mtp
from planner.policy import DEFAULT_POLICY, MemoryPolicy
from planner.search.space import SearchOptions


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

    def __post_init__(self) -> None:
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
