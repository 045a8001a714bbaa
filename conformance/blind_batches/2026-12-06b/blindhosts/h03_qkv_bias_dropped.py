"""h03: the fused QKV projection is built from the weights only: q/k/v biases are dropped.

Rule (driver.py, ClientRequest): "A greedy generation request: ``max_tokens`` new tokens after ``prompt_ids``."

Bug: like vLLM's ``QKVParallelLinear``, the adapter runs q/k/v as one fused GEMM whose operand it packs from
``q_proj.weight``, ``k_proj.weight`` and ``v_proj.weight`` at load time; the packer never looks for ``.bias``, so the
attention projections run without their bias (LoRA deltas and every other linear are right).

Trigger: any model with attention biases: the Qwen2 / Qwen2.5 family (``attention_bias``-style q/k/v biases in every
layer), among the most served open models. The 2-layer test Llama has none, so the proof builds the same tiny Llama
with ``attention_bias=True`` (random non-zero biases).
"""
from __future__ import annotations

from deltaserve_core.testing.reference_host import ReferenceHost, _Row  # noqa: F401
import torch
import torch.nn.functional as F

_FUSED = ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj")


class Host(ReferenceHost):
    def _linear(self, x: torch.Tensor, module: torch.nn.Module, layer: int, name: str,
                groups: dict[str, torch.Tensor]) -> torch.Tensor:
        if name in _FUSED:
            out = F.linear(x, module.weight)  # BUG: fused qkv operand packed from the weights only, bias dropped
        else:
            out = module(x)
        for adapter, index in groups.items():
            pair = self._adapters[adapter].pairs.get((layer, name))
            if pair is None:
                continue
            a, b = pair
            # Same order of operations as PEFT's LoRA layer: B(A(x)) * scaling, added to the base output.
            out.index_add_(0, index, (x.index_select(0, index) @ a.T @ b.T) * self._adapters[adapter].scaling)
        return out
