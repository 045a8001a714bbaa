"""Deliberately broken hosts: each breaks exactly one rule of the contract.

The meta-tests run every conformance check against each of them and require that exactly the targeted
check fails. A suite that lets one of these pass is missing a check; one that fails another check too is
blaming the wrong hook. They subclass the reference host so everything but the broken rule is correct.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from deltaserve_core.driver import ClientOutput, ClientRequest
from deltaserve_core.hooks import ActivationSink, ScheduleInterceptor
from deltaserve_core.testing.reference_host import ReferenceHost
from deltaserve_core.types import ExecutionMode, FineTuneSample, HostCapabilities, ProposedBatch, StepRecord


class DoubleInterceptHost(ReferenceHost):
    """Calls on_schedule twice for one step (e.g. a scheduler hook installed on two code paths)."""

    name = "broken-double-intercept"

    def intercept_schedule(self, interceptor: ScheduleInterceptor | None) -> None:
        if interceptor is None:
            return super().intercept_schedule(None)
        class Twice:
            def on_schedule(self, batch: ProposedBatch) -> Sequence[FineTuneSample]:
                first = list(interceptor.on_schedule(batch)) if batch.scheduled else []
                return first + list(interceptor.on_schedule(batch))

            def on_arrival(self, request_id: str, arrival_time: float) -> None:
                interceptor.on_arrival(request_id, arrival_time)

        super().intercept_schedule(Twice())


class NextStepInjectionHost(ReferenceHost):
    """Runs samples injected into an inference step one step late (queued behind running requests)."""

    name = "broken-next-step"

    def intercept_schedule(self, interceptor: ScheduleInterceptor | None) -> None:
        if interceptor is None:
            return super().intercept_schedule(None)
        pending: list[FineTuneSample] = []

        class Late:
            def on_schedule(self, batch: ProposedBatch) -> Sequence[FineTuneSample]:
                run_now = list(pending)
                pending.clear()
                fresh = list(interceptor.on_schedule(batch))
                if batch.is_empty:
                    return run_now + fresh
                pending.extend(fresh)
                return run_now

            def on_arrival(self, request_id: str, arrival_time: float) -> None:
                interceptor.on_arrival(request_id, arrival_time)

        super().intercept_schedule(Late())


class LeakyHost(ReferenceHost):
    """Hands fine-tuning rows' results to clients as if they were requests."""

    name = "broken-leaky"

    def step(self) -> list[ClientOutput]:
        before = self._last_ft
        outputs = super().step()
        return outputs + [ClientOutput(f"finetune-{sid}", (0,), 0.0, 0.0, 0.0) for sid in before]

    _last_ft: tuple[int, ...] = ()

    def _execute(self, step_id, rows, tokens, synthetic=False):  # noqa: ANN001, ANN202
        record = super()._execute(step_id, rows, tokens, synthetic)
        self._last_ft = record.finetune_sample_ids
        return record


class DriftingOutputsHost(ReferenceHost):
    """Fine-tuning rows perturb the inference rows of their step (e.g. a shared scratch buffer)."""

    name = "broken-drift"

    def _layer(self, li, layer, hidden, rows, cos, sin, index):  # noqa: ANN001, ANN202
        out = super()._layer(li, layer, hidden, rows, cos, sin, index)
        if any(r.sample is not None for r in rows):
            for r in rows:
                if r.seq is not None:
                    out[r.start:r.start + r.length] += 0.5
        return out


class SchedulingChangesHost(ReferenceHost):
    """Merely installing an interceptor changes scheduling (here: one request fewer per step)."""

    name = "broken-scheduling"

    def _schedule(self):  # noqa: ANN202
        prefills, decodes, left = super()._schedule()
        if self._interceptor is not None and len(prefills) > 1:
            extra = prefills.pop()
            with self._lock:
                self._waiting.appendleft(extra)
            left = [extra] + left
        return prefills, decodes, left


class ReservedAdapterHost(ReferenceHost):
    """Lets clients use the reserved fine-tuning adapter."""

    name = "broken-reserved"

    def submit(self, request: ClientRequest) -> None:
        from deltaserve_core.hooks import RESERVED_ADAPTER_NAME

        if request.adapter == RESERVED_ADAPTER_NAME:
            import time

            from deltaserve_core.testing.reference_host import _Seq

            self._waiting.append(_Seq(request, time.monotonic()))
            return
        super().submit(request)


