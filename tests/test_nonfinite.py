"""Non-finite training never lands: a NaN/inf loss, gradient or updated weight skips the step with the adapter and
the optimizer state untouched; the controller counts it and pauses after repeats; nothing non-finite is
checkpointed or published."""

from __future__ import annotations

import os
import tempfile

os.environ.setdefault("OMP_NUM_THREADS", "1")

from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from deltaserve_core.activation_buffer import CapturedSample
from deltaserve_core.adapter_state import LoraAdapterState, NonFiniteAdapterError, all_finite
from deltaserve_core.checkpoint import list_checkpoints, save_checkpoint
from deltaserve_core.lora_backward import LoraBackward, TrainerConfig


def _trainer(tiny_llama: tuple[str, str], **cfg: object) -> LoraBackward:
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(tiny_llama[0], dtype=torch.float32)
    config = TrainerConfig(**cfg)  # type: ignore[arg-type]
    return LoraBackward(model, LoraAdapterState.load_pretrained(tiny_llama[1]), config)


def _samples(trainer: LoraBackward, n: int = 2, length: int = 12, seed: int = 0) -> list[CapturedSample]:
    g = torch.Generator().manual_seed(seed)
    hidden = trainer.model.config.hidden_size
    vocab = trainer.model.config.vocab_size
    out = []
    for i in range(n):
        mask = torch.tensor([False] * (length // 2) + [True] * (length - length // 2))
        out.append(CapturedSample(i, torch.randint(0, vocab, (length,), generator=g), mask,
                                  torch.randn(trainer.num_layers, length, hidden, generator=g)))
    return out


def _state(trainer: LoraBackward) -> tuple[dict[str, torch.Tensor], list[dict[str, torch.Tensor]]]:
    weights = {k: p.detach().clone() for k, p in trainer.params.items()}
    moments = [{k: v.clone() for k, v in st.items()} for st in trainer.optimizer.state.values()]
    return weights, moments


def _assert_same(a: tuple[dict, list], b: tuple[dict, list]) -> None:
    assert a[0].keys() == b[0].keys()
    assert all(torch.equal(a[0][k], b[0][k]) for k in a[0]), "adapter weights changed"
    assert len(a[1]) == len(b[1]), "optimizer state gained or lost entries"
    for x, y in zip(a[1], b[1]):
        assert x.keys() == y.keys() and all(torch.equal(x[k], y[k]) for k in x), "optimizer moments changed"


def test_all_finite() -> None:
    assert all_finite([torch.ones(3), None, torch.zeros(2, 2)])
    assert not all_finite([torch.ones(3), torch.tensor([1.0, float("nan")])])
    assert not all_finite([torch.tensor([float("-inf")])])
    assert all_finite([])


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device (runs on the H200: benchmarks/gpu/vllm_h200.sh step 0)")
def test_all_finite_across_devices() -> None:
    # Adam on CUDA parameters keeps state["step"] on the CPU: a checkpoint's optimizer state spans two devices.
    cuda, cpu = torch.ones(3, device="cuda"), torch.tensor(4.0)
    assert all_finite([cuda, cpu])
    assert not all_finite([cuda, torch.tensor(float("nan"))])
    assert not all_finite([torch.tensor([float("inf")], device="cuda"), cpu])


def test_nan_activations_skip_the_step_and_leave_adapter_and_optimizer(tiny_llama: tuple[str, str]) -> None:
    trainer = _trainer(tiny_llama)
    good = _samples(trainer)
    first = trainer.train_step(good)
    assert first.nonfinite == "" and trainer.step == 1
    before = _state(trainer)
    bad = _samples(trainer, seed=1)
    bad[0].hidden[-1, 3] = float("nan")  # the top layer's input: the loss itself is NaN
    result = trainer.train_step(bad)
    assert result.nonfinite == "loss" and result.step == 1 and trainer.step == 1
    _assert_same(before, _state(trainer))
    assert all(p.grad is None for p in trainer.params.values())
    # training carries on from the untouched state
    assert trainer.train_step(good).nonfinite == "" and trainer.step == 2


def test_nonfinite_gradients_below_a_finite_loss_skip_the_step(tiny_llama: tuple[str, str]) -> None:
    trainer = _trainer(tiny_llama)
    trainer.train_step(_samples(trainer))
    before = _state(trainer)
    bad = _samples(trainer, seed=2)
    bad[1].hidden[0, 5] = float("inf")  # layer 0's saved input: only that layer's LoRA gradients see it
    result = trainer.train_step(bad)
    assert result.loss == result.loss and abs(result.loss) != float("inf")  # the loss is finite
    assert result.nonfinite == "gradients" and trainer.step == 1
    _assert_same(before, _state(trainer))


def test_a_step_that_overflows_the_weights_is_undone(tiny_llama: tuple[str, str]) -> None:
    trainer = _trainer(tiny_llama)
    trainer.train_step(_samples(trainer))
    before = _state(trainer)
    for group in trainer.optimizer.param_groups:
        group["lr"] = 1e39  # finite as a Python float; torch refuses it part-way through the update
    result = trainer.train_step(_samples(trainer, seed=3))
    assert result.nonfinite == "weights" and trainer.step == 1
    _assert_same(before, _state(trainer))
    assert all_finite(trainer.params.values())


def test_a_step_that_writes_inf_into_the_weights_is_undone(tiny_llama: tuple[str, str]) -> None:
    trainer = _trainer(tiny_llama)
    trainer.train_step(_samples(trainer))
    before = _state(trainer)
    real_step = trainer.optimizer.step
    last = list(trainer.params.values())[-1]

    def overflowing_step() -> None:  # what a finite but huge update does to float32 weights
        real_step()
        with torch.no_grad():
            last[0, 0] = float("inf")

    trainer.optimizer.step = overflowing_step  # type: ignore[method-assign]
    result = trainer.train_step(_samples(trainer, seed=4))
    assert result.nonfinite == "weights" and trainer.step == 1
    _assert_same(before, _state(trainer))


def test_the_first_step_overflowing_leaves_no_optimizer_state(tiny_llama: tuple[str, str]) -> None:
    trainer = _trainer(tiny_llama, lr=1e39)
    before = _state(trainer)
    assert trainer.train_step(_samples(trainer)).nonfinite == "weights"
    _assert_same(before, _state(trainer))
    assert not trainer.optimizer.state


def test_trainer_config_refuses_infinite_lr() -> None:
    with pytest.raises(ValueError, match="finite lr"):
        TrainerConfig(lr=float("inf"))
    with pytest.raises(ValueError, match="finite lr"):
        TrainerConfig(lr=float("nan"))


def _adapter(value: float = 0.5) -> LoraAdapterState:
    from deltaserve_core.adapter_state import LoraConfigSpec

    t = {"base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight": torch.full((4, 8), value),
         "base_model.model.model.layers.0.self_attn.q_proj.lora_B.weight": torch.zeros(8, 4)}
    return LoraAdapterState("ft", 1, LoraConfigSpec(r=4, lora_alpha=8.0, target_modules=("q_proj",)), t)


@pytest.mark.parametrize("value", [float("nan"), float("inf")])
def test_checkpoint_refuses_nonfinite_weights(tmp_path: Path, value: float) -> None:
    with pytest.raises(NonFiniteAdapterError, match="lora_A"):
        save_checkpoint(tmp_path, _adapter(value), None, step=3)
    assert list_checkpoints(tmp_path) == [] and not any(tmp_path.iterdir())
    save_checkpoint(tmp_path, _adapter(), None, step=3)  # the same call with finite weights writes
    assert len(list_checkpoints(tmp_path)) == 1


def test_checkpoint_refuses_nonfinite_optimizer_state(tmp_path: Path) -> None:
    opt = {"state": {0: {"step": torch.tensor(1.0), "exp_avg": torch.tensor([float("nan")])}}, "param_groups": []}
    with pytest.raises(NonFiniteAdapterError, match="optimizer state"):
        save_checkpoint(tmp_path, _adapter(), opt, step=1)
    assert list_checkpoints(tmp_path) == []


# ---------------------------------------------------------------------------------------------- the controller


def _controller(pause_after: int = 3):  # noqa: ANN202 - a CoServer with only what these handlers touch
    from deltaserve_core.coserve import CoServer, CoServeStats

    co = object.__new__(CoServer)
    completed: list[int] = []
    co.pool = SimpleNamespace(complete=completed.extend, state_dict=lambda: {}, finished=False)
    co.stats = CoServeStats()
    co.nonfinite_pause_after = pause_after
    co.dp = None  # a single-replica job (data_parallel off)
    co._nonfinite_streak = 0
    co._step_log = []
    co._host_work = {}
    co._host_work_since = {}
    co._step_ids, co._step_tokens = [], 0
    co.job = SimpleNamespace(adapter_name="bot", checkpoint=SimpleNamespace(every_steps=0, keep=3,
                                                                        dir=tempfile.mkdtemp(prefix="nonfinite-")),
                             publish=SimpleNamespace(policy="never", every_steps=0))
    co._init_operator_state()
    co.host = SimpleNamespace(set_finetune_adapter=lambda s: None)
    co.backward = SimpleNamespace(adapter_snapshot=lambda version: _adapter())
    return co, completed


def test_controller_counts_skips_and_pauses_after_three_in_a_row() -> None:
    from deltaserve_core.backward_process import BackwardReport

    co, completed = _controller()
    nonfinite = lambda i: BackwardReport("nonfinite", step=1, sample_ids=(i,), message="loss nan")  # noqa: E731
    co._handle(nonfinite(1))
    co._handle(nonfinite(2))
    co._handle(BackwardReport("step", step=2, sample_ids=(3,), tokens=10, loss=1.0))  # a good step resets the run
    co._handle(nonfinite(4))
    co._handle(nonfinite(5))
    assert co.stats.training_paused is None
    co._handle(nonfinite(6))
    assert co.stats.nonfinite_skipped == 5 and co.stats.optimizer_steps == 1
    assert co.stats.training_paused is not None and "optimizer.lr" in co.stats.training_paused
    assert completed == [1, 2, 3, 4, 5, 6]  # skipped samples are consumed, not retried forever
    d = co.stats.as_dict()
    assert d["nonfinite_skipped"] == 5 and d["training_paused"] == co.stats.training_paused


def test_publish_refuses_a_nonfinite_snapshot() -> None:
    co, _ = _controller()
    published: list[int] = []
    co._published_step = -1
    co.host = SimpleNamespace(publish_adapter=lambda s: published.append(s.version) or f"bot@v{s.version}")
    co.backward = SimpleNamespace(adapter_snapshot=lambda version: _adapter(float("nan")))
    co._publish(4)
    assert published == [] and co.stats.publish_refused == 1 and co.stats.published == []
    co.backward = SimpleNamespace(adapter_snapshot=lambda version: _adapter().with_tensors(_adapter().tensors,
                                                                                            version=version))
    co._publish(4)  # the refusal did not mark step 4 as published
    assert published == [4] and co.stats.published == ["bot@v4"]


def test_recovery_does_not_count_redone_steps_twice() -> None:
    from deltaserve_core.backward_process import BackwardReport

    co, _ = _controller()
    for step in range(1, 6):
        co._handle(BackwardReport("step", step=step, sample_ids=(step,), tokens=100, loss=float(step)))
    assert co.stats.optimizer_steps == 5 and co.stats.trained_tokens == 500
    co._rewind_stats(3)  # a restart resumed from the checkpoint of step 3: steps 4 and 5 will be trained again
    assert co.stats.optimizer_steps == 3 and co.stats.trained_tokens == 300 and co.stats.redone_steps == 2
    assert co.stats.losses == [1.0, 2.0, 3.0] and co.stats.trained_batches == [(1,), (2,), (3,)]
    for step in (4, 5):
        co._handle(BackwardReport("step", step=step, sample_ids=(step,), tokens=100, loss=float(step)))
    assert co.stats.optimizer_steps == 5 and co.stats.trained_tokens == 500


@pytest.mark.faults
def test_spawned_backward_reports_nonfinite_and_keeps_the_shared_adapter(tiny_llama: tuple[str, str],
                                                                         tmp_path: Path) -> None:
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    from deltaserve_core.activation_buffer import ActivationBuffer
    from deltaserve_core.backward_process import BackwardProcess
    from deltaserve_core.testing.capture import capture_forward

    from test_exactness import make_batches  # tests/ is on sys.path

    model_dir, adapter_dir = tiny_llama
    load = lambda: AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)  # noqa: E731
    capture = PeftModel.from_pretrained(load(), adapter_dir)
    batch = make_batches(5, 1, 3, capture.config.vocab_size)[0]
    buffer = ActivationBuffer(3, 64, capacity_tokens=512)
    bp = BackwardProcess(load(), LoraAdapterState.load_pretrained(adapter_dir), buffer,
                         config=TrainerConfig(lr=1e39), checkpoint_dir=tmp_path / "ckpt", torch_threads=1)
    before = {k: v.clone() for k, v in bp.adapter.tensors.items()}
    try:
        bp.start()
        bp.wait_ready(120)
        for s in batch:
            assert buffer.reserve(s) is not None
        done, _ = capture_forward(capture, buffer, 0, batch)
        rep = bp.wait(bp.train_batch(done), 120)
        assert rep.kind == "nonfinite" and rep.step == 0 and "weights" in rep.message, rep.message
        assert all(torch.equal(before[k], v) for k, v in bp.adapter.tensors.items())
        assert buffer.free_tokens == buffer.capacity_tokens  # the skipped batch's samples were consumed
        assert bp.wait(bp.save_checkpoint({}), 60).kind == "checkpoint"  # the unchanged adapter still saves
    finally:
        bp.close()
        buffer.close()
