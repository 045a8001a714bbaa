"""Helpers shared by the benchmark scripts: where results go, what machine produced them, atomic JSON.

Benchmarks run as plain scripts from a clone (``python benchmarks/X.py``), so importing this module also puts
the clone's ``src`` on ``sys.path`` -- the numbers must come from the code next to the script, not from
whatever ``deltaserve`` happens to be installed.
"""

from __future__ import annotations

import datetime as _dt
import json
import os
import platform
import shlex
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results"

if str(ROOT / "src") not in sys.path:
    sys.path.insert(0, str(ROOT / "src"))

from deltaserve_core.bench import source_commit  # noqa: E402  (after the path above)

__all__ = ["ROOT", "RESULTS", "command_line", "machine_info", "load_average", "write_json"]


def command_line(argv: list[str] | None = None) -> str:
    """The command as a user would retype it (script path relative to the clone when possible)."""
    args = list(sys.argv[1:] if argv is None else argv)
    script = Path(sys.argv[0])
    try:
        script = script.resolve().relative_to(ROOT)
    except ValueError:
        pass
    return shlex.join(["python", str(script), *args])


def load_average() -> list[float] | None:
    """1/5/15-minute load averages, recorded next to timings on shared machines (None where unsupported)."""
    try:
        return [round(x, 2) for x in os.getloadavg()]
    except OSError:
        return None


def machine_info(device: str = "cpu") -> dict[str, Any]:
    """What produced the numbers: CPU and thread settings, library versions, accelerator, date."""
    info: dict[str, Any] = {
        "date": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        "hostname": platform.node(),
        "python": platform.python_version(),
        "platform": platform.platform(),
        "machine": platform.machine(),
        "processor": platform.processor() or None,
        "cpu_count": os.cpu_count(),
        "cpus_usable": len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else None,
        "omp_num_threads": os.environ.get("OMP_NUM_THREADS"),
        "load_average": load_average(),
        "commit": source_commit(),
    }
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as fh:
            names = [line.split(":", 1)[1].strip() for line in fh if line.startswith("model name")]
        if names:
            info["cpu_model"] = names[0]
    except OSError:
        pass
    try:
        import torch

        info["torch"] = torch.__version__
        info["torch_threads"] = torch.get_num_threads()
        if device.startswith("cuda") and torch.cuda.is_available():
            info["gpu"] = torch.cuda.get_device_name(torch.device(device))
            info["cuda"] = torch.version.cuda
    except ImportError:
        pass
    try:
        import transformers

        info["transformers"] = transformers.__version__
    except ImportError:
        pass
    return info


def write_json(path: Path, payload: dict[str, Any]) -> None:
    """Write ``payload`` atomically (a crashed run never leaves a truncated result file behind)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps(payload, indent=2, allow_nan=False) + "\n", encoding="utf-8")
    os.replace(tmp, path)
