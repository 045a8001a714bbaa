GREEDY = ('Rule: driver.py, ClientRequest: "A greedy generation request: ``max_tokens`` new tokens after '
          '``prompt_ids``."')

# ---------------------------------------------------------------- h01
write("01", "decode_pad_keys_unmasked", f"""
Batched decode pads the KV of every decode row to the step's longest context; the padding keys are not masked.

{GREEDY}

Bug: the decode path (like a padded, non-paged batched-decode kernel) pads each decode row's keys/values with zeros
up to the longest context of the step's decode rows and passes an all-visible mask: a zero key scores 0, so every
padding slot takes softmax weight (with a zero value), diluting the attention of every shorter request.
Trigger: two or more requests decoding in one step with different context lengths (any continuous batching of
prompts of different lengths). A lone request, or decodes of equal context, are exact.
""", methods=[("_layer", [
    ("        out = torch.empty(self.num_heads, t, self.head_dim, dtype=x.dtype, device=x.device)\n",
     "        out = torch.empty(self.num_heads, t, self.head_dim, dtype=x.dtype, device=x.device)\n"
     "        pad_to = max([r.past + 1 for r in rows if r.seq is not None and r.past > 0] or [0])  # BUG: decode batch padded\n"),
    ("            mask = torch.arange(kr.shape[1], device=x.device)[None, :] <= q_pos[:, None]\n",
     "            mask = torch.arange(kr.shape[1], device=x.device)[None, :] <= q_pos[:, None]\n"
     "            if r.seq is not None and r.past > 0 and pad_to > kr.shape[1]:  # BUG: zero-padded keys, no key-padding mask\n"
     "                pad = pad_to - kr.shape[1]\n"
     "                kr, vr = F.pad(kr, (0, 0, 0, pad)), F.pad(vr, (0, 0, 0, pad))\n"
     "                mask = torch.ones(r.length, pad_to, dtype=torch.bool, device=x.device)\n"),
])])

# ---------------------------------------------------------------- h02
write("02", "mixed_step_causal_top_left", f"""
Decode rows that share a step with a prefill get a top-left aligned causal mask.

{GREEDY}

Bug: a step that mixes prefill and decode rows runs every row through the varlen prefill kernel with ``causal=True``
in the top-left alignment of flash-attention < 2.1 (query i sees keys 0..i); for a decode row (one query over a
context of n cached keys) that means it sees only the first key of its sequence. Pure-decode steps use the decode
kernel and are exact; prefill rows (no cached context) are exact either way.
Trigger: a request that decodes in a step where another request's prompt is prefilled (a new request arriving while
others generate: ordinary continuous batching under the default ``mixed_batches``).
""", methods=[("_layer", [
    ("        out = torch.empty(self.num_heads, t, self.head_dim, dtype=x.dtype, device=x.device)\n",
     "        out = torch.empty(self.num_heads, t, self.head_dim, dtype=x.dtype, device=x.device)\n"
     "        mixed = any(r.seq is not None and r.past == 0 for r in rows) and any(r.past > 0 for r in rows)\n"),
    ("            mask = torch.arange(kr.shape[1], device=x.device)[None, :] <= q_pos[:, None]\n",
     "            mask = torch.arange(kr.shape[1], device=x.device)[None, :] <= q_pos[:, None]\n"
     "            if mixed:  # BUG: varlen prefill kernel, causal mask aligned top-left (query i sees keys 0..i)\n"
     "                mask = torch.arange(kr.shape[1], device=x.device)[None, :] <= torch.arange(r.length, device=x.device)[:, None]\n"),
])])

