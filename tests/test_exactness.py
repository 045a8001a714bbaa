"""Exactness: training through capture → ActivationBuffer → LoraBackward equals a plain transformers + PEFT loop.

The reference is :func:`deltaserve_core.peft_steps.plain_peft_step` (per-sample unpadded forward, HF's loss with
``num_items_in_batch`` = the batch's target tokens, one ``torch.optim.AdamW`` step per batch). The DeltaServe side
captures every layer input with forward pre-hooks on a PEFT model that holds the adapter *as of the previous step*
(what a host serving the fine-tuning adapter does: no admission while a backward runs), then trains on the captures.

Tolerance: 1e-5 relative (max abs difference / max abs reference) on gradients of every step, on final weights and on
the weight *change* (AdamW's early steps are close to sign(grad), so weights alone would hide gradient errors). With
one sample per unit (``pack_tokens=0``) the fp32 results are bit-identical on CPU in practice. Packed units (the
default) run the same math on other matmul/attention shapes, so gradients differ by rounding (~1e-6); AdamW divides
each gradient entry by its own magnitude, which turns that into up to ~1e-4 of the largest update on entries whose
gradient is near ``eps``, so the weight-change bound is ``PACKED_DELTA_TOL`` there.

The spawned-process variant (and crash/restart) is in tests/test_backward_process.py.
"""

from __future__ import annotations

import copy
import os

os.environ.setdefault("OMP_NUM_THREADS", "1")

import random
from collections.abc import Mapping, Sequence

import pytest
import torch

from deltaserve_core.activation_buffer import ActivationBuffer
from deltaserve_core.adapter_state import LoraAdapterState, LoraConfigSpec
from deltaserve_core.lora_backward import LoraBackward, TrainerConfig
from deltaserve_core.peft_steps import plain_peft_step
from deltaserve_core.testing.capture import capture_forward
from deltaserve_core.types import FineTuneSample

pytestmark = pytest.mark.exactness

TOL = 1e-5
PACKED_DELTA_TOL = 2e-4
PACKING = [pytest.param(0, id="per-sample"), pytest.param(2048, id="packed")]


# ------------------------------------------------------------------------------------------ helpers


def make_batches(seed: int, num_batches: int, per_batch: int, vocab: int, *, min_len: int = 6,
                 max_len: int = 40) -> list[list[FineTuneSample]]:
    """Alpaca-like samples: a prompt (not trained on) followed by a response (targets)."""
    rng = random.Random(seed)
    batches, sid = [], 0
    for _ in range(num_batches):
        batch = []
        for _ in range(per_batch):
            n = rng.randint(min_len, max_len)
            prompt = rng.randint(1, n - 2)
            batch.append(FineTuneSample(sid, tuple(rng.randrange(vocab) for _ in range(n)),
                                        tuple([False] * prompt + [True] * (n - prompt))))
            sid += 1
        batches.append(batch)
    return batches


