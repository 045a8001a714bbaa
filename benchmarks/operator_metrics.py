"""Scrape a DeltaServe-enabled server's ``/metrics`` under a light client load and plot what an operator sees.

Two ways to run it (from a clone, with the venv's python):

- against any running server with DeltaServe switched on (vLLM's ``--additional-config``, SGLang's
  ``DELTASERVE_JOB``, ``deltaserve serve``)::

      python benchmarks/operator_metrics.py --server http://127.0.0.1:8000 --duration 150

  ``--api-key`` (or ``DELTASERVE_API_KEY``) is sent as a bearer token on every request;

- ``--start-vllm-cpu``: the script runs the README's two operator lines itself -- ``deltaserve calibrate --host vllm
  --model MODEL`` (which reuses a stored profile when one covers the sweep) and the ``python -m deltaserve_vllm
  serve ...`` line that calibrate prints -- on the ``tiny`` demo model and a small job over the Alpaca demo set
  (both fetched or built through :mod:`deltaserve_core.assets`, as the tests and the demo do), then stops that
  server with SIGTERM and checks that no process it started is left.

Meanwhile a client thread sends a few greedy, short ``/v1/completions`` requests per second, and every ``--every``
seconds ``/metrics`` is scraped and its ``deltaserve_*`` samples kept. Written to ``--out`` (default
``./deltaserve-operator-metrics``; existing results are kept unless ``--force``):

- ``operator_metrics.json``: every sample (time, metric, labels, value), each scrape's outcome, the client's
  requests, and the environment (commit, vLLM version, model, settings, the server command when it started one);
- ``operator_metrics.png``: fine-tuning tokens trained and their rate, training loss, SLO attainment (TTFT/TPOT),
  adapter step and published version, over time.

``--plot-only operator_metrics.json`` redraws the figure from a recorded run without any server.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shlex
import signal
import socket
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))  # _common, also when imported by a test
from _common import ROOT, command_line, machine_info, write_json  # noqa: E402  (puts the clone's src first)
from deltaserve_core.testing.servers import alive as _alive  # noqa: E402
from deltaserve_core.testing.servers import http_json, process_tree  # noqa: E402

__all__ = ["DEFAULT_OUT", "JSON_NAME", "PNG_NAME", "PANELS", "main", "parse_scrape", "plot", "prepare_out",
           "series_of", "build_parser", "counter_rate"]

DEFAULT_OUT = "deltaserve-operator-metrics"
JSON_NAME = "operator_metrics.json"
PNG_NAME = "operator_metrics.png"
SCHEMA = "deltaserve-operator-metrics/1"

#: (panel title, [(metric, labels that select the series, legend text)]) -- the names are those of
#: deltaserve_core.metrics.METRICS; tests/test_operator_metrics.py checks they still exist there
PANELS: tuple[tuple[str, tuple[tuple[str, dict[str, str], str], ...]], ...] = (
    ("Fine-tuning tokens trained", (("deltaserve_finetune_tokens_total", {}, "tokens (counter)"),)),
    ("Training loss", (("deltaserve_loss", {}, "loss of the latest optimizer step"),)),
    ("SLO attainment (scheduler's view, since start)", (
        ("deltaserve_slo_attainment_ratio", {"objective": "ttft"}, "TTFT"),
        ("deltaserve_slo_attainment_ratio", {"objective": "tpot"}, "TPOT (mean per request)"),
    )),
    ("Adapter step / published version", (
        ("deltaserve_adapter_step", {}, "adapter step"),
        ("deltaserve_published_version", {}, "published version"),
    )),
)

# The calibration sweep of --start-vllm-cpu, sized to what this script sends: prompts of at most a few dozen
# tokens, a handful of decodes at once, fine-tuning rows up to the job's max_length. The model's defaults (2048
# prompt tokens, 64 decodes) would make the first run's calibration several times longer on a small CPU for steps
# this load never schedules.
CALIBRATE_LIMITS = ("--max-prefill", "256", "--max-decode", "8", "--max-kv", "768", "--max-ft", "256")

#: the job --start-vllm-cpu writes when no --job is given: small optimizer steps, so a 2-3 minute run on a CPU
#: shows several of them and a few published versions; two epochs, so the tiny model does not run out of data
#: (about 600 tok/s on 2 cores) before the run ends; SLOs loose enough for a shared 2-core machine
DEFAULT_JOB = {
    "adapter_name": "operator-demo",
    "lora": {"r": 8, "alpha": 16, "target_modules": ["q_proj", "k_proj", "v_proj", "o_proj"], "dropout": 0.0},
    "optimizer": {"lr": 1.0e-3, "weight_decay": 0.01},
    "epochs": 2,
    "backward_batch_tokens": 128,
    "max_length": 128,
    "overflow": "truncate",
    "buffer_tokens": 1024,
    "slo": {"ttft_s": 5.0, "tpot_s": 1.0, "avg_tpot_s": None},
    "checkpoint": {"dir": "checkpoints", "every_steps": 0, "keep": 2},
    "publish": {"policy": "every_n_steps", "every_steps": 10},
    "seed": 0,
}

#: client prompts: short, varied, the same on every run (greedy outputs are then comparable between runs)
PROMPTS = (
    "Give three tips for staying healthy.",
    "What are the three primary colors?",
    "Describe the structure of an atom.",
    "How can we reduce air pollution?",
    "Explain why the sky is blue.",
    "Name a famous painting by Leonardo da Vinci.",
    "Write a haiku about autumn.",
    "What is the capital of France?",
)


# ---------------------------------------------------------------------------------------------- HTTP


def _get_json(url: str, key: str | None, timeout: float = 10.0) -> Any:
    status, payload = http_json("GET", url, key=key or None, timeout=timeout)
    if status != 200:
        raise RuntimeError(f"GET {url} answered {status}: {str(payload)[:300]}")
    return payload


def base_model_name(server: str, key: str | None) -> str:
    """The model the client requests go to: the first entry of ``/v1/models`` that is not an adapter (vLLM lists
    adapters, published versions included, with a ``parent``)."""
    models = _get_json(f"{server}/v1/models", key).get("data", [])
    bases = [m["id"] for m in models if not m.get("parent")]
    if not bases:
        raise RuntimeError(f"{server}/v1/models lists no base model: {models}")
    return bases[0]


def server_vllm_version(server: str, key: str | None) -> str | None:
    """vLLM's version as the server reports it (``/version``), else the locally installed one (None if neither:
    another engine's server)."""
    try:
        return str(_get_json(f"{server}/version", key)["version"])
    except (OSError, RuntimeError, KeyError, ValueError, TypeError):
        pass
    try:
        from deltaserve_vllm.versions import installed_vllm

        found = installed_vllm()
    except ImportError:
        return None
    return None if found is None else f"{found[1]} (installed here; the server did not say)"


