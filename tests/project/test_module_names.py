"""Every module name means one thing across the tree (issue 25): no two modules of the product
(``planner/``, ``trials/``) share a file name, and a module named like a package is only the
command-line face of that package (``planner/cli/sizing.py`` runs ``planner/sizing/``)."""
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
MODULES = [path for top in ("planner", "trials") for path in sorted((ROOT / top).rglob("*.py"))
           if path.name not in ("__init__.py", "__main__.py")]


def test_module_names_are_unique():
    by_name = defaultdict(list)
    for path in MODULES:
        by_name[path.stem].append(str(path.relative_to(ROOT)))
    repeated = {name: paths for name, paths in by_name.items() if len(paths) > 1}
    assert not repeated, f"module names used twice: {repeated}"


def test_a_module_named_like_a_package_is_its_command_line():
    packages = {path.parent.name for top in ("planner", "trials")
                for path in (ROOT / top).rglob("__init__.py")}
    clashing = [str(path.relative_to(ROOT)) for path in MODULES
                if path.stem in packages and path.parent.name != "cli"]
    assert not clashing, f"modules named like a package: {clashing}"


def test_tests_mirror_the_packages():
    """Tests live in folders named after what they test (``tests/cost/``, ``tests/verl_adapter/``, ...),
    shared helpers in ``tests/conftest.py`` and ``tests/fixtures/``."""
    loose = sorted(path.name for path in (ROOT / "tests").glob("test_*.py"))
    assert not loose, f"tests outside a package folder: {loose}"


def test_no_test_folder_shadows_a_package():
    """pytest puts ``tests/`` on ``sys.path`` (its conftest has no package), where a folder
    without ``__init__.py`` is a namespace package: ``tests/verl/`` would be imported as verl
    wherever verl is not installed.  So no test folder takes the name of a package the product
    imports."""
    imported = {"planner", "trials", "benchmarks", "verl", "megatron", "torch", "transformers",
                "optuna", "hydra", "omegaconf", "vllm", "sglang", "ray", "pynvml", "pandas",
                "numpy", "scipy", "mbridge", "psutil", "rich", "matplotlib", "jsonschema"}
    folders = {path.name for path in (ROOT / "tests").iterdir() if path.is_dir()}
    assert not folders & imported, sorted(folders & imported)
