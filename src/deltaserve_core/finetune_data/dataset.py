"""Tokenising fine-tuning records with the model's chat template: :class:`FinetuneDataset` and its loss masks.

:func:`tokenize_conversation` / :class:`FinetuneDataset` turn messages into :class:`FineTuneSample` rows with a
loss mask that covers assistant tokens only (see "How the loss mask is placed" below), enforce ``max_length`` and
count what was truncated or skipped.

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

import os
from collections.abc import Mapping, Sequence
from typing import Any

from deltaserve_core.types import FineTuneSample

from .pool import FinetunePool, samples_fingerprint
from .records import ChatRecord, DataConfig, DatasetError, LoadReport, load_records

__all__ = [
    "tokenize_conversation",
    "FinetuneDataset",
]

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
