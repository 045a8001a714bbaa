"""DeltaServe core: host-agnostic co-serving of LoRA fine-tuning inside a running inference engine.

The host protocol lives in :mod:`deltaserve_core.hooks`, the data that crosses it in :mod:`deltaserve_core.types`,
and host discovery in :mod:`deltaserve_core.registry`. Engine adapters live in their own packages
(``deltaserve_vllm``, ``deltaserve_sglang``, ``deltaserve_slora``).
"""

from .types import (
    PROTOCOL_VERSION,
    ExecutionMode,
    FineTuneSample,
    HostCapabilities,
    ModelSpec,
    ProfileShape,
    ProposedBatch,
    RequestSLO,
    ScheduledRequest,
    StepRecord,
)

__version__ = "0.1.0"

# The protocol names from .hooks are loaded on first use: hooks imports torch, and a command that only reads a
# job config (and refuses it) should not pay seconds of torch import first.
_FROM_HOOKS = frozenset({"RESERVED_ADAPTER_NAME", "ActivationSink", "HostHooks", "HostProtocolError",
                         "ReservedAdapterError", "ScheduleInterceptor", "StepSink", "validate_host"})


def __getattr__(name: str) -> object:
    if name in _FROM_HOOKS:
        from . import hooks

        return getattr(hooks, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")

__all__ = [
    "__version__",
    "PROTOCOL_VERSION",
    "RESERVED_ADAPTER_NAME",
    "ActivationSink",
    "ExecutionMode",
    "FineTuneSample",
    "HostCapabilities",
    "HostHooks",
    "HostProtocolError",
    "ModelSpec",
    "ProfileShape",
    "ProposedBatch",
    "RequestSLO",
    "ReservedAdapterError",
    "ScheduleInterceptor",
    "ScheduledRequest",
    "StepRecord",
    "StepSink",
    "validate_host",
]
