"""DeltaServe's Prometheus metrics on ``vllm serve``'s own ``/metrics`` (:mod:`deltaserve_core.metrics`).

The CoServer runs in the EngineCore process; ``/metrics`` is served by the API server process, from
``vllm.v1.metrics.prometheus.get_prometheus_registry()``:

- with one API server (vLLM's default) that is prometheus_client's in-memory global ``REGISTRY``. The API server
  (:func:`install_api_server_collector`, from the plugin's engine-config hook) makes a private folder, registers
  in ``REGISTRY`` a collector that reads the snapshot file there at each scrape, and passes the file's path to the
  EngineCore in ``additional_config``; the EngineCore's exporter replaces that file every second;
- with ``PROMETHEUS_MULTIPROC_DIR`` set (vLLM sets it for ``--api-server-count`` > 1, before it spawns the
  EngineCore, or the operator did) it is a ``MultiProcessCollector`` over that folder: the EngineCore, which
  inherits the variable, writes its metrics there in prometheus_client's multiprocess format and no collector is
  registered in the API server.

Either way no route is added to vLLM's server and no port is opened.
"""

from __future__ import annotations

import atexit
import logging
import os
import shutil
import tempfile
from pathlib import Path

__all__ = ["METRICS_FILE_KEY", "install_api_server_collector"]

log = logging.getLogger("deltaserve.vllm")

#: key next to ``job`` in ``--additional-config "deltaserve"`` that carries the snapshot file to the EngineCore
METRICS_FILE_KEY = "metrics_file"
_INSTALLED: dict[str, str] = {}


def install_api_server_collector() -> str | None:
    """In the API server process: the snapshot file the EngineCore is to write, its collector registered in
    prometheus_client's ``REGISTRY`` (once per process); ``None`` in multiprocess mode, where none is needed."""
    if os.environ.get("PROMETHEUS_MULTIPROC_DIR"):
        return None
    if "path" in _INSTALLED:
        return _INSTALLED["path"]
    from prometheus_client import REGISTRY

    from deltaserve_core.metrics import snapshot_file_collector

    folder = tempfile.mkdtemp(prefix="deltaserve-metrics-")
    atexit.register(shutil.rmtree, folder, True)
    path = str(Path(folder) / "metrics.json")
    REGISTRY.register(snapshot_file_collector(path))
    _INSTALLED["path"] = path
    log.debug("DeltaServe metrics: API server reads the EngineCore's snapshots from %s", path)
    return path
