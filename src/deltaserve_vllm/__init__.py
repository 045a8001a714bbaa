"""DeltaServe adapter for vLLM: co-serve LoRA fine-tuning inside an unmodified vLLM engine.

The adapter only translates; every policy (admission, pricing, training) lives in :mod:`deltaserve_core`.
It attaches through vLLM's own extension points, with no fork and no edited vLLM file:

- :mod:`deltaserve_vllm.scheduler`: a ``scheduler_cls`` subclass that offers every proposed step to the core
  and injects fine-tuning samples into that same step as internal prefill-only requests on the reserved LoRA;
- :mod:`deltaserve_vllm.worker`: a ``worker_extension_cls`` whose layer pre-hooks feed the activation sink,
  poll the abort flag and time ``execute_model``;
- :mod:`deltaserve_vllm.host`: :class:`~deltaserve_vllm.host.VllmHost`, the ``HostHooks`` + ``HostDriver``
  object the registry creates (``deltaserve conformance vllm``).

Every vLLM internal touched is listed in ``docs/vllm-adapter.md``. Importing this package does not import vLLM.
"""

from __future__ import annotations

from .versions import SUPPORTED_ENGINES, UnsupportedVllmError, check_supported_vllm

__all__ = ["SUPPORTED_ENGINES", "UnsupportedVllmError", "check_supported_vllm"]
