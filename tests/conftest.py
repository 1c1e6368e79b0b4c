import warnings

import pytest

from planner.hardware import ClusterSpec, get_gpu
from planner.workload import GrpoWorkload

warnings.filterwarnings("ignore", message=".*Transformer Engine and Apex are not installed.*")


@pytest.fixture
def h100():
    return get_gpu("H100-80GB")


def cluster(num_gpus: int, gpu: str = "H100-80GB", per_node: int = 8) -> ClusterSpec:
    return ClusterSpec(get_gpu(gpu), num_gpus, min(per_node, num_gpus))


@pytest.fixture
def workload():
    return GrpoWorkload()
