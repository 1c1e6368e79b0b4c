"""The package's layering: no import cycles, no import of a higher layer, nothing but the CLI
imports the CLI (benchmarks/import_graph.py prints the graph)."""

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from fixtures.imports import imported_by  # noqa: E402

from benchmarks import import_graph  # noqa: E402


def test_no_cycles_no_upward_imports_and_nothing_imports_the_cli():
    edges = import_graph.graph()
    assert len(edges) > 50  # every module of planner/ and trials/ was read
    assert import_graph.problems(edges) == []


def test_the_checker_finds_a_cycle_and_an_upward_import():
    edges = {"planner.search.rules": {"planner.cost.memory"},
             "planner.cost.memory": {"planner.search.rules"},
             "planner.plan": {"planner.cli.main"}, "planner.cli.main": set()}
    found = import_graph.problems(edges)
    assert any(p.startswith("cycle: planner.cost.memory <-> planner.search.rules") for p in found)
    assert any("planner.search.rules (search) imports planner.cost.memory (cost)" in p
               for p in found)
    assert any("planner.plan imports planner.cli.main: nothing below the CLI may" in p
               for p in found)


def test_the_script_prints_the_graph_by_layer():
    result = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "import_graph.py")],
                            capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    first, last = import_graph.LAYER_NAMES[0], import_graph.LAYER_NAMES[-1]
    assert f"0 {first}" in result.stdout
    assert f"{len(import_graph.LAYER_NAMES) - 1} {last}" in result.stdout
    assert "0 problem(s)" in result.stderr


def test_every_module_has_a_layer_and_the_list_is_the_one_the_docs_name():
    edges = import_graph.graph()
    assert all(import_graph.layer_of(name) >= 0 for name in edges)
    assert import_graph.layer_of("planner.nothing_here") == -1  # a new module must be placed
    assert any("belongs to no layer" in p for p in
               import_graph.problems({"planner.nothing_here": set()}))
    # the package docstring points here rather than keeping its own copy
    import planner
    assert "benchmarks/import_graph.py" in planner.__doc__
    assert "->" not in planner.__doc__.split("Layers", 1)[1]


def test_planning_imports_no_heavy_package():
    heavy, output = imported_by(
        ["--model", "qwen3-8b", "--gpus", "8", "--gpu-type", "h100", "--top", "1"],
        ("torch", "verl", "optuna", "transformers", "megatron", "ray", "matplotlib", "hydra",
         "scipy"))
    assert heavy == [], output
