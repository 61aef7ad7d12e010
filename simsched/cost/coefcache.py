"""A per-user cache of the fitted coefficients, keyed by a hash of the bundled data and fit code.

Fitting every GPU's kernel terms and the engine's whole-iteration terms takes a noticeable part of
a short run, and every process (each sweep worker) would repeat it. The first process to need a
set of coefficients fits it and writes it as JSON to
``$SIMSCHED_CACHE_DIR`` (default ``$XDG_CACHE_HOME/simsched`` or ``~/.cache/simsched``); later
processes read it back (floats round-trip exactly through JSON, so cached and fresh coefficients
are bit-identical). The file name carries a SHA-256 over every bundled data file and the source of
the modules that fit them, so new data or a changed fit never reads a stale file. Set
``SIMSCHED_CACHE_DIR=off`` to always fit in memory; an unwritable cache directory does the same.
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
import tempfile
from pathlib import Path
from typing import Callable

from simsched.cost import calibration, calibration_h200

HERE = Path(__file__).resolve().parent
DATA_DIR = HERE / "data"
# Modules whose code decides the coefficients (a change in any of them invalidates the cache).
FIT_MODULES = ("calibration.py", "calibration_h200.py", "serving.py", "overhead.py",
               "hardware.py", "kernels.py")


def cache_dir() -> Path | None:
    """The cache folder, or None when caching is switched off."""
    env = os.environ.get("SIMSCHED_CACHE_DIR")
    if env is not None:
        return None if env.strip().lower() in ("", "off", "0", "none") else Path(env)
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base) / "simsched"


def hash_files(files, root: Path) -> str:
    """SHA-256 (first 16 hex digits) over the files' paths relative to ``root`` and contents."""
    h = hashlib.sha256()
    for path in files:
        h.update(str(Path(path).relative_to(root)).encode())
        h.update(Path(path).read_bytes())
    return h.hexdigest()[:16]


@functools.lru_cache(maxsize=None)
def data_hash() -> str:
    """The cache key: a hash of every bundled data file and of the fitting code."""
    files = sorted(p for p in DATA_DIR.rglob("*") if p.is_file())
    return hash_files(files + [HERE / name for name in FIT_MODULES], HERE)


def cached(name: str, compute: Callable[[], dict]) -> dict:
    """``compute()`` (a JSON-able dict), read from the cache when present, else written to it."""
    folder = cache_dir()
    path = folder / f"{name}-{data_hash()}.json" if folder is not None else None
    if path is not None and path.is_file():
        try:
            return json.loads(path.read_text())
        except (OSError, ValueError):
            pass  # a torn or unreadable file: refit and overwrite it
    value = compute()
    if path is not None:
        try:
            folder.mkdir(parents=True, exist_ok=True)
            # Write then rename, so a concurrent reader never sees half a file.
            fd, tmp = tempfile.mkstemp(dir=folder, suffix=".tmp")
            with os.fdopen(fd, "w") as f:
                json.dump(value, f)
            os.replace(tmp, path)
        except OSError:
            pass  # read-only home or similar: run without the cache
    return value


_FITS = {calibration.REFERENCE_GPU: calibration.fit_all,
         calibration_h200.GPU_NAME: calibration_h200.fit_all}


@functools.lru_cache(maxsize=None)
def anchor_coefficients(anchor: str) -> dict:
    """Kernel fits of one measured anchor GPU (``a100-80gb`` or ``h200``), once per process."""
    if anchor not in _FITS:
        raise ValueError(f"anchor must be one of {sorted(_FITS)}, got {anchor!r}")
    return cached(f"kernels-{anchor}", _FITS[anchor])


def kernel_coefficients() -> dict:
    """Kernel fits of every measured anchor GPU, keyed by anchor name."""
    return {anchor: anchor_coefficients(anchor) for anchor in _FITS}
