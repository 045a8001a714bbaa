"""Checks of a host's life cycle and error paths: ``shutdown`` (twice, with requests pending, leaving nothing
running), the refusal of an adapter the host never loaded, and an abort that must not outlive its step.

The shutdown checks need a host of their own, since shutting down the suite's host would end the run: one host of the
same kind is started in a child process (as ``capabilities__dtypes_follow_the_engine_dtype`` does), taken through
:data:`LIFECYCLE_PROBES` in order, and its report is shared by every check that reads it (one child start per suite
run). A later lifecycle rule adds a probe (a function of the child's env and the report so far) and a check that
reads its entry.

Written for the audit of 2026-12-05 (docs/conformance.md); they register into :data:`.checks.CHECKS` like the
fixed checks there.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

from deltaserve_core.driver import ClientRequest
from deltaserve_core.types import FineTuneSample

from .checks import (
    _fail,
    _inject_into_first_idle,
    _inject_into_first_prefill,
    _needs_abort,
    check,
    second_host_command,
    second_host_from_argv,
)
from .harness import ConformanceEnv, Recorder, make_prompts, make_samples

__all__ = ["LIFECYCLE_PROBES", "child_host_report"]

_MARK = "DELTASERVE-LIFECYCLE-PROBE "
#: seconds a probe allows a ``shutdown()`` call, and the child to exit once it printed its report
_SHUTDOWN_WAIT_S = 20.0
_EXIT_WAIT_S = 20.0
#: seconds the processes and threads a host started get to end after ``shutdown()`` returned
_GRACE_S = 5.0


# ------------------------------------------------------------------------------------------ the child's probes


def _processes() -> dict[int, tuple[int, str, str]]:
    """pid -> (parent pid, state, command line) of every process, from /proc (Linux); empty elsewhere."""
    out: dict[int, tuple[int, str, str]] = {}
    proc = Path("/proc")
    if not proc.is_dir():
        return out
    for entry in proc.iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
            cmd = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace").strip()
        except OSError:
            continue
        rest = stat[stat.rfind(")") + 2:].split()  # after "pid (comm) ": state ppid ...
        out[int(entry.name)] = (int(rest[1]), rest[0], cmd)
    return out


#: processes of the interpreter itself, not of the host: Python's multiprocessing helpers live until it exits
_INTERPRETER_HELPERS = ("multiprocessing.resource_tracker", "multiprocessing.forkserver")


def _live_descendants(root: int) -> dict[int, str]:
    """pid -> command line of every live (not zombie) descendant of ``root`` but the interpreter's own helpers."""
    table = _processes()
    children: dict[int, list[int]] = {}
    for pid, (ppid, _, _) in table.items():
        children.setdefault(ppid, []).append(pid)
    found: dict[int, str] = {}
    todo = list(children.get(root, ()))
    while todo:
        pid = todo.pop()
        ppid, state, cmd = table[pid]
        todo.extend(children.get(pid, ()))
        if state not in ("Z", "X") and not any(h in cmd for h in _INTERPRETER_HELPERS):
            found[pid] = cmd[:200]
    return found


def _probe_serve(env: ConformanceEnv, ctx: dict) -> dict:
    """One client request with a fine-tuning row in its step: the host is alive and working before it stops."""
    sample = FineTuneSample(4700, (5, 9, 14, 7, 11, 6), (False,) * 3 + (True,) * 3)
    rec = Recorder(inject=_inject_into_first_prefill([sample]))
    env.install(rec)
    try:
        out = env.run([ClientRequest("lifecycle-serve", (3, 4, 5, 6, 7, 8, 9), 3)])
    finally:
        env.install(None)
    return {"tokens": len(out[0].token_ids) if out else 0,
            "finetune_rows_ran": any(4700 in r.finetune_sample_ids for r in rec.records)}


