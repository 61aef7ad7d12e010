"""Field checks shared by the config sections: each raises ValueError naming the field."""

from __future__ import annotations

import dataclasses
import math
from typing import Any

import numpy as np


def plain(obj) -> None:
    """Turn numpy scalars in ``obj``'s fields into Python ones (sweeps often pass np.int64)."""
    for f in dataclasses.fields(obj):
        value = getattr(obj, f.name)
        if isinstance(value, np.generic):
            object.__setattr__(obj, f.name, value.item())


def check_bool(owner: str, name: str, value: Any) -> None:
    """``owner.name`` must be a bool."""
    if not isinstance(value, bool):
        raise ValueError(f"{owner}.{name} must be True or False, got {value!r}")


def check_int(owner: str, name: str, value: Any, low: int, high: float = math.inf) -> None:
    """``owner.name`` must be an integer (not a bool) in ``[low, high]``."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValueError(f"{owner}.{name} must be an integer in [{low}, {high}], got {value!r}")
    if not low <= value <= high:
        raise ValueError(f"{owner}.{name} must be in [{low}, {high}], got {value!r}")


def check_float(owner: str, name: str, value: Any, low: float, high: float = math.inf,
                 low_open: bool = False, finite: bool = False) -> None:
    """``owner.name`` must be a number (not a bool or NaN) in ``[low, high]`` (``(low, high]``
    with ``low_open``), and finite with ``finite``."""
    bracket = "(" if low_open else "["
    if isinstance(value, bool) or not isinstance(value, (int, float)) or math.isnan(value):
        raise ValueError(f"{owner}.{name} must be a number in {bracket}{low}, {high}], "
                         f"got {value!r}")
    bad = value <= low if low_open else value < low
    if bad or value > high:
        raise ValueError(f"{owner}.{name} must be in {bracket}{low}, {high}], got {value!r}")
    if finite and math.isinf(value):
        raise ValueError(f"{owner}.{name} must be finite, got {value!r}")


def check_choice(owner: str, name: str, value: Any, choices) -> None:
    """``owner.name`` must be one of ``choices``."""
    try:
        known = value in choices
    except TypeError:  # unhashable, e.g. a list
        known = False
    if not known:
        raise ValueError(f"{owner}.{name} must be one of {sorted(choices)}, got {value!r}")


def as_part(value: Any, cls: type, where: str) -> Any:
    """An optional config object given as None, a ``cls`` or a mapping of its fields (as a
    config file or ``--set`` JSON holds it); anything else raises ValueError naming ``where``."""
    if value is None or isinstance(value, cls):
        return value
    if isinstance(value, dict) or hasattr(value, "items"):
        return from_fields(cls, value, where)
    raise ValueError(f"{where} must be None, a {cls.__name__} or a mapping of its fields, "
                     f"got {value!r}")


def from_fields(cls: type, value: Any, where: str) -> Any:
    """A ``cls`` (a config dataclass) built from the mapping ``value`` of its fields, as JSON
    or ``--set`` gives it; a key that is not one of its fields raises ValueError naming
    ``where``, the key(s) and the known fields (not Python's bare ``TypeError``)."""
    known = {f.name for f in dataclasses.fields(cls)}
    unknown = sorted(str(k) for k in value if k not in known)
    if unknown:
        raise ValueError(f"{where}: unknown field(s) {unknown}; known: {sorted(known)}")
    return cls(**dict(value))
