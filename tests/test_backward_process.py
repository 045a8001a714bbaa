"""The backward process: spawned child, shared adapter, grant preemption, kill -9 / hang detection and restart.

The scenario test is the spawned-process half of the exactness bar (marked ``exactness``) and the crash test
(marked ``faults``): it trains three steps through capture → buffer → spawned backward, checkpoints after step 2,
kills the child with SIGKILL while it is paused mid-step 3, restarts it from the checkpoint and shows step 3 then
lands on exactly the weights of an uninterrupted plain PEFT loop. Two child start-ups cost ~10 s each here
(importing transformers), so everything that needs a child lives in that one test.
"""

from __future__ import annotations

import os

os.environ.setdefault("OMP_NUM_THREADS", "1")

import signal
import time

import pytest
import torch

from deltaserve_core.activation_buffer import ActivationBuffer
from deltaserve_core.adapter_state import LoraAdapterState
from deltaserve_core.backward_process import BackwardProcess, share_model_weights
from deltaserve_core.lora_backward import BackwardCancelled, LoraBackward, TrainerConfig
from deltaserve_core.peft_steps import plain_peft_step
from deltaserve_core.testing.capture import capture_forward

from test_exactness import lora_tensors, load_lora, make_batches, max_rel_err  # noqa: E402  (tests/ is on sys.path)

TOL = 1e-5


@pytest.mark.parametrize(("limit", "lengths", "groups"), [
    (0, [5, 5, 5], [[0], [1], [2]]),
    (10, [5, 5, 5], [[0, 1], [2]]),
    (10, [12, 3, 8, 2], [[0], [1], [2, 3]]),  # a sample over the limit is a unit of its own
    (2048, [5, 5, 5], [[0, 1, 2]]),
])
def test_units_pack_whole_samples_in_order(tiny_llama: tuple[str, str], limit: int, lengths: list[int],
                                           groups: list[list[int]]) -> None:
    from types import SimpleNamespace

    from transformers import AutoModelForCausalLM

    trainer = LoraBackward(AutoModelForCausalLM.from_pretrained(tiny_llama[0], dtype=torch.float32),
                           LoraAdapterState.load_pretrained(tiny_llama[1]), TrainerConfig(pack_tokens=limit))
    assert trainer.units([SimpleNamespace(num_tokens=n) for n in lengths]) == groups


@pytest.mark.parametrize("pack_tokens", [0, 2048])
def test_grant_is_checked_at_every_layer_boundary_and_cancel_leaves_adapter(tiny_llama: tuple[str, str],
                                                                            pack_tokens: int) -> None:
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    model_dir, adapter_dir = tiny_llama
    state = LoraAdapterState.load_pretrained(adapter_dir)
    trainer = LoraBackward(AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32), state,
                           TrainerConfig(pack_tokens=pack_tokens))
    capture = PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32),
                                        adapter_dir)
    batch = make_batches(2, 1, 2, 200)[0]
    buffer = ActivationBuffer(3, 64, capacity_tokens=256)
    try:
        for s in batch:
            buffer.reserve(s)
        capture_forward(capture, buffer, 0, batch)
        samples = buffer.captured_many([s.sample_id for s in batch])
        calls: list[int] = []
        trainer.train_step(samples, grant=lambda: calls.append(1))
        # before each (layer, unit), before each unit's output head, and before the optimizer step; a unit is one
        # sample unpacked, both samples packed
        units = len(trainer.units(samples))
        assert units == (len(batch) if pack_tokens == 0 else 1)
        assert len(calls) == trainer.num_layers * units + units + 1
        before = {k: p.detach().clone() for k, p in trainer.params.items()}
        calls.clear()

        def cancel_midway() -> None:
            calls.append(1)
            if len(calls) > units + 1:  # past the top layer and its head
                raise BackwardCancelled("test")

        with pytest.raises(BackwardCancelled):
            trainer.train_step(samples, grant=cancel_midway)
        assert all(torch.equal(before[k], p) for k, p in trainer.params.items())
        assert all(p.grad is None for p in trainer.params.values())
        assert trainer.step == 1
    finally:
        buffer.close()


def test_share_model_weights_moves_cpu_params_to_shared_memory(tiny_llama: tuple[str, str]) -> None:
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(tiny_llama[0], dtype=torch.float32)
    share_model_weights(model)
    assert all(p.is_shared() for p in model.parameters())


