"""How long creating a fine-tuning job over HTTP stalls a serving engine: client token gaps before vs during a create.

On a real ``vllm serve`` (CPU, the ``tiny`` demo model, started as the README's operator path does:
:class:`operator_metrics.VllmCpuServer`, no job file, ``"jobs": {"data_dir": ..., "max_concurrent": 1}``),
``--streams`` clients keep one streaming greedy completion each in flight back to back, so the engine always has a
request to step, and the arrival time of every streamed token is kept. After ``--baseline-s`` seconds the operator
creates a job (``POST /v1/fine_tuning/jobs``), then polls it until it is ``running`` (or ``failed``), and the streams
go on for ``--after-s`` seconds more. With several streams in flight, the merged arrivals have a gap only when the
engine did not step, so the longest gap between consecutive token arrivals of all streams is the longest engine
stall a client saw. Reported per window:

- ``before``: from the first token to the create request;
- ``during``: from the create request until ``--settle-s`` seconds after the job was first seen ``running`` (the job
  joins the engine's steps there, and its first fine-tuning rows run);
- ``after``: the rest (the job training beside the clients).

Written to ``--out`` (default ``benchmarks/results/cpu/<date>_<commit>/``): ``create_stall.json`` (the windows'
longest and 99th-percentile gaps, the create's answer and how long it took, when the job ran, every arrival time,
the environment with the commit) and the server's log (the server runs in a temporary folder).

Run from a clone, with the venv's python and the clone's src first on the server's path::

    PYTHONPATH=$PWD/src OMP_NUM_THREADS=1 python benchmarks/create_stall.py
"""

from __future__ import annotations

import argparse
import datetime as dt
import http.client
import json
import os
import shutil
import sys
import tempfile
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

sys.path.insert(0, str(Path(__file__).resolve().parent))
import operator_metrics as om  # noqa: E402  (also puts the clone's src first)
from _common import RESULTS, command_line, machine_info, write_json  # noqa: E402
from deltaserve_core.testing.servers import http_json  # noqa: E402
from two_jobs_metrics import JOB_SETTINGS, generated_records  # noqa: E402

JSON_NAME = "create_stall.json"
SCHEMA = "deltaserve-create-stall/1"
KEY = "create-stall-key"


class Streams:
    """``n`` clients, each keeping one streaming completion in flight back to back; every token's arrival kept."""

    def __init__(self, base: str, model: str, n: int, max_tokens: int, t0: float) -> None:
        self.base, self.model, self.max_tokens, self.t0 = base, model, max_tokens, t0
        self.arrivals: list[float] = []  # seconds after t0, every stream's tokens
        self.requests: list[dict[str, Any]] = []
        self.errors: list[str] = []
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._threads = [threading.Thread(target=self._run, args=(i,), name=f"create-stall-stream-{i}", daemon=True)
                         for i in range(n)]

    def start(self) -> None:
        for t in self._threads:
            t.start()

    def stop(self) -> None:
        self._stop.set()
        for t in self._threads:
            t.join(timeout=300)

    def _run(self, i: int) -> None:
        n = 0
        while not self._stop.is_set():
            try:
                self._one(i, n)
            except (OSError, ValueError, http.client.HTTPException) as exc:
                with self._lock:
                    self.errors.append(f"{time.monotonic() - self.t0:.3f}: {exc}")
                self._stop.wait(0.5)
            n += 1

    def _one(self, i: int, n: int) -> None:
        url = urlsplit(self.base)
        conn = http.client.HTTPConnection(url.hostname, url.port, timeout=300)
        body = {"model": self.model, "prompt": om.PROMPTS[(i + n) % len(om.PROMPTS)], "max_tokens": self.max_tokens,
                "temperature": 0.0, "stream": True, "ignore_eos": True}
        sent = time.monotonic() - self.t0
        conn.request("POST", "/v1/completions", json.dumps(body),
                     {"Content-Type": "application/json", "Authorization": f"Bearer {KEY}"})
        resp = conn.getresponse()
        if resp.status != 200:
            raise ValueError(f"HTTP {resp.status}: {resp.read()[:300]!r}")
        tokens = 0
        for raw in resp:
            line = raw.strip()
            if not line.startswith(b"data:") or line == b"data: [DONE]":
                continue
            now = time.monotonic() - self.t0
            tokens += 1
            with self._lock:
                self.arrivals.append(now)
        conn.close()
        with self._lock:
            self.requests.append({"stream": i, "sent": round(sent, 3), "tokens": tokens,
                                  "done": round(time.monotonic() - self.t0, 3)})


