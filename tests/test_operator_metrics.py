"""benchmarks/operator_metrics.py without an engine: its parser, rates, figure and output folder.

The scraped pages are rendered by DeltaServe's own collector (``deltaserve_core.metrics.SnapshotCollector``, what
every engine's ``/metrics`` serves) from a few snapshots of a job that starts training between two scrapes, with
some of vLLM's own lines around them; a stub HTTP server in a thread answers ``/metrics``, ``/v1/models``,
``/v1/completions`` and ``/version`` as vLLM's would. No engine starts (the real run is
benchmarks/results/operator/)."""

from __future__ import annotations

import importlib.util
import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from types import ModuleType

import pytest

from deltaserve_core.metrics import JOB_LABEL, SnapshotCollector, exposed_names, render_text

ROOT = Path(__file__).resolve().parents[1]
JOB = "support-bot"
VLLM_LINES = (
    "# HELP vllm:num_requests_running Number of requests in model execution batches.\n"
    "# TYPE vllm:num_requests_running gauge\n"
    'vllm:num_requests_running{engine="0",model_name="m"} 1.0\n'
    "# HELP vllm:prompt_tokens_total Number of prefill tokens processed.\n"
    "# TYPE vllm:prompt_tokens_total counter\n"
    'vllm:prompt_tokens_total{engine="0",model_name="m"} 120.0\n'
    'vllm:prompt_tokens_created{engine="0",model_name="m"} 1.7e+09\n'
)


def _load_script() -> ModuleType:
    spec = importlib.util.spec_from_file_location("operator_metrics", ROOT / "benchmarks" / "operator_metrics.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


om = _load_script()


def _snapshot(step: int, tokens: float, loss: float | None, published: int | None, requests: int) -> dict:
    """One job's metric values as JobMetrics.sample() gives them (the metrics not listed: absent, as before the
    job has one)."""
    snap: dict[str, list[tuple[str | None, float]]] = {
        "deltaserve_finetune_tokens_total": [(None, tokens)],
        "deltaserve_optimizer_steps_total": [(None, float(step))],
        "deltaserve_adapter_step": [(None, float(step))],
        "deltaserve_loss": [] if loss is None else [(None, loss)],
        "deltaserve_published_version": [] if published is None else [(None, float(published))],
        "deltaserve_slo_attainment_ratio": [] if not requests else [("ttft", 1.0), ("tpot", 0.75), ("both", 0.75)],
        "deltaserve_slo_requests": [(None, float(requests))],
        "deltaserve_backward_state": [("training", 1.0), ("idle", 0.0)],
    }
    return snap


#: a job seen at four scrapes: nothing trained yet, then steps, a publish, and a backward restart's counter reset
SCRAPES = [
    _snapshot(0, 0.0, None, None, 0),
    _snapshot(3, 384.0, 2.5, None, 4),
    _snapshot(6, 768.0, 2.1, 5, 9),
    _snapshot(7, 128.0, 1.9, 5, 12),  # the serving process restarted: counters from 0, the adapter step goes on
]


def _page(snapshot: dict) -> str:
    body, _ = render_text(SnapshotCollector(lambda: [({JOB_LABEL: JOB}, snapshot)]))
    return VLLM_LINES + body.decode()


class _StubServer:
    """A vLLM-shaped server answering from :data:`SCRAPES` (one page per scrape, the last repeated)."""

    def __init__(self, scrapes: list[dict], key: str | None = None) -> None:
        self.pages = [_page(s) for s in scrapes]
        self.key = key
        self.served = 0
        self.completions = 0
        self.unauthorized = 0
        stub = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: object) -> None:
                pass

            def _send(self, status: int, body: bytes, kind: str = "application/json") -> None:
                self.send_response(status)
                self.send_header("Content-Type", kind)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def _authorized(self) -> bool:
                if stub.key is None or self.headers.get("Authorization") == f"Bearer {stub.key}":
                    return True
                stub.unauthorized += 1
                self._send(401, b'{"error": "unauthorized"}')
                return False

            def do_GET(self) -> None:  # noqa: N802 - http.server's name
                if self.path == "/metrics":
                    page = stub.pages[min(stub.served, len(stub.pages) - 1)]
                    stub.served += 1
                    self._send(200, page.encode(), "text/plain; version=0.0.4")
                elif self.path == "/version":
                    self._send(200, b'{"version": "0.32.0"}')
                elif self.path == "/v1/models" and self._authorized():
                    models = [{"id": "base-model", "parent": None}, {"id": f"{JOB}@v5", "parent": "base-model"}]
                    self._send(200, json.dumps({"data": models}).encode())

            def do_POST(self) -> None:  # noqa: N802
                length = int(self.headers.get("Content-Length", 0))
                request = json.loads(self.rfile.read(length))
                if self.path == "/v1/completions" and self._authorized():
                    assert request["model"] == "base-model" and request["temperature"] == 0.0
                    stub.completions += 1
                    self._send(200, json.dumps({"usage": {"completion_tokens": request["max_tokens"]}}).encode())

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)
        self.thread.start()

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


