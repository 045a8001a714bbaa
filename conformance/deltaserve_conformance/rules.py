"""Every normative sentence of the host protocol, and the check(s) that enforce it.

The protocol is written down in the docstrings (and ``#:`` comments) of :mod:`deltaserve_core.hooks`,
:mod:`deltaserve_core.types` and :mod:`deltaserve_core.driver` (the client side every check drives).
:func:`documented_rules` parses them: a sentence is a rule when it says *must*, *never*, *exactly* or *once per*.
:data:`RULES` maps each one to the checks that enforce it, or says why none can (an obligation of the core, which
the suite's recorders keep by construction). The meta-test
``test_rules.py`` fails when a new rule appears without an entry here, so the contract cannot grow past the suite.
"""

from __future__ import annotations

import ast
import re
from dataclasses import dataclass
from pathlib import Path

__all__ = ["Rule", "DocumentedRule", "RULES", "SHAPE_RERUNS", "documented_rules", "rules_for"]

_NORMATIVE = re.compile(r"\b(must|never|exactly|once per)\b", re.IGNORECASE)


@dataclass(frozen=True)
class DocumentedRule:
    """One normative sentence: where it is written (``Class.method`` or ``#:`` + the constant) and its text."""

    where: str
    sentence: str


@dataclass(frozen=True)
class Rule:
    """Entry of :data:`RULES`: ``phrase`` identifies the sentence (a substring of it, whitespace-normalised)."""

    where: str
    phrase: str
    checks: tuple[str, ...] = ()
    #: why no host check exists (an obligation of the core, kept by the suite's own recorders)
    core_obligation: str = ""

    @property
    def sentence(self) -> str:
        return next((d.sentence for d in documented_rules() if d.where == self.where and self.phrase in d.sentence),
                    self.phrase)


def _sentences(text: str) -> list[str]:
    text = " ".join(text.split())
    # Split at sentence ends and list bullets; ". " inside ``code`` spans is rare enough in these docstrings.
    parts = re.split(r"(?<=[.;])\s+(?=[A-Z*`(])|\s+[-*]\s+(?=``)", text)
    return [p.strip() for p in parts if p.strip()]


_CACHE: list[DocumentedRule] | None = None


def documented_rules() -> list[DocumentedRule]:
    """Parse hooks.py, types.py and driver.py (the installed ones) for normative sentences."""
    global _CACHE
    if _CACHE is not None:
        return _CACHE
    import deltaserve_core.driver as driver
    import deltaserve_core.hooks as hooks
    import deltaserve_core.types as types

    found: list[DocumentedRule] = []
    for module in (hooks, types, driver):
        source = Path(module.__file__).read_text()  # type: ignore[arg-type]
        tree = ast.parse(source)

        def walk(node: ast.AST, prefix: str) -> None:
            for child in ast.iter_child_nodes(node):
                if isinstance(child, (ast.ClassDef, ast.FunctionDef)):
                    where = prefix + child.name
                    for s in _sentences(ast.get_docstring(child) or ""):
                        if _NORMATIVE.search(s):
                            found.append(DocumentedRule(where, s))
                    walk(child, where + ".")

        walk(tree, "")
        lines = source.splitlines()
        for i, line in enumerate(lines):
            stripped = line.strip()
            if stripped.startswith("#:"):
                target = lines[i + 1].split("=")[0].split(":")[0].strip() if i + 1 < len(lines) else "?"
                for s in _sentences(stripped[2:]):
                    if _NORMATIVE.search(s):
                        found.append(DocumentedRule(f"#:{target}", s))
    _CACHE = found
    return found


_CORE = "the core's obligation; the suite's recorders keep it by construction"

