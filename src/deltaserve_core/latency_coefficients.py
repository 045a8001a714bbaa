"""The latency model's value types: which equation prices a step, its coefficients, and how well they fit.

Split from :mod:`deltaserve_core.latency_model` (which re-exports every name here and documents the equations);
what follows is why Equation I has coefficients the paper's does not.

The per-row term δ R (beyond the paper)
---------------------------------------
``R`` is the number of rows (sequences) in the step: prefill requests + decode requests + fine-tuning
samples. The paper's Equation I has no term for it, which is right for an engine that runs a step's
attention as *one* variable-length kernel over all rows: there a row costs only its tokens. But many engines
pay a fixed cost per sequence -- the reference host loops over requests for attention, S-LoRA-style
per-request kernels launch once per row, and on a GPU small steps are launch-bound, so every extra row adds
kernel launches, metadata and a gather/scatter of its KV. Equation I then has to smear that cost over
α, β and c, and mis-prices steps with many short rows (a decode batch joining a prompt, a pile of short
fine-tuning samples); ``benchmarks/latency_model.py`` measures the held-out error with and without δ R
(``docs/benchmarks.md``, "Figures behind design choices"). Because the fit is non-negative, an engine
without a per-row cost simply fits δ ≈ 0 and Equation I reduces to the paper's. Equation II has no separate
δ′: in a decode-only step R = B_d, so a per-row cost is already what β′ measures.

The co-serving terms ζ U + η (beyond the paper)
----------------------------------------------
γ T_ft assumes a fine-tuning row only costs its own tokens. That holds on engines that apply a LoRA
adapter per row (the reference host, S-LoRA's per-request kernels), but not on engines that switch the
LoRA path on for the *whole* batch once any row uses an adapter: vLLM's punica path then runs the LoRA
shrink/expand over every token of the step, so even a short fine-tuning row makes every client token of the
step pay the LoRA cost. Without these terms Equation I under-predicts co-serving steps on such engines (the
measured gap: ``docs/benchmarks.md``) -- unsafe, since admission would then let a step overrun Δ. ``ζ`` prices
each inference token of a step that carries fine-tuning rows, ``η`` a fixed cost of turning the LoRA path
on. Both features are zero unless the step carries fine-tuning rows, so pure-inference steps are priced
exactly as before, and hosts where adapters are per-row fit ζ ≈ η ≈ 0 (non-negative fit). For admission
they are a one-time jump when the first sample is admitted, constant afterwards, so the cost of a growing
mixed batch stays monotone in the samples taken. The calibration ``finetune`` family varies U under
fine-tuning (none, a short and a mid-length prompt, decode batches) so the two are identifiable.

The extra coefficients are appended after δ: the tuples are ``(α, β, γ, ε, c, δ, ζ, η)``, so code that
builds coefficients positionally as ``(α, β, γ, ε, c)`` keeps working (δ, ζ and η default to 0), and
:func:`eq1_time` also accepts the paper's 5-tuple. :func:`prefill_features` returns ``R`` as a fifth feature;
U is ``T_in + B_d − T_ft`` of those features, so it needs no feature of its own.
"""

from __future__ import annotations

import enum
import math
from dataclasses import asdict, dataclass
from typing import Any

__all__ = [
    "DecodeCoefficients",
    "Eq1Coefficients",
    "Equation",
    "FitQuality",
    "LatencyModelNotFitted",
    "PrefillCoefficients",
]

#: ``(α, β, γ, ε, c, δ, ζ, η)``, see :class:`PrefillCoefficients`.
Eq1Coefficients = tuple[float, float, float, float, float, float, float, float]


class Equation(str, enum.Enum):
    """Which of the two latency equations prices a step."""

    PREFILL = "prefill"  # Equation I: the step computes at least one prefill or fine-tuning row
    DECODE = "decode"  # Equation II: decode rows only


class LatencyModelNotFitted(LookupError):
    """The model has no coefficients that can price the requested step."""


@dataclass(frozen=True, slots=True)
class PrefillCoefficients:
    """Equation I coefficients, in seconds per unit of each feature.

    ``delta`` (δ, seconds per row of the step), ``zeta`` (ζ, seconds per inference token of a step that
    carries fine-tuning rows) and ``eta`` (η, seconds per such step) come last and default to 0, the
    paper's Equation I, so ``PrefillCoefficients(α, β, γ, ε, c)`` keeps its meaning (see the module docs).
    """

    alpha: float
    beta: float
    gamma: float
    eps: float
    c: float
    delta: float = 0.0
    zeta: float = 0.0
    eta: float = 0.0

    def __post_init__(self) -> None:
        _check_coefficients(self)

    def as_tuple(self) -> Eq1Coefficients:
        """``(α, β, γ, ε, c, δ, ζ, η)``: the layout of :func:`eq1_time`'s ``coef``."""
        return (self.alpha, self.beta, self.gamma, self.eps, self.c, self.delta, self.zeta, self.eta)


@dataclass(frozen=True, slots=True)
class DecodeCoefficients:
    """Equation II coefficients (β′, ε′, c′), in seconds per unit of each feature."""

    beta: float
    eps: float
    c: float

    def __post_init__(self) -> None:
        _check_coefficients(self)

    def as_tuple(self) -> tuple[float, float, float]:
        return (self.beta, self.eps, self.c)


def _check_coefficients(coef: Any) -> None:
    for name, value in asdict(coef).items():
        if not (isinstance(value, (int, float)) and math.isfinite(value) and value >= 0):
            raise ValueError(
                f"{type(coef).__name__}.{name} must be a finite non-negative number of seconds per unit, "
                f"got {value!r}"
            )


@dataclass(frozen=True, slots=True)
class FitQuality:
    """How well coefficients explain a set of step records.

    ``mape`` and ``p95_ape`` are fractions (0.02 = 2 %) of absolute percentage error ``|pred - t| / t``;
    ``n`` is the number of records scored, ``dropped`` the outliers the trimmed fit excluded (0 for a
    held-out evaluation).
    """

    n: int
    mape: float
    p95_ape: float
    max_ape: float
    dropped: int = 0

    def to_dict(self) -> dict[str, float | int | None]:
        """JSON-able; NaN (nothing scored) becomes None so the output is strict JSON."""
        return {k: (None if isinstance(v, float) and math.isnan(v) else v) for k, v in asdict(self).items()}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> FitQuality:
        def num(x: Any) -> float:
            return math.nan if x is None else float(x)

        return cls(n=int(data["n"]), mape=num(data["mape"]), p95_ape=num(data["p95_ape"]),
                   max_ape=num(data["max_ape"]), dropped=int(data.get("dropped", 0)))