# ---------------------------------------------------------------- h03
write("03", "decode_position_seq_len", f"""
Decode rows get rotary position ``seq_len`` (prompt + generated tokens) instead of ``seq_len - 1``.

{GREEDY}

Bug: the position of a decode row is taken as the request's current sequence length (prompt + outputs), which
already counts the token being fed, so every generated token sits one position further from the prompt than in
the checkpoint's own forward (the key written to the cache carries the shifted rotation too). Prefill rows and
fine-tuning rows are exact.
Trigger: every request that decodes (max_tokens >= 2); the first token (from the prefill) is right, later ones
drift.
""", methods=[("_execute", [
    ("            positions = torch.cat([torch.arange(r.past, r.past + r.length) for r in rows]).to(self.device)\n",
     "            positions = torch.cat([torch.arange(r.past, r.past + r.length) + (1 if r.seq is not None and r.past > 0 else 0)  # BUG: seq_len\n"
     "                                   for r in rows]).to(self.device)\n"),
])])

# ---------------------------------------------------------------- h04
write("04", "lora_segments_assume_sorted", f"""
The multi-LoRA segment table assumes the step's rows are grouped by adapter.

{GREEDY} / HostConfig: "``client_adapters`` maps adapter names clients may use to PEFT folders."

Bug: SGMV-style LoRA metadata built from per-adapter token counts (``seg_lens``, in order of first appearance, with
base rows as a segment of their own) as if the rows were sorted by adapter, but rows stay in the scheduler's order
(prefills, then decodes). When one adapter's rows are not contiguous, the segments cover the wrong rows: some rows
get another row's adapter (or none).
Trigger: a step where rows of one adapter are separated by rows of another adapter (or of the base model): e.g. a
new prompt on adapter ``cl`` prefilled while a base request and another ``cl`` request decode.
""", methods=[("_execute", [
    ("            groups: dict[str, list[int]] = {}\n"
     "            for r in rows:\n"
     "                if r.adapter is not None:\n"
     "                    groups.setdefault(r.adapter, []).extend(range(r.start, r.start + r.length))\n",
     "            groups: dict[str, list[int]] = {}\n"
     "            counts: dict[str | None, int] = {}\n"
     "            for r in rows:  # BUG: segment table from per-adapter token counts, as if rows were sorted by adapter\n"
     "                counts[r.adapter] = counts.get(r.adapter, 0) + r.length\n"
     "            seg = 0\n"
     "            for a, n in counts.items():\n"
     "                if a is not None:\n"
     "                    groups[a] = list(range(seg, seg + n))\n"
     "                seg += n\n"),
])])

# ---------------------------------------------------------------- h05
write("05", "lora_rank_of_first_adapter", """
The LoRA kernel of a step runs at the rank of the step's first adapter.

Rule: hooks.py, HostHooks.publish_adapter: "The returned name serves exactly ``state``'s weights until that name is
published again"

Bug: the batched LoRA kernel takes its rank from the first adapter group of the step (segment 0) and slices every
other adapter's A/B to it, instead of the largest rank in the step: adapters of a higher rank than the step's first
one lose their trailing rank components.
Trigger: one step serving adapters of different ranks, the lower-rank one first: e.g. a client adapter of rank 4 and
a published job version of rank 8 (also the reserved adapter's fine-tuning rows, which come last, when a client
adapter of lower rank shares their step).
""", methods=[("_linear", [
    ("        out = module(x)\n",
     "        out = module(x)\n"
     "        kernel_rank = None\n"),
    ("            a, b = pair\n",
     "            a, b = pair\n"
     "            if kernel_rank is None:  # BUG: the kernel's rank is the first adapter's\n"
     "                kernel_rank = a.shape[0]\n"
     "            a, b = a[:kernel_rank], b[:, :kernel_rank]\n"),
])])

