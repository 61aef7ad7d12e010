"""A :class:`~simsched.config.SimConfig` as JSON data and back.

:func:`to_dict` gives the same plain data a run writes into its ``config.json`` (sections as
objects, tuples as lists, non-finite floats as the strings ``"inf"``, ``"-inf"``, ``"nan"``);
:func:`from_dict` builds the config again, so ``from_dict(to_dict(cfg)) == cfg``. A ``derived``
block (what a run computed from its config: KV blocks, context length) is not configuration and
is skipped; ``simsched run config.json`` compares it with the new run's.

JSON cannot tell a list from a tuple nor keep non-string mapping keys: lists become tuples in the
fields that hold tuples (``prompt_range``, ``replicas``, ``roles``, ...) and stay lists inside
mappings (``policy_options``, per-replica overrides); mapping keys come back as strings.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
from pathlib import Path
from typing import Any, Mapping

import numpy as np

# The spelling of non-finite floats in JSON data (as the run's config.json writes them).
_NON_FINITE = {"inf": math.inf, "-inf": -math.inf, "nan": math.nan}


def plain_data(value: Any) -> Any:
    """``value`` as JSON data: dataclasses and mappings as objects, tuples as lists, numpy
    scalars as Python numbers, non-finite floats as ``"inf"``, ``"-inf"``, ``"nan"``."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: plain_data(getattr(value, f.name)) for f in dataclasses.fields(value)}
    if isinstance(value, Mapping):
        return {str(k): plain_data(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [plain_data(v) for v in value]
    if isinstance(value, np.generic):
        value = value.item()
    if isinstance(value, float) and not math.isfinite(value):
        return "nan" if value != value else ("inf" if value > 0 else "-inf")
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    return str(value)


def to_dict(config) -> dict[str, Any]:
    """``config`` (a SimConfig) as JSON data: one object per section, then the run fields."""
    return plain_data(config)


def to_json(config, indent: int | None = 1) -> str:
    """``config`` as a JSON document (strict JSON: no NaN or Infinity literals)."""
    return json.dumps(to_dict(config), indent=indent, allow_nan=False)


def _tuples(value: Any) -> Any:
    """Lists (at any depth outside mappings) as tuples."""
    if isinstance(value, list):
        return tuple(_tuples(v) for v in value)
    return value


def _field_value(f: dataclasses.Field, value: Any) -> Any:
    kind = str(f.type)
    if isinstance(value, str) and "float" in kind and value in _NON_FINITE:
        return _NON_FINITE[value]
    if "tuple" in kind:
        return _tuples(value)
    return value


def _section(cls, owner: str, data: Any) -> Any:
    if not isinstance(data, Mapping):
        raise ValueError(f"config: section {owner!r} must be an object of fields, got {data!r}")
    fields = {f.name: f for f in dataclasses.fields(cls)}
    unknown = sorted(set(data) - set(fields))
    if unknown:
        raise ValueError(f"config: unknown field(s) {unknown} in section {owner!r}; known: "
                         f"{sorted(fields)}")
    return cls(**{name: _field_value(fields[name], value) for name, value in data.items()})


def from_dict(cls, data: Mapping[str, Any]):
    """A ``cls`` (SimConfig) from :func:`to_dict`'s data, or a run's ``config.json``.

    Sections left out keep their defaults; an unknown section or field is a ValueError naming
    it; ``derived`` is skipped (see the module docstring).
    """
    if not isinstance(data, Mapping):
        raise ValueError(f"config must be an object of sections, got {type(data).__name__}")
    parts = {f.name: f for f in dataclasses.fields(cls)}
    unknown = sorted(set(data) - set(parts) - {"derived"})
    if unknown:
        hint = ""
        if "runs" in data or "base" in data:
            hint = " (this is a sweep's or capacity search's config.json, not one run's)"
        raise ValueError(f"config: unknown key(s) {unknown}{hint}; known: {sorted(parts)}")
    kwargs = {}
    for name, value in data.items():
        if name == "derived":
            continue
        if name in cls._PARTS:
            kwargs[name] = _section(parts[name].default_factory, name, value)
        else:
            kwargs[name] = _field_value(parts[name], value)
    return cls(**kwargs)


def from_json(cls, source: str | bytes | os.PathLike):
    """A ``cls`` (SimConfig) from JSON text, or from a JSON file given as a path.

    ``source`` is read as a path when it is a :class:`os.PathLike` or a string that does not
    start with ``{``; a missing or malformed file is a ValueError naming it.
    """
    where = "config JSON"
    if isinstance(source, os.PathLike) or (isinstance(source, str)
                                           and not source.lstrip().startswith("{")):
        where = f"config file {source}"
        try:
            source = Path(source).read_text()
        except FileNotFoundError:
            raise ValueError(f"{where} not found") from None
    try:
        data = json.loads(source)
    except json.JSONDecodeError as exc:
        raise ValueError(f"{where}: not valid JSON ({exc})") from None
    try:
        return from_dict(cls, data)
    except (TypeError, ValueError) as exc:
        raise ValueError(f"{where}: {exc}") from None