def _timed_shutdown(env: ConformanceEnv) -> dict:
    """Call ``shutdown()`` from a daemon thread (so a call that never returns cannot keep the child alive)."""
    result: dict = {}

    def call() -> None:
        t0 = time.monotonic()
        try:
            env.host.shutdown()  # type: ignore[attr-defined]
        except Exception as exc:  # noqa: BLE001 - reported
            result["error"] = f"{type(exc).__name__}: {exc}"
        result["seconds"] = round(time.monotonic() - t0, 3)

    worker = threading.Thread(target=call, name="deltaserve-lifecycle-shutdown", daemon=True)
    worker.start()
    worker.join(_SHUTDOWN_WAIT_S)
    result["returned"] = not worker.is_alive()
    return result


def _tensor_bytes() -> int:
    """Bytes of every distinct tensor storage alive in this process (host and device memory), after a collection.

    What a host holds is judged by what Python can reach: an engine's caches live in tensors its objects keep."""
    import gc

    import torch

    gc.collect()
    seen: set[tuple[str, int]] = set()
    total = 0
    for obj in gc.get_objects():
        try:
            if not isinstance(obj, torch.Tensor):
                continue
            storage = obj.untyped_storage()
            key = (str(storage.device), storage.data_ptr())
            if key[1] == 0 or key in seen:
                continue
            seen.add(key)
            total += storage.nbytes()
        except Exception:  # noqa: BLE001 - meta, sparse or wrapper tensors have no plain storage: not memory held
            continue
    return total


#: client requests kept in flight across shutdown(): prompt length and count fill most of the default step budget, so
#: the KV they hold dwarfs the noise of anything else a probe allocates
_HELD_REQUESTS, _HELD_PROMPT = 16, 120


def _probe_request_memory(env: ConformanceEnv, ctx: dict) -> dict:
    """Tensor memory before client requests, and with ``_HELD_REQUESTS`` of them prefilled and decoding."""
    before = _tensor_bytes()
    vocab = max(4, env.vocab_size - 3)
    for i in range(_HELD_REQUESTS):
        prompt = tuple(3 + (31 * i + 7 * j) % vocab for j in range(_HELD_PROMPT))
        env.host.submit(ClientRequest(f"lifecycle-held-{i}", prompt, 64))  # type: ignore[attr-defined]
    for _ in range(3):
        env.host.step()  # type: ignore[attr-defined]
    return {"before": before, "held": _tensor_bytes(), "unfinished": bool(env.host.has_unfinished())}  # type: ignore[attr-defined]


def _probe_memory_after_shutdown(env: ConformanceEnv, ctx: dict) -> dict:
    if not ctx["shutdown_with_a_request_pending"].get("returned"):
        return {"skipped": "the first shutdown() never returned"}
    return {"after": _tensor_bytes()}


def _probe_shutdown_with_a_request_pending(env: ConformanceEnv, ctx: dict) -> dict:
    """The first ``shutdown()``, with one client request submitted and never stepped (and the request-memory probe's
    requests still decoding); counts the engine steps whose records reach the step sink while it runs."""
    env.host.submit(ClientRequest("lifecycle-pending", (3, 5, 7, 9, 11), 50))  # type: ignore[attr-defined]
    during: list[int] = []
    env.host.report_step_time(lambda record: during.append(record.step_id))  # type: ignore[attr-defined]
    result = _timed_shutdown(env)
    result["steps_during"] = len(during)
    return result


def _probe_shutdown_again(env: ConformanceEnv, ctx: dict) -> dict:
    if not ctx["shutdown_with_a_request_pending"].get("returned"):
        return {"skipped": "the first shutdown() never returned"}
    return _timed_shutdown(env)


def _probe_left_running(env: ConformanceEnv, ctx: dict) -> dict:
    """Processes and non-daemon threads the host started that are still running ``_GRACE_S`` after shutdown."""
    deadline = time.monotonic() + _GRACE_S
    while True:
        procs = {pid: cmd for pid, cmd in _live_descendants(os.getpid()).items() if pid not in ctx["_procs_before"]}
        threads = [t.name for t in threading.enumerate() if t.ident not in ctx["_threads_before"] and not t.daemon
                   and t is not threading.current_thread() and t.is_alive()]
        if (not procs and not threads) or time.monotonic() > deadline:
            return {"processes": [f"pid {pid}: {cmd}" for pid, cmd in sorted(procs.items())], "threads": threads,
                    "procfs": Path("/proc").is_dir()}
        time.sleep(0.2)


