"""Broken host (prefix cache): re-publishing a resident name replaces the weights but keeps its cached KV.

Rule (hooks.py, HostHooks.publish_adapter): "A host must never serve KV computed with older weights under the returned
name (publish under a fresh name/version or reset its prefix cache)." ... "a second publish of the same name and
version (a restarted job redoing a step) replaces them."

Bug: prefix-cache invalidation sits in the adapter's slot-allocation path, which runs only for a name that is not
resident yet; a second publish of a resident ``job@vN`` (a restarted job redoing step N with different data order,
or republishing from disk) overwrites the slot's weights in place and skips the invalidation. Prompts sharing whole
blocks with those served before read KV computed with the first weights.

Trigger: a second publish of the same name and version, then a prompt sharing >= 16 tokens with one served on it.
Base: ``_prefix_cache.PrefixCacheHost`` (correct: every publish drops the name's entries).
"""
from __future__ import annotations

import time  # noqa: F401
from collections.abc import Sequence  # noqa: F401
from dataclasses import replace  # noqa: F401

import torch  # noqa: F401
import torch.nn.functional as F  # noqa: F401

from deltaserve_core.driver import ClientOutput  # noqa: F401
from deltaserve_core.hooks import RESERVED_ADAPTER_NAME  # noqa: F401
from deltaserve_core.testing.reference_host import ReferenceHost, _Lora, _Row, _Seq  # noqa: F401
from deltaserve_core.types import ExecutionMode, FineTuneSample, ProposedBatch, StepRecord  # noqa: F401
from blindhosts._prefix_cache import PrefixCacheHost
from deltaserve_core.hostkit import published_name



class Host(PrefixCacheHost):
    def publish_adapter(self, state) -> str:
        name = published_name(state.name, state.version)
        fresh = name not in self._adapters
        self._adapters[name] = self._to_lora(state)
        if fresh:  # BUG: invalidation only when a slot is allocated; a resident name is updated in place
            self._drop_prefix(name)
        return name