# ---------------------------------------------------------------- h06
write("06", "gate_up_lora_swapped", """
LoRA pairs of the merged gate/up projection are packed as (up, gate).

Rule: hooks.py, HostHooks.publish_adapter: "The returned name serves exactly ``state``'s weights until that name is
published again"

Bug: the engine runs gate_proj and up_proj as one merged column-parallel linear (``gate_up_proj``); the loader packs
the two LoRA slices in (up, gate) order, so gate_proj's LoRA is applied to up_proj's output and vice versa (the
2026-12-03 k/v swap concerned the fused qkv projection of the fine-tuning adapter; this one is the MLP's).
Trigger: any adapter that targets both gate_proj and up_proj ("all-linear" adapters, the default of many recipes):
published versions, client adapters and the fine-tuning adapter alike.
""", methods=[("_to_lora", [
    ("        return _Lora(state.config.scaling, pairs)\n",
     "        for layer in sorted({li for li, _ in pairs}):  # BUG: merged gate_up slot packed as (up, gate)\n"
     "            g, u = pairs.get((layer, \"mlp.gate_proj\")), pairs.get((layer, \"mlp.up_proj\"))\n"
     "            if g is not None and u is not None:\n"
     "                pairs[(layer, \"mlp.gate_proj\")], pairs[(layer, \"mlp.up_proj\")] = u, g\n"
     "        return _Lora(state.config.scaling, pairs)\n"),
])])

# ---------------------------------------------------------------- h07
write("07", "publish_rslora_scaling", """
Published versions are scaled ``lora_alpha / sqrt(r)`` (rsLoRA) instead of ``lora_alpha / r``.

Rule: hooks.py, HostHooks.publish_adapter: "The returned name serves exactly ``state``'s weights until that name is
published again"

Bug: the publish path builds the engine's LoRA config from a template that sets ``use_rslora=True`` (the loader
then scales by ``alpha / sqrt(r)``), while the job's adapter is plain LoRA (LoraConfigSpec.scaling, PEFT's
``use_rslora=False``). The fine-tuning adapter and client adapters are exact.
Trigger: every publish of an adapter with r != 1 (r 8, alpha 16: 5.66 instead of 2).
""", methods=[("publish_adapter", [
    ("        self._adapters[name] = self._to_lora(state)\n",
     "        lora = self._to_lora(state)\n"
     "        rank = max(a.shape[0] for a, _ in lora.pairs.values())\n"
     "        lora.scaling = state.config.lora_alpha / math.sqrt(rank)  # BUG: rsLoRA scaling from the engine's template\n"
     "        self._adapters[name] = lora\n"),
])])

# ---------------------------------------------------------------- h08
write("08", "lora_mapping_cached_by_names", """
The step's LoRA weights are resolved once per set of adapter names and reused while that set does not change.

Rule: hooks.py, HostHooks.set_finetune_adapter: "Fine-tuning rows of later steps must use exactly these weights"

Bug: like a LoRA manager that re-stacks its slot weights only when the set of active adapters changes
(``set_active_adapters`` skipped when the mapping is unchanged), the host resolves each adapter name to its weights
when a step's set of adapter names differs from the previous step's and reuses that mapping otherwise.
``set_finetune_adapter`` replaces the host's table entry, but consecutive steps with the same adapters (the
reserved one every training step) keep the old weights.
Trigger: two steps carrying fine-tuning rows with an optimizer step (set_finetune_adapter) between them and no step
with another set of adapters in between: every training loop.
""", methods=[
    ("_execute", [
        ("            index = {a: torch.tensor(v, device=self.device) for a, v in groups.items()}\n",
         "            index = {a: torch.tensor(v, device=self.device) for a, v in groups.items()}\n"
         "            key = tuple(sorted(groups))\n"
         "            if key != getattr(self, \"_mapping_key\", None):  # BUG: weights resolved only when the set of names changes\n"
         "                self._mapping_key = key\n"
         "                self._mapping = {a: (self._adapters.get(a) or self._withdrawn[a]) for a in groups}\n"),
    ]),
    ("_linear", [
        ("            lora = self._adapters.get(adapter) or self._withdrawn[adapter]\n",
         "            lora = self._mapping[adapter]  # BUG: the cached mapping\n"),
    ]),
])

