"""Fine-tuning admission for one scheduling step: Algorithm 1 of the paper.

Who calls it: the core's :class:`~deltaserve_core.hooks.ScheduleInterceptor` (``on_schedule``), in the
host's scheduling process, once per step, after the host chose its inference batch and before dispatch.
Its answer -- the samples to append to that step as prefill rows on the reserved adapter -- is on the
engine's critical path, so the decision is plain Python arithmetic: one pass over the batch for Δ and the
inference features, then a lazy walk of the pool in increasing length that stops at the first sample that
does not fit (the walk is bounded by the step's fine-tuning token cap, never by the pool size). The walk
reads the pool in blocks and settles each block with prefix sums and a bisection; it admits exactly the
samples of the literal loop (see the comment in :meth:`Admission.decide`; the tests compare the two).

Algorithm 1, as implemented by :meth:`Admission.decide`:

1-4.  Nothing while the backward process runs (the caller's ``hold``, which also carries the controller's other
      reasons to wait), when the activation buffer has no room, or the pool is empty.
5-7.  On hosts without mixed batches, nothing for a step that carries only decodes.
8-10. Δ = min(TTFT slack of the earliest deadline with queue wait, TPOT slack minus D_wait) -- see
      :func:`deltaserve_core.slo.step_budget` (which also applies the average-TPOT SLO and per-request
      overrides, and the fine-tuning-only cap for an empty batch).
11-13. If the inference batch alone, priced in the host's own mode (``batch.mode``), exceeds Δ: nothing.
      Prices use Equation I with its per-row term δ·R (see :mod:`.latency_model`): each admitted sample adds
      a row, so on engines with a per-sequence cost many short samples cost more than one long one.
14-22. Samples in increasing token length; each joins while the buffer/step cap holds and the mixed step,
      priced with *eager* coefficients (capture hooks force eager execution), stays ≤ Δ; the first sample
      that fails either check ends the walk, as in the paper (``break``, not ``continue``). The first
      admitted sample also brings Equation I's co-serving terms ζ·U + η (the whole batch's LoRA path, on
      engines that switch it on per batch; see :mod:`.latency_model`): a one-time jump, constant after.
23.   ``pool.claim`` the admitted samples (reserves them, removes them from the pool).

The fine-tuning-only step (no scheduled inference) is the same procedure with an empty inference batch:
its predicted inference time is 0 and Δ is capped by the fine-tuning-only budget (see :mod:`.slo`).

Beyond the paper, a model without calibration admits nothing (reason ``not_calibrated``) instead of
guessing, and a step with inference is held to (Δ − ``overhead_s``) / ``safety`` rather than Δ: an unbiased
estimator is still wrong by a few percent either way, a walk that fills a step up to Δ exactly turns every
under-estimate into a missed SLO, and a decode's token gap also contains the host's time between steps.
``safety`` (≥ 1) and ``overhead_s`` (≥ 0) are measured by the admission's own
:class:`~deltaserve_core.slo_margin.SLOMargin` from the records it is shown (:meth:`Admission.observe`), against the
prices it gave those steps; :meth:`AdmissionPolicy.paper` keeps them at 1 and 0, the paper's rule. Fine-tuning-only
steps are not held by them (no decode waits on such a step).

Also beyond the paper: fine-tuning rows may lengthen a step with inference by at most the fine-tuning-only budget
(``ft_only_budget_s``, default the TPOT SLO), the bound a fine-tuning-only step already has. Equation III prices
only the requests that have arrived; a request arriving while the step runs waits for all of it, and a prefill
step filled up to its requests' TTFT slack (often several times the TPOT SLO) made such arrivals miss their TTFT:
on vLLM-CPU's burst-light trace DeltaServe missed TTFTs that the variant whose fine-tuning-only steps are
never interrupted -- whose completed captures start a backward pass, which pauses admission through the next
steps -- met (``docs/benchmarks.md``). ``AdmissionPolicy(cap_extension=False)`` restores the paper's rule.
Admission never raises for policy reasons; misuse (a negative step cap) is refused at construction.

Every step is priced once (:meth:`Admission._price`): Δ and the inference batch's Equation I/II price serve both
the host-work check (:meth:`Admission.spare_s`) and :meth:`Admission.decide`, and every Equation I price, the
walk's included, is :func:`~deltaserve_core.latency_model.eq1_time` itself.
"""

from __future__ import annotations

import dataclasses
import enum
import logging
import math
from bisect import bisect_right
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from itertools import accumulate, islice, repeat
from operator import add, attrgetter, mul
from typing import Protocol, runtime_checkable