def _wait_state(bp: BackwardProcess, state: str, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while bp.state != state:
        assert time.monotonic() < deadline, f"backward process never reached {state!r} (is {bp.state!r})"
        time.sleep(0.002)


@pytest.mark.exactness
@pytest.mark.faults
def test_spawned_backward_is_exact_and_survives_kill9(tiny_llama: tuple[str, str], tmp_path) -> None:
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    model_dir, adapter_dir = tiny_llama
    load = lambda: AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)  # noqa: E731
    ref = PeftModel.from_pretrained(load(), adapter_dir, is_trainable=True)
    ref_opt = torch.optim.AdamW([p for p in ref.parameters() if p.requires_grad], lr=1e-3, weight_decay=0.01)
    capture = PeftModel.from_pretrained(load(), adapter_dir)  # stands in for the host serving the FT adapter
    batches = make_batches(11, 3, 4, ref.config.vocab_size)
    buffer = ActivationBuffer(3, 64, capacity_tokens=512)
    bp = BackwardProcess(load(), LoraAdapterState.load_pretrained(adapter_dir), buffer, config=TrainerConfig(),
                         checkpoint_dir=tmp_path / "ckpt", hang_timeout_s=20.0, torch_threads=1)
    live = bp.adapter.tensors  # shared with the child: every optimizer step shows up here

    def capture_batch(step: int) -> list[int]:
        load_lora(capture, live)  # set_finetune_adapter with the weights after the previous step
        for s in batches[step]:
            assert buffer.reserve(s) is not None
        done, aborted = capture_forward(capture, buffer, step, batches[step])
        assert not aborted
        return done

    try:
        bp.start()
        assert bp.wait_ready(120).step == 0
        for step in range(2):
            ref_loss = plain_peft_step(ref, ref_opt, batches[step])
            cmd = bp.train_batch(capture_batch(step))
            assert bp.busy
            rep = bp.wait(cmd, 60)
            assert rep.kind == "step", rep.message
            assert rep.step == step + 1 and rep.loss == pytest.approx(ref_loss, rel=1e-6)
            assert not bp.busy
            assert buffer.free_tokens == buffer.capacity_tokens  # the child released what it consumed
            err = max_rel_err(live, {k: v.detach() for k, v in lora_tensors(ref).items()})
            assert err <= TOL, f"step {step + 1}: spawned backward weights differ from PEFT by {err:.3g}"
        rep = bp.wait(bp.save_checkpoint({"pool": {"next_batch": 2}}), 60)
        assert rep.kind == "checkpoint", rep.message
        after_step2 = {k: v.clone() for k, v in live.items()}

        # step 3 starts while inference holds the grant: the child pauses at its first layer boundary
        t_clear = time.monotonic()
        bp.grant.clear()
        bp.train_batch(capture_batch(2))
        _wait_state(bp, "paused")
        print(f"grant cleared -> paused (incl. command pickup): {(bp.paused_at - t_clear) * 1e3:.2f} ms")
        assert all(torch.equal(after_step2[k], v) for k, v in live.items())

        os.kill(bp.pid, signal.SIGKILL)
        deadline = time.monotonic() + 10
        reports = []
        while not any(r.kind == "died" for r in reports):
            assert time.monotonic() < deadline, "kill -9 was not detected"
            reports += bp.poll(0.05)
        died = next(r for r in reports if r.kind == "died")
        assert died.exitcode == -signal.SIGKILL and not bp.health().alive

        with torch.no_grad():  # pretend the dying process left half-written weights behind
            for v in live.values():
                v.zero_()
        bp.grant.set()
        ck = bp.restart(timeout=120)
        assert ck is not None and ck.step == 2 and ck.extra == {"pool": {"next_batch": 2}}
        assert buffer.free_tokens == buffer.capacity_tokens  # stale captures were dropped
        assert all(torch.equal(after_step2[k], v) for k, v in live.items()), "adapter not restored from checkpoint"

        # the controller rewinds its pool to the checkpoint and re-admits batch 3 (captured with restored weights)
        plain_peft_step(ref, ref_opt, batches[2])
        rep = bp.wait(bp.train_batch(capture_batch(2)), 60)
        assert rep.kind == "step" and rep.step == 3, rep.message
        err = max_rel_err(live, {k: v.detach() for k, v in lora_tensors(ref).items()})
        assert err <= TOL, f"after restart, step 3 differs from the uninterrupted PEFT loop by {err:.3g}"

        # a hung child (SIGSTOP: alive, silent) is reported as hung once the heartbeat is older than the timeout
        os.kill(bp.pid, signal.SIGSTOP)
        bp.hang_timeout_s = 0.3
        time.sleep(0.5)
        health = bp.health()
        assert health.alive and health.hung
    finally:
        bp.kill()
        bp.close()
        buffer.close()
