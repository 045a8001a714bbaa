"""Fine-tuning data manager: loading, bad input, loss masks, max length, and the admission pool."""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from deltaserve_core.finetune_data import (
    DataConfig,
    DatasetError,
    FinetuneDataset,
    FinetunePool,
    InMemoryPool,
    LoadReport,
    load_records,
    tokenize_conversation,
)
from deltaserve_core.types import FineTuneSample

# --------------------------------------------------------------------------------------------------------------
# helpers
# --------------------------------------------------------------------------------------------------------------

ALPACA = [
    {"instruction": "Give three tips for staying healthy.", "input": "", "output": "Eat well, sleep enough, move."},
    {"instruction": "Summarise the text.", "input": "The quick brown fox jumps over the lazy dog.",
     "output": "A fox jumps over a dog."},
    {"instruction": "What is the capital of France?", "output": "The capital of France is Paris.",
     "system": "Answer briefly."},
]

SHAREGPT = [
    {"conversations": [{"from": "human", "value": "What is the capital of France?"},
                       {"from": "gpt", "value": "Paris."}]},
    {"conversations": [{"from": "system", "value": "Be terse."},
                       {"from": "human", "value": "Name a colour."}, {"from": "gpt", "value": "Blue."},
                       {"from": "human", "value": "Another one?"}, {"from": "gpt", "value": "Green, of course."}]},
]


@pytest.fixture(scope="module")
def tokenizer(tiny_model: Path):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(tiny_model))


def write_json(path: Path, records) -> Path:
    path.write_text(json.dumps(records), encoding="utf-8")
    return path


def write_lines(path: Path, lines: list[str]) -> Path:
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


def masked_spans(ids, mask) -> list[list[int]]:
    """Contiguous runs of target tokens."""
    spans, cur = [], []
    for tok, m in zip(ids, mask):
        if m:
            cur.append(tok)
        elif cur:
            spans.append(cur)
            cur = []
    if cur:
        spans.append(cur)
    return spans


def make_samples(lengths: list[int], start_id: int = 0) -> list[FineTuneSample]:
    return [FineTuneSample(start_id + i, tuple(range(n)), (False,) + (True,) * (n - 1))
            for i, n in enumerate(lengths)]


# --------------------------------------------------------------------------------------------------------------
# loading and bad input
# --------------------------------------------------------------------------------------------------------------


def test_alpaca_json_with_malformed_records_reported_by_index(tmp_path: Path) -> None:
    records = ALPACA + [
        {"instruction": "No output here"},                       # index 3: missing field
        {"instruction": 7, "output": "x"},                       # index 4: wrong type
        {"instruction": "Empty response", "output": "   "},      # index 5: empty response
        ["not", "an", "object"],                                 # index 6
    ]
    recs, report = load_records(write_json(tmp_path / "a.json", records))
    assert report.format == "alpaca"
    assert (report.records, report.malformed, len(recs)) == (7, 4, 3)
    assert [(p.index, p.kind) for p in report.problems] == [
        (3, "missing_field"), (4, "wrong_type"), (5, "empty_response"), (6, "not_an_object")]
    assert all(p.line is None for p in report.problems)
    assert "index 3" in report.summary()
    json.dumps(report.to_dict())  # serialisable for status endpoints
    # Alpaca input is joined to the instruction, the optional system becomes a system message.
    assert recs[1].messages[0]["content"] == "Summarise the text.\n\nThe quick brown fox jumps over the lazy dog."
    assert recs[2].messages[0] == {"role": "system", "content": "Answer briefly."}


def test_jsonl_malformed_lines_counted_by_line_number(tmp_path: Path) -> None:
    lines = [json.dumps(ALPACA[0]), "", "{not json", json.dumps(ALPACA[1]), json.dumps({"instruction": "x"}),
             "   ", json.dumps({"instruction": "q", "output": ""}), json.dumps(ALPACA[2]), "[1, 2]"]
    recs, report = load_records(write_lines(tmp_path / "a.jsonl", lines))
    assert report.records == 7  # blank lines are not records
    assert report.malformed == 4
    assert [(p.line, p.kind) for p in report.problems] == [
        (3, "invalid_json"), (5, "missing_field"), (7, "empty_response"), (9, "not_an_object")]
    assert [r.line for r in recs] == [1, 4, 8]
    # sample ids index the records of the file, so they are stable across restarts
    assert [r.record_index for r in recs] == [0, 2, 5]


