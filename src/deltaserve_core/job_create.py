"""Creating a fine-tuning job over HTTP: OpenAI's create body turned into a
:class:`~deltaserve_core.job_config.JobConfig`, checked against the server's settings, and kept on disk so a
restarted server resumes it.

Engine-agnostic, no torch: the engine's runtime (:class:`~deltaserve_core.runtime.EngineRuntime`) calls
:func:`job_from_request` in the process that owns the job, then :func:`save_created` once the request is
accepted (before the job's dataset loads, which happens off the engine's thread: :mod:`.job_prepare`;
:func:`forget_created` if it fails there), and :func:`startup_job` when the server starts.

Where things are (``jobs`` settings, :class:`JobsSettings`): the training file is read only from inside the
operator's ``data_dir`` (symlinks resolved, so neither ``..`` nor a link leads out of it); each created job gets
``<dir>/<suffix>/`` with its ``job.yaml``, the request's own fields (``request.json``) and its checkpoints
(``checkpoints/``, where its published versions go too, and ``operator.json``: a pause or an end that a restart
keeps); ``<dir>/current`` names the newest created job. A restarted server starts its job file's job and every
created job that neither succeeded nor was cancelled (:func:`startup_jobs`), each from its newest checkpoint.

The body's fields, and what they become::

    model                     must be the served base model's name (or path)
    training_file             a path inside data_dir (relative to it, or absolute) -> dataset
    suffix                    -> adapter_name (and the job id ftjob-<suffix>); default job-<8 hex digits>
    hyperparameters.n_epochs  -> epochs
    hyperparameters.learning_rate_multiplier  -> optimizer.lr = multiplier x DeltaServe's default lr (1e-3)
    hyperparameters.batch_size               -> backward_batch_tokens (DeltaServe batches by tokens, not samples;
                                                the job object reports it so, with batch_size_unit "tokens")
    seed                      -> seed
    metadata                  kept with the job and returned on it (up to 16 string pairs, as OpenAI's)
    method                    {"type": "supervised"} only; its supervised.hyperparameters as above
    deltaserve                the keys of the YAML job file, checked by its schema (job_config); not dataset,
                              adapter_name, checkpoint.dir or data_parallel, which the server sets or refuses
"""

from __future__ import annotations

import json
import math
import os
import re
import secrets
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .job_config import JobConfig, JobConfigError, job_config_from_mapping, job_config_to_mapping, load_job_config
from .job_control import JobCallError

__all__ = ["CreatedJob", "JobsSettings", "config_error", "created_jobs", "current_suffix", "forget_created",
           "job_from_request", "load_created", "operator_state", "save_created", "save_operator_state", "startup_job",
           "startup_jobs"]

#: ``jobs.dir`` when the operator names none: relative to the server's working directory at start-up
DEFAULT_JOBS_DIR = "deltaserve-jobs"
#: the most ``jobs.max_concurrent`` may be: every job's rows compete for one engine's spare capacity
MAX_CONCURRENT_CAP = 64
#: ``jobs.max_concurrent`` when the operator names none: one job at a time, as before several could share a host
DEFAULT_MAX_CONCURRENT = 1
_CURRENT = "current"
_REQUEST = "request.json"
#: beside a job's checkpoints: what the operator did to it that a restart keeps (save_operator_state)
_OPERATOR = "operator.json"
#: the statuses after which a restart does not start a created job again (a failed one is tried again)
_FINAL = ("succeeded", "cancelled")
_JOB_FILE = "job.yaml"
#: OpenAI's fields of the create body; anything else at the top level is refused
_FIELDS = ("model", "training_file", "suffix", "hyperparameters", "seed", "metadata", "method", "validation_file",
           "integrations", "deltaserve")
#: the job file's keys a create may not set: the server sets them from the body, or does not offer them here
_SERVER_KEYS = {"dataset": "give the file as training_file (a path inside the server's data directory)",
                "adapter_name": "give the adapter's name as suffix",
                "data_parallel": "a created job runs on one engine; declare data-parallel jobs in the job file "
                                 "the server starts with"}
_DEFAULT_LR = JobConfig.__dataclass_fields__["lr"].default
_SUFFIX = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}")


