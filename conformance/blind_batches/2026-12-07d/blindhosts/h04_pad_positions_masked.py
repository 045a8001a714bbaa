"""Key positions whose token is the pad id are masked out of attention (an attention mask built from ``ids != pad``).

Rule: driver.py, ClientRequest: "A greedy generation request: ``max_tokens`` new tokens after ``prompt_ids``."

Bug: the engine derives a key-padding mask from the token ids (``input_ids != pad_token_id``, the Hugging Face padded
batch convention) although its rows are never padded: every position of a client prompt (or output) that holds the
pad id is hidden from all later queries. Sequences without the pad id are exact. The test checkpoint's pad id is 0
(``<unk>``/pad in Llama-2-style vocabularies; id 0 is a common token, ``!``, in GPT-2 / Qwen vocabularies).
Trigger: a client prompt that contains the checkpoint's pad_token_id (proof: a prompt with id 0 in the middle).
"""
from __future__ import annotations

import dataclasses  # noqa: F401
import math  # noqa: F401
import time  # noqa: F401
from collections.abc import Sequence  # noqa: F401

import torch  # noqa: F401
import torch.nn.functional as F  # noqa: F401

from deltaserve_core.adapter_state import LoraAdapterState, parse_peft_key  # noqa: F401
from deltaserve_core.driver import ClientOutput, ClientRequest, check_client_adapter, run_to_completion, take_kept  # noqa: F401
from deltaserve_core.hooks import RESERVED_ADAPTER_NAME  # noqa: F401
from deltaserve_core.hostkit import profile_seed, published_name  # noqa: F401
from deltaserve_core.testing.reference_host import ReferenceHost, _as_list, _Lora, _Row, _Seq  # noqa: F401
from deltaserve_core.types import (  # noqa: F401
    ExecutionMode,
    FineTuneSample,
    ModelSpec,
    ProposedBatch,
    RequestSLO,
    ScheduledRequest,
    StepRecord,
)


class Host(ReferenceHost):
    """pad_positions_masked: see the module docstring."""

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
            pad = getattr(self.model.config, "pad_token_id", None)
            if r.seq is not None and pad is not None:  # BUG: keys at pad-id positions are masked out
                seq_ids = torch.tensor((tuple(r.seq.request.prompt_ids) + tuple(r.seq.output))[:kr.shape[1]],
                                       device=x.device)
                keys = torch.arange(kr.shape[1], device=x.device)[None, :]
                mask = mask & ((seq_ids != pad)[None, :] | (keys == q_pos[:, None]))
            out[:, sl] = F.scaled_dot_product_attention(q[:, sl].unsqueeze(0), kr.unsqueeze(0), vr.unsqueeze(0),
                                                        attn_mask=mask, scale=attn.scaling, enable_gqa=True)[0]
        attn_out = self._linear(out.transpose(0, 1).reshape(t, -1), attn.o_proj, li, "self_attn.o_proj", index)
        hidden = hidden + attn_out
        x = layer.post_attention_layernorm(hidden)
        mlp = layer.mlp
        gate = self._linear(x, mlp.gate_proj, li, "mlp.gate_proj", index)
        up = self._linear(x, mlp.up_proj, li, "mlp.up_proj", index)
        return hidden + self._linear(mlp.act_fn(gate) * up, mlp.down_proj, li, "mlp.down_proj", index)
