"""GPU catalog, cluster description and local GPU detection.

Units: bytes, bytes per second and FLOP/s throughout; convert to GiB or TB/s only for display.
Bandwidths are *per GPU and per direction* (unidirectional), the figure a ring collective's
bus bandwidth approaches.  ``memory_bytes`` is what NVML reports as total memory for the part,
the number vLLM's ``gpu_memory_utilization`` and PyTorch's allocator work against.
"""

from __future__ import annotations

import difflib
import re
from dataclasses import dataclass

from planner.bounds import MAX_GPUS, MAX_GPUS_PER_NODE, check_number
from planner.errors import PlanInputError
from planner.units import GIB, GIGA, MIB, TERA


@dataclass(frozen=True)
class GpuSpec:
    """One accelerator model.  Peak FLOP/s are dense (no 2:4 sparsity)."""

    name: str
    memory_bytes: int
    bf16_flops: float
    fp8_flops: float  # 0 when the part has no FP8 tensor cores (A100): FP8 then runs at BF16 rate
    hbm_bandwidth_bytes_per_s: float
    nvlink_bandwidth_bytes_per_s: float  # per GPU, per direction; PCIe figure when no NVLink
    inter_node_bandwidth_bytes_per_s: float  # per GPU, per direction (one NIC per GPU)
    nvlink_domain_gpus: int  # GPUs one NVLink/NVSwitch domain connects (8 on HGX, 72 on NVL72)
    host_bandwidth_bytes_per_s: float = 25 * 1e9  # GPU<->CPU per direction (offload traffic)
    # Host RAM per GPU in a typical server of this part (DGX/HGX: 2 TB for 8 GPUs); what verl's
    # offload and Megatron's CPU optimizer fill.  --host-memory-gib overrides it per node.
    host_memory_per_gpu_bytes: int = 256 * GIB
    aliases: tuple[str, ...] = ()
    nvml_names: tuple[str, ...] = ()  # substrings of pynvml.nvmlDeviceGetName() for this part

    def __post_init__(self) -> None:
        for field_name in ("memory_bytes", "bf16_flops", "hbm_bandwidth_bytes_per_s",
                           "nvlink_bandwidth_bytes_per_s", "inter_node_bandwidth_bytes_per_s",
                           "nvlink_domain_gpus"):
            if getattr(self, field_name) <= 0:
                raise ValueError(f"GpuSpec {self.name}: {field_name} must be positive")

    def peak_flops(self, precision: str) -> float:
        if precision == "fp8":
            return self.fp8_flops or self.bf16_flops
        if precision in ("bf16", "fp16"):
            return self.bf16_flops  # every catalog part runs FP16 at the BF16 dense rate
        raise PlanInputError(f"unknown precision {precision!r}; valid: bf16, fp16, fp8")

    @property
    def memory_gib(self) -> float:
        return self.memory_bytes / GIB