def test_invalid_utf8_line_is_a_problem_not_a_crash(tmp_path: Path) -> None:
    path = tmp_path / "a.jsonl"
    path.write_bytes(json.dumps(ALPACA[0]).encode() + b"\n\xff\xfe{}\n" + json.dumps(ALPACA[1]).encode() + b"\n")
    recs, report = load_records(path)
    assert len(recs) == 2 and report.problems[0].kind == "invalid_utf8" and report.problems[0].line == 2


def test_sharegpt_json_and_messages_jsonl(tmp_path: Path) -> None:
    recs, report = load_records(write_json(tmp_path / "s.json", SHAREGPT))
    assert report.format == "sharegpt" and report.malformed == 0
    assert [m["role"] for m in recs[1].messages] == ["system", "user", "assistant", "user", "assistant"]

    msgs = [
        {"messages": [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello!"}]},
        {"messages": [{"role": "user", "content": "Hi"}, {"role": "tool", "content": "?"}]},           # bad role
        {"messages": [{"role": "assistant", "content": "Hi"}, {"role": "user", "content": "?"}]},      # order
        {"messages": [{"role": "user", "content": "Only a question"}]},                               # no answer
        {"messages": [{"role": "user", "content": "Q"}, {"role": "assistant", "content": ""}]},       # empty
        {"messages": "not a list"},
        {"messages": [{"role": "user", "content": "Q"}, {"role": "system", "content": "late"},
                      {"role": "assistant", "content": "A"}]},
        {"system": "Top-level system.", "messages": [{"role": "user", "content": "Q"},
                                                     {"role": "assistant", "content": "A"}]},
    ]
    recs, report = load_records(write_lines(tmp_path / "m.jsonl", [json.dumps(m) for m in msgs]))
    assert report.format == "sharegpt"
    assert [(p.line, p.kind) for p in report.problems] == [
        (2, "bad_role"), (3, "bad_turn_order"), (4, "empty_response"), (5, "empty_response"), (6, "wrong_type"),
        (7, "bad_turn_order")]
    assert [r.line for r in recs] == [1, 8]
    assert recs[1].messages[0] == {"role": "system", "content": "Top-level system."}


def test_truncated_json_list_keeps_the_records_before_the_damage(tmp_path: Path) -> None:
    text = json.dumps(ALPACA)
    path = tmp_path / "cut.json"
    path.write_text(text[: text.rindex("{") + 20])  # the last record is cut in half
    recs, report = load_records(path)
    assert len(recs) == 2 and report.malformed == 1
    assert report.problems[0].kind == "invalid_json" and report.problems[0].index == 2


@pytest.mark.parametrize("content, suffix, message", [
    ("", ".json", "is empty"),
    ("  \n", ".jsonl", "is empty"),
    ('{"a": 1}', ".txt", "extension"),
    ('"just a string"', ".json", "not a JSON list"),
    ("[1, 2, 3]", ".json", r"no record is a JSON object[\s\S]*index 2"),
    ("{oops\n[1]\n", ".jsonl", r"no record is a JSON object[\s\S]*line 1: \[invalid_json\]"),
    ('{\n  "data": [\n {"instruction": "a", "output": "b"}]\n}', ".json", r"single JSON object.*'data'"),
    (json.dumps([{"prompt": "x", "completion": "y"}]), ".json", "cannot tell the format"),
])
def test_unusable_datasets_are_refused_with_what_to_fix(tmp_path: Path, content, suffix, message) -> None:
    path = tmp_path / f"d{suffix}"
    path.write_text(content)
    with pytest.raises(DatasetError, match=message):
        load_records(path)


def test_jsonl_saved_as_json_is_read_per_line(tmp_path: Path) -> None:
    path = write_lines(tmp_path / "a.json", [json.dumps(r) for r in ALPACA] + ["{bad"])
    recs, report = load_records(path)
    assert len(recs) == 3 and report.problems[0].line == 4


def test_missing_file_directory_and_all_malformed_are_refused(tmp_path: Path) -> None:
    with pytest.raises(DatasetError, match="does not exist"):
        load_records(tmp_path / "nope.json")
    with pytest.raises(DatasetError, match="directory"):
        load_records(tmp_path)
    path = write_lines(tmp_path / "bad.jsonl", [json.dumps({"instruction": "x", "output": ""}), "{oops"])
    with pytest.raises(DatasetError, match=r"all 2 records are malformed[\s\S]*line 1[\s\S]*line 2"):
        load_records(path)
    # forcing the wrong format: every record is reported, and the message suggests the format setting
    with pytest.raises(DatasetError, match="DataConfig.format"):
        load_records(write_json(tmp_path / "s.json", SHAREGPT), "alpaca")


def test_problem_list_is_bounded_but_counts_are_complete(tmp_path: Path) -> None:
    lines = [json.dumps(ALPACA[0])] + ["{bad"] * 50
    recs, report = load_records(write_lines(tmp_path / "a.jsonl", lines), max_problems=5)
    assert report.malformed == 50 and len(report.problems) == 5 and report.kinds["invalid_json"] == 50
    assert "and 45 more" in report.summary()


@pytest.mark.parametrize("kwargs, message", [
    ({"format": "csv"}, "format"), ({"max_length": 1}, "max_length"), ({"max_length": 2.5}, "max_length"),
    ({"overflow": "drop"}, "overflow"), ({"epochs": 0}, "epochs"), ({"epochs": True}, "epochs"),
    ({"seed": "1"}, "seed"), ({"shuffle": 1}, "shuffle"), ({"max_problems": -1}, "max_problems"),
])
def test_data_config_is_validated(kwargs, message) -> None:
    with pytest.raises(DatasetError, match=message):
        DataConfig("data.json", **kwargs)
    with pytest.raises(DatasetError, match="path"):
        DataConfig("")


# --------------------------------------------------------------------------------------------------------------
# tokenising and loss masks
# --------------------------------------------------------------------------------------------------------------


def test_loss_mask_covers_only_the_response(tmp_path: Path, tokenizer) -> None:
    ds = FinetuneDataset(DataConfig(write_json(tmp_path / "a.json", ALPACA), max_length=512), tokenizer)
    assert len(ds) == 3 and ds.report.samples == 3
    for sample, record in zip(ds.samples, ALPACA):
        spans = masked_spans(sample.input_ids, sample.loss_mask)
        assert len(spans) == 1
        # the target is the response plus the template's end-of-turn, nothing of the prompt
        assert tokenizer.decode(spans[0]) == record["output"] + "<|im_end|>\n"
        prompt_text = tokenizer.decode([t for t, m in zip(sample.input_ids, sample.loss_mask) if not m])
        assert record["instruction"] in prompt_text and record["output"] not in prompt_text
        assert sample.loss_mask[0] is False and sample.epoch == 0
    # same ids as apply_chat_template(tokenize=True) gives for the whole conversation
    recs, _ = load_records(tmp_path / "a.json")
    expected = tokenizer.apply_chat_template([dict(m) for m in recs[0].messages], tokenize=True,
                                             return_dict=False)
    assert list(ds.samples[0].input_ids) == list(expected)


def test_multi_turn_masks_every_assistant_turn(tmp_path: Path, tokenizer) -> None:
    ds = FinetuneDataset(DataConfig(write_json(tmp_path / "s.json", SHAREGPT)), tokenizer)
    multi = ds.samples[1]
    spans = [tokenizer.decode(s) for s in masked_spans(multi.input_ids, multi.loss_mask)]
    assert spans == ["Blue.<|im_end|>\n", "Green, of course.<|im_end|>\n"]
    assert ds.report.context_only_turns == 0
    ids, mask = tokenize_conversation(tokenizer, SHAREGPT_AS_MESSAGES)
    assert (tuple(ids), tuple(mask)) == (multi.input_ids, multi.loss_mask)


SHAREGPT_AS_MESSAGES = [{"role": "system", "content": "Be terse."}, {"role": "user", "content": "Name a colour."},
                        {"role": "assistant", "content": "Blue."}, {"role": "user", "content": "Another one?"},
                        {"role": "assistant", "content": "Green, of course."}]


def test_template_that_rewrites_history_trains_only_turns_it_can_locate(tmp_path: Path, tokenizer) -> None:
    # Like reasoning templates that drop old "thinking": earlier assistant turns render differently once a later
    # turn exists, so only the last turn can be located; earlier ones stay context.
    template = ("{% for m in messages %}<|im_start|>{{ m['role'] }}\n"
                "{% if m['role'] == 'assistant' and not loop.last %}[old]{% else %}{{ m['content'] }}{% endif %}"
                "<|im_end|>\n{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")
    ds = FinetuneDataset(DataConfig(write_json(tmp_path / "s.json", SHAREGPT), chat_template=template), tokenizer)
    multi = ds.samples[1]
    assert [tokenizer.decode(s) for s in masked_spans(multi.input_ids, multi.loss_mask)] == [
        "Green, of course.<|im_end|>\n"]
    assert ds.report.context_only_turns == 1


def test_template_errors_are_per_record(tmp_path: Path, tokenizer) -> None:
    template = ("{% for m in messages %}{% if 'BOOM' in m['content'] %}{{ raise_exception('no booms') }}{% endif %}"
                "<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
                "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")
    records = ALPACA + [{"instruction": "BOOM", "output": "bang"}]
    ds = FinetuneDataset(DataConfig(write_json(tmp_path / "a.json", records), chat_template=template), tokenizer)
    assert len(ds) == 3 and ds.report.malformed == 1
    assert ds.report.problems[0].kind == "template_error" and ds.report.problems[0].index == 3
    assert "no booms" in ds.report.problems[0].message


def test_tokenizer_without_chat_template_is_refused(tmp_path: Path, tokenizer) -> None:
    import copy

    bare = copy.deepcopy(tokenizer)
    bare.chat_template = None
    with pytest.raises(DatasetError, match="no chat template"):
        FinetuneDataset(DataConfig(write_json(tmp_path / "a.json", ALPACA)), bare)


def test_max_length_skip_vs_truncate(tmp_path: Path, tokenizer) -> None:
    long = {"instruction": "Write a lot.", "output": "word " * 200}
    path = write_json(tmp_path / "a.json", ALPACA + [long])
    full = FinetuneDataset(DataConfig(path, max_length=4096), tokenizer)
    long_len = full.samples[-1].num_tokens
    limit = long_len - 50
    assert max(s.num_tokens for s in full.samples[:3]) < limit

    skip = FinetuneDataset(DataConfig(path, max_length=limit, overflow="skip"), tokenizer)
    assert len(skip) == 3 and skip.report.skipped_too_long == 1 and skip.report.truncated == 0
    assert skip.report.problems[0].kind == "too_long" and skip.report.problems[0].index == 3

    cut = FinetuneDataset(DataConfig(path, max_length=limit, overflow="truncate"), tokenizer)
    assert len(cut) == 4 and cut.report.truncated == 1 and cut.report.skipped == 0
    assert cut.samples[-1].input_ids == full.samples[-1].input_ids[:limit]
    assert cut.samples[-1].loss_mask == full.samples[-1].loss_mask[:limit]

    # truncating inside the prompt leaves no target: counted as skipped, never a sample without targets
    prompt_len = full.samples[-1].loss_mask.index(True)
    with pytest.raises(DatasetError, match="no usable sample"):
        FinetuneDataset(DataConfig(write_json(tmp_path / "b.json", [long]), max_length=prompt_len), tokenizer)
    ds = FinetuneDataset(DataConfig(path, max_length=prompt_len), tokenizer)
    assert ds.report.skipped_no_target >= 1
    assert ds.report.samples + ds.report.skipped + ds.report.malformed == ds.report.records
    assert all(s.num_targets > 0 and s.num_tokens <= prompt_len for s in ds.samples)


def test_report_is_logged(tmp_path: Path, tokenizer, caplog) -> None:
    lines = [json.dumps(ALPACA[0]), "{bad"]
    with caplog.at_level("WARNING", logger="deltaserve.finetune_data"):
        FinetuneDataset(DataConfig(write_lines(tmp_path / "a.jsonl", lines)), tokenizer)
    assert "line 2" in caplog.text and "1 malformed" in caplog.text


def test_dataset_makes_a_pool_with_its_settings(tmp_path: Path, tokenizer) -> None:
    ds = FinetuneDataset(DataConfig(write_json(tmp_path / "a.json", ALPACA), epochs=2, seed=7), tokenizer)
    pool = ds.make_pool()
    assert (pool.epochs, pool.seed, len(pool)) == (2, 7, 3)
    assert ds.location(ds.samples[1].sample_id) == "index 1"
    # the fingerprint computed while loading is the one a pool computes itself
    assert pool.fingerprint() == FinetunePool(ds.samples, epochs=2, seed=7).fingerprint()
    assert isinstance(ds.report, LoadReport)


# --------------------------------------------------------------------------------------------------------------
# the admission pool
# --------------------------------------------------------------------------------------------------------------


def test_pool_iterates_by_length_with_seeded_ties() -> None:
    lengths = [5, 3, 9, 3, 3, 7, 5, 2, 3]
    pool = FinetunePool(make_samples(lengths), seed=1)
    order = list(pool.iter_by_length())
    assert [s.num_tokens for s in order] == sorted(lengths)
    ties = [s.sample_id for s in order if s.num_tokens == 3]
    assert sorted(ties) == [1, 3, 4, 8]
    # same seed, same order; other seeds shuffle ties differently; shuffle=False is id order
    assert [s.sample_id for s in FinetunePool(make_samples(lengths), seed=1).iter_by_length()] == \
        [s.sample_id for s in order]
    tie_orders = {tuple(s.sample_id for s in FinetunePool(make_samples(lengths), seed=k).iter_by_length()
                        if s.num_tokens == 3) for k in range(20)}
    assert len(tie_orders) > 1
    plain = [s.sample_id for s in FinetunePool(make_samples(lengths), shuffle=False).iter_by_length()]
    assert [i for i in plain if lengths[i] == 3] == [1, 3, 4, 8]


def test_claim_release_complete() -> None:
    pool = FinetunePool(make_samples([4, 2, 6, 3]), shuffle=False)
    first = list(pool.iter_by_length())[:2]
    assert [s.sample_id for s in first] == [1, 3]
    pool.claim(first)
    assert len(pool) == 2 and pool.in_flight == {1, 3}
    assert [s.sample_id for s in pool.iter_by_length()] == [0, 2]
    pool.release([3])
    assert [s.sample_id for s in pool.iter_by_length()] == [3, 0, 2]
    pool.complete([1])
    assert pool.state_of(1) == "done" and pool.state_of(3) == "pool" and len(pool) == 3
    with pytest.raises(ValueError, match="not in the pool"):
        pool.claim([pool.sample(1)])
    with pytest.raises(ValueError, match="not in flight"):
        pool.complete([3])
    with pytest.raises(ValueError, match="not in flight"):
        pool.release([1])
    with pytest.raises(KeyError, match="not part of this"):
        pool.release([99])
    # all-or-nothing: a bad id anywhere leaves the pool as it was
    pool.claim([0])
    with pytest.raises(ValueError):
        pool.complete([0, 3])
    assert pool.state_of(0) == "in_flight"
    # release takes sample ids only, like InMemoryPool.release
    with pytest.raises(TypeError, match="sample ids"):
        pool.release([pool.sample(0)])
    assert pool.state_of(0) == "in_flight"
    pool.release([0])
    assert pool.state_of(0) == "pool"
    p = pool.progress()
    assert (p["in_pool"], p["in_flight"], p["done_in_epoch"], p["samples_completed"]) == (3, 0, 1, 1)


def test_iterator_tolerates_claims_while_walking() -> None:
    pool = FinetunePool(make_samples([2 + i % 5 for i in range(30)]), seed=3)
    it = pool.iter_by_length()
    seen = []
    for s in it:
        seen.append(s.sample_id)
        pool.claim([s])
        if len(seen) == 10:
            break
    rest = [s.sample_id for s in pool.iter_by_length()]
    assert not set(seen) & set(rest) and len(seen) + len(rest) == 30


def test_epochs_advance_when_all_done_and_finish() -> None:
    pool = FinetunePool(make_samples([3, 2, 4]), epochs=2, seed=5)
    orders = []
    for epoch in range(2):
        assert pool.epoch == epoch and not pool.finished
        batch = list(pool.iter_by_length())
        assert all(s.epoch == epoch for s in batch)
        orders.append([s.sample_id for s in batch])
        pool.claim(batch[:2])
        pool.complete([batch[0].sample_id])
        assert pool.epoch == epoch  # one still in flight, one in the pool: the epoch is not over
        pool.claim(batch[2:])
        pool.complete([s.sample_id for s in batch[1:]])
    assert pool.finished and len(pool) == 0 and list(pool.iter_by_length()) == []
    p = pool.progress()
    assert p["fraction"] == 1.0 and p["samples_completed"] == 6 and p["tokens_completed"] == 18
    with pytest.raises(ValueError, match="epoch"):
        FinetunePool(make_samples([3, 2]), epochs=2).claim([FineTuneSample(0, (1, 2, 3), (False, True, True), 1)])


def test_pool_refuses_bad_construction() -> None:
    with pytest.raises(DatasetError):
        FinetunePool([])
    with pytest.raises(DatasetError, match="unique"):
        FinetunePool(make_samples([2, 3]) + make_samples([4]))
    with pytest.raises(DatasetError, match="epochs"):
        FinetunePool(make_samples([2]), epochs=0)



@pytest.mark.parametrize("make_pool", [lambda s: FinetunePool(s, shuffle=False), InMemoryPool],
                         ids=["FinetunePool", "InMemoryPool"])
def test_both_pools_claim_samples_and_release_ids(make_pool) -> None:
    pool = make_pool(make_samples([4, 2, 6, 3]))
    first = list(pool.iter_by_length())[:2]
    assert [s.sample_id for s in first] == [1, 3]
    pool.claim(first)
    assert len(pool) == 2 and [s.sample_id for s in pool.iter_by_length()] == [0, 2]
    with pytest.raises(TypeError, match="sample ids"):
        pool.release(first)
    with pytest.raises(KeyError, match="not part of this"):
        pool.release([99])
    pool.release([3])
    assert [s.sample_id for s in pool.iter_by_length()] == [3, 0, 2]
    pool.release([1])
    assert len(pool) == 4 and [s.sample_id for s in pool.iter_by_length()] == [1, 3, 0, 2]

def drive(pool: FinetunePool, rng: random.Random, steps: int) -> list[tuple[int, int]]:
    """A scheduler-like driver: claim a short prefix, then complete or abort some in-flight samples."""
    log: list[tuple[int, int]] = []
    for _ in range(steps):
        if pool.finished:
            break
        k = rng.randint(0, 3)
        batch = []
        for s in pool.iter_by_length():
            if len(batch) == k:
                break
            batch.append(s)
        pool.claim(batch)
        log += [(s.epoch, s.sample_id) for s in batch]
        flying = sorted(pool.in_flight)
        rng.shuffle(flying)
        n_done = rng.randint(0, len(flying))
        n_aborted = rng.randint(0, len(flying) - n_done)
        pool.complete(flying[:n_done])
        pool.release(flying[n_done:n_done + n_aborted])  # the rest stays in flight for a later step
    return log


def test_state_dict_round_trip_resumes_exactly() -> None:
    samples = make_samples([random.Random(i).randint(2, 40) for i in range(60)])
    a = FinetunePool(samples, epochs=3, seed=11)
    drive(a, random.Random(0), 80)
    a.claim([s for _, s in zip(range(2), a.iter_by_length())])
    assert a.epoch > 0 and len(a.in_flight) >= 2  # the checkpoint is taken mid-run with samples in flight
    state = json.loads(json.dumps(a.state_dict()))

    b = FinetunePool(samples, epochs=3, seed=11)
    b.load_state_dict(state)
    assert b.in_flight == frozenset() and len(b) == len(a) + len(a.in_flight)
    a.release(sorted(a.in_flight))  # what a restart does to in-flight work
    assert a.progress() == b.progress()
    assert [(s.epoch, s.sample_id) for s in a.iter_by_length()] == [(s.epoch, s.sample_id) for s in b.iter_by_length()]
    assert drive(a, random.Random(1), 500) == drive(b, random.Random(1), 500)
    assert a.finished and b.finished and a.state_dict() == b.state_dict()


def test_load_state_dict_refuses_a_different_dataset_or_setting() -> None:
    samples = make_samples([3, 4, 5])
    state = FinetunePool(samples, seed=1).state_dict()
    with pytest.raises(ValueError, match="different samples"):
        FinetunePool(make_samples([3, 4, 6]), seed=1).load_state_dict(state)
    with pytest.raises(ValueError, match="seed"):
        FinetunePool(samples, seed=2).load_state_dict(state)
    with pytest.raises(ValueError, match="not a FinetunePool state"):
        FinetunePool(samples).load_state_dict({"version": 99})


def test_pool_is_deterministic_under_a_seed() -> None:
    samples = make_samples([random.Random(i).randint(2, 10) for i in range(50)])
    runs = [drive(FinetunePool(samples, epochs=2, seed=4), random.Random(9), 300) for _ in range(2)]
    assert runs[0] == runs[1]
    assert runs[0] != drive(FinetunePool(samples, epochs=2, seed=5), random.Random(9), 300)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.integers(2, 30), min_size=1, max_size=40), st.integers(0, 2**32), st.booleans())
