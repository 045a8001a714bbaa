"""``deltaserve jobs``: the operator's client of a server's fine-tuning jobs API (``/v1/fine_tuning/jobs``).

    deltaserve jobs create  --model M --training-file F [--suffix S] [--n-epochs N] [--learning-rate-multiplier X]
                            [--batch-size TOKENS] [--seed N] [--metadata K=V ...] [--deltaserve JSON|@FILE]
                            --server URL            start a job (the server's previous one must have ended)
    deltaserve jobs list    --server URL            the jobs, one line each
    deltaserve jobs get     [ID] --server URL       one job as JSON
    deltaserve jobs pause|resume|cancel [ID] ...    the operator's controls (prints the job's status)
    deltaserve jobs events  [ID] [--limit N] [--after EVENT_ID]   recent events, oldest of the page first
    deltaserve jobs watch   [ID] [--interval S]     a one-line progress bar until the job ends (Ctrl-C leaves)

``ID`` may be left out when the server runs one job. The key is ``--api-key`` or ``DELTASERVE_API_KEY`` (the
server's ``--api-key``). Standard library only: the client runs anywhere Python does, without torch or an engine.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
import urllib.error
import urllib.parse
import urllib.request
from typing import Any, TextIO

__all__ = ["JobsClient", "JobsClientError", "add_jobs_arguments", "create_body", "progress_line", "run_jobs"]

_ENDED = ("succeeded", "failed", "cancelled")


class JobsClientError(ValueError):
    """A request the server refused or could not be sent; the message is the server's (OpenAI error) or why not."""


class JobsClient:
    """JSON calls to one server's jobs API."""

    def __init__(self, server: str, api_key: str | None = None, timeout_s: float = 90.0) -> None:
        self.base = server.rstrip("/")
        if not self.base.startswith(("http://", "https://")):
            self.base = "http://" + self.base
        self.api_key = api_key
        self.timeout_s = timeout_s

    def request(self, method: str, path: str, query: dict[str, Any] | None = None, body: Any = None) -> Any:
        url = f"{self.base}/v1/fine_tuning/jobs{path}"
        params = {k: v for k, v in (query or {}).items() if v is not None}
        if params:
            url += "?" + urllib.parse.urlencode(params)
        headers = {"Accept": "application/json", "Content-Type": "application/json"}
        if self.api_key:
            headers["Authorization"] = f"Bearer {self.api_key}"
        data = json.dumps(body).encode() if body is not None else b"" if method == "POST" else None
        req = urllib.request.Request(url, method=method, headers=headers, data=data)
        try:
            with urllib.request.urlopen(req, timeout=self.timeout_s) as resp:
                return json.loads(resp.read() or b"null")
        except urllib.error.HTTPError as err:
            raise JobsClientError(f"{method} {url}: HTTP {err.code}: {_error_message(err.read())}") from None
        except (urllib.error.URLError, OSError) as err:
            reason = getattr(err, "reason", err)
            raise JobsClientError(f"cannot reach {self.base}: {reason}") from None

    def create(self, body: dict[str, Any]) -> dict[str, Any]:
        """Start a job from OpenAI's create ``body`` (DeltaServe's own keys under ``deltaserve``)."""
        return dict(self.request("POST", "", body=body))

    def jobs(self) -> list[dict[str, Any]]:
        return list(self.request("GET", "")["data"])

    def resolve(self, job_id: str | None) -> str:
        """``job_id``, or the server's only job when none is given."""
        if job_id:
            return job_id
        jobs = self.jobs()
        if len(jobs) != 1:
            raise JobsClientError(f"the server runs {len(jobs)} jobs ({', '.join(j['id'] for j in jobs) or 'none'}): "
                                  "name one")
        return str(jobs[0]["id"])

    def get(self, job_id: str) -> dict[str, Any]:
        return dict(self.request("GET", f"/{urllib.parse.quote(job_id)}"))

    def control(self, job_id: str, op: str) -> dict[str, Any]:
        return dict(self.request("POST", f"/{urllib.parse.quote(job_id)}/{op}"))

    def events(self, job_id: str, limit: int = 20, after: str | None = None) -> dict[str, Any]:
        return dict(self.request("GET", f"/{urllib.parse.quote(job_id)}/events", {"limit": limit, "after": after}))


