"""Weight layouts between transformers/PEFT and S-LoRA, in plain torch (no S-LoRA import, runs in CI).

Two transforms, both exact:

- **GQA → MHA expansion.** S-LoRA stores each adapter as rows of its KV pool, one row per rank index per
  projection, each row ``num_attention_heads * head_dim`` wide (``slora/server/router/model_infer/infer_adapter.py``
  ``load_lora_A/B``; ``bgmv_impl.cuh`` reads row ``j`` as ``feat_in``/``feat_out`` = hidden elements). A k/v LoRA B
  of a grouped-query model is narrower than that row, and the pool's cells are ``num_key_value_heads`` wide, so
  S-LoRA cannot hold LoRA on GQA models. Repeating every K/V head ``num_heads / num_kv_heads`` times (exactly what
  transformers' ``repeat_kv`` does at attention time) gives an MHA checkpoint whose every attention score and
  output is the same function of the inputs; the adapter's k/v B rows are repeated the same way.
- **PEFT → pool rows.** Per layer S-LoRA keeps ``w_combined[2, 4r, heads, head_dim]``: ``[0]`` the A rows
  (q, k, v, o blocks of r rows; row j = ``A[j, :]``), ``[1]`` the B rows, where each block is B (``[out, r]``,
  row-major) *flattened and cut into r rows of out elements* (the expand kernel reads ``W[(o*r + k) // out]
  [(o*r + k) % out]`` for ``B[o, k]``). :func:`pool_rows` builds exactly that; :func:`peft_from_pool_rows`
  inverts it (the round trip is tested against a real PEFT adapter).
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Mapping
from pathlib import Path

import torch

from deltaserve_core.adapter_state import LoraAdapterState, parse_peft_key

__all__ = [
    "SLORA_MODULES",
    "UnsupportedAdapterError",
    "expand_lora_pair",
    "expand_state_dict_gqa",
    "kv_repeat",
    "peft_from_pool_rows",
    "pool_rows",
    "slora_dir_name",
    "write_mha_checkpoint",
    "write_slora_adapter",
]

#: The projections S-LoRA applies LoRA to, in its pool order (qkvo index 0..3 of the bgmv kernels).
SLORA_MODULES: tuple[str, ...] = ("q_proj", "k_proj", "v_proj", "o_proj")


class UnsupportedAdapterError(ValueError):
    """An adapter S-LoRA cannot serve (modules other than q/k/v/o, missing modules, rank over the kernel table)."""


def kv_repeat(config: Mapping[str, object]) -> int:
    """How many times each K/V head is repeated to make the model MHA (1 for MHA models)."""
    heads = int(config["num_attention_heads"])  # type: ignore[arg-type]
    kv = int(config.get("num_key_value_heads") or heads)  # type: ignore[arg-type]
    if heads % kv:
        raise ValueError(f"num_attention_heads={heads} is not a multiple of num_key_value_heads={kv}")
    return heads // kv


def _repeat_heads(w: torch.Tensor, rep: int, head_dim: int) -> torch.Tensor:
    """Repeat output rows head by head: ``[kv*hd, ...]`` -> ``[kv*rep*hd, ...]`` (head j -> heads j*rep..j*rep+rep-1)."""
    if rep == 1:
        return w
    kv = w.shape[0] // head_dim
    return w.reshape(kv, head_dim, *w.shape[1:]).repeat_interleave(rep, dim=0).reshape(kv * rep * head_dim,
                                                                                       *w.shape[1:])


def _head_dim(config: Mapping[str, object]) -> int:
    heads = int(config["num_attention_heads"])  # type: ignore[arg-type]
    hd = config.get("head_dim")
    hidden = int(config["hidden_size"])  # type: ignore[arg-type]
    if hd is not None and int(hd) * heads != hidden:  # type: ignore[arg-type]
        raise ValueError(f"S-LoRA needs head_dim * num_attention_heads == hidden_size (got {hd} * {heads} != {hidden})")
    return hidden // heads


def expand_state_dict_gqa(tensors: Mapping[str, torch.Tensor], config: Mapping[str, object]) -> dict[str, torch.Tensor]:
    """Base weights with every ``k_proj``/``v_proj`` weight (and bias) repeated per head group (see module doc)."""
    rep, hd = kv_repeat(config), _head_dim(config)
    out: dict[str, torch.Tensor] = {}
    for key, t in tensors.items():
        if rep > 1 and (".k_proj." in key or ".v_proj." in key):
            t = _repeat_heads(t, rep, hd)
        out[key] = t
    return out


def expand_lora_pair(module: str, a: torch.Tensor, b: torch.Tensor,
                     config: Mapping[str, object]) -> tuple[torch.Tensor, torch.Tensor]:
    """``(A, B)`` of one module for the MHA-expanded model: k/v B rows repeated per head group, A unchanged."""
    rep = kv_repeat(config)
    if rep > 1 and module in ("k_proj", "v_proj"):
        b = _repeat_heads(b, rep, _head_dim(config))
    return a, b


def _pairs(state: LoraAdapterState) -> dict[tuple[int, str], tuple[torch.Tensor, torch.Tensor]]:
    pairs: dict[tuple[int, str], tuple[torch.Tensor, torch.Tensor]] = {}
    for key, t in state.tensors.items():
        layer, module, ab = parse_peft_key(key)
        short = module.rsplit(".", 1)[-1]
        if short not in SLORA_MODULES:
            raise UnsupportedAdapterError(
                f"adapter {state.name!r} has LoRA on {module!r}; S-LoRA applies LoRA to "
                f"{', '.join(SLORA_MODULES)} only: set the job's lora.target_modules to a subset of those")
        if ab == "A":
            pairs[(layer, short)] = (t, state.tensors[key[: -len("A.weight")] + "B.weight"])
    return pairs


def pool_rows(state: LoraAdapterState, config: Mapping[str, object],
              dtype: torch.dtype = torch.float16) -> list[torch.Tensor]:
    """Per layer, the ``[2, 4r, heads, head_dim]`` block S-LoRA keeps for this adapter (see module doc).

    Every layer must carry all four projections: S-LoRA's loader builds the block from q, k, v and o and fails on
    a missing one, so a partial adapter is refused here with the reason instead."""
    heads, hd = int(config["num_attention_heads"]), _head_dim(config)  # type: ignore[arg-type]
    layers = int(config["num_hidden_layers"])  # type: ignore[arg-type]
    pairs = _pairs(state)
    r = state.config.r
    out = []
    for li in range(layers):
        a_rows, b_rows = [], []
        for m in SLORA_MODULES:
            if (li, m) not in pairs:
                raise UnsupportedAdapterError(
                    f"adapter {state.name!r}: layer {li} has no LoRA on {m}; S-LoRA needs q_proj, k_proj, v_proj and "
                    "o_proj on every layer (target_modules: [q_proj, k_proj, v_proj, o_proj])")
            a, b = expand_lora_pair(m, *pairs[(li, m)], config)
            if a.shape[0] != r or b.shape[1] != r:
                raise UnsupportedAdapterError(f"adapter {state.name!r}: layer {li} {m} has rank {a.shape[0]}, "
                                              f"its config says r={r}")
            a_rows.append(a.detach().to("cpu", torch.float32).reshape(r, heads, hd))
            # B [out, r] row-major, cut into r rows of `out` elements: the expand kernel's addressing.
            b_rows.append(b.detach().to("cpu", torch.float32).contiguous().reshape(r, heads, hd))
        out.append(torch.stack([torch.cat(a_rows), torch.cat(b_rows)]).to(dtype))
    return out


def peft_from_pool_rows(rows: list[torch.Tensor], r: int, config: Mapping[str, object],
                        layers_path: str = "base_model.model.model.layers") -> dict[str, torch.Tensor]:
    """Inverse of :func:`pool_rows` for an MHA model: PEFT tensors (``A [r, in]``, ``B [out, r]``) per layer."""
    hidden = int(config["hidden_size"])  # type: ignore[arg-type]
    tensors: dict[str, torch.Tensor] = {}
    for li, block in enumerate(rows):
        for qi, m in enumerate(SLORA_MODULES):
            a = block[0, qi * r:(qi + 1) * r].reshape(r, hidden)
            b = block[1, qi * r:(qi + 1) * r].reshape(hidden, r)
            tensors[f"{layers_path}.{li}.self_attn.{m}.lora_A.weight"] = a.clone()
            tensors[f"{layers_path}.{li}.self_attn.{m}.lora_B.weight"] = b.clone()
    return tensors


def slora_dir_name(name: str, index: int) -> str:
    """A folder name S-LoRA keeps as given: its ``get_lora_config`` strips a trailing ``-<digits>``."""
    safe = "".join(c if c.isalnum() or c in "._" else "_" for c in name)
    return f"a{index:03d}_{safe}_lora"


def write_slora_adapter(state: LoraAdapterState, config: Mapping[str, object], directory: Path) -> Path:
    """A PEFT folder S-LoRA's loader reads (``adapter_config.json`` + safetensors) for the MHA-expanded model."""
    from safetensors.torch import save_file

    pairs = _pairs(state)
    tensors: dict[str, torch.Tensor] = {}
    for (li, m), (a, b) in sorted(pairs.items()):
        a, b = expand_lora_pair(m, a, b, config)
        prefix = f"base_model.model.model.layers.{li}.self_attn.{m}"
        tensors[f"{prefix}.lora_A.weight"] = a.detach().to("cpu", torch.float16).contiguous()
        tensors[f"{prefix}.lora_B.weight"] = b.detach().to("cpu", torch.float16).contiguous()
    directory.mkdir(parents=True, exist_ok=True)
    save_file(tensors, str(directory / "adapter_model.safetensors"))
    cfg = state.config.peft_config_dict(state.base_model_path)
    (directory / "adapter_config.json").write_text(json.dumps(cfg, indent=2))
    return directory