def test_order_is_sorted_and_a_permutation(lengths, seed, shuffle) -> None:
    pool = FinetunePool(make_samples(lengths), seed=seed, shuffle=shuffle)
    order = list(pool.iter_by_length())
    assert sorted(s.sample_id for s in order) == list(range(len(lengths)))
    assert [s.num_tokens for s in order] == sorted(lengths)


class PoolMachine(RuleBasedStateMachine):
    """Random claim/release/complete/checkpoint sequences; every sample is in exactly one place at all times."""

    @initialize(lengths=st.lists(st.integers(2, 12), min_size=1, max_size=25), epochs=st.integers(1, 3),
                seed=st.integers(0, 1000))
    def setup(self, lengths, epochs, seed) -> None:
        self.samples = make_samples(lengths)
        self.pool = FinetunePool(self.samples, epochs=epochs, seed=seed)
        self.args = dict(epochs=epochs, seed=seed)
        self.completed_total = 0
        self.last_epoch = 0

    @precondition(lambda self: len(self.pool) > 0)
    @rule(k=st.integers(1, 5))
    def claim_prefix(self, k) -> None:
        batch = [s for _, s in zip(range(k), self.pool.iter_by_length())]
        self.pool.claim(batch)

    @precondition(lambda self: len(self.pool) > 0)
    @rule(data=st.data())
    def claim_any(self, data) -> None:
        available = list(self.pool.iter_by_length())
        self.pool.claim(data.draw(st.lists(st.sampled_from(available), min_size=1, max_size=3, unique_by=id)))

    @precondition(lambda self: self.pool.in_flight)
    @rule(data=st.data())
    def release(self, data) -> None:
        ids = data.draw(st.lists(st.sampled_from(sorted(self.pool.in_flight)), min_size=1, unique=True))
        self.pool.release(ids)

    @precondition(lambda self: self.pool.in_flight)
    @rule(data=st.data())
    def complete(self, data) -> None:
        ids = data.draw(st.lists(st.sampled_from(sorted(self.pool.in_flight)), min_size=1, unique=True))
        self.pool.complete(ids)
        self.completed_total += len(ids)

    @rule()
    def checkpoint_and_restore(self) -> None:
        state = json.loads(json.dumps(self.pool.state_dict()))
        fresh = FinetunePool(self.samples, **self.args)
        fresh.load_state_dict(state)
        self.pool = fresh  # in-flight samples are back in the pool

    @rule(sid=st.integers(0, 30))
    def bad_operations_change_nothing(self, sid) -> None:
        before = self.pool.progress()
        for op in (self.pool.release, self.pool.complete):
            if sid < len(self.samples) and self.pool.state_of(sid) == "in_flight":
                continue
            with pytest.raises((ValueError, KeyError)):
                op([sid])
        assert self.pool.progress() == before

    @invariant()
    def every_sample_in_exactly_one_place(self) -> None:
        pool = self.pool
        in_pool = [s.sample_id for s in pool.iter_by_length()]
        assert len(in_pool) == len(set(in_pool)) == len(pool)
        flying = pool.in_flight
        done = {s.sample_id for s in self.samples if pool.state_of(s.sample_id) == "done"}
        assert not (set(in_pool) & flying) and not (set(in_pool) & done) and not (flying & done)
        assert set(in_pool) | flying | done == {s.sample_id for s in self.samples}
        assert all(pool.state_of(i) == "pool" for i in in_pool)
        p = pool.progress()
        assert (p["in_pool"], p["in_flight"], p["done_in_epoch"]) == (len(in_pool), len(flying), len(done))
        assert [s.num_tokens for s in pool.iter_by_length()] == sorted(s.num_tokens for s in pool.iter_by_length())
        assert all(s.epoch == pool.epoch for s in pool.iter_by_length())
        assert pool.epoch >= self.last_epoch
        self.last_epoch = pool.epoch
        if pool.finished:
            assert pool.epoch == pool.epochs - 1 and len(pool) == 0 and not flying


TestPoolMachine = PoolMachine.TestCase
TestPoolMachine.settings = settings(max_examples=60, stateful_step_count=40, deadline=None)