def lora_tensors(peft_model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """The PEFT model's LoRA parameters under LoraAdapterState keys (PEFT's saved names)."""
    return {name.replace(".default", ""): p for name, p in peft_model.named_parameters() if "lora_" in name}


def load_lora(peft_model: torch.nn.Module, tensors: Mapping[str, torch.Tensor]) -> None:
    """What a host's ``set_finetune_adapter`` does: make the served adapter equal the trainer's weights."""
    with torch.no_grad():
        for key, p in lora_tensors(peft_model).items():
            p.copy_(tensors[key])


def rel_err(ours: torch.Tensor, ref: torch.Tensor) -> float:
    scale = ref.abs().max().item()
    return (ours - ref).abs().max().item() / (scale if scale > 0 else 1.0)


def max_rel_err(ours: Mapping[str, torch.Tensor], ref: Mapping[str, torch.Tensor]) -> float:
    assert set(ours) == set(ref)
    return max(rel_err(ours[k].detach(), ref[k].detach()) for k in ref)


def run_deltaserve_vs_reference(ref_model: torch.nn.Module, capture_model: torch.nn.Module,
                                trainer: LoraBackward, buffer: ActivationBuffer,
                                batches: Sequence[Sequence[FineTuneSample]]) -> dict[str, float]:
    """Train both sides on the same batches; assert per-step gradient/loss agreement; return the error summary."""
    init = {k: v.detach().clone() for k, v in lora_tensors(ref_model).items()}
    opt = torch.optim.AdamW([p for p in ref_model.parameters() if p.requires_grad], lr=1e-3, weight_decay=0.01)
    worst_grad = 0.0
    for step, batch in enumerate(batches):
        ref_loss = plain_peft_step(ref_model, opt, batch)
        load_lora(capture_model, trainer.params)  # captures for batch k use the weights after step k-1
        for s in batch:
            assert buffer.reserve(s) is not None
        done, aborted = capture_forward(capture_model, buffer, step, batch, finetune_only=False)
        assert aborted == [] and done == [s.sample_id for s in batch]
        result = trainer.train_step(buffer.captured_many(done))
        for sid in done:
            buffer.release(sid)
        ref_grads = {k: p.grad for k, p in lora_tensors(ref_model).items()}
        ours_grads = {k: p.grad for k, p in trainer.params.items()}
        g = max_rel_err(ours_grads, ref_grads)
        worst_grad = max(worst_grad, g)
        assert g <= TOL, f"step {step}: gradient rel err {g:.3g}"
        assert result.loss == pytest.approx(ref_loss, rel=1e-5)
        assert result.step == step + 1
    ref_w = {k: v.detach() for k, v in lora_tensors(ref_model).items()}
    w_err = max_rel_err(dict(trainer.params), ref_w)
    d_err = max_rel_err({k: trainer.params[k].detach() - init[k] for k in init}, {k: ref_w[k] - init[k] for k in init})
    assert w_err <= TOL, f"weights rel err {w_err:.3g}"
    delta_tol = TOL if trainer.config.pack_tokens == 0 else PACKED_DELTA_TOL
    assert d_err <= delta_tol, f"weight-change rel err {d_err:.3g}"
    assert buffer.free_tokens == buffer.capacity_tokens
    return {"grad": worst_grad, "weights": w_err, "delta": d_err}


# ------------------------------------------------------------------------------------------ fixtures


# ------------------------------------------------------------------------------------------ tests


@pytest.mark.parametrize("pack_tokens", PACKING)
def test_llama_three_steps_match_plain_peft(tiny_llama: tuple[str, str], pack_tokens: int) -> None:
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    model_dir, adapter_dir = tiny_llama
    load = lambda: AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)  # noqa: E731
    ref = PeftModel.from_pretrained(load(), adapter_dir, is_trainable=True)
    capture = PeftModel.from_pretrained(load(), adapter_dir)
    state = LoraAdapterState.load_pretrained(adapter_dir)
    trainer = LoraBackward(load(), state.with_tensors({k: v.clone() for k, v in state.tensors.items()}, version=0),
                           TrainerConfig(pack_tokens=pack_tokens))
    buffer = ActivationBuffer(3, 64, capacity_tokens=512)
    try:
        errs = run_deltaserve_vs_reference(ref, capture, trainer, buffer,
                                           make_batches(0, 3, 4, ref.config.vocab_size))
    finally:
        buffer.close()
    print(f"llama exactness: {errs}")


