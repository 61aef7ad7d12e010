"""Calibrated deployment profiles: the shipped cost model corrected by terms fitted to a user's runs.

A calibrated profile (written by :func:`simsched.fit.calibrate`, read here) is a versioned JSON
file holding a handful of interpretable corrections to the shipped cost model of the engine profile
it was fitted for (``engine_overhead``: the default ``vllm_silicon``, or ``vllm_v1``):

* ``gemm_scale``, ``attention_scale``, ``comm_scale``: multipliers of the kernel tables' GEMM
  time (linear layers, embedding, LM head), attention time (prefill and decode) and
  tensor-parallel communication;
* ``step_time``: host seconds added to every step (the engine's per-step CPU work beyond the
  shipped ``step_gap``), ``seq_time``: host seconds added per sequence and step (scheduling,
  input preparation and output processing that grow with the batch);
* ``output_delay``: seconds from a step's end until the client sees its tokens (replaces the
  shipped value).

With all scales 1 and both times 0 (and the shipped output delay) the model is the shipped one.
The file also holds the fit's uncertainty: the mean ``center`` and ``covariance`` of the terms in
the fit's coordinates (:data:`SPACES`: log for the scales, seconds for the times), from which
:func:`draw` samples coefficient sets for ensembles, and ``discrepancy``: the relative scatter
per metric the terms do not explain. ``hardware.profile = "path"`` loads one
(:func:`load`, checked against the config's GPU and engine overhead).
"""

from __future__ import annotations

import functools
import json
import math
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

FORMAT = "simsched-calibrated-profile"
VERSION = 1
TERMS = ("gemm_scale", "attention_scale", "comm_scale", "step_time", "seq_time", "output_delay")
# The fit's coordinates: scales in log (a multiplier stays positive), times in seconds.
SPACES = {"gemm_scale": "log", "attention_scale": "log", "comm_scale": "log",
          "step_time": "linear", "seq_time": "linear", "output_delay": "linear"}
UNITS = {"gemm_scale": ("x", 1.0), "attention_scale": ("x", 1.0), "comm_scale": ("x", 1.0),
         "step_time": ("ms per step", 1e3), "seq_time": ("us per sequence and step", 1e6),
         "output_delay": ("ms", 1e3)}


def neutral_terms(output_delay: float) -> dict:
    """The terms that leave the shipped model unchanged (``output_delay``: the shipped one)."""
    return {"gemm_scale": 1.0, "attention_scale": 1.0, "comm_scale": 1.0, "step_time": 0.0,
            "seq_time": 0.0, "output_delay": float(output_delay)}


def check_terms(terms, where: str = "terms") -> dict:
    """``terms`` as a dict of floats with every name of :data:`TERMS`: scales > 0, the output
    delay >= 0, every value finite; an error names ``where`` and the term."""
    if not isinstance(terms, dict):
        raise ValueError(f"{where}: expected a mapping of {', '.join(TERMS)}, got "
                         f"{type(terms).__name__}")
    unknown = sorted(set(terms) - set(TERMS))
    if unknown:
        raise ValueError(f"{where}: unknown term {unknown[0]!r}; known: {', '.join(TERMS)}")
    out = {}
    for name in TERMS:
        if name not in terms:
            raise ValueError(f"{where}: missing term {name!r}")
        value = terms[name]
        if isinstance(value, bool) or not isinstance(value, (int, float)) \
                or not math.isfinite(value):
            raise ValueError(f"{where}.{name} must be a finite number, got {value!r}")
        if SPACES[name] == "log" and value <= 0:
            raise ValueError(f"{where}.{name} must be > 0, got {value!r}")
        if name == "output_delay" and value < 0:
            raise ValueError(f"{where}.output_delay must be >= 0, got {value!r}")
        out[name] = float(value)
    return out


def to_coordinates(terms: dict) -> np.ndarray:
    """The terms in the fit's coordinates (:data:`SPACES`), in :data:`TERMS` order."""
    return np.array([math.log(terms[t]) if SPACES[t] == "log" else terms[t] for t in TERMS])


def from_coordinates(u) -> dict:
    """:func:`to_coordinates`'s inverse (the output delay clipped at 0)."""
    out = {t: float(math.exp(v) if SPACES[t] == "log" else v) for t, v in zip(TERMS, u)}
    out["output_delay"] = max(0.0, out["output_delay"])
    return out


@dataclass(frozen=True)
class DeploymentProfile:
    """A calibrated profile as read from its file: ``terms`` (the fitted values), ``center`` and
    ``covariance`` (the terms' posterior in the fit's coordinates), ``discrepancy`` (metric ->
    unexplained relative scatter), the ``gpus``, ``models`` and ``engine_overhead`` it was fitted
    for, and the whole document (``data``: inputs' hashes, residuals, report)."""

    path: str
    terms: dict
    center: tuple
    covariance: tuple
    discrepancy: dict = field(default_factory=dict)
    gpus: tuple = ()
    models: tuple = ()
    engine_overhead: str = "vllm_v1"
    data: dict = field(default_factory=dict, compare=False, hash=False)

    def draw(self, n: int, seed: int = 0) -> list[dict]:
        """``n`` coefficient sets drawn from the posterior (seeded: the same seed, the same
        sets)."""
        return draw(self, n, seed)


