"""The latency model's solver: relative-error non-negative least squares and the scores of a fit.

:class:`~deltaserve_core.latency_model.LatencyModel` calls these on feature rows ``(*features, duration)``; its
docs explain the trimmed refit and the calibration anchors built on top. numpy and scipy are imported on first
use: the model's prediction path is plain float arithmetic and must not pay for them.

Non-negative least squares (``scipy.optimize.nnls``): every coefficient prices real work, a negative one
would make the model claim that adding tokens saves time and admission would over-admit. Rows are weighted
by ``1/duration`` so the fit minimises *relative* error -- step times span three orders of magnitude and
the SLO budget cares about relative accuracy of short decode steps as much as of long prefills. Columns are
then scaled to unit norm before the solve (Σ(n+B_d)² is ~10⁶× larger than the intercept column), and the
solution is unscaled afterwards; scaling by a positive factor keeps the non-negativity constraint intact.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from .latency_coefficients import FitQuality


def _nnls_relative(rows: Sequence[tuple[float, ...]], weights: Sequence[float] | None = None) -> list[float]:
    """Relative-error NNLS on rows ``(*features, y)``: minimise Σ wᵢ((aᵢ·x − yᵢ)/yᵢ)² subject to x ≥ 0."""
    import numpy as np
    from scipy.optimize import nnls

    data = np.asarray(rows, dtype=np.float64)
    row_scale = 1.0 / data[:, -1]
    if weights is not None:
        row_scale = row_scale * np.sqrt(np.asarray(weights, dtype=np.float64))
    a = data[:, :-1] * row_scale[:, None]
    b = data[:, -1] * row_scale
    col_scale = np.linalg.norm(a, axis=0)
    col_scale[col_scale == 0.0] = 1.0  # an all-zero column (no FT in graph mode, no decodes) keeps coefficient 0
    x_scaled, _ = nnls(a / col_scale, b, maxiter=50 * a.shape[1])
    return [float(v) for v in x_scaled / col_scale]


def _relative_errors(rows: Sequence[tuple[float, ...]], coef: Sequence[float]) -> list[float]:
    """Signed ``(pred − y) / y`` per row."""
    out = []
    for row in rows:
        y = row[-1]
        pred = sum(c * v for c, v in zip(coef, row[:-1]))
        out.append((pred - y) / y)
    return out


def _quality(rel: Sequence[float], dropped: int = 0) -> FitQuality:
    import numpy as np

    if not rel:
        return FitQuality(n=0, mape=math.nan, p95_ape=math.nan, max_ape=math.nan, dropped=dropped)
    ape = np.abs(np.asarray(rel, dtype=np.float64))
    return FitQuality(n=len(rel), mape=float(ape.mean()), p95_ape=float(np.percentile(ape, 95)),
                      max_ape=float(ape.max()), dropped=dropped)


def _median(values: Sequence[float]) -> float:
    ordered = sorted(values)
    mid = len(ordered) // 2
    return ordered[mid] if len(ordered) % 2 else 0.5 * (ordered[mid - 1] + ordered[mid])


@dataclass(frozen=True, slots=True)
class _Fit:
    coef: tuple[float, ...]
    quality: FitQuality
