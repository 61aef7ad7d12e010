"""Least squares and small linear solves that give the same bits on every CPU.

``numpy.linalg`` hands its work to BLAS/LAPACK, whose kernels (chosen per CPU, and by
``OPENBLAS_CORETYPE``) sum in different orders: the last bits of a fit then depend on the machine,
and an ill-conditioned or iterative fit amplifies them (the ``eager_2023`` terms moved by up to 96 %
between two kernels of one machine). The fits here are small (at most a few thousand rows, a dozen
columns), so they are done with Householder QR in which every dot product is an exactly rounded
sum (:func:`math.fsum`) of correctly rounded element-wise products: IEEE arithmetic alone, so the
result is the same on any CPU, any BLAS and any numpy. These replace ``numpy.linalg.lstsq``,
``numpy.linalg.solve`` and ``@`` in :mod:`simsched.cost.calibration`,
:mod:`simsched.cost.calibration_h200` and :mod:`simsched.cost.serving`.
"""

from __future__ import annotations

import math

import numpy as np


def dot(a, b) -> float:
    """Exactly rounded sum of the element-wise products of two vectors."""
    return math.fsum(np.multiply(np.asarray(a, dtype=float), np.asarray(b, dtype=float)).tolist())


def lstsq(design, y) -> np.ndarray:
    """The least-squares solution ``x`` of ``design @ x ≈ y`` (full column rank required).

    Householder QR: for a well-conditioned problem the same solution as ``numpy.linalg.lstsq`` up
    to rounding, and bit-for-bit the same on every machine.
    """
    a = np.array(design, dtype=float, copy=True)
    b = np.array(y, dtype=float, copy=True)
    if a.ndim != 2 or b.ndim != 1 or a.shape[0] != b.shape[0]:
        raise ValueError(f"design must be (m, n) and y (m,), got {a.shape} and {b.shape}")
    m, n = a.shape
    if m < n:
        raise ValueError(f"lstsq needs at least as many rows as columns, got {m} x {n}")
    cols = [a[:, j].copy() for j in range(n)]
    scale = [math.sqrt(dot(c, c)) for c in cols]
    for k in range(n):
        head = cols[k][k:]
        norm = math.sqrt(dot(head, head))
        if norm <= 1e-12 * scale[k]:
            raise ValueError(f"design is rank deficient (column {k} is a combination of the "
                             "ones before it)")
        v = head.copy()
        v[0] += norm if v[0] >= 0.0 else -norm
        vv = dot(v, v)
        for target in cols[k:] + [b]:
            part = target[k:]
            part -= v * (2.0 * dot(v, part) / vv)
    x = np.zeros(n)
    for k in range(n - 1, -1, -1):
        rest = math.fsum([cols[j][k] * x[j] for j in range(k + 1, n)])
        x[k] = (b[k] - rest) / cols[k][k]
    return x


def gram(jac: np.ndarray, r: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``(jac.T @ jac, jac.T @ r)`` with exactly rounded sums."""
    n = jac.shape[1]
    jtj = np.empty((n, n))
    for i in range(n):
        for j in range(i, n):
            jtj[i, j] = jtj[j, i] = dot(jac[:, i], jac[:, j])
    return jtj, np.array([dot(jac[:, i], r) for i in range(n)])


def solve(matrix, rhs) -> np.ndarray:
    """``x`` with ``matrix @ x = rhs`` for a small square system (Gaussian elimination with
    partial pivoting; exactly rounded row sums)."""
    a = np.array(matrix, dtype=float, copy=True)
    b = np.array(rhs, dtype=float, copy=True)
    n = a.shape[0]
    if a.shape != (n, n) or b.shape != (n,):
        raise ValueError(f"matrix must be square and rhs match it, got {a.shape} and {b.shape}")
    for k in range(n):
        p = k + int(np.argmax(np.abs(a[k:, k])))
        if a[p, k] == 0.0:
            raise ValueError("matrix is singular")
        if p != k:
            a[[k, p]], b[[k, p]] = a[[p, k]], b[[p, k]]
        for i in range(k + 1, n):
            f = a[i, k] / a[k, k]
            a[i, k:] -= f * a[k, k:]
            b[i] -= f * b[k]
    x = np.zeros(n)
    for k in range(n - 1, -1, -1):
        x[k] = (b[k] - math.fsum([a[k, j] * x[j] for j in range(k + 1, n)])) / a[k, k]
    return x
