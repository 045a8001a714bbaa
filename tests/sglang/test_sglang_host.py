"""The SGLang host: the conformance suite against SGLang's real CPU engine, plus behaviour the suite does not pin.

One engine (an in-process SGLang scheduler) serves the whole module. Skipped where SGLang is not installed;
``scripts/test_sglang.sh`` builds the environment and sets DELTASERVE_REQUIRE_ENGINES, so there a missing SGLang
fails (tests/sglang/conftest.py).
"""

from __future__ import annotations

import importlib.util
import os
from collections.abc import Iterator

import pytest
from deltaserve_conformance import ConformanceEnv, HostConformanceTests, Recorder
from deltaserve_conformance.harness import make_prompts, make_samples
from step_log import graph_step_log

from deltaserve_core.types import FineTuneSample, ProfileShape, ProposedBatch

HAVE_SGLANG = importlib.util.find_spec("sglang") is not None
#: CPU fp32 by default (CI); on a GPU machine DELTASERVE_SGLANG_DEVICE=cuda runs the module against CUDA SGLang
#: (benchmarks/gpu/sglang_h200.sh), bf16 unless DELTASERVE_SGLANG_DTYPE says otherwise.
DEVICE = os.environ.get("DELTASERVE_SGLANG_DEVICE", "cpu")
DTYPE = os.environ.get("DELTASERVE_SGLANG_DTYPE", "float32" if DEVICE == "cpu" else "bfloat16")
#: host options, "key=value,key=value" (e.g. cuda_graph_backend_prefill=disabled on a GPU)
OPTIONS = dict(kv.split("=", 1) for kv in os.environ.get("DELTASERVE_SGLANG_OPTIONS", "").split(",") if "=" in kv)
needs_sglang = pytest.mark.skipif(not HAVE_SGLANG, reason="SGLang is not installed (bash scripts/setup_sglang.sh)")


@pytest.fixture(scope="module")
def deltaserve_conformance_env(cache_dir) -> Iterator[ConformanceEnv]:
    if not HAVE_SGLANG:
        pytest.skip("SGLang is not installed")
    from deltaserve_conformance.plugin import build_env

    env = build_env("deltaserve_sglang.host:SglangHost", cache_dir=cache_dir / "conformance", device=DEVICE,
                    dtype=DTYPE, options=OPTIONS)
    yield env
    env.host.shutdown()  # type: ignore[attr-defined]


@needs_sglang
def test_finetune_rows_are_never_stored_in_the_radix_cache(deltaserve_conformance_env: ConformanceEnv) -> None:
    """A fine-tuning row's KV is freed when it finishes, not inserted into the radix cache (skip_radix_cache_insert):
    a fine-tuning-only step leaves the cache's size as it was, while a client request of the same length grows it."""
    from deltaserve_core.driver import ClientRequest

    # Defined before the suite's class so it runs on a fresh engine: after the suite's long prompts the cache is at
    # capacity, where a client's insert evicts as much as it adds and the size cannot show it.
    env = deltaserve_conformance_env
    cache = env.host._sched.tree_cache  # type: ignore[attr-defined]
    sample = make_samples(env, 1, lengths=[33], seed=43, first_id=720)[0]
    before = cache.total_size()
    inject, _ = _inject_once([sample], empty=True)
    rec = Recorder(inject=inject)
    env.install(rec)
    assert env.host.run_idle_step()  # type: ignore[attr-defined]
    env.install(None)
    assert rec.records[-1].finetune_lengths == (33,)
    assert cache.total_size() == before, "the fine-tuning row's KV was stored in the radix cache"
    env.run([ClientRequest("cached-client", make_prompts(env, 1, seed=44)[0].prompt_ids, 2)])
    assert cache.total_size() > before, "a client request's KV should be cached (the measure is blind otherwise)"


@needs_sglang
class TestSglangConformance(HostConformanceTests):
    """Every conformance check, against SGLang's CPU engine."""


def _inject_once(samples: list[FineTuneSample], *, empty: bool = False):
    fired: list[int] = []

    def inject(batch: ProposedBatch):
        if not fired and (batch.is_empty if empty else batch.has_prefill):
            fired.append(batch.step_id)
            return samples
        return ()

    return inject, fired