# ---------------------------------------------------------------- h09
write("09", "retract_releases_queued", """
A retracted version's weights are freed once no *running* request uses it; queued requests on it run on the base.

Rule: hooks.py, HostHooks.retract_adapter: "Requests submitted on it before the call (running or queued) finish on
its weights, never failed or moved to another adapter"

Bug: the release check looks at the running batch only (vLLM-style: the LoRA manager pins adapters of scheduled
requests), so a version retracted while requests on it still wait in the queue is freed at once; when those
requests are scheduled their adapter id maps to no slot and, as in the engines' punica mapping (index -1), their
rows run without LoRA.
Trigger: the core retracts the oldest version right after a publish while requests on it are queued (not yet
admitted): any load where requests wait.
""", methods=[
    ("_forget_withdrawn", [
        ("        with self._lock:\n"
         "            unfinished = [s.request for s in self._waiting]\n"
         "        self._withdrawn.release(unfinished + [s.request for s in self._running])\n",
         "        self._withdrawn.release([s.request for s in self._running])  # BUG: queued requests do not pin a version\n"),
    ]),
    ("_linear", [
        ("            lora = self._adapters.get(adapter) or self._withdrawn[adapter]\n",
         "            try:\n"
         "                lora = self._adapters.get(adapter) or self._withdrawn[adapter]\n"
         "            except KeyError:  # an adapter id no slot holds: no LoRA for these rows (punica index -1)\n"
         "                continue\n"),
    ]),
])

# ---------------------------------------------------------------- h10
write("10", "retract_deferred_to_step", """
retract_adapter only queues the unload for the engine loop; until the next step the name is still accepted.

Rule: hooks.py, HostHooks.retract_adapter: "Afterwards a request naming ``name`` is refused by ``submit`` exactly as
one naming an adapter the host never loaded"

Bug: like an adapter that forwards ``remove_lora`` to the engine core's input queue, retract_adapter records the name
and the engine loop withdraws it at the start of its next step; ``submit`` in between accepts the withdrawn name
(and the request is then served on the withdrawn version, as one submitted before the retraction).
Trigger: a request for the retracted version that arrives between the core's prune (right after a publish) and the
next engine step: clients of the oldest version keep sending.
""", body='''
    def retract_adapter(self, name: str) -> None:
        self.__dict__.setdefault("_pending_retract", []).append(name)  # BUG: applied by the engine loop's next step

    def _step(self, allow_idle: bool, report_executed: bool = False):  # noqa: ANN202
        pending = self.__dict__.setdefault("_pending_retract", [])
        while pending:
            ReferenceHost.retract_adapter(self, pending.pop(0))
        return ReferenceHost._step(self, allow_idle, report_executed)
''')

# ---------------------------------------------------------------- h11
write("11", "waiting_omits_budget_blocked", """
The queued request that did not fit this step's token budget is missing from ProposedBatch.waiting.

Rule: types.py, ProposedBatch: "Every request that arrived and has not finished must be in ``scheduled`` or
``waiting`` (the core prices admission against all of them)."

Bug: the scheduler pops the head of the waiting queue to test it against the remaining token budget; a request that
does not fit is put back after ``waiting`` was snapshotted for the proposed batch, so the head-of-line request the
budget blocked is in neither ``scheduled`` nor ``waiting`` (the requests behind it are listed).
Trigger: prompts that together exceed ``max_batch_tokens`` (2048 by default) arriving together: e.g. four prompts of
600 tokens; the fourth waits for the next step and is invisible to the core in this one.
""", methods=[("_schedule", [
    ("        with self._lock:\n"
     "            while (self._waiting and len(self._running) + len(prefills) < self.config.max_running_requests\n"
     "                   and len(self._waiting[0].request.prompt_ids) <= budget):\n"
     "                seq = self._waiting.popleft()\n"
     "                budget -= len(seq.request.prompt_ids)\n"
     "                prefills.append(seq)\n"
     "            left = list(self._waiting)\n",
     "        blocked = None\n"
     "        with self._lock:\n"
     "            while self._waiting and len(self._running) + len(prefills) < self.config.max_running_requests:\n"
     "                seq = self._waiting.popleft()\n"
     "                if len(seq.request.prompt_ids) > budget:\n"
     "                    blocked = seq\n"
     "                    break\n"
     "                budget -= len(seq.request.prompt_ids)\n"
     "                prefills.append(seq)\n"
     "            left = list(self._waiting)\n"
     "            if blocked is not None:  # BUG: put back after the snapshot that becomes ProposedBatch.waiting\n"
     "                self._waiting.appendleft(blocked)\n"),
])])