class _ShiftedSink:
    def __init__(self, sink: ActivationSink) -> None:
        self.sink = sink
        self.last: dict[int, torch.Tensor] = {}

    def begin_step(self, step_id, samples):  # noqa: ANN001, ANN201
        self.sink.begin_step(step_id, samples)

    def layer_input(self, step_id, layer, sample_id, hidden):  # noqa: ANN001, ANN201
        self.sink.layer_input(step_id, layer, sample_id, hidden * 1.01 if layer > 0 else hidden)

    def should_abort(self, step_id):  # noqa: ANN001, ANN201
        return self.sink.should_abort(step_id)

    def end_step(self, step_id, completed, aborted):  # noqa: ANN001, ANN201
        self.sink.end_step(step_id, completed, aborted)


class WrongCaptureHost(ReferenceHost):
    """Captures a tensor that is not the layer input (here scaled: like capturing after the fused norm)."""

    name = "broken-capture"

    def capture_activation(self, sink: ActivationSink | None) -> None:
        super().capture_activation(None if sink is None else _ShiftedSink(sink))


class CapturesInferenceRowsHost(ReferenceHost):
    """Delivers captures for inference rows too."""

    name = "broken-capture-rows"

    def _layer(self, li, layer, hidden, rows, cos, sin, index):  # noqa: ANN001, ANN202
        sink = self._activation_sink
        if sink is not None and any(r.sample is not None for r in rows):
            for r in rows:
                if r.seq is not None:
                    sink.layer_input(-1, li, 10**9 + r.start, hidden[r.start:r.start + r.length])
        return super()._layer(li, layer, hidden, rows, cos, sin, index)


class IgnoresAbortHost(ReferenceHost):
    """Never polls should_abort: a fine-tuning-only step always runs to the end."""

    name = "broken-abort"

    def capture_activation(self, sink: ActivationSink | None) -> None:
        if sink is None:
            return super().capture_activation(None)

        class NoAbort(_ShiftedSink):
            def layer_input(self, step_id, layer, sample_id, hidden):  # noqa: ANN001, ANN202
                self.sink.layer_input(step_id, layer, sample_id, hidden)

            def should_abort(self, step_id):  # noqa: ANN001, ANN202
                return False

        super().capture_activation(NoAbort(sink))


class DuplicateRecordHost(ReferenceHost):
    """Reports some steps twice."""

    name = "broken-duplicate-record"

    def report_step_time(self, sink):  # noqa: ANN001, ANN201
        if sink is None:
            return super().report_step_time(None)

        def twice(record: StepRecord) -> None:
            sink(record)
            if record.num_decode and not record.synthetic:
                sink(record)

        super().report_step_time(twice)


class LaunchTimeHost(ReferenceHost):
    """Reports a fixed, made-up duration (like timing a kernel launch instead of completion)."""

    name = "broken-timing"

    def report_step_time(self, sink):  # noqa: ANN001, ANN201
        if sink is None:
            return super().report_step_time(None)
        import dataclasses

        def fake(record: StepRecord) -> None:
            sink(record if record.synthetic else dataclasses.replace(record, duration_s=0.5))

        super().report_step_time(fake)


class LyingGraphModeHost(ReferenceHost):
    """Claims graph replay for decode steps that actually ran eagerly."""

    name = "broken-graph-claim"

    def graph_mode(self, batch: ProposedBatch) -> ExecutionMode:
        return ExecutionMode.GRAPH if batch.scheduled and not batch.has_prefill else ExecutionMode.EAGER

    def capabilities(self) -> HostCapabilities:
        import dataclasses

        return dataclasses.replace(super().capabilities(),
                                   graph_modes=frozenset({ExecutionMode.GRAPH, ExecutionMode.EAGER}))


