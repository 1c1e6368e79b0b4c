"""The import graph of ``planner`` and ``trials``: prints it by layer and checks the layering.

    python benchmarks/import_graph.py [--dot]

Layers: :data:`LAYERS` below, lowest first (each module may import its own layer and those
below it, never above) -- the one list of the package's layers; ``--layers`` prints it, and
``planner/__init__.py``, the tests and the docs refer here.

Checks: no import cycle between modules (imports inside functions count too), no import of a
higher layer, and nothing but ``planner.cli`` (and ``planner.__main__``) imports ``planner.cli``.
Exit 1 and one line per problem when a check fails.
"""

from __future__ import annotations

import argparse
import ast
import sys
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("planner", "trials")
# The layers, lowest first: (name, what it holds, its modules).  A module belongs to the layer
# whose entry names it or the package it is in (the longest such entry); the root package
# ``planner`` is an entry by itself only.  A module no entry names is a problem.
LAYERS = (
    ("base", "errors, bounds, units, phases, policy, extras, versions",
     ("planner", "planner.errors", "planner.bounds", "planner.units", "planner.phases",
      "planner.policy", "planner.extras", "planner.versions")),
    ("catalog", "models, GPUs, clusters, workloads", ("planner.catalog",)),
    ("search", "layouts, rules, the search space", ("planner.search",)),
    ("cost", "memory, time, FLOPs, efficiency, columns", ("planner.cost",)),
    ("plan", "space -> cost -> ranking (the one ranker), the split of a cluster into pools",
     ("planner.plan", "planner.ranking", "planner.first_ties", "planner.step_bound",
      "planner.no_fit", "planner.results", "planner.placement")),
    ("sizing", "GPU counts and types, prices, the sweep over them (plans per count)",
     ("planner.sizing",)),
    ("output", "the one output module: units, rounding and the JSON contract of results",
     ("planner.output",)),
    ("verl", "keys, config, jobs, scripts, export, library", ("planner.verl",)),
    ("modes", "training modes as plug-ins: plan, estimate, explain, export per mode; the "
              "registry", ("planner.modes",)),
    ("trials", "Optuna studies, launchers (a sibling package)", ("trials",)),
    ("report", "text/JSON/CSV, HTML, plots", ("planner.report",)),
    ("diagnose", "validate, fix, diff, explain, profile", ("planner.diagnose",)),
    ("cli", "argument parsing, exit codes", ("planner.cli", "planner.__main__")),
)
LAYER_NAMES = tuple(name for name, _, _ in LAYERS)
ROOT_PACKAGE = "planner"


def layer_of(module: str) -> int:
    """Index into :data:`LAYERS` of ``module``'s layer; -1 when no entry names it."""
    best, found = -1, -1
    for index, (_, _, members) in enumerate(LAYERS):
        for member in members:
            exact_only = member == ROOT_PACKAGE
            if module == member or (not exact_only and module.startswith(member + ".")):
                if len(member) > best:
                    best, found = len(member), index
    return found


def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts = parts[:-1]
    return ".".join(parts)


def layers_text() -> str:
    """The layer list as the script prints it with ``--layers``."""
    return "\n".join(f"{index:>2} {name:<9} {what}"
                     for index, (name, what, _) in enumerate(LAYERS))


def modules() -> dict[str, Path]:
    found = {}
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            found[module_name(path)] = path
    return found


def _resolve(target: str, known: set[str]) -> str | None:
    """The project module an import names (``from planner.cost import timing`` names
    ``planner.cost.timing``; ``from planner.cost.timing import grpo_step`` the module)."""
    while target and target not in known:
        target = target.rpartition(".")[0]
    return target or None


def imports(path: Path, known: set[str]) -> set[str]:
    tree = ast.parse(path.read_text(), str(path))
    out = set()
    for node in ast.walk(tree):
        names = []
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names = [f"{node.module}.{alias.name}" for alias in node.names] + [node.module]
        for name in names:
            if name.split(".")[0] in PACKAGES:
                resolved = _resolve(name, known)
                if resolved:
                    out.add(resolved)
    return out


def graph() -> dict[str, set[str]]:
    found = modules()
    known = set(found)
    edges = {}
    for name, path in found.items():
        # a module's parent packages are imported with it implicitly: not edges
        edges[name] = {target for target in imports(path, known)
                       if target != name and not name.startswith(target + ".")}
    return edges


def cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan)."""
    index, low, on_stack, stack, out = {}, {}, set(), [], []
    counter = [0]

    def visit(node: str) -> None:
        index[node] = low[node] = counter[0]
        counter[0] += 1
        stack.append(node)
        on_stack.add(node)
        for target in edges.get(node, ()):
            if target not in index:
                visit(target)
                low[node] = min(low[node], low[target])
            elif target in on_stack:
                low[node] = min(low[node], index[target])
        if low[node] == index[node]:
            component = []
            while True:
                item = stack.pop()
                on_stack.discard(item)
                component.append(item)
                if item == node:
                    break
            if len(component) > 1:
                out.append(sorted(component))

    sys.setrecursionlimit(10_000)
    for node in sorted(edges):
        if node not in index:
            visit(node)
    return out


def problems(edges: dict[str, set[str]]) -> list[str]:
    found = [f"cycle: {' <-> '.join(component)}" for component in cycles(edges)]
    found += [f"{name} belongs to no layer: name it in LAYERS (benchmarks/import_graph.py)"
              for name in sorted(edges) if layer_of(name) < 0]
    for source, targets in sorted(edges.items()):
        for target in sorted(targets):
            if target.startswith("planner.cli") and not (
                    source.startswith("planner.cli") or source == "planner.__main__"):
                found.append(f"{source} imports {target}: nothing below the CLI may")
            elif min(layer_of(source), layer_of(target)) >= 0 \
                    and layer_of(target) > layer_of(source):
                found.append(f"{source} ({LAYER_NAMES[layer_of(source)]}) imports {target} "
                             f"({LAYER_NAMES[layer_of(target)]}), a higher layer")
    return found


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--dot", action="store_true", help="print Graphviz dot instead")
    parser.add_argument("--layers", action="store_true", help="print the layer list only")
    args = parser.parse_args(argv)
    if args.layers:
        print(layers_text())
        return 0
    edges = graph()
    if args.dot:
        print("digraph imports {")
        for source, targets in sorted(edges.items()):
            for target in sorted(targets):
                print(f'  "{source}" -> "{target}";')
        print("}")
    else:
        by_layer = defaultdict(list)
        for name in sorted(edges):
            by_layer[layer_of(name)].append(name)
        for layer, names in sorted(by_layer.items()):
            print(f"{layer} {LAYER_NAMES[layer] if layer >= 0 else '(no layer)'}")
            for name in names:
                targets = ", ".join(sorted(edges[name])) or "-"
                print(f"    {name} -> {targets}")
    found = problems(edges)
    for problem in found:
        print(f"problem: {problem}", file=sys.stderr)
    print(f"{len(edges)} modules, {sum(map(len, edges.values()))} imports, "
          f"{len(found)} problem(s)", file=sys.stderr)
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main())