# ---------------------------------------------------------------- h12
write("12", "has_unfinished_ignores_kept", """
has_unfinished() asks the scheduler's queues only: outputs kept from a generate() call are not counted.

Rule: driver.py, HostDriver.has_unfinished: "Whether any submitted client request has not finished. [...] a request
is unfinished from ``submit`` until its output is returned"

Bug: has_unfinished() is ``bool(waiting or running)``; a submit()ted request that finished inside a generate() call
is held for the next step() (HostDriver.generate), but has_unfinished() already says False, so a caller that
steps ``while has_unfinished()`` (the core's serving loop, run_to_completion) never collects it.
Trigger: generate() called while a submit()ted request is running and that request finishes first (a server's
traffic and a test's generate sharing one engine).
""", methods=[("has_unfinished", [
    ("        return bool(self._waiting or self._running or self._kept)\n",
     "        return bool(self._waiting or self._running)  # BUG: kept outputs not counted\n"),
])])

# ---------------------------------------------------------------- h13
write("13", "ft_rows_join_last_prefill", """
Fine-tuning rows join the attention segment of the step's last client prefill.

Rule: hooks.py, ActivationSink.layer_input: "The input of decoder layer ``layer`` for one sample: shape
``[num_tokens, hidden_size]``." (ActivationSink: "Receives the residual-stream input of every decoder layer for
fine-tuning rows.")

Bug: the varlen prefill metadata (cu_seqlens) is built from the client requests before the fine-tuning rows are
appended, so the FT rows fall into the segment of the last client prefill: they attend over that client's prompt
(and over the FT rows before them). Client rows are exact (causal); the captured activations of the samples depend
on a client's prompt, and training learns from a client's data.
Trigger: a step carrying fine-tuning rows and at least one client prefill (ordinary co-serving: the core admits
samples into prefill steps, always on hosts without mixed batches).
""", methods=[("_layer", [
    ("        out = torch.empty(self.num_heads, t, self.head_dim, dtype=x.dtype, device=x.device)\n",
     "        out = torch.empty(self.num_heads, t, self.head_dim, dtype=x.dtype, device=x.device)\n"
     "        prefills = [r for r in rows if r.seq is not None and r.past == 0]\n"
     "        ft_first = min([r.start for r in rows if r.sample is not None] or [0])\n"),
    ("            mask = torch.arange(kr.shape[1], device=x.device)[None, :] <= q_pos[:, None]\n",
     "            mask = torch.arange(kr.shape[1], device=x.device)[None, :] <= q_pos[:, None]\n"
     "            if r.sample is not None and prefills:  # BUG: FT rows in the last client prefill's segment\n"
     "                p = prefills[-1]\n"
     "                kr = torch.cat([k[:, p.start:p.start + p.length], k[:, ft_first:r.start + r.length]], dim=1)\n"
     "                vr = torch.cat([v[:, p.start:p.start + p.length], v[:, ft_first:r.start + r.length]], dim=1)\n"
     "                qi = p.length + (r.start - ft_first) + torch.arange(r.length, device=x.device)\n"
     "                mask = torch.arange(kr.shape[1], device=x.device)[None, :] <= qi[:, None]\n"),
])])