@pytest.fixture
def stub() -> Iterator[_StubServer]:
    server = _StubServer(SCRAPES, key="test-key")
    yield server
    server.close()


def test_the_panels_name_metrics_that_exist() -> None:
    for _, lines in om.PANELS:
        for metric, _, _ in lines:
            assert metric in exposed_names(), metric


def test_a_scrape_keeps_deltaserve_samples_with_their_labels() -> None:
    samples = om.parse_scrape(_page(SCRAPES[2]), 10.0, 1.7e9)
    names = {s["metric"] for s in samples}
    assert all(n.startswith("deltaserve_") and not n.endswith("_created") for n in names), names
    assert "deltaserve_finetune_tokens_total" in names  # counters keep their _total name
    assert all(s["labels"]["finetune_job"] == JOB and s["t"] == 10.0 for s in samples)
    slo = {s["labels"]["objective"]: s["value"] for s in samples if s["metric"] == "deltaserve_slo_attainment_ratio"}
    assert slo == {"ttft": 1.0, "tpot": 0.75, "both": 0.75}
    # a metric without a value yet has its HELP and TYPE lines only: no sample
    assert not [s for s in om.parse_scrape(_page(SCRAPES[0]), 0.0, 1.7e9) if s["metric"] == "deltaserve_loss"]


def test_counter_rate_counts_a_reset_and_merges_short_intervals() -> None:
    ts, rs = om.counter_rate([0.0, 5.0, 10.0, 10.4, 15.0], [0.0, 500.0, 1000.0, 20.0, 520.0], min_interval=2.5)
    # 10 -> 15 merges the 0.4 s interval; the drop to 20 is a restart: 20 + 500 tokens in 5 s
    assert ts == [2.5, 7.5, 12.5] and rs == [100.0, 100.0, 104.0]


def test_a_run_against_a_server_writes_every_sample_and_refuses_to_overwrite(stub: _StubServer, tmp_path: Path,
                                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DELTASERVE_API_KEY", "test-key")  # the key from the environment, as documented
    out = tmp_path / "run"
    argv = ["--server", stub.url, "--duration", "1.0", "--every", "0.25", "--rate", "8", "--out", str(out),
            "--commit", "abc123"]
    assert om.main(argv) == 0
    report = json.loads((out / om.JSON_NAME).read_text())
    png = (out / om.PNG_NAME).read_bytes()
    assert png.startswith(b"\x89PNG")

    assert report["schema"] == "deltaserve-operator-metrics/1"
    env = report["environment"]
    assert env["commit"] == "abc123" and env["vllm_version"] == "0.32.0" and env["model"] == "base-model"
    assert env["settings"] == {"duration_s": 1.0, "every_s": 0.25, "rate_per_s": 8.0, "max_tokens": 8,
                               "temperature": 0.0}
    assert report["scrapes"] and all(s["ok"] for s in report["scrapes"])
    assert stub.served == len(report["scrapes"]) >= 4
    for s in report["samples"]:
        assert set(s) == {"t", "time", "metric", "labels", "value"} and s["metric"].startswith("deltaserve_")
    # every sample of every scrape: one tokens sample per scrape, the reset kept as scraped
    tokens = om.series_of(report["samples"], "deltaserve_finetune_tokens_total")[JOB]
    assert len(tokens[0]) == len(report["scrapes"]) and tokens[1][:4] == [0.0, 384.0, 768.0, 128.0]
    assert report["summary"][JOB]["deltaserve_adapter_step"]["last"][1] == 7.0
    client = report["client"]
    assert client["answered_200"] == stub.completions >= 4 and client["failed"] == 0 and stub.unauthorized == 0

    # results are kept unless --force: nothing is scraped or rewritten
    served = stub.served
    assert om.main(argv) == 2
    assert stub.served == served and (out / om.PNG_NAME).read_bytes() == png
    assert om.main([*argv, "--force", "--duration", "0.5"]) == 0 and stub.served > served


def test_the_figure_says_which_series_had_no_samples(tmp_path: Path) -> None:
    """A job before its first optimizer step and publish: those panels say so instead of plotting nothing."""
    samples = [x for i, snap in enumerate(SCRAPES[:1] * 3) for x in om.parse_scrape(_page(snap), 5.0 * i, 1.7e9)]
    report = {"schema": "deltaserve-operator-metrics/1", "environment": {"model": "m", "settings": {"every_s": 5}},
              "samples": samples}
    (tmp_path / "in.json").write_text(json.dumps(report))
    empty = om.plot(report, tmp_path / "fig.png")
    assert "deltaserve_loss" in empty and "deltaserve_published_version" in empty
    assert 'deltaserve_slo_attainment_ratio{objective="ttft"}' in empty
    assert "deltaserve_adapter_step" not in empty and (tmp_path / "fig.png").stat().st_size > 0

    out = tmp_path / "replot"
    assert om.main(["--plot-only", str(tmp_path / "in.json"), "--out", str(out)]) == 0
    assert (out / om.PNG_NAME).is_file() and json.loads((out / om.JSON_NAME).read_text()) == report
