"""The package layout: imports point one way, SimPy only in process modules, golden results."""

import ast
import json
from pathlib import Path

import pytest

from tests.golden.make_golden import CASES, run_case

ROOT = Path(__file__).resolve().parent.parent / "simsched"
# Lower layers never import higher ones (api and cli sit on top; config only needs the
# catalogs below it, so every layer above may read it).
LAYERS = {
    "request": 0, "workloads": 0, "policies": 1, "cost": 1,
    "config": 1.5, "engine": 2, "cluster": 3, "analysis": 4, "api": 6, "cli": 7, "__main__": 8,
    "__init__": 9,
}
SIMPY_MODULES = {"simsched.engine.replica", "simsched.engine.simpy_fast", "simsched.cluster.cluster",
                 "simsched.cluster.disagg", "simsched.cluster.sessions"}


def _modules():
    for path in ROOT.rglob("*.py"):
        rel = path.relative_to(ROOT.parent).with_suffix("")
        name = ".".join(rel.parts)
        if name.endswith(".__init__"):
            name = name[: -len(".__init__")]
        yield name, path


def _imports(path: Path) -> set[str]:
    """Every simsched module a file imports, at module level or inside functions."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module:
            found.add(node.module)
            found |= {f"{node.module}.{a.name}" for a in node.names}
    return found


def _layer(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "__init__"


def test_imports_point_one_way_and_have_no_cycles():
    modules = dict(_modules())
    graph = {m: {i for i in _imports(p) if i in modules and i != m} for m, p in modules.items()}
    for mod, deps in graph.items():
        for dep in deps:
            if _layer(dep) == _layer(mod):
                continue
            assert LAYERS[_layer(dep)] < LAYERS[_layer(mod)], f"{mod} imports {dep} (upward)"
    # no cycle among modules (depth-first search for a back edge)
    state: dict[str, int] = {}

    def visit(m, stack):
        state[m] = 1
        for d in graph[m]:
            if d.startswith(m + "."):       # a package importing its own submodule
                continue
            if state.get(d) == 1:
                raise AssertionError(f"import cycle: {' -> '.join(stack + [d])}")
            if d not in state:
                visit(d, stack + [d])
        state[m] = 2

    for m in graph:
        if m not in state:
            visit(m, [m])


def test_simpy_only_in_process_modules():
    for mod, path in _modules():
        if any(i == "simpy" or i.startswith("simpy.") for i in _imports(path)):
            assert mod in SIMPY_MODULES, f"{mod} imports simpy"


@pytest.mark.parametrize("name", sorted(CASES))
def test_golden_frames_are_bit_identical(name):
    golden = json.loads((Path(__file__).parent / "golden" / "frames.json").read_text())
    assert run_case(CASES[name]) == golden[name]