from .finetune_data.pool import InMemoryPool
from .latency_model import Equation, LatencyModel, eq1_time, eq2_time
from .slo import SLOConfig, StepBudget, step_budget
from .slo_margin import SLOMargin
from .types import ExecutionMode, FineTuneSample, ProposedBatch, StepRecord

__all__ = [
    "AdmissionPool",
    "AdmissionPolicy",
    "AdmissionReason",
    "AdmissionDecision",
    "AdmissionRule",
    "Admission",
    "InMemoryPool",
]

log = logging.getLogger("deltaserve.admission")


@runtime_checkable
class AdmissionPool(Protocol):
    """The fine-tuning samples admission may draw from (implemented by the fine-tuning data manager).

    Called by admission in the scheduling process; never concurrently with itself.
    """

    def __len__(self) -> int:
        """Number of samples that could be admitted now (claimed ones excluded)."""
        ...

    def iter_by_length(self) -> Iterator[FineTuneSample]:
        """Unclaimed samples in increasing token length (ties in a fixed, deterministic order), lazily:
        admission stops after the first sample that does not fit, so producing the rest would be waste."""
        ...

    def claim(self, samples: Sequence[FineTuneSample]) -> None:
        """Reserve ``samples`` (a prefix of :meth:`iter_by_length`) for the step being scheduled and remove
        them from the pool, so a pipelined scheduler never selects them twice."""
        ...


class AdmissionReason(str, enum.Enum):
    """Why a decision admitted what it did (the values are stable strings for logs and metrics)."""

    ADMITTED = "admitted"
    BACKWARD_RUNNING = "backward_running"  # line 2: activations of the running backward must not be overwritten
    INSTALL_PENDING = "install_pending"  # beyond the paper: the newest adapter version is not on the host yet
    BACKWARD_RECOVERING = "backward_recovering"  # beyond the paper: the backward process is being restarted
    # beyond the paper: the job is paused (repeated non-finite steps, failing saves, the operator) or stopping
    TRAINING_PAUSED = "training_paused"
    HOST_WORK_IN_STEP = "host_work_in_step"  # beyond the paper: this step's spare time went to an adapter install
    OTHER_JOB = "other_job"  # beyond the paper: another job on this host has the fine-tuning rows (job_sharing)
    BUFFER_FULL = "buffer_full"  # line 2: S_max ≤ 0
    POOL_EMPTY = "pool_empty"  # line 2
    DECODE_ONLY_STEP = "decode_only_step"  # line 5: host cannot mix, step has no prefill
    POLICY_EXCLUDES_STEP = "policy_excludes_step"  # the policy admits into no step of this kind (idle-only)
    NOT_CALIBRATED = "not_calibrated"  # beyond the paper: no coefficients to price the step
    NO_SLACK = "no_slack"  # line 11: the inference batch alone exceeds Δ
    SAMPLE_EXCEEDS_BUDGET = "sample_exceeds_budget"  # line 17 on the first (shortest) sample
    SAMPLE_EXCEEDS_BUFFER = "sample_exceeds_buffer"  # line 16 on the first (shortest) sample


@dataclass(frozen=True, slots=True)
class AdmissionDecision:
    """The outcome of one admission decision.

    ``samples``: admitted, in admission order (increasing length), already claimed from the pool.
    ``delta``: the step's budget Δ (seconds; NaN when the decision stopped before computing it).
    ``predicted_inference``: the inference batch alone in ``batch.mode`` (NaN when not computed; 0 for an
    empty batch). ``predicted_mixed``: the step with ``samples`` added, eager coefficients (None when nothing
    was admitted). ``stopped_by``: what ended the walk when it started -- ``"budget"``, ``"buffer"`` or
    ``"pool_exhausted"``. ``budget``: the full :class:`StepBudget` when Δ was computed.
    """

    samples: tuple[FineTuneSample, ...]
    delta: float
    predicted_inference: float
    predicted_mixed: float | None
    reason: AdmissionReason
    stopped_by: str | None = None
    budget: StepBudget | None = None

    @property
    def admitted_tokens(self) -> int:
        return sum(s.num_tokens for s in self.samples)

    @classmethod
    def refused(cls, reason: AdmissionReason) -> AdmissionDecision:
        """Nothing admitted, for ``reason``, before the step was priced."""
        return cls((), _NAN, _NAN, None, reason)