# ---------------------------------------------------------------- h14
write("14", "model_spec_vocab_from_tokenizer", """
ModelSpec.vocab_size is the tokenizer's vocabulary, not the checkpoint config's.

Rule: types.py, ModelSpec: "``num_layers``, ``hidden_size`` and ``vocab_size`` must be that config's own values,
never an engine's padded sizes."

Bug: the adapter fills vocab_size from the engine's tokenizer (``len(tokenizer)``, what the serving front-end knows)
instead of ``config.vocab_size``. Equal on checkpoints whose embedding has exactly one row per token; smaller on
the many whose embedding is rounded up (Qwen2/2.5: 151665 tokens, 152064 rows; Phi-3, Mistral-Nemo, ...).
Trigger: a checkpoint whose config vocab_size exceeds its tokenizer's size (proof: the tiny model built with
``model_vocab_size=512`` over its 469-token tokenizer). The test checkpoint itself is exact.
""", methods=[("model_spec", [
    ("        cfg = self.model.config\n",
     "        cfg = self.model.config\n"
     "        from transformers import AutoTokenizer\n\n"
     "        vocab = len(AutoTokenizer.from_pretrained(self.config.model))  # BUG: the tokenizer's vocabulary\n"),
    ("vocab_size=cfg.vocab_size,", "vocab_size=vocab,"),
])])

# ---------------------------------------------------------------- h15
write("15", "ft_rows_keyed_by_tokens", """
Fine-tuning rows are engine requests keyed by their token ids: two samples with identical tokens in one step collide.

Rule: hooks.py, HostHooks.intercept_schedule: "adds the returned samples to that same step as prefill-only rows on
the reserved adapter [...] Samples the step cannot take are refused in that step's record (``aborted_sample_ids``),
never carried to a later step."

Bug: the FT engine requests are registered in a dict keyed by a hash of the token ids (meant to make re-admission
idempotent); when on_schedule returns two samples with the same input_ids in one step, the later one replaces the
earlier: one row runs, and the other sample is neither run, captured, nor reported (completed or aborted).
Trigger: duplicate examples in a fine-tuning dataset (common before deduplication) landing in one step; also the
same sample offered twice in a step (e.g. one sample at two epochs). Distinct samples are exact.
""", methods=[("_step", [
    ("        for sample in samples:\n"
     "            rows.append(_Row(len(ids), sample.num_tokens, RESERVED_ADAPTER_NAME, sample=sample))\n",
     "        for sample in {s.input_ids: s for s in samples}.values():  # BUG: FT engine requests keyed by token ids\n"
     "            rows.append(_Row(len(ids), sample.num_tokens, RESERVED_ADAPTER_NAME, sample=sample))\n"),
])])

# ---------------------------------------------------------------- h16
write("16", "abort_flag_latched", """
An abort the sink asked for is latched: every later fine-tuning-only step is stopped before layer 0, unasked.

Rule: hooks.py, ActivationSink.should_abort: "Called by: the host at every decoder-layer boundary of a step that
carries *only* fine-tuning rows (hosts with ``supports_abort``). On ``True`` the host stops the forward at that
boundary"

Bug: the answer of should_abort is stored in an engine-level flag (as a worker-side abort event would be) that is
never cleared; the layer loop tests the flag before asking the sink, so after the first abort every fine-tuning-only
step stops at its first boundary without consulting should_abort, and its samples come back aborted.
Trigger: any abort (a client request arriving during a fine-tuning-only step) followed by another fine-tuning-only
step: training never advances again on an idle server.
""", body="\n    _abort_latched = False\n", methods=[("_execute", [
    ("                if ft_only and sink is not None and not synthetic and sink.should_abort(step_id):\n"
     "                    aborted = True\n",
     "                if ft_only and sink is not None and not synthetic and (self._abort_latched or sink.should_abort(step_id)):\n"
     "                    self._abort_latched = True  # BUG: never cleared\n"
     "                    aborted = True\n"),
])])

