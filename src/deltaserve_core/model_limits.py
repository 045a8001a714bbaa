"""What a checkpoint's ``config.json`` says about the steps an engine can run on it (context length, dtype).

Read from the file, not through transformers, so ``deltaserve calibrate`` can check its arguments against the model
before anything heavy is imported.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path

__all__ = ["ModelLimits", "model_limits"]

#: config.json keys that bound a sequence's length, as engines read them (vLLM takes the smallest it finds).
_CONTEXT_KEYS = ("max_position_embeddings", "n_positions", "max_seq_len", "seq_length", "max_sequence_length",
                 "max_seq_length", "seq_len", "model_max_length")
_CONFIG_DTYPES = {"float32": "float32", "bfloat16": "bfloat16", "float16": "float16", "torch.float32": "float32",
                  "torch.bfloat16": "bfloat16", "torch.float16": "float16", "float": "float32", "half": "float16"}


@dataclass(frozen=True, slots=True)
class ModelLimits:
    """What a checkpoint's ``config.json`` says about the steps an engine can run on it.

    ``context_length``: tokens one sequence may hold (``None`` when the config names no limit), read from
    ``context_key``; ``dtype``: the weights' dtype as ``float32``/``bfloat16``/``float16`` (``None`` when absent
    or another one). Read from the file, not through transformers, so ``deltaserve calibrate`` can check its
    limits before anything heavy is imported.
    """

    context_length: int | None
    context_key: str | None
    dtype: str | None
    config_path: Path

    @property
    def max_prompt(self) -> int | None:
        """Longest prompt of a profile step: vLLM refuses a prompt that leaves no room for the one token its
        prefill samples (a prompt of ``context_length`` tokens is refused at submission)."""
        return None if self.context_length is None else self.context_length - 1

    @property
    def max_decode_context(self) -> int | None:
        """Longest per-request context of a profiled decode row: the row's prefill samples one token and the
        profiled step decodes one more, so ``context_length - 1`` finishes at the prefill ("length") and never
        reaches the profiled step."""
        return None if self.context_length is None else self.context_length - 2


def model_limits(model_dir: str | os.PathLike[str]) -> ModelLimits:
    """The :class:`ModelLimits` of the checkpoint folder ``model_dir`` (its ``config.json``; a nested
    ``text_config`` of a multimodal config counts too). Raises ``FileNotFoundError`` without a readable config."""
    path = Path(model_dir) / "config.json"
    try:
        config = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise FileNotFoundError(f"cannot read the model's config {path}: {exc}") from exc
    sections = [config] + [config[k] for k in ("text_config", "llm_config") if isinstance(config.get(k), dict)]
    found = [(int(section[key]), key) for section in sections for key in _CONTEXT_KEYS
             if isinstance(section.get(key), int) and not isinstance(section.get(key), bool) and section[key] > 2]
    context, key = min(found) if found else (None, None)
    raw = next((section.get(k) for section in sections for k in ("dtype", "torch_dtype") if section.get(k)), None)
    return ModelLimits(context_length=context, context_key=key,
                       dtype=_CONFIG_DTYPES.get(str(raw)) if raw is not None else None, config_path=path)
