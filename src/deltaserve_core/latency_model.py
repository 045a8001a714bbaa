"""The step-latency model of §3.3: Equations I and II, one coefficient set per execution mode.

Who uses it and why
-------------------
* :mod:`deltaserve_core.calibration` fits it once from a profiling sweep, before the host takes requests.
* The core's step sink feeds every executed :class:`~deltaserve_core.types.StepRecord` to :meth:`LatencyModel.observe`,
  which keeps a rolling window per (mode, equation) and refits periodically, so the model tracks drift
  (thermal throttling, a changed adapter rank, another tenant on the device).
* :mod:`deltaserve_core.admission` prices the proposed inference batch and each candidate mixed batch with it,
  inside the host's scheduling loop; that is why the prediction path is plain float arithmetic.

The equations
-------------
For a step that computes any prefill row (an inference prompt chunk *or* a fine-tuning sample), Equation I::

    T ≈ α Σᵢ (nᵢ + B_d)² + β (T_in + B_d) + γ T_ft + ε K + δ R + c  +  1[T_ft > 0] · (ζ U + η)

where ``U`` is the step's *inference* tokens (prompt tokens plus B_d, fine-tuning tokens excluded); the
bracketed co-serving terms are ours, see below.

For a decode-only step, Equation II::

    T ≈ β′ B_d + ε′ K + c′

How fine-tuning rows enter Equation I (a decision the paper leaves implicit): a fine-tuning sample is a
prefill row like any other -- its tokens run the same attention and feed-forward kernels -- so its length
is one of the ``nᵢ`` of the quadratic term and is counted in ``T_in`` as well. ``T_ft`` is the number of
fine-tuning tokens *again*, so γ isolates what fine-tuning adds on top of an equally long prefill: the
activation capture (the per-layer copy into the activation buffer) and the LoRA path of the reserved adapter.
The split is what lets the calibration sweep identify γ: its prefill-only shapes pin α and β, its
fine-tuning shapes then only move γ.

The terms δ R and ζ U + η (beyond the paper)
--------------------------------------------
δ prices each row of the step, ζ and η what a step pays once it carries fine-tuning rows; why the paper's
Equation I needs them on some engines, and how they extend the coefficient tuples, is documented with the
coefficients in :mod:`deltaserve_core.latency_coefficients`.

Fitting
-------
Non-negative, relative-error least squares (:mod:`deltaserve_core.latency_fit` explains each choice).

Robustness: one fit, then every row whose relative residual lies more than ``outlier_k`` scaled MADs
from the median residual (and more than ``outlier_floor`` in absolute relative terms) is dropped and the
fit repeated. This is a deterministic trimmed refit. ``sklearn.linear_model.HuberRegressor`` would be the
textbook alternative but cannot constrain coefficients to be non-negative, and RANSAC is randomised and
an order of magnitude slower; stragglers in step timing (GC pauses, a co-tenant's kernel) are rare and
large, which a single MAD trim removes well.

Online refit keeps the calibration records as an *anchor* set next to the rolling window: live traffic
is often narrow (the same few batch shapes for minutes), and a fit on it alone would leave some
coefficients undetermined and extrapolate badly to the next unusual batch. In online refits each anchor
row weighs ``anchor_weight`` (0.1) of a live row: enough to pin directions live data leaves free, little
enough that drift in the live window dominates wherever live data exists.

Fallbacks when a mode has no fit of its own (documented, not silent -- see :meth:`LatencyModel.source`):

* Equation I or II of one mode missing: the other mode's coefficients for the same equation. For a missing
  GRAPH fit this over-estimates (eager is slower), which is safe for SLOs; for a missing EAGER fit it
  under-estimates, so a host with graph modes should always be calibrated in eager too (the calibration
  sweep does that).
* Equation II missing in both modes: Equation I of the same mode with no prefill rows, i.e. (β + δ)·B_d + ε·K + c
  (the B_d decode rows are the step's R).
* Equation I missing in both modes: the model cannot price prefill; :attr:`LatencyModel.is_ready` is False,
  :meth:`LatencyModel.predict` raises :class:`LatencyModelNotFitted` and admission admits nothing.
"""

from __future__ import annotations

import math
import threading
import warnings
from collections import deque
from collections.abc import Iterable, Sequence
from typing import Any