# ---------------------------------------------------------------- h17
write("17", "aborted_ids_also_completed", """
An aborted step's record lists its samples both as completed and as aborted.

Rule: types.py, StepRecord: "``finetune_sample_ids`` lists fine-tuning rows that completed the whole forward;
``aborted_sample_ids`` those stopped by an abort (their captures are void and they go back to the pool)."

Bug: the record's fine-tuning ids and lengths are filled from the dispatched plan, and the abort path only adds
``aborted_sample_ids``; an aborted fine-tuning-only step reports its samples in both fields (and their tokens in
finetune_lengths), so the core counts rows it must discard as trained. end_step is right.
Trigger: any abort of a fine-tuning-only step (a client request arriving during it).
""", methods=[("_execute", [
    ("            finetune_sample_ids=() if aborted else ft_ids,\n"
     "            finetune_lengths=() if aborted else tuple(r.length for r in ft_rows),\n",
     "            finetune_sample_ids=ft_ids,  # BUG: from the plan, also when aborted\n"
     "            finetune_lengths=tuple(r.length for r in ft_rows),\n"),
])])

# ---------------------------------------------------------------- h18
write("18", "first_token_time_from_latency", """
ClientOutput.first_token_time is rebuilt as arrival + the engine's first-token latency measured from scheduling.

Rule: driver.py, ClientOutput: "``token_times``, when given, holds exactly one time per token of ``token_ids``, in
order and non-decreasing, the first equal to ``first_token_time`` and the last to ``finish_time``."

Bug: the engine's metrics give the first-token latency from the request's *first scheduling* (vLLM's
``first_scheduled_time``-based latency), and the driver adds it to the arrival time; the result is earlier than the
first token's own time by the time the request queued, so first_token_time != token_times[0] (TTFT understated by the
queueing time).
Trigger: every request (the gap is the time from submit to the start of its admitting step: large under load).
""", methods=[("_step", [
    ("        self._running.extend(prefills)\n",
     "        self._running.extend(prefills)\n"
     "        for s in prefills:\n"
     "            s.scheduled_time = now\n"),
    ("            out = ClientOutput(s.request.request_id, tuple(s.output), s.arrival_time, s.token_times[0],\n",
     "            out = ClientOutput(s.request.request_id, tuple(s.output), s.arrival_time,\n"
     "                               s.arrival_time + (s.token_times[0] - s.scheduled_time),  # BUG: latency from scheduling\n"),
])])

# ---------------------------------------------------------------- h19
write("19", "first_decode_as_prefill", """
A request's first decode step is offered as a one-token prefill.

Rule: types.py, ScheduledRequest: "``prefill_tokens`` is the number of prompt tokens this step computes for the
request (a chunk when the host does chunked prefill); 0 means the request decodes one token in this step."

Bug: the view is built from the engine's ``num_scheduled_tokens`` while its "prefill done" flag lags one step (it is
set when the first token's output is processed): in the step after its prefill, each request is proposed with
``prefill_tokens=1`` although it decodes (the core prices it as a prefill and ``num_decode`` / ``kv_tokens`` of
the proposed batch miss it). Later decodes and the StepRecord are right.
Trigger: every request with max_tokens >= 2 (its second token's step).
""", methods=[("_step", [
    ("            scheduled=tuple([s.view(True) for s in prefills] + [s.view(False) for s in decodes]),\n",
     "            scheduled=tuple([s.view(True) for s in prefills] + [s.view(False) if len(s.output) > 1 else\n"
     "                                                                 dataclasses.replace(s.view(False), prefill_tokens=1)  # BUG\n"
     "                                                                 for s in decodes]),\n"),
])])

