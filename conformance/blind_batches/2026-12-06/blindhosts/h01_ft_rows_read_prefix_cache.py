"""Broken host: fine-tuning rows READ the block prefix cache under the base model's key.

Rule (hooks.py, HostHooks.intercept_schedule): "adds the returned samples to that same step as prefill-only rows on
the reserved adapter (no prefix-cache reads, no sampling output)".

Bug: the adapter injects each fine-tuning row as an engine request whose scheduler-side request carries no LoRA
request (the reserved adapter is attached by the model runner from the step plan), and it only sets the engine's
"skip cache write" flag for them. The prefix-cache lookup (block hashes keyed by the request's LoRA name and tokens)
therefore runs for fine-tuning rows under the *base model's* key: a sample whose leading whole blocks (16 tokens)
equal those of a base-model client prompt served earlier attends over that prompt's cached KV, computed without the
fine-tuning adapter. Captures of every layer after the first are then wrong.

Trigger: a fine-tuning sample sharing its first 16+ tokens with a base-model prompt already served (shared system
prompts / instruction templates make this common); default options (prefix caching on, as in vLLM and SGLang).
Base: ``_prefix_cache.PrefixCacheHost`` (correct; fine-tuning rows never read or write it).
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
from blindhosts._prefix_cache import BLOCK, PrefixCacheHost



class Host(PrefixCacheHost):
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
            if r.seq is not None and r.past == 0:  # client prefill: prefix cache (whole blocks, last token excluded)
                kr, vr = self._prefix_lookup_or_store(r, li, kr, vr)
            elif r.sample is not None:  # BUG: FT rows are looked up (read-only) under their engine request's key
                kr, vr = self._ft_prefix_lookup(r, li, kr, vr)
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
            out[:, sl] = F.scaled_dot_product_attention(q[:, sl].unsqueeze(0), kr.unsqueeze(0), vr.unsqueeze(0),
                                                        attn_mask=mask, scale=attn.scaling, enable_gqa=True)[0]
        attn_out = self._linear(out.transpose(0, 1).reshape(t, -1), attn.o_proj, li, "self_attn.o_proj", index)
        hidden = hidden + attn_out
        x = layer.post_attention_layernorm(hidden)
        mlp = layer.mlp
        gate = self._linear(x, mlp.gate_proj, li, "mlp.gate_proj", index)
        up = self._linear(x, mlp.up_proj, li, "mlp.up_proj", index)
        return hidden + self._linear(mlp.act_fn(gate) * up, mlp.down_proj, li, "mlp.down_proj", index)

    def _ft_prefix_lookup(self, r, li, kr, vr):
        """The scheduler's lookup for an injected row: its engine request has no LoRA request, so key (None, tokens);
        the longest cached whole-block prefix (last token excluded) wins, like a block-hash walk."""
        ids = r.sample.input_ids
        m = ((len(ids) - 1) // BLOCK) * BLOCK
        while m > 0:
            entry = self._prefix.get((None, tuple(ids[:m])))
            if entry is not None and li in entry:
                ck, cv = entry[li]
                return torch.cat([ck, kr[:, m:]], dim=1), torch.cat([cv, vr[:, m:]], dim=1)
            m -= BLOCK
        return kr, vr