@dataclass(frozen=True)
class JobsSettings:
    """The operator's settings for jobs created over HTTP; ``how_to_enable``: this engine's way of setting
    ``data_dir``, named when a create is refused for the lack of one."""

    data_dir: Path | None
    dir: Path
    how_to_enable: str = ""
    #: jobs that may be active (not succeeded, failed or cancelled) on the server at once, the job file's
    #: included: each has its own backward process and copy of the trainable state, so more jobs means more memory
    max_concurrent: int = DEFAULT_MAX_CONCURRENT
    #: how the operator names ``max_concurrent`` on this engine, in the refusal of a create past it
    limit_setting: str = "jobs.max_concurrent"

    @classmethod
    def from_mapping(cls, raw: Any, *, base: Path, where: str, how_to_enable: str = "",
                     limit_setting: str | None = None) -> "JobsSettings":
        """``raw``: ``{"data_dir": ..., "dir": ...}`` (both optional; relative paths against ``base``). Raises
        ``ValueError`` naming ``where``'s key, the value and the fix."""
        if raw is None:
            raw = {}
        if not isinstance(raw, Mapping):
            raise ValueError(f'{where}: must be an object such as {{"data_dir": "/data"}}, got {raw!r}')
        unknown = sorted(set(raw) - {"data_dir", "dir", "max_concurrent"})
        if unknown:
            raise ValueError(f"{where}: unknown key(s) {unknown}; known: data_dir (where training files are read), "
                             "dir (where created jobs are kept), max_concurrent (how many jobs may train at once)")
        limit = raw.get("max_concurrent", DEFAULT_MAX_CONCURRENT)
        if isinstance(limit, str) and limit.strip().isdigit():
            limit = int(limit)  # an environment variable's text
        if isinstance(limit, bool) or not isinstance(limit, int) or not 1 <= limit <= MAX_CONCURRENT_CAP:
            raise ValueError(f"{where}.max_concurrent: must be a whole number of jobs from 1 to {MAX_CONCURRENT_CAP}, "
                             f"got {limit!r}; set it to how many fine-tuning jobs may train on this server at once")
        paths: dict[str, Path | None] = {}
        for key in ("data_dir", "dir"):
            value = raw.get(key)
            if value is not None and (not isinstance(value, str) or not value):
                raise ValueError(f"{where}.{key}: must be a folder path, got {value!r}")
            paths[key] = None if value is None else (base / Path(value).expanduser()).resolve()
        data_dir = paths["data_dir"]
        if data_dir is not None and not data_dir.is_dir():
            raise ValueError(f"{where}.data_dir: {data_dir} is not a folder; name the folder clients' training "
                             "files are read from")
        return cls(data_dir, paths["dir"] or (base / DEFAULT_JOBS_DIR).resolve(), how_to_enable, limit,
                   limit_setting or f"{where}.max_concurrent")

    def as_mapping(self) -> dict[str, str | int | None]:
        """Absolute paths, for handing the settings to another process (:meth:`from_mapping` reads them back)."""
        return {"data_dir": None if self.data_dir is None else str(self.data_dir), "dir": str(self.dir),
                "max_concurrent": self.max_concurrent}


@dataclass(frozen=True)
class CreatedJob:
    """A job created over HTTP: its config and what the request said beyond it (``created_at``, ``metadata``,
    ``suffix``), which the job object shows."""

    job: JobConfig
    record: dict[str, Any]


def _bad(message: str, param: str, code: str = "invalid_request") -> JobCallError:
    return JobCallError(400, message, code=code, param=param)


def _training_file(value: Any, data_dir: Path) -> str:
    if not isinstance(value, str) or not value:
        raise _bad(f"training_file: must be the path of a dataset file inside the server's data directory "
                   f"{data_dir}, got {value!r}", "training_file")
    root = os.path.realpath(data_dir)
    # realpath resolves '..' and every symlink: a link inside the folder that points out of it is refused too
    real = os.path.realpath(os.path.join(root, value))
    if os.path.commonpath([root, real]) != root:
        raise JobCallError(403, f"training_file: {value!r} is outside the server's data directory {data_dir}; "
                                "name a file inside it (relative to it, or absolute)",
                           code="training_file_outside_data_dir", param="training_file")
    if not os.path.isfile(real):
        raise _bad(f"training_file: {value!r} is not a file in the server's data directory {data_dir}",
                   "training_file", "training_file_not_found")
    return real


