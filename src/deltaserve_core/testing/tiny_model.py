"""Small real checkpoints built offline, for tests, the conformance suite and CPU demos.

No machine here reaches a model hub, so tests build a random-weight Llama (any Llama-style family works the
same way through transformers) with a byte-level BPE tokenizer trained on a few sentences, and save both as
an ordinary ``save_pretrained`` folder that vLLM, SGLang, transformers and PEFT all load.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import torch

from deltaserve_core.adapter_state import install_folder

__all__ = ["build_tiny_llama", "build_lora_adapter", "TINY_CHAT_TEMPLATE"]

# A ChatML-style template: close to what SmolLM2/Qwen ship, so formatting code is exercised the same way.
TINY_CHAT_TEMPLATE = (
    "{% for message in messages %}<|im_start|>{{ message['role'] }}\n{{ message['content'] }}<|im_end|>\n"
    "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)

_CORPUS = [
    "The quick brown fox jumps over the lazy dog.",
    "Continuous batching keeps the accelerator busy while requests come and go.",
    "Low-rank adapters fine-tune a large model by training two small matrices per layer.",
    "Give three tips for staying healthy. Eat well, sleep enough, and move every day.",
    "What is the capital of France? The capital of France is Paris.",
    "Instruction: summarise the text. Response: a short summary of the text follows here.",
]


def _train_tokenizer(vocab_size: int):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE(unk_token=None))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    specials = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=specials,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tok.train_from_iterator(_CORPUS * 4, trainer=trainer)
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<|im_start|>", eos_token="<|im_end|>",
                                   pad_token="<|endoftext|>", unk_token="<|endoftext|>")
    fast.chat_template = TINY_CHAT_TEMPLATE
    return fast


def build_tiny_llama(directory: str | os.PathLike[str], *, num_layers: int = 2, hidden_size: int = 128,
                     num_heads: int = 4, num_kv_heads: int = 2, intermediate_size: int = 256,
                     vocab_size: int = 512, max_position_embeddings: int = 1024, seed: int = 0,
                     dtype: torch.dtype = torch.float32, head_dim: int | None = None, attention_bias: bool = False,
                     tie_word_embeddings: bool = False, rope_theta: float = 10000.0,
                     model_vocab_size: int | None = None,
                     generation_config: dict[str, float | int] | None = None,
                     rope_scaling: dict[str, float | str] | None = None,
                     extra_eos_token_ids: tuple[int, ...] | None = None) -> Path:
    """Write a random-weight ``LlamaForCausalLM`` + tokenizer folder (idempotent: reuses a matching folder).

    ``vocab_size`` is the tokenizer's BPE target; ``model_vocab_size`` widens the model's embedding and head past the
    tokenizer (as Qwen's and Llama-3's checkpoints do), so token ids the tokenizer never emits still reach the model.
    ``attention_bias`` gives q/k/v/o random non-zero biases; ``generation_config`` is written as the checkpoint's
    ``generation_config.json`` (sampling defaults an engine may pick up); ``rope_scaling`` adds RoPE scaling parameters
