"""Which GPUs the pinned rollout engines run on, and which precision a GPU trains in.

verl 0.9.1 (``planner.verl.keys.VERL_VERSION``) pins its rollout engines in its extras: ``vllm``
-> vLLM 0.24.0, ``sglang`` -> SGLang 0.5.12, both on torch 2.11.0, and its ``megatron`` and
``fsdp`` extras pull CUDA 13.0 wheels (``cupy-cuda13x``, ``flash-attn`` cu130) -- a CUDA 13
stack.  What each engine's build runs on:

* vLLM: its ``CMakeLists.txt`` compiles CUDA >= 13.0 builds for compute capability 7.5 and up
  (``CUDA_SUPPORTED_ARCHS "7.5;8.0;8.6;8.7;8.9;9.0;10.0;11.0;12.0"``) and CUDA 12.8/12.9 builds
  from 7.0 (``"7.0;7.2;7.5;..."``): CUDA 13.0 dropped Volta (sm_70).  The pinned stack is CUDA
  13, so sm_75 is its floor; a vLLM built for CUDA 12.8 still runs on a V100 (FP16, the Triton
  attention backend: vLLM's FlashAttention backend needs sm_80).
* SGLang: v0.5 ended sm_75 support (sgl-project/sglang#6006, "sm75 EOL") and its kernels
  (``sgl-kernel``) ship for sm_80 and up; sm_80 is its floor.
* BF16 needs sm_80 (Ampere) everywhere: a V100 trains and samples in FP16.

ROCm parts (MI300X, MI325X) carry no compute capability; vLLM and SGLang ship ROCm builds for
them, so no check applies.  The choice when an engine cannot run on the card: plan anyway and
print one line naming what can (a CUDA 12.x vLLM build), rather than refuse -- the layout, memory
and times do not depend on which build serves the rollout.
"""

from __future__ import annotations

from dataclasses import dataclass

from planner.catalog.hardware import GpuSpec
from planner.errors import PlanInputError


@dataclass(frozen=True)
class EngineBuild:
    """A rollout engine as verl's extras pin it, and the oldest GPU its build runs on."""

    name: str
    version: str
    min_compute_capability: tuple[int, int]
    why: str  # the source of the floor, for the message


PINNED_ENGINES = {
    "vllm": EngineBuild("vLLM", "0.24.0", (7, 5), "verl 0.9.1's pin, a CUDA 13 build"),
    "sglang": EngineBuild("SGLang", "0.5.12", (8, 0), "verl 0.9.1's pin; v0.5 dropped sm_75"),
}
# What runs where the pinned builds do not: a vLLM compiled for CUDA 12.8, whose supported
# architectures still start at sm_70 (vLLM CMakeLists.txt), in FP16.
FALLBACK = ("vLLM built for CUDA 12.8 (still compiles sm_70; FP16, Triton attention) on torch's "
            "CUDA 12 build, an older stack than verl 0.9.1 pins")


def sm(capability: tuple[int, int]) -> str:
    return f"sm_{capability[0]}{capability[1]}"


def engine_problem(gpu: GpuSpec, engine: str) -> str | None:
    """One line when the pinned ``engine`` cannot run on ``gpu`` (None when it can), naming
    what can: the other pinned engine, else :data:`FALLBACK`."""
    build = PINNED_ENGINES.get(engine)
    if build is None or gpu.compute_capability is None:
        return None
    if gpu.compute_capability >= build.min_compute_capability:
        return None
    others = [other for key, other in PINNED_ENGINES.items() if key != engine]
    runs = [other for other in others if gpu.compute_capability >= other.min_compute_capability]
    head = (f"{build.name} {build.version} ({build.why}: {sm(build.min_compute_capability)}+) "
            f"does not run on {gpu.name} ({sm(gpu.compute_capability)})")
    if runs:
        return (f"{head}; {runs[0].name} {runs[0].version} does (--rollout-engine "
                f"{runs[0].name.lower()})")
    return (f"{head}, nor does " + ", ".join(
        f"{other.name} {other.version} ({sm(other.min_compute_capability)}+)" for other in others)
        + f"; what can: {FALLBACK}")


def training_precision(gpu: GpuSpec, requested: str | None) -> tuple[str, str | None]:
    """The precision a job on ``gpu`` trains in, and the line saying why when it is not what was
    asked.  ``requested`` None: BF16, or FP16 on a part without BF16.  An explicit ``bf16`` or
    ``fp8`` on such a part is an input error, and so is ``fp8`` on a part without FP8 tensor
    cores (A100, A10: Transformer Engine's FP8 needs sm_89+)."""
    capability = sm(gpu.compute_capability) if gpu.compute_capability else "no BF16 units"
    if gpu.bf16:
        if requested == "fp8" and not gpu.fp8_flops:
            raise PlanInputError(f"--precision fp8: {gpu.name} has no FP8 tensor cores "
                                 f"({capability}; FP8 needs sm_89+); valid: bf16, fp16")
        return requested or "bf16", None
    if requested in ("bf16", "fp8"):
        raise PlanInputError(f"--precision {requested}: {gpu.name} has no "
                             f"{requested.upper()} tensor cores ({capability}; BF16 needs "
                             f"sm_80+, FP8 sm_89+); valid: fp16")
    if requested is None:
        return "fp16", (f"{gpu.name} has no BF16 tensor cores ({capability}; BF16 needs "
                        f"sm_80+): planning in FP16 (megatron dtype float16 with loss scaling, "
                        f"rollout dtype float16), as --precision fp16")
    return requested, None