class AdmissionRule(Protocol):
    """A replacement for Algorithm 1's walk (a benchmark's baseline policy), built by
    :meth:`AdmissionPolicy.with_rule`'s factory from the job's :class:`Admission`. It is asked only for steps
    nothing holds; it claims what it admits from ``pool``."""

    def decide(self, batch: ProposedBatch, *, pool: AdmissionPool, buffer_free_tokens: int) -> AdmissionDecision: ...


@dataclass(frozen=True)
class AdmissionPolicy:
    """How a job's admission departs from the paper's Algorithm 1 (see the module docs); a value, so a caller
    states a policy instead of setting flags on a built controller.

    ``safety_quantile``: steps with inference are held to (Δ − overhead) / safety, both measured by an
    :class:`~deltaserve_core.slo_margin.SLOMargin` at this quantile (1: the window's maximum); ``None`` keeps safety
    1 and overhead 0. ``cap_extension``: fine-tuning rows lengthen a step with inference by at most the
    fine-tuning-only budget. ``cap_to_calibration``: no more fine-tuning tokens per step than calibration measured.
    ``idle_steps_only``: admit only into steps with no inference. ``interrupt``: a request arriving during a
    fine-tuning-only step aborts it at the next layer boundary. ``rule``: builds an :class:`AdmissionRule` that
    replaces the walk (holds, the idle-only filter and the margin stay the core's).
    """

    safety_quantile: float | None = 1.0
    cap_extension: bool = True
    cap_to_calibration: bool = True
    idle_steps_only: bool = False
    interrupt: bool = True
    rule: Callable[[Admission], AdmissionRule] | None = None

    def __post_init__(self) -> None:
        q = self.safety_quantile
        if q is not None and not 0.5 < q <= 1.0:
            raise ValueError(f"safety_quantile must be in (0.5, 1] or None (the paper's rule), got {q!r}")

    @classmethod
    def default(cls) -> AdmissionPolicy:
        """DeltaServe as shipped: measured margin, extension cap, calibrated token cap, interruptible."""
        return cls()

    @classmethod
    def paper(cls) -> AdmissionPolicy:
        """The paper's Algorithm 1: safety 1, no overhead, no extension cap, no calibrated token cap."""
        return cls(safety_quantile=None, cap_extension=False, cap_to_calibration=False)

    @classmethod
    def idle_only(cls) -> AdmissionPolicy:
        """Fine-tuning rows only in steps with no inference."""
        return cls(idle_steps_only=True)

    @classmethod
    def no_interrupt(cls) -> AdmissionPolicy:
        """Fine-tuning-only steps always run to completion (paper §4.4, DeltaServe-No-INTR)."""
        return cls(interrupt=False)

    def with_rule(self, rule: Callable[[Admission], AdmissionRule]) -> AdmissionPolicy:
        """This policy with the walk replaced by the rule ``rule`` builds."""
        return dataclasses.replace(self, rule=rule)


_NAN = math.nan
_input_ids = attrgetter("input_ids")
# The pool is first read 16 samples at a time (most steps admit a handful); later blocks are sized from the
# remaining budget, see Admission.decide.
_FIRST_BLOCK = 16


