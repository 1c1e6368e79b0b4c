"""The package's layering: no import cycles, no import of a higher layer, nothing but the CLI
imports the CLI (benchmarks/import_graph.py prints the graph)."""

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

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
    assert "0 base" in result.stdout and "10 cli" in result.stdout
    assert "0 problem(s)" in result.stderr


def test_planning_imports_no_heavy_package():
    code = ("import sys\n"
            "from planner.cli import main\n"
            "main(['--model', 'qwen3-8b', '--gpus', '8', '--gpu-type', 'h100', '--top', '1'])\n"
            "heavy = [m for m in ('torch', 'verl', 'optuna', 'transformers', 'megatron', 'ray',"
            " 'matplotlib', 'hydra', 'scipy') if m in sys.modules]\n"
            "print('HEAVY', heavy)")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert "HEAVY []" in result.stdout, result.stdout + result.stderr