# Sources: NVIDIA and AMD data sheets (dense tensor-core rates, i.e. half the "with sparsity"
# figures), NVML-reported totals seen on the parts, NVLink generation bandwidth halved for one
# direction,
# one 200/400/800 Gb/s NIC per GPU for the inter-node figure.  Host bandwidth: PCIe Gen4 x16
# (~25 GB/s achieved) or Gen5 x16 (~50 GB/s); Grace-Blackwell's NVLink-C2C 900 GB/s (bidir) per
# superchip, shared by its two GPUs.  Host RAM: DGX/HGX H100, H200, B200 and the H800/H20 HGX
# servers ship 2 TB for 8 GPUs; DGX A100 and L40S servers 1 TB; a GB200/GB300 compute tray has
# 2 Grace CPUs x 480 GB LPDDR5X for 4 GPUs.
GPU_CATALOG: tuple[GpuSpec, ...] = (
    # A100 SXM4 80GB data sheet: BF16 312 TFLOP/s, HBM2e 2,039 GB/s, NVLink3 600 GB/s (bidir);
    # HDR InfiniBand 200 Gb/s per GPU (DGX A100).  NVML total 81,920 MiB.
    GpuSpec("A100-80GB", 81920 * MIB, 312 * TERA, 0.0, 2039 * GIGA, 300 * GIGA, 25 * GIGA, 8,
            host_bandwidth_bytes_per_s=25 * GIGA, host_memory_per_gpu_bytes=128 * GIB,
            aliases=("a100", "a100-80g", "a100-sxm"),
            nvml_names=("A100-SXM4-80GB", "A100 80GB")),
    # A100 SXM4 40GB (same data sheet): BF16 312 TFLOP/s, HBM2 1,555 GB/s, NVLink3 600 GB/s
    # (bidir); HDR InfiniBand 200 Gb/s per GPU (DGX A100 40GB).  NVML total 40,960 MiB.
    GpuSpec("A100-40GB", 40960 * MIB, 312 * TERA, 0.0, 1555 * GIGA, 300 * GIGA, 25 * GIGA, 8,
            host_bandwidth_bytes_per_s=25 * GIGA, host_memory_per_gpu_bytes=128 * GIB,
            aliases=("a100-40g", "a100-sxm4-40gb"), nvml_names=("A100-SXM4-40GB", "A100 40GB")),
    # H100 SXM5 data sheet: BF16 989 TFLOP/s, FP8 1,979, HBM3 3.35 TB/s, NVLink4 900 GB/s
    # (bidir); NDR 400 Gb/s per GPU (DGX H100).  NVML total 81,559 MiB.
    GpuSpec("H100-80GB", 81559 * MIB, 989 * TERA, 1979 * TERA, 3350 * GIGA, 450 * GIGA, 50 * GIGA,
            8, host_bandwidth_bytes_per_s=50 * GIGA, aliases=("h100", "h100-sxm", "h100-80g"),
            nvml_names=("H100 80GB", "H100-SXM")),
    # H100 PCIe data sheet: BF16 756 TFLOP/s dense (1,513 with sparsity), FP8 1,513, HBM2e 80 GB
    # at 2.0 TB/s; NVLink bridges join only pairs of cards, so collectives across a server's 8
    # GPUs run over PCIe Gen5 x16 (64 GB/s per direction); 200 Gb/s NIC per GPU typical of
    # PCIe servers, which ship 1 TB of host RAM for 8 cards.  NVML total 81,559 MiB.
    GpuSpec("H100-PCIe", 81559 * MIB, 756 * TERA, 1513 * TERA, 2000 * GIGA, 64 * GIGA, 25 * GIGA,
            8, host_bandwidth_bytes_per_s=50 * GIGA, host_memory_per_gpu_bytes=128 * GIB,
            aliases=("h100-pcie-80gb", "h100pcie"), nvml_names=("H100 PCIe",)),
    # H800 (export H100): same SXM5 compute and HBM, NVLink cut to 400 GB/s (bidir); DeepSeek-V3
    # report (arXiv 2412.19437 §3.1) quotes ~160 GB/s achieved NVLink and 50 GB/s IB per GPU.
    GpuSpec("H800", 81559 * MIB, 989 * TERA, 1979 * TERA, 3350 * GIGA, 200 * GIGA, 50 * GIGA, 8,
            host_bandwidth_bytes_per_s=50 * GIGA, aliases=("h800-80gb", "h800-sxm"),
            nvml_names=("H800",)),
    # H20 (export Hopper): BF16 148 TFLOP/s, FP8 296, HBM3 96 GB at 4.0 TB/s, NVLink 900 GB/s.
    GpuSpec("H20-96GB", 97871 * MIB, 148 * TERA, 296 * TERA, 4000 * GIGA, 450 * GIGA, 50 * GIGA, 8,
            host_bandwidth_bytes_per_s=50 * GIGA, aliases=("h20", "h20-96g"), nvml_names=("H20",)),
    # H200 SXM data sheet: H100 compute, HBM3e 141 GB at 4.8 TB/s, NVLink 900 GB/s (bidir).
    GpuSpec("H200", 143771 * MIB, 989 * TERA, 1979 * TERA, 4800 * GIGA, 450 * GIGA, 50 * GIGA, 8,
            host_bandwidth_bytes_per_s=50 * GIGA, aliases=("h200-141gb", "h200-sxm"),
            nvml_names=("H200",)),
    # B200 (HGX/DGX B200): BF16 2.25 PFLOP/s dense, FP8 4.5, HBM3e 180 GB at 8 TB/s, NVLink5
    # 1.8 TB/s (bidir); ConnectX-7 400 Gb/s per GPU.
    GpuSpec("B200", 183359 * MIB, 2250 * TERA, 4500 * TERA, 8000 * GIGA, 900 * GIGA, 50 * GIGA, 8,
            host_bandwidth_bytes_per_s=50 * GIGA, aliases=("b200-180gb",), nvml_names=("B200",)),
    # B300 (HGX B300, Blackwell Ultra): BF16/FP8 dense as B200, HBM3e 288 GB at 8 TB/s,
    # ConnectX-8 800 Gb/s per GPU.
    GpuSpec("B300", 275040 * MIB, 2250 * TERA, 4500 * TERA, 8000 * GIGA, 900 * GIGA, 100 * GIGA, 8,
            host_bandwidth_bytes_per_s=50 * GIGA, aliases=("b300-288gb",), nvml_names=("B300",)),
    # GB200 NVL72 (per GPU): BF16 2.5 PFLOP/s dense, FP8 5, HBM3e 186 GB at 8 TB/s, NVLink5
    # 1.8 TB/s (bidir) across all 72 GPUs of the rack; ConnectX-7 400 Gb/s per GPU.
    GpuSpec("GB200", 189471 * MIB, 2500 * TERA, 5000 * TERA, 8000 * GIGA, 900 * GIGA, 50 * GIGA, 72,
            host_bandwidth_bytes_per_s=225 * GIGA, host_memory_per_gpu_bytes=240 * GIB,
            aliases=("gb200-nvl72",), nvml_names=("GB200",)),
    # GB300 NVL72 (per GPU): BF16 2.5 PFLOP/s dense, FP8 5, HBM3e 288 GB at 8 TB/s, NVLink5
    # 1.8 TB/s across the rack; ConnectX-8 800 Gb/s per GPU.
    GpuSpec("GB300", 284208 * MIB, 2500 * TERA, 5000 * TERA, 8000 * GIGA, 900 * GIGA, 100 * GIGA,
            72,
            host_bandwidth_bytes_per_s=225 * GIGA, host_memory_per_gpu_bytes=240 * GIB,
            aliases=("gb300-nvl72",), nvml_names=("GB300",)),
    # AMD Instinct MI300X data sheet: BF16 1,307.4 TFLOP/s dense (2,614.9 with sparsity), FP8
    # 2,614.9 dense, HBM3 192 GB (8 stacks x 24 GiB) at 5.3 TB/s; Infinity Fabric: 7 links of
    # 128 GB/s (bidir) to the other 7 GPUs of an 8-GPU platform, 448 GB/s per direction in all
    # (RCCL's rings use every link); 400 Gb/s NIC per GPU, PCIe Gen5 x16 to the host.  verl runs
    # on ROCm; NVML does not see AMD parts, so pass --gpu-type.
    GpuSpec("MI300X", 196608 * MIB, 1307.4 * TERA, 2614.9 * TERA, 5300 * GIGA, 448 * GIGA,
            50 * GIGA, 8, host_bandwidth_bytes_per_s=50 * GIGA,
            aliases=("mi300x-192gb", "instinct-mi300x", "mi300"), nvml_names=("MI300X",)),
    # AMD Instinct MI325X data sheet: the MI300X's compute (BF16 1,307.4 TFLOP/s dense, FP8
    # 2,614.9) with HBM3E 256 GB (8 x 32 GiB) at 6.0 TB/s; the same Infinity Fabric platform.
    GpuSpec("MI325X", 262144 * MIB, 1307.4 * TERA, 2614.9 * TERA, 6000 * GIGA, 448 * GIGA,
            50 * GIGA, 8, host_bandwidth_bytes_per_s=50 * GIGA,
            aliases=("mi325x-256gb", "instinct-mi325x", "mi325"), nvml_names=("MI325X",)),
    # L40S data sheet: BF16 362 TFLOP/s dense, FP8 733, GDDR6 48 GB at 864 GB/s, no NVLink
    # (PCIe Gen4 x16, 32 GB/s per direction); 100 GbE per GPU typical.  NVML total 46,068 MiB.
    GpuSpec("L40S", 46068 * MIB, 362 * TERA, 733 * TERA, 864 * GIGA, 32 * GIGA, 12.5 * GIGA, 8,
            host_bandwidth_bytes_per_s=25 * GIGA, host_memory_per_gpu_bytes=128 * GIB,
            aliases=("l40s-48gb",), nvml_names=("L40S",)),
)

