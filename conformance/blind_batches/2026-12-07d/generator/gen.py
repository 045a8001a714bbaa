"""Generator of the 2026-12-07d blind hosts: copies ReferenceHost methods with inspect.getsource and applies exact,
once-only string edits (each marked # BUG)."""
import inspect
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[4] / "src"))
from deltaserve_core.testing import reference_host as RH  # noqa: E402

OUT = Path(__file__).resolve().parent.parent / "blindhosts"
R = RH.ReferenceHost

IMPORTS = '''from __future__ import annotations

import dataclasses  # noqa: F401
import math  # noqa: F401
import time  # noqa: F401
from collections.abc import Sequence  # noqa: F401

import torch  # noqa: F401
import torch.nn.functional as F  # noqa: F401

from deltaserve_core.adapter_state import LoraAdapterState, parse_peft_key  # noqa: F401
from deltaserve_core.driver import ClientOutput, ClientRequest, check_client_adapter, run_to_completion, take_kept  # noqa: F401
from deltaserve_core.hooks import RESERVED_ADAPTER_NAME  # noqa: F401
from deltaserve_core.hostkit import profile_seed, published_name  # noqa: F401
from deltaserve_core.testing.reference_host import ReferenceHost, _as_list, _Lora, _Row, _Seq  # noqa: F401
from deltaserve_core.types import (  # noqa: F401
    ExecutionMode,
    FineTuneSample,
    ModelSpec,
    ProposedBatch,
    RequestSLO,
    ScheduledRequest,
    StepRecord,
)
'''


def method(name, edits, cls=R):
    src = inspect.getsource(getattr(cls, name))
    for old, new in edits:
        n = src.count(old)
        assert n == 1, (name, n, old)
        src = src.replace(old, new)
    return src


def write(num, slug, doc, methods=(), body="", module_extra="", base="ReferenceHost"):
    parts = ['"""' + doc.strip() + '\n"""\n', IMPORTS, module_extra, f"\n\nclass Host({base}):\n",
             f'    """{slug}: see the module docstring."""\n']
    if body:
        parts.append(body)
    for m, edits in methods:
        parts.append("\n" + method(m, edits))
    path = OUT / f"h{num}_{slug}.py"
    path.write_text("".join(parts))
    print(path.name)


exec((Path(__file__).resolve().parent / "specs.py").read_text())