def gaps_in(arrivals: Sequence[float], start: float, end: float) -> dict[str, Any]:
    """The gaps between consecutive ``arrivals`` (sorted) that end in [start, end): longest, where, p99, count."""
    gaps = [(b - a, b) for a, b in zip(arrivals, arrivals[1:]) if start <= b < end]
    if not gaps:
        return {"tokens": 0, "longest_gap_s": None, "longest_gap_ends_at": None, "p99_gap_s": None}
    ordered = sorted(g for g, _ in gaps)
    longest, at = max(gaps)
    return {"tokens": len(gaps), "longest_gap_s": round(longest, 4), "longest_gap_ends_at": round(at, 3),
            "p99_gap_s": round(ordered[min(len(ordered) - 1, int(0.99 * len(ordered)))], 4),
            "median_gap_s": round(ordered[len(ordered) // 2], 4)}


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", type=Path, default=None, help="results folder (default benchmarks/results/cpu/"
                                                          "<date>_<commit>)")
    p.add_argument("--model", default="tiny", help="the demo model's name or a model folder")
    p.add_argument("--streams", type=int, default=2, help="streaming completions kept in flight")
    p.add_argument("--max-tokens", type=int, default=64, help="tokens per streamed completion")
    p.add_argument("--baseline-s", type=float, default=30.0, help="seconds of traffic before the create")
    p.add_argument("--settle-s", type=float, default=5.0, help="the 'during' window's end after the job runs")
    p.add_argument("--after-s", type=float, default=20.0, help="seconds of traffic after the job runs")
    p.add_argument("--running-timeout-s", type=float, default=300.0, help="give up waiting for the job to run")
    p.add_argument("--startup-timeout", type=float, default=600.0, help="seconds for the server to come up")
    p.add_argument("--force", action="store_true", help="overwrite results in --out")
    return p


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    from deltaserve_core.assets import resolve_model
    from deltaserve_core.bench import source_commit

    commit = source_commit() or "unknown"
    out = (args.out or RESULTS / "cpu" / f"{dt.date.today().isoformat()}_{commit[:7]}").resolve()
    if (out / JSON_NAME).exists() and not args.force:
        print(f"[create-stall] results exist in {out}; pass --force to overwrite them", file=sys.stderr)
        return 2
    out.mkdir(parents=True, exist_ok=True)
    # the server's folder (checkpoints, published versions) stays out of the results; its log is copied in
    workdir = Path(tempfile.mkdtemp(prefix="create-stall-"))
    (workdir / "data").mkdir()
    (workdir / "data" / "alpaca.json").write_text(json.dumps(generated_records()))
    os.environ["VLLM_PLUGINS"] = "deltaserve,deltaserve_jobs"  # the jobs routes (the server inherits this)
    server = om.VllmCpuServer(str(resolve_model(args.model)), None, workdir, KEY, args.startup_timeout,
                              jobs={"data_dir": str(workdir / "data"), "max_concurrent": 1})
    report: dict[str, Any] = {"schema": SCHEMA, "command": command_line(list(sys.argv[1:] if argv is None else argv))}
    try:
        base = server.start()
        model = om.base_model_name(base, KEY)
        body = {"model": model, "training_file": "alpaca.json", "suffix": "stall",
                "hyperparameters": {"n_epochs": 20, "batch_size": 128}, "deltaserve": JOB_SETTINGS}
        report["environment"] = {"commit": commit, "vllm_version": om.server_vllm_version(base, KEY), "model": model,
                                 "settings": {k: v for k, v in vars(args).items() if k != "out"},
                                 "create_body": body, "machine": machine_info()}
        t0 = time.monotonic()
        streams = Streams(base, model, args.streams, args.max_tokens, t0)
        streams.start()
        create: dict[str, Any] = {}
        try:
            time.sleep(args.baseline_s)
            create["sent_at"] = round(time.monotonic() - t0, 3)
            status, answer = http_json("POST", f"{base}/v1/fine_tuning/jobs", body, key=KEY, timeout=300.0)
            create["answered_at"] = round(time.monotonic() - t0, 3)
            create["response_s"] = round(create["answered_at"] - create["sent_at"], 3)
            create["http_status"] = status
            create["status_in_answer"] = answer.get("status") if isinstance(answer, dict) else None
            print(f"[create-stall] create answered in {create['response_s']} s: HTTP {status} "
                  f"{create['status_in_answer']}", flush=True)
            if status != 200:
                raise RuntimeError(f"the create was refused: HTTP {status} {answer}")
            deadline = time.monotonic() + args.running_timeout_s
            while True:
                job = http_json("GET", f"{base}/v1/fine_tuning/jobs/ftjob-stall", key=KEY)[1]
                if job.get("status") in ("running", "failed", "succeeded", "cancelled"):
                    break
                if time.monotonic() > deadline:
                    raise RuntimeError(f"the job did not run within {args.running_timeout_s} s: {job}")
                time.sleep(0.2)
            create["running_at"] = round(time.monotonic() - t0, 3)
            create["final_status"] = job.get("status")
            create["error"] = job.get("error")
            print(f"[create-stall] job {job.get('status')} at {create['running_at']} s", flush=True)
            time.sleep(args.after_s)
        finally:
            streams.stop()
        arrivals = sorted(streams.arrivals)
        if not arrivals or "running_at" not in create:
            raise RuntimeError(f"no measurement: {len(arrivals)} tokens, create {create}, errors {streams.errors[:5]}")
        end_during = create["running_at"] + args.settle_s
        report.update(create=create, windows={
            "before": {"from": round(arrivals[0], 3), "to": create["sent_at"],
                       **gaps_in(arrivals, arrivals[0], create["sent_at"])},
            "during": {"from": create["sent_at"], "to": round(end_during, 3),
                       **gaps_in(arrivals, create["sent_at"], end_during)},
            "after": {"from": round(end_during, 3), "to": round(arrivals[-1], 3),
                      **gaps_in(arrivals, end_during, arrivals[-1] + 1)}},
            stream_errors=streams.errors, requests=streams.requests, arrivals=[round(a, 4) for a in arrivals],
            jobs_at_end=http_json("GET", f"{base}/v1/fine_tuning/jobs", key=KEY)[1])
        w = report["windows"]
        print(f"[create-stall] longest token gap: before {w['before']['longest_gap_s']} s, during "
              f"{w['during']['longest_gap_s']} s, after {w['after']['longest_gap_s']} s", flush=True)
    finally:
        report.setdefault("environment", {})["server_started"] = server.info
        server.stop()
        if (workdir / "server.log").exists():
            shutil.copy(workdir / "server.log", out / "server.log")
    write_json(out / JSON_NAME, report)
    print(f"[create-stall] wrote {out / JSON_NAME}", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
