"""The recommended-configs library: the planner's best layout for common model/cluster pairs.

``python -m planner.verl.library`` (from the repository root) regenerates ``configs/``: one
directory
per pair, ``configs/<model>_<gpus>x<gpu>/`` with ``run_grpo.sh``, ``grpo.yaml`` and ``plan.json``
(the files ``plan-parallel ... --write`` writes for the top-ranked layout), and
``configs/README.md``, an index table.  Every config is planned under the default memory policy
(:data:`planner.policy.DEFAULT_POLICY`): its nvidia-smi peak sits inside the band, or its README
row states why not, a reason the plan itself proves (no layout fits below the band's top; or
the fastest layout is below the band and every layout that uses more memory is slower).
``--check`` compares instead of writing and enforces the policy on the committed files (exit 1
on any difference or on a config outside the band without a reason).  A test checks that the
committed files are what the current planner produces and that each one passes
``plan-parallel validate``.
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import dataclass, replace
from pathlib import Path

from planner.catalog.hardware import ClusterSpec, get_gpu
from planner.catalog.lengths import default_lengths
from planner.catalog.models import builtin_model
from planner.catalog.workload import GrpoWorkload
from planner.cost.request import PlanRequest
from planner.plan import make_plan
from planner.policy import DEFAULT_POLICY, PEAK_NAME, WORKING_SET_NAME, MemoryPolicy
from planner.verl.export import job_from_plan
from planner.verl.files import render_config, render_plan_json, render_script
from planner.verl.keys import CONFIG_FILE, PLAN_FILE, SCRIPT_FILE, VERL_VERSION

INDEX_FILE = "README.md"


@dataclass(frozen=True)
class Entry:
    model: str
    gpu: str
    gpus: int
    # None: verl's GRPO example default (planner.catalog.workload) with the published response
    # lengths for the model's kind of job, as a plan with no lengths given assumes them
    workload: GrpoWorkload | None = None

    @property
    def grpo(self) -> GrpoWorkload:
        """The workload the entry is planned for."""
        if self.workload is not None:
            return self.workload
        base = GrpoWorkload()
        return replace(base, lengths=default_lengths(base.response_length, self.model))

    @property
    def directory(self) -> str:
        return f"{self.model}_{self.gpus}x{self.gpu}"


# Common pairs: each model on a typical cluster of H100-80GB and of H20-96GB, sized as verl's
# examples size them (one node for 7-8B, two for 30-32B, four for 70B, eight for 235B, 16-32
# nodes for DeepSeek-V3).  The workload is verl's GRPO example default (planner.catalog.workload)
# over the published lengths of the model's kind of job (planner.catalog.lengths).
ENTRIES = (
    Entry("Qwen2.5-7B", "H100-80GB", 8),
    Entry("Qwen2.5-7B", "H20-96GB", 8),
    Entry("Qwen3-8B", "H100-80GB", 8),
    Entry("Qwen3-8B", "H20-96GB", 8),
    Entry("Llama-3.1-8B", "H100-80GB", 8),
    Entry("Llama-3.1-8B", "H20-96GB", 8),
    Entry("Qwen3-30B-A3B", "H100-80GB", 16),
    Entry("Qwen3-30B-A3B", "H20-96GB", 16),
    Entry("Qwen3-32B", "H100-80GB", 16),
    Entry("Qwen3-32B", "H20-96GB", 16),
    Entry("Llama-3.1-70B", "H100-80GB", 32),
    Entry("Llama-3.1-70B", "H20-96GB", 32),
    Entry("Qwen3-235B-A22B", "H100-80GB", 64),
    Entry("Qwen3-235B-A22B", "H20-96GB", 64),
    Entry("DeepSeek-V3", "H100-80GB", 256),
    Entry("DeepSeek-V3", "H20-96GB", 128),
)


def plan_entry(entry: Entry, policy: MemoryPolicy = DEFAULT_POLICY):
    """The exported job for the entry's top-ranked layout, and the reason it sits outside the
    memory band (``""`` inside; ``None`` when the plan cannot justify it)."""
    cluster = ClusterSpec(get_gpu(entry.gpu), entry.gpus, min(8, entry.gpus))
    plan = make_plan(PlanRequest(builtin_model(entry.model), cluster, entry.grpo,
                                 policy=policy))
    job = job_from_plan(plan, 1)
    return job, band_reason(plan, job.prediction, policy)


def band_reason(plan, prediction: dict, policy: MemoryPolicy = DEFAULT_POLICY) -> str | None:
    """Why the top layout's nvidia-smi peak is outside the band, as the plan proves it: ``""``
    inside the band, ``None`` when nothing justifies it."""
    share = prediction["memory_utilization"]
    position = policy.position(share)
    fitting = plan.fitting
    if position == "inside":
        return ""
    if position == "above":
        lowest = float(fitting["memory_utilization"].min())
        if lowest > policy.high:
            return (f"no layout fits below {100 * policy.high:.0f}%: the lowest {PEAK_NAME} "
                    f"is {100 * lowest:.0f}%")
        return None
    using = fitting[fitting["memory_utilization"] >= policy.low]
    if not len(using):
        return f"no layout reaches {100 * policy.low:.0f}%"
    fastest = float(using["step_time_s"].min())
    if fastest > prediction["step_time_s"]:
        return (f"the fastest layout; every layout using more memory is slower (best "
                f"{fastest:.0f} s)")
    return None


def layout_text(job) -> str:
    return job.layout.actor_text(moe=job.model.is_moe)


def band_cell(prediction: dict, reason: str | None, policy: MemoryPolicy) -> str:
    position = policy.position(prediction["memory_utilization"])
    if position == "inside":
        return "inside"
    return f"{position}: {reason}" if reason else f"{position}, no reason"


def index_text(jobs: list[tuple[Entry, object, str | None]],
               policy: MemoryPolicy = DEFAULT_POLICY) -> str:
    workloads = sorted({entry.grpo.describe() for entry, _, _ in jobs})
    lines = [
        "# Recommended verl GRPO configs (Megatron backend)",
        "",
        f"Produced by the planner for verl {VERL_VERSION}; regenerate with "
        f"`python -m planner.verl.library` from the repository root (a test checks these files are "
        f"what the current planner produces and that each passes `plan-parallel validate`).",
        "Each directory holds `run_grpo.sh` (launch script: `MODEL_PATH=... TRAIN_FILES=... "
        "VAL_FILES=... bash run_grpo.sh`), `grpo.yaml` (the same settings for "
        "`--config-path/--config-name`) and `plan.json` (layout and predictions).",
        "",
        "Workload: " + "; ".join(workloads) + ".",
        f"Memory policy: the {PEAK_NAME} (what nvidia-smi shows: vLLM's whole "
        f"`gpu_memory_utilization` pool and the state resident during rollout included) sits in "
        f"the {policy.band_text} band, or the band column says why not "
        f"(`python -m planner.verl.library --check` enforces it).  The {WORKING_SET_NAME} is "
        f"what the tensors of that phase occupy.  Throughput is the predicted tokens "
        f"(prompt + response) per second per GPU.",
        "",
        f"| model | GPUs | layout | rollout (vLLM) | {PEAK_NAME} | {WORKING_SET_NAME} | "
        f"band {policy.band_text} | throughput | step time | config |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for entry, job, reason in jobs:
        lay, pred = job.layout, job.prediction
        lines.append(
            f"| {entry.model} | {entry.gpus} x {entry.gpu} | {layout_text(job)} | "
            f"TP{lay.rollout_tp} DP{lay.rollout_dp} EP{lay.rollout_ep}, util "
            f"{lay.gpu_memory_utilization:.2f} | {pred['peak_memory_gib']:.1f} GiB "
            f"({100 * pred['memory_utilization']:.0f}%, {pred['peak_phase']}) | "
            f"{pred['working_set_gib'][pred['peak_phase']]:.1f} GiB | "
            f"{band_cell(pred, reason, policy)} | "
            f"{pred['tokens_per_s_per_gpu']:.0f} tok/s/GPU | {pred['step_time_s']:.0f} s | "
            f"[{entry.directory}]({entry.directory}/) |")
    return "\n".join(lines) + "\n"


def render_library(entries=ENTRIES) -> dict[str, str]:
    """Every library file, relative path -> text."""
    files, jobs = {}, []
    for entry in entries:
        job, reason = plan_entry(entry)
        jobs.append((entry, job, reason))
        files[f"{entry.directory}/{SCRIPT_FILE}"] = render_script(job)
        files[f"{entry.directory}/{CONFIG_FILE}"] = render_config(job)
        files[f"{entry.directory}/{PLAN_FILE}"] = render_plan_json(job)
    files[INDEX_FILE] = index_text(jobs)
    return files


def band_problems(out: Path, entries=ENTRIES,
                  policy: MemoryPolicy = DEFAULT_POLICY) -> list[str]:
    """Committed configs outside the memory band whose README row gives no reason."""
    import json

    index = out / INDEX_FILE
    rows = index.read_text().splitlines() if index.is_file() else []
    problems = []
    for entry in entries:
        path = out / entry.directory / PLAN_FILE
        if not path.is_file():
            continue
        try:
            share = float(json.loads(path.read_text())["prediction"]["memory_utilization"])
        except (ValueError, KeyError, TypeError):
            problems.append(f"{path}: no predicted memory_utilization to judge")
            continue
        position = policy.position(share)
        if position == "inside":
            continue
        row = next((line for line in rows if f"]({entry.directory}/)" in line), "")
        cells = [cell.strip() for cell in row.split("|")]
        if not any(cell.startswith(f"{position}: ") and len(cell) > len(position) + 2
                   for cell in cells):
            problems.append(f"{entry.directory}: {PEAK_NAME} {100 * share:.0f}% is {position} "
                            f"the {policy.band_text} band and its {INDEX_FILE} row gives no "
                            f"reason")
    return problems


def differences(out: Path, files: dict[str, str]) -> list[str]:
    """What differs between ``out`` and the rendered library (missing, changed, stale)."""
    problems = []
    for name, text in files.items():
        path = out / name
        if not path.is_file():
            problems.append(f"missing {path}")
        elif path.read_text() != text:
            problems.append(f"out of date {path}")
    entry_dirs = {name.split("/")[0] for name in files if "/" in name}
    for path in sorted(out.iterdir()) if out.is_dir() else []:
        if path.is_dir() and path.name not in entry_dirs:
            problems.append(f"not in the library: {path}")
    return problems


def write_library(out: Path, files: dict[str, str]) -> list[Path]:
    written = []
    for name, text in files.items():
        path = out / name
        path.parent.mkdir(parents=True, exist_ok=True)
        if not path.is_file() or path.read_text() != text:
            path.write_text(text)
            written.append(path)
        if path.name.endswith(".sh"):
            path.chmod(0o755)
    return written


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m planner.verl.library", description=__doc__)
    parser.add_argument("--out", default="configs", help="library directory (default configs)")
    parser.add_argument("--check", action="store_true",
                        help="compare with the planner's output instead of writing")
    args = parser.parse_args(argv)
    out = Path(args.out)
    files = render_library()
    if args.check:
        problems = differences(out, files) + band_problems(out)
        for problem in problems:
            print(problem, file=sys.stderr)
        return 1 if problems else 0
    written = write_library(out, files)
    for path in written:
        print(f"wrote {path}", file=sys.stderr)
    for problem in differences(out, files):
        print(f"note: {problem} (left as it is)", file=sys.stderr)
    print(f"{len(ENTRIES)} configs in {out}: {len(written)} file(s) changed", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
