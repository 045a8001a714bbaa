"""Registry entry for the S-LoRA host (entry point ``deltaserve.hosts: slora``). Imports nothing of S-LoRA."""

from __future__ import annotations

from deltaserve_core.registry import HostSpec

__all__ = ["SPEC"]

SPEC = HostSpec(
    name="slora",
    description="S-LoRA (unmodified checkout) with run-time patches applied before its router steps",
    factory="deltaserve_slora.host:SloraHost",
    # S-LoRA is on no package registry: the host locates a checkout (deltaserve_slora.locate), so no distribution
    # gates it here; the commit/attach-file check runs when the host starts.
    install_command=("git clone https://github.com/S-LoRA/S-LoRA && build its CUDA extension, then "
                     "--option slora_path=PATH or DELTASERVE_SLORA_PATH=PATH (see docs/slora-adapter.md)"),
    engine_distributions=(),
    patches="deltaserve_slora.patches:PATCHES",
    operator_command="deltaserve_slora.launch:operator_command",
    notes="CUDA + fp16 only; in-process router (TP=1); prefill and decode never mixed; eager only; tested at "
          "S-LoRA c1ddf48",
    static_capabilities={"mixed_batches": "no", "graph_modes": "eager", "abort": "no", "devices": "cuda",
                         "dtypes": "float16"},
)
