"""Shared scaffolding for the blind broken hosts.

``Patchable`` is the reference host with its step/forward split into small overridable pieces; unmodified it
behaves exactly like ``ReferenceHost`` (checked: it passes the suite and every proof). Each broken host overrides
one piece. ``GraphCapable`` is a correct host that additionally *models* CUDA-graph capture sizes the way vLLM does
(pure-decode batches of <= 8 rows "replay a graph", reported GRAPH); it is the base of the graph-mode bugs and is
itself checked to pass.
"""

from __future__ import annotations

import time
from collections.abc import Sequence

import torch

from deltaserve_core.hooks import RESERVED_ADAPTER_NAME
from deltaserve_core.testing.reference_host import ReferenceHost, _Row
from deltaserve_core.types import ExecutionMode, FineTuneSample, HostCapabilities, ProposedBatch, StepRecord

__all__ = ["Patchable", "GraphCapable", "RESERVED_ADAPTER_NAME"]


class Patchable(ReferenceHost):
    name = "blind-patchable"

    # ---------------------------------------------------------------- scheduling pieces
    def _view_batch(self, prefills, decodes, left, deferred, step_id, now) -> ProposedBatch:
        batch = ProposedBatch(
            step_id=step_id, now=now,
            scheduled=tuple([s.view(True) for s in prefills] + [s.view(False) for s in decodes]),
            waiting=tuple([s.view(True) for s in left] + [s.view(False) for s in deferred]),
        )
        return ProposedBatch(batch.step_id, batch.now, batch.scheduled, batch.waiting, self.graph_mode(batch))

    def _ask(self, batch: ProposedBatch, allow_idle: bool) -> tuple[FineTuneSample, ...]:
        if self._interceptor is not None and (batch.scheduled or allow_idle or not self.has_unfinished()):
            return tuple(self._interceptor.on_schedule(batch))
        return ()

    def _check_samples(self, samples, decodes) -> None:
        if samples and RESERVED_ADAPTER_NAME not in self._adapters:
            raise RuntimeError("fine-tuning samples were injected before set_finetune_adapter()")
        ft_tokens = sum(s.num_tokens for s in samples)
        if ft_tokens > self._capabilities.max_finetune_tokens_per_step:
            raise RuntimeError(f"interceptor injected {ft_tokens} fine-tuning tokens, over max")
        if samples and decodes and not self.mixed:
            raise RuntimeError("fine-tuning rows were injected into a decode step of a non-mixed host")

    def _build_rows(self, prefills, decodes, samples):
        rows: list[_Row] = []
        ids: list[int] = []
        for s in prefills:
            rows.append(_Row(len(ids), len(s.request.prompt_ids), s.request.adapter, seq=s))
            ids.extend(s.request.prompt_ids)
        for s in decodes:
            rows.append(_Row(len(ids), 1, s.request.adapter, seq=s, past=s.context))
            ids.append(s.output[-1])
        for sample in samples:
            rows.append(_Row(len(ids), sample.num_tokens, RESERVED_ADAPTER_NAME, sample=sample))
            ids.extend(sample.input_ids)
        return rows, ids

    def _finish_outputs(self):
        from deltaserve_core.driver import ClientOutput

        outputs = []
        for s in [s for s in self._running if self._is_done(s)]:
            self._running.remove(s)
            outputs.append(ClientOutput(s.request.request_id, tuple(s.output), s.arrival_time, s.token_times[0],
                                        s.token_times[-1], tuple(s.token_times)))
        return outputs

    def _step(self, allow_idle: bool, report_executed: bool = False):  # noqa: ANN202
        prefills, decodes, left = self._schedule()
        deferred = [s for s in self._running if s not in decodes]
        step_id = next(self._step_ids)
        now = time.monotonic()
        batch = self._view_batch(prefills, decodes, left, deferred, step_id, now)
        samples = self._ask(batch, allow_idle)
        self._check_samples(samples, decodes)
        samples = self._before_rows(samples, prefills, decodes)
        if not prefills and not decodes and not samples:
            return False if report_executed else []
        rows, ids = self._build_rows(prefills, decodes, samples)
        self._running.extend(prefills)
        self._execute(step_id, rows, torch.tensor(ids, dtype=torch.long))
        outputs = self._finish_outputs()
        if report_executed:
            return True
        return outputs

    def _before_rows(self, samples, prefills, decodes):
        return samples

    # ---------------------------------------------------------------- forward pieces
    def _positions(self, rows) -> torch.Tensor:
        return torch.cat([torch.arange(r.past, r.past + r.length) for r in rows])

    def _should_check_abort(self, li: int, ft_only: bool, mixed_ft: bool) -> bool:
        return ft_only

    def _emit_layer_inputs(self, sink, step_id: int, li: int, ft_rows, hidden, rows) -> None:
        for r in ft_rows:
            sink.layer_input(step_id, li, r.sample.sample_id, hidden[r.start:r.start + r.length])

    def _after_forward_captures(self, sink, step_id: int) -> None:
        pass

    def _on_abort_continue(self) -> bool:
        """Whether the forward keeps running after an abort (it must not)."""
        return False

    def _record_mode(self, rows, ft_rows) -> ExecutionMode:
        return ExecutionMode.EAGER

    def _fires_hooks(self, rows, ft_rows) -> bool:
        return True

    def _make_record(self, step_id, start, duration, rows, ft_rows, aborted, synthetic) -> StepRecord:
        ft_ids = tuple(r.sample.sample_id for r in ft_rows)
        return StepRecord(
            step_id=step_id, start_time=start, duration_s=duration, mode=self._record_mode(rows, ft_rows),
            prefill_lengths=tuple(r.length for r in rows if r.sample is None and r.past == 0 and r.fake_kv is None),
            num_decode=sum(1 for r in rows if r.sample is None and (r.past > 0 or r.fake_kv is not None)),
            kv_tokens=sum(r.past for r in rows if r.sample is None and (r.past > 0 or r.fake_kv is not None)),
            finetune_sample_ids=() if aborted else ft_ids,
            finetune_lengths=() if aborted else tuple(r.length for r in ft_rows),
            aborted_sample_ids=ft_ids if aborted else (), synthetic=synthetic,
        )

    def _end_step(self, sink, step_id, ft_ids, aborted) -> None:
        sink.end_step(step_id, () if aborted else ft_ids, ft_ids if aborted else ())

    def _deliver(self, record: StepRecord) -> None:
        if self._step_sink is not None:
            self._step_sink(record)

    def _timed_forward_start(self) -> None:
        pass

    def _execute(self, step_id: int, rows, tokens: torch.Tensor, synthetic: bool = False) -> StepRecord:
        sink = self._activation_sink
        ft_rows = [r for r in rows if r.sample is not None]
        ft_only = bool(ft_rows) and len(ft_rows) == len(rows)
        capture = sink is not None and bool(ft_rows) and not synthetic and self._fires_hooks(rows, ft_rows)
        aborted = False
        self._launch_end = None
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
        start = time.monotonic()
        with torch.inference_mode():
            if capture:
                sink.begin_step(step_id, [r.sample for r in ft_rows])
            tokens = tokens.to(self.device)
            positions = self._positions(rows).to(self.device)
            groups: dict[str, list[int]] = {}
            for r in rows:
                if r.adapter is not None:
                    groups.setdefault(r.adapter, []).extend(range(r.start, r.start + r.length))
            index = {a: torch.tensor(v, device=self.device) for a, v in groups.items()}
            hidden = self._inner.embed_tokens(tokens)
            cos, sin = self._inner.rotary_emb(hidden.unsqueeze(0), positions.unsqueeze(0))
            self._timed_forward_start()
            for li, layer in enumerate(self._layers):
                if (not aborted and sink is not None and not synthetic and ft_rows
                        and self._should_check_abort(li, ft_only, not ft_only)
                        and sink.should_abort(step_id)):
                    aborted = True
                    if not self._on_abort_continue():
                        break
                if capture and not aborted:
                    self._emit_layer_inputs(sink, step_id, li, ft_rows, hidden, rows)
                elif synthetic and ft_rows:
                    for r in ft_rows:
                        hidden[r.start:r.start + r.length].clone()
                hidden = self._layer(li, layer, hidden, rows, cos, sin, index)
            if capture:
                self._after_forward_captures(sink, step_id)
            if not aborted or self._on_abort_continue():
                self._sample(rows, hidden)
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
        end = time.monotonic() if self._launch_end is None else self._launch_end
        duration = end - start
        ft_ids = tuple(r.sample.sample_id for r in ft_rows)
        if capture:
            self._end_step(sink, step_id, ft_ids, aborted)
        record = self._make_record(step_id, start, duration, rows, ft_rows, aborted, synthetic)
        self._after_record(record, rows, ft_rows, aborted)
        self._deliver(record)
        return record

    def _after_record(self, record, rows, ft_rows, aborted) -> None:
        pass