def draw(profile: DeploymentProfile, n: int, seed: int = 0) -> list[dict]:
    """``n`` term sets from ``profile``'s posterior: normal in the fit's coordinates."""
    rng = np.random.default_rng(seed)
    cov = np.array(profile.covariance, dtype=float)
    center = np.array(profile.center, dtype=float)
    # Cholesky of a covariance a fit wrote may be semi-definite by rounding: jitter it.
    chol = np.linalg.cholesky(cov + 1e-18 * np.eye(len(center)))
    return [from_coordinates(center + chol @ rng.standard_normal(len(center)))
            for _ in range(int(n))]


def _where(path: Path, key: str) -> str:
    return f"{path}: {key}"


def parse(document: dict, path: str = "profile") -> DeploymentProfile:
    """A profile document (as :func:`json.load` gives it) checked and read; every error names
    ``path`` and the key."""
    p = Path(path)
    if not isinstance(document, dict):
        raise ValueError(f"{path}: expected a JSON object")
    if document.get("format") != FORMAT:
        raise ValueError(f"{path}: format must be {FORMAT!r} (a profile written by "
                         f"simsched calibrate), got {document.get('format')!r}")
    if document.get("version") != VERSION:
        raise ValueError(f"{path}: version {document.get('version')!r} is not supported "
                         f"(this simsched reads version {VERSION})")
    for key in ("terms", "center", "covariance", "gpus", "engine_overhead"):
        if key not in document:
            raise ValueError(f"{path}: missing key {key!r}")
    terms = check_terms(document["terms"], f"{path}: terms")
    k = len(TERMS)
    center = np.asarray(document["center"], dtype=float) \
        if isinstance(document["center"], list) else None
    if center is None or center.shape != (k,) or not np.isfinite(center).all():
        raise ValueError(f"{_where(p, 'center')} must be a list of {k} finite numbers")
    try:
        cov = np.asarray(document["covariance"], dtype=float)
    except (TypeError, ValueError):
        cov = None
    if cov is None or cov.shape != (k, k) or not np.isfinite(cov).all() \
            or not np.allclose(cov, cov.T, rtol=1e-9, atol=1e-15) \
            or np.linalg.eigvalsh(cov).min() < -1e-12 * max(1.0, np.abs(cov).max()):
        raise ValueError(f"{_where(p, 'covariance')} must be a symmetric positive "
                         f"semi-definite {k}x{k} matrix (terms in order {', '.join(TERMS)})")
    disc = document.get("discrepancy", {})
    if not isinstance(disc, dict) or not all(
            isinstance(v, (int, float)) and not isinstance(v, bool) and v >= 0
            for v in disc.values()):
        raise ValueError(f"{_where(p, 'discrepancy')} must map metric names to numbers >= 0")
    gpus = document["gpus"]
    if not isinstance(gpus, list) or not gpus or not all(isinstance(g, str) for g in gpus):
        raise ValueError(f"{_where(p, 'gpus')} must be a non-empty list of GPU names")
    return DeploymentProfile(str(path), terms, tuple(center.tolist()),
                             tuple(map(tuple, cov.tolist())),
                             {str(m): float(v) for m, v in disc.items()}, tuple(gpus),
                             tuple(document.get("models", [])),
                             str(document["engine_overhead"]), document)


@functools.lru_cache(maxsize=32)
def _load(path: str, mtime_ns: int, size: int) -> DeploymentProfile:
    p = Path(path)
    try:
        document = json.loads(p.read_text())
    except json.JSONDecodeError as exc:
        raise ValueError(f"{path}: not JSON ({exc})") from None
    return parse(document, path)


def load(path) -> DeploymentProfile:
    """The calibrated profile in the file ``path`` (re-read when the file changes)."""
    p = Path(path)
    if not p.is_file():
        raise ValueError(f"{path}: no such calibrated profile file")
    st = p.stat()
    return _load(str(p), st.st_mtime_ns, st.st_size)


def check_for(path, gpu: str, engine_overhead: str, where: str = "hardware.profile"
              ) -> DeploymentProfile:
    """:func:`load`, refusing a profile fitted for another GPU or engine overhead."""
    try:
        prof = load(path)
    except ValueError as exc:
        raise ValueError(f"{where}: {exc}") from None
    if gpu not in prof.gpus:
        raise ValueError(f"{where}: {path} was calibrated on {', '.join(prof.gpus)}, not "
                         f"hardware.gpu={gpu!r}; calibrate on a run of this GPU")
    if engine_overhead != prof.engine_overhead:
        raise ValueError(f"{where}: {path} corrects engine_overhead={prof.engine_overhead!r}, "
                         f"the config has hardware.engine_overhead={engine_overhead!r}")
    return prof


def scale_kernels(k, terms: dict) -> None:
    """Scale a :class:`~simsched.cost.kernels.KernelTables`' GEMM and attention tables by the
    terms (new arrays: tables another model shares are never changed in place)."""
    g, a = terms["gemm_scale"], terms["attention_scale"]
    k.linear, k.emb, k.lm_head = k.linear * g, k.emb * g, k.lm_head * g
    k.pre_t0, k.pre_slope = k.pre_t0 * a, k.pre_slope * a
    k.dec_a, k.dec_s = k.dec_a * a, k.dec_s * a
    k.sat_a, k.sat_s = k.sat_a * a, k.sat_s * a
