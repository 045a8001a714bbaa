"""Every normative sentence of hooks.py/types.py maps to a check (or to a named obligation of the core), and every
check enforces a documented rule: a rule added to the protocol without a check fails here."""

from __future__ import annotations

from deltaserve_conformance.checks import CHECKS
from deltaserve_conformance.rules import RULES, documented_rules


def _matches(rule, doc) -> bool:  # noqa: ANN001
    return rule.where == doc.where and rule.phrase in doc.sentence


def test_every_documented_rule_has_exactly_one_entry() -> None:
    docs = documented_rules()
    assert len(docs) >= 25, f"the parser found only {len(docs)} normative sentences; is it still reading the docstrings?"
    unmapped = [f"{d.where}: {d.sentence}" for d in docs if not any(_matches(r, d) for r in RULES)]
    assert not unmapped, "normative sentences without a check (add one to checks.py and an entry to rules.RULES):\n" \
        + "\n".join(unmapped)
    ambiguous = [f"{d.where}: {d.sentence}" for d in docs if sum(_matches(r, d) for r in RULES) > 1]
    assert not ambiguous, "sentences matched by more than one RULES entry:\n" + "\n".join(ambiguous)


def test_every_entry_names_a_documented_sentence_and_real_checks() -> None:
    docs = documented_rules()
    stale = [f"{r.where}: {r.phrase!r}" for r in RULES if not any(_matches(r, d) for d in docs)]
    assert not stale, "RULES entries whose sentence is gone from the docstrings:\n" + "\n".join(stale)
    names = {c.name for c in CHECKS}
    unknown = sorted({c for r in RULES for c in r.checks} - names)
    assert not unknown, f"RULES names checks that do not exist: {unknown}"
    empty = [f"{r.where}: {r.phrase!r}" for r in RULES if not r.checks and not r.core_obligation]
    assert not empty, "entries with neither a check nor a core obligation:\n" + "\n".join(empty)


def test_every_check_enforces_a_documented_rule() -> None:
    enforced = {c for r in RULES for c in r.checks}
    orphans = sorted(c.name for c in CHECKS if c.name not in enforced)
    assert not orphans, f"checks that enforce no documented rule (document the rule in hooks.py/types.py): {orphans}"
