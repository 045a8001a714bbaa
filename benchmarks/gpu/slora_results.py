"""Summarise a benchmarks/gpu/slora_h200.sh run as JSON (date, S-LoRA commit, versions, per-test outcomes)."""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import re
import xml.etree.ElementTree as ET
from pathlib import Path


def _cases(path: Path) -> dict[str, dict[str, str]]:
    if not path.is_file():
        return {}
    out = {}
    for case in ET.parse(path).getroot().iter("testcase"):
        name = case.get("name", "")
        status, message = "passed", ""
        for tag in ("failure", "error", "skipped"):
            el = case.find(tag)
            if el is not None:
                status = {"failure": "failed", "error": "error", "skipped": "skipped"}[tag]
                message = (el.get("message") or "")[:600]
        out[name] = {"status": status, "seconds": case.get("time", ""), **({"message": message} if message else {})}
    return out


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--logs", required=True)
    p.add_argument("--slora", required=True)
    p.add_argument("--out", required=True)
    a = p.parse_args()
    logs = Path(a.logs)
    import peft
    import torch
    import transformers

    from deltaserve_core.bench import source_commit
    from deltaserve_slora.locate import inspect_checkout

    checkout = inspect_checkout(Path(a.slora))
    conf = _cases(logs / "conformance.xml")
    gpu = _cases(logs / "gpu_tests.xml")
    text = (logs / "gpu_tests.txt").read_text() if (logs / "gpu_tests.txt").is_file() else ""
    exact = re.findall(r"differs from plain PEFT by ([0-9.e+-]+) \(relative max\), update error ([0-9.e+-]+) "
                       r"\(relative L2\) vs plain PEFT in float16: ([0-9.e+-]+)", text)
    bug = re.findall(r"bug reproduced on mixed batches: (\w+)", text)
    count = lambda cases, s: sum(1 for c in cases.values() if c["status"] == s)
    result = {
        "date": datetime.date.today().isoformat(),
        "device": torch.cuda.get_device_name(0) if torch.cuda.is_available() else None,
        "commit": source_commit(),  # DeltaServe's (DELTASERVE_COMMIT on the GPU machine, which has no .git)
        "slora_commit": os.environ.get("SLORA_COMMIT") or checkout.commit,
        "slora_attach_files_match_tested": checkout.tested,
        "versions": {"python": platform.python_version(), "torch": torch.__version__,
                     "cuda": torch.version.cuda, "transformers": transformers.__version__, "peft": peft.__version__,
                     "triton": __import__("triton").__version__},
        "kernel_table": {"widths": os.environ.get("SLORA_WIDTHS", "128"), "ranks": os.environ.get("SLORA_RANKS", "8 16")},
        "conformance": {"passed": count(conf, "passed"), "failed": count(conf, "failed") + count(conf, "error"),
                        "skipped": count(conf, "skipped"), "checks": conf},
        "gpu_tests": {"passed": count(gpu, "passed"), "failed": count(gpu, "failed") + count(gpu, "error"),
                      "skipped": count(gpu, "skipped"), "tests": gpu},
        # the criterion (tests/test_coserve.assert_within_precision): update_error <= max(2 x peft_fp16, 0.05)
        "exactness": {"dtype": "float16", "criterion": "update_error <= max(2 * peft_fp16_update_error, 0.05)",
                      "runs": [{"max_rel_diff": float(m), "update_error": float(u), "peft_fp16_update_error": float(p)}
                               for m, u, p in exact]},
        "stock_bug_reproduced": bug[-1] if bug else None,
        "reproduce": "SLORA_SRC=<S-LoRA checkout> bash benchmarks/gpu/slora_h200.sh",
    }
    Path(a.out).write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps({k: result[k] for k in ("conformance", "gpu_tests")}, default=str)[:2000])


if __name__ == "__main__":
    main()
