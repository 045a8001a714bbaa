"""Two fine-tuning jobs created over HTTP on one real ``vllm serve`` (CPU), and what its ``/metrics`` shows of them.

The operator's path of the README, run by this script on the ``tiny`` demo model (built locally, no download):
``deltaserve calibrate`` then the server line it prints (``VLLM_PLUGINS=deltaserve,deltaserve_jobs``), with
``"jobs": {"data_dir": ..., "max_concurrent": 2}`` and no job file (:class:`operator_metrics.VllmCpuServer`). While
a client sends a few greedy completions per second and ``/metrics`` is scraped every ``--every`` seconds, the
operator's calls go over HTTP at fixed times (seconds after the first scrape, :data:`DEFAULT_ACTIONS`): create job
``alpha``, create job ``beta``, pause ``alpha``, resume it, cancel ``beta``. Both jobs train on ``--training-file``
(default: 200 short generated Alpaca-format records, so the run needs no download). Written to ``--out``:

- ``two_jobs_metrics.json``: every ``deltaserve_*`` sample (time, metric, labels, value), the operator's calls with
  their times and answers, the client's requests and the environment (commit, vLLM version, the server command);
- ``two_jobs_metrics.png``: fine-tuning tokens trained per job (``deltaserve_finetune_tokens_total`` by
  ``finetune_job``) and each job's adapter step over time, the operator's calls marked.

Run from a clone, with the venv's python::

    python benchmarks/two_jobs_metrics.py --out benchmarks/results/cpu/DATE_COMMIT --duration 180

``--plot-only two_jobs_metrics.json`` redraws the figure from a recorded run.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
import operator_metrics as om  # noqa: E402  (also puts the clone's src first)
from _common import command_line, machine_info, write_json  # noqa: E402
from deltaserve_core.testing.servers import http_json  # noqa: E402

JSON_NAME = "two_jobs_metrics.json"
PNG_NAME = "two_jobs_metrics.png"
SCHEMA = "deltaserve-two-jobs-metrics/1"
#: the operator's calls: (seconds after the first scrape, operation, job suffix)
DEFAULT_ACTIONS = ((5, "create", "alpha"), (35, "create", "beta"), (80, "pause", "alpha"), (115, "resume", "alpha"),
                   (145, "cancel", "beta"))
#: a created job's settings (the create body's ``deltaserve`` block): small optimizer steps, many epochs so
#: neither job runs out of data in a few minutes, SLOs loose enough for a shared 2-core machine
JOB_SETTINGS = {"max_length": 128, "overflow": "truncate", "buffer_tokens": 1024,
                "slo": {"ttft_s": 5.0, "tpot_s": 1.0}, "checkpoint": {"every_steps": 10, "keep": 2},
                "publish": {"policy": "on_checkpoint"}}


def generated_records(n: int = 200) -> list[dict[str, str]]:
    """An Alpaca-format training set made here, so the run needs no download (``--training-file`` for a real one)."""
    return [{"instruction": f"Write one sentence about topic {i}.", "input": "",
             "output": f"Here is a short sentence about topic {i}, written plainly for a reader."} for i in range(n)]


def create_body(model: str, suffix: str) -> dict[str, Any]:
    return {"model": model, "training_file": "alpaca.json", "suffix": suffix,
            "hyperparameters": {"n_epochs": 20, "batch_size": 128}, "deltaserve": JOB_SETTINGS}


def call(base: str, key: str | None, model: str, op: str, suffix: str) -> tuple[int, Any]:
    """One operator call over HTTP, as the README's curl lines make it."""
    url = f"{base}/v1/fine_tuning/jobs"
    if op == "create":
        return http_json("POST", url, create_body(model, suffix), key=key)
    return http_json("POST", f"{url}/ftjob-{suffix}/{op}", key=key)