@needs_sglang
def test_serving_continues_after_an_aborted_step(deltaserve_conformance_env: ConformanceEnv) -> None:
    """An aborted fine-tuning-only step (the forward stopped at a layer boundary, zero logits handed to SGLang's
    sampler) leaves SGLang consistent: its rows are finished and their request slots freed by SGLang's own result
    processing, none is left queued or running, and later outputs equal the no-abort baseline."""
    from deltaserve_sglang.binding import FINETUNE_RID_PREFIX

    env = deltaserve_conformance_env
    sched = env.host._sched  # type: ignore[attr-defined]
    requests = make_prompts(env, 3, seed=31)
    baseline = env.run(requests)
    slots = sched.req_to_token_pool.available_size()
    inject, fired = _inject_once(make_samples(env, 2, lengths=[8, 11], seed=31, first_id=600), empty=True)
    rec = Recorder(inject=inject, abort_after_layer=1)
    env.install(rec)
    assert env.host.run_idle_step()  # type: ignore[attr-defined]
    env.install(None)
    assert fired and rec.records[-1].aborted_sample_ids == (600, 601) and not rec.records[-1].finetune_sample_ids
    assert not [c for c in rec.captures if c[1] >= 1], "layers after the abort boundary ran"
    queued = [r.rid for r in list(sched.waiting_queue) + list(sched.running_batch.reqs)]
    assert not [rid for rid in queued if str(rid).startswith(FINETUNE_RID_PREFIX)], queued
    assert sched.req_to_token_pool.available_size() == slots, "an aborted row kept its request slot"
    assert [o.token_ids for o in env.run(requests)] == [o.token_ids for o in baseline]


