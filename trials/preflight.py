"""Can this machine run ``tune``'s verl trials?  The checks behind ``plan-parallel doctor``,
also run by ``tune`` before its first trial (a study whose every trial would crash in 20 s
with the cause buried in a log is caught here, with the cause and its fix on one line).

Each check answers ``ok``, ``fail`` (with the fix) or ``skip`` (with why it does not apply):

* the trainer: verl (the release the planner targets) and the rollout engine the job names
  (vLLM or SGLang) import in the trainer's Python -- ``import verl.trainer.main_ppo``, which
  loads verl's runtime dependencies too -- and CUDA sees GPUs there;
* the GPUs NVML reports: enough of them, of the planned type;
* the job's files: the model path has a readable ``config.json``; the data files exist;
* the Ray cluster answers, for ``--launcher ray``.

The trainer and GPU checks apply when the trainer runs here as verl's own entry point
(``python -m verl.trainer.main_ppo``, the default); a wrapper (``srun ...``, ``apptainer
exec ...``) or a Ray cluster runs it elsewhere, where ``doctor`` should run instead.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Sequence

VERL_MODULE = "verl.trainer.main_ppo"
IMPORT_TIMEOUT_S = 300.0  # importing verl with torch and vLLM takes 10-60 s on a cold cache

# Run in the trainer's interpreter: what imports, and what CUDA sees (JSON on the last line).
PROBE = r"""
import json, sys
out = {}
def last_line(error):
    text = f"{type(error).__name__}: {error}".strip().splitlines()
    return text[-1][:300] if text else type(error).__name__
for name in sys.argv[1:]:
    try:
        module = __import__(name, fromlist=["_"])
        out[name] = {"ok": True, "version": str(getattr(module, "__version__", ""))}
    except BaseException as error:
        out[name] = {"ok": False, "error": last_line(error)}
try:
    import torch
    out["cuda"] = {"ok": bool(torch.cuda.is_available()), "count": torch.cuda.device_count(),
                   "name": torch.cuda.get_device_name(0) if torch.cuda.is_available() else ""}
except BaseException as error:
    out["cuda"] = {"ok": False, "error": last_line(error)}
