"""``plan-parallel profile TRACE``: how much of a training step is communication, and how much
of it hides behind compute.

Reads PyTorch profiler Chrome traces (what verl's torch profiler writes, one file per rank;
``.json`` or ``.json.gz``; several files or a folder of them).  GPU work is the ``kernel``
category of complete (``"ph": "X"``) events; a kernel is *communication* when its name is a
collective or P2P kernel (NCCL, and the NVSHMEM/DeepEP and userbuffer kernels MoE and TP
overlap use), *compute* otherwise.  Steps are the ``ProfilerStep#N`` annotations (GPU side when
present, CPU side otherwise); without them the whole trace is one step.

Per rank and step it reports:

* communication share = time covered by communication kernels / step time;
* overlap = the part of that time during which a compute kernel runs (necessarily on another
  stream: a stream runs its kernels one after another).

and compares them with the targets users quote: communication under 15% of step time, overlap
over 80%.  Intervals are merged per category before measuring, so concurrent kernels are not
counted twice.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from pathlib import Path

from planner.bounds import MAX_TRACE_BYTES, check_number, invalid, parse_json, read_bytes
from planner.errors import PlanInputError

COMM_KERNEL = re.compile(r"nccl|nvshmem|deep_?ep|userbuffers|all_?reduce|all_?gather|"
                         r"reduce_?scatter|all_?to_?all|sendrecv|c10d", re.IGNORECASE)
STEP_ANNOTATION = re.compile(r"ProfilerStep#(\d+)")
COMM_SHARE_TARGET = 0.15
OVERLAP_TARGET = 0.80


@dataclass(frozen=True)
class StepProfile:
    rank: int
    step: int
    step_s: float
    comm_s: float  # union of communication kernel time
    overlapped_s: float  # of which a compute kernel ran concurrently on another stream
    compute_s: float  # union of compute kernel time
    top_comm_kernels: tuple[tuple[str, float], ...]  # (kernel family, seconds), largest first

    @property
    def comm_share(self) -> float:
        return self.comm_s / self.step_s if self.step_s > 0 else 0.0

    @property
    def overlap(self) -> float:
        return self.overlapped_s / self.comm_s if self.comm_s > 0 else 1.0


def _merge(intervals: list[tuple[float, float]]) -> list[tuple[float, float]]:
    merged: list[list[float]] = []
    for start, end in sorted(intervals):
        if merged and start <= merged[-1][1]:
            merged[-1][1] = max(merged[-1][1], end)
        else:
            merged.append([start, end])
    return [(a, b) for a, b in merged]


def _length(intervals: list[tuple[float, float]]) -> float:
    return sum(end - start for start, end in intervals)


def _intersection(a: list[tuple[float, float]], b: list[tuple[float, float]]) -> float:
    """Total length of the intersection of two merged interval lists."""
    i = j = 0
    total = 0.0
    while i < len(a) and j < len(b):
        start, end = max(a[i][0], b[j][0]), min(a[i][1], b[j][1])
        if end > start:
            total += end - start
        if a[i][1] < b[j][1]:
            i += 1
        else:
            j += 1
    return total


def _clip(intervals, start, end):
    return [(max(s, start), min(e, end)) for s, e in intervals if e > start and s < end]


def kernel_family(name: str) -> str:
    """A short name for a communication kernel: ncclDevKernel_AllGather_RING_LL -> AllGather."""
    for family in ("AllReduce", "AllGather", "ReduceScatter", "AllToAll", "SendRecv", "Send",
                   "Recv", "Broadcast", "Reduce"):
        if family.lower() in name.lower().replace("_", ""):
            return family
    return name.split("(")[0][:40]


MAX_TIMESTAMP_US = 1e15  # ~31 years in microseconds: any real trace's clock is below
MAX_RANK = 1 << 20


def read_trace(path: Path) -> dict:
    """A Chrome trace, with its size (also gunzipped) and nesting bounded before parsing."""
    field = f"trace {str(path)!r}"
    raw = read_bytes(path, "trace", MAX_TRACE_BYTES)
    data = parse_json(raw, field)  # its message already reads "cannot read trace '...': ..."
    if isinstance(data, list):
        data = {"traceEvents": data}
    if not isinstance(data, dict) or not isinstance(data.get("traceEvents"), list):
        raise PlanInputError(f"{str(path)!r} is not a Chrome trace (no traceEvents list)")
    return data


def trace_rank(data: dict, default: int, where: str) -> int:
    """``distributedInfo.rank`` (the file's position when absent), checked."""
    info = data.get("distributedInfo", {})
    if info is None:
        return default
    if not isinstance(info, dict):
        raise invalid(f"{where}: distributedInfo", info, "an object with the rank")
    if "rank" not in info:
        return default
    return int(check_number(f"{where}: distributedInfo.rank", info["rank"], 0, MAX_RANK,
                            integer=True))


def _checked(event: dict, index: int, where: str) -> dict:
    """A complete event's fields, type- and range-checked (the message names the field)."""
    for key in ("ts", "dur"):
        check_number(f"{where} event {index}: {key}", event.get(key), 0, MAX_TIMESTAMP_US)
    name = event.get("name", "")
    if not isinstance(name, str):
        raise invalid(f"{where} event {index}: name", name, "a string")
    tid = event.get("tid")
    if tid is not None and (isinstance(tid, bool) or not isinstance(tid, (int, str))):
        raise invalid(f"{where} event {index}: tid", tid, "a stream id (integer or string)")
    return event


MAX_STEP_DIGITS = 18  # a step number below 10**18: int() of it is cheap and exact


def step_number(digits: str, where: str) -> int:
    """The N of ``ProfilerStep#N``, its length bounded before ``int()`` (Python refuses to
    convert more than 4,300 digits, and no run has that many steps)."""
    if len(digits) > MAX_STEP_DIGITS:
        raise PlanInputError(f"{where}: ProfilerStep#{digits[:12]}... has a step number of "
                             f"{len(digits):,} digits; valid: fewer than "
                             f"{MAX_STEP_DIGITS + 1} digits")
    return int(digits)


def profile_trace(data: dict, rank: int, where: str = "trace") -> list[StepProfile]:
    events = [_checked(e, index, where) for index, e in enumerate(data["traceEvents"])
              if isinstance(e, dict) and e.get("ph") == "X"
              and e.get("cat") in ("kernel", "gpu_user_annotation", "user_annotation")]
    kernels = [e for e in events if e.get("cat") == "kernel"]
    if not kernels:
        raise PlanInputError("trace has no GPU kernel events (cat 'kernel'); profile with "
                             "activities including CUDA")
    steps = []
    for category in ("gpu_user_annotation", "user_annotation"):
        steps = [(step_number(m.group(1), where), e["ts"], e["ts"] + e["dur"]) for e in events
                 if e.get("cat") == category and (m := STEP_ANNOTATION.search(e.get("name", "")))]
        if steps:
            break
    if not steps:
        steps = [(0, min(k["ts"] for k in kernels), max(k["ts"] + k["dur"] for k in kernels))]
    comm_by_stream: dict = {}
    compute_by_stream: dict = {}  # by stream, for readers; overlap uses the unions
    families: dict[str, list[tuple[float, float]]] = {}
    for kernel in kernels:
        interval = (float(kernel["ts"]), float(kernel["ts"] + kernel["dur"]))
        stream = kernel.get("tid")
        if COMM_KERNEL.search(kernel.get("name", "")):
            comm_by_stream.setdefault(stream, []).append(interval)
            families.setdefault(kernel_family(kernel["name"]), []).append(interval)
        else:
            compute_by_stream.setdefault(stream, []).append(interval)
    all_compute = _merge([i for v in compute_by_stream.values() for i in v])
    result = []
    all_comm = _merge([i for v in comm_by_stream.values() for i in v])
    for step, start, end in sorted(steps):
        comm_union = _clip(all_comm, start, end)
        comm_s = _length(comm_union)
        # A stream runs its kernels in order, so compute that coincides with a communication
        # kernel necessarily ran on another stream.
        overlapped = _intersection(comm_union, _clip(all_compute, start, end))
        top = sorted(((family, _length(_merge(_clip(v, start, end))) / 1e6)
                      for family, v in families.items()), key=lambda item: -item[1])
        result.append(StepProfile(
            rank=rank, step=step, step_s=(end - start) / 1e6, comm_s=comm_s / 1e6,
            overlapped_s=overlapped / 1e6,
            compute_s=_length(_clip(all_compute, start, end)) / 1e6,
            top_comm_kernels=tuple((f, round(t, 6)) for f, t in top if t > 0)[:5]))
    return result


def trace_files(paths: list[str]) -> list[Path]:
    files: list[Path] = []
    for text in paths:
        path = Path(text)
        if path.is_dir():
            files += sorted(p for p in path.iterdir()
                            if p.name.endswith((".json", ".json.gz", ".pt.trace.json")))
        elif path.is_file():
            files.append(path)
        else:
            raise PlanInputError(f"trace {text!r} does not exist")
    if not files:
        raise PlanInputError(f"no trace files (.json, .json.gz) in {', '.join(paths)}")
    return files


def advice(steps: list[StepProfile]) -> list[str]:
    """Settings that move communication share and overlap, chosen by what the trace shows."""
    comm_share = max(step.comm_share for step in steps)
    overlap = min(step.overlap for step in steps)
    families = {}
    for step in steps:
        for family, seconds in step.top_comm_kernels:
            families[family] = families.get(family, 0.0) + seconds
    top = max(families, key=families.get) if families else ""
    tips = []
    if overlap < OVERLAP_TARGET:
        tips.append("set CUDA_DEVICE_MAX_CONNECTIONS=1 so Megatron's communication kernels are "
                    "scheduled ahead of compute (verl sets it for Megatron on Hopper/Ampere)")
        tips.append("overlap DP communication with backward: actor.megatron.override_ddp_config."
                    "overlap_grad_reduce=True and overlap_param_gather=True")
    if top in ("AllGather", "ReduceScatter") and comm_share > COMM_SHARE_TARGET:
        tips.append("AllGather/ReduceScatter dominate: keep tensor parallelism inside a node "
                    "(TP <= GPUs per node) and prefer PP or EP over a larger TP")
    if top == "AllToAll":
        tips.append("AllToAll dominates (MoE expert parallelism): keep EP inside the NVLink "
                    "domain, or overlap it (moe_shared_expert_overlap, the flex/DeepEP "
                    "dispatcher, overlap_moe_expert_parallel_comm with VPP)")
    if top in ("SendRecv", "Send", "Recv"):
        tips.append("pipeline P2P is exposed: raise the number of micro-batches per mini-batch "
                    "or use virtual pipeline stages (VPP)")
    if comm_share > COMM_SHARE_TARGET:
        tips.append("check the network: NCCL_IB_HCA / NCCL_SOCKET_IFNAME must name the fast "
                    "interfaces, and NCCL_DEBUG=INFO shows which transport NCCL picked")
    return tips


def profile_traces(paths: list[str]) -> dict:
    """Per rank and step: communication share and overlap, the targets and advice."""
    steps: list[StepProfile] = []
    for index, path in enumerate(trace_files(paths)):
        data = read_trace(path)
        where = f"trace {path.name}"
        steps += profile_trace(data, trace_rank(data, index, where), where)
    for step in steps:  # a NaN, negative or empty time is never "targets met"
        for name in ("step_s", "comm_s", "overlapped_s", "compute_s"):
            value = getattr(step, name)
            if not math.isfinite(value) or value < 0:
                raise PlanInputError(f"rank {step.rank} step {step.step}: {name} = {value!r} "
                                     f"is not a time; valid: a finite number >= 0 (the "
                                     f"trace's ts/dur)")
        if step.step_s == 0:
            raise PlanInputError(f"rank {step.rank} step {step.step} lasts 0 s (its "
                                 f"ProfilerStep annotation, or its kernels, have no duration); "
                                 f"nothing to measure -- profile at least one whole step")
    within = all(s.comm_share <= COMM_SHARE_TARGET and s.overlap >= OVERLAP_TARGET for s in steps)
    return {"steps": [{"rank": s.rank, "step": s.step, "step_s": s.step_s,
                       "comm_s": s.comm_s, "comm_share": round(s.comm_share, 4),
                       "overlap": round(s.overlap, 4),
                       "top_comm_kernels": dict(s.top_comm_kernels)}
                      for s in steps],
            "targets": {"comm_share_max": COMM_SHARE_TARGET, "overlap_min": OVERLAP_TARGET},
            "within_targets": within, "advice": advice(steps)}


def profile_text(data: dict) -> str:
    lines = [f"{'rank':>4} {'step':>5} {'step s':>8} {'comm s':>8} {'comm %':>7} {'overlap':>8}  "
             f"top communication kernels"]
    for s in data["steps"]:
        kernels = ", ".join(f"{name} {sec * 1e3:.1f} ms"
                            for name, sec in list(s["top_comm_kernels"].items())[:3])
        lines.append(f"{s['rank']:>4} {s['step']:>5} {s['step_s']:>8.3f} {s['comm_s']:>8.3f} "
                     f"{100 * s['comm_share']:>6.1f}% {100 * s['overlap']:>7.1f}%  {kernels}")
    lines.append("")
    lines.append(f"targets: communication under {COMM_SHARE_TARGET:.0%} of step time, overlap "
                 f"over {OVERLAP_TARGET:.0%}: {'met' if data['within_targets'] else 'NOT met'}")
    lines += [f"- {tip}" for tip in data["advice"]]
    return "\n".join(lines)