class Admission:
    """Algorithm 1 bound to one job's model, SLOs, host capabilities and :class:`AdmissionPolicy`.

    Constructed by the core when a job starts (from ``host.capabilities()``), then :meth:`decide` is called
    from ``on_schedule`` each step and :meth:`observe` with each executed step's record. ``decode_mode`` is
    ``host.graph_mode``: with it, the deferred decode step D_wait of a non-mixed host is priced in the mode the
    host will really run it in; without it, the slower mode is assumed. ``ft_only_budget_s`` caps a
    fine-tuning-only step (default: the TPOT SLO).
    """

    def __init__(
        self,
        model: LatencyModel,
        slo: SLOConfig,
        *,
        mixed_batches: bool,
        max_ft_tokens_per_step: int,
        ft_only_budget_s: float | None = None,
        decode_mode: Callable[[ProposedBatch], ExecutionMode] | None = None,
        policy: AdmissionPolicy | None = None,
    ) -> None:
        if isinstance(max_ft_tokens_per_step, bool) or not isinstance(max_ft_tokens_per_step, int) \
                or max_ft_tokens_per_step <= 0:
            raise ValueError(f"max_ft_tokens_per_step must be a positive number of tokens, got "
                             f"{max_ft_tokens_per_step!r}; use the host's "
                             "HostCapabilities.max_finetune_tokens_per_step")
        if ft_only_budget_s is not None and not (math.isfinite(ft_only_budget_s) and ft_only_budget_s > 0):
            raise ValueError(f"ft_only_budget_s must be a positive number of seconds, got {ft_only_budget_s!r}; "
                             "leave it as None to use the TPOT SLO")
        if not isinstance(slo, SLOConfig):
            raise TypeError(f"slo must be an SLOConfig, got {type(slo).__name__}")
        self.policy = policy if policy is not None else AdmissionPolicy.default()
        self.slo = slo
        self.mixed_batches = mixed_batches
        self.max_ft_tokens_per_step = max_ft_tokens_per_step
        self.ft_only_budget_s = ft_only_budget_s
        self.decode_mode = decode_mode
        self.cap_extension = self.policy.cap_extension
        q = self.policy.safety_quantile
        self.margin: SLOMargin | None = SLOMargin(quantile=q) if q is not None else None
        #: a step with inference must fit (Δ − overhead_s) / safety (see the module docs), both taken from
        #: ``margin`` as records arrive. 1 and 0: the paper's rule.
        self.safety = 1.0
        self.overhead_s = 0.0
        self._predicted: dict[int, float] = {}  # step id -> the price this admission gave it
        self._priced: tuple[ProposedBatch, StepBudget, float] | None = None  # the step being scheduled
        self.use_model(model)
        self._rule = self.policy.rule(self) if self.policy.rule is not None else None

    # ------------------------------------------------------------------------------------------ model, margin

    def use_model(self, model: LatencyModel) -> None:
        """Price with ``model`` from now on; under ``cap_to_calibration`` admit no more fine-tuning tokens per
        step than its calibration measured (see
        :meth:`~deltaserve_core.latency_model.LatencyModel.calibrated_finetune_tokens`): a step the model only
        extrapolates to is priced by a guess, and the margin learns that only after it overran."""
        self.model = model
        self._priced = None
        if not self.policy.cap_to_calibration:
            return
        most = model.calibrated_finetune_tokens() if model.is_ready else None
        if most is not None and most < self.max_ft_tokens_per_step:
            log.info("fine-tuning tokens per step capped at %d, the most the calibration measured (was %d)",
                     most, self.max_ft_tokens_per_step)
            self.max_ft_tokens_per_step = most

    def seed_margin(self) -> None:
        """Until co-served steps are measured, trust the calibration's own tail error on eager prefill steps."""
        if self.margin is None:
            return
        quality = self.model.equation_quality(ExecutionMode.EAGER, Equation.PREFILL)
        self.margin.seed(quality.p95_ape if quality is not None else None)
        self.safety = self.margin.factor

    def observe(self, record: StepRecord) -> float | None:
        """Account one executed, non-synthetic step in the margin; returns the price admission gave it (None:
        unpriced)."""
        entry = self._predicted.pop(record.step_id, None)
        predicted = entry if entry is not None and entry == entry else None  # NaN: unpriced
        if self.margin is not None:
            self.margin.observe(record, predicted)
            self.safety = self.margin.factor
            self.overhead_s = self.margin.overhead_s
        return predicted

    def forget(self, step_id: int) -> None:
        """Step ``step_id`` ran another job's fine-tuning rows: its price here (inference alone) says nothing about
        its duration, so the margin must not learn from it (:mod:`.job_sharing`)."""
        self._predicted.pop(step_id, None)

    def discount_gap(self, seconds: float) -> None:
        """Host work of ``seconds`` ran before the next step: not host overhead between steps (see the margin)."""
        if self.margin is not None:
            self.margin.discount_gap(seconds)

    def rows_returned(self, batch: ProposedBatch, decision: AdmissionDecision) -> None:
        """The caller could place none of ``decision``'s samples: the step runs as its inference batch alone."""
        if not batch.is_empty and self.model.is_ready:
            self._predicted[batch.step_id] = decision.predicted_inference
        else:
            self._predicted.pop(batch.step_id, None)

    # ------------------------------------------------------------------------------------------ pricing

    def _price(self, batch: ProposedBatch) -> tuple[StepBudget, float]:
        """Δ and the inference batch alone in ``batch.mode``: computed once per scheduled step."""
        priced = self._priced
        if priced is not None and priced[0] is batch:
            return priced[1], priced[2]
        budget = step_budget(batch, self.slo, self.model, mixed_batches=self.mixed_batches,
                             deferred_mode=self._deferred_mode(batch), ft_only_budget_s=self.ft_only_budget_s)
        # Σ(nᵢ+B_d)² = Σn² + 2·B_d·Σn + p·B_d², exact in integers; the inference batch has R = p + B_d rows
        # (δ's feature, see latency_model).
        p, lin, bd, kv = budget.num_prefill, budget.prefill_tokens, budget.num_decode, budget.kv_tokens
        mode = batch.mode
        if p:
            inference = eq1_time(self.model.eq1_coefficients(mode), budget.prefill_sq + 2 * bd * lin + p * bd * bd,  # type: ignore[arg-type]
                                 lin + bd, 0, kv, p + bd)
        elif bd:
            inference = eq2_time(self.model.eq2_coefficients(mode), bd, kv)  # type: ignore[arg-type]
        else:
            inference = 0.0
        self._priced = (batch, budget, inference)
        return budget, inference

    def spare_s(self, batch: ProposedBatch, *, inference_margin: bool = True) -> float:
        """Seconds ``batch`` could be lengthened by *measured* host work and still meet every SLO (0 when the model
        is not ready or there is no slack). A fine-tuning-only step is never waited on.

        The step is priced at the margin's inference-only factor (``inference_margin=False``: its plain
        prediction) times its prediction; the host work is a measured time, so it is not divided by the margin.
        The controller prices host-side work it must do between steps (installing a new adapter version) with
        this, so that work lands where no request pays for it."""
        if not batch.scheduled:
            return math.inf
        if not self.model.is_ready:
            return 0.0
        factor = self.margin.inference_factor if inference_margin and self.margin is not None else 1.0
        budget, inference = self._price(batch)
        return max(0.0, budget.delta - self.overhead_s - factor * inference)

    def _deferred_mode(self, batch: ProposedBatch) -> ExecutionMode | None:
        if self.decode_mode is None or self.mixed_batches:
            return None
        deferred = batch.deferred_decodes
        if not deferred:
            return None
        probe = ProposedBatch(step_id=batch.step_id, now=batch.now, scheduled=deferred)
        return self.decode_mode(probe)

    # ------------------------------------------------------------------------------------------ decision

    def decide(
        self,
        batch: ProposedBatch,
        *,
        pool: AdmissionPool,
        buffer_free_tokens: int,
        hold: AdmissionReason | None = None,
    ) -> AdmissionDecision:
        """Run Algorithm 1 for ``batch``; claims and returns the admitted samples. See the module docs.

        ``hold``: the caller's reason to admit nothing this step (the backward runs, an install is pending, the
        job is paused): the decision carries it as its reason."""
        if hold is not None:
            decision = AdmissionDecision.refused(hold)
        elif self.policy.idle_steps_only and not batch.is_empty:
            decision = AdmissionDecision.refused(AdmissionReason.POLICY_EXCLUDES_STEP)
        elif self._rule is not None:
            decision = self._rule.decide(batch, pool=pool, buffer_free_tokens=buffer_free_tokens)
        else:
            decision = self._algorithm1(batch, pool, buffer_free_tokens)
        self._priced = None
        if decision.samples:
            self._predicted[batch.step_id] = decision.predicted_mixed or 0.0
        elif not batch.is_empty and self.model.is_ready:
            self._predicted[batch.step_id] = decision.predicted_inference
        return decision

    def _algorithm1(self, batch: ProposedBatch, pool: AdmissionPool, buffer_free_tokens: int) -> AdmissionDecision:
        # Lines 2-4 (line 2's running backward is the caller's ``hold``).
        if buffer_free_tokens <= 0:
            return AdmissionDecision.refused(AdmissionReason.BUFFER_FULL)
        if len(pool) == 0:
            return AdmissionDecision.refused(AdmissionReason.POOL_EMPTY)

        # Lines 5-7. An empty batch is a fine-tuning-only step, which is a prefill step on every host.
        if not self.mixed_batches and batch.scheduled and not batch.has_prefill:
            return AdmissionDecision.refused(AdmissionReason.DECODE_ONLY_STEP)

        model = self.model
        if not model.is_ready:
            return AdmissionDecision.refused(AdmissionReason.NOT_CALIBRATED)

        # Lines 8-13: Δ, then the inference batch alone in the host's own mode.
        budget, inference = self._price(batch)
        delta = budget.delta
        if inference > delta:
            return AdmissionDecision((), delta, inference, None, AdmissionReason.NO_SLACK, budget=budget)

        # Lines 14-22, eager coefficients. Both stopping tests are monotone in the number of samples taken
        # (tokens grow; every coefficient is ≥ 0 and the integer features -- the row count R included, one
        # more per sample -- only grow, and IEEE rounding is monotone), so the sample-by-sample walk stops
        # exactly where a bisection over prefix sums does.
        # The pool is read in growing blocks and each block is settled with C-level prefix sums and a
        # bisection: the same samples as the literal loop, at a fraction of the interpreter work when many
        # short samples fit. Features are exact integers and every candidate is priced by eq1_time, so the
        # walk's prices are LatencyModel.predict's on the mixed batch.
        bd, kv = budget.num_decode, budget.kv_tokens
        sum_sq = budget.prefill_sq + 2 * bd * budget.prefill_tokens + budget.num_prefill * bd * bd
        t_lin = budget.prefill_tokens + bd
        rows = budget.num_prefill + bd
        coef = model.eq1_coefficients(ExecutionMode.EAGER)
        limit_s = delta
        if self.cap_extension and batch.scheduled:
            # no step grows by more than a fine-tuning-only step may take (see the module docs)
            extension = self.slo.tpot_s if self.ft_only_budget_s is None else self.ft_only_budget_s
            limit_s = min(delta, inference + extension)
        if batch.scheduled:
            # the measured margin (see slo_margin): a decode's token gap is the host's time between steps plus
            # the step, and the step may run up to ``safety`` times its prediction
            if self.overhead_s or self.safety != 1.0:
                limit_s = (limit_s - self.overhead_s) / self.safety
        fit_within = limit_s
        limit = buffer_free_tokens if buffer_free_tokens < self.max_ft_tokens_per_step else self.max_ft_tokens_per_step
        admitted: list[FineTuneSample] = []
        tokens = 0
        stopped_by = "pool_exhausted"
        source = pool.iter_by_length()
        block_size = _FIRST_BLOCK
        per_token = coef[1] + coef[2]  # every FT token adds at least β + γ (the quadratic and per-row terms add more)
        while True:
            block = list(islice(source, block_size))
            if not block:
                break
            lens = list(map(len, map(_input_ids, block)))
            f_pre = list(accumulate(lens, initial=tokens))  # f_pre[j]: FT tokens with j more samples
            shifted = list(map(add, lens, repeat(bd))) if bd else lens
            s_pre = list(accumulate(map(mul, shifted, shifted), initial=sum_sq))
            fits_buffer = bisect_right(f_pre, limit) - 1  # line 16: most samples of the block within S_max
            lo, hi = 0, fits_buffer  # cost with lo samples is known to fit (lo = 0: the state before the block)
            # with j more samples: f_pre[j] FT tokens, s_pre[j] squared, rows + j rows
            if hi and eq1_time(coef, s_pre[hi], t_lin + f_pre[hi], f_pre[hi], kv, rows + hi) <= fit_within:
                lo = hi
            else:
                hi -= 1  # the largest count still in question
                while lo < hi:  # line 17: largest count whose mixed step stays within Δ
                    mid = (lo + hi + 1) >> 1
                    if eq1_time(coef, s_pre[mid], t_lin + f_pre[mid], f_pre[mid], kv, rows + mid) <= fit_within:
                        lo = mid
                    else:
                        hi = mid - 1
            if lo:
                admitted.extend(block[:lo])
                tokens = f_pre[lo]
                sum_sq = s_pre[lo]
                rows += lo
            if lo < len(block):
                stopped_by = "buffer" if lo == fits_buffer else "budget"
                break
            # The whole block fitted. Size the next one to what can still fit: the remaining buffer and
            # budget bound the tokens, and no later sample is shorter than this block's last one. (Only the
            # amount read ahead depends on this estimate, never which samples are admitted.)
            room = limit - tokens
            if per_token > 0:
                now_cost = eq1_time(coef, sum_sq, t_lin + tokens, tokens, kv, rows)
                room = min(room, int((fit_within - now_cost) / per_token) + 1)
            block_size = max(1, room // lens[-1] + 1)

        if not admitted:
            reason = (AdmissionReason.SAMPLE_EXCEEDS_BUFFER if stopped_by == "buffer"
                      else AdmissionReason.SAMPLE_EXCEEDS_BUDGET if stopped_by == "budget"
                      else AdmissionReason.POOL_EMPTY)
            return AdmissionDecision((), delta, inference, None, reason, stopped_by, budget)
        samples = tuple(admitted)
        pool.claim(samples)  # line 23
        mixed = eq1_time(coef, sum_sq, t_lin + tokens, tokens, kv, rows)
        return AdmissionDecision(samples, delta, inference, mixed, AdmissionReason.ADMITTED, stopped_by, budget)
