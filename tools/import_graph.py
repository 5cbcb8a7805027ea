"""The import graph of the project's packages, counted: modules, edges, cycles, largest modules.

    python -m tools.import_graph                        # api and serving, this checkout
    python -m tools.import_graph --root /other/checkout api serving

The graph is grimp's (the library `lint-imports` checks the contracts on), so these are the
imports the contracts see: every import statement, at module level or inside a function,
including those under `if TYPE_CHECKING:`. An edge is one importing module -> one imported
module, however many statements say it. A cycle is a strongly connected group of modules
(each reaches every other through imports); its size is how many modules it holds.
Generated protobuf code (`*_pb2`, `*_pb2_grpc`) is left out of every figure: it is not
written by hand and imports only other generated modules.

Prints one table per package, the cycles found, then every folder (package) with its
hand-written modules, their lines and the layer it sits in -- read from the `layers` contracts
of `[tool.importlinter]` in the checkout's pyproject.toml, the ones `lint-imports` holds, so
the figure cannot drift from the contract -- and the ten largest modules by lines.
"""

from __future__ import annotations

import argparse
import re
import sys
import tomllib
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import grimp


@dataclass(frozen=True)
class PackageFigures:
    """One top-level package's import graph, generated modules left out."""

    name: str
    modules: int
    edges: int
    cycles: list[list[str]]  # each sorted; the largest first


@dataclass(frozen=True)
class Layer:
    """Where a module sits in a `layers` contract: the `number`-th of `count` layers, 1 = top."""

    contract: str
    number: int
    count: int
    names: str  # the layer as the contract writes it, e.g. "app | http_server"

    def __str__(self) -> str:
        return f"{self.number} of {self.count} ({self.names})"


def contract_layers(pyproject: Path) -> dict[str, Layer]:
    """Module -> its layer, for every module a `layers` contract of `[tool.importlinter]` names
    (`container.name` when the contract has containers). Empty without such contracts."""
    if not pyproject.is_file():
        return {}
    config = tomllib.loads(pyproject.read_text()).get("tool", {}).get("importlinter", {})
    found: dict[str, Layer] = {}
    for contract in config.get("contracts", []):
        if contract.get("type") != "layers":
            continue
        layers = contract.get("layers", [])
        for container in contract.get("containers", []) or [""]:
            for number, names in enumerate(layers, 1):
                layer = Layer(contract.get("id", contract.get("name", "?")), number, len(layers), names.strip())
                for name in filter(None, (n.strip() for n in re.split(r"[|:]", names))):
                    found[f"{container}.{name}" if container else name] = layer
    return found


def layer_of(module: str, layers: Mapping[str, Layer]) -> Layer | None:
    """The layer of `module`: that of the nearest of itself and its ancestors a contract names."""
    while module:
        if module in layers:
            return layers[module]
        module = module.rpartition(".")[0]
    return None


def folder_rows(root: Path, packages: Sequence[str], layers: Mapping[str, Layer]) -> list[tuple[str, int, int, str]]:
    """Each folder of `packages` under `root` with hand-written modules in it or below:
    (path, modules, lines, layer); folders of generated code only are left out. A folder
    inside a layer reads as that layer; one that holds layers itself (a contract's container)
    lists the layers of the modules directly in it."""
    rows = []
    for package in packages:
        top = root / package.replace(".", "/")
        for folder in sorted([top, *(p.parent for p in top.rglob("*/__init__.py"))]):
            modules = [p for p in sorted(folder.glob("*.py")) if not is_generated(p.stem)]
            if not any(p.name != "__init__.py" and not is_generated(p.stem) for p in folder.rglob("*.py")):
                continue  # generated code and the `__init__` files written with it
            dotted = folder.relative_to(root).as_posix().replace("/", ".")
            lines = sum(len(p.read_bytes().splitlines()) for p in modules)
            layer = layer_of(dotted, layers)
            if layer is not None:
                where = str(layer)
            else:
                own = {m.stem: layer_of(f"{dotted}.{m.stem}", layers) for m in modules if m.stem != "__init__"}
                placed = [f"{name} {found}" for name, found in own.items() if found is not None]
                contract = next((f for f in own.values() if f is not None), None)
                where = f"holds the layers of {contract.contract}; {', '.join(placed)}" if contract else "-"
            rows.append((folder.relative_to(root).as_posix() + "/", len(modules), lines, where))
    return rows


def is_generated(module: str) -> bool:
    """Protoc's output (`make protos`): `foo_pb2`, `foo_pb2_grpc`."""
    leaf = module.rsplit(".", 1)[-1]
    return leaf.endswith("_pb2") or leaf.endswith("_pb2_grpc")


def generated_modules(graph: grimp.ImportGraph, modules: Iterable[str]) -> set[str]:
    """Of `modules`, protoc's output and the packages that hold nothing else (their
    `__init__` files are written by `make protos` too)."""
    generated = set()
    for module in modules:
        leaves = {d for d in graph.find_descendants(module) | {module} if not graph.find_children(d)}
        if all(is_generated(leaf) for leaf in leaves):
            generated.add(module)
    return generated