def _error_message(raw: bytes) -> str:
    try:
        body = json.loads(raw)
    except (json.JSONDecodeError, UnicodeDecodeError):
        return raw.decode(errors="replace").strip()[:500] or "(no body)"
    if isinstance(body, dict) and isinstance(body.get("error"), dict):
        return str(body["error"].get("message"))
    if isinstance(body, dict) and "detail" in body:
        return str(body["detail"])
    return json.dumps(body)[:500]


def _duration(seconds: float) -> str:
    seconds = max(int(seconds), 0)
    h, rest = divmod(seconds, 3600)
    m, s = divmod(rest, 60)
    return f"{h}h{m:02d}m" if h else f"{m}m{s:02d}s" if m else f"{s}s"


def progress_line(job: dict[str, Any], width: int = 24, now: float | None = None) -> str:
    """One line for ``watch``: status, a bar of the data trained, tokens trained, loss, step and ETA."""
    ds = job.get("deltaserve") or {}
    fraction = float((ds.get("progress") or {}).get("fraction") or 0.0)
    filled = min(width, int(round(fraction * width)))
    loss = ds.get("loss")
    eta = job.get("estimated_finish")
    now = time.time() if now is None else now
    tail = (f"ETA {_duration(eta - now)}" if eta else "done" if job.get("status") in _ENDED
            else "ETA n/a")
    return (f"{job.get('id')} {job.get('status'):<9} [{'#' * filled}{'.' * (width - filled)}] {fraction * 100:5.1f}% "
            f"{job.get('trained_tokens', 0)} tok  loss {f'{loss:.4f}' if isinstance(loss, (int, float)) else 'n/a'}  "
            f"step {ds.get('step', 0)}  {tail}")


def _watch(client: JobsClient, job_id: str, interval: float, out: TextIO) -> int:
    tty = out.isatty()
    last = ""
    try:
        while True:
            job = client.get(job_id)
            line = progress_line(job)
            if tty:
                out.write("\r\x1b[2K" + line)  # rewrite the one line in place
            elif line != last:
                out.write(line + "\n")
            out.flush()
            last = line
            if job.get("status") in _ENDED:
                if tty:
                    out.write("\n")
                return 1 if job["status"] == "failed" else 0
            time.sleep(interval)
    except KeyboardInterrupt:
        out.write("\n")
        return 130


def _list_line(job: dict[str, Any]) -> str:
    ds = job.get("deltaserve") or {}
    loss = ds.get("loss")
    return (f"{job['id']:<32} {job['status']:<10} step {ds.get('step', 0):<6} {job.get('trained_tokens', 0):>10} tok  "
            f"loss {f'{loss:.4f}' if isinstance(loss, (int, float)) else 'n/a':<8} "
            f"{job.get('fine_tuned_model') or '-'}")


def create_body(args: argparse.Namespace) -> dict[str, Any]:
    """OpenAI's create body from ``deltaserve jobs create``'s arguments; raises :class:`JobsClientError` naming a
    bad one."""
    body: dict[str, Any] = {"model": args.model, "training_file": args.training_file}
    if args.suffix:
        body["suffix"] = args.suffix
    hyper = {k: v for k, v in (("n_epochs", args.n_epochs), ("learning_rate_multiplier", args.learning_rate_multiplier),
                               ("batch_size", args.batch_size)) if v is not None}
    if hyper:
        body["hyperparameters"] = hyper
    if args.seed is not None:
        body["seed"] = args.seed
    if args.metadata:
        pairs = [item.partition("=") for item in args.metadata]
        bad = [key for key, eq, _ in pairs if not eq or not key]
        if bad:
            raise JobsClientError(f"--metadata: give KEY=VALUE pairs, got {args.metadata!r}")
        body["metadata"] = {key: value for key, _, value in pairs}
    if args.deltaserve:
        raw = args.deltaserve
        try:
            text = open(raw[1:], encoding="utf-8").read() if raw.startswith("@") else raw
            body["deltaserve"] = json.loads(text)
        except (OSError, json.JSONDecodeError) as exc:
            raise JobsClientError(f"--deltaserve: a JSON object of the job file's keys, or @FILE holding one: {exc}"
                                  ) from None
    return body


