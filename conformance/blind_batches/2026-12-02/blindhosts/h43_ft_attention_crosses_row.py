"""Varlen boundaries for injected rows come from exclusive ends (cu_seqlens off by one): a fine-tuning row that
follows a client prefill row also attends to that row's last token."""
import torch
import torch.nn.functional as F

from ._base import Patchable


class Host(Patchable):
    name = "blind-h43"

    def _layer(self, li, layer, hidden, rows, cos, sin, index):
        from transformers.models.llama.modeling_llama import apply_rotary_pos_emb

        attn = layer.self_attn
        x = layer.input_layernorm(hidden)
        t = x.shape[0]
        q = self._linear(x, attn.q_proj, li, "self_attn.q_proj", index).view(t, self.num_heads, self.head_dim)
        k = self._linear(x, attn.k_proj, li, "self_attn.k_proj", index).view(t, self.num_kv_heads, self.head_dim)
        v = self._linear(x, attn.v_proj, li, "self_attn.v_proj", index).view(t, self.num_kv_heads, self.head_dim)
        if getattr(attn, "q_norm", None) is not None:
            q, k = attn.q_norm(q), attn.k_norm(k)
        q, k = apply_rotary_pos_emb(q.transpose(0, 1).unsqueeze(0), k.transpose(0, 1).unsqueeze(0), cos, sin)
        q, k, v = q[0], k[0], v.transpose(0, 1)
        out = torch.empty(self.num_heads, t, self.head_dim, dtype=x.dtype, device=x.device)
        for i, r in enumerate(rows):
            sl = slice(r.start, r.start + r.length)
            kr, vr = k[:, sl], v[:, sl]
            extra = 0
            if r.sample is not None and i > 0 and rows[i - 1].sample is None and rows[i - 1].past == 0 \
                    and rows[i - 1].seq is not None:
                kr, vr = k[:, r.start - 1:r.start + r.length], v[:, r.start - 1:r.start + r.length]  # BUG
                extra = 1
            if r.seq is not None or r.fake_kv is not None:
                cache = (r.seq.kv if r.seq is not None else r.fake_kv)
                if cache is not None and r.past > 0:
                    kr = torch.cat([cache[li][0], kr], dim=1)
                    vr = torch.cat([cache[li][1], vr], dim=1)
                if r.seq is not None:
                    if r.seq.kv is None:
                        r.seq.kv = [None] * len(self._layers)
                    r.seq.kv[li] = (kr, vr)
            q_pos = torch.arange(r.past + extra, r.past + extra + r.length, device=x.device)
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
