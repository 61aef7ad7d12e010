"""Fitted coefficients shipped as package data: runs load them, only maintainers fit.

Every fit of the cost model (a measured GPU's kernel terms, the ``eager_2023`` whole-iteration
terms) is a :class:`ShippedFit`: a name, the function that fits it from the bundled data, and the
files that decide its value (data and fit code). Its coefficients live in
``simsched/cost/data/fits/NAME.json`` with a format version and the SHA-256 of those files at the
time of the fit. A simulation reads that file and never fits, so its results do not depend on the
machine (BLAS kernels, numpy version) it runs on.

After changing bundled data or fit code, a maintainer re-writes the files with
``python -m experiments.calibrate --update``; ``tests/test_fits.py`` refits every entry, compares
with the shipped values (relative 1e-9) and checks the recorded hash, and says to run that command
when either is off. The fits themselves are exactly reproducible (:mod:`simsched.cost.linalg`).
"""

from __future__ import annotations

import functools
import hashlib
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

COST_DIR = Path(__file__).resolve().parent
FITS_DIR = COST_DIR / "data" / "fits"
FORMAT = 1
UPDATE_COMMAND = "python -m experiments.calibrate --update"


@dataclass(frozen=True)
class ShippedFit:
    """One named set of fitted coefficients and where it comes from.

    ``fit`` returns a JSON-able dict (plain floats, lists, strings); ``sources`` are paths relative
    to ``simsched/cost/`` (files, or folders taken whole) whose content decides the fit.
    """

    name: str
    fit: Callable[[], dict] = field(compare=False)
    sources: tuple[str, ...]

    @property
    def path(self) -> Path:
        """The shipped JSON file."""
        return FITS_DIR / f"{self.name}.json"

    def source_hash(self) -> str:
        """SHA-256 (first 16 hex digits) over the source files' relative paths and contents."""
        files: list[Path] = []
        for rel in self.sources:
            p = COST_DIR / rel
            if not p.exists():
                raise ValueError(f"fit {self.name!r}: source {rel!r} not found in {COST_DIR}")
            # Bytecode caches (written by imports or compileall) are not sources.
            files += sorted(q for q in p.rglob("*") if q.is_file() and q.suffix != ".pyc"
                            and "__pycache__" not in q.parts) if p.is_dir() else [p]
        h = hashlib.sha256()
        for p in files:
            h.update(p.relative_to(COST_DIR).as_posix().encode())
            # Text files hashed with normalised line ends: a checkout with CRLF is the same data.
            h.update(p.read_bytes().replace(b"\r\n", b"\n"))
        return h.hexdigest()[:16]

    def read(self) -> dict:
        """The shipped file's whole record (``name``, ``format``, ``source_hash``,
        ``coefficients``)."""
        try:
            record = json.loads(self.path.read_text())
        except FileNotFoundError:
            raise ValueError(f"{self.path}: shipped coefficients of fit {self.name!r} are missing; "
                             f"run `{UPDATE_COMMAND}`") from None
        except ValueError as exc:
            raise ValueError(f"{self.path}: not valid JSON ({exc}); run `{UPDATE_COMMAND}`") \
                from None
        if record.get("format") != FORMAT or "coefficients" not in record:
            raise ValueError(f"{self.path}: format {record.get('format')!r}, expected {FORMAT} "
                             f"with a 'coefficients' entry; run `{UPDATE_COMMAND}`")
        return record

    def write(self) -> Path:
        """Fit now and write the result (maintainers only)."""
        record = {"name": self.name, "format": FORMAT, "source_hash": self.source_hash(),
                  "update_command": UPDATE_COMMAND, "coefficients": self.fit()}
        FITS_DIR.mkdir(parents=True, exist_ok=True)
        # repr-exact floats: json writes the shortest string that reads back to the same double.
        self.path.write_text(json.dumps(record, indent=1, sort_keys=True) + "\n")
        return self.path


_REGISTRY: dict[str, ShippedFit] = {}


def register(fit: ShippedFit) -> ShippedFit:
    """Add a fit to the registry (each module that defines one registers it at import)."""
    if fit.name in _REGISTRY and _REGISTRY[fit.name] != fit:
        raise ValueError(f"a different fit named {fit.name!r} is already registered")
    _REGISTRY[fit.name] = fit
    return fit


def registered() -> dict[str, ShippedFit]:
    """Every registered fit by name (importing the cost package registers the built-in ones)."""
    return dict(_REGISTRY)


@functools.lru_cache(maxsize=None)
def coefficients(name: str) -> dict:
    """The shipped coefficients of the fit ``name``, read once per process. Treat as read-only."""
    if name not in _REGISTRY:
        raise ValueError(f"no fit named {name!r}; registered: {sorted(_REGISTRY)}")
    return _REGISTRY[name].read()["coefficients"]