def run_jobs(args: argparse.Namespace, out: TextIO | None = None) -> int:
    """``deltaserve jobs ...``; raises :class:`JobsClientError` (a ValueError: one line, exit 2) on a refusal."""
    out = out or sys.stdout
    client = JobsClient(args.server, args.api_key or os.environ.get("DELTASERVE_API_KEY"))
    action = args.jobs_command
    if action == "create":
        job = client.create(create_body(args))
        out.write(json.dumps(job, indent=2) + "\n" if args.json else _list_line(job) + "\n")
        return 0
    if action == "list":
        jobs = client.jobs()
        if args.json:
            out.write(json.dumps(jobs, indent=2) + "\n")
        for job in jobs if not args.json else ():
            out.write(_list_line(job) + "\n")
        return 0
    job_id = client.resolve(args.job_id)
    if action == "get":
        out.write(json.dumps(client.get(job_id), indent=2) + "\n")
    elif action in ("pause", "resume", "cancel"):
        job = client.control(job_id, action)
        out.write(json.dumps(job, indent=2) + "\n" if args.json else _list_line(job) + "\n")
    elif action == "events":
        page = client.events(job_id, limit=args.limit, after=args.after)
        if args.json:
            out.write(json.dumps(page, indent=2) + "\n")
        else:
            for event in reversed(page["data"]):  # the API pages newest first; a terminal reads oldest first
                stamp = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(event["created_at"]))
                out.write(f"{stamp} {event['id']:<14} {event['level']:<5} {event['message']}\n")
            if page.get("has_more") and page["data"]:
                out.write(f"(older events: --after {page['data'][-1]['id']})\n")
    elif action == "watch":
        return _watch(client, job_id, args.interval, out)
    return 0


def add_jobs_arguments(parser: argparse.ArgumentParser) -> None:
    parser.description = __doc__
    parser.formatter_class = argparse.RawDescriptionHelpFormatter
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--server", required=True, help="the server's base URL, e.g. http://127.0.0.1:8000")
    common.add_argument("--api-key", default=None, help="the server's API key (default: $DELTASERVE_API_KEY)")
    common.add_argument("--json", action="store_true", help="print the server's JSON")
    sub = parser.add_subparsers(dest="jobs_command", required=True)
    sub.add_parser("list", parents=[common], help="the server's fine-tuning jobs")
    create = sub.add_parser("create", parents=[common], help="start a fine-tuning job (OpenAI's create)")
    create.add_argument("--model", required=True, help="the server's base model, as it serves it")
    create.add_argument("--training-file", required=True, help="a dataset path inside the server's data directory")
    create.add_argument("--suffix", default=None, help="the adapter's name (the job id is ftjob-SUFFIX)")
    create.add_argument("--n-epochs", type=int, default=None, help="epochs over the training file")
    create.add_argument("--learning-rate-multiplier", type=float, default=None,
                        help="times DeltaServe's default learning rate (1e-3)")
    create.add_argument("--batch-size", type=int, default=None, help="tokens per optimizer step")
    create.add_argument("--seed", type=int, default=None, help="the job's seed")
    create.add_argument("--metadata", nargs="*", default=None, metavar="KEY=VALUE", help="kept with the job")
    create.add_argument("--deltaserve", default=None, metavar="JSON|@FILE",
                        help="DeltaServe's own job keys (those of the job file), e.g. '{\"lora\": {\"r\": 16}}'")
    for name, text in (("get", "one job as JSON"), ("pause", "stop admitting fine-tuning (nothing is lost)"),
                       ("resume", "admit fine-tuning again"),
                       ("cancel", "stop the job with a final checkpoint"),
                       ("events", "the job's recent events"), ("watch", "a progress bar until the job ends")):
        p = sub.add_parser(name, parents=[common], help=text)
        p.add_argument("job_id", nargs="?", default=None, help="the job's id (default: the server's only job)")
        if name == "events":
            p.add_argument("--limit", type=int, default=20, help="events per page (1-1000)")
            p.add_argument("--after", default=None, help="page on from this event id (older events)")
        if name == "watch":
            p.add_argument("--interval", type=float, default=2.0, help="seconds between refreshes")
