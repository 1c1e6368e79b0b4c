"""Figures for reports and notebooks (matplotlib, imported lazily, rendered off-screen).

Each function takes plain data (pandas DataFrames from a plan or a sweep) and returns a
matplotlib Figure; :func:`to_png` renders it.  Axes are labelled with units.
"""

from __future__ import annotations

import io
from typing import TYPE_CHECKING

from planner.cost.columns import memory_column, time_column
from planner.extras import require
from planner.phases import PHASES
from planner.policy import PEAK_NAME
from planner.units import GIB

if TYPE_CHECKING:
    import pandas as pd


MEMORY_PARTS = (("weights_bytes", "weights"), ("grads_bytes", "fp32 grads"),
                ("optimizer_bytes", "optimizer"), ("train_activations_bytes", "activations"),
                ("train_logits_bytes", "log-prob logits"), ("ref_weights_bytes", "reference"))
CATEGORY_COLORS = {"ok": "#2a9d8f", "oom": "#e76f51", "nccl": "#8e44ad", "hang": "#f4a261",
                   "timeout": "#e9c46a", "config": "#264653", "crash": "#6c757d",
                   "pruned": "#90be6d"}


def _pyplot():
    matplotlib = require("matplotlib", "the report's figures")
    matplotlib.use("Agg")
    return require("matplotlib.pyplot", "the report's figures")


def to_png(figure) -> bytes:
    buffer = io.BytesIO()
    figure.savefig(buffer, format="png", dpi=110, bbox_inches="tight")
    _pyplot().close(figure)
    return buffer.getvalue()


def layout_label(row) -> str:
    label = f"TP{row['tp']} PP{row['pp']}"
    if row["pp"] > 1 and row["vpp"] > 1:
        label += f" VPP{row['vpp']}"
    if row["cp"] > 1:
        label += f" CP{row['cp']}"
    if row["ep"] > 1:
        label += f" EP{row['ep']}"
    label += f" mb{row['micro_batch']}"
    offloads = "".join(flag for flag, key in (("p", "param_offload"), ("o", "optimizer_offload"))
                       if bool(row.get(key, False)))
    return label + (f" off:{offloads}" if offloads else "")


def pareto_front(memory, throughput):
    """Indices of points no other point beats on both lower memory and higher throughput."""
    import numpy as np

    order = np.lexsort((-np.asarray(throughput), np.asarray(memory)))
    front, best = [], -np.inf
    for index in order:
        if throughput[index] > best:
            front.append(index)
            best = throughput[index]
    return np.array(front, dtype=int)


def pareto_figure(candidates: "pd.DataFrame", trials: "pd.DataFrame | None" = None,
                  capacity_gib: float | None = None, sample: int = 4000,
                  band: tuple[float, float] | None = None):
    """Predicted nvidia-smi peak vs predicted throughput of fitting candidates, with the Pareto
    front, the memory band (``band``: fractions of ``capacity_gib``) shaded, and measured
    trials on top when given."""
    plt = _pyplot()
    fitting = candidates[candidates["fits"]]
    shown = fitting.sample(min(sample, len(fitting)), random_state=0) if len(fitting) else fitting
    figure, axes = plt.subplots(figsize=(7.5, 4.8))
    if band and capacity_gib:
        low, high = band
        axes.axvspan(low * capacity_gib, high * capacity_gib, color="#2a9d8f", alpha=0.12,
                     label=f"memory band {100 * low:.0f}-{100 * high:.0f}%")
    axes.scatter(shown["peak_bytes"] / GIB, shown["tokens_per_s_per_gpu"], s=6, alpha=0.35,
                 color="#8ab6d6", label=f"candidates that fit ({len(fitting):,})")
    if len(fitting):
        memory = (fitting["peak_bytes"] / GIB).to_numpy()
        speed = fitting["tokens_per_s_per_gpu"].to_numpy()
        front = pareto_front(memory, speed)
        axes.plot(memory[front], speed[front], "-o", color="#1d3557", markersize=3,
                  label="Pareto front (predicted)")
    if trials is not None and len(trials):
        done = trials[trials["measured_tokens_per_s_per_gpu"].notna()
                      & (trials["category"] == "ok")]
        if len(done):
            axes.scatter(done["peak_memory_gib"], done["measured_tokens_per_s_per_gpu"],
                         marker="*", s=90, color="#e63946", label="measured trials")
    if capacity_gib:
        axes.axvline(capacity_gib, color="grey", linestyle="--", linewidth=1,
                     label=f"GPU memory ({capacity_gib:.0f} GiB)")
    axes.set_xlabel(f"{PEAK_NAME} per GPU (GiB)")
    axes.set_ylabel("throughput (tokens/s/GPU)")
    axes.set_title("Memory vs throughput")
    axes.grid(alpha=0.3)
    axes.legend(fontsize=8, loc="lower right")
    return figure


