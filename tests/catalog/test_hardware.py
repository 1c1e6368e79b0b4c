"""GPU catalog and NVML detection (through a stand-in pynvml module with NVML's API)."""

import sys
import types

import pytest

from planner.catalog.hardware import (
    GPU_CATALOG,
    ClusterSpec,
    detect_local_gpus,
    get_gpu,
    gpu_from_detected,
)
from planner.errors import PlanInputError
from planner.units import GIB

REQUIRED = {"A100-80GB", "A100-40GB", "H100-80GB", "H100-PCIe", "H800", "H20-96GB", "H200",
            "B200", "GB200", "GB300", "L40S", "MI300X", "MI325X"}


def test_catalog_has_required_gpus_with_sane_numbers():
    names = {gpu.name for gpu in GPU_CATALOG}
    assert REQUIRED <= names
    for gpu in GPU_CATALOG:
        assert 15 < gpu.memory_gib < 300  # V100-16GB .. B300
        assert gpu.fp8_flops in (0.0,) or gpu.fp8_flops >= gpu.bf16_flops
        assert gpu.nvlink_bandwidth_bytes_per_s >= gpu.inter_node_bandwidth_bytes_per_s
    assert get_gpu("h100").peak_flops("bf16") == 989e12
    assert get_gpu("a100").peak_flops("fp8") == 312e12  # no FP8 units: BF16 rate


@pytest.mark.parametrize("name,gib,bf16_tflops,hbm_tb_s", [
    ("A100-40GB", 40, 312, 1.555), ("H100-PCIe", 79.6, 756, 2.0),
    ("MI300X", 192, 1307.4, 5.3), ("MI325X", 256, 1307.4, 6.0)])
def test_added_parts_carry_their_data_sheet_figures(name, gib, bf16_tflops, hbm_tb_s):
    gpu = get_gpu(name)
    assert gpu.memory_gib == pytest.approx(gib, abs=0.1)
    assert gpu.bf16_flops == pytest.approx(bf16_tflops * 1e12)
    assert gpu.hbm_bandwidth_bytes_per_s == pytest.approx(hbm_tb_s * 1e12)
    assert gpu.fp8_flops == (0.0 if name.startswith("A100")
                             else pytest.approx(2 * gpu.bf16_flops, rel=1e-3))


def test_nvml_names_tell_pcie_and_40gb_parts_apart():
    from planner.catalog.hardware import DetectedGpus

    for device, name in (("NVIDIA H100 PCIe", "H100-PCIe"), ("NVIDIA H100 80GB HBM3", "H100-80GB"),
                         ("NVIDIA A100-SXM4-40GB", "A100-40GB"),
                         ("NVIDIA A100-SXM4-80GB", "A100-80GB")):
        assert gpu_from_detected(DetectedGpus(device, 8, 0)).name == name


@pytest.mark.parametrize("alias,name", [("h100", "H100-80GB"), ("H20", "H20-96GB"),
                                        ("h200", "H200"), ("gb200-nvl72", "GB200")])
def test_gpu_aliases(alias, name):
    assert get_gpu(alias).name == name


def test_unknown_gpu_suggests():
    with pytest.raises(PlanInputError, match="closest: .*H100"):
        get_gpu("h1000")


def test_cluster_rules():
    with pytest.raises(PlanInputError, match=r"--gpus 0 is not valid; valid: an integer in "
                                             r"1\.\.131,072"):
        ClusterSpec(get_gpu("h100"), 0)
    with pytest.raises(PlanInputError, match="--gpus 9223372036854775808 is not valid"):
        ClusterSpec(get_gpu("h100"), 2**63)  # answered at once, whatever the reader
    with pytest.raises(PlanInputError, match="multiple of --gpus-per-node 8"):
        ClusterSpec(get_gpu("h100"), 12, 8)
    assert ClusterSpec(get_gpu("h100"), 4, 8).num_nodes == 1
    assert ClusterSpec(get_gpu("gb200"), 144, 4).fast_domain_gpus == 72


class FakeNvml(types.ModuleType):
    """Behaves like pynvml: raises NVMLError when no driver, else reports the given devices."""

    class NVMLError(Exception):
        pass

    def __init__(self, devices=None):
        super().__init__("pynvml")
        self.devices = devices
        self.initialised = 0

    def nvmlInit(self):
        if self.devices is None:
            raise self.NVMLError("NVML Shared Library Not Found")
        self.initialised += 1

    def nvmlShutdown(self):
        self.initialised -= 1

    def nvmlDeviceGetCount(self):
        return len(self.devices)

    def nvmlDeviceGetHandleByIndex(self, index):
        return self.devices[index]

    def nvmlDeviceGetName(self, handle):
        return handle[0]

    def nvmlDeviceGetMemoryInfo(self, handle):
        return types.SimpleNamespace(total=handle[1], used=0, free=handle[1])


def test_detects_gpus_through_nvml(monkeypatch):
    fake = FakeNvml([("NVIDIA H200", 143771 * 2**20)] * 8)
    monkeypatch.setitem(sys.modules, "pynvml", fake)
    detected = detect_local_gpus()
    assert detected.count == 8 and detected.name == "NVIDIA H200"
    assert gpu_from_detected(detected).name == "H200"  # not the H20
    assert fake.initialised == 0  # shut down again


def test_no_driver_means_no_detection(monkeypatch):
    monkeypatch.setitem(sys.modules, "pynvml", FakeNvml(None))
    assert detect_local_gpus() is None


def test_unknown_detected_gpu_is_input_error(monkeypatch):
    monkeypatch.setitem(sys.modules, "pynvml", FakeNvml([("NVIDIA RTX 9999", 8 * GIB)]))
    with pytest.raises(PlanInputError, match="--gpu-type"):
        gpu_from_detected(detect_local_gpus())
