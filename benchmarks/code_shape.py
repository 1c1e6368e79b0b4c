"""The shape of the code below the CLI, in numbers a refactor can be judged by.

    python benchmarks/code_shape.py [--root DIR] [--schema FILE] [--list]

Reads the source of ``planner/`` and ``trials/`` under ``--root`` (default: this checkout) with
``ast`` -- nothing is imported -- and prints:

* **parameters per function** below ``planner/cli/``: every ``def`` of ``planner/`` outside
  ``planner/cli/`` and ``planner/__main__.py`` (methods without ``self``/``cls``; ``*args`` and
  ``**kwargs`` count one each): how many, the largest count, the mean, and how many take more
  than :data:`MAX_PARAMETERS`; the same for ``trials/``;
* **result key reads**: reads by string key (``x["key"]``, ``x.get("key")``, ``x.pop("key")``)
  of a key that only a result has -- a property name of the candidate-level objects of the JSON
  contract (``--schema``, default this checkout's ``docs/plan.schema.json``: the
  :data:`RESULT_DEFS`) that is not also a cost-model column or a layout field
  (``planner.cost.columns``, ``planner.search.layout``: their reads are the vectorised
  columns), a phase or a part name, or a verl config section (:data:`NOT_RESULT_KEYS`) --
  outside the output module (:data:`OUTPUT_MODULE`);
* **workload kind checks**: comparisons of a ``kind`` attribute (or ``getattr(.., "kind")``)
  with a workload kind (``"grpo"``, ``"pretrain"``);
* **modules that name a training mode**: modules outside ``planner/modes/`` holding the exact
  string of a built-in mode (``"sync"``, ``"one-step-off"``, ``"fully-async"``) -- what a new
  mode would have to be added to.

``--list`` names every function over the limit, every read, check and module.  To measure
another checkout against this one's contract: ``--root /path/to/main``.
"""

from __future__ import annotations

import argparse
import ast
import json
import statistics
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
MAX_PARAMETERS = 5
OUTPUT_MODULE = "planner/output.py"
WORKLOAD_KINDS = ("grpo", "pretrain")
MODE_NAMES = ("sync", "one-step-off", "fully-async")
READ_METHODS = ("get", "pop", "setdefault")
# the $defs of the schema whose property names are result keys: a candidate and its parts
RESULT_DEFS = ("colocatedCandidate", "splitFields", "placement", "staleness", "trainerPool",
               "rolloutPool", "blocked", "sizing")
# names that are keys of results but also of everything else: phases and parts (the keys of
# per-phase and per-part objects), verl's config sections
NOT_RESULT_KEYS = {"generate", "old_log_prob", "ref", "update_actor", "weight_sync", "train",
                   "compute", "comm", "bubble", "host_transfer", "latency", "gather",
                   "broadcast", "load", "total", "weights", "grads", "optimizer",
                   "rollout", "trainer", "actor", "data", "model", "mode", "rows", "types",
                   "workload", "run", "prices", "text", "steps"}


def sources(root: Path, package: str) -> list[Path]:
    return sorted((root / package).rglob("*.py"))


def relative(path: Path, root: Path) -> str:
    return path.relative_to(root).as_posix()


def parameters(node: ast.FunctionDef | ast.AsyncFunctionDef) -> int:
    args = node.args
    names = [a.arg for a in args.posonlyargs + args.args + args.kwonlyargs]
    if names and names[0] in ("self", "cls"):
        names = names[1:]
    return len(names) + (args.vararg is not None) + (args.kwarg is not None)


def function_parameters(root: Path, package: str, skip: tuple[str, ...] = ()
                        ) -> list[tuple[int, str]]:
    out = []
    for path in sources(root, package):
        name = relative(path, root)
        if name.startswith(skip):
            continue
        for node in ast.walk(ast.parse(path.read_text(), name)):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                out.append((parameters(node), f"{name}:{node.lineno} {node.name}"))
    return out


def schema_keys(schema: dict) -> set[str]:
    """Every property name anywhere in the :data:`RESULT_DEFS` of a JSON Schema."""
    keys: set[str] = set()
    stack = [schema["$defs"][name] for name in RESULT_DEFS if name in schema.get("$defs", {})]
    while stack:
        node = stack.pop()
        if isinstance(node, dict):
            keys.update((node.get("properties") or {}).keys())
            stack.extend(node.values())
        elif isinstance(node, list):
            stack.extend(node)
    return keys


def column_keys(root: Path) -> set[str]:
    """Cost-model column names and layout fields, read from their modules' source: the
    ``SCHEMA`` keys and name patterns of ``planner/cost/columns.py`` and the ``Layout`` fields."""
    keys: set[str] = set()
    columns = ast.parse((root / "planner/cost/columns.py").read_text())
    for node in ast.walk(columns):
        if isinstance(node, ast.Dict):
            keys.update(k.value for k in node.keys
                        if isinstance(k, ast.Constant) and isinstance(k.value, str))
        if isinstance(node, ast.Assign) and any(getattr(t, "id", "") in
                                                ("BREAKDOWN_PARTS", "TIME_PARTS")
                                                for t in node.targets):
            keys.update(ast.literal_eval(node.value))
    layout = ast.parse((root / "planner/search/layout.py").read_text())
    for node in ast.walk(layout):
        if isinstance(node, ast.ClassDef) and node.name == "Layout":
            keys.update(item.target.id for item in node.body if isinstance(item, ast.AnnAssign))
    return keys | {"rank", "fits"}