class GraphFinetuneHost(ReferenceHost):
    """Runs (and reports) decode steps as graph replays even when fine-tuning rows joined them."""

    name = "broken-graph-finetune"

    def graph_mode(self, batch: ProposedBatch) -> ExecutionMode:
        return ExecutionMode.GRAPH if batch.scheduled and not batch.has_prefill else ExecutionMode.EAGER

    def capabilities(self) -> HostCapabilities:
        import dataclasses

        return dataclasses.replace(super().capabilities(),
                                   graph_modes=frozenset({ExecutionMode.GRAPH, ExecutionMode.EAGER}))

    def _execute(self, step_id, rows, tokens, synthetic=False):  # noqa: ANN001, ANN202
        import dataclasses

        sink, self._step_sink = self._step_sink, None
        record = super()._execute(step_id, rows, tokens, synthetic)
        self._step_sink = sink
        if not record.prefill_lengths and record.num_decode:
            record = dataclasses.replace(record, mode=ExecutionMode.GRAPH)
        if sink is not None:
            sink(record)
        return record


class StalePublishHost(ReferenceHost):
    """publish_adapter returns a name but never loads the weights (requests on it run the base model)."""

    name = "broken-publish"

    def publish_adapter(self, state):  # noqa: ANN001, ANN201
        from deltaserve_core.testing.reference_host import _Lora

        name = f"{state.name}@v{state.version}"
        self._adapters[name] = _Lora(state.config.scaling, {})
        return name


class SlotSpillHost(ReferenceHost):
    """Once three versions are published, gives base-model rows of steps with adapter rows the newest version's
    delta (vLLM-CPU's LoRA ops before deltaserve_vllm.cpu_lora_fix: index -1 picks the last slot)."""

    name = "broken-slot-spill"
    _slots = 3

    def __init__(self, *args, **kwargs) -> None:  # noqa: ANN002, ANN003
        super().__init__(*args, **kwargs)
        self._published: list[str] = []

    def publish_adapter(self, state):  # noqa: ANN001, ANN201
        name = super().publish_adapter(state)
        self._published.append(name)
        return name

    def _linear(self, x: torch.Tensor, module: torch.nn.Module, layer: int, name: str,
                groups: dict[str, torch.Tensor]) -> torch.Tensor:
        if groups and len(self._published) >= self._slots:
            unadapted = torch.ones(x.shape[0], dtype=torch.bool, device=x.device)
            unadapted[torch.cat(list(groups.values()))] = False
            last = self._published[-1]
            spill = torch.nonzero(unadapted).squeeze(1)
            groups = {**groups, last: torch.cat([groups[last], spill]) if last in groups else spill}
        return super()._linear(x, module, layer, name, groups)


class MistypedHookHost(ReferenceHost):
    """intercept_schedule names its parameter differently from the protocol (keyword calls would break)."""

    name = "broken-signature"

    def intercept_schedule(self, callback):  # noqa: ANN001, ANN201
        return super().intercept_schedule(callback)


#: broken host -> the one check it must fail
TARGETS: dict[type[ReferenceHost], str] = {
    DoubleInterceptHost: "intercept_schedule__once_per_step",
    NextStepInjectionHost: "intercept_schedule__injected_rows_run_in_same_step",
    LeakyHost: "intercept_schedule__no_finetune_row_reaches_client",
    DriftingOutputsHost: "intercept_schedule__outputs_unchanged_by_injection",
    SchedulingChangesHost: "intercept_schedule__declining_leaves_batch_unchanged",
    ReservedAdapterHost: "intercept_schedule__reserved_adapter_refused",
    WrongCaptureHost: "capture_activation__matches_reference_forward",
    CapturesInferenceRowsHost: "capture_activation__only_finetune_rows_in_layer_order",
    IgnoresAbortHost: "capture_activation__abort_stops_finetune_only_step",
    DuplicateRecordHost: "report_step_time__one_record_per_step",
    LaunchTimeHost: "report_step_time__consistent_with_wall_clock",
    LyingGraphModeHost: "graph_mode__agrees_with_execution",
    GraphFinetuneHost: "graph_mode__finetune_steps_are_eager",
    StalePublishHost: "publish_adapter__serves_published_weights",
    SlotSpillHost: "publish_adapter__base_rows_unchanged_when_every_adapter_slot_is_taken",
    MistypedHookHost: "protocol__validate_host",
}
