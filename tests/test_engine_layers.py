"""The scheduler's parts: one owner of the state, layers that call down only, docs that say who
touches what."""

import ast
from pathlib import Path

import pytest

ENGINE = Path(__file__).resolve().parent.parent / "simsched" / "engine" / "scheduler"
# module -> (class, layer): a part may call only parts of lower layers (and itself)
PARTS = {"decode": ("DecodeMixin", 0), "preemption": ("PreemptionMixin", 1),
         "handoff": ("HandoffMixin", 1), "admission": ("AdmissionMixin", 2),
         "core": ("Scheduler", 3),
         # plan_ahead's schedule wraps the class's (type(self).schedule, not a call up)
         "plan_ahead": ("PlanAheadMixin", 2)}


def _class(module):
    name = PARTS[module][0]
    tree = ast.parse((ENGINE / f"{module}.py").read_text())
    return next(n for n in ast.walk(tree) if isinstance(n, ast.ClassDef) and n.name == name)


def _self_attrs(node):
    """Attributes of ``self`` the class reads, and those it assigns or changes in place."""
    read, changed = set(), set()
    for sub in ast.walk(node):
        if isinstance(sub, ast.Attribute) and isinstance(sub.value, ast.Name) \
                and sub.value.id == "self":
            (changed if isinstance(sub.ctx, ast.Store) else read).add(sub.attr)
        target = sub.target if isinstance(sub, ast.AugAssign) else \
            sub.value if isinstance(sub, ast.Subscript) and not isinstance(sub.ctx, ast.Load) \
            else sub.func.value if isinstance(sub, ast.Call) \
            and isinstance(sub.func, ast.Attribute) else None
        if isinstance(target, ast.Attribute) and isinstance(target.value, ast.Name) \
                and target.value.id == "self" and (not isinstance(sub, ast.Call) or sub.func.attr
                                                   in {"append", "pop", "clear", "setdefault"}):
            changed.add(target.attr)
    return read, changed


OWNER = {}                      # method name -> the module defining it
for module in PARTS:
    for f in _class(module).body:
        if isinstance(f, ast.FunctionDef):
            OWNER[f.name] = module


@pytest.mark.parametrize("module", sorted(PARTS))
def test_parts_call_down_only(module):
    read, _ = _self_attrs(_class(module))
    layer = PARTS[module][1]
    up = sorted(f"{OWNER[a]}.{a}" for a in read if a in OWNER and OWNER[a] != module
                and PARTS[OWNER[a]][1] >= layer)
    assert not up, f"{module} calls {up}: a part calls only parts below it"


def test_only_the_scheduler_declares_fields():
    declared = {sub.attr for sub in ast.walk(_class("core")) if isinstance(sub, ast.Attribute)
                and isinstance(sub.ctx, ast.Store)}
    for module in PARTS:
        read, changed = _self_attrs(_class(module))
        fields = (read | changed) - set(OWNER) - {"queue"}
        assert fields <= declared, f"{module} uses fields the Scheduler never sets: " \
                                   f"{sorted(fields - declared)}"


@pytest.mark.parametrize("module", ["decode", "preemption", "handoff", "admission"])
def test_each_part_documents_the_fields_it_touches(module):
    node = _class(module)
    doc = ast.get_docstring(node)
    read, changed = _self_attrs(node)
    missing = sorted(a for a in (read | changed) - set(OWNER) if f"``{a}``" not in doc)
    assert not missing, f"{PARTS[module][0]}'s docstring does not name {missing}"


def test_the_swap_space_knows_no_scheduler():
    source = (ENGINE / "swap.py").read_text()
    names = {n.id for n in ast.walk(ast.parse(source)) if isinstance(n, ast.Name)}
    assert "sched" not in names and "Scheduler" not in source.replace("scheduler", "")
