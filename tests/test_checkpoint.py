"""Checkpoints: atomic PEFT-format folders, loadable by PEFT with identical logits, resumable to identical weights."""

from __future__ import annotations

import os

os.environ.setdefault("OMP_NUM_THREADS", "1")

import json

import pytest
import torch

from deltaserve_core.activation_buffer import ActivationBuffer
from deltaserve_core.adapter_state import LoraAdapterState, LoraConfigSpec
from deltaserve_core.checkpoint import list_checkpoints, load_latest, save_checkpoint
from deltaserve_core.lora_backward import LoraBackward
from deltaserve_core.testing.capture import capture_forward

from test_exactness import load_lora, make_batches  # noqa: E402  (tests/ is on sys.path)


def toy_adapter(step: int = 0) -> LoraAdapterState:
    torch.manual_seed(step)
    tensors = {}
    for layer in range(2):
        for mod in ("self_attn.q_proj", "self_attn.v_proj"):
            base = f"base_model.model.model.layers.{layer}.{mod}"
            tensors[f"{base}.lora_A.weight"] = torch.randn(4, 16)
            tensors[f"{base}.lora_B.weight"] = torch.randn(16, 4)
    return LoraAdapterState("ft", step, LoraConfigSpec(r=4, lora_alpha=8.0, target_modules=("q_proj", "v_proj")),
                            tensors, "/models/base")


def test_roundtrip_keep_last_and_no_leftovers(tmp_path) -> None:
    opt_state = {"state": {0: {"step": torch.tensor(3.0), "exp_avg": torch.ones(2)}},
                 "param_groups": [{"lr": 1e-3, "betas": (0.9, 0.999), "params": [0]}]}
    for step in (1, 2, 3, 4):
        save_checkpoint(tmp_path, toy_adapter(step), opt_state, step, {"pool": {"cursor": step * 10}}, keep_last=2)
    assert [p.name for p in list_checkpoints(tmp_path)] == ["checkpoint-00000003", "checkpoint-00000004"]
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]
    ck = load_latest(tmp_path)
    assert ck is not None and ck.step == 4 and ck.extra == {"pool": {"cursor": 40}}
    assert ck.adapter.base_model_path == "/models/base" and ck.adapter.config.r == 4
    assert all(torch.equal(ck.adapter.tensors[k], v) for k, v in toy_adapter(4).tensors.items())
    assert torch.equal(ck.optimizer_state["state"][0]["exp_avg"], torch.ones(2))
    cfg = json.loads((ck.path / "adapter_config.json").read_text())
    assert cfg["peft_type"] == "LORA" and cfg["r"] == 4


def test_incomplete_or_damaged_checkpoints_are_skipped(tmp_path) -> None:
    save_checkpoint(tmp_path, toy_adapter(1), None, 1, {})
    (tmp_path / "checkpoint-00000009").mkdir()  # a crash before trainer_state.json: not complete
    (tmp_path / ".tmp-checkpoint-00000005-1-abc").mkdir()
    damaged = save_checkpoint(tmp_path, toy_adapter(2), None, 2, {})
    (damaged / "adapter_model.safetensors").write_bytes(b"truncated")
    with pytest.warns(UserWarning, match="skipping unreadable"):
        ck = load_latest(tmp_path)
    assert ck is not None and ck.step == 1 and ck.optimizer_state is None
    assert load_latest(tmp_path / "nothing-here") is None


def test_non_json_extra_fails_before_writing(tmp_path) -> None:
    with pytest.raises(TypeError):
        save_checkpoint(tmp_path, toy_adapter(), None, 1, {"bad": object()})
    assert list(tmp_path.iterdir()) == []


def _train(trainer: LoraBackward, capture: torch.nn.Module, buffer: ActivationBuffer, batches, first_step: int) -> None:
    for i, batch in enumerate(batches):
        load_lora(capture, trainer.params)
        for s in batch:
            buffer.reserve(s)
        done, _ = capture_forward(capture, buffer, first_step + i, batch)
        trainer.train_step(buffer.captured_many(done))
        for sid in done:
            buffer.release(sid)


def test_checkpoint_loads_in_peft_with_identical_logits_and_resumes_exactly(tiny_llama, tmp_path) -> None:
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    model_dir, adapter_dir = tiny_llama
    load = lambda: AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)  # noqa: E731
    state = LoraAdapterState.load_pretrained(adapter_dir)
    state = LoraAdapterState(state.name, 0, state.config, state.tensors, model_dir)
    capture = PeftModel.from_pretrained(load(), adapter_dir)
    batches = make_batches(21, 3, 3, capture.config.vocab_size)
    buffer = ActivationBuffer(3, 64, capacity_tokens=256)
    try:
        trainer = LoraBackward(load(), state.with_tensors({k: v.clone() for k, v in state.tensors.items()}, version=0))
        _train(trainer, capture, buffer, batches[:2], 0)
        path = save_checkpoint(tmp_path, trainer.adapter_state(), trainer.optimizer_state(), trainer.step,
                               {"pool": {"epoch": 0, "cursor": 6}})

        # PEFT loads the folder as an ordinary adapter and computes the same logits as the in-memory weights
        ids = torch.tensor(batches[2][0].input_ids)
        peft_model = PeftModel.from_pretrained(load(), str(path))
        with torch.no_grad():
            peft_logits = peft_model(input_ids=ids[None]).logits[0]
        assert torch.equal(peft_logits, trainer.forward_logits(ids))

        _train(trainer, capture, buffer, batches[2:], 2)  # uninterrupted run: step 3
        resumed_ck = load_latest(tmp_path)
        assert resumed_ck is not None and resumed_ck.step == 2 and resumed_ck.extra["pool"]["cursor"] == 6
        resumed = LoraBackward(load(), resumed_ck.adapter.with_tensors(
            {k: v.clone() for k, v in resumed_ck.adapter.tensors.items()}))
        resumed.load_optimizer_state(resumed_ck.optimizer_state, resumed_ck.step)
        _train(resumed, capture, buffer, batches[2:], 2)
        assert resumed.step == trainer.step == 3
        assert all(torch.equal(resumed.params[k], trainer.params[k]) for k in trainer.params)
    finally:
        buffer.close()
