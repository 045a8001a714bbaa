"""Creating a fine-tuning job over HTTP: OpenAI's create body turned into a
:class:`~deltaserve_core.job_config.JobConfig`, checked against the server's settings, and kept on disk so a
restarted server resumes it.

Engine-agnostic, no torch: the engine's runtime (:class:`~deltaserve_core.runtime.EngineRuntime`) calls
:func:`job_from_request` in the process that owns the job, then :func:`save_created` once the job's dataset
loaded, and :func:`startup_job` when the server starts.

Where things are (``jobs`` settings, :class:`JobsSettings`): the training file is read only from inside the
operator's ``data_dir`` (symlinks resolved, so neither ``..`` nor a link leads out of it); each created job gets
``<dir>/<suffix>/`` with its ``job.yaml``, the request's own fields (``request.json``) and its checkpoints
(``checkpoints/``, where its published versions go too); ``<dir>/current`` names the newest created job, the one
a restarted server resumes instead of the job file it was started with (that job had ended, or the create
would have been refused).

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

__all__ = ["CreatedJob", "JobsSettings", "config_error", "current_suffix", "forget_created", "job_from_request",
           "load_created", "save_created", "startup_job"]

#: ``jobs.dir`` when the operator names none: relative to the server's working directory at start-up
DEFAULT_JOBS_DIR = "deltaserve-jobs"
_CURRENT = "current"
_REQUEST = "request.json"
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

    @classmethod
    def from_mapping(cls, raw: Any, *, base: Path, where: str, how_to_enable: str = "") -> "JobsSettings":
        """``raw``: ``{"data_dir": ..., "dir": ...}`` (both optional; relative paths against ``base``). Raises
        ``ValueError`` naming ``where``'s key, the value and the fix."""
        if raw is None:
            raw = {}
        if not isinstance(raw, Mapping):
            raise ValueError(f'{where}: must be an object such as {{"data_dir": "/data"}}, got {raw!r}')
        unknown = sorted(set(raw) - {"data_dir", "dir"})
        if unknown:
            raise ValueError(f"{where}: unknown key(s) {unknown}; known: data_dir (where training files are read), "
                             "dir (where created jobs are kept)")
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
        return cls(data_dir, paths["dir"] or (base / DEFAULT_JOBS_DIR).resolve(), how_to_enable)

    def as_mapping(self) -> dict[str, str | None]:
        """Absolute paths, for handing the settings to another process (:meth:`from_mapping` reads them back)."""
        return {"data_dir": None if self.data_dir is None else str(self.data_dir), "dir": str(self.dir)}


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
    """Undo :func:`save_created` for a job that did not start: the folder goes, ``current`` names ``previous``."""
    import shutil

    shutil.rmtree(settings.dir / created.record["suffix"], ignore_errors=True)
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
    home = settings.dir / suffix
    return CreatedJob(load_job_config(home / _JOB_FILE), json.loads((home / _REQUEST).read_text()))


def startup_job(declared: str | os.PathLike[str] | None, settings: JobsSettings | None) -> tuple[
        JobConfig | None, CreatedJob | None]:
    """The job a server starts with: the newest job created over HTTP when there is one (a create is refused while
    a job is active, so the declared job had ended before it), else the job file it was started with (None: none).
    Returns (job, the created job's record or None)."""
    created = load_created(settings) if settings is not None else None
    if created is not None:
        return created.job, created
    return (load_job_config(declared) if declared else None), None