#: (name, probe) in the order the child runs them; a probe gets the env and the report so far and returns a JSON-able
#: dict (an exception is reported as {"error": ...}). Add a lifecycle rule here, and a check that reads its entry.
LIFECYCLE_PROBES: list[tuple[str, Callable[[ConformanceEnv, dict], dict]]] = [
    ("serve", _probe_serve),
    ("request_memory", _probe_request_memory),
    ("shutdown_with_a_request_pending", _probe_shutdown_with_a_request_pending),
    ("memory_after_shutdown", _probe_memory_after_shutdown),
    ("shutdown_again", _probe_shutdown_again),
    ("left_running", _probe_left_running),
]


def _lifecycle_child() -> None:
    """Child-process entry: start a host of the kind under test, run every probe, print one marked JSON line."""
    ctx: dict = {"_threads_before": {t.ident for t in threading.enumerate()},
                 "_procs_before": set(_live_descendants(os.getpid()))}
    try:
        env = second_host_from_argv()
    except Exception as exc:  # noqa: BLE001 - reported to the parent, which skips with it
        print(_MARK + json.dumps({"stage": "start", "error": f"{type(exc).__name__}: {exc}"}), flush=True)
        return
    report: dict = {"stage": "done"}
    for name, probe in LIFECYCLE_PROBES:
        try:
            report[name] = probe(env, {**ctx, **report})
        except Exception as exc:  # noqa: BLE001 - reported per probe
            report[name] = {"error": f"{type(exc).__name__}: {exc}"}
    print(_MARK + json.dumps(report), flush=True)
    if not report.get("shutdown_with_a_request_pending", {}).get("returned"):
        sys.stdout.flush()
        os._exit(0)  # a shutdown() stuck in its thread: that is reported, do not also report a hung exit


_REPORTS: dict[tuple[int, str], dict] = {}


def child_host_report(env: ConformanceEnv, entry: str, mark: str, *, model_shape: str = "test",
                      wait_s: float = 300.0) -> dict:
    """Run ``entry`` (``module:function``) in a child process against a second host of ``env``'s kind and return
    the JSON it printed after ``mark``: ``{"stage": "no report", "error": ...}`` when it printed none within
    ``wait_s``; ``exit_s`` added: seconds from its report to its exit (None past ``_EXIT_WAIT_S``). Started once per
    env and entry; every check that reads the report shares it."""
    import pytest

    key = (id(env.host), entry)
    if key in _REPORTS:
        return _REPORTS[key]
    if not env.host_spec:
        pytest.skip("the env does not say how its host was started (ConformanceEnv.host_spec), so no second host of "
                    "its kind can be started")
    argv, child_env = second_host_command(env, env.dtype, entry, model_shape=model_shape)
    child = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=child_env,
                             start_new_session=True)
    tail: list[str] = []
    reported = threading.Event()
    found: list[tuple[str, float]] = []

    def drain(stream, marked: bool) -> None:  # noqa: ANN001
        for line in stream:
            if marked and line.startswith(mark) and not found:
                found.append((line, time.monotonic()))
                reported.set()
            elif not marked:
                tail.append(line.rstrip())
                del tail[:-8]
        if marked:
            reported.set()  # the child closed its stdout (exited) with or without a report

    readers = [threading.Thread(target=drain, args=(child.stdout, True), daemon=True),
               threading.Thread(target=drain, args=(child.stderr, False), daemon=True)]
    for r in readers:
        r.start()
    exit_s: float | None = None
    try:
        reported.wait(wait_s)
        if found:
            try:
                child.wait(timeout=max(0.0, _EXIT_WAIT_S - (time.monotonic() - found[0][1])))
                exit_s = time.monotonic() - found[0][1]
            except subprocess.TimeoutExpired:
                exit_s = None
    finally:
        try:  # end the child, and anything it left in its session (its report says what)
            os.killpg(child.pid, 9)
        except OSError:
            pass
        child.wait()
        for r in readers:
            r.join(5.0)
    if not found:
        report: dict = {"stage": "no report", "error": f"exited {child.returncode}: {' | '.join(tail[-5:])}"}
    else:
        report = json.loads(found[0][0][len(mark):])
    report["exit_s"] = exit_s
    _REPORTS[key] = report
    return report