from .latency_coefficients import (
    DecodeCoefficients,
    Eq1Coefficients,
    Equation,
    FitQuality,
    LatencyModelNotFitted,
    PrefillCoefficients,
)
from .latency_fit import _Fit, _median, _nnls_relative, _quality, _relative_errors
from .types import ExecutionMode, ProposedBatch, StepRecord

__all__ = [
    "Equation",
    "PrefillCoefficients",
    "DecodeCoefficients",
    "FitQuality",
    "LatencyModel",
    "LatencyModelNotFitted",
    "prefill_features",
    "eq1_time",
    "eq2_time",
    "Eq1Coefficients",
    "MODEL_FORMAT",
]

#: ``format`` field of :meth:`LatencyModel.to_dict`; bump the version when the layout changes.
MODEL_FORMAT = "deltaserve.latency_model"
# Version 2: Equation I gained δ (per-row cost). Version 3: the co-serving terms ζ and η. Older files lack
# terms that change predictions on some hosts and are refused (recalibrate).
_MODEL_FORMAT_VERSION = 3

_MODES: tuple[ExecutionMode, ...] = (ExecutionMode.GRAPH, ExecutionMode.EAGER)
_ZERO_EQ1: Eq1Coefficients = (0.0,) * 8  # type: ignore[assignment]
_OTHER = {ExecutionMode.GRAPH: ExecutionMode.EAGER, ExecutionMode.EAGER: ExecutionMode.GRAPH}


# ------------------------------------------------------------------------------------------ hot path helpers
#
# These are module functions rather than methods so admission can evaluate a growing mixed batch from
# running integer sums and get *bit-identical* results to LatencyModel.predict on the full batch: both call
# the same expression on the same (exact, integer) features.


def prefill_features(
    prefill_lengths: Iterable[int], num_decode: int, kv_tokens: int, ft_lengths: Iterable[int] = ()
) -> tuple[int, int, int, int, int]:
    """Equation I features ``(Σ(nᵢ+B_d)², T_in + B_d, T_ft, K, R)``; fine-tuning rows count as prefill rows
    too, and ``R`` = prompts + decodes + fine-tuning samples (the rows of the step, priced by δ)."""
    bd = num_decode
    sum_sq = 0
    t_lin = bd
    rows = bd
    for n in prefill_lengths:
        m = n + bd
        sum_sq += m * m
        t_lin += n
        rows += 1
    t_ft = 0
    for n in ft_lengths:
        m = n + bd
        sum_sq += m * m
        t_ft += n
        rows += 1
    return sum_sq, t_lin + t_ft, t_ft, kv_tokens, rows


def eq1_time(coef: Sequence[float], sum_sq: int, t_lin: int, t_ft: int, kv: int, rows: int = 0) -> float:
    """Equation I from its features (see :func:`prefill_features`); ``coef`` is ``(α, β, γ, ε, c, δ, ζ, η)``.

    Shorter tuples are accepted: the paper's ``(α, β, γ, ε, c)`` and ``(α, β, γ, ε, c, δ)`` (missing terms
    are 0). The one Equation I price: :meth:`LatencyModel.predict` and every step admission prices call it.
    """
    d = coef[5] if len(coef) > 5 else 0.0
    base = coef[0] * sum_sq + coef[1] * t_lin + coef[2] * t_ft + coef[3] * kv + d * rows + coef[4]
    if t_ft and len(coef) > 7:
        return base + (coef[6] * (t_lin - t_ft) + coef[7])
    return base


def eq2_time(coef: tuple[float, float, float], num_decode: int, kv: int) -> float:
    """Equation II; ``coef`` is ``(β′, ε′, c′)``."""
    return coef[0] * num_decode + coef[1] * kv + coef[2]


