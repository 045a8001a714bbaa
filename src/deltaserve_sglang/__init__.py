"""DeltaServe adapter for SGLang: co-serve LoRA fine-tuning inside an unmodified SGLang.

The adapter only translates; every policy lives in :mod:`deltaserve_core`. It attaches through SGLang's plugin
system (entry-point group ``sglang.srt.plugins``, ``HookRegistry`` AROUND hooks), with no fork and no edited
SGLang file:

- :mod:`deltaserve_sglang.plugin`: ``register()`` (the entry point) and ``verify_hooks()``; the hook list;
- :mod:`deltaserve_sglang.binding`: what the hooks do on a scheduler DeltaServe is attached to;
- :mod:`deltaserve_sglang.host`: :class:`~deltaserve_sglang.host.SglangHost`, the ``HostHooks`` + ``HostDriver``
  object the registry creates (``deltaserve conformance sglang``);
- :mod:`deltaserve_sglang.serving`: the operator path (``DELTASERVE_JOB=job.yaml python -m sglang.launch_server ...``):
  co-serving started inside SGLang's scheduler process.

Every SGLang internal touched is listed in ``docs/sglang-adapter.md``. Importing this package does not import
SGLang.
"""

from __future__ import annotations

from .versions import SUPPORTED_VERSIONS, UnsupportedSglangError, check_supported_sglang

__all__ = ["SUPPORTED_VERSIONS", "UnsupportedSglangError", "check_supported_sglang"]