# transformers 5 keeps the chat template in its own file; without it the copy cannot format a fine-tuning dataset.
_TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "generation_config.json",
                    "chat_template.jinja", "chat_template.json")


def write_mha_checkpoint(model_dir: Path, out_dir: Path) -> tuple[Path, dict[str, object]]:
    """Copy a Llama checkpoint for S-LoRA: fp16 safetensors, K/V heads expanded to MHA, ``rope_theta`` explicit.

    Returns the folder and its config. Idempotent per source folder (a stamp records the source's mtime)."""
    from safetensors.torch import load_file, save_file

    cfg = json.loads((model_dir / "config.json").read_text())
    if cfg.get("model_type") != "llama":
        raise ValueError(f"S-LoRA serves Llama checkpoints only; {model_dir} is model_type={cfg.get('model_type')!r}")
    # "files" is part of the stamp so that a copy made before a file joined _TOKENIZER_FILES is rewritten.
    stamp = {"source": str(model_dir.resolve()),
             "mtime": max(p.stat().st_mtime for p in model_dir.glob("*.safetensors")),
             "files": list(_TOKENIZER_FILES)}
    marker = out_dir / "deltaserve_slora.json"
    if marker.is_file() and json.loads(marker.read_text()) == stamp:
        return out_dir, json.loads((out_dir / "config.json").read_text())
    if out_dir.exists():
        shutil.rmtree(out_dir)
    out_dir.mkdir(parents=True)
    tensors: dict[str, torch.Tensor] = {}
    for f in sorted(model_dir.glob("*.safetensors")):
        tensors.update(load_file(str(f)))
    tensors = {k: v.to(torch.float16).contiguous() for k, v in expand_state_dict_gqa(tensors, cfg).items()}
    save_file(tensors, str(out_dir / "model.safetensors"))
    new_cfg = dict(cfg)
    new_cfg["num_key_value_heads"] = cfg["num_attention_heads"]
    # transformers 5 writes rope_parameters; S-LoRA reads rope_theta (default 10000).
    rope = cfg.get("rope_parameters") or {}
    new_cfg["rope_theta"] = float(cfg.get("rope_theta") or rope.get("rope_theta") or 10000.0)
    if (rope.get("rope_type") or "default") != "default" or cfg.get("rope_scaling"):
        raise ValueError("S-LoRA's rotary embedding is plain RoPE; this checkpoint uses rope scaling")
    new_cfg["torch_dtype"] = "float16"
    (out_dir / "config.json").write_text(json.dumps(new_cfg, indent=2))
    for extra in _TOKENIZER_FILES:
        if (model_dir / extra).is_file():
            shutil.copy(model_dir / extra, out_dir / extra)
    marker.write_text(json.dumps(stamp))
    return out_dir, new_cfg
