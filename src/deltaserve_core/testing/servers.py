"""Test support for servers run as subprocesses, as operators run them: JSON over HTTP (with an API key or not),
waiting until a server answers, and finding every process a server started.

Used by the tests of ``deltaserve serve``, ``vllm serve``, SGLang's and S-LoRA's servers; stdlib only, so it
imports in every engine's environment.
"""

from __future__ import annotations

import json
import os
import subprocess
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

__all__ = ["alive", "http_json", "process_tree", "processes_with_env", "wait_until_up"]


def http_json(method: str, url: str, body: Any = None, *, key: str | None = None,
              timeout: float = 120.0) -> tuple[int, Any]:
    """``(status, payload)`` of one request; ``key``: sent as ``Authorization: Bearer <key>``.

    The payload is the parsed JSON body, or the body as text when it is not JSON (some endpoints answer plain
    text); an error status is returned, not raised. Connection failures raise ``OSError``."""
    headers = {"Content-Type": "application/json"}
    if key is not None:
        headers["Authorization"] = f"Bearer {key}"
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(url, data=data, method=method, headers=headers)
    try:
        with urllib.request.urlopen(req, timeout=timeout) as resp:
            status, raw = resp.status, resp.read()
    except urllib.error.HTTPError as err:
        status, raw = err.code, err.read()
    try:
        return status, json.loads(raw or b"null")
    except (json.JSONDecodeError, UnicodeDecodeError):
        return status, raw.decode(errors="replace")


def wait_until_up(url: str, proc: subprocess.Popen, deadline_s: float, *, key: str | None = None,
                  poll_s: float = 1.0) -> str | None:
    """Poll ``GET url`` until it answers 200. ``None`` once it does; otherwise why not (the process exited, or
    the deadline passed), for the caller's failure message. The caller stops the process."""
    deadline = time.monotonic() + deadline_s
    while True:
        if proc.poll() is not None:
            return f"exited with {proc.returncode}"
        try:
            if http_json("GET", url, key=key, timeout=5.0)[0] == 200:
                return None
        except OSError:
            pass
        if time.monotonic() > deadline:
            return f"did not come up within {deadline_s:.0f} s"
        time.sleep(poll_s)


def processes_with_env(entry: str) -> list[int]:
    """Pids of the running processes whose environment holds ``entry`` (``"NAME=value"``).

    A test sets a unique entry in a server's environment; every process the server starts inherits it, whatever
    its parentage (daemonised, re-parented to init), so this finds orphans that a process tree walk misses."""
    found = []
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            env = Path(f"/proc/{pid}/environ").read_bytes()
        except OSError:
            continue
        if entry.encode() in env.split(b"\0"):
            found.append(int(pid))
    return found


def _children() -> dict[int, list[int]]:
    kids: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            stat = Path(f"/proc/{entry}/stat").read_text()
        except OSError:
            continue
        # the command name (field 2) may hold spaces and parentheses: the fields after its last ')' are fixed
        ppid = int(stat.rsplit(")", 1)[1].split()[1])
        kids.setdefault(ppid, []).append(int(entry))
    return kids


def process_tree(pid: int) -> list[int]:
    """``pid`` and every live descendant of it."""
    kids, out, todo = _children(), [], [pid]
    while todo:
        p = todo.pop()
        if Path(f"/proc/{p}").exists():
            out.append(p)
        todo.extend(kids.get(p, []))
    return out


def alive(pid: int) -> bool:
    """Whether ``pid`` runs (a zombie does not)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state != "Z"  # a zombie has exited; only its parent's wait is missing
