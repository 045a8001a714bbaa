"""Registry entry for the SGLang host (entry point ``deltaserve.hosts: sglang``). Imports nothing of SGLang."""

from __future__ import annotations

from deltaserve_core.registry import HostSpec

__all__ = ["SPEC"]

SPEC = HostSpec(
    name="sglang",
    description="SGLang (unmodified) through its sglang.srt.plugins hooks",
    factory="deltaserve_sglang.host:SglangHost",
    install_command="bash scripts/setup_sglang.sh  (builds .venv-sglang: torch 2.13.0 CPU + sglang==0.5.23 --no-deps); "
                    "CUDA with torch 2.11: sglang==0.5.15 (benchmarks/gpu/prepare_sglang_h200.sh)",
    engine_distributions=("sglang",),
    # The registry's coarse gate (both ends tested: 0.5.15 on CUDA, 0.5.23 on CPU); the adapter then compares the
    # hooked internals with both ends at start-up (versions.check_hook_shapes).
    supported=">=0.5.15,<=0.5.23",
    patches="deltaserve_sglang.patch_record:PATCHES",
    operator_command="deltaserve_sglang.launch:operator_command",
    notes="in-process scheduler driven step by step (driver path); CPU engine (0.5.23) or CUDA (0.5.15: SGLang's "
          "CUDA graphs for inference-only steps, eager for steps with fine-tuning rows); plugin hooks also load in "
          "`sglang serve` processes",
)