RULES: tuple[Rule, ...] = (
    Rule("#:RESERVED_ADAPTER_NAME", "Hosts must refuse client requests naming it",
         ("intercept_schedule__reserved_adapter_refused", "intercept_schedule__reserved_adapter_variants_refused",
          "intercept_schedule__reserved_adapter_refused_by_generate")),
    Rule("#:REQUIRED_MEMBERS", "Every member a host must provide", ("protocol__validate_host",)),
    Rule("ScheduleInterceptor.on_schedule", "exactly once per step",
         ("intercept_schedule__once_per_step", "generated__scenarios_keep_every_invariant",
          "stateful__interleaved_operations_keep_every_invariant")),
    Rule("ScheduleInterceptor.on_schedule", "an empty sequence means the step runs exactly as the host proposed it",
         ("intercept_schedule__injected_rows_run_in_same_step", "intercept_schedule__declining_leaves_batch_unchanged",
          "generated__scenarios_keep_every_invariant")),
    Rule("ScheduleInterceptor.on_schedule", "Must return within tens of microseconds",
         core_obligation=_CORE + " (the recorders return at once)"),
    Rule("ScheduleInterceptor.on_schedule", "Never blocks, never raises",
         core_obligation=_CORE + " (the recorders never block or raise)"),
    Rule("ScheduleInterceptor.on_arrival", "once per client request",
         ("intercept_schedule__on_arrival_once_per_client_request", "generated__scenarios_keep_every_invariant",
          "stateful__interleaved_operations_keep_every_invariant")),
    Rule("ScheduleInterceptor.on_arrival", "Must not block", core_obligation=_CORE),
    Rule("ScheduleInterceptor.on_arrival", "Never called for a request ``submit`` refuses",
         ("intercept_schedule__no_on_arrival_for_refused_requests",)),
    Rule("ScheduledRequest", "``first_token_time`` never changes once set",
         ("intercept_schedule__scheduled_request_token_times", "generated__scenarios_keep_every_invariant",
          "stateful__interleaved_operations_keep_every_invariant")),
    Rule("ScheduledRequest", "``last_token_time`` is never set while",
         ("intercept_schedule__scheduled_request_token_times",)),
    Rule("ScheduledRequest", "``output_tokens`` never counts the prompt",
         ("intercept_schedule__scheduled_request_output_tokens_exclude_the_prompt",)),
    Rule("ScheduledRequest", "never the tokens this step computes",
         ("intercept_schedule__prefill_context_is_what_the_prompt_computed_before",)),
    Rule("ScheduledRequest", "``slo`` must be the client request's own",
         ("intercept_schedule__scheduled_request_carries_its_slo",)),
    Rule("HostDriver.generate", "Returns exactly one output per request, in request order",
         ("driver__generate_returns_outputs_in_request_order", "generated__scenarios_keep_every_invariant",
          "stateful__interleaved_operations_keep_every_invariant")),
    Rule("HostDriver.generate", "Steps run meanwhile go through the hooks exactly as in serving",
         ("intercept_schedule__injected_rows_run_in_same_step",
          "intercept_schedule__client_outputs_match_independent_model")),
    Rule("HostDriver.submit", "never lost", ("intercept_schedule__request_submitted_during_a_step_is_served",
                                             "driver__a_prompt_of_the_whole_step_budget_is_served",
                                             "intercept_schedule__request_arriving_during_an_aborted_step_is_served")),
    Rule("check_client_adapter", "What every host's ``submit`` must refuse",
         ("intercept_schedule__reserved_adapter_refused", "intercept_schedule__reserved_adapter_variants_refused",
          "intercept_schedule__no_on_arrival_for_refused_requests", "driver__unknown_adapter_refused",
          "intercept_schedule__reserved_adapter_refused_by_generate")),
    Rule("ScheduleInterceptor.on_arrival", "must never be lost",
         ("intercept_schedule__request_submitted_during_a_step_is_served",
          "intercept_schedule__request_arriving_during_an_aborted_step_is_served")),
    Rule("ActivationSink.begin_step", "Called once per such step, before layer 0",
         ("capture_activation__call_order", "generated__scenarios_keep_every_invariant")),
    Rule("ActivationSink.layer_input", "Called once per (layer, fine-tuning sample)",
         ("capture_activation__only_finetune_rows_in_layer_order", "capture_activation__matches_reference_forward", "capture_activation__call_order",
          "capture_activation__layer_input_arrives_before_its_layer_runs", "generated__scenarios_keep_every_invariant")),
    Rule("ActivationSink.layer_input", "Never called for inference rows",
         ("capture_activation__only_finetune_rows_in_layer_order", "generated__scenarios_keep_every_invariant")),
    Rule("ActivationSink.should_abort", "Whether the host must stop a fine-tuning-only step now",
         ("capture_activation__abort_stops_finetune_only_step", "capture_activation__abort_stops_compute",
          "capture_activation__abort_does_not_outlive_its_step",
          "stateful__interleaved_operations_keep_every_invariant")),
    Rule("ActivationSink.should_abort", "share a step with client rows are never aborted",
         ("capture_activation__mixed_step_rows_complete_whatever_should_abort_says",)),
    Rule("HostHooks.intercept_schedule", "never carried to a later step",
         ("intercept_schedule__rows_over_the_step_budget_run_or_are_refused_in_that_step",
          "intercept_schedule__samples_with_equal_tokens_each_run_or_are_refused",
          "generated__scenarios_keep_every_invariant")),
    Rule("HostHooks.intercept_schedule", "replaces the installed interceptor, which is never called again",
         ("capture_activation__a_second_install_replaces_the_first", "intercept_schedule__none_removes_every_hook")),
    Rule("HostHooks.capture_activation", "replaces the installed sink, which is never called again",
         ("capture_activation__a_second_install_replaces_the_first", "intercept_schedule__none_removes_every_hook",
          "capture_activation__none_alone_removes_the_sink")),
    Rule("HostHooks.report_step_time", "replaces the installed sink, which is never called again",
         ("capture_activation__a_second_install_replaces_the_first", "intercept_schedule__none_removes_every_hook")),
    Rule("HostHooks.set_finetune_adapter", "The host must copy what it keeps",
         ("set_finetune_adapter__keeps_its_own_copy",)),
    Rule("HostHooks.set_finetune_adapter", "must refuse it by raising, never run with part of it",
         ("set_finetune_adapter__every_target_module_applies_or_is_refused",)),
    Rule("HostHooks.set_finetune_adapter", "never by logging the error and keeping the previous weights",
         ("set_finetune_adapter__over_max_lora_rank_applies_or_is_refused",)),
    Rule("HostHooks.publish_adapter", "request the returned name exactly as returned",
         ("publish_adapter__returned_name_serves_as_returned",)),
    Rule("HostHooks.run_profile_step", "never more than the call took",
         ("run_profile_step__duration_in_seconds_within_the_call",)),
    Rule("HostHooks", "never concurrently with itself",
         core_obligation=_CORE + " (checks call the host from one thread)"),
    Rule("HostHooks.capabilities", "must be cheap and constant", ("capabilities__constant_for_the_host_lifetime",)),
    Rule("HostHooks.intercept_schedule", "once per step before dispatch",
         ("intercept_schedule__once_per_step", "intercept_schedule__injected_rows_run_in_same_step",
          "intercept_schedule__declining_leaves_batch_unchanged", "intercept_schedule__inputs_not_mutated",
          "intercept_schedule__finetune_rows_read_no_prefix_cache",
          "intercept_schedule__no_finetune_row_reaches_client", "intercept_schedule__outputs_unchanged_by_injection",
          "intercept_schedule__client_ids_equal_to_sample_ids_are_served_intact",
          "intercept_schedule__client_outputs_match_independent_model", "intercept_schedule__on_arrival_once_per_client_request",
          "generated__scenarios_keep_every_invariant", "stateful__interleaved_operations_keep_every_invariant")),
    Rule("HostHooks.capture_activation", "must run eagerly", ("graph_mode__finetune_steps_are_eager",
                                                             "generated__scenarios_keep_every_invariant")),
    Rule("HostHooks.report_step_time", "exactly one :class:`StepRecord` per executed step",
         ("report_step_time__one_record_per_step", "report_step_time__consistent_with_wall_clock",
          "report_step_time__duration_not_below_device_time", "report_step_time__profile_step_reports_its_shape",
          "report_step_time__record_has_the_composition_that_ran", "generated__scenarios_keep_every_invariant", "stateful__interleaved_operations_keep_every_invariant")),
    Rule("HostHooks.graph_mode", "Called by the core inside ``on_schedule``",
         core_obligation=_CORE + " (checks call graph_mode from the thread that drives the host)"),
    Rule("HostHooks.graph_mode", "Must be a pure function",
         ("graph_mode__pure_function_of_shape", "graph_mode__agrees_with_execution",
          "generated__scenarios_keep_every_invariant")),
    Rule("HostHooks.set_finetune_adapter", "never while a step carrying fine-tuning rows is in flight",
         core_obligation=_CORE + " (checks call it between steps only)"),
    Rule("HostHooks.set_finetune_adapter", "must use exactly these weights",
         ("set_finetune_adapter__later_rows_use_the_new_weights", "intercept_schedule__inputs_not_mutated",
          "set_finetune_adapter__lora_dropout_never_reaches_the_forward",
          "stateful__interleaved_operations_keep_every_invariant")),
    Rule("HostHooks.publish_adapter", "must never serve KV computed with older weights",
         ("publish_adapter__serves_published_weights", "publish_adapter__new_version_never_served_stale_kv",
          "publish_adapter__base_rows_unchanged_when_every_adapter_slot_is_taken",
          "stateful__interleaved_operations_keep_every_invariant")),
    Rule("HostHooks.run_profile_step", "Synthetic rows never reach a client",
         ("run_profile_step__synthetic_rows_never_reach_a_client", "report_step_time__profile_step_reports_its_shape",
          "stateful__interleaved_operations_keep_every_invariant")),
    Rule("ProposedBatch", "must be in ``scheduled`` or ``waiting``",
         ("intercept_schedule__batch_lists_every_unfinished_request", "generated__scenarios_keep_every_invariant",
          "stateful__interleaved_operations_keep_every_invariant")),
    Rule("StepRecord", "never before the step's batch was decided",
         ("report_step_time__duration_excludes_scheduling",)),
    Rule("ProfileShape", "never the one asked for when the host could not run it",
         ("run_profile_step__reports_the_mode_it_ran_in",)),
    Rule("ActivationSink", "never by a count the forward side keeps itself",
         ("capture_activation__step_id_is_the_scheduler_step",)),
    Rule("HostHooks.report_step_time", "after the step's outputs are processed, never before",
         ("report_step_time__record_after_the_step_outputs",)),
    Rule("HostHooks.run_profile_step", "or the call refuses the shape by raising: never dropped",
         ("run_profile_step__finetune_rows_never_dropped",)),
    Rule("HostHooks.run_profile_step", "exactly once like every step's",
         ("run_profile_step__record_delivered_exactly_once", "report_step_time__profile_step_reports_its_shape")),
    Rule("LendsBaseWeights.base_weights", "Called by: the core, once per",
         core_obligation=_CORE + " (the check calls it from the owning process)"),
    Rule("LendsBaseWeights.base_weights", "never a copy", ("lends_base_weights__views_of_the_checkpoint",)),
    Rule("LendsBaseWeights.base_weights", "must not lend them", ("lends_base_weights__views_of_the_checkpoint",)),
    Rule("HostCapabilities", "S-LoRA never mixes them",
         core_obligation=_CORE + " (checks inject into prefill steps only when mixed_batches is False)"),
    Rule("HostCapabilities", "the core never injects more",
         core_obligation=_CORE + " (the generated scenarios fill up to the cap, never past it)"),
    Rule("HostCapabilities", "It must be the dtype the engine runs in",
         ("capabilities__dtypes_follow_the_engine_dtype",)),
    Rule("ModelSpec", "``dtype`` must be the dtype the engine serves the model in",
         ("capabilities__dtypes_follow_the_engine_dtype",)),
    Rule("HostCapabilities", "never reused under another",
         core_obligation="the calibration store's obligation (tests/test_calibration.py)"),
    Rule("ProposedBatch", "never in both", ("intercept_schedule__scheduled_and_waiting_are_disjoint",)),
    Rule("StepRecord", "A ``step_id`` is never reused", ("report_step_time__step_ids_never_repeat",)),
    Rule("ScheduledRequest", "A token's time is never before the forward",
         ("intercept_schedule__token_times_not_before_their_step",
          "intercept_schedule__a_reused_request_id_is_a_new_request")),
    Rule("HostCapabilities", "It must be the host's whole per-step token budget",
         ("capabilities__finetune_budget_is_the_step_budget",)),
    Rule("ModelSpec", "``path`` must be a local transformers checkpoint folder",
         ("model_spec__matches_the_checkpoint",)),
    Rule("ModelSpec", "``layer_module`` must be the dotted attribute path", ("model_spec__matches_the_checkpoint",)),
    Rule("ClientRequest", "it must stop at the first EOS it generates",
         ("driver__ignore_eos_false_stops_at_the_first_eos",)),
    Rule("HostDriver.run_idle_step", "True exactly when one ran", ("driver__run_idle_step_answers_whether_a_step_ran",
                                                                    "driver__run_idle_step_true_for_an_aborted_step")),
    Rule("HostCapabilities", "A host that declares it must run fine-tuning rows injected into a decode-only step",
         ("capabilities__declared_mixed_batches_run_rows_in_decode_steps",)),
    Rule("HostDriver.run_idle_step", "Client requests pending when it is called are never lost",
         ("driver__run_idle_step_never_loses_pending_client_work",)),
    Rule("HostHooks.publish_adapter", "The returned name serves exactly ``state``'s weights",
         ("publish_adapter__version_keeps_its_weights_when_training_moves_on",
          "publish_adapter__republished_name_serves_the_new_weights",
          "publish_adapter__older_version_keeps_its_weights_after_a_newer_publish",
          "publish_adapter__serves_a_copy_of_the_state",
          "publish_adapter__every_version_in_one_step_serves_its_weights",
          "publish_adapter__adapters_of_different_ranks_in_one_step_serve_their_weights")),
    Rule("HostHooks.publish_adapter", "Requests in flight when it is called keep the adapter",
         ("publish_adapter__requests_in_flight_keep_their_adapter",)),
    # --- audit 2026-12-05 (checks_lifecycle.py, checks_audit.py)
    Rule("HostDriver.shutdown", "a second call returns without raising", ("driver__shutdown_is_idempotent",)),
    Rule("HostDriver.shutdown", "It returns also with client requests pending",
         ("driver__shutdown_returns_with_requests_pending", "driver__shutdown_drops_pending_requests_without_stepping")),
    Rule("HostDriver.shutdown", "It never leaves a process or a non-daemon thread the host started running",
         ("driver__shutdown_leaves_nothing_running",)),
    Rule("HostHooks.set_finetune_adapter", "Client requests in flight when it is called keep the weights",
         ("set_finetune_adapter__requests_in_flight_keep_their_adapter",)),
    Rule("HostDriver.step", "It never runs several steps in one call", ("driver__step_runs_at_most_one_engine_step",)),
    Rule("HostDriver.has_unfinished", "Fine-tuning and calibration rows never count",
         ("driver__has_unfinished_counts_client_requests_only",)),
    Rule("HostDriver.has_unfinished", "It must answer so from any thread, also while a step runs",
         ("driver__has_unfinished_from_another_thread_during_a_step",
          "driver__has_unfinished_true_when_the_finishing_steps_record_arrives",
          "driver__has_unfinished_counts_a_request_during_its_on_arrival")),
    Rule("ClientOutput", "``arrival_time`` is when ``submit``", ("driver__client_output_times_follow_the_request",)),
    Rule("ClientOutput", "``token_times``, when given, holds exactly one time per token",
         ("driver__client_output_times_follow_the_request", "driver__ignore_eos_false_stops_at_the_first_eos")),
    # --- reach, after blind batch 2026-12-05 (checks_reach.py, checks_lifecycle.py)
    Rule("HostDriver.submit", "it never waits for the step to end",
         ("driver__submit_from_another_thread_returns_while_a_step_runs",)),
    Rule("HostDriver.shutdown", "it never keeps them referenced", ("driver__shutdown_releases_request_memory",)),
    Rule("HostHooks.publish_adapter", "never serve the returned name without some of them",
         ("publish_adapter__every_target_module_serves_or_is_refused",)),
    # --- blind batch 2026-12-06b, h16 and h28 (checks_interleaving.py)
    Rule("HostDriver.generate", "their outputs are never lost and never in its result",
         ("driver__generate_keeps_other_requests_outputs_for_step",)),
    Rule("HostDriver.step", "It also returns, exactly once, the outputs of other requests",
         ("driver__generate_keeps_other_requests_outputs_for_step",)),
    Rule("HostHooks.retract_adapter", "It withdraws exactly that version",
         ("retract_adapter__withdraws_exactly_that_version",)),
    Rule("HostHooks.retract_adapter", "is refused by ``submit`` exactly as one naming an adapter the host never loaded",
         ("retract_adapter__withdraws_exactly_that_version",
          "retract_adapter__requests_in_flight_finish_on_their_version")),
    Rule("HostHooks.retract_adapter", "finish on its weights, never failed or moved to another adapter",
         ("retract_adapter__requests_in_flight_finish_on_their_version",)),
    # --- blind batch 2026-12-07c, h07 h14 h16 h28 (checks.py, checks_interleaving.py)
    Rule("HostHooks.set_finetune_adapter", "A state carries its own rank and ``lora_alpha``",
         ("set_finetune_adapter__a_state_of_another_rank_or_alpha_runs_at_its_own_scaling",)),
    Rule("ProposedBatch", "A request whose ``submit`` returned before the host proposed the step has arrived",
         ("intercept_schedule__request_submitted_between_steps_is_in_the_next_offer",)),
    Rule("ClientRequest", "Every id of the checkpoint's ``eos_token_id`` is an EOS",
         ("driver__ignore_eos_false_stops_at_the_first_eos",)),
    Rule("ClientRequest", "once its output was returned the id may be submitted again",
         ("intercept_schedule__a_reused_request_id_is_a_new_request",)),
)


