"""Co-serve a fine-tuning job on the reference host from Python (what `deltaserve demo` does, minus the trace).

    OMP_NUM_THREADS=1 python examples/coserve_reference.py
"""

from __future__ import annotations

import os

os.environ.setdefault("OMP_NUM_THREADS", "1")

from deltaserve_core.assets import demo_dataset_path  # noqa: E402
from deltaserve_core.calibration import ProfileStore, load_or_calibrate  # noqa: E402
from deltaserve_core.coserve import CoServer  # noqa: E402
from deltaserve_core.assets import resolve_model  # noqa: E402
from deltaserve_core.driver import ClientRequest, HostConfig  # noqa: E402
from deltaserve_core.job_config import CheckpointSpec, JobConfig, SLOSpec  # noqa: E402
from deltaserve_core.registry import create_host  # noqa: E402


def main() -> None:
    model = resolve_model("tiny")
    host = create_host("reference", HostConfig(model=str(model)))
    profile = load_or_calibrate(host, ProfileStore(), max_prefill_tokens=256, max_decode_batch=8, max_kv=512,
                                max_ft_tokens=256)
    job = JobConfig(dataset=str(demo_dataset_path()), max_length=128, buffer_tokens=1024,
                    slo=SLOSpec(ttft_s=1.0, tpot_s=0.2), checkpoint=CheckpointSpec(dir="runs/example", every_steps=5))
    with CoServer(host, job, latency_model=profile.model) as co:
        outputs = host.generate([ClientRequest(f"r{i}", (5, 6, 7, 8 + i), 16) for i in range(4)])
        while co.stats.optimizer_steps < 5:  # idle steps: fine-tuning only, aborted if a request arrives
            if not host.run_idle_step():
                co.poll()
        print([o.token_ids[:4] for o in outputs], co.stats.as_dict()["losses"])
    host.shutdown()


if __name__ == "__main__":
    main()
