"""Configs for the ``simsched`` command: TOML files, flags and ``--set`` pairs to a ``SimConfig``."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Sequence

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10: the same parser, as the tomli package
    import tomli as tomllib

from simsched.analysis.slo import SLO
from simsched.config import SimConfig, field_names
from simsched.workloads.workload import WorkloadConfig

SECTIONS = ("scheduler", "cache", "hardware", "workload", "cluster")
# flag destination -> config field
FLAG_FIELDS = {"model": "model", "gpu": "gpu", "tp": "tensor_parallel_size", "policy": "policy",
               "victim_policy": "victim_policy", "preemption": "preemption",
               "max_num_batched_tokens": "max_num_batched_tokens", "max_num_seqs": "max_num_seqs",
               "num_blocks": "cache.num_blocks", "workload": "name", "rate": "rate",
               "num_requests": "num_requests", "duration": "duration", "seed": "seed",
               "max_sim_time": "max_sim_time", "cost_model": "cost_model"}

def parse_value(text: str) -> Any:
    """A flag value as Python: int, float, true/false, none, or the string itself."""
    low = text.strip().lower()
    if low in ("true", "false"):
        return low == "true"
    if low in ("none", "null"):
        return None
    for cast in (int, float):
        try:
            return cast(text)
        except ValueError:
            pass
    return text.strip()


def read_toml(path: str | Path) -> dict[str, Any]:
    """A TOML file's contents; a missing or malformed file is a ValueError naming it."""
    path = Path(path)
    try:
        return tomllib.loads(path.read_text())
    except FileNotFoundError:
        raise ValueError(f"config file {path} not found") from None
    except tomllib.TOMLDecodeError as exc:
        raise ValueError(f"config file {path}: {exc}") from None


def load_toml(path: str | Path, skip: Sequence[str] = ()
              ) -> tuple[dict[str, Any], dict[str, float]]:
    """Read a TOML config file into flat ``SimConfig.replace`` changes and SLO bounds.

    Sections named in ``skip`` belong to the caller (``plan`` reads its own) and are left out.
    """
    path = Path(path)
    data = read_toml(path)
    changes: dict[str, Any] = {}
    slo: dict[str, float] = {}
    for key, value in data.items():
        if isinstance(value, dict):
            if key in SECTIONS:
                changes.update({f"{key}.{k}": _tupled(v) for k, v in value.items()})
            elif key == "run":
                changes.update({k: _tupled(v) for k, v in value.items()})
            elif key == "slo":
                slo.update(value)
            elif key in skip:
                continue
            else:
                raise ValueError(f"config file {path}: unknown section [{key}]; known: "
                                 f"{', '.join(SECTIONS + ('run', 'slo'))}")
        elif key in skip:
            continue
        else:
            changes[key] = _tupled(value)
    return changes, slo


def _tupled(value: Any) -> Any:
    if isinstance(value, list):
        return tuple(_tupled(v) for v in value)
    return value


def build_config(changes: dict[str, Any]) -> SimConfig:
    """A ``SimConfig`` from flat or dotted changes; a workload name starts from its preset."""
    changes = dict(changes)
    name = changes.pop("workload.name", changes.pop("name", None))
    base = SimConfig()
    if name is not None:
        wl = {k.split(".", 1)[-1]: changes.pop(k) for k in list(changes)
              if k.startswith("workload.") or (k in _workload_fields() and "." not in k)}
        try:
            base = base.replace(workload=WorkloadConfig.preset(name, **wl))
        except TypeError as exc:
            raise ValueError(f"bad workload field: {exc}") from None
    for key in changes:
        bare = key.split(".", 1)[-1]
        if bare not in field_names():
            raise ValueError(f"unknown config field {key!r}")
    return base.replace(**changes)


def _workload_fields() -> set[str]:
    import dataclasses

    return {f.name for f in dataclasses.fields(WorkloadConfig)}


def parse_pairs(items: Sequence[str], what: str) -> list[tuple[str, str]]:
    """``FIELD=VALUE`` items (of option ``what``) as (field, value text) pairs."""
    out = []
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key.strip() or not value.strip():
            raise ValueError(f"{what} expects FIELD=VALUE, got {item!r}")
        out.append((key.strip(), value))
    return out


def config_from_args(args) -> tuple[SimConfig, SLO | None]:
    """The config and SLO given by a TOML file and the flags (flags win)."""
    changes, slo = load_toml(args.config) if args.config else ({}, {})
    for dest, fld in FLAG_FIELDS.items():
        value = getattr(args, dest, None)
        if value is not None:
            changes = {k: v for k, v in changes.items() if k.split(".", 1)[-1] != fld.split(
                ".", 1)[-1]}
            changes[fld] = value
    for key, value in parse_pairs(args.set, "--set"):
        changes[key] = parse_value(value)
    for name in ("ttft", "tpot", "e2el"):
        if getattr(args, f"slo_{name}") is not None:
            slo[name] = getattr(args, f"slo_{name}")
    unknown = set(slo) - {"ttft", "tpot", "e2el"}
    if unknown:
        raise ValueError(f"unknown [slo] key(s) {sorted(unknown)}; known: ttft, tpot, e2el")
    return build_config(changes), (SLO(**slo) if slo else None)
