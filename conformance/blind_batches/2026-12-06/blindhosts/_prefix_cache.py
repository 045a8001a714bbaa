"""A correct block prefix cache for the reference engine, shared by the prefix-cache hosts of this batch (h01, h30).

Like vLLM's automatic prefix caching and SGLang's radix cache: the KV of a client prompt's whole blocks
(``BLOCK`` tokens, the last prompt token excluded so that it is always computed) is kept under a key of the
adapter *name* the request runs on and the block's token prefix; a later prompt with the same key attends over the
cached KV instead of its own for those positions. Published versions get fresh names (``<adapter>@v<step>``), so a
cached entry never outlives the weights it was computed with; a re-publish of the same name (its
retraction, a reload of a client adapter) drops that name's entries. Fine-tuning rows never read or write it. Each prefix
cache host changes one piece. ``_layer`` is the reference host's with the one lookup added.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from deltaserve_core.testing.reference_host import ReferenceHost

BLOCK = 16


class PrefixCacheHost(ReferenceHost):
    def __init__(self, config) -> None:
        self._prefix: dict = {}  # before the base constructor: it loads the client adapters
        super().__init__(config)

    def _prefix_key(self, request, m):
        return (request.adapter, tuple(request.prompt_ids[:m]))

    def reset_prefix_cache(self) -> None:
        self._prefix.clear()

    def _drop_prefix(self, name) -> None:
        for key in [k for k in self._prefix if k[0] == name]:
            del self._prefix[key]

    def publish_adapter(self, state):
        # a second publish of the same name and version replaces its weights: KV cached under it is stale
        name = super().publish_adapter(state)
        self._drop_prefix(name)
        return name

    def retract_adapter(self, name):
        super().retract_adapter(name)
        self._drop_prefix(name)

    def load_client_adapter(self, name, path):
        super().load_client_adapter(name, path)
        self._drop_prefix(name)

    def _prefix_lookup_or_store(self, r, li, kr, vr):
        m = ((len(r.seq.request.prompt_ids) - 1) // BLOCK) * BLOCK
        if m == 0:
            return kr, vr
        key = self._prefix_key(r.seq.request, m)
        entry = self._prefix.get(key)
        if entry is not None and li in entry:
            ck, cv = entry[li]
            return torch.cat([ck, kr[:, m:]], dim=1), torch.cat([cv, vr[:, m:]], dim=1)
        self._prefix.setdefault(key, {})[li] = (kr[:, :m].clone(), vr[:, :m].clone())
        return kr, vr

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