# ---------------------------------------------------------------------------------------------- scraping


def parse_scrape(text: str, t: float, wall: float, prefix: str = "deltaserve_") -> list[dict[str, Any]]:
    """The samples of one ``/metrics`` page whose name starts with ``prefix``, as ``{"t", "time", "metric",
    "labels", "value"}``; ``t``: seconds since the run's first scrape, ``wall``: Unix time.

    ``*_created`` samples (prometheus_client's counter creation stamps) are left out: they are no reading."""
    from prometheus_client.parser import text_string_to_metric_families

    out: list[dict[str, Any]] = []
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            if not s.name.startswith(prefix) or s.name.endswith("_created"):
                continue
            out.append({"t": round(t, 3), "time": round(wall, 3), "metric": s.name, "labels": dict(s.labels),
                        "value": s.value if math.isfinite(s.value) else None})
    return out


def series_of(samples: Iterable[dict[str, Any]], metric: str,
              labels: dict[str, str] | None = None) -> dict[str, tuple[list[float], list[float]]]:
    """``metric``'s samples that carry ``labels``, as ``{finetune_job: (times, values)}`` in time order (a server
    may carry several jobs; non-finite values, stored as null, are left out)."""
    wanted = labels or {}
    out: dict[str, tuple[list[float], list[float]]] = {}
    for s in samples:
        if s["metric"] != metric or s["value"] is None or any(s["labels"].get(k) != v for k, v in wanted.items()):
            continue
        ts, vs = out.setdefault(s["labels"].get("finetune_job", ""), ([], []))
        ts.append(float(s["t"]))
        vs.append(float(s["value"]))
    for ts, vs in out.values():
        order = sorted(range(len(ts)), key=ts.__getitem__)
        ts[:], vs[:] = [ts[i] for i in order], [vs[i] for i in order]
    return out


