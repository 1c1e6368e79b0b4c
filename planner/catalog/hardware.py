"""GPU catalog, cluster description and local GPU detection.

Units: bytes, bytes per second and FLOP/s throughout; convert to GiB or TB/s only for display.
Bandwidths are *per GPU and per direction* (unidirectional), the figure a ring collective's
bus bandwidth approaches.  ``memory_bytes`` is what NVML reports as total memory for the part,
the number vLLM's ``gpu_memory_utilization`` and PyTorch's allocator work against.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from planner.bounds import MAX_GPUS, MAX_GPUS_PER_NODE, check_number
from planner.errors import PlanInputError
from planner.units import GIB, GIGA, MIB, TERA


@dataclass(frozen=True)
class GpuSpec:
    """One accelerator model.  Peak FLOP/s are dense (no 2:4 sparsity) tensor-core rates with
    FP32 accumulation, the mode training runs in."""

    name: str
    memory_bytes: int
    bf16_flops: float  # the 16-bit tensor rate: BF16, or FP16 on a part without BF16 (``bf16``)
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
    # CUDA compute capability (major, minor); None for non-NVIDIA parts (ROCm).  What a rollout
    # engine's build runs on (planner/catalog/engines.py) and whether BF16 exists (sm_80+).
    compute_capability: tuple[int, int] | None = None
    bf16: bool = True  # False: no BF16 tensor cores (Volta): training and rollout run in FP16

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
            # every catalog part runs FP16 at its BF16 dense rate; a part without BF16 (V100)
            # carries its FP16 rate here, and plans for it are made in FP16
            return self.bf16_flops
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
            compute_capability=(8, 0),
            aliases=("a100", "a100-80g", "a100-sxm"),
            nvml_names=("A100-SXM4-80GB", "A100 80GB")),
    # A100 SXM4 40GB (same data sheet): BF16 312 TFLOP/s, HBM2 1,555 GB/s, NVLink3 600 GB/s
    # (bidir); HDR InfiniBand 200 Gb/s per GPU (DGX A100 40GB).  NVML total 40,960 MiB.
    GpuSpec("A100-40GB", 40960 * MIB, 312 * TERA, 0.0, 1555 * GIGA, 300 * GIGA, 25 * GIGA, 8,
            host_bandwidth_bytes_per_s=25 * GIGA, host_memory_per_gpu_bytes=128 * GIB,
            compute_capability=(8, 0),
            aliases=("a100-40g", "a100-sxm4-40gb"), nvml_names=("A100-SXM4-40GB", "A100 40GB")),
    # H100 SXM5 data sheet: BF16 989 TFLOP/s, FP8 1,979, HBM3 3.35 TB/s, NVLink4 900 GB/s
    # (bidir); NDR 400 Gb/s per GPU (DGX H100).  NVML total 81,559 MiB.
    GpuSpec("H100-80GB", 81559 * MIB, 989 * TERA, 1979 * TERA, 3350 * GIGA, 450 * GIGA, 50 * GIGA,
            8, host_bandwidth_bytes_per_s=50 * GIGA,
            compute_capability=(9, 0), aliases=("h100", "h100-sxm", "h100-80g"),
            nvml_names=("H100 80GB", "H100-SXM")),
    # H100 PCIe data sheet: BF16 756 TFLOP/s dense (1,513 with sparsity), FP8 1,513, HBM2e 80 GB
    # at 2.0 TB/s; NVLink bridges join only pairs of cards, so collectives across a server's 8
    # GPUs run over PCIe Gen5 x16 (64 GB/s per direction); 200 Gb/s NIC per GPU typical of
    # PCIe servers, which ship 1 TB of host RAM for 8 cards.  NVML total 81,559 MiB.
    GpuSpec("H100-PCIe", 81559 * MIB, 756 * TERA, 1513 * TERA, 2000 * GIGA, 64 * GIGA, 25 * GIGA,
            8, host_bandwidth_bytes_per_s=50 * GIGA, host_memory_per_gpu_bytes=128 * GIB,
            compute_capability=(9, 0),
            aliases=("h100-pcie-80gb", "h100pcie"), nvml_names=("H100 PCIe",)),
    # H800 (export H100): same SXM5 compute and HBM, NVLink cut to 400 GB/s (bidir); DeepSeek-V3
    # report (arXiv 2412.19437 §3.1) quotes ~160 GB/s achieved NVLink and 50 GB/s IB per GPU.
    GpuSpec("H800", 81559 * MIB, 989 * TERA, 1979 * TERA, 3350 * GIGA, 200 * GIGA, 50 * GIGA, 8,
            host_bandwidth_bytes_per_s=50 * GIGA,
            compute_capability=(9, 0), aliases=("h800-80gb", "h800-sxm"),
            nvml_names=("H800",)),
    # H20 (export Hopper): BF16 148 TFLOP/s, FP8 296, HBM3 96 GB at 4.0 TB/s, NVLink 900 GB/s.
    GpuSpec("H20-96GB", 97871 * MIB, 148 * TERA, 296 * TERA, 4000 * GIGA, 450 * GIGA, 50 * GIGA, 8,
            host_bandwidth_bytes_per_s=50 * GIGA,
            compute_capability=(9, 0), aliases=("h20", "h20-96g"), nvml_names=("H20",)),
    # H200 SXM data sheet: H100 compute, HBM3e 141 GB at 4.8 TB/s, NVLink 900 GB/s (bidir).
    GpuSpec("H200", 143771 * MIB, 989 * TERA, 1979 * TERA, 4800 * GIGA, 450 * GIGA, 50 * GIGA, 8,
            host_bandwidth_bytes_per_s=50 * GIGA,
            compute_capability=(9, 0), aliases=("h200-141gb", "h200-sxm"),
            nvml_names=("H200",)),
    # B200 (HGX/DGX B200): BF16 2.25 PFLOP/s dense, FP8 4.5, HBM3e 180 GB at 8 TB/s, NVLink5
    # 1.8 TB/s (bidir); ConnectX-7 400 Gb/s per GPU.
    GpuSpec("B200", 183359 * MIB, 2250 * TERA, 4500 * TERA, 8000 * GIGA, 900 * GIGA, 50 * GIGA, 8,
            host_bandwidth_bytes_per_s=50 * GIGA,
            compute_capability=(10, 0), aliases=("b200-180gb",), nvml_names=("B200",)),
    # B300 (HGX B300, Blackwell Ultra): BF16/FP8 dense as B200, HBM3e 288 GB at 8 TB/s,
    # ConnectX-8 800 Gb/s per GPU.
    GpuSpec("B300", 275040 * MIB, 2250 * TERA, 4500 * TERA, 8000 * GIGA, 900 * GIGA, 100 * GIGA, 8,
            host_bandwidth_bytes_per_s=50 * GIGA,
            compute_capability=(10, 3), aliases=("b300-288gb",), nvml_names=("B300",)),
    # GB200 NVL72 (per GPU): BF16 2.5 PFLOP/s dense, FP8 5, HBM3e 186 GB at 8 TB/s, NVLink5
    # 1.8 TB/s (bidir) across all 72 GPUs of the rack; ConnectX-7 400 Gb/s per GPU.
    GpuSpec("GB200", 189471 * MIB, 2500 * TERA, 5000 * TERA, 8000 * GIGA, 900 * GIGA, 50 * GIGA, 72,
            host_bandwidth_bytes_per_s=225 * GIGA, host_memory_per_gpu_bytes=240 * GIB,
            compute_capability=(10, 0),
            aliases=("gb200-nvl72",), nvml_names=("GB200",)),
    # GB300 NVL72 (per GPU): BF16 2.5 PFLOP/s dense, FP8 5, HBM3e 288 GB at 8 TB/s, NVLink5
    # 1.8 TB/s across the rack; ConnectX-8 800 Gb/s per GPU.
    GpuSpec("GB300", 284208 * MIB, 2500 * TERA, 5000 * TERA, 8000 * GIGA, 900 * GIGA, 100 * GIGA,
            72,
            host_bandwidth_bytes_per_s=225 * GIGA, host_memory_per_gpu_bytes=240 * GIB,
            compute_capability=(10, 3),
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
            compute_capability=(8, 9),
            aliases=("l40s-48gb",), nvml_names=("L40S",)),
    # --- the cards small RL jobs still run on (issue 26) ----------------------------------------
    # NVIDIA Tesla V100 data sheet (SXM2): 125 TFLOP/s tensor (FP16 in, FP32 accumulate; Volta
    # has no BF16 and no 2:4 sparsity), HBM2 16 or 32 GB at 900 GB/s, NVLink2 300 GB/s (bidir;
    # DGX-1's hybrid cube mesh joins all 8), PCIe Gen3 x16 to the host (~12 GB/s achieved of
    # 16); DGX-1V: 4 x 100 Gb/s EDR InfiniBand for 8 GPUs, 512 GB of host RAM.  NVML totals
    # 16,160 and 32,510 MiB.  Compute capability 7.0 (sm_70).
    GpuSpec("V100-16GB", 16160 * MIB, 125 * TERA, 0.0, 900 * GIGA, 150 * GIGA, 6.25 * GIGA, 8,
            host_bandwidth_bytes_per_s=12 * GIGA, host_memory_per_gpu_bytes=64 * GIB,
            compute_capability=(7, 0), bf16=False,
            aliases=("v100-16g", "v100-sxm2-16gb", "tesla-v100-16gb"),
            nvml_names=("V100-SXM2-16GB",)),
    GpuSpec("V100-32GB", 32510 * MIB, 125 * TERA, 0.0, 900 * GIGA, 150 * GIGA, 6.25 * GIGA, 8,
            host_bandwidth_bytes_per_s=12 * GIGA, host_memory_per_gpu_bytes=64 * GIB,
            compute_capability=(7, 0), bf16=False,
            aliases=("v100", "v100-32g", "v100-sxm2-32gb", "tesla-v100"),
            nvml_names=("V100-SXM2-32GB",)),
    # NVIDIA A10 data sheet: BF16 tensor 125 TFLOP/s dense (250 with sparsity), no FP8, GDDR6
    # 24 GB at 600 GB/s, no NVLink: PCIe Gen4 x16 (32 GB/s per direction) between cards and to
    # the host; 8-card servers as AWS g5.48xlarge: 100 Gb/s for the node, 768 GiB of RAM.
    # NVML total 23,028 MiB.  sm_86.
    GpuSpec("A10", 23028 * MIB, 125 * TERA, 0.0, 600 * GIGA, 32 * GIGA, 1.5625 * GIGA, 8,
            host_bandwidth_bytes_per_s=25 * GIGA, host_memory_per_gpu_bytes=96 * GIB,
            compute_capability=(8, 6), aliases=("a10-24gb", "a10-pcie"), nvml_names=("A10",)),
    # A10G (AWS g5 only; NVIDIA publishes no data sheet): GA102 with 80 SMs tuned for graphics,
    # tensor 70 TFLOP/s dense against the A10's 125, the same 24 GB GDDR6 at 600 GB/s (AWS g5
    # documentation; Baseten, "NVIDIA A10 vs A10G for ML model inference", 2023); g5.48xlarge:
    # 8 cards on PCIe Gen4, 100 Gb/s for the node, 768 GiB of RAM.  NVML total 23,028 MiB.
    GpuSpec("A10G", 23028 * MIB, 70 * TERA, 0.0, 600 * GIGA, 32 * GIGA, 1.5625 * GIGA, 8,
            host_bandwidth_bytes_per_s=25 * GIGA, host_memory_per_gpu_bytes=96 * GIB,
            compute_capability=(8, 6), aliases=("a10g-24gb",), nvml_names=("A10G",)),
    # NVIDIA L4 data sheet: BF16 121 TFLOP/s dense (242 with sparsity), FP8 242.5 (485), GDDR6
    # 24 GB at 300 GB/s, PCIe Gen4 x16; AWS g6.48xlarge: 8 cards, 100 Gb/s for the node, 768 GiB
    # of RAM.  NVML total 23,034 MiB.  sm_89.
    GpuSpec("L4", 23034 * MIB, 121 * TERA, 242.5 * TERA, 300 * GIGA, 32 * GIGA, 1.5625 * GIGA, 8,
            host_bandwidth_bytes_per_s=25 * GIGA, host_memory_per_gpu_bytes=96 * GIB,
            compute_capability=(8, 9), aliases=("l4-24gb",), nvml_names=("L4",)),
    # NVIDIA L40 data sheet: BF16 181 TFLOP/s dense (362 with sparsity), FP8 362 (724), GDDR6
    # 48 GB at 864 GB/s, no NVLink (PCIe Gen4 x16); servers as the L40S's.  NVML total 46,068
    # MiB.  sm_89.
    GpuSpec("L40", 46068 * MIB, 181 * TERA, 362 * TERA, 864 * GIGA, 32 * GIGA, 12.5 * GIGA, 8,
            host_bandwidth_bytes_per_s=25 * GIGA, host_memory_per_gpu_bytes=128 * GIB,
            compute_capability=(8, 9), aliases=("l40-48gb",), nvml_names=("L40",)),
    # GeForce RTX 4090 (NVIDIA Ada Lovelace architecture white paper, appendix table): BF16
    # tensor 165.2 TFLOP/s dense with FP32 accumulate (330.4 with sparsity), FP8 330.3 dense,
    # GDDR6X 24 GB at 1,008 GB/s.  No NVLink, and GeForce drivers disable PCIe peer-to-peer, so
    # NCCL moves data through host memory: about half of PCIe Gen4 x16's 32 GB/s per direction.
    # Workstation-class 8-card servers: 100 Gb/s for the node, 512 GB of RAM.  NVML total 24,564
    # MiB.  sm_89.
    GpuSpec("RTX-4090", 24564 * MIB, 165.2 * TERA, 330.3 * TERA, 1008 * GIGA, 16 * GIGA,
            1.5625 * GIGA, 8, host_bandwidth_bytes_per_s=25 * GIGA,
            host_memory_per_gpu_bytes=64 * GIB, compute_capability=(8, 9),
            aliases=("4090", "rtx4090", "geforce-rtx-4090"), nvml_names=("RTX 4090",)),
    # H20 with 141 GB HBM3e (the 2024 refresh of the export Hopper): the H20's compute (BF16 148
    # TFLOP/s dense, FP8 296) and NVLink 900 GB/s, HBM3e 141 GB at 4.8 TB/s as the H200's (server
    # vendors' listings; NVIDIA publishes no separate data sheet); HGX servers as the H20's.
    # NVML total assumed the H200's 143,771 MiB (the same HBM3e stacks); NVML names it "H20" as
    # the 96 GB part, so detection tells them apart by memory.
    GpuSpec("H20-141GB", 143771 * MIB, 148 * TERA, 296 * TERA, 4800 * GIGA, 450 * GIGA,
            50 * GIGA, 8, host_bandwidth_bytes_per_s=50 * GIGA, compute_capability=(9, 0),
            aliases=("h20-141g", "h20-3e", "h20e"), nvml_names=("H20",)),
    # H200 NVL data sheet: BF16 1,671 TFLOP/s and FP8 3,341 with sparsity (835.5 and 1,670.5
    # dense), HBM3e 141 GB at 4.8 TB/s, NVLink bridges of 2 or 4 cards at 900 GB/s; across a
    # server's 8 cards collectives run over PCIe Gen5 x16 (128 GB/s bidir, 64 per direction),
    # as for the H100 PCIe; one 400 Gb/s NIC per 2 GPUs, 1 TB of host RAM for 8.  NVML total
    # assumed the H200 SXM's 143,771 MiB.
    GpuSpec("H200-NVL", 143771 * MIB, 835.5 * TERA, 1670.5 * TERA, 4800 * GIGA, 64 * GIGA,
            25 * GIGA, 8, host_bandwidth_bytes_per_s=50 * GIGA,
            host_memory_per_gpu_bytes=128 * GIB, compute_capability=(9, 0),
            aliases=("h200nvl", "h200-nvl-141gb"), nvml_names=("H200 NVL",)),
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
        import difflib  # an unknown name's hint alone: not at every start

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


def _names(token: str, device: str) -> bool:
    """``token`` appears in the NVML device name as a name of its own: not inside a longer
    model number ("A10" is not in "A100-PCIE-40GB", "H20" not in "H200")."""
    pattern = rf"(?<![a-z0-9]){re.escape(token.lower())}"
    if token[-1].isdigit():
        pattern += r"(?!\d)"
    return re.search(pattern, device.lower()) is not None


def gpu_from_detected(detected: DetectedGpus) -> GpuSpec:
    """Match an NVML device name to the catalog; unknown parts are an input error.  The longest
    matching name wins ("H200 NVL" over "H200"); parts NVML names alike (the H20's 96 and
    141 GB versions) are told apart by the memory NVML reports."""
    matches = [(len(token), gpu) for gpu in GPU_CATALOG for token in gpu.nvml_names
               if _names(token, detected.name)]
    if matches:
        longest = max(length for length, _ in matches)
        alike = [gpu for length, gpu in matches if length == longest]
        return min(alike, key=lambda gpu: abs(gpu.memory_bytes - detected.memory_bytes))
    raise PlanInputError(
        f"local GPU {detected.name!r} is not in the catalog; pass --gpu-type "
        f"(one of: {', '.join(gpu_names())})")