def memory_breakdown_figure(top: "pd.DataFrame"):
    """Stacked memory components of the actor update (on the rank where the step peaks), with
    every phase's peak marked beside it."""
    import numpy as np

    plt = _pyplot()
    figure, axes = plt.subplots(figsize=(8, 4.6))
    labels = [f"#{row['rank']} {layout_label(row)}" for _, row in top.iterrows()]
    x = np.arange(len(top))
    bottom = np.zeros(len(top))
    for column, name in MEMORY_PARTS:
        values = (top[column] / GIB).to_numpy()
        axes.bar(x, values, bottom=bottom, label=name, width=0.6)
        bottom += values
    # CUDA context, NCCL buffers and allocator fragmentation: the rest of the update's peak
    rest = np.maximum(top["mem_update_actor_bytes"].to_numpy() / GIB - bottom, 0)
    axes.bar(x, rest, bottom=bottom, label="overheads", width=0.6, color="#bbbbbb")
    markers = ("o", "s", "^", "D", "v")
    phases = [phase for phase in PHASES if memory_column(phase) in top]  # pretrain: update only
    for marker, phase in zip(markers, phases):
        axes.scatter(x + 0.38, top[memory_column(phase)] / GIB, marker=marker, s=22,
                     color="black", zorder=3, label=f"{phase} peak")
    axes.set_xticks(x, labels, rotation=20, ha="right", fontsize=8)
    axes.set_ylabel("GiB per GPU")
    axes.set_title("Actor-update memory by component (bars); each phase's peak (markers)")
    axes.grid(axis="y", alpha=0.3)
    axes.legend(fontsize=7, ncol=2, loc="upper left", bbox_to_anchor=(1.0, 1.0))
    return figure


def phase_time_figure(top: "pd.DataFrame"):
    """Stacked predicted phase times of the top layouts."""
    import numpy as np

    plt = _pyplot()
    figure, axes = plt.subplots(figsize=(8, 4.2))
    labels = [f"#{row['rank']} {layout_label(row)}" for _, row in top.iterrows()]
    x = np.arange(len(top))
    bottom = np.zeros(len(top))
    columns = [(phase, time_column(phase)) for phase in PHASES if time_column(phase) in top]
    for phase, column in columns or [("step", "step_time_s")]:  # pretrain: one step time
        values = top[column].to_numpy()
        axes.bar(x, values, bottom=bottom, label=phase, width=0.6)
        bottom += values
    axes.set_xticks(x, labels, rotation=20, ha="right", fontsize=8)
    axes.set_ylabel("seconds per step")
    axes.set_title("Predicted time per phase")
    axes.grid(axis="y", alpha=0.3)
    axes.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.0, 1.0))
    return figure


def trial_history_figure(trials: "pd.DataFrame"):
    """Measured throughput per trial in order, failures marked by category."""
    plt = _pyplot()
    figure, axes = plt.subplots(figsize=(7.5, 4.2))
    for category, group in trials.groupby("category"):
        # a failed trial may have logged steps before failing: plot it at 0, it produced nothing
        y = group["measured_tokens_per_s_per_gpu"].fillna(0) if category == "ok" else \
            group["measured_tokens_per_s_per_gpu"] * 0
        axes.scatter(group["number"], y, s=40, label=category,
                     color=CATEGORY_COLORS.get(category, "#999999"),
                     marker="o" if category == "ok" else "x")
    ok = trials[trials["category"] == "ok"].sort_values("number")
    if len(ok):
        axes.step(ok["number"], ok["measured_tokens_per_s_per_gpu"].cummax(), where="post",
                  color="#1d3557", label="best so far")
    axes.set_xlabel("trial number")
    axes.set_ylabel("measured throughput (tokens/s/GPU; 0 = failed)")
    axes.set_title("Trial history")
    axes.grid(alpha=0.3)
    axes.legend(fontsize=8)
    return figure


def failure_figure(trials: "pd.DataFrame"):
    plt = _pyplot()
    counts = trials["category"].value_counts()
    figure, axes = plt.subplots(figsize=(6, 3.6))
    axes.bar(counts.index, counts.values,
             color=[CATEGORY_COLORS.get(c, "#999999") for c in counts.index])
    axes.set_ylabel("trials")
    axes.set_xlabel("outcome")
    axes.set_title("Trials by outcome")
    axes.grid(axis="y", alpha=0.3)
    return figure