print(json.dumps(out))
"""


@dataclass(frozen=True)
class Check:
    name: str
    status: str  # "ok", "fail" or "skip"
    detail: str  # what was found (ok), the fix (fail), why not (skip)

    def line(self) -> str:
        return f"{self.status:<4}  {self.name}: {self.detail}"


@dataclass(frozen=True)
class DoctorInputs:
    trainer_command: tuple[str, ...]
    launcher: str  # "local" or "ray"
    rollout_engine: str  # "vllm" or "sglang"
    gpu_name: str  # the planned catalog GPU
    nvml_names: tuple[str, ...]  # its NVML name substrings
    gpus_needed: int  # on this node
    model_path: str | None
    data_files: tuple[tuple[str, str | None], ...]  # (flag, value)
    ray_address: str | None = None
    verl_version: str = ""
    # the asynchronous modes' entry modules a ``tune --mode`` study runs (verl.experimental)
    entry_modules: tuple[str, ...] = ()


def runs_verl_here(inputs: DoctorInputs) -> str | None:
    """The trainer's Python when the trainer is verl's entry point run on this machine; None
    otherwise."""
    argv = inputs.trainer_command
    if inputs.launcher != "local" or len(argv) < 3:
        return None
    if argv[1:3] == ("-m", VERL_MODULE) and "python" in Path(argv[0]).name:
        return shutil.which(argv[0])
    return None


def probe_trainer(python: str, modules: Sequence[str], timeout_s: float = IMPORT_TIMEOUT_S,
                  env: dict | None = None) -> dict:
    """Import ``modules`` in ``python`` (a subprocess: an argument list, no shell) and ask
    torch about CUDA; {module: {"ok", "version" | "error"}, "cuda": {...}}."""
    try:
        done = subprocess.run([python, "-c", PROBE, *modules], stdin=subprocess.DEVNULL,
                              capture_output=True, text=True, timeout=timeout_s,
                              env=env if env is not None else dict(os.environ))
    except subprocess.TimeoutExpired:
        return {name: {"ok": False, "error": f"import took over {timeout_s:g} s"}
                for name in modules}
    except OSError as error:
        return {name: {"ok": False, "error": str(error)} for name in modules}
    lines = done.stdout.strip().splitlines()
    try:
        return json.loads(lines[-1])
    except (IndexError, ValueError):
        tail = (done.stderr.strip().splitlines() or ["no output"])[-1][:300]
        return {name: {"ok": False, "error": tail} for name in modules}


def trainer_checks(inputs: DoctorInputs, probe: Callable[..., dict] = probe_trainer
                   ) -> list[Check]:
    python = runs_verl_here(inputs)
    if python is None:
        where = ("the trials run on the Ray cluster" if inputs.launcher == "ray"
                 else f"--trainer-command runs {' '.join(inputs.trainer_command[:3])}, not "
                      f"`python -m {VERL_MODULE}` here")
        why = f"{where}; run `plan-parallel doctor` where the trainer runs"
        return [Check("verl", "skip", why), Check("cuda", "skip", why)]
    engine = inputs.rollout_engine
    modules = [VERL_MODULE, *inputs.entry_modules]
    found = probe(python, [*modules, engine])
    checks = []
    broken = next((name for name in modules if not found.get(name, {}).get("ok")), None)
    verl = dict(found.get(broken or VERL_MODULE, {}))
    if broken not in (None, VERL_MODULE):  # verl imports, not its experimental entry point
        verl["error"] = f"{broken}: {verl.get('error', 'does not import')}"
    if broken is None:
        checks.append(Check("verl", "ok", f"{', '.join(modules)} import in {python}"
                            if len(modules) > 1 else f"{VERL_MODULE} imports in {python}"))
    else:
        checks.append(Check("verl", "fail", (
            f"{verl.get('error', 'does not import')} -- fix: install verl=={inputs.verl_version} "
            f"and its runtime dependencies in {python} (verl's container image has them), "
            f"or pass --trainer-command with the Python that has them")))
    module = found.get(engine, {})
    if module.get("ok"):
        version = module.get("version") or "?"
        checks.append(Check(engine, "ok", f"{engine} {version} imports (rollout engine)"))
    else:
        checks.append(Check(engine, "fail", (
            f"{module.get('error', 'does not import')} -- fix: install the rollout engine "
            f"verl {inputs.verl_version} pins for {engine} (pip install 'verl[{engine}]=="
            f"{inputs.verl_version}'), or choose the one you have with --rollout-engine")))
    cuda = found.get("cuda", {})
    if cuda.get("ok") and cuda.get("count", 0) >= inputs.gpus_needed:
        checks.append(Check("cuda", "ok", f"torch sees {cuda['count']} GPU(s) "
                                          f"({cuda.get('name', '')})"))
    elif cuda.get("ok"):
        checks.append(Check("cuda", "fail", (
            f"torch sees {cuda.get('count')} GPU(s), the trials need {inputs.gpus_needed} -- "
            f"fix: check CUDA_VISIBLE_DEVICES, or plan for --gpus-per-node "
            f"{cuda.get('count')}")))
    else:
        checks.append(Check("cuda", "fail", (
            f"{cuda.get('error') or 'torch.cuda.is_available() is False'} -- fix: install the "
            f"CUDA build of torch verl pins, and check the NVIDIA driver (nvidia-smi)")))
    return checks


def gpu_check(inputs: DoctorInputs, detect: Callable[[], object] | None = None) -> Check:
    if inputs.launcher != "local":
        return Check("gpus", "skip", "the trials run on the Ray cluster's GPUs")
    if detect is None:
        from planner.catalog.hardware import detect_local_gpus as detect
    found = detect()
    if found is None:
        return Check("gpus", "fail", (
            "NVML reports no GPU (no NVIDIA driver, or nvidia-ml-py missing) -- fix: run on a "
            "GPU node with the driver loaded; `nvidia-smi` must list the GPUs"))
    matches = any(token.lower() in found.name.lower() for token in inputs.nvml_names)
    if not matches:
        return Check("gpus", "fail", (
            f"this node has {found.count} x {found.name}, the plan is for {inputs.gpu_name} -- "
            f"fix: pass --gpu-type for these GPUs (or run on {inputs.gpu_name} nodes)"))
    if found.count < inputs.gpus_needed:
        return Check("gpus", "fail", (
            f"{found.count} x {found.name} here, the trials need {inputs.gpus_needed} per node "
            f"-- fix: pass --gpus-per-node {found.count} or run on a larger node"))
    return Check("gpus", "ok", f"{found.count} x {found.name} (NVML), planned {inputs.gpu_name}")


def _local(path: str) -> bool:
    return "://" not in path


def model_check(path: str | None) -> Check:
    if not path:
        return Check("model", "fail", "no model path -- fix: pass --model-path DIR (or set "
                                      "$MODEL_PATH)")
    if not _local(path):
        return Check("model", "skip", f"{path} is not a local path; verl copies it at start")
    directory = Path(path).expanduser()
    if not directory.exists():
        looks_like_hub_id = not path.startswith(("/", ".", "~")) and path.count("/") == 1
        if looks_like_hub_id:
            return Check("model", "skip", f"{path} is no local directory; verl will ask the "
                                          f"Hugging Face Hub for it")
        return Check("model", "fail", f"{path} does not exist -- fix: pass --model-path with "
                                      f"the downloaded model directory "
                                      f"(`hf download ORG/NAME --local-dir DIR`)")
    config = directory / "config.json"
    try:
        data = json.loads(config.read_text())
    except OSError as error:
        return Check("model", "fail", f"{config} cannot be read ({error.strerror}) -- fix: "
                                      f"point --model-path at the HF model directory")
    except (ValueError, UnicodeDecodeError) as error:
        return Check("model", "fail", f"{config} is not JSON ({str(error)[:80]}) -- fix: "
                                      f"download the model again")
    kind = data.get("model_type", "?") if isinstance(data, dict) else "?"
    return Check("model", "ok", f"{config} readable (model_type {kind})")


def split_files(value: str) -> list[str]:
    """verl's data.train_files: one path, or a Hydra list ``[a.parquet,b.parquet]``."""
    text = value.strip()
    if text.startswith("[") and text.endswith("]"):
        text = text[1:-1]
    return [part.strip().strip("'\"") for part in text.split(",") if part.strip()]


