"""Broken host: the decode attention path maps query heads to KV heads interleaved (GQA).

Rule (driver.py, ClientRequest): "A greedy generation request: ``max_tokens`` new tokens after ``prompt_ids``."

Bug: the decode kernel's grouped-query mapping uses ``kv_head = q_head % num_kv_heads`` (the layout of a
``repeat``-expanded cache) instead of ``q_head // (num_heads // num_kv_heads)``; prefill uses the library attention and
is right. On any GQA model (num_key_value_heads < num_attention_heads, Llama 3 / Qwen / SmolLM2 and the tiny test
model) every token after the first is decoded with the wrong KV heads.

Trigger: any request with max_tokens >= 2 on a GQA model.
"""
from __future__ import annotations

import time  # noqa: F401
from collections.abc import Sequence  # noqa: F401
from dataclasses import replace  # noqa: F401

import torch  # noqa: F401
import torch.nn.functional as F  # noqa: F401

from deltaserve_core.driver import ClientOutput  # noqa: F401
from deltaserve_core.hooks import RESERVED_ADAPTER_NAME  # noqa: F401
from deltaserve_core.testing.reference_host import ReferenceHost, _Lora, _Row, _Seq  # noqa: F401
from deltaserve_core.types import ExecutionMode, FineTuneSample, ProposedBatch, StepRecord  # noqa: F401



class Host(ReferenceHost):
    def _layer(self, li: int, layer: torch.nn.Module, hidden: torch.Tensor, rows: list[_Row],
               cos: torch.Tensor, sin: torch.Tensor, index: dict[str, torch.Tensor]) -> torch.Tensor:
        from transformers.models.llama.modeling_llama import apply_rotary_pos_emb

        attn = layer.self_attn
        x = layer.input_layernorm(hidden)
        t = x.shape[0]
        q = self._linear(x, attn.q_proj, li, "self_attn.q_proj", index).view(t, self.num_heads, self.head_dim)
        k = self._linear(x, attn.k_proj, li, "self_attn.k_proj", index).view(t, self.num_kv_heads, self.head_dim)
        v = self._linear(x, attn.v_proj, li, "self_attn.v_proj", index).view(t, self.num_kv_heads, self.head_dim)
        if getattr(attn, "q_norm", None) is not None:  # Qwen3 normalises q and k per head before rotary
            q, k = attn.q_norm(q), attn.k_norm(k)
        q, k = apply_rotary_pos_emb(q.transpose(0, 1).unsqueeze(0), k.transpose(0, 1).unsqueeze(0), cos, sin)
        q, k, v = q[0], k[0], v.transpose(0, 1)  # [heads, T, head_dim]
        out = torch.empty(self.num_heads, t, self.head_dim, dtype=x.dtype, device=x.device)
        for r in rows:
            sl = slice(r.start, r.start + r.length)
            kr, vr = k[:, sl], v[:, sl]
            if r.seq is not None or r.fake_kv is not None:
                cache = (r.seq.kv if r.seq is not None else r.fake_kv)
                if cache is not None and r.past > 0:
                    kr = torch.cat([cache[li][0], kr], dim=1)
                    vr = torch.cat([cache[li][1], vr], dim=1)
                if r.seq is not None:
                    if r.seq.kv is None:
                        r.seq.kv = [None] * len(self._layers)  # type: ignore[list-item]
                    r.seq.kv[li] = (kr, vr)
            q_pos = torch.arange(r.past, r.past + r.length, device=x.device)
            mask = torch.arange(kr.shape[1], device=x.device)[None, :] <= q_pos[:, None]
            if r.past > 0 and self.num_kv_heads != self.num_heads:  # decode kernel
                group = self.num_heads // self.num_kv_heads
                kx, vx = kr.repeat(group, 1, 1), vr.repeat(group, 1, 1)  # BUG: q head h reads kv head h % num_kv
                out[:, sl] = F.scaled_dot_product_attention(q[:, sl].unsqueeze(0), kx.unsqueeze(0), vx.unsqueeze(0),
                                                            attn_mask=mask, scale=attn.scaling)[0]
                continue
            out[:, sl] = F.scaled_dot_product_attention(q[:, sl].unsqueeze(0), kr.unsqueeze(0), vr.unsqueeze(0),
                                                        attn_mask=mask, scale=attn.scaling, enable_gqa=True)[0]
        attn_out = self._linear(out.transpose(0, 1).reshape(t, -1), attn.o_proj, li, "self_attn.o_proj", index)
        hidden = hidden + attn_out
        x = layer.post_attention_layernorm(hidden)
        mlp = layer.mlp
        gate = self._linear(x, mlp.gate_proj, li, "mlp.gate_proj", index)
        up = self._linear(x, mlp.up_proj, li, "mlp.up_proj", index)
        return hidden + self._linear(mlp.act_fn(gate) * up, mlp.down_proj, li, "mlp.down_proj", index)