DEFAULT_GPU = "H100-80GB"
DEFAULT_GPUS_PER_NODE = 8


def _key(text: str) -> str:
    return re.sub(r"[^a-z0-9]", "", text.lower())


def _gpu_index() -> dict[str, GpuSpec]:
    index: dict[str, GpuSpec] = {}
    for gpu in GPU_CATALOG:
        for alias in (gpu.name, *gpu.aliases):
            index[_key(alias)] = gpu
    return index


def gpu_names() -> list[str]:
    return [gpu.name for gpu in GPU_CATALOG]


def get_gpu(name: str) -> GpuSpec:
    """Look a GPU up by catalog name or alias (case and punctuation ignored)."""
    index = _gpu_index()
    found = index.get(_key(name))
    if found is None:
        close = difflib.get_close_matches(_key(name), list(index), n=3, cutoff=0.5)
        hint = ", ".join(dict.fromkeys(index[c].name for c in close)) or ", ".join(gpu_names())
        raise PlanInputError(f"unknown GPU type {name!r}; closest: {hint}")
    return found


@dataclass(frozen=True)
class ClusterSpec:
    """The GPUs a job runs on: ``num_gpus`` of one ``gpu`` type in nodes of ``gpus_per_node``."""

    gpu: GpuSpec
    num_gpus: int
    gpus_per_node: int = DEFAULT_GPUS_PER_NODE
    host_memory_gib: float | None = None  # host RAM per node; None: the GPU catalog's typical

    def __post_init__(self) -> None:
        check_number("--gpus", self.num_gpus, 1, MAX_GPUS, integer=True)
        check_number("--gpus-per-node", self.gpus_per_node, 1, MAX_GPUS_PER_NODE, integer=True)
        if self.host_memory_gib is not None and not 1 <= self.host_memory_gib <= 1 << 20:
            raise PlanInputError(f"--host-memory-gib {self.host_memory_gib} is outside "
                                 f"1..1048576 (GiB of host RAM per node)")
        if self.num_gpus > self.gpus_per_node and self.num_gpus % self.gpus_per_node:
            raise PlanInputError(
                f"--gpus {self.num_gpus} is not a multiple of --gpus-per-node "
                f"{self.gpus_per_node}; verl places whole nodes (e.g. --gpus "
                f"{self.num_gpus // self.gpus_per_node * self.gpus_per_node} or "
                f"{(self.num_gpus // self.gpus_per_node + 1) * self.gpus_per_node})")

    @property
    def host_memory_per_node_bytes(self) -> float:
        if self.host_memory_gib is not None:
            return self.host_memory_gib * GIB
        return float(self.gpu.host_memory_per_gpu_bytes * min(self.gpus_per_node,
                                                              self.num_gpus))

    @property
    def num_nodes(self) -> int:
        return max(1, self.num_gpus // self.gpus_per_node)

    @property
    def fast_domain_gpus(self) -> int:
        """GPUs reachable over NVLink from any GPU: the node, or the NVL72 rack."""
        return min(self.num_gpus, max(self.gpus_per_node, self.gpu.nvlink_domain_gpus))

    def to_dict(self) -> dict:
        return {"gpu_type": self.gpu.name, "num_gpus": self.num_gpus,
                "gpus_per_node": self.gpus_per_node, "num_nodes": self.num_nodes,
                "gpu_memory_gib": round(self.gpu.memory_gib, 2),
                "host_memory_gib_per_node": round(self.host_memory_per_node_bytes / GIB, 1)}


@dataclass(frozen=True)
class DetectedGpus:
    name: str
    count: int
    memory_bytes: int


def detect_local_gpus() -> DetectedGpus | None:
    """Ask NVML for the local GPUs; ``None`` when NVML (driver or ``pynvml``) is absent."""
    try:
        import pynvml  # from nvidia-ml-py
    except ImportError:
        return None
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError:
        return None
    try:
        count = pynvml.nvmlDeviceGetCount()
        if count == 0:
            return None
        handle = pynvml.nvmlDeviceGetHandleByIndex(0)
        name = pynvml.nvmlDeviceGetName(handle)
        if isinstance(name, bytes):
            name = name.decode()
        memory_bytes = int(pynvml.nvmlDeviceGetMemoryInfo(handle).total)
        return DetectedGpus(name=name, count=count, memory_bytes=memory_bytes)
    finally:
        pynvml.nvmlShutdown()


def gpu_from_detected(detected: DetectedGpus) -> GpuSpec:
    """Match an NVML device name to the catalog; unknown parts are an input error."""
    # Longest token first, so "NVIDIA H200" is not taken for an H20.
    tokens = sorted(((token, gpu) for gpu in GPU_CATALOG for token in gpu.nvml_names),
                    key=lambda pair: -len(pair[0]))
    for token, gpu in tokens:
        if token.lower() in detected.name.lower():
            return gpu
    raise PlanInputError(
        f"local GPU {detected.name!r} is not in the catalog; pass --gpu-type "
        f"(one of: {', '.join(gpu_names())})")