def data_checks(files: Sequence[tuple[str, str | None]]) -> list[Check]:
    checks = []
    for flag, value in files:
        name = flag.lstrip("-")
        if not value:
            checks.append(Check(name, "fail", f"not given -- fix: pass {flag} FILE.parquet"))
            continue
        missing = [path for path in split_files(value)
                   if _local(path) and not Path(path).expanduser().is_file()]
        if missing:
            checks.append(Check(name, "fail", (
                f"{missing[0]} does not exist -- fix: prepare the data (e.g. verl's "
                f"examples/data_preprocess/gsm8k.py) and pass {flag}")))
        else:
            checks.append(Check(name, "ok", f"{value} exists"))
    return checks


def ray_check(inputs: DoctorInputs, client_factory: Callable | None = None) -> Check:
    if inputs.launcher != "ray":
        return Check("ray", "skip", "--launcher local")
    from trials.storage import mask_url

    address = inputs.ray_address or "http://127.0.0.1:8265"
    try:
        if client_factory is None:
            from ray.job_submission import JobSubmissionClient as client_factory
        client_factory(address).list_jobs()
    except Exception as error:  # noqa: BLE001 - unreachable, wrong address, ray missing
        first = str(error).strip().splitlines()[0] if str(error).strip() else \
            type(error).__name__
        return Check("ray", "fail", f"{mask_url(address)} does not answer ({mask_url(first)[:160]})"
                                    f" -- fix: start the cluster (`ray start --head "
                                    f"--dashboard-host=0.0.0.0`) or pass --ray-address")
    return Check("ray", "ok", f"the Ray Jobs API answers at {mask_url(address)}")


def run_checks(inputs: DoctorInputs, *, probe: Callable[..., dict] = probe_trainer,
               detect: Callable[[], object] | None = None,
               ray_client: Callable | None = None) -> list[Check]:
    checks = trainer_checks(inputs, probe)
    if runs_verl_here(inputs) is not None:
        checks.append(gpu_check(inputs, detect))
    else:
        checks.append(Check("gpus", "skip", checks[0].detail.split("; ")[0]))
    checks.append(model_check(inputs.model_path))
    checks.extend(data_checks(inputs.data_files))
    checks.append(ray_check(inputs, ray_client))
    return checks