#: Checks checks_shapes.py runs again on a host started on the production-shaped checkpoint (``deep_model__<name>``):
#: the numeric ones, whose truth a model shape can change (layer indices, GQA grouping, projection widths). Each re-run
#: enforces the rules its original does.
SHAPE_RERUNS: tuple[str, ...] = (
    "capture_activation__matches_reference_forward",
    "set_finetune_adapter__later_rows_use_the_new_weights",
    "intercept_schedule__client_outputs_match_independent_model",
    "publish_adapter__serves_published_weights",
    "lends_base_weights__views_of_the_checkpoint",
    "capture_activation__abort_stops_finetune_only_step",
    "model_spec__matches_the_checkpoint",
    "driver__a_prompt_of_the_whole_step_budget_is_served",
    "driver__ignore_eos_false_stops_at_the_first_eos",
)

RULES = tuple(Rule(r.where, r.phrase, r.checks + tuple(f"deep_model__{c}" for c in r.checks if c in SHAPE_RERUNS),
                   r.core_obligation) for r in RULES)


def rules_for(check_name: str) -> list[Rule]:
    """The documented rules a check enforces (for its failure message)."""
    return [r for r in RULES if check_name in r.checks]


def table() -> str:
    """The rule → check table in Markdown (``python -m deltaserve_conformance.rules``)."""
    lines = ["| where | rule (phrase) | checks |", "| --- | --- | --- |"]
    for r in RULES:
        checks = ", ".join(f"`{c}`" for c in r.checks) if r.checks else f"none: {r.core_obligation}"
        lines.append(f"| `{r.where}` | {r.phrase} | {checks} |")
    return "\n".join(lines)


if __name__ == "__main__":
    print(table())