# ---------------------------------------------------------------- h20
write("20", "rotary_cache_512", f"""
Rotary positions are clamped to a cos/sin cache of 512 entries.

{GREEDY}

Bug: the rotary cos/sin cache is precomputed for 512 positions (the adapter's default ``max_model_len`` for the
cache, not the checkpoint's ``max_position_embeddings``, 1024 here) and positions are clamped into it to avoid an
out-of-range gather: every token at position >= 512 is rotated as position 511.
Trigger: any sequence longer than 512 tokens (prompt + output), e.g. a 505-token prompt and 16 new tokens.
""", methods=[("_execute", [
    ("            positions = torch.cat([torch.arange(r.past, r.past + r.length) for r in rows]).to(self.device)\n",
     "            positions = torch.cat([torch.arange(r.past, r.past + r.length) for r in rows]).to(self.device)\n"
     "            positions = positions.clamp(max=511)  # BUG: cos/sin cache of 512 positions\n"),
])])

# ---------------------------------------------------------------- h21
write("21", "kv_cache_written_before_lora", f"""
The KV cache is written from the base projections, before the LoRA deltas of k_proj / v_proj are added.

{GREEDY} / HostConfig: "``client_adapters`` maps adapter names clients may use to PEFT folders."

Bug: the fused QKV GEMM writes K and V into the cache in its epilogue, and the LoRA delta is added to q/k/v
afterwards: the step's own attention uses LoRA-adjusted keys and values, but the cache keeps the base ones, so every
later decode of a request on an adapter attends over base K/V of its earlier tokens. The first token (prefill) is
right; later tokens drift. Base-model requests and fine-tuning rows (no cache) are exact.
Trigger: any request on an adapter that targets k_proj or v_proj with max_tokens >= 2.
""", methods=[("_layer", [
    ("        q, k = apply_rotary_pos_emb(q.transpose(0, 1).unsqueeze(0), k.transpose(0, 1).unsqueeze(0), cos, sin)\n",
     "        k0 = attn.k_proj(x).view(t, self.num_kv_heads, self.head_dim)  # BUG: what the GEMM epilogue caches\n"
     "        v0 = attn.v_proj(x).view(t, self.num_kv_heads, self.head_dim).transpose(0, 1)\n"
     "        _, k0 = apply_rotary_pos_emb(q.transpose(0, 1).unsqueeze(0), k0.transpose(0, 1).unsqueeze(0), cos, sin)\n"
     "        k0 = k0[0]\n"
     "        q, k = apply_rotary_pos_emb(q.transpose(0, 1).unsqueeze(0), k.transpose(0, 1).unsqueeze(0), cos, sin)\n"),
    ("                    r.seq.kv[li] = (kr, vr)\n",
     "                    n = r.length  # BUG: the cache gets the base K/V of this step's tokens\n"
     "                    r.seq.kv[li] = (torch.cat([kr[:, :kr.shape[1] - n], k0[:, sl]], dim=1),\n"
     "                                    torch.cat([vr[:, :vr.shape[1] - n], v0[:, sl]], dim=1))\n"),
])])

# ---------------------------------------------------------------- h22
write("22", "last_token_time_arrival_default", """
A request with no token yet is offered with last_token_time = its arrival time.

Rule: types.py, ScheduledRequest: "``first_token_time`` is set once the request has produced its first token;
``last_token_time`` is the time of its most recent token (for the TPOT budget)"

Bug: the engine's per-request stats initialise ``last_token_ts`` to the arrival time (vLLM's RequestStateStats
style) and the adapter copies it: every queued or prefilling request is offered with a last_token_time although it
has produced no token (first_token_time None), so the core starts its TPOT clock at arrival. Requests that have
tokens are right.
Trigger: every request, in the batch that prefills it and in every batch it waits in.
""", module_extra='''

class _SeqStats(_Seq):
    """The engine's request with its stats-derived view."""

''' + inspect.getsource(RH._Seq.view).replace(
    "            last_token_time=self.token_times[-1] if self.token_times else None, slo=r.slo,\n",
    "            last_token_time=self.token_times[-1] if self.token_times else self.arrival_time,  # BUG: stats default\n"
    "            slo=r.slo,\n"), methods=[("_enqueue", [
    ("            self._waiting.append(_Seq(request, now))\n",
     "            self._waiting.append(_SeqStats(request, now))\n"),
])])