class GraphCapable(Patchable):
    """Correct host that models CUDA-graph replays for small pure-decode batches (capture sizes 1..8)."""

    name = "blind-graph"
    CAPTURE_MAX = 8

    def __init__(self, config) -> None:
        super().__init__(config)
        import dataclasses

        self._capabilities = dataclasses.replace(
            self._capabilities, graph_modes=frozenset({ExecutionMode.EAGER, ExecutionMode.GRAPH}))

    def _natural_mode(self, num_prefill_tokens: int, num_decode: int) -> ExecutionMode:
        if num_prefill_tokens == 0 and 0 < num_decode <= self.CAPTURE_MAX:
            return ExecutionMode.GRAPH
        return ExecutionMode.EAGER

    def graph_mode(self, batch: ProposedBatch) -> ExecutionMode:
        return self._natural_mode(sum(batch.prefill_lengths), batch.num_decode)

    def _record_mode(self, rows, ft_rows) -> ExecutionMode:
        if ft_rows:
            return ExecutionMode.EAGER  # steps with fine-tuning rows are forced eager
        inf = [r for r in rows if r.sample is None]
        pre = sum(r.length for r in inf if r.past == 0 and r.fake_kv is None)
        dec = sum(1 for r in inf if r.past > 0 or r.fake_kv is not None)
        return self._natural_mode(pre, dec)