def _lifecycle_report(env: ConformanceEnv) -> dict:
    """The lifecycle child's report for the kind of host ``env`` runs."""
    return child_host_report(env, "deltaserve_conformance.checks_lifecycle:_lifecycle_child", _MARK)


def _started_report(env: ConformanceEnv) -> dict:
    """The report of a child host that started and served; skips (could not start) or fails (could not serve)."""
    import pytest

    report = _lifecycle_report(env)
    if report["stage"] == "no report":
        raise _fail(env, "driver", f"the lifecycle probe of {env.host_spec!r} gave no report (a host of the same kind "
                    f"did not start and serve within 300 s?): {report['error']}")
    if report["stage"] == "start":
        pytest.skip(f"a second {env.host_spec} host could not start in a child process "
                    f"({report['error'][:300]}); the shutdown rules were not checked")
    serve = report.get("serve", {})
    if "error" in serve or not serve.get("tokens"):
        raise _fail(env, "driver", f"a host of the same kind, started in a child process, failed to serve one request "
                    f"with a fine-tuning row before its shutdown: {serve}")
    return report


# ------------------------------------------------------------------------------------------ shutdown


@check("driver", spawns=True)
def check_driver__shutdown_is_idempotent(env: ConformanceEnv) -> None:
    """A second ``shutdown()`` returns without raising (the core, a server's signal handler and a test fixture may each
    call it). Checked on a host of the same kind started in a child process, after it served one request with a
    fine-tuning row."""
    report = _started_report(env)
    first, again = report["shutdown_with_a_request_pending"], report["shutdown_again"]
    if "skipped" in again:
        return  # the first call never returned: driver__shutdown_returns_with_requests_pending says so
    if "error" in first:
        raise _fail(env, "driver", f"the first shutdown() raised {first['error']}; expected it to stop the engine")
    if not again.get("returned"):
        raise _fail(env, "driver", f"a second shutdown() did not return within {_SHUTDOWN_WAIT_S:.0f} s; expected it "
                    "to return at once (idempotent)")
    if "error" in again:
        raise _fail(env, "driver", f"a second shutdown() raised {again['error']}; expected shutdown to be idempotent "
                    "(a second call returns without raising)")


@check("driver", spawns=True)
def check_driver__shutdown_returns_with_requests_pending(env: ConformanceEnv) -> None:
    """``shutdown()`` returns also while a client request is pending (submitted, never stepped): pending requests
    are dropped, never waited for (nothing else will step the engine once the core decided to stop)."""
    first = _started_report(env)["shutdown_with_a_request_pending"]
    if not first.get("returned"):
        raise _fail(env, "driver", f"shutdown() called with one client request submitted and never stepped did not "
                    f"return within {_SHUTDOWN_WAIT_S:.0f} s; expected it to drop the request and return")


@check("driver", spawns=True)
def check_driver__shutdown_drops_pending_requests_without_stepping(env: ConformanceEnv) -> None:
    """``shutdown()`` with client requests pending drops them: it runs no engine step for them (a graceful drain that
    finishes them first waits for as long as they take, and admits fine-tuning during a stop). Judged by the step
    records delivered while the call ran, with 17 requests unfinished (16 decoding, one never stepped)."""
    first = _started_report(env)["shutdown_with_a_request_pending"]
    if not first.get("returned") or "steps_during" not in first:
        return  # driver__shutdown_returns_with_requests_pending reports a call that never returned
    if first["steps_during"]:
        raise _fail(env, "driver", f"shutdown() called with 17 client requests unfinished ran {first['steps_during']} "
                    "engine step(s) before it returned (step records delivered during the call); expected the pending "
                    "requests dropped, never stepped to completion")