@needs_sglang
def test_hooks_are_live_and_a_missing_hook_is_refused(deltaserve_conformance_env: ConformanceEnv,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    """SGLang logs a hook that failed to apply and carries on; the adapter checks and refuses instead."""
    from sglang.srt.managers.scheduler import Scheduler

    from deltaserve_sglang import plugin

    plugin.verify_hooks()  # the live engine's hooks
    unwrapped = Scheduler.__dict__["run_batch"].__wrapped__
    monkeypatch.setattr(Scheduler, "run_batch", unwrapped)
    with pytest.raises(plugin.HooksNotLiveError, match="Scheduler.run_batch"):
        plugin.verify_hooks()


@needs_sglang
def test_same_sample_twice_is_recomputed_not_read_from_the_radix_cache(
        deltaserve_conformance_env: ConformanceEnv) -> None:
    """A fine-tuning row never reads the radix cache: a repeated sample runs (and is captured) in full."""
    env = deltaserve_conformance_env
    long = make_samples(env, 1, lengths=[40], seed=41, first_id=700)[0]
    again = FineTuneSample(701, long.input_ids, long.loss_mask)
    for sample in (long, again):
        inject, _ = _inject_once([sample], empty=True)
        rec = Recorder(inject=inject)
        env.install(rec)
        assert env.host.run_idle_step()  # type: ignore[attr-defined]
        assert rec.records[-1].finetune_lengths == (40,)
        assert all(t.shape[0] == 40 for _, _, _, t in rec.captures)
    env.install(None)


@needs_sglang
def test_a_client_prompt_equal_to_a_sample_is_not_served_from_its_kv(deltaserve_conformance_env: ConformanceEnv) -> None:
    """KV left by a fine-tuning row (reserved adapter, own radix namespace) never serves a client request."""
    from deltaserve_core.driver import ClientRequest

    env = deltaserve_conformance_env
    sample = make_samples(env, 1, lengths=[24], seed=42, first_id=710)[0]
    request = ClientRequest("same-prompt", sample.input_ids, 4)
    baseline = env.run([request])
    inject, _ = _inject_once([sample], empty=True)
    env.install(Recorder(inject=inject))
    assert env.host.run_idle_step()  # type: ignore[attr-defined]
    env.install(None)
    sched = env.host._sched  # type: ignore[attr-defined]
    outputs = env.run([ClientRequest("same-prompt-2", sample.input_ids, 4)])
    assert outputs[0].token_ids == baseline[0].token_ids
    assert sched is env.host._sched  # type: ignore[attr-defined]


@needs_sglang
def test_idle_step_without_samples_runs_nothing(deltaserve_conformance_env: ConformanceEnv) -> None:
    env = deltaserve_conformance_env
    rec = Recorder()
    env.install(rec)
    assert env.host.run_idle_step() is False  # type: ignore[attr-defined]
    env.install(None)
    assert len(rec.batches) == 1 and rec.batches[0].is_empty
    assert rec.records == []


@needs_sglang
def test_a_profile_step_of_decodes_whose_contexts_take_two_prefill_steps(
        deltaserve_conformance_env: ConformanceEnv) -> None:
    """Three decodes of 800 tokens of context need two prefill steps under the 2048-token budget: with the mixed
    chunk the first-prefilled rows decode meanwhile, and with only two tokens to generate they used to finish before
    the profiled step (calibration of an 8B shape on an H100 stopped so: two decodes of 4064 under 4096)."""
    env = deltaserve_conformance_env
    record = env.host.run_profile_step(ProfileShape(num_decode=3, decode_context=800))  # type: ignore[attr-defined]
    assert record.num_decode == 3 and not record.prefill_lengths
    assert record.kv_tokens >= 3 * 800


@pytest.mark.parametrize("version", ["0.5.24", "0.5.14", "0.6.0", "0.5.9"])
def test_unsupported_sglang_version_is_refused_at_startup(monkeypatch: pytest.MonkeyPatch, version: str) -> None:
    from deltaserve_sglang import versions

    monkeypatch.setattr(versions.md, "version", lambda dist: version)
    with pytest.raises(versions.UnsupportedSglangError,
                       match=rf"sglang=={version} is not supported.*sglang>=0.5.15,<=0.5.23.*0.5.15 on CUDA"):
        versions.check_supported_sglang()


@pytest.mark.parametrize("version", ["0.5.15", "0.5.15.post1", "0.5.19", "0.5.23", "0.5.23+cpu"])
def test_versions_of_the_range_pass_the_version_check(monkeypatch: pytest.MonkeyPatch, version: str) -> None:
    from deltaserve_sglang import versions

    monkeypatch.setattr(versions.md, "version", lambda dist: version)
    assert versions.check_supported_sglang() == version


@needs_sglang
def test_hooked_internals_of_another_shape_are_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    """A release inside the range whose hooked internals match neither tested end is refused, naming the symbol;
    the installed one (0.5.23 in CI, 0.5.15 on the GPU machine) matches its own end."""
    from deltaserve_sglang import versions

    assert versions.check_hook_shapes() is versions.is_legacy()
    target = "sglang.srt.managers.scheduler.Scheduler.run_batch"
    original = dict(versions.SHAPES)
    shapes = dict(original)
    shapes[target] = (("self", "batch", "moved"),) * 2
    monkeypatch.setattr(versions, "SHAPES", shapes)
    with pytest.raises(versions.UnsupportedSglangError, match=r"Scheduler.run_batch.*expected"):
        versions.check_hook_shapes()
    # one symbol with the other end's shape beside this end's others: a mix of both ends, refused too
    target = "sglang.srt.managers.scheduler.Scheduler.get_next_batch_to_run"
    shapes = dict(original)
    shapes[target] = original[target][::-1]
    monkeypatch.setattr(versions, "SHAPES", shapes)
    with pytest.raises(versions.UnsupportedSglangError, match="mix"):
        versions.check_hook_shapes()


def test_graph_guard_answers_no_only_for_steps_with_finetune_rows() -> None:
    """CUDA: the graph runners' can_run_graph is SGLang's own answer unless the step carries fine-tuning rows, which
    then run eagerly (capture hooks do not fire in a replayed graph). No GPU needed: the runners are stand-ins."""
    from deltaserve_sglang.binding import Binding, StepPlan
    from deltaserve_sglang.plugin import install_graph_guard

    class Runner:
        def __init__(self) -> None:
            self.asked = 0

        def can_run_graph(self, forward_batch) -> bool:
            self.asked += 1
            return True

    class EagerRunner:
        def can_run_graph(self, forward_batch) -> bool:
            return False

    class ModelRunner:
        decode_cuda_graph_runner = Runner()
        prefill_cuda_graph_runner = EagerRunner()

    mr, b = ModelRunner(), Binding()
    assert install_graph_guard(mr, b) == ["decode_cuda_graph_runner"]
    assert install_graph_guard(mr, b) == []  # idempotent
    graph = mr.decode_cuda_graph_runner
    assert graph.can_run_graph(None) is True  # no step planned: SGLang's answer
    b.plan = StepPlan(step_id=1)
    assert graph.can_run_graph(None) is True  # a step without rows: SGLang's answer
    b.plan = StepPlan(step_id=2, samples={"__deltaserve_ft__x": make_samples_stub()})
    assert graph.can_run_graph(None) is False and graph.asked == 2


def make_samples_stub():
    from deltaserve_core.types import FineTuneSample

    return FineTuneSample(sample_id=1, input_ids=(1, 2, 3), loss_mask=(False, True, True))


def test_legacy_layer_capture_reads_hidden_plus_residual() -> None:
    """SGLang 0.5.15's decoder layers take (positions, hidden_states, forward_batch, residual): the captured input
    is hidden_states + residual (hidden_states alone at the first layer), taken before the layer runs."""
    import torch

    from deltaserve_sglang.binding import Binding, StepPlan
    from deltaserve_sglang.plugin import install_layer_capture

    class Layer(torch.nn.Module):
        def forward(self, positions, hidden_states, forward_batch, residual):
            if residual is None:
                residual = hidden_states.clone()
            else:
                residual.add_(hidden_states)  # in place, as SGLang's fused add-RMSNorm
            return hidden_states * 2, residual

    class Inner(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.layers = torch.nn.ModuleList([Layer(), Layer()])

    class Model(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.model = Inner()

        def forward(self, input_ids, positions, forward_batch):
            h, r = input_ids, None
            for layer in self.model.layers:
                h, r = layer(positions, h, forward_batch, r)
            return h

    got: list[tuple[int, torch.Tensor]] = []
    b = Binding()
    b.capture = lambda layer, hidden: got.append((layer, hidden.clone()))  # type: ignore[method-assign]
    model = Model()
    assert install_layer_capture(model, b) == 2
    x = torch.arange(6.0).reshape(3, 2)
    b.plan, b._rows = StepPlan(step_id=0), [(1, 0, 3)]
    model(x, None, None)
    assert [layer for layer, _ in got] == [0, 1]
    assert torch.equal(got[0][1], x) and torch.equal(got[1][1], x * 2 + x)


def test_missing_sglang_names_the_install_command(monkeypatch: pytest.MonkeyPatch) -> None:
    import importlib.metadata as md

    from deltaserve_sglang import versions

    def missing(dist: str) -> str:
        raise md.PackageNotFoundError(dist)

    monkeypatch.setattr(versions.md, "version", missing)
    with pytest.raises(versions.UnsupportedSglangError, match="setup_sglang.sh"):
        versions.check_supported_sglang()


def test_spec_and_plugin_import_no_sglang() -> None:
    import subprocess
    import sys

    code = ("import sys; from deltaserve_sglang.spec import SPEC; import deltaserve_sglang.plugin; "
            "assert SPEC.name == 'sglang'; assert 'sglang' not in sys.modules, 'SGLang imported'")
    subprocess.run([sys.executable, "-c", code], check=True)


def test_shims_are_never_imported_by_the_product() -> None:
    from pathlib import Path

    root = Path(__file__).resolve().parents[2] / "src" / "deltaserve_sglang"
    for path in root.glob("*.py"):
        text = path.read_text()
        for shim in ("sgl_kernel", "deltaserve_pin_memory_shim", "torchvision"):
            assert f"import {shim}" not in text and f"from {shim}" not in text, f"{path.name} imports {shim}"


def _check_captures(env: ConformanceEnv, rec: Recorder, samples: list[FineTuneSample]) -> None:
    from deltaserve_conformance.checks import _reference_layer_inputs

    for s in samples:
        ref = _reference_layer_inputs(env, s.input_ids)
        got = {layer: t for _, layer, sid, t in rec.captures if sid == s.sample_id}
        assert sorted(got) == list(range(len(ref))), f"sample {s.sample_id}: layers captured {sorted(got)}"
        for layer, t in got.items():
            err = (t - ref[layer]).abs().max().item()
            assert err <= env.tolerance * (1.0 + ref[layer].abs().max().item()), (s.sample_id, layer, err)


@needs_sglang
@pytest.mark.parametrize("kind", ["decode", "mixed"])
def test_rows_join_decode_and_mixed_steps_with_exact_captures(deltaserve_conformance_env: ConformanceEnv,
                                                             kind: str) -> None:
    """Rows offered for a pure decode step (SGLang's mix_with_running path) or for a step SGLang itself mixed
    (prefill + decodes, --enable-mixed-chunk) run in that step, with layer inputs equal to a PEFT forward, and
    leave the client outputs unchanged."""
    env = deltaserve_conformance_env
    assert env.host.capabilities().mixed_batches  # type: ignore[attr-defined]
    samples = make_samples(env, 2, lengths=[6, 11], seed=50 + len(kind), first_id=800 + 10 * len(kind))
    fired: list[int] = []

    def inject(batch: ProposedBatch):
        want = (batch.num_decode > 0 and not batch.has_prefill) if kind == "decode" else (
            batch.num_decode > 0 and batch.has_prefill)
        if not fired and want:
            fired.append(batch.step_id)
            return samples
        return ()

    from deltaserve_core.driver import ClientRequest

    first = make_prompts(env, 2, seed=60, max_tokens=6)
    late = [ClientRequest("late-0", make_prompts(env, 1, seed=61)[0].prompt_ids, 3)]
    baseline = _run_with_late_arrival(env, first, late)
    rec = Recorder(inject=inject)
    env.install(rec)
    outputs = _run_with_late_arrival(env, first, late)
    env.install(None)
    assert fired, f"no {kind} step was offered"
    record = rec.record_for(fired[0])
    assert sorted(record.finetune_sample_ids) == [s.sample_id for s in samples] and not record.aborted_sample_ids
    assert (record.num_decode > 0, bool(record.prefill_lengths)) == (True, kind == "mixed")
    assert [o.token_ids for o in outputs] == [o.token_ids for o in baseline]
    _check_captures(env, rec, samples)


def _run_with_late_arrival(env: ConformanceEnv, first, late):
    """Serve ``first``; submit ``late`` once they decode, so a later step mixes its prefill with their decodes."""
    host = env.host
    for r in first:
        host.submit(r)  # type: ignore[attr-defined]
    outputs, steps = [], 0
    while host.has_unfinished() or steps == 0:  # type: ignore[attr-defined]
        outputs += host.step()  # type: ignore[attr-defined]
        steps += 1
        if steps == 3:
            for r in late:
                host.submit(r)  # type: ignore[attr-defined]
    return sorted(outputs, key=lambda o: o.request_id)


@needs_sglang
def test_every_offered_sample_runs_in_its_step_or_is_reported_aborted(deltaserve_conformance_env: ConformanceEnv) -> None:
    """Samples offered for every step, more than one step can take: each one is accounted for in the record of
    the very step it was offered for (ran or aborted), never dropped, never run later."""
    env = deltaserve_conformance_env
    offered: dict[int, list[int]] = {}
    counter = iter(range(900, 90_000))

    def inject(batch: ProposedBatch):
        # Alternating small and over-budget offers: the over-budget ones must come back aborted.
        n = 2 if batch.step_id % 2 else 1
        length = 12 if batch.step_id % 3 else env.host.capabilities().max_finetune_tokens_per_step  # type: ignore
        samples = make_samples(env, n, lengths=[length] * n, seed=next(counter), first_id=next(counter) * 10)
        offered[batch.step_id] = [s.sample_id for s in samples]
        return samples

    rec = Recorder(inject=inject)
    env.install(rec)
    env.run(make_prompts(env, 4, seed=70, max_tokens=5))
    env.install(None)
    by_step = {r.step_id: r for r in rec.real_records()}
    aborted = 0
    for step_id, ids in offered.items():
        r = by_step.get(step_id)
        assert r is not None, f"step {step_id} was offered samples {ids} but reported nothing"
        assert sorted(r.finetune_sample_ids + r.aborted_sample_ids) == sorted(ids), (step_id, r)
        aborted += len(r.aborted_sample_ids)
    assert aborted, "no offer exceeded the budget: the check did not exercise refusal"
    ran = [i for r in by_step.values() for i in r.finetune_sample_ids]
    assert len(ran) == len(set(ran))


@needs_sglang
def test_retract_unloads_the_version_once_no_request_runs_on_it(deltaserve_conformance_env: ConformanceEnv) -> None:
    """retract_adapter withdraws the name at once and unloads SGLang's adapter (its memory-pool slot and weights) and
    its folder once the last request on it finished: that request keeps its tokens; the other version stays loaded.
    Before, the host had no retract_adapter and every published version stayed loaded for the server's life."""
    import dataclasses

    from deltaserve_conformance.harness import handed_copy

    from deltaserve_core.adapter_state import LoraAdapterState

    env = deltaserve_conformance_env
    host = env.host
    manager = host._sched.tp_worker.model_runner.lora_manager  # type: ignore[attr-defined]
    source = LoraAdapterState.load_pretrained(env.client_adapter_dir, name="sglang-retract", version=1)
    old = host.publish_adapter(handed_copy(source))  # type: ignore[attr-defined]
    new = host.publish_adapter(handed_copy(source.with_tensors(  # type: ignore[attr-defined]
        {k: -v for k, v in source.tensors.items()}, version=2)))
    old_id, new_id = host._adapters[old], host._adapters[new]  # type: ignore[attr-defined]
    request = dataclasses.replace(make_prompts(env, 1, seed=71, max_tokens=6, prefix="retract")[0], adapter=old)
    baseline = env.run([request])[0]
    running = dataclasses.replace(request, request_id="retract-running")
    host.submit(running)  # type: ignore[attr-defined]
    outputs = list(host.step()) + list(host.step())  # type: ignore[attr-defined]
    host.retract_adapter(old)  # type: ignore[attr-defined]
    with pytest.raises(ValueError, match="unknown adapter"):
        host.submit(dataclasses.replace(request, request_id="retract-refused"))  # type: ignore[attr-defined]
    assert old_id in manager.loras, "unloaded under a running request"
    outputs += env.run_stepwise([])
    assert [o.token_ids for o in outputs] == [baseline.token_ids]
    assert old_id not in manager.loras and new_id in manager.loras
    assert not host._published_path(old).exists() and host._published_path(new).exists()  # type: ignore[attr-defined]


# ------------------------------------------------------------------------------------ CUDA only

on_cuda = pytest.mark.skipif(not DEVICE.startswith("cuda"),
                             reason="needs a CUDA GPU: benchmarks/gpu/sglang_h200.sh (DELTASERVE_SGLANG_DEVICE=cuda)")


def test_graph_modes_are_declared_for_the_device(deltaserve_conformance_env: ConformanceEnv) -> None:
    from deltaserve_core.types import ExecutionMode

    caps = deltaserve_conformance_env.host.capabilities()  # type: ignore[attr-defined]
    if DEVICE == "cpu":
        assert caps.graph_modes == frozenset({ExecutionMode.EAGER})
    else:
        assert caps.graph_modes == frozenset({ExecutionMode.EAGER, ExecutionMode.GRAPH})


@on_cuda
@needs_sglang
def test_cuda_inference_steps_replay_graphs_and_finetune_steps_run_eagerly(
        deltaserve_conformance_env: ConformanceEnv) -> None:
    """SGLang's defaults on CUDA: inference-only steps replay its CUDA graphs (decode; prefill under its breakable
    backend where the step fits), steps with fine-tuning rows run eagerly with every row captured, and each
    record's mode is what SGLang did and what graph_mode() predicted. Writes the per-step log to
    $DELTASERVE_STEP_LOG."""
    rows, mixed = graph_step_log(deltaserve_conformance_env)
    graph = [r for r in rows if r["mode"] == "graph"]
    assert any(r["num_decode"] and not r["prefill_lengths"] for r in graph), "no decode step replayed a CUDA graph"
    assert not any(r["finetune_lengths"] for r in graph), "a fine-tuning row ran inside a replayed graph"
    assert all(r["mode"] == r["predicted"] == r["proposed"] for r in rows if not r["finetune_lengths"]), \
        "graph_mode() or the proposed batch's mode disagrees with what SGLang ran"
    ft = [r for r in rows if r["finetune_lengths"]]
    assert ft and all(r["mode"] == "eager" for r in ft)
    assert any(r["num_decode"] for r in ft), "no fine-tuning row joined a decode step (would have been a graph)"
    captured = {s for s, _, _, _ in mixed.captures}
    assert captured == {r.step_id for r in mixed.real_records() if r.finetune_sample_ids}
