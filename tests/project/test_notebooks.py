"""The notebooks run top to bottom (executed with nbclient), so they never rot."""

from pathlib import Path

import pytest

pytestmark = pytest.mark.needs("notebooks")

NOTEBOOKS = Path(__file__).resolve().parents[2] / "notebooks"


def execute(path: Path, cwd: Path) -> None:
    nbformat = pytest.importorskip("nbformat")
    nbclient = pytest.importorskip("nbclient")
    notebook = nbformat.read(path, as_version=4)
    client = nbclient.NotebookClient(notebook, timeout=300, kernel_name="python3",
                                     resources={"metadata": {"path": str(cwd)}})
    client.execute()
    errors = [output for cell in notebook.cells if cell.cell_type == "code"
              for output in cell.get("outputs", []) if output.get("output_type") == "error"]
    assert not errors


def test_explore_plan_notebook(tmp_path):
    execute(NOTEBOOKS / "explore_plan.ipynb", tmp_path)


def test_analyse_sweep_notebook(tmp_path, monkeypatch):
    """Against a small sweep made here by the fake trainer (tests/fixtures)."""
    from fixtures.tuning import FAKE_ENV, tune_argv, write_config

    from planner.cli.main import main

    config = write_config(tmp_path / "fake.json", step_sleep_s=0.01,
                          throughput={"base": 900.0, "factors": {"tp": {"2": 1.2}}},
                          rules=[{"match": {"tp": 2, "micro_batch": 8}, "behaviour": "oom",
                                  "phase": "update_actor", "at_step": 2}])
    monkeypatch.setenv(FAKE_ENV, str(config))
    assert main(tune_argv(tmp_path, "--top-k", "3", "--seed", "2", trials=6)) == 0
    monkeypatch.setenv("PLAN_PARALLEL_SWEEP", str(tmp_path / "sweep"))
    execute(NOTEBOOKS / "analyse_sweep.ipynb", tmp_path)
    assert main(["report", str(tmp_path / "sweep")]) == 0
    assert (tmp_path / "sweep" / "report.html").stat().st_size > 10_000
