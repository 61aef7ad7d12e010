"""Ray, an optional dependency: importing it, and connecting to (or starting) a Ray instance.

Sweeps (:mod:`simsched.analysis.executors`) and sharded runs
(:mod:`simsched.analysis.shard_workers`) both reach Ray through here."""

from __future__ import annotations

import os
from pathlib import Path


def ray_module(what: str = "executor='ray'"):
    """The ``ray`` module, or ImportError saying that ``what`` needs it."""
    try:
        import ray
    except ImportError:
        raise ImportError(f"{what} needs Ray, an optional dependency: pip install ray") from None
    return ray


def connect(address: str | None = None, what: str = "executor='ray'"):
    """The ``ray`` module, initialised: connected to the cluster at ``address`` if given
    (simsched must be importable on its nodes), else to the Ray instance already initialised
    in this process, else a local one started with ``ray.init(num_cpus=2,
    include_dashboard=False)`` (left running; ``ray.shutdown()`` stops it)."""
    ray = ray_module(what)
    if not ray.is_initialized():
        # Local workers must import this checkout even when it is not installed.
        root = str(Path(__file__).resolve().parent.parent.parent)
        path = os.pathsep.join(p for p in (root, os.environ.get("PYTHONPATH")) if p)
        if address is not None:
            ray.init(address=address, logging_level="ERROR")
        else:
            ray.init(num_cpus=2, include_dashboard=False, logging_level="ERROR",
                     runtime_env={"env_vars": {"PYTHONPATH": path}})
    return ray