def counter_rate(times: Sequence[float], values: Sequence[float],
                 min_interval: float = 0.0) -> tuple[list[float], list[float]]:
    """Per-second increase of a counter over intervals of at least ``min_interval`` seconds between samples,
    stamped at each interval's midpoint.

    Short intervals are merged into the next: the servers refresh these values about once a second, so a rate over
    a fraction of that shows the refresh, not the training. A value below the previous one is a restart of the
    serving process (counters start at 0 again): the increase since is the new value itself, as Prometheus'
    ``rate`` counts it."""
    ts: list[float] = []
    rs: list[float] = []
    if not times:
        return ts, rs
    t_base, gained, last = times[0], 0.0, values[0]
    for t1, v1 in zip(times[1:], values[1:]):
        gained += v1 - last if v1 >= last else v1
        last = v1
        if t1 - t_base > 0 and t1 - t_base >= min_interval:
            ts.append((t_base + t1) / 2)
            rs.append(gained / (t1 - t_base))
            t_base, gained = t1, 0.0
    return ts, rs


class Scraper:
    """Scrapes ``/metrics`` every ``every_s`` on its own thread until stopped; a failed scrape is recorded and the
    next one tried (a server busy with a long step may miss one)."""

    def __init__(self, server: str, key: str | None, every_s: float, t0: float) -> None:
        self.url = f"{server}/metrics"
        self.key = key
        self.every_s = every_s
        self.t0 = t0
        self.samples: list[dict[str, Any]] = []
        self.scrapes: list[dict[str, Any]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="operator-metrics-scraper", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()

    def scrape_once(self) -> None:
        wall = time.time()
        t = time.monotonic() - self.t0
        try:
            status, text = http_json("GET", self.url, key=self.key or None, timeout=max(self.every_s, 10.0))
            if status != 200 or not isinstance(text, str):  # the exposition format is text, never JSON
                raise RuntimeError(f"status {status}")
            got = parse_scrape(text, t, wall)
        except (OSError, RuntimeError, ValueError) as exc:
            self.scrapes.append({"t": round(t, 3), "time": round(wall, 3), "ok": False, "error": str(exc)})
            return
        self.samples.extend(got)
        self.scrapes.append({"t": round(t, 3), "time": round(wall, 3), "ok": True, "samples": len(got)})

    def _run(self) -> None:
        tick = 0
        while not self._stop.is_set():
            self.scrape_once()
            tick += 1
            # on a fixed grid from t0, so a slow scrape does not shift every later one
            self._stop.wait(max(0.0, self.t0 + tick * self.every_s - time.monotonic()))


class ClientLoad:
    """Sends ``rate`` greedy completion requests per second, each from a small worker pool so a slow answer does
    not delay the next arrival; records each request's send time, latency, status and output tokens."""

    def __init__(self, server: str, key: str | None, model: str, rate: float, max_tokens: int, t0: float,
                 workers: int = 8) -> None:
        self.url = f"{server}/v1/completions"
        self.key = key
        self.model = model
        self.rate = rate
        self.max_tokens = max_tokens
        self.t0 = t0
        self.requests: list[dict[str, Any]] = []
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._pool = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="operator-metrics-client")
        self._thread = threading.Thread(target=self._run, name="operator-metrics-load", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self, wait_s: float = 120.0) -> None:
        """Stop sending; wait up to ``wait_s`` for requests in flight (the server is stopped after this)."""
        self._stop.set()
        self._thread.join()
        deadline = time.monotonic() + wait_s
        while time.monotonic() < deadline:
            with self._lock:
                if all("latency_s" in r for r in self.requests):
                    break
            time.sleep(0.2)
        self._pool.shutdown(wait=False, cancel_futures=True)

    def _one(self, i: int, sent: float) -> None:
        body = {"model": self.model, "prompt": PROMPTS[i % len(PROMPTS)], "max_tokens": self.max_tokens,
                "temperature": 0.0}
        record: dict[str, Any] = {"i": i, "t": round(sent - self.t0, 3)}
        try:
            status, payload = http_json("POST", self.url, body, key=self.key or None, timeout=300.0)
            record["status"] = status
            if status == 200 and isinstance(payload, dict):
                record["completion_tokens"] = payload.get("usage", {}).get("completion_tokens")
            else:
                record["error"] = str(payload)[:300]
        except (OSError, ValueError) as exc:
            record["status"], record["error"] = None, str(exc)
        record["latency_s"] = round(time.monotonic() - sent, 4)
        with self._lock:
            self.requests[i] = record

    def _run(self) -> None:
        i = 0
        while not self._stop.is_set():
            sent = time.monotonic()
            with self._lock:
                self.requests.append({"i": i, "t": round(sent - self.t0, 3)})
            self._pool.submit(self._one, i, sent)
            i += 1
            self._stop.wait(max(0.0, self.t0 + i / self.rate - time.monotonic()))

    def summary(self) -> dict[str, Any]:
        with self._lock:
            done = [r for r in self.requests if "latency_s" in r]
            ok = [r for r in done if r.get("status") == 200]
            lat = sorted(r["latency_s"] for r in ok)
            return {"model": self.model, "rate_per_s": self.rate, "max_tokens": self.max_tokens,
                    "sent": len(self.requests), "answered_200": len(ok), "failed": len(done) - len(ok),
                    "unfinished": len(self.requests) - len(done),
                    "latency_s": None if not lat else {"mean": round(sum(lat) / len(lat), 4),
                                                        "p50": lat[len(lat) // 2],
                                                        "p95": lat[min(len(lat) - 1, int(0.95 * len(lat)))],
                                                        "max": lat[-1]},
                    "requests": list(self.requests)}


# ---------------------------------------------------------------------------------------------- the server


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _with_env(entry: str) -> list[int]:
    from deltaserve_core.testing.servers import processes_with_env

    return [p for p in processes_with_env(entry) if p != os.getpid() and _alive(p)]


def default_job(workdir: Path) -> Path:
    """Write :data:`DEFAULT_JOB` over the Alpaca demo set to ``workdir/job.yaml``."""
    import yaml

    from deltaserve_core.assets import demo_dataset_path

    job = {"dataset": str(demo_dataset_path()), **DEFAULT_JOB}
    path = workdir / "job.yaml"
    path.write_text(yaml.safe_dump(job, sort_keys=False))
    return path


class VllmCpuServer:
    """The README's operator path on vLLM-CPU: calibrate, then the printed server line, in ``workdir``.

    Every process it starts carries a unique environment entry, so :meth:`stop` finds them all, re-parented or
    not, and can say that none is left."""

    def __init__(self, model: str, job: Path | None, workdir: Path, key: str | None, startup_s: float,
                 jobs: dict[str, Any] | None = None) -> None:
        """``jobs``: the ``jobs`` settings of jobs created over HTTP (``data_dir``, ``max_concurrent``); with them
        and no ``job`` the server starts without a job file."""
        self.model = model
        self.jobs = jobs
        self.workdir = workdir
        self.key = key
        self.startup_s = startup_s
        self.marker = f"DELTASERVE_OPERATOR_METRICS_RUN={uuid.uuid4().hex}"
        self.job = job
        self.proc: subprocess.Popen[bytes] | None = None
        self.base = ""
        self.info: dict[str, Any] = {}

    def _env(self) -> dict[str, str]:
        env = dict(os.environ)
        name, value = self.marker.split("=", 1)
        env[name] = value
        env.setdefault("OMP_NUM_THREADS", "1")
        env.setdefault("VLLM_LOGGING_LEVEL", "INFO")  # DeltaServe's progress lines are INFO records
        return env

    def calibrate(self) -> list[str]:
        """Run ``deltaserve calibrate --host vllm --model MODEL`` (a stored profile that covers the sweep is
        reused) and return the vLLM server line it prints, as words."""
        cmd = [sys.executable, "-m", "deltaserve_core.cli", "calibrate", "--host", "vllm", "--model", self.model,
               *CALIBRATE_LIMITS, "--no-progress"]
        shown = shlex.join(["deltaserve", *cmd[3:]])
        print(f"[operator-metrics] calibrating: {shown} (minutes the first time, seconds after)", flush=True)
        started = time.monotonic()
        with open(self.workdir / "calibrate.log", "w") as log:
            run = subprocess.run(cmd, env=self._env(), stdout=subprocess.PIPE, stderr=log, text=True, cwd=ROOT)
        (self.workdir / "calibrate.out").write_text(run.stdout)
        if run.returncode != 0:
            raise RuntimeError(f"calibrate failed ({run.returncode}); see {self.workdir / 'calibrate.log'}")
        lines = [ln.strip() for ln in run.stdout.splitlines() if "deltaserve_vllm serve" in ln]
        if len(lines) != 1:
            raise RuntimeError(f"calibrate printed no single vLLM server line:\n{run.stdout[-2000:]}")
        self.info["calibrate"] = {"command": shown, "seconds":
                                  round(time.monotonic() - started, 1),
                                  "reused_profile": "reused the stored profile" in run.stdout,
                                  "printed": [ln.strip() for ln in run.stdout.splitlines()
                                              if ln.startswith(("profile saved", "reused the stored", "eager:",
                                                                "graph:"))]}
        return shlex.split(lines[0])

    def start(self) -> str:
        """Calibrate, start the server line on a free port (with the job ``job.yaml`` in ``workdir``), wait for
        ``/health``; returns the server's base URL."""
        from deltaserve_core.testing.servers import wait_until_up

        if self.job is None and self.jobs is None:
            self.job = default_job(self.workdir)
        words = self.calibrate()
        if words[:1] != ["python"] or "--additional-config" not in words:
            raise RuntimeError(f"unexpected server line from calibrate: {shlex.join(words)}")
        at = words.index("--additional-config") + 1
        settings = json.loads(words[at])
        if self.job is None:
            del settings["deltaserve"]["job"]  # jobs come over HTTP
        elif self.job.resolve() != (self.workdir / "job.yaml").resolve():
            # the printed line's job.yaml stands for the operator's job; its absolute path keeps the job's own
            # relative paths (dataset, checkpoint dir) relative to the job file's folder, where the job reads them
            settings["deltaserve"]["job"] = str(self.job.resolve())
        if self.jobs is not None:
            settings["deltaserve"]["jobs"] = self.jobs
        words[at] = json.dumps(settings)
        port = _free_port()
        extra = ["--port", str(port)] + (["--api-key", self.key] if self.key else [])
        cmd = [sys.executable, *words[1:], *extra]
        # the key is a secret: the recorded command shows that one was given, not its value
        shown = shlex.join(words + ["--port", str(port)] + (["--api-key", "$DELTASERVE_API_KEY"] if self.key else []))
        self.info.update(command=shown, workdir=str(self.workdir), log=str(self.workdir / "server.log"))
        print(f"[operator-metrics] starting: {shown}", flush=True)
        with open(self.workdir / "server.log", "wb") as log:
            self.proc = subprocess.Popen(cmd, env=self._env(), stdout=log, stderr=subprocess.STDOUT,
                                         cwd=self.workdir, start_new_session=True)
        self.base = f"http://127.0.0.1:{port}"
        started = time.monotonic()
        why = wait_until_up(f"{self.base}/health", self.proc, self.startup_s, poll_s=2.0)
        if why:
            tail = (self.workdir / "server.log").read_text(errors="replace")[-3000:]
            self.stop()
            raise RuntimeError(f"the vLLM server {why}; last lines of its log:\n{tail}")
        self.info["startup_s"] = round(time.monotonic() - started, 1)
        return self.base

    def stop(self, grace_s: float = 120.0) -> dict[str, Any]:
        """SIGTERM the server, wait ``grace_s`` for it and its children (the EngineCore, the backward process),
        then SIGKILL whatever of them is still alive, one pid at a time; records what was left."""
        result: dict[str, Any] = {"signal": "SIGTERM"}
        if self.proc is None:
            return result
        tree = process_tree(self.proc.pid)
        result["process_tree_before_stop"] = tree
        started = time.monotonic()
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        try:
            result["exit_code"] = self.proc.wait(timeout=grace_s)
        except subprocess.TimeoutExpired:
            result["exit_code"] = None
        deadline = time.monotonic() + 15.0
        while time.monotonic() < deadline:
            left = sorted({p for p in tree if _alive(p)} | set(_with_env(self.marker)))
            if not left:
                break
            time.sleep(0.5)
        result["seconds_to_stop"] = round(time.monotonic() - started, 1)
        result["left_after_sigterm"] = left
        for pid in left:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        if self.proc.poll() is None:
            self.proc.wait(10)
        time.sleep(1.0)
        result["left_after_sigkill"] = sorted({p for p in tree if _alive(p)} | set(_with_env(self.marker)))
        self.info["stop"] = result
        return result


# ---------------------------------------------------------------------------------------------- output


def prepare_out(out: Path, force: bool) -> None:
    """Create ``out``; refuse (``FileExistsError``) when it already holds this script's results and ``force`` is
    off, before any server starts or any minute is spent."""
    taken = [str(out / n) for n in (JSON_NAME, PNG_NAME) if (out / n).exists()]
    if taken and not force:
        raise FileExistsError(f"results exist: {', '.join(taken)}; pass --force to overwrite them, or --out DIR to "
                              "write elsewhere")
    out.mkdir(parents=True, exist_ok=True)


def plot(report: dict[str, Any], path: Path) -> list[str]:
    """Draw the four panels of ``report`` (an ``operator_metrics.json`` payload) to ``path``; returns the metrics
    that had no samples (their panels say so in the title)."""
    import matplotlib

    matplotlib.use("Agg")  # no display on a server
    import matplotlib.pyplot as plt

    samples = report["samples"]
    empty: list[str] = []
    fig, axes = plt.subplots(4, 1, figsize=(9, 12), sharex=True)
    for ax, (title, lines) in zip(axes, PANELS):
        missing = []
        for metric, labels, legend in lines:
            by_job = series_of(samples, metric, labels)
            if not by_job:
                missing.append(metric + ("{" + ",".join(f'{k}="{v}"' for k, v in labels.items()) + "}"
                                         if labels else ""))
                continue
            for job, (ts, vs) in sorted(by_job.items()):
                name = legend if len(by_job) == 1 else f"{legend} [{job}]"
                # the second line of a panel dashed and with other marks: equal values (100 % TTFT and TPOT
                # attainment, a version published at every step) would otherwise hide the first
                style = {"linestyle": "--", "marker": "x"} if ax.lines else {"linestyle": "-", "marker": "."}
                if metric in ("deltaserve_adapter_step", "deltaserve_published_version"):
                    ax.step(ts, vs, where="post", label=name, linestyle=style["linestyle"])
                else:
                    ax.plot(ts, vs, label=name, **style)
                if metric == "deltaserve_finetune_tokens_total":
                    every = report.get("environment", {}).get("settings", {}).get("every_s", 0.0)
                    rt, rv = counter_rate(ts, vs, min_interval=0.5 * float(every or 0.0))
                    twin = ax.twinx()
                    twin.plot(rt, rv, color="tab:orange", linestyle="--", label="rate (tok/s)")
                    twin.set_ylabel("tok/s")
                    twin.legend(loc="lower right", fontsize=8)
        empty.extend(missing)
        if missing:
            title += f" -- no samples: {', '.join(missing)}"
        ax.set_title(title, fontsize=10)
        ratio = all(m == "deltaserve_slo_attainment_ratio" for m, _, _ in lines)
        if ratio:
            ax.set_ylim(-0.05, 1.05)
        if ax.lines:
            # attainment sits near 1 and the other series start low: the legend goes where they are not
            ax.legend(loc="lower left" if ratio else "upper left", fontsize=8)
        ax.grid(alpha=0.3)
    axes[0].set_ylabel("tokens")
    axes[1].set_ylabel("loss")
    axes[2].set_ylabel("share of requests")
    axes[3].set_ylabel("optimizer step")
    axes[-1].set_xlabel("seconds since the first scrape")
    env = report.get("environment", {})
    model = str(env.get("model", "?"))
    fig.suptitle(f"DeltaServe operator metrics: {Path(model).name or model} on vLLM {env.get('vllm_version', '?')}, "
                 f"commit {str(env.get('commit', '?'))[:12]}", fontsize=11)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return empty


def summarize(samples: list[dict[str, Any]]) -> dict[str, Any]:
    """First and last value of each plotted series, per job: the numbers a reader checks the figure against."""
    out: dict[str, Any] = {}
    for _, lines in PANELS:
        for metric, labels, _ in lines:
            for job, (ts, vs) in series_of(samples, metric, labels).items():
                key = metric + "".join(f"{{{k}={v}}}" for k, v in labels.items())
                out.setdefault(job, {})[key] = {"first": [ts[0], vs[0]], "last": [ts[-1], vs[-1]], "n": len(ts)}
    return out


# ---------------------------------------------------------------------------------------------- command line


def build_parser() -> argparse.ArgumentParser:
    """The command line (module docstring)."""
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    where = p.add_mutually_exclusive_group(required=True)
    where.add_argument("--server", help="base URL of a running DeltaServe-enabled server, e.g. http://127.0.0.1:8000")
    where.add_argument("--start-vllm-cpu", action="store_true",
                       help="calibrate and start vLLM-CPU's server with DeltaServe as the README does, stop it after")
    where.add_argument("--plot-only", type=Path, metavar="JSON", help="redraw the figure of a recorded run")
    p.add_argument("--api-key", default=os.environ.get("DELTASERVE_API_KEY"),
                   help="bearer token for the server (default: $DELTASERVE_API_KEY); with --start-vllm-cpu it is "
                        "also passed to vLLM as --api-key")
    p.add_argument("--model", default="tiny",
                   help="--start-vllm-cpu: checkpoint folder or shortcut (tiny, smollm2); default tiny")
    p.add_argument("--job", type=Path, default=None,
                   help="--start-vllm-cpu: job YAML (default: a small job over the Alpaca demo set)")
    p.add_argument("--request-model", default=None,
                   help="model name for the client requests (default: the server's base model, from /v1/models)")
    p.add_argument("--duration", type=float, default=150.0, help="seconds of load and scraping (default 150)")
    p.add_argument("--every", type=float, default=5.0, help="seconds between scrapes of /metrics (default 5)")
    p.add_argument("--rate", type=float, default=2.0, help="client requests per second (default 2)")
    p.add_argument("--max-tokens", type=int, default=8, help="output tokens per request (default 8)")
    p.add_argument("--startup-timeout", type=float, default=600.0,
                   help="--start-vllm-cpu: seconds to wait for the server's /health (default 600)")
    p.add_argument("--out", type=Path, default=Path(DEFAULT_OUT), help=f"output folder (default ./{DEFAULT_OUT})")
    p.add_argument("--force", action="store_true", help="overwrite results already in --out")
    p.add_argument("--commit", default=None,
                   help="commit of the server's code (default: git rev-parse HEAD of this checkout, +dirty when "
                        "tracked files differ)")
    return p


def _check_args(p: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    for name in ("duration", "every", "rate", "max_tokens", "startup_timeout"):
        if not getattr(args, name) > 0:
            p.error(f"--{name.replace('_', '-')} must be positive, got {getattr(args, name)}")
    if args.every > args.duration:
        p.error(f"--every {args.every} is longer than --duration {args.duration}: there would be one scrape")
    if args.job is not None and not args.start_vllm_cpu:
        p.error("--job is used only with --start-vllm-cpu (a running server already has its job)")
    if args.job is not None and not args.job.is_file():
        p.error(f"--job {args.job} is not a file")


def _finish(report: dict[str, Any], out: Path) -> None:
    write_json(out / JSON_NAME, report)
    empty = plot(report, out / PNG_NAME)
    if empty:
        print(f"[operator-metrics] no samples for: {', '.join(empty)}", flush=True)
    print(f"[operator-metrics] wrote {out / JSON_NAME} and {out / PNG_NAME}", flush=True)


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command line; returns the exit status (2: refused arguments or existing results, 1: the server
    could not be reached or started)."""
    try:
        return _main(argv)
    except (RuntimeError, OSError) as exc:
        print(f"[operator-metrics] failed: {exc}", file=sys.stderr)
        return 1


def _main(argv: Sequence[str] | None) -> int:
    p = build_parser()
    args = p.parse_args(argv)
    _check_args(p, args)
    out = args.out.resolve()
    try:
        prepare_out(out, args.force)
    except FileExistsError as exc:
        print(f"[operator-metrics] {exc}", file=sys.stderr)
        return 2
    if args.plot_only is not None:
        _finish(json.loads(args.plot_only.read_text()), out)
        return 0

    from deltaserve_core.bench import source_commit

    key = args.api_key or None
    server: VllmCpuServer | None = None
    report: dict[str, Any] = {"schema": SCHEMA, "command": command_line(list(sys.argv[1:] if argv is None else argv))}
    try:
        if args.start_vllm_cpu:
            from deltaserve_core.assets import resolve_model

            model_dir = str(resolve_model(args.model))  # the absolute folder: the calibration profile's key
            workdir = out / "server"
            workdir.mkdir(exist_ok=True)
            server = VllmCpuServer(model_dir, args.job, workdir, key, args.startup_timeout)
            base = server.start()
        else:
            base = args.server.rstrip("/")
        request_model = args.request_model or base_model_name(base, key)
        env = {"commit": args.commit or source_commit(), "commit_source": "--commit" if args.commit else
               "git rev-parse HEAD of this checkout", "vllm_version": server_vllm_version(base, key),
               "server": base if not args.start_vllm_cpu else "started by this script (--start-vllm-cpu)",
               "model": request_model, "settings": {"duration_s": args.duration, "every_s": args.every,
                                                    "rate_per_s": args.rate, "max_tokens": args.max_tokens,
                                                    "temperature": 0.0},
               "machine": machine_info()}
        if server is not None and server.job is not None:
            env["job"] = {"path": str(server.job.resolve()), "yaml": server.job.read_text()}
        report["environment"] = env
        print(f"[operator-metrics] {args.duration:.0f} s of load at {args.rate} req/s on {request_model}, "
              f"scraping {base}/metrics every {args.every} s", flush=True)
        t0 = time.monotonic()
        scraper = Scraper(base, key, args.every, t0)
        client = ClientLoad(base, key, request_model, args.rate, args.max_tokens, t0)
        scraper.start()
        client.start()
        try:
            time.sleep(args.duration)
        finally:
            client.stop()
            scraper.stop()
        scraper.scrape_once()  # after the requests in flight ended: the attainment over every request sent
        report.update(scrapes=scraper.scrapes, samples=scraper.samples, client=client.summary())
    finally:
        if server is not None:
            stopped = server.stop()
            report.setdefault("environment", {})["server_started"] = server.info
            left = stopped.get("left_after_sigterm") or []
            print(f"[operator-metrics] server stopped with SIGTERM in {stopped.get('seconds_to_stop')} s, exit code "
                  f"{stopped.get('exit_code')}; processes left after it: {left or 'none'}"
                  + (f", still alive after SIGKILL: {stopped['left_after_sigkill']}"
                     if stopped.get("left_after_sigkill") else ""), flush=True)
    report["summary"] = summarize(report["samples"])
    ok = sum(1 for s in report["scrapes"] if s["ok"])
    print(f"[operator-metrics] {ok}/{len(report['scrapes'])} scrapes answered, {len(report['samples'])} samples; "
          f"client: {report['client']['answered_200']}/{report['client']['sent']} requests answered", flush=True)
    _finish(report, out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