def _record_row(record: StepRecord) -> tuple[Equation, tuple[float, ...]] | None:
    """The (equation, feature row) a record contributes, or None when it cannot be used for fitting."""
    y = record.duration_s
    if record.aborted_sample_ids or not (isinstance(y, (int, float)) and math.isfinite(y) and y > 0):
        # An aborted step stopped part-way through its layers: its duration says nothing about the shape.
        return None
    if record.prefill_lengths or record.finetune_lengths:
        s, t, f, k, r = prefill_features(record.prefill_lengths, record.num_decode, record.kv_tokens,
                                         record.finetune_lengths)
        # column order = PrefillCoefficients field order (α, β, γ, ε, c, δ, ζ, η)
        co = 1.0 if f else 0.0
        return Equation.PREFILL, (float(s), float(t), float(f), float(k), 1.0, float(r), co * (t - f), co, float(y))
    return Equation.DECODE, (float(record.num_decode), float(record.kv_tokens), 1.0, float(y))


class LatencyModel:
    """Equations I and II with one coefficient set per :class:`ExecutionMode`, fitted and refitted online.

    Thread-safety: predictions read coefficient tables that a fit replaces whole (never mutates in place),
    so a refit running in another thread (e.g. a step sink that offloads :meth:`refit`) never exposes a
    half-updated coefficient set. ``observe``/``fit``/``refit`` serialise among themselves on a lock.

    Parameters: ``window`` rows kept per (mode, equation) of live records; a refit of a (mode, equation)
    every ``refit_every`` new records of it (0 disables automatic refits: call :meth:`refit` yourself);
    at least ``min_records`` rows before a (mode, equation) is fitted; outlier trimming per the module docs;
    ``anchor_weight``: the weight of each calibration (anchor) row relative to a live row in online refits.
    """

    def __init__(
        self,
        *,
        window: int = 2048,
        refit_every: int = 256,
        min_records: int = 8,
        outlier_k: float = 4.0,
        outlier_floor: float = 0.02,
        anchor_weight: float = 0.1,
    ) -> None:
        if window < 1:
            raise ValueError(f"LatencyModel window must be at least 1 record, got {window}")
        if refit_every < 0:
            raise ValueError(f"LatencyModel refit_every must be >= 0 (0 disables automatic refits), got {refit_every}")
        if min_records < 5:
            raise ValueError(f"LatencyModel min_records must be at least 5 (Equations I and II have 6 and 3 "
                             "coefficients; NNLS tolerates the odd under-determined refit), "
                             f"got {min_records}")
        if not outlier_k > 0 or not outlier_floor >= 0:
            raise ValueError("LatencyModel outlier_k must be > 0 and outlier_floor >= 0")
        if not 0 < anchor_weight <= 1:
            raise ValueError(f"LatencyModel anchor_weight must be in (0, 1], got {anchor_weight}")
        self.anchor_weight = anchor_weight
        self.window = window
        self.refit_every = refit_every
        self.min_records = min_records
        self.outlier_k = outlier_k
        self.outlier_floor = outlier_floor
        self._lock = threading.RLock()
        keys = [(m, e) for m in _MODES for e in Equation]
        self._live: dict[tuple[ExecutionMode, Equation], deque[tuple[float, ...]]] = {
            k: deque(maxlen=window) for k in keys
        }
        self._anchors: dict[tuple[ExecutionMode, Equation], list[tuple[float, ...]]] = {k: [] for k in keys}
        self._since_refit: dict[tuple[ExecutionMode, Equation], int] = {k: 0 for k in keys}
        self._fits: dict[tuple[ExecutionMode, Equation], _Fit] = {}
        self._own_source: dict[tuple[ExecutionMode, Equation], str] = {}
        self.skipped_records = 0
        # Resolved (fallbacks applied) coefficient tuples, read by predict without locking.
        self._eq1: dict[ExecutionMode, Eq1Coefficients] = {}
        self._eq2: dict[ExecutionMode, tuple[float, float, float]] = {}
        self._sources: dict[tuple[ExecutionMode, Equation], str] = {}
        self._eq1_floor: tuple[float, ...] = _ZERO_EQ1
        self._ready = False
        self._warned_eager_from_graph = False

    # ------------------------------------------------------------------------------------------ prediction

    @property
    def is_ready(self) -> bool:
        """Whether every (mode, equation) can be priced (possibly through a documented fallback)."""
        return self._ready

    def predict(
        self,
        prefill_lengths: Sequence[int] = (),
        num_decode: int = 0,
        kv_tokens: int = 0,
        ft_lengths: Sequence[int] = (),
        mode: ExecutionMode = ExecutionMode.EAGER,
    ) -> float:
        """Predicted duration (seconds) of one step in ``mode``.

        Called by admission and by anyone who wants a price for a hypothetical step. The caller picks the
        mode; note that a step carrying fine-tuning rows always runs eagerly (see :meth:`predict_batch`).
        Pure float arithmetic: a few µs for typical batches.
        """
        if prefill_lengths or ft_lengths:
            coef = self._eq1.get(mode)
            if coef is None:
                raise LatencyModelNotFitted(self._missing_message(mode, Equation.PREFILL))
            s, t, f, k, r = prefill_features(prefill_lengths, num_decode, kv_tokens, ft_lengths)
            return eq1_time(coef, s, t, f, k, r)
        coef2 = self._eq2.get(mode)
        if coef2 is None:
            raise LatencyModelNotFitted(self._missing_message(mode, Equation.DECODE))
        return eq2_time(coef2, num_decode, kv_tokens)

    def predict_batch(
        self,
        batch: ProposedBatch,
        extra_ft_lengths: Sequence[int] = (),
        mode: ExecutionMode | None = None,
    ) -> float:
        """Predicted duration of ``batch`` plus fine-tuning rows of ``extra_ft_lengths``.

        ``mode`` defaults to EAGER when fine-tuning rows are added (capture hooks cannot run inside a
        replayed graph) and to ``batch.mode`` -- the host's own choice -- otherwise.
        """
        if mode is None:
            mode = ExecutionMode.EAGER if extra_ft_lengths else batch.mode
        prefill: list[int] = []
        bd = 0
        kv = 0
        for r in batch.scheduled:
            if r.prefill_tokens > 0:
                prefill.append(r.prefill_tokens)
            else:
                bd += 1
                kv += r.context_tokens
        return self.predict(prefill, bd, kv, extra_ft_lengths, mode)

    def min_prefill_time(self, num_tokens: int) -> float:
        """A lower bound on the duration of a step that prefills one request of ``num_tokens`` tokens alone,
        in whichever mode the host picks (coefficient-wise minimum over modes; 0 when uncalibrated).

        Called by the SLO budget for requests still waiting in the queue: whatever this step does, their
        own prefill step must still run before their first token. That step has at least the one row, so
        the floor is α n² + β n + (c + δ).
        """
        a, b, _, _, c, d, _, _ = self._eq1_floor
        return a * (num_tokens * num_tokens) + b * num_tokens + (c + d)

    def prefill_floor_coefficients(self) -> tuple[float, float, float]:
        """``(α, β, c + δ)`` of :meth:`min_prefill_time` (δ folded into the constant: the request's own
        prefill step has at least its one row), for callers that inline it in a per-request loop."""
        a, b, _, _, c, d, _, _ = self._eq1_floor
        return a, b, c + d

    def eq1_coefficients(self, mode: ExecutionMode) -> Eq1Coefficients | None:
        """Resolved ``(α, β, γ, ε, c, δ, ζ, η)`` for ``mode`` (fallbacks applied), or None. For :func:`eq1_time`."""
        return self._eq1.get(mode)

    def eq2_coefficients(self, mode: ExecutionMode) -> tuple[float, float, float] | None:
        """Resolved ``(β′, ε′, c′)`` for ``mode`` (fallbacks applied), or None. For :func:`eq2_time`."""
        return self._eq2.get(mode)

    def coefficients(self, mode: ExecutionMode, equation: Equation) -> PrefillCoefficients | DecodeCoefficients | None:
        """Resolved coefficients of one (mode, equation) as a named object, or None."""
        if equation is Equation.PREFILL:
            c1 = self._eq1.get(mode)
            return None if c1 is None else PrefillCoefficients(*c1)
        c2 = self._eq2.get(mode)
        return None if c2 is None else DecodeCoefficients(*c2)

    def source(self, mode: ExecutionMode, equation: Equation) -> str:
        """Where the coefficients of (mode, equation) come from: ``"fitted"``, ``"set"``, ``"fallback:<why>"``
        or ``"missing"``."""
        return self._sources.get((mode, equation), "missing")

    def _missing_message(self, mode: ExecutionMode, equation: Equation) -> str:
        return (f"latency model has no {equation.value} coefficients for {mode.value} mode (nor a fallback); "
                "run calibration (`deltaserve calibrate`) or load a saved profile before admitting fine-tuning")

    # -------------------------------------------------------------------------------------- coefficients

    def set_coefficients(
        self,
        mode: ExecutionMode,
        prefill: PrefillCoefficients | None = None,
        decode: DecodeCoefficients | None = None,
    ) -> None:
        """Install coefficients directly (tests, seeding from a profile). They are replaced by the next fit
        of that (mode, equation)."""
        with self._lock:
            nan_quality = FitQuality(n=0, mape=math.nan, p95_ape=math.nan, max_ape=math.nan)
            if prefill is not None:
                self._fits[(mode, Equation.PREFILL)] = _Fit(prefill.as_tuple(), nan_quality)
            if decode is not None:
                self._fits[(mode, Equation.DECODE)] = _Fit(decode.as_tuple(), nan_quality)
            if prefill is not None:
                self._own_source[(mode, Equation.PREFILL)] = "set"
            if decode is not None:
                self._own_source[(mode, Equation.DECODE)] = "set"
            self._resolve()

    def _resolve(self) -> None:
        """Rebuild the prediction tables with fallbacks; called with the lock held after every change."""
        sources: dict[tuple[ExecutionMode, Equation], str] = {k: self._own_source.get(k, "fitted") for k in self._fits}
        eq1: dict[ExecutionMode, Eq1Coefficients] = {}
        eq2: dict[ExecutionMode, tuple[float, float, float]] = {}
        for mode in _MODES:
            own = self._fits.get((mode, Equation.PREFILL))
            other = self._fits.get((_OTHER[mode], Equation.PREFILL))
            if own is not None:
                eq1[mode] = own.coef  # type: ignore[assignment]
            elif other is not None:
                eq1[mode] = other.coef  # type: ignore[assignment]
                sources[(mode, Equation.PREFILL)] = f"fallback:{_OTHER[mode].value} prefill coefficients"
        for mode in _MODES:
            own = self._fits.get((mode, Equation.DECODE))
            other = self._fits.get((_OTHER[mode], Equation.DECODE))
            if own is not None:
                eq2[mode] = own.coef  # type: ignore[assignment]
            elif other is not None:
                eq2[mode] = other.coef  # type: ignore[assignment]
                sources[(mode, Equation.DECODE)] = f"fallback:{_OTHER[mode].value} decode coefficients"
            elif mode in eq1:
                _, b, _, e, c, d, _, _ = eq1[mode]
                eq2[mode] = (b + d, e, c)  # a decode-only step's rows are its B_d decodes
                sources[(mode, Equation.DECODE)] = "fallback:prefill equation without prefill rows"
        self._sources = sources
        self._eq1_floor = (tuple(min(vals) for vals in zip(*eq1.values())) if eq1  # type: ignore[assignment]
                           else _ZERO_EQ1)
        self._eq1 = eq1
        self._eq2 = eq2
        self._ready = all(m in eq1 and m in eq2 for m in _MODES)

    def _warn_if_eager_borrowed(self) -> None:
        if self.source(ExecutionMode.EAGER, Equation.PREFILL).startswith("fallback") \
                and not self._warned_eager_from_graph:
            self._warned_eager_from_graph = True
            warnings.warn(
                "latency model: no eager-mode prefill fit, so mixed (fine-tuning) steps are priced with graph "
                "coefficients, which under-estimates them; calibrate the host in eager mode too",
                RuntimeWarning, stacklevel=3)

    # ------------------------------------------------------------------------------------------- fitting

    def fit(self, records: Iterable[StepRecord], *, anchor: bool = True) -> dict[ExecutionMode, FitQuality]:
        """Fit every (mode, equation) that has enough rows in ``records`` from scratch (earlier fits and
        installed coefficients are discarded).

        Called by calibration with the sweep's records. With ``anchor`` the records become the anchor set
        that every later online refit includes (see module docs); the live window is cleared either way.
        Returns the in-sample quality per mode (see :meth:`fit_quality`).
        """
        rows = self._rows_by_key(records)
        with self._lock:
            self._fits.clear()
            self._own_source.clear()
            for key in self._live:
                self._live[key].clear()
                self._since_refit[key] = 0
                if anchor:
                    self._anchors[key] = rows.get(key, [])
            for key, key_rows in rows.items():
                if anchor:
                    self._fit_key(key, key_rows)
                else:
                    self._live[key].extend(key_rows)
                    self._fit_key(key, (), list(self._live[key]))
            self._resolve()
            self._warn_if_eager_borrowed()
        return self.fit_quality()

    def set_anchors(self, records: Iterable[StepRecord]) -> None:
        """Replace the anchor set without refitting (used when coefficients come from a saved profile)."""
        rows = self._rows_by_key(records)
        with self._lock:
            for key in self._anchors:
                self._anchors[key] = rows.get(key, [])

    def observe(self, record: StepRecord) -> bool:
        """Add one executed step to the rolling window; refit its (mode, equation) every ``refit_every``.

        Called by the core's step sink once per step (scheduling process, after the step's outputs were
        processed). Unusable records (aborted steps, non-positive durations) are counted in
        ``skipped_records`` and ignored. Returns whether a refit happened. A refit costs a few ms of NNLS;
        hosts that cannot afford that on their scheduling thread set ``refit_every=0`` and call
        :meth:`refit` from elsewhere.
        """
        parsed = _record_row(record)
        if parsed is None:
            self.skipped_records += 1
            return False
        key = (record.mode, parsed[0])
        with self._lock:
            self._live[key].append(parsed[1])
            self._since_refit[key] += 1
            if self.refit_every and self._since_refit[key] >= self.refit_every:
                self._since_refit[key] = 0
                if self._fit_key(key, self._anchors[key], self._live[key]):
                    self._resolve()
                    return True
        return False

    def refit(self) -> None:
        """Refit every (mode, equation) from anchors plus the live window now."""
        with self._lock:
            for key in self._live:
                self._since_refit[key] = 0
                self._fit_key(key, self._anchors[key], self._live[key])
            self._resolve()

    def _rows_by_key(self, records: Iterable[StepRecord]) -> dict[tuple[ExecutionMode, Equation], list]:
        rows: dict[tuple[ExecutionMode, Equation], list] = {}
        for record in records:
            parsed = _record_row(record)
            if parsed is None:
                self.skipped_records += 1
                continue
            rows.setdefault((record.mode, parsed[0]), []).append(parsed[1])
        return rows

    def _fit_key(self, key: tuple[ExecutionMode, Equation], anchors: Sequence[tuple[float, ...]],
                 live: Sequence[tuple[float, ...]] = ()) -> bool:
        rows = list(anchors) + list(live)
        if len(rows) < self.min_records:
            return False
        # Anchors only need to pin what live traffic leaves undetermined, so once live rows exist they
        # count ``anchor_weight`` each and drift in the live window dominates the fit.
        weights = [self.anchor_weight if live else 1.0] * len(anchors) + [1.0] * len(live)
        coef = _nnls_relative(rows, weights)
        rel = _relative_errors(rows, coef)
        med = _median(rel)
        mad = _median([abs(r - med) for r in rel])
        threshold = max(self.outlier_k * 1.4826 * mad, self.outlier_floor)
        keep = [abs(r - med) <= threshold for r in rel]
        dropped = len(rows) - sum(keep)
        if dropped and len(rows) - dropped >= self.min_records:
            rows = [row for row, k in zip(rows, keep) if k]
            weights = [w for w, k in zip(weights, keep) if k]
            coef = _nnls_relative(rows, weights)
            rel = _relative_errors(rows, coef)
        else:
            dropped = 0
        self._fits[key] = _Fit(tuple(coef), _quality(rel, dropped))
        self._own_source[key] = "fitted"
        return True

    # ------------------------------------------------------------------------------------------- quality

    def fit_quality(self) -> dict[ExecutionMode, FitQuality]:
        """In-sample quality of the last fit per mode, both equations pooled (outliers excluded, counted)."""
        out: dict[ExecutionMode, FitQuality] = {}
        for mode in _MODES:
            parts = [self._fits[(mode, e)].quality for e in Equation
                     if (mode, e) in self._fits and self._fits[(mode, e)].quality.n > 0]
            if not parts:
                continue
            n = sum(p.n for p in parts)
            out[mode] = FitQuality(
                n=n,
                mape=sum(p.mape * p.n for p in parts) / n,
                # a pooled p95 cannot be recovered from parts exactly; the worse part's is the honest bound
                p95_ape=max(p.p95_ape for p in parts),
                max_ape=max(p.max_ape for p in parts),
                dropped=sum(p.dropped for p in parts),
            )
        return out

    def calibrated_finetune_tokens(self) -> int | None:
        """The most fine-tuning tokens any calibration (anchor) step carried, or None without anchors.

        Beyond it Equation I extrapolates, and fine-tuning steps far longer than any calibrated one ran well over
        their price on a GPU (``docs/benchmarks.md``). Admission caps a step's fine-tuning tokens here.
        """
        with self._lock:
            rows = self._anchors.get((ExecutionMode.EAGER, Equation.PREFILL), [])
            most = max((row[2] for row in rows), default=0.0)
        return int(most) if most > 0 else None

    def equation_quality(self, mode: ExecutionMode, equation: Equation) -> FitQuality | None:
        """In-sample quality of the last fit of one (mode, equation), or None if it was never fitted."""
        fit = self._fits.get((mode, equation))
        return None if fit is None else fit.quality

    def evaluate(self, records: Iterable[StepRecord]) -> dict[ExecutionMode, FitQuality]:
        """Quality of the current (resolved) coefficients on ``records`` -- e.g. a held-out set -- per the
        mode each record ran in. Unusable records are skipped."""
        rel: dict[ExecutionMode, list[float]] = {}
        for record in records:
            if _record_row(record) is None:
                continue
            pred = self.predict(record.prefill_lengths, record.num_decode, record.kv_tokens,
                                record.finetune_lengths, record.mode)
            rel.setdefault(record.mode, []).append((pred - record.duration_s) / record.duration_s)
        return {mode: _quality(values) for mode, values in rel.items()}

    # -------------------------------------------------------------------------------------- persistence

    def to_dict(self) -> dict[str, Any]:
        """JSON-able state: configuration and the *own* fits (fallbacks are re-derived on load).
        Records are not included; :class:`~deltaserve_core.calibration.CalibrationProfile` stores those."""
        fits: dict[str, dict[str, Any]] = {}
        names = {Equation.PREFILL: ("alpha", "beta", "gamma", "eps", "c", "delta", "zeta", "eta"),
                 Equation.DECODE: ("beta", "eps", "c")}
        for (mode, equation), fit in self._fits.items():
            fits.setdefault(mode.value, {})[equation.value] = {
                "coefficients": dict(zip(names[equation], fit.coef)),
                "quality": fit.quality.to_dict(),
                "source": self._sources.get((mode, equation), "fitted"),
            }
        return {
            "format": MODEL_FORMAT,
            "version": _MODEL_FORMAT_VERSION,
            "config": {
                "window": self.window, "refit_every": self.refit_every, "min_records": self.min_records,
                "outlier_k": self.outlier_k, "outlier_floor": self.outlier_floor,
                "anchor_weight": self.anchor_weight,
            },
            "fits": fits,
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> LatencyModel:
        """Rebuild a model saved with :meth:`to_dict`. Raises ValueError naming what is wrong."""
        if data.get("format") != MODEL_FORMAT:
            raise ValueError(f"not a DeltaServe latency model (format {data.get('format')!r}, "
                             f"expected {MODEL_FORMAT!r})")
        if data.get("version") != _MODEL_FORMAT_VERSION:
            raise ValueError(f"latency model format version {data.get('version')!r} is not supported "
                             f"(this DeltaServe reads version {_MODEL_FORMAT_VERSION}); recalibrate")
        model = cls(**data.get("config", {}))
        with model._lock:
            for mode_name, eqs in data.get("fits", {}).items():
                mode = ExecutionMode(mode_name)
                for eq_name, entry in eqs.items():
                    equation = Equation(eq_name)
                    raw = entry["coefficients"]
                    coef_obj: PrefillCoefficients | DecodeCoefficients = (
                        PrefillCoefficients(**raw) if equation is Equation.PREFILL else DecodeCoefficients(**raw))
                    model._fits[(mode, equation)] = _Fit(coef_obj.as_tuple(), FitQuality.from_dict(entry["quality"]))
                    model._own_source[(mode, equation)] = "set" if entry.get("source") == "set" else "fitted"
            model._resolve()
        return model