@check("driver", spawns=True)
def check_driver__shutdown_leaves_nothing_running(env: ConformanceEnv) -> None:
    """Once ``shutdown()`` returned, no process the host started is alive (after a grace of a few seconds; Python's
    own multiprocessing helpers aside), no non-daemon thread it started is running, and the process that owned it
    exits."""
    report = _started_report(env)
    left = report["left_running"]
    if not report["shutdown_with_a_request_pending"].get("returned"):
        return  # driver__shutdown_returns_with_requests_pending says so
    problems = []
    if "error" in left:
        problems.append(f"the probe failed: {left['error']}")
    if left.get("processes"):
        problems.append(f"{len(left['processes'])} process(es) it started still alive {_GRACE_S:.0f} s after "
                        f"shutdown() returned: {left['processes'][:3]}")
    if left.get("threads"):
        problems.append(f"non-daemon thread(s) it started still running {_GRACE_S:.0f} s after shutdown() returned: "
                        f"{left['threads'][:5]}")
    if report["exit_s"] is None:
        problems.append(f"the process that owned the host did not exit within {_EXIT_WAIT_S:.0f} s of its last "
                        "statement")
    if problems:
        raise _fail(env, "driver", "expected nothing the host started left running once shutdown() returned; "
                    + "; ".join(problems))


#: what shutdown() may keep of the memory its pending requests took: half of it, or this many bytes (allocator and
#: bookkeeping noise of a host whose KV lives in a pool reserved at start-up, which requests do not grow)
_KEPT_FLOOR = 512 * 1024


