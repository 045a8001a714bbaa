"""Registry entry for the SGLang host (entry point ``deltaserve.hosts: sglang``). Imports nothing of SGLang."""

from __future__ import annotations

from deltaserve_core.registry import HostSpec

__all__ = ["SPEC"]

SPEC = HostSpec(
    name="sglang",
    description="SGLang (unmodified) through its sglang.srt.plugins hooks",
    factory="deltaserve_sglang.host:SglangHost",
    install_command="bash scripts/setup_sglang.sh  (builds .venv-sglang: torch 2.13.0 CPU + sglang==0.5.23 --no-deps)",
    engine_distributions=("sglang",),
    # The registry's coarse gate; the adapter then insists on the exact tested builds (versions.py).
    supported=">=0.5.23,<0.5.24",
    patches="deltaserve_sglang.patch_record:PATCHES",
    notes="in-process scheduler driven step by step (driver path); CPU engine; plugin hooks also load in "
          "`sglang serve` processes",
)
