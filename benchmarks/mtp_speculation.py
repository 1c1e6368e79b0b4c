"""Generation with and without MTP speculative decoding against NeMo RL's DeepSeek-V3 run.

    python benchmarks/mtp_speculation.py

NeMo RL PR 2779 (``grpo_runs.csv`` row 54, pre-v0.7, 32 nodes x 8 H100, colocated, the
``grpo-deepseek-v3-32n8g`` recipe) publishes generation 57.4 s and step 121.2 s, and with MTP
speculative decoding 40.1 s and 100.5 s; the number of drafted tokens and the acceptance are not
published.  Row 54 publishes no mean length, so the case is the same recipe's row 13 (NeMo RL
v0.5 table: mean sequence 744 tokens) read as ``benchmarks/rl_data.py`` reads it.  Printed: the
predicted generate and step seconds with speculation off and with k = 1..3 drafted tokens at the
default acceptance (85% per drafted token), and the acceptance length at k = 1 that would make
the predicted generation ratio equal the published one.
"""

from __future__ import annotations

import csv
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from rl_data import case_from_row, replace_workload  # noqa: E402

from planner.cost.request import PlanRequest  # noqa: E402
from planner.plan import estimate_layout  # noqa: E402

DATA = Path(__file__).resolve().parent / "data" / "grpo_runs.csv"
CASE_ROW, PUBLISHED_ROW = "13", "54"
PUBLISHED = {"generate_off": 57.4, "generate_mtp": 40.1, "step_off": 121.2, "step_mtp": 100.5}


def predict(case, **workload) -> tuple[float, float]:
    """(generate, step) seconds of the case's layout with ``workload`` changes."""
    case = replace_workload(case, **workload)
    row = estimate_layout(PlanRequest(case.model, case.cluster, case.workload), case.layout).row
    return float(row["time_generate_s"]), float(row["step_time_s"])


def implied_acceptance(case, ratio: float) -> float:
    """The acceptance length at k = 1 whose predicted generate ratio (MTP / off) is ``ratio``
    (bisection; the ratio falls as the acceptance length grows)."""
    off = predict(case)[0]
    low, high = 1.0, 2.0
    for _ in range(30):
        mid = (low + high) / 2
        if predict(case, speculative="mtp", acceptance_length=mid)[0] / off > ratio:
            low = mid
        else:
            high = mid
    return (low + high) / 2


def main() -> None:
    rows = {row["row_id"]: row for row in csv.DictReader(DATA.open(newline=""))}
    case = case_from_row(rows[CASE_ROW])
    print(f"DeepSeek-V3, {case.cluster.num_gpus} x {case.cluster.gpu.name}, recipe of row "
          f"{CASE_ROW}; published: row {PUBLISHED_ROW} (NeMo RL PR 2779)")
    generate_off, step_off = predict(case)
    print(f"{'speculation':28} {'generate s':>10} {'step s':>8} {'gen ratio':>9}")
    print(f"{'off':28} {generate_off:10.1f} {step_off:8.1f} {1.0:9.2f}")
    for k in (1, 2, 3):
        workload = replace_workload(case, speculative="mtp", speculative_tokens=k).workload
        generate, step = predict(case, speculative="mtp", speculative_tokens=k)
        label = f"mtp k={k}, {workload.acceptance_length:.2f} tok/step"
        print(f"{label:28} {generate:10.1f} {step:8.1f} {generate / generate_off:9.2f}")
    ratio = PUBLISHED["generate_mtp"] / PUBLISHED["generate_off"]
    print(f"{'published off':28} {PUBLISHED['generate_off']:10.1f} {PUBLISHED['step_off']:8.1f}"
          f" {1.0:9.2f}")
    print(f"{'published mtp (k unstated)':28} {PUBLISHED['generate_mtp']:10.1f} "
          f"{PUBLISHED['step_mtp']:8.1f} {ratio:9.2f}")
    print(f"acceptance length at k=1 that reproduces the published ratio: "
          f"{implied_acceptance(case, ratio):.2f} tokens/step")


if __name__ == "__main__":
    main()