def _whole(value: Any, key: str, least: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < least:
        raise _bad(f"{key}: must be an integer >= {least} or \"auto\", got {value!r}", key)
    return value


def _hyperparameters(body: Mapping[str, Any]) -> dict[str, Any]:
    """The hyperparameters from the body's top level or its ``method`` (OpenAI has both), not both at once."""
    found: dict[str, Any] = {}
    method = body.get("method")
    if method is not None:
        if not isinstance(method, Mapping) or method.get("type", "supervised") != "supervised":
            raise _bad(f"method: only {{\"type\": \"supervised\"}} is offered, got {method!r}", "method")
        inner = (method.get("supervised") or {}).get("hyperparameters") if isinstance(
            method.get("supervised") or {}, Mapping) else None
        if inner is not None:
            found["method.supervised.hyperparameters"] = inner
    if body.get("hyperparameters") is not None:
        found["hyperparameters"] = body["hyperparameters"]
    if len(found) > 1:
        raise _bad("hyperparameters: give them once, at the top level or under method.supervised, not both",
                   "hyperparameters")
    if not found:
        return {}
    (where, hp), = found.items()
    if not isinstance(hp, Mapping):
        raise _bad(f"{where}: must be an object, got {hp!r}", where)
    unknown = sorted(set(hp) - {"n_epochs", "learning_rate_multiplier", "batch_size"})
    if unknown:
        raise _bad(f"{where}: unknown key(s) {unknown}; known: n_epochs, learning_rate_multiplier, batch_size "
                   "(DeltaServe's other settings go under deltaserve)", where)
    mapped: dict[str, Any] = {}
    if hp.get("n_epochs", "auto") != "auto":
        mapped["epochs"] = _whole(hp["n_epochs"], f"{where}.n_epochs", 1)
    if hp.get("batch_size", "auto") != "auto":
        mapped["backward_batch_tokens"] = _whole(hp["batch_size"], f"{where}.batch_size", 1)
    multiplier = hp.get("learning_rate_multiplier", "auto")
    if multiplier != "auto":
        if isinstance(multiplier, bool) or not isinstance(multiplier, (int, float)) \
                or not math.isfinite(multiplier) or multiplier <= 0:
            raise _bad(f"{where}.learning_rate_multiplier: must be a positive number or \"auto\", got "
                       f"{multiplier!r}", f"{where}.learning_rate_multiplier")
        mapped["lr"] = _DEFAULT_LR * float(multiplier)
    return mapped


def _metadata(value: Any) -> dict[str, str] | None:
    if value is None:
        return None
    if not isinstance(value, Mapping) or len(value) > 16 or not all(
            isinstance(k, str) and len(k) <= 64 and isinstance(v, str) and len(v) <= 512 for k, v in value.items()):
        raise _bad("metadata: must be an object of at most 16 string keys (64 characters each) and string values "
                   f"(512 characters each), got {value!r}", "metadata")
    return dict(value)


def _suffix(value: Any) -> str:
    if value is None:
        return f"job-{secrets.token_hex(4)}"
    if not isinstance(value, str) or not _SUFFIX.fullmatch(value) or value.startswith("__deltaserve"):
        raise _bad(f"suffix: the adapter's name, 1-64 letters, digits, '.', '_' or '-' starting with a letter or "
                   f"digit; got {value!r}", "suffix")
    return value


def _deltaserve_block(value: Any, mapped: Mapping[str, Any]) -> dict[str, Any]:
    """The job file's keys from the body's ``deltaserve`` block, refusing those the server sets and those the body
    already set through OpenAI's fields."""
    if value is None:
        return {}
    if not isinstance(value, Mapping):
        raise _bad(f"deltaserve: must be an object of the job file's keys (lora, optimizer, slo, ...), got {value!r}",
                   "deltaserve")
    block = json.loads(json.dumps(value))  # a deep copy, and only JSON data
    for key, fix in _SERVER_KEYS.items():
        if key in block:
            raise _bad(f"deltaserve.{key}: set by the server for a created job; {fix}", f"deltaserve.{key}")
    if isinstance(block.get("checkpoint"), Mapping) and "dir" in block["checkpoint"]:
        raise _bad("deltaserve.checkpoint.dir: a created job's checkpoints are kept in the server's jobs folder; "
                   "leave it out", "deltaserve.checkpoint.dir")
    twins = {"epochs": ("epochs", "hyperparameters.n_epochs"), "lr": ("optimizer.lr",
             "hyperparameters.learning_rate_multiplier"),
             "backward_batch_tokens": ("backward_batch_tokens", "hyperparameters.batch_size"),
             "seed": ("seed", "seed")}
    for field, (key, openai) in twins.items():
        head, _, tail = key.partition(".")
        given = head in block if not tail else isinstance(block.get(head), Mapping) and tail in block[head]
        if field in mapped and given:
            raise _bad(f"deltaserve.{key}: also given as {openai}; give it once", f"deltaserve.{key}")
    return block


def job_from_request(body: Any, settings: JobsSettings, *, served_models: tuple[str, ...],
                     taken: tuple[str, ...] = ()) -> CreatedJob:
    """The job OpenAI's create ``body`` asks for, or :class:`~deltaserve_core.job_control.JobCallError` (400 naming
    the field, the value and the fix; 403 for a training file outside the data directory; 409 for a suffix in use).

    ``served_models``: the names the engine serves its base model under (its name, its path); ``taken``: adapter
    names of jobs this server knows besides the ones in its jobs folder."""
    if not isinstance(body, Mapping):
        raise _bad(f"the body must be a JSON object (OpenAI's fine-tuning job create), got {type(body).__name__}",
                   "body")
    unknown = sorted(set(body) - set(_FIELDS))
    if unknown:
        raise _bad(f"unknown field(s) {unknown}; known: {', '.join(_FIELDS)} (DeltaServe's own keys go under "
                   "deltaserve)", unknown[0])
    model = body.get("model")
    if model not in served_models:
        raise _bad(f"model: {model!r} is not served here; this server fine-tunes its base model "
                   f"{served_models[0]!r}", "model", "model_not_found")
    for key in ("validation_file",):
        if body.get(key) is not None:
            raise _bad(f"{key}: not offered by DeltaServe; leave it out", key)
    if body.get("integrations"):
        raise _bad("integrations: not offered by DeltaServe; leave it out", "integrations")
    assert settings.data_dir is not None, "the caller refuses a create without a data directory"
    dataset = _training_file(body.get("training_file"), settings.data_dir)
    suffix = _suffix(body.get("suffix"))
    mapped = _hyperparameters(body)
    if body.get("seed") is not None:
        mapped["seed"] = _whole(body["seed"], "seed", 0)
    metadata = _metadata(body.get("metadata"))
    block = _deltaserve_block(body.get("deltaserve"), mapped)
    home = settings.dir / suffix
    if suffix in taken or home.exists():
        raise JobCallError(409, f"suffix: a job named {suffix!r} exists on this server already (ftjob-{suffix}); "
                                "choose another suffix", code="suffix_taken", param="suffix")
    block.update({k: v for k, v in mapped.items() if k != "lr"})
    if "lr" in mapped:
        block["optimizer"] = {**(block.get("optimizer") or {}), "lr": mapped["lr"]}
    block["checkpoint"] = {**(block.get("checkpoint") or {}), "dir": str(home / "checkpoints")}
    block.update(dataset=dataset, adapter_name=suffix)
    try:
        job = job_config_from_mapping(block)
    except JobConfigError as exc:
        raise config_error(exc) from None
    record = {"created_at": int(time.time()), "suffix": suffix, "metadata": metadata, "model": model,
              "training_file": body.get("training_file")}
    return CreatedJob(job, record)


def config_error(exc: JobConfigError) -> JobCallError:
    """A job file's refusal (the schema's, or :func:`deltaserve_core.preflight.check_job`'s) as the API's 400: the
    same keys, values and fixes, under ``deltaserve``."""
    text = str(exc).removeprefix("job config: ")
    lines = [line.strip() for line in text.splitlines()]
    several = len(lines) > 1  # "N problems:" and one line each
    first = lines[1] if several else lines[0]
    message = "deltaserve: " + text if several else "deltaserve." + text
    return _bad(message, "deltaserve." + first.split(":", 1)[0].strip())


def save_created(created: CreatedJob, settings: JobsSettings) -> Path:
    """Keep ``created`` in the jobs folder and make it the one a restart resumes; returns its folder."""
    home = settings.dir / created.record["suffix"]
    home.mkdir(parents=True, exist_ok=False)
    import yaml

    (home / _JOB_FILE).write_text(yaml.safe_dump(job_config_to_mapping(created.job), sort_keys=False))
    (home / _REQUEST).write_text(json.dumps(created.record, indent=2))
    _write_atomic(settings.dir / _CURRENT, created.record["suffix"] + "\n")
    return home


def forget_created(created: CreatedJob, settings: JobsSettings, previous: str | None) -> None:
    """Undo :func:`save_created` for a job that did not start: the folder goes, and ``current`` names ``previous``
    again unless a newer job was created meanwhile (jobs are prepared beside each other)."""
    import shutil

    shutil.rmtree(settings.dir / created.record["suffix"], ignore_errors=True)
    if current_suffix(settings) != created.record["suffix"]:
        return
    if previous is None:
        (settings.dir / _CURRENT).unlink(missing_ok=True)
    else:
        _write_atomic(settings.dir / _CURRENT, previous + "\n")


def _write_atomic(path: Path, text: str) -> None:
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(text)
    os.replace(tmp, path)


def current_suffix(settings: JobsSettings) -> str | None:
    """The suffix of the newest created job (None: none was created)."""
    try:
        name = (settings.dir / _CURRENT).read_text().strip()
    except FileNotFoundError:
        return None
    return name or None


def load_created(settings: JobsSettings) -> CreatedJob | None:
    """The newest created job, as :func:`save_created` left it (None: none was created)."""
    suffix = current_suffix(settings)
    if suffix is None:
        return None
    return _load_home(settings.dir / suffix)


def _load_home(home: Path) -> CreatedJob:
    return CreatedJob(load_job_config(home / _JOB_FILE), json.loads((home / _REQUEST).read_text()))


def created_jobs(settings: JobsSettings) -> list[CreatedJob]:
    """Every job created on this server that is kept in its jobs folder, oldest first."""
    if not settings.dir.is_dir():
        return []
    homes = [h for h in settings.dir.iterdir() if (h / _JOB_FILE).is_file() and (h / _REQUEST).is_file()]
    # created_at is whole seconds: the request file's write time orders jobs created within one
    found = [(_load_home(h), (h / _REQUEST).stat().st_mtime_ns) for h in homes]
    return [c for c, _ in sorted(found, key=lambda f: (f[0].record["created_at"], f[1]))]


def operator_state(job: JobConfig) -> dict[str, Any]:
    """What the operator did to ``job`` that must outlive a restart (:func:`save_operator_state`); empty if nothing."""
    try:
        state = json.loads((Path(job.checkpoint.dir) / _OPERATOR).read_text())
    except (FileNotFoundError, ValueError):
        return {}
    return state if isinstance(state, dict) else {}


def save_operator_state(job: JobConfig, **changes: Any) -> None:
    """Keep ``changes`` (``paused``: the operator paused it; ``ended``: its final status) beside ``job``'s
    checkpoints: a restarted server leaves a paused job paused and does not start an ended one again."""
    folder = Path(job.checkpoint.dir)
    folder.mkdir(parents=True, exist_ok=True)
    _write_atomic(folder / _OPERATOR, json.dumps({**operator_state(job), **changes}))


def startup_jobs(declared: str | os.PathLike[str] | None, settings: JobsSettings | None) -> list[
        tuple[JobConfig, CreatedJob | None]]:
    """The jobs a server starts with: the job file it was started with (if any; it resumes from its checkpoint, and
    one that had ended stays so), then every job created over HTTP that did not succeed or was not cancelled, oldest
    first. Each with its create record (None for the job file's)."""
    out: list[tuple[JobConfig, CreatedJob | None]] = []
    if declared:
        out.append((load_job_config(declared), None))
    for created in created_jobs(settings) if settings is not None else []:
        if operator_state(created.job).get("ended") not in _FINAL:
            out.append((created.job, created))
    return out


def startup_job(declared: str | os.PathLike[str] | None, settings: JobsSettings | None) -> tuple[
        JobConfig | None, CreatedJob | None]:
    """The newest of :func:`startup_jobs` (the job whose published versions a server that serves one job's names
    serves), or (None, None)."""
    jobs = startup_jobs(declared, settings)
    return jobs[-1] if jobs else (None, None)