def string_reads(tree: ast.AST):
    """(line, key) of every read by string literal: subscripts and .get/.pop/.setdefault."""
    for node in ast.walk(tree):
        if (isinstance(node, ast.Subscript) and isinstance(node.ctx, ast.Load)
                and isinstance(node.slice, ast.Constant) and isinstance(node.slice.value, str)):
            yield node.lineno, node.slice.value
        elif (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
              and node.func.attr in READ_METHODS and node.args
              and isinstance(node.args[0], ast.Constant) and isinstance(node.args[0].value, str)):
            yield node.lineno, node.args[0].value


def result_reads(root: Path, keys: set[str]) -> list[str]:
    out = []
    for package in ("planner", "trials"):
        for path in sources(root, package):
            name = relative(path, root)
            if name == OUTPUT_MODULE:
                continue
            for line, key in string_reads(ast.parse(path.read_text(), name)):
                if key in keys:
                    out.append(f"{name}:{line} {key!r}")
    return out


def _is_kind(node: ast.AST) -> bool:
    if isinstance(node, ast.Attribute) and node.attr == "kind":
        return True
    return (isinstance(node, ast.Call) and getattr(node.func, "id", "") == "getattr"
            and len(node.args) >= 2 and isinstance(node.args[1], ast.Constant)
            and node.args[1].value == "kind")


def kind_checks(root: Path) -> list[str]:
    out = []
    for package in ("planner", "trials"):
        for path in sources(root, package):
            name = relative(path, root)
            for node in ast.walk(ast.parse(path.read_text(), name)):
                if not isinstance(node, ast.Compare):
                    continue
                sides = [node.left, *node.comparators]
                literal = any(isinstance(s, ast.Constant) and s.value in WORKLOAD_KINDS
                              for s in sides)
                if literal and any(_is_kind(s) for s in sides):
                    out.append(f"{name}:{node.lineno}")
    return out


def mode_modules(root: Path) -> dict[str, int]:
    out: dict[str, int] = {}
    for package in ("planner", "trials"):
        for path in sources(root, package):
            name = relative(path, root)
            if name.startswith("planner/modes/"):
                continue
            count = sum(1 for node in ast.walk(ast.parse(path.read_text(), name))
                        if isinstance(node, ast.Constant) and node.value in MODE_NAMES)
            if count:
                out[name] = count
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--root", type=Path, default=REPO, help="checkout to measure")
    parser.add_argument("--schema", type=Path, default=REPO / "docs" / "plan.schema.json",
                        help="the JSON contract whose keys are result keys")
    parser.add_argument("--list", action="store_true", help="name every hit")
    args = parser.parse_args(argv)
    root = args.root.resolve()

    for package, skip in (("planner", ("planner/cli/", "planner/__main__.py")), ("trials", ())):
        counts = function_parameters(root, package, skip)
        over = sorted((c for c in counts if c[0] > MAX_PARAMETERS), reverse=True)
        values = [n for n, _ in counts]
        below = " below planner/cli/" if package == "planner" else ""
        print(f"parameters per function, {package}/{below}: {len(values)} functions, max "
              f"{max(values)}, mean {statistics.mean(values):.2f}, "
              f"{len(over)} over {MAX_PARAMETERS}")
        if args.list:
            print("".join(f"    {n} {where}\n" for n, where in over), end="")

    if args.schema.is_file():
        keys = (schema_keys(json.loads(args.schema.read_text())) - column_keys(root)
                - NOT_RESULT_KEYS)
        reads = result_reads(root, keys)
        modules = sorted({hit.split(":")[0] for hit in reads})
        print(f"result key reads outside {OUTPUT_MODULE}: {len(reads)} in {len(modules)} "
              f"modules ({len(keys)} result-only keys from {args.schema.name})")
        if args.list:
            print("".join(f"    {hit}\n" for hit in reads), end="")
    else:
        print(f"result key reads: no schema at {args.schema}", file=sys.stderr)

    checks = kind_checks(root)
    print(f"workload kind checks: {len(checks)} in {len({c.split(':')[0] for c in checks})} "
          f"modules")
    if args.list:
        print("".join(f"    {hit}\n" for hit in checks), end="")

    named = mode_modules(root)
    print(f"modules outside planner/modes/ that name a training mode: {len(named)} "
          f"({sum(named.values())} literals)")
    if args.list:
        print("".join(f"    {name} ({count})\n" for name, count in sorted(named.items())), end="")
    return 0


if __name__ == "__main__":
    sys.exit(main())