def predicted_vs_measured_figure(trials: "pd.DataFrame"):
    plt = _pyplot()
    done = trials[trials["measured_tokens_per_s_per_gpu"].notna() & (trials["category"] == "ok")]
    figure, axes = plt.subplots(figsize=(5.2, 5))
    axes.scatter(done["predicted_tokens_per_s_per_gpu"], done["measured_tokens_per_s_per_gpu"],
                 color="#e63946")
    if len(done):
        low = float(min(done["predicted_tokens_per_s_per_gpu"].min(),
                        done["measured_tokens_per_s_per_gpu"].min())) * 0.9
        high = float(max(done["predicted_tokens_per_s_per_gpu"].max(),
                         done["measured_tokens_per_s_per_gpu"].max())) * 1.1
        axes.plot([low, high], [low, high], "--", color="grey", label="measured = predicted")
        axes.set_xlim(low, high)
        axes.set_ylim(low, high)
    axes.set_xlabel("predicted throughput (tokens/s/GPU)")
    axes.set_ylabel("measured throughput (tokens/s/GPU)")
    axes.set_title("Predicted vs measured")
    axes.grid(alpha=0.3)
    axes.legend(fontsize=8)
    return figure


# marker of each point a sizing sweep marks (planner.sizing.sweep.MARKS)
SIZING_MARKERS = {"fastest": ("*", 150), "cheapest": ("D", 60), "knee": ("^", 80),
                  "smallest": ("s", 60)}


def sizing_figure(rows, currency: str = "$"):
    """A sizing sweep's rows (:class:`planner.sizing.sweep.SizingRow`): step time and the
    run's cost (GPU-hours without prices) against GPU count, one line per GPU type, with the
    fastest, cheapest, knee and smallest fitting points marked."""
    plt = _pyplot()
    ticker = require("matplotlib.ticker", "the report's figures")
    figure, (time_axes, cost_axes) = plt.subplots(1, 2, figsize=(11, 4.4))
    priced = any(row.cost is not None for row in rows)
    value = "cost" if priced else "gpu_hours"
    types = list(dict.fromkeys(row.gpu for row in rows))
    colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    for index, gpu in enumerate(types):
        color = colors[index % len(colors)]
        fitting = sorted((row for row in rows if row.gpu == gpu and row.fits
                          and getattr(row, value) is not None), key=lambda row: row.num_gpus)
        if not fitting:
            continue
        counts = [row.num_gpus for row in fitting]
        time_axes.plot(counts, [row.step_time_s for row in fitting], "-o", markersize=3,
                       color=color, label=gpu)
        cost_axes.plot(counts, [getattr(row, value) for row in fitting], "-o", markersize=3,
                       color=color, label=gpu)
        for row in fitting:
            for mark in row.marks:
                marker, size = SIZING_MARKERS[mark]
                for axes, y in ((time_axes, row.step_time_s), (cost_axes, getattr(row, value))):
                    axes.scatter([row.num_gpus], [y], marker=marker, s=size, color=color,
                                 edgecolors="black", linewidths=0.6, zorder=3)
    for mark, (marker, size) in SIZING_MARKERS.items():  # legend entries for the marks
        time_axes.scatter([], [], marker=marker, s=size, color="white", edgecolors="black",
                          label=mark)
    counts = sorted({row.num_gpus for row in rows if row.fits})
    for axes in (time_axes, cost_axes):
        axes.set_xscale("log", base=2)
        axes.set_yscale("log")
        axes.set_xlabel("GPUs")
        axes.grid(alpha=0.3, which="both")
        if counts:  # label the counts themselves: the doublings of the smallest, if enough
            doublings = [c for c in counts if (c // counts[0]) & (c // counts[0] - 1) == 0
                         and c % counts[0] == 0]
            shown = doublings if len(doublings) >= 3 else counts[::-(-len(counts) // 8)]
            axes.set_xticks(shown, [str(count) for count in shown])
            axes.xaxis.set_minor_locator(ticker.NullLocator())
    time_axes.set_ylabel("step time (s)")
    time_axes.set_title("Step time of the best layout")
    cost_axes.set_ylabel(f"cost of the run ({currency})" if priced else "GPU-hours of the run")
    cost_axes.set_title("Cost of the run" if priced else "GPU-hours of the run (no prices)")
    time_axes.legend(fontsize=8)
    figure.tight_layout()
    return figure
