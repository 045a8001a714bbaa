"""Patch: vLLM's PyTorch LoRA ops apply the last LoRA slot to base-model rows (vLLM 0.26-0.32, CPU).

The bug. vLLM marks a token that uses no adapter with LoRA index ``-1``. The Triton kernels (CUDA) skip such
tokens; the PyTorch ops that :class:`~vllm.lora.punica_wrapper.punica_cpu.PunicaWrapperCPU` runs on CPU do
``lora_weights[lora_indices]``, and index ``-1`` selects the *last* slot. That slot holds zeros until
``max_loras`` adapters are active at once; from then on, every base-model row in a step that also carries a LoRA
row gets that adapter's delta. Base-only steps are unaffected (the prefill path returns early when no row uses
an adapter), which is why a plain vLLM-CPU user rarely sees it.

Why DeltaServe must fix it. Co-serving puts fine-tuning rows on the reserved adapter into client steps, and
publishing loads new adapter versions (``add_lora`` activates each one into a slot), so steps with a LoRA row and
a full set of slots become the common case: ``tests/test_serve.py`` caught base-model clients getting a published
version's output. The exactness promise (a client gets what it would get without DeltaServe) needs the fix.

How. The three gather-and-apply ops (``bgmv_shrink``, ``bgmv_expand``, ``bgmv_expand_slice``; the ``sgmv_*``
variants call them through their module globals) are wrapped: rows whose index is negative are copied before the
op and written back after it, bit for bit, so they receive no delta at all. Rows of adapters are untouched; steps
without a negative index pay one comparison. Applied in the worker process when DeltaServe attaches
(:meth:`deltaserve_vllm.worker.DeltaServeWorkerExtension.deltaserve_attach`) and only where the platform runs
``PunicaWrapperCPU``; :func:`remove` restores vLLM's functions (the test that reproduces the stock bug uses it).

When it can go away: when the torch ops (or ``PunicaWrapperCPU``) skip negative indices upstream.
``tests/test_vllm_host.py::test_stock_vllm_cpu_gives_base_rows_the_last_lora_slot`` reproduces the stock bug with
the patch removed and fails once vLLM no longer has it.
"""

from __future__ import annotations

import functools
import importlib
import logging
from collections.abc import Callable
from typing import Any

import torch

__all__ = ["PATCHED_OPS", "apply", "is_applied", "remove"]

#: Functions wrapped, and where their names are bound (each binding is replaced: callers look them up there).
PATCHED_OPS = ("bgmv_shrink", "bgmv_expand", "bgmv_expand_slice")
_MODULES = ("vllm.lora.ops.torch_ops.lora_ops", "vllm.lora.ops.torch_ops", "vllm.lora.punica_wrapper.punica_cpu")
_MARK = "__deltaserve_base_rows_fix__"
_CPU_WRAPPER = "vllm.lora.punica_wrapper.punica_cpu.PunicaWrapperCPU"
log = logging.getLogger("deltaserve.vllm")


def _keep_base_rows(op: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(op)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        output = args[2] if len(args) > 2 else kwargs["output_tensor"]
        indices = args[3] if len(args) > 3 else kwargs["lora_indices_tensor"]
        if indices.numel() == 1:  # one index for the whole output (the ops broadcast it)
            if int(indices.reshape(()).item()) >= 0:
                return op(*args, **kwargs)
            rows = torch.arange(output.shape[0], device=output.device)
        else:
            rows = torch.nonzero(indices[:output.shape[0]] < 0).squeeze(1)
            if rows.numel() == 0:
                return op(*args, **kwargs)
        kept = output.index_select(0, rows)
        result = op(*args, **kwargs)
        output.index_copy_(0, rows, kept)
        return result

    setattr(wrapper, _MARK, True)
    return wrapper


def _needed() -> bool:
    from vllm.platforms import current_platform

    return current_platform.get_punica_wrapper() == _CPU_WRAPPER


def is_applied() -> bool:
    ops = importlib.import_module(_MODULES[0])
    return getattr(ops.bgmv_shrink, _MARK, False)


def apply() -> bool:
    """Wrap the ops once per process where the platform uses ``PunicaWrapperCPU``. Returns whether it is applied."""
    if is_applied():
        return True
    if not _needed():
        return False
    wrapped = {name: _keep_base_rows(getattr(importlib.import_module(_MODULES[0]), name)) for name in PATCHED_OPS}
    for module_name in _MODULES:
        module = importlib.import_module(module_name)
        for name, fn in wrapped.items():
            if hasattr(module, name):
                setattr(module, name, fn)
    log.info("DeltaServe: patched vLLM's CPU LoRA ops %s so base-model rows never get the last LoRA slot's adapter "
             "(a vLLM-CPU bug; docs/vllm-adapter.md)", ", ".join(PATCHED_OPS))
    return True


def remove() -> None:
    """Restore vLLM's own functions."""
    if not is_applied():
        return
    ops = importlib.import_module(_MODULES[0])
    originals = {name: getattr(ops, name).__wrapped__ for name in PATCHED_OPS}
    for module_name in _MODULES:
        module = importlib.import_module(module_name)
        for name, fn in originals.items():
            if hasattr(module, name):
                setattr(module, name, fn)
