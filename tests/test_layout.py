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
    "config": 1.5, "engine": 2, "cluster": 3, "analysis": 4, "fit": 5, "api": 6, "cli": 7, "__main__": 8,
    "__init__": 9,
}
SIMPY_MODULES = {"simsched.engine.replica", "simsched.engine.simpy_fast", "simsched.cluster.cluster",
                 "simsched.cluster.disagg", "simsched.cluster.kv_transfer",
                 "simsched.cluster.sessions",
                 "simsched.cluster.retries", "simsched.cluster.failures",
                 "simsched.cluster.shard", "simsched.cluster.flow"}


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


# Inside engine/, the KV cache sits below the scheduler: the cache never asks who schedules it,
# and the scheduler's parts reach the cache only through its interface modules.
ENGINE_ROOMS = {"kv": 0, "scheduler": 1}


def _engine_room(module: str) -> str | None:
    parts = module.split(".")
    if len(parts) > 3 and parts[1] == "engine" and parts[2] in ENGINE_ROOMS:
        return parts[2]
    return None


def test_engine_rooms_hold_their_concern_and_point_down():
    modules = dict(_modules())
    rooms = {m: _engine_room(m) for m in modules}
    assert {r for r in rooms.values() if r} == set(ENGINE_ROOMS), "an engine room is empty"
    # no KV-cache or scheduler module left loose at the top of engine/
    loose = {m.rsplit(".", 1)[1] for m, path in modules.items()
             if m.count(".") == 2 and m.startswith("simsched.engine.") and path.name != "__init__.py"}
    assert not loose & {"kv_cache", "prefix_cache", "block_pool", "kv_tier", "kv_tiers", "kv_factory",
                        "prefix_blocks", "scheduler", "admission", "decode", "preemption", "handoff",
                        "plan_ahead", "constraints", "queue_binding", "speculative", "quiet", "swap"}
    for mod, path in modules.items():
        room = rooms[mod]
        if room is None:
            continue
        for dep in _imports(path):
            dep_room = rooms.get(dep)
            if dep_room and dep_room != room:
                assert ENGINE_ROOMS[dep_room] < ENGINE_ROOMS[room], f"{mod} imports {dep} (upward)"


@pytest.mark.parametrize("name", sorted(CASES))
def test_golden_frames_are_bit_identical(name):
    golden = json.loads((Path(__file__).parent / "golden" / "frames.json").read_text())
    assert run_case(CASES[name]) == golden[name]
