"""Configs for the ``simsched`` command: TOML files, a run's ``config.json``, flags and ``--set``
pairs to a ``SimConfig``."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any, Sequence

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10: the same parser, as the tomli package
    import tomli as tomllib

from simsched.analysis.slo import SLO
from simsched.cli.client_flags import CLIENT_FLAG_FIELDS
from simsched.cli.fault_flags import FAULT_FLAG_FIELDS
from simsched.config import (CacheConfig, ClusterConfig, HardwareConfig, SchedulerConfig,
                             SimConfig, field_names)
from simsched.config.client import ClientConfig
from simsched.config.faults import FaultsConfig
from simsched.config.presets import preset_changes
from simsched.workloads.workload import WorkloadConfig

SECTIONS = ("scheduler", "cache", "hardware", "workload", "cluster", "client", "faults")
# flag destination -> config field
FLAG_FIELDS = {"model": "model", "gpu": "gpu", "tp": "tensor_parallel_size", "policy": "policy",
               "victim_policy": "victim_policy", "preemption": "preemption",
               "max_num_batched_tokens": "max_num_batched_tokens", "max_num_seqs": "max_num_seqs",
               "num_blocks": "cache.num_blocks", "workload": "name", "rate": "rate",
               "num_requests": "num_requests", "duration": "duration", "seed": "seed",
               "max_sim_time": "max_sim_time", "cost_model": "cost_model",
               "profile": "hardware.profile", **CLIENT_FLAG_FIELDS, **FAULT_FLAG_FIELDS}

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


# Fields holding tuples or mappings: --set takes them as JSON. An example value for each.
STRUCTURED_EXAMPLES = {
    "prompt_range": "[10,100]", "output_range": "[10,100]", "tenant_weights": "[3,1]",
    "priority_weights": "[1,1,1]", "rate_schedule": "[[60,2],[60,8]]",
    "num_turns": '["uniform",2,6]', "think_time": '["exponential",5]',
    "replicas": '[{"gpu":"h100-sxm","count":2}]', "roles": '["prefill","decode"]',
    "policy_options": '{"aging_rate":2}', "engine_options": '{"schedule_policy":"lpm"}',
    "router_options": '{"weights":[2,1]}',
    "model_spec": '{"num_layers":32,"hidden_size":4096,...}',
    "parallel": '{"pipeline_parallel_size":2}',
    "lora": '{"max_loras":4,"max_cpu_loras":16}',
    "kv_tiers": '{"tiers":[{"name":"cpu","capacity_gib":256}]}',
    "kv_remote_tier": '{"name":"remote","capacity_gib":4096}',
    "autoscaling": '{"policy":"threshold","target":16,"max_replicas":8}',
    "speculative": '{"method":"eagle","num_speculative_tokens":3}',
    "stages": "[[8,600],[20,600]]",
    "retry_on": '["failed","timed_out"]', "replica_failures": "[[300,2]]",
    "cancel_time": '["exponential",10]', "restart_time": '["uniform",20,40]',
    "model_load_time": '["fixed",60]', "mtbf": '[["default",["weibull",0.8,3600]]]',
    "link_events": "[[60,30,0,0]]", "link_mtbf": '["weibull",1.5,600]',
    "link_mttr": '["lognormal",30,0.5]',
}
# --set takes these as JSON
_MAPPINGS = ("model_spec", "parallel", "lora", "autoscaling", "speculative")


def _structured_fields() -> dict[str, str]:
    """Field name -> its type, for the fields holding tuples or mappings."""
    out = {}
    for cls in (SchedulerConfig, CacheConfig, HardwareConfig, WorkloadConfig, ClusterConfig,
                ClientConfig, FaultsConfig):
        for f in dataclasses.fields(cls):
            kind = str(f.type)
            if "tuple" in kind or "Mapping" in kind or f.name in _MAPPINGS:
                out[f.name] = kind
    return out


def parse_set_value(key: str, text: str) -> Any:
    """A ``--set FIELD=VALUE`` value as Python; tuple and mapping fields take JSON.

    ``--set prompt_range=[10,100]``, ``--set replicas='[{"gpu":"h100-sxm","count":2}]'``,
    ``--set policy_options='{"aging_rate":2}'``: JSON arrays become tuples (objects stay
    mappings). Anything else is :func:`parse_value`'s. A tuple or mapping field given something
    else is a ValueError naming the field and showing the syntax.
    """
    name = key.split(".", 1)[-1]
    kind = _structured_fields().get(name)
    if kind is None:
        return parse_value(text)
    example = f"--set {key}={STRUCTURED_EXAMPLES.get(name, '[...]')}"
    stripped = text.strip()
    if stripped[:1] in ("[", "{"):
        try:
            return _tupled(json.loads(stripped))
        except json.JSONDecodeError as exc:
            raise ValueError(f"--set {key}: {text!r} is not valid JSON ({exc}); write the "
                             f"value as JSON, e.g. {example} (quote it for the shell)") from None
    value = parse_value(text)
    if value is None or ("float" in kind and isinstance(value, (int, float))
                         and not isinstance(value, bool)):
        return value
    what = "a mapping" if "Mapping" in kind or name in _MAPPINGS else "a list"
    raise ValueError(f"--set {key}: {name} takes {what}, written as JSON, e.g. {example} "
                     f"(quote it for the shell), got {text!r}")


def split_values(text: str) -> list[str]:
    """``V1,V2,...`` split at the commas outside brackets and quotes (``[10,100],[10,200]``
    is two values)."""
    out, depth, quote, start = [], 0, None, 0
    for i, ch in enumerate(text):
        if quote:
            quote = None if ch == quote else quote
        elif ch in "\"'":
            quote = ch
        elif ch in "[{":
            depth += 1
        elif ch in "]}":
            depth -= 1
        elif ch == "," and depth == 0:
            out.append(text[start:i])
            start = i + 1
    out.append(text[start:])
    return [v for v in out if v.strip()]


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


def build_config(changes: dict[str, Any], base: SimConfig | None = None) -> SimConfig:
    """A ``SimConfig``: ``base`` (default: the defaults) with flat or dotted changes; a workload
    name starts the workload afresh from its preset."""
    changes = dict(changes)
    name = changes.pop("workload.name", changes.pop("name", None))
    base = base or SimConfig()
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


def load_config_file(path: str | Path) -> tuple[SimConfig | None, dict[str, Any],
                                                 dict[str, float]]:
    """A config file: ``(base config, changes, SLO bounds)``.

    A ``.json`` file is a config as :meth:`SimConfig.to_json` or a run's ``config.json`` writes
    it (the base; no changes); anything else is a TOML file (changes from the defaults).
    """
    if Path(path).suffix.lower() == ".json":
        return SimConfig.from_json(Path(path)), {}, {}
    changes, slo = load_toml(path)
    return None, changes, slo


def _router_config(changes: dict[str, Any], path: str) -> None:
    """``--router-config FILE``: the llm-d router, configured by FILE (other options kept)."""
    keys = [k for k in changes if k.split(".", 1)[-1] == "router"]
    router = changes[keys[-1]] if keys else "llm-d"
    if router != "llm-d":
        raise ValueError(f"--router-config configures the llm-d router, but router is {router!r}")
    opts_keys = [k for k in changes if k.split(".", 1)[-1] == "router_options"]
    options = dict(changes.pop(opts_keys[-1])) if opts_keys else {}
    for k in keys + opts_keys:
        changes.pop(k, None)
    options["config"] = path
    changes["router"] = "llm-d"
    changes["router_options"] = options


def config_from_args(args) -> tuple[SimConfig, SLO | None]:
    """The config and SLO given by a config file (TOML, or a run's JSON) and the flags (flags
    win)."""
    base, changes, slo = load_config_file(args.config) if args.config else (None, {}, {})
    for dest, fld in FLAG_FIELDS.items():
        value = getattr(args, dest, None)
        if value is not None:
            changes = {k: v for k, v in changes.items() if k.split(".", 1)[-1] != fld.split(
                ".", 1)[-1]}
            changes[fld] = value
    for key, value in parse_pairs(args.set, "--set"):
        changes[key] = parse_set_value(key, value)
    if getattr(args, "router_config", None):
        _router_config(changes, args.router_config)
    for name in ("ttft", "tpot", "e2el"):
        if getattr(args, f"slo_{name}") is not None:
            slo[name] = getattr(args, f"slo_{name}")
    unknown = set(slo) - {"ttft", "tpot", "e2el"}
    if unknown:
        raise ValueError(f"unknown [slo] key(s) {sorted(unknown)}; known: ttft, tpot, e2el")
    preset = getattr(args, "preset", None)
    engine = getattr(args, "engine", None)
    if engine is not None:
        # --engine NAME runs that engine at its defaults: its preset.
        implied = "vllm_v1" if engine == "vllm" else engine
        if preset is not None and preset != implied and not (engine == "vllm"
                                                             and preset == "classic"):
            raise ValueError(f"--engine {engine} and --preset {preset} disagree: give one")
        preset = preset or implied
    if preset:
        changes = preset_changes(preset, changes)
    return build_config(changes, base), (SLO(**slo) if slo else None)
