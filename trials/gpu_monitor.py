"""GPU memory and utilisation of a running trial, sampled through NVML (``nvidia-ml-py``).

verl reports the training process's ``torch.cuda.max_memory_allocated``; vLLM's memory lives
in other processes, so the local launcher also samples every GPU the trial uses: peak memory
used (all processes) and mean utilisation.  Without NVML (no driver, no GPU, no ``pynvml``)
the trial runs unsampled and a note says so once per process — that is not an error.
"""

from __future__ import annotations

import os
import sys
import threading
import time
from dataclasses import dataclass
from typing import Any, Sequence

from planner.units import GIB

_NOTED = False


def note_once(message: str) -> None:
    global _NOTED
    if not _NOTED:
        _NOTED = True
        print(f"note: {message}", file=sys.stderr)


def open_nvml(nvml: Any = None) -> Any | None:
    """An initialised NVML module, or None (with the one-time note) when there is none."""
    if nvml is None:
        try:
            import pynvml as nvml
        except ImportError:
            note_once("nvidia-ml-py is not installed; trials' GPU memory and utilisation "
                      "are not sampled")
            return None
    try:
        nvml.nvmlInit()
    except Exception as error:  # pynvml.NVMLError and friends: no driver, no device
        note_once(f"NVML is not available ({error}); trials' GPU memory and utilisation "
                  f"are not sampled")
        return None
    return nvml


def visible_devices(env: dict[str, str] | None, count: int) -> list[str]:
    """The GPUs a local trial uses: ``CUDA_VISIBLE_DEVICES`` (indices or UUIDs) if set, else
    the first ``count`` devices."""
    value = (env or {}).get("CUDA_VISIBLE_DEVICES", os.environ.get("CUDA_VISIBLE_DEVICES"))
    if value is not None and value.strip():
        return [item.strip() for item in value.split(",") if item.strip()]
    return [str(index) for index in range(count)]


def _handles(nvml: Any, devices: Sequence[str]) -> list[Any]:
    total = nvml.nvmlDeviceGetCount()
    handles = []
    for device in devices:
        if device.isdigit():
            if int(device) < total:
                handles.append(nvml.nvmlDeviceGetHandleByIndex(int(device)))
        else:
            handles.append(nvml.nvmlDeviceGetHandleByUUID(device))
    return handles


def memory_used(nvml: Any, handles: Sequence[Any]) -> list[int]:
    return [int(nvml.nvmlDeviceGetMemoryInfo(handle).used) for handle in handles]


@dataclass(frozen=True)
class GpuStats:
    devices: tuple[str, ...]
    peak_used_gib: tuple[float, ...]  # per GPU, every process on it
    mean_utilization: float  # percent, over GPUs and samples
    samples: int

    @property
    def peak_gib(self) -> float:
        return max(self.peak_used_gib) if self.peak_used_gib else 0.0

    def to_dict(self) -> dict:
        return {"devices": list(self.devices), "peak_used_gib": [round(v, 3) for v in
                                                                 self.peak_used_gib],
                "peak_gib": round(self.peak_gib, 3),
                "mean_utilization": round(self.mean_utilization, 1), "samples": self.samples}


class GpuSampler:
    """Samples the given GPUs every ``interval_s`` in a background thread.

    ``start()`` then ``stop()`` -> :class:`GpuStats` (None without NVML or devices), then
    :meth:`wait_until_free` (memory back to what was in use when the sampler was made) and
    :meth:`close`.
    """

    def __init__(self, devices: Sequence[str], interval_s: float = 0.5, nvml: Any = None):
        self.devices = tuple(devices)
        self.interval_s = interval_s
        self._nvml = open_nvml(nvml) if self.devices else None
        self._handles = _handles(self._nvml, self.devices) if self._nvml else []
        self._peaks = [0] * len(self._handles)
        self._util_sum = 0.0
        self._util_count = 0
        self._samples = 0
        self._baseline = memory_used(self._nvml, self._handles) if self._handles else []
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    @property
    def available(self) -> bool:
        return bool(self._handles)

    def baseline(self) -> list[int]:
        return list(self._baseline)

    def sample(self) -> None:
        nvml = self._nvml
        for index, handle in enumerate(self._handles):
            try:
                used = int(nvml.nvmlDeviceGetMemoryInfo(handle).used)
                util = float(nvml.nvmlDeviceGetUtilizationRates(handle).gpu)
            except Exception:  # a GPU falling off the bus mid-trial: keep what we have
                continue
            self._peaks[index] = max(self._peaks[index], used)
            self._util_sum += util
            self._util_count += 1
        self._samples += 1

    def _run(self) -> None:
        while not self._stop.is_set():
            self.sample()
            self._stop.wait(self.interval_s)

    def start(self) -> "GpuSampler":
        if self.available:
            self._thread = threading.Thread(target=self._run, name="gpu-sampler", daemon=True)
            self._thread.start()
        return self

    def stop(self) -> GpuStats | None:
        if self._thread is not None:
            self._stop.set()
            self._thread.join()
            self._thread = None
        if not self.available or not self._samples:
            return None
        mean = self._util_sum / self._util_count if self._util_count else 0.0
        return GpuStats(devices=self.devices,
                        peak_used_gib=tuple(peak / GIB for peak in self._peaks),
                        mean_utilization=mean, samples=self._samples)

    def wait_until_free(self, timeout_s: float, slack_bytes: int = GIB,
                        poll_s: float = 0.5) -> bool:
        """Wait until every GPU uses no more than it did before the trial (plus ``slack``):
        the driver frees a killed process's memory shortly after it exits.  False on timeout."""
        if not self.available:
            return True
        deadline = time.monotonic() + timeout_s
        while True:
            used = memory_used(self._nvml, self._handles)
            if all(now <= before + slack_bytes for now, before in zip(used, self._baseline)):
                return True
            if time.monotonic() >= deadline:
                return False
            time.sleep(poll_s)

    def close(self) -> None:
        if self._nvml is not None:
            try:
                self._nvml.nvmlShutdown()
            except Exception:
                pass
            self._nvml = None
            self._handles = []