def plot(report: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    samples = report["samples"]
    fig, axes = plt.subplots(2, 1, figsize=(9, 7), sharex=True)
    for ax, (metric, title, unit) in zip(axes, (
            ("deltaserve_finetune_tokens_total", "Fine-tuning tokens trained, per job", "tokens"),
            ("deltaserve_adapter_step", "Adapter step (optimizer steps applied), per job", "step"))):
        for job, (ts, vs) in sorted(om.series_of(samples, metric).items()):
            ax.plot(ts, vs, marker=".", label=f'finetune_job="{job}"')
        for action in report["actions"]:
            ax.axvline(action["t"], color="grey", linestyle=":", linewidth=1)
            if ax is axes[0]:
                ax.annotate(f"{action['op']} {action['job']}", (action["t"], 1.0), xycoords=("data", "axes fraction"),
                            rotation=90, va="top", ha="right", fontsize=8, color="dimgrey")
        ax.set_title(title, fontsize=10)
        ax.set_ylabel(unit)
        ax.grid(alpha=0.3)
        if ax.lines:
            ax.legend(loc="center left", fontsize=8)
    axes[-1].set_xlabel("seconds since the first scrape")
    env = report.get("environment", {})
    fig.suptitle(f"Two jobs over HTTP on one vLLM {env.get('vllm_version', '?')} CPU server (tiny model), "
                 f"commit {str(env.get('commit', '?'))[:12]}", fontsize=11)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", type=Path, default=Path("deltaserve-two-jobs-metrics"), help="where results go")
    p.add_argument("--duration", type=float, default=180.0, help="seconds of load and scraping")
    p.add_argument("--every", type=float, default=2.0, help="seconds between scrapes of /metrics")
    p.add_argument("--rate", type=float, default=1.0, help="client completion requests per second")
    p.add_argument("--model", default="tiny", help="the demo model's name or a model folder")
    p.add_argument("--training-file", type=Path, default=None,
                   help="an Alpaca-format JSON dataset both jobs train on (default: 200 generated records)")
    p.add_argument("--startup-timeout", type=float, default=900.0, help="seconds to wait for /health")
    p.add_argument("--force", action="store_true", help="overwrite existing results in --out")
    p.add_argument("--plot-only", type=Path, default=None, help="redraw the figure from a recorded JSON")
    return p


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    out = args.out.resolve()
    if (out / JSON_NAME).exists() and not args.force and args.plot_only is None:
        print(f"[two-jobs] results exist in {out}; pass --force to overwrite them", file=sys.stderr)
        return 2
    out.mkdir(parents=True, exist_ok=True)
    if args.plot_only is not None:
        plot(json.loads(args.plot_only.read_text()), out / PNG_NAME)
        return 0
    from deltaserve_core.assets import resolve_model
    from deltaserve_core.bench import source_commit

    workdir = out / "server"
    (workdir / "data").mkdir(parents=True, exist_ok=True)
    training = workdir / "data" / "alpaca.json"
    if args.training_file is not None:
        shutil.copy(args.training_file, training)
    else:
        training.write_text(json.dumps(generated_records()))
    key = "two-jobs-demo-key"
    # the jobs routes are vLLM's endpoint plugin, loaded only when VLLM_PLUGINS names it (the server inherits this)
    os.environ["VLLM_PLUGINS"] = "deltaserve,deltaserve_jobs"
    server = om.VllmCpuServer(str(resolve_model(args.model)), None, workdir, key, args.startup_timeout,
                              jobs={"data_dir": str(workdir / "data"), "max_concurrent": 2})
    report: dict[str, Any] = {"schema": SCHEMA, "command": command_line(list(sys.argv[1:] if argv is None else argv)),
                              "actions": []}
    try:
        base = server.start()
        model = om.base_model_name(base, key)
        report["environment"] = {
            "commit": source_commit(), "vllm_version": om.server_vllm_version(base, key), "model": model,
            "settings": {"duration_s": args.duration, "every_s": args.every, "rate_per_s": args.rate,
                         "actions": DEFAULT_ACTIONS, "create_body": create_body(model, "SUFFIX")},
            "machine": machine_info()}
        t0 = time.monotonic()
        scraper = om.Scraper(base, key, args.every, t0)
        client = om.ClientLoad(base, key, model, args.rate, 16, t0)
        scraper.start()
        client.start()
        try:
            for at, op, job in DEFAULT_ACTIONS:
                time.sleep(max(0.0, t0 + at - time.monotonic()))
                status, answer = call(base, key, model, op, job)
                status_of = answer.get("status") if isinstance(answer, dict) else None
                print(f"[two-jobs] t={time.monotonic() - t0:.0f}s {op} {job}: HTTP {status} {status_of}", flush=True)
                report["actions"].append({"t": round(time.monotonic() - t0, 3), "op": op, "job": job,
                                          "http_status": status, "answer": answer})
                if status != 200:
                    raise RuntimeError(f"{op} {job} was refused: HTTP {status} {answer}")
            time.sleep(max(0.0, t0 + args.duration - time.monotonic()))
            listed = http_json("GET", f"{base}/v1/fine_tuning/jobs", key=key)[1]
            report["jobs_at_end"] = listed.get("data") if isinstance(listed, dict) else listed
        finally:
            client.stop()
            scraper.stop()
        report.update(scrapes=scraper.scrapes, samples=scraper.samples, client=client.summary())
    finally:
        report.setdefault("environment", {})["server_started"] = server.info
        server.stop()
    write_json(out / JSON_NAME, report)
    plot(report, out / PNG_NAME)
    print(f"[two-jobs] wrote {out / JSON_NAME} and {out / PNG_NAME}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