def strongly_connected(graph: Mapping[str, Iterable[str]]) -> list[list[str]]:
    """Tarjan's strongly connected components of `graph` (module -> modules it imports).

    Iterative (no recursion limit on deep graphs). Returns the components of more than one
    module, or of one module that imports itself, each sorted, the largest first.
    """
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    on_stack: set[str] = set()
    stack: list[str] = []
    found: list[list[str]] = []
    for start in sorted(graph):
        if start in index:
            continue
        work: list[tuple[str, list[str]]] = [(start, sorted(graph[start]))]
        index[start] = low[start] = len(index)
        stack.append(start)
        on_stack.add(start)
        while work:
            node, todo = work[-1]
            if todo:
                child = todo.pop()
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, sorted(graph.get(child, ()))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                parent = work[-1][0]
                low[parent] = min(low[parent], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1 or node in graph.get(node, ()):
                    found.append(sorted(component))
    return sorted(found, key=lambda c: (-len(c), c))


def package_figures(graph: grimp.ImportGraph, package: str) -> PackageFigures:
    """Modules, edges and cycles among the hand-written modules of `package`."""
    every = graph.find_descendants(package) | {package}
    modules = every - generated_modules(graph, every)
    edges = {m: {i for i in graph.find_modules_directly_imported_by(m) if i in modules} for m in modules}
    return PackageFigures(
        name=package,
        modules=len(modules),
        edges=sum(len(imported) for imported in edges.values()),
        cycles=strongly_connected(edges),
    )


def module_lines(root: Path, packages: Sequence[str], count: int) -> list[tuple[int, str]]:
    """The `count` largest hand-written modules of `packages` under `root`: (lines, path)."""
    sizes = []
    for package in packages:
        for path in sorted((root / package.replace(".", "/")).rglob("*.py")):
            if is_generated(path.stem):
                continue
            with path.open("rb") as f:
                sizes.append((sum(1 for _ in f), path.relative_to(root).as_posix()))
    return sorted(sizes, key=lambda s: (-s[0], s[1]))[:count]


def report(root: Path, packages: Sequence[str], largest: int = 10) -> str:
    """The figures for `packages` of the checkout at `root`, as text."""
    sys.path.insert(0, str(root))  # these packages, not another checkout's on the path
    try:
        graph = grimp.build_graph(*packages, cache_dir=None)
    finally:
        sys.path.remove(str(root))
    figures = [package_figures(graph, p) for p in packages]
    lines = [
        f"import graph of {', '.join(packages)} (grimp {grimp.__version__}; function-local and "
        "TYPE_CHECKING imports counted; generated *_pb2 modules left out)",
        "",
    ]
    width = max(len("package"), *(len(p) for p in packages))
    lines.append(f"{'package':<{width}}  {'modules':>7} {'edges':>6} {'cycles':>6} {'in cycles':>9}")
    for f in figures:
        in_cycles = sum(len(c) for c in f.cycles)
        lines.append(f"{f.name:<{width}}  {f.modules:>7} {f.edges:>6} {len(f.cycles):>6} {in_cycles:>9}")
    cross = [
        (importer, imported)
        for a in packages
        for b in packages
        if a != b
        for importer, imported in _imports_between(graph, a, b)
    ]
    lines.append(f"imports between these packages: {len(cross)}")
    for importer, imported in cross:
        lines.append(f"  {importer} -> {imported}")
    lines += ["", "cycles:"]
    cycles = [c for f in figures for c in f.cycles]
    lines += [f"  {len(c)} modules: {', '.join(c)}" for c in cycles] or ["  none"]
    rows = folder_rows(root, packages, contract_layers(root / "pyproject.toml"))
    lines += [
        "",
        "folders: hand-written modules, their lines, and the layer the folder sits in (pyproject.toml's "
        "layers contracts, 1 = top):",
    ]
    path_width = max([len("folder"), *(len(r[0]) for r in rows)])
    lines.append(f"  {'folder':<{path_width}}  {'modules':>7} {'lines':>6}  layer")
    lines += [f"  {path:<{path_width}}  {n:>7} {size:>6}  {where}" for path, n, size, where in rows]
    lines += ["", f"largest {largest} modules (lines):"]
    lines += [f"  {n:>5}  {path}" for n, path in module_lines(root, packages, largest)]
    return "\n".join(lines)


def _imports_between(graph: grimp.ImportGraph, source: str, target: str) -> list[tuple[str, str]]:
    pairs = set()
    for importer in graph.find_descendants(source) | {source}:
        for imported in graph.find_modules_directly_imported_by(importer):
            if imported == target or imported.startswith(target + "."):
                pairs.add((importer, imported))
    return sorted(pairs)


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description="The import graph of the project's packages, counted.")
    parser.add_argument("packages", nargs="*", default=["api", "serving"], help="top-level packages (api serving)")
    parser.add_argument("--root", type=Path, default=Path.cwd(), help="the checkout to read (this directory)")
    args = parser.parse_args(argv)
    print(report(args.root.resolve(), args.packages))


if __name__ == "__main__":
    main()