@check("driver", spawns=True)
def check_driver__shutdown_releases_request_memory(env: ConformanceEnv) -> None:
    """Once ``shutdown()`` returned, the tensor memory the host took for client requests (KV caches, per-request
    state) is released, for the requests still pending too: the memory of an interrupted workload is not held for the
    life of the process. Measured in a child host as the bytes of every live tensor storage: before 16 requests of 120
    prompt tokens, with them decoding, and after shutdown() returned with them pending."""
    report = _started_report(env)
    if not report["shutdown_with_a_request_pending"].get("returned"):
        return  # driver__shutdown_returns_with_requests_pending says so
    memory, after = report["request_memory"], report["memory_after_shutdown"]
    for probe in (memory, after):
        if "error" in probe:
            raise _fail(env, "driver", f"the memory probe failed: {probe['error']}")
    grown = memory["held"] - memory["before"]
    kept = after["after"] - memory["before"]
    if grown < _KEPT_FLOOR:
        import pytest

        # the requests' memory is not in tensors this process reaches (an engine in a worker process, a KV pool
        # reserved at start-up): nothing here can say whether shutdown() releases it
        pytest.skip(f"{_HELD_REQUESTS} pending requests grew the tensor memory this process reaches by "
                    f"{grown / 2**20:.2f} MiB only (under {_KEPT_FLOOR / 2**20:.2f} MiB): their memory lives where "
                    "this probe cannot see it, so its release after shutdown() was not checked")
    allowed = max(grown // 2, _KEPT_FLOOR)
    if kept > allowed:
        raise _fail(env, "driver", f"{_HELD_REQUESTS} pending client requests took {grown / 2**20:.2f} MiB of tensor "
                    f"memory ({memory['before'] / 2**20:.2f} MiB before them); {kept / 2**20:.2f} MiB of it is still "
                    f"held after shutdown() returned; expected at most {allowed / 2**20:.2f} MiB (the memory of "
                    "dropped requests released)")


# ------------------------------------------------------------------------------------------ error paths


@check("driver")
def check_driver__unknown_adapter_refused(env: ConformanceEnv) -> None:
    """``submit`` refuses (raises) a request naming an adapter the host never loaded, also a spelling of a loaded
    one in other capitals or with spaces, and queues nothing for it: serving it on the base model (an engine's LoRA
    lookup that falls back to no adapter) hands the client tokens of weights it never asked for."""
    if env.host.has_unfinished():  # type: ignore[attr-defined]
        env.run_stepwise([])  # what was left is has_unfinished's concern, not this check's
    never = ["conformance-adapter-never-loaded", env.client_adapter.upper(), f" {env.client_adapter}"]
    accepted = []
    for i, adapter in enumerate(never):
        request = ClientRequest(f"unknown-adapter-{i}", (5, 6, 7, 8), 2, adapter=adapter)
        try:
            env.host.submit(request)  # type: ignore[attr-defined]
        except Exception:  # noqa: BLE001 - refusing is raising; which error is the host's choice
            continue
        accepted.append(adapter)
    leftover = env.host.has_unfinished()  # type: ignore[attr-defined]
    if leftover:
        env.run_stepwise([])
    if accepted:
        raise _fail(env, "driver", f"submit() accepted requests on adapters it never loaded: {accepted!r} (loaded: "
                    f"{env.client_adapter!r}); expected each refused by raising")
    if leftover:
        raise _fail(env, "driver", "submit() raised for adapters it never loaded but queued the requests anyway")


# ------------------------------------------------------------------------------------------ abort


@check("capture_activation", requires=_needs_abort)
def check_capture_activation__abort_does_not_outlive_its_step(env: ConformanceEnv) -> None:
    """An abort stops the step it was answered in and nothing after it: the next fine-tuning-only step, whose
    should_abort says False, runs every layer and completes its samples, and so do rows in the next client step (a
    host that keeps an "aborting" flag set until some later event voids them)."""
    num_layers = env.host.model_spec().num_layers  # type: ignore[attr-defined]
    fired: list[int] = []
    first = Recorder(inject=_inject_into_first_idle(make_samples(env, 2, seed=48, first_id=4800), fired),
                     abort_after_layer=1)
    env.install(first)
    env.host.run_idle_step()  # type: ignore[attr-defined]
    env.install(None)
    if not fired:
        raise _fail(env, "capture_activation", "run_idle_step() did not offer an empty batch to on_schedule, so no "
                    "fine-tuning-only step could be issued")
    problems = []
    for label, run in (("fine-tuning-only step", "idle"), ("client step", "client")):
        samples = make_samples(env, 2, seed=49 if run == "idle" else 50, first_id=4900 if run == "idle" else 5000)
        fired_next: list[int] = []
        rec = Recorder(inject=(_inject_into_first_idle(samples, fired_next) if run == "idle"
                               else _inject_into_first_prefill(samples)))
        env.install(rec)
        if run == "idle":
            env.host.run_idle_step()  # type: ignore[attr-defined]
        else:
            env.run(make_prompts(env, 2, seed=51, max_tokens=3, prefix="after-abort"))
        env.install(None)
        if not rec.injected:
            problems.append(f"the {label} after the abort took no rows")
            continue
        (step_id, _), = rec.injected.items()
        ids = sorted(s.sample_id for s in samples)
        record = rec.record_for(step_id)
        captured = {(layer, sid) for s, layer, sid, _ in rec.captures if s == step_id}
        want = {(layer, sid) for layer in range(num_layers) for sid in ids}
        if record is None or sorted(record.finetune_sample_ids) != ids or record.aborted_sample_ids:
            problems.append(f"the {label} after the abort (step {step_id}, should_abort always False) reported "
                            f"completed {sorted(record.finetune_sample_ids) if record else None}, aborted "
                            f"{sorted(record.aborted_sample_ids) if record else None}; expected completed {ids}")
        elif captured != want:
            problems.append(f"the {label} after the abort (step {step_id}) delivered {len(captured)} of {len(want)} "
                            "layer inputs")
    if problems:
        raise _fail(env, "capture_activation", f"step {fired[0]} was aborted at layer 1; expected later steps to run "
                    "whole: " + "; ".join(problems))