@pytest.mark.parametrize("pack_tokens", PACKING)
def test_qwen3_sliding_window_and_mlp_targets_match_plain_peft(pack_tokens: int) -> None:
    """Another family (Qwen3: q/k norms, per-layer sliding/full attention) and LoRA on MLP linears too."""
    from peft import LoraConfig, get_peft_model
    from transformers import Qwen3Config, Qwen3ForCausalLM

    cfg = Qwen3Config(vocab_size=300, hidden_size=64, intermediate_size=96, num_hidden_layers=3,
                      num_attention_heads=4, num_key_value_heads=2, head_dim=16, max_position_embeddings=256,
                      use_sliding_window=True, sliding_window=8, max_window_layers=1, tie_word_embeddings=True)
    torch.manual_seed(3)
    base = Qwen3ForCausalLM(cfg).float()
    with torch.no_grad():
        for p in base.parameters():
            if p.dim() == 2:
                p.normal_(0.0, 0.08)
    assert len(set(base.config.layer_types)) == 2, "the test wants both sliding and full attention layers"
    ours_base = copy.deepcopy(base)
    targets = ("down_proj", "gate_proj", "q_proj", "v_proj")
    ref = get_peft_model(base, LoraConfig(r=4, lora_alpha=8, target_modules=list(targets), lora_dropout=0.0))
    gen = torch.Generator().manual_seed(5)
    with torch.no_grad():
        for p in lora_tensors(ref).values():
            p.copy_(torch.randn(p.shape, generator=gen) * 0.05)
    capture = copy.deepcopy(ref)
    state = LoraAdapterState("qwen3-ft", 0, LoraConfigSpec(r=4, lora_alpha=8.0, target_modules=targets),
                             {k: v.detach().clone() for k, v in lora_tensors(ref).items()})
    trainer = LoraBackward(ours_base, state, TrainerConfig(pack_tokens=pack_tokens))
    buffer = ActivationBuffer(3, 64, capacity_tokens=512)
    try:
        errs = run_deltaserve_vs_reference(ref, capture, trainer, buffer,
                                           make_batches(1, 3, 3, cfg.vocab_size, min_len=10, max_len=30))
    finally:
        buffer.close()
    print(f"qwen3 exactness: {errs}")


def test_layer_kwargs_come_from_the_models_own_forward(tiny_llama: tuple[str, str]) -> None:
    """The recompute of a layer from its captured input reproduces the next captured input (the host's forward)."""
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    model_dir, adapter_dir = tiny_llama
    capture = PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32),
                                        adapter_dir)
    state = LoraAdapterState.load_pretrained(adapter_dir)
    trainer = LoraBackward(AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32), state)
    sample = make_batches(7, 1, 1, 200, min_len=20, max_len=20)[0][0]
    buffer = ActivationBuffer(3, 64, capacity_tokens=64)
    try:
        buffer.reserve(sample)
        capture_forward(capture, buffer, 0, [sample])
        cap = buffer.captured(sample.sample_id)
        kwargs = trainer.layer_kwargs(sample.num_tokens)
        with torch.no_grad(), trainer.lora_applied():
            for li in range(2):
                args, kw = kwargs[li]
                out = trainer.layers[li](cap.hidden[li][None], *args, **kw)
                assert rel_err(out[0], cap.hidden[li + 1]) <= 1e-6
    finally:
        buffer.close()


def test_packed_peft_step_matches_the_per_sample_loop(tiny_llama: tuple[str, str]) -> None:
    """The split-pool baseline's trainer (transformers' padding-free packing) trains like the reference loop."""
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    from deltaserve_core.peft_steps import packed_peft_step

    model_dir, adapter_dir = tiny_llama
    models, grads = [], []
    for step in (plain_peft_step, lambda m, o, b: packed_peft_step(m, o, b, pack_tokens=60)):
        m = PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32),
                                      adapter_dir, is_trainable=True)
        opt = torch.optim.AdamW([p for p in m.parameters() if p.requires_grad], lr=1e-3, weight_decay=0.01)
        losses = [step(m, opt, batch) for batch in make_batches(4, 2, 5, m.config.vocab_size)]
        models.append((m, losses))
        grads.append({k: p.grad.clone() for k, p in lora_tensors(m).items()})
    (ref, ref_losses), (packed, packed_losses) = models
    assert sum(packed_losses) == pytest.approx(sum(ref_losses), rel=1e-5)
    assert max_rel_err(grads[1], grads[0]) <= TOL
    assert max_rel_err(lora_tensors(packed), lora_tensors(ref)) <= TOL