(e.g. Llama-3.1's ``{"rope_type": "llama3", "factor": 8.0, ...}``) to the rope base; ``extra_eos_token_ids`` makes
``eos_token_id`` a list, the tokenizer's EOS first and then these, in config.json and generation_config.json alike (as
Llama-3 Instruct and Qwen2.5 ship it)."""
    from transformers import LlamaConfig, LlamaForCausalLM

    out = Path(directory)
    stamp = {"num_layers": num_layers, "hidden_size": hidden_size, "num_heads": num_heads,
             "num_kv_heads": num_kv_heads, "intermediate_size": intermediate_size, "vocab_size": vocab_size,
             "seed": seed, "dtype": str(dtype), "max_position_embeddings": max_position_embeddings}
    variations = {"head_dim": head_dim, "attention_bias": attention_bias or None,
                  "tie_word_embeddings": tie_word_embeddings or None,
                  "rope_theta": rope_theta if rope_theta != 10000.0 else None, "model_vocab_size": model_vocab_size,
                  "generation_config": generation_config, "rope_scaling": rope_scaling,
                  "extra_eos_token_ids": list(extra_eos_token_ids) if extra_eos_token_ids else None}
    stamp.update({k: v for k, v in variations.items() if v is not None})  # the default model's stamp is unchanged
    marker = out / "deltaserve_tiny.json"

    def built(folder: Path) -> bool:
        m = folder / "deltaserve_tiny.json"
        return m.is_file() and json.loads(m.read_text()) == stamp

    if built(out):
        return out
    with _building(out) as staging:
        tokenizer = _train_tokenizer(vocab_size)
        eos = [tokenizer.eos_token_id, *extra_eos_token_ids] if extra_eos_token_ids else tokenizer.eos_token_id
        config = LlamaConfig(
            vocab_size=max(len(tokenizer), model_vocab_size or 0), hidden_size=hidden_size,
            intermediate_size=intermediate_size, num_hidden_layers=num_layers, num_attention_heads=num_heads,
            num_key_value_heads=num_kv_heads, head_dim=head_dim or hidden_size // num_heads,
            max_position_embeddings=max_position_embeddings, rms_norm_eps=1e-5, attention_bias=attention_bias,
            rope_parameters={"rope_type": "default", "rope_theta": float(rope_theta), **(rope_scaling or {})},
            tie_word_embeddings=tie_word_embeddings, bos_token_id=tokenizer.bos_token_id,
            eos_token_id=eos, pad_token_id=tokenizer.pad_token_id,
        )
        torch.manual_seed(seed)
        model = LlamaForCausalLM(config).to(dtype)
        with torch.no_grad():  # wider init than HF's default so random models produce varied greedy text
            for name, p in model.named_parameters():
                if p.dim() == 2:
                    p.normal_(0.0, 0.08)
                elif name.endswith(".bias"):  # HF starts biases at zero, which no bug that drops them could show
                    p.normal_(0.0, 0.08)
        model.save_pretrained(staging, safe_serialization=True)
        tokenizer.save_pretrained(staging)
        if generation_config is not None:
            (staging / "generation_config.json").write_text(json.dumps(
                {"bos_token_id": tokenizer.bos_token_id, "eos_token_id": eos, **generation_config},
                indent=2))
        (staging / marker.name).write_text(json.dumps(stamp))
        return install_folder(staging, out, keep=built)


def build_lora_adapter(model_dir: str | os.PathLike[str], directory: str | os.PathLike[str], *, r: int = 8,
                       lora_alpha: float = 16.0, target_modules: tuple[str, ...] = ("q_proj", "k_proj", "v_proj", "o_proj"),
                       seed: int = 1, scale: float = 0.05) -> Path:
    """Write a PEFT LoRA adapter for ``model_dir`` with random non-zero A *and* B (so it changes outputs)."""
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    out = Path(directory)
    model_stamp = Path(model_dir) / "deltaserve_tiny.json"
    stamp = {"r": r, "lora_alpha": lora_alpha, "target_modules": list(target_modules), "seed": seed, "scale": scale,
             "model": json.loads(model_stamp.read_text()) if model_stamp.is_file() else str(model_dir)}

    def built(folder: Path) -> bool:  # a folder made for another checkpoint or other settings is rebuilt
        m = folder / "deltaserve_lora.json"
        return (folder / "adapter_model.safetensors").is_file() and m.is_file() and json.loads(m.read_text()) == stamp

    if built(out):
        return out
    with _building(out) as staging:
        base = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
        model = get_peft_model(base, LoraConfig(r=r, lora_alpha=lora_alpha, target_modules=list(target_modules),
                                                lora_dropout=0.0, task_type="CAUSAL_LM"))
        gen = torch.Generator().manual_seed(seed)
        with torch.no_grad():
            for name, p in model.named_parameters():
                if "lora_" in name:
                    p.copy_(torch.randn(p.shape, generator=gen) * scale)
        model.save_pretrained(staging)
        (staging / "deltaserve_lora.json").write_text(json.dumps(stamp))
        return install_folder(staging, out, keep=built)


@contextmanager
def _building(out: Path) -> Iterator[Path]:
    """A fresh folder beside ``out`` to build in; removed if the build fails."""
    out.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{out.name}.", suffix=".building", dir=out.parent))
    staging.chmod(0o755)  # mkdtemp's 0700 would travel with the rename
    try:
        yield staging
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
