"""Why is a packed backward unit slow on a *new* length on the H200? Times one Llama-3-8B-shaped decoder layer's
forward+backward with a packed (block-diagonal) mask on fresh and repeated lengths, per SDPA backend set.
Diagnostic for benchmarks/gpu/backward_h200.sh; prints one line per case."""
import time

import torch
from torch.nn.attention import SDPBackend, sdpa_kernel
from transformers import LlamaConfig
from transformers.models.llama.modeling_llama import LlamaDecoderLayer, LlamaRotaryEmbedding
from transformers.masking_utils import create_causal_mask

cfg = LlamaConfig(vocab_size=128256, hidden_size=4096, intermediate_size=14336, num_hidden_layers=1,
                  num_attention_heads=32, num_key_value_heads=8, max_position_embeddings=8192, rope_theta=500000.0)
cfg._attn_implementation = "sdpa"
dev = torch.device("cuda")
layer = LlamaDecoderLayer(cfg, 0).to(dev, torch.bfloat16)
rope = LlamaRotaryEmbedding(cfg).to(dev)


def one(lengths):
    n = sum(lengths)
    x = torch.randn(1, n, 4096, device=dev, dtype=torch.bfloat16, requires_grad=True)
    pos = torch.cat([torch.arange(k, device=dev) for k in lengths])[None]
    mask = create_causal_mask(config=cfg, inputs_embeds=x, attention_mask=None, past_key_values=None,
                              position_ids=pos)
    pe = rope(x, pos)
    torch.cuda.synchronize()
    t = time.perf_counter()
    out = layer(x, attention_mask=mask, position_ids=pos, position_embeddings=pe)
    out = out[0] if isinstance(out, tuple) else out
    out.backward(torch.ones_like(out))
    torch.cuda.synchronize()
    return time.perf_counter() - t


print("torch", torch.__version__, "cudnn sdp enabled", torch.backends.cuda.cudnn_sdp_enabled())
for name, backends in [("default", None),
                       ("no-cudnn", [SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION, SDPBackend.MATH])]:
    ctx = sdpa_kernel(backends) if backends else torch.enable_grad()
    with ctx:
        base = 97 if name == "default" else 131
        one([base, 60])  # warm
        fresh = [one([base + i, 60 + 3 * i]) for i in range(1, 6)]
        same = [one([base + 5, 75]) for _ in range(5)]
        big_fresh = [one([1000 + 7 * i + (name == "no-cudnn"), 1000]) for i in range(3)]
        print(f"{name}: fresh-length ms {[round(t * 1e3, 1) for t in fresh]}, repeated {[round(t * 1e3, 1) for t in same]}, "
              f"~2k fresh {[round(t * 1e3, 1) for t in big_fresh]}")
