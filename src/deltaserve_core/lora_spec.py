"""The LoRA hyper-parameters of a job, apart from the tensors (:mod:`.adapter_state`) so that reading and
validating a job config needs no torch: a refused config is then answered in well under a second of imports."""

from __future__ import annotations

import math
from dataclasses import dataclass

__all__ = ["LoraConfigSpec"]


@dataclass(frozen=True, slots=True)
class LoraConfigSpec:
    """LoRA hyper-parameters of the fine-tuning job (mirrors ``peft.LoraConfig``'s fields of the same names)."""

    r: int = 8
    lora_alpha: float = 16.0
    target_modules: tuple[str, ...] = ("q_proj", "k_proj", "v_proj", "o_proj")
    lora_dropout: float = 0.0

    def __post_init__(self) -> None:
        if not isinstance(self.r, int) or isinstance(self.r, bool) or self.r <= 0:
            raise ValueError(f"LoRA rank r must be a positive integer, got {self.r!r}")
        if isinstance(self.target_modules, str):  # tuple("q_proj") would be six one-letter module names
            raise ValueError(f"target_modules must be a sequence of module names, got the string "
                             f"{self.target_modules!r}")
        if not math.isfinite(self.lora_alpha) or self.lora_alpha <= 0:
            raise ValueError(f"lora_alpha must be positive, got {self.lora_alpha}")
        if not self.target_modules:
            raise ValueError("target_modules must name at least one linear layer, e.g. ['q_proj', 'v_proj']")
        if not 0.0 <= self.lora_dropout < 1.0:
            raise ValueError(f"lora_dropout must be in [0, 1), got {self.lora_dropout}")

    @property
    def scaling(self) -> float:
        return self.lora_alpha / self.r

    def peft_config_dict(self, base_model_path: str) -> dict[str, object]:
        return {
            "peft_type": "LORA",
            "task_type": "CAUSAL_LM",
            "r": self.r,
            "lora_alpha": self.lora_alpha,
            "lora_dropout": self.lora_dropout,
            "target_modules": list(self.target_modules),
            "bias": "none",
            "base_model_name_or_path": base_model_path,
            "inference_mode": True,
            "fan_in_fan_out": False,
            "use_rslora": False,
            "use_dora": False,
        }
