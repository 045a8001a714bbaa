GREEDY = ('Rule: driver.py, ClientRequest: "A greedy generation request: ``max_tokens`` new tokens after '
          '``prompt_ids``."')
EOS = ('driver.py, ClientRequest: "With ``ignore_eos=False`` it must stop at the first EOS it generates, EOS included '
       'as its last token"')
CLIENT = 'driver.py, HostConfig: "``client_adapters`` maps adapter names clients may use to PEFT folders."'
FT_EXACT = ('hooks.py, HostHooks.set_finetune_adapter: "Fine-tuning rows of later steps must use exactly these weights '
            '(the training path is only exact if the forward sees the current adapter)."')
PUB_EXACT = ('hooks.py, HostHooks.publish_adapter: "The returned name serves exactly ``state``\'s weights until that '
             'name is published again"')
IS_DONE_LINE = "        return bool(s.output) and not s.request.ignore_eos and s.output[-1] in self.eos_ids\n"

# ---------------------------------------------------------------- h01
write("01", "eos_scan_includes_prompt", f"""
The EOS stop check scans the whole sequence (prompt included), not the generated tokens.

Rule: {EOS}

Bug: the stop checker asks whether any token of the sequence is an EOS id (``seq.get_token_ids()``, prompt and output
together) instead of looking at the token just generated, as a stop-string / stop-token scanner written for the
output text and moved onto token ids does. A request with ignore_eos=False whose prompt holds an EOS id stops after
its first generated token. Prompts without an EOS id are exact; ignore_eos=True requests are exact.
Trigger: an ignore_eos=False request whose prompt contains the EOS id: chat transcripts that separate turns with
``</s>`` / ``<|eot_id|>``, few-shot prompts built from several documents.
""", methods=[("_is_done", [
    (IS_DONE_LINE,
     "        seq = tuple(s.request.prompt_ids) + tuple(s.output)  # BUG: the scan covers the prompt too\n"
     "        return bool(s.output) and not s.request.ignore_eos and any(t in self.eos_ids for t in seq)\n"),
])])

# ---------------------------------------------------------------- h02
write("02", "eos_checked_one_token_late", f"""
The EOS stop check looks at the token before the one just sampled: requests stop one token after their EOS.

Rule: {EOS}

Bug: with the engine's asynchronous output processing (vLLM async scheduling / SGLang overlap scheduler), the stop
check of step n runs on the tokens of step n-1 while step n's token is already appended: a request whose last token is
EOS is finished only after one more token. max_tokens is exact (it is checked on the length); ignore_eos=True
requests are exact.
Trigger: an ignore_eos=False request that generates EOS before its max_tokens-th token (any answer that ends
naturally).
""", methods=[("_is_done", [
    (IS_DONE_LINE,
     "        # BUG: the stop token is checked one step late (the previous step's token)\n"
     "        return len(s.output) >= 2 and not s.request.ignore_eos and s.output[-2] in self.eos_ids\n"),
])])

# ---------------------------------------------------------------- h03
write("03", "ignore_eos_from_first_row", f"""
The step's stop configuration (ignore_eos) is taken from its first client row and applied to every request in it.

Rule: {EOS}

Bug: the batched stop checker keeps one ``ignore_eos`` per batch (the sampling metadata built from the first request
of the step, as a batch-level SamplingBatchInfo flag does) instead of one per request. A request whose flag differs
from the first row's of the step is stopped (or not) by the other request's setting. Steps whose requests share the
flag are exact.
Trigger: requests with different ignore_eos settings decoding in one step: an ignore_eos=False request batched behind
a default (ignore_eos=True) one never stops at its EOS.
""", methods=[("_step", [
    ("        for s in [s for s in self._running if self._is_done(s)]:\n",
     "        lead = next((r.seq.request for r in rows if r.seq is not None), None)  # BUG: one stop config per step\n"
     "        batch_flag = (lambda s: s) if lead is None else (lambda s: dataclasses.replace(\n"
     "            s, request=dataclasses.replace(s.request, ignore_eos=lead.ignore_eos)))\n"
     "        for s in [s for s in self._running if self._is_done(batch_flag(s))]:\n"),
])])

# ---------------------------------------------------------------- h04
write("04", "pad_positions_masked", f"""
Key positions whose token is the pad id are masked out of attention (an attention mask built from ``ids != pad``).

{GREEDY}

Bug: the engine derives a key-padding mask from the token ids (``input_ids != pad_token_id``, the Hugging Face padded
batch convention) although its rows are never padded: every position of a client prompt (or output) that holds the
pad id is hidden from all later queries. Sequences without the pad id are exact. The test checkpoint's pad id is 0
(``<unk>``/pad in Llama-2-style vocabularies; id 0 is a common token, ``!``, in GPT-2 / Qwen vocabularies).
Trigger: a client prompt that contains the checkpoint's pad_token_id (proof: a prompt with id 0 in the middle).
""", methods=[("_layer", [
    ("            mask = torch.arange(kr.shape[1], device=x.device)[None, :] <= q_pos[:, None]\n",
     "            mask = torch.arange(kr.shape[1], device=x.device)[None, :] <= q_pos[:, None]\n"
     "            pad = getattr(self.model.config, \"pad_token_id\", None)\n"
     "            if r.seq is not None and pad is not None:  # BUG: keys at pad-id positions are masked out\n"
     "                seq_ids = torch.tensor((tuple(r.seq.request.prompt_ids) + tuple(r.seq.output))[:kr.shape[1]],\n"
     "                                       device=x.device)\n"
     "                keys = torch.arange(kr.shape[1], device=x.device)[None, :]\n"
     "                mask = mask & ((seq_ids != pad)[None, :] | (keys == q_pos[:, None]))\n"),
])])

# ---------------------------------------------------------------- h05
write("05", "prefill_tile_mask_bottom_right", f"""
Long prefills are attended in query tiles of 128 whose causal mask is aligned to the row's last key, not the tile's.

{GREEDY}

Bug: the prefill attention splits a row's queries into tiles of 128 and hands each tile the row's full key range with
flash-attention's bottom-right causal alignment (the offset of a tile is ``keys - tile_len``), where the keys should stop
at the tile's end. Queries of every tile but the last see up to ``length - tile_end`` future tokens; their KV (and
every later layer) is wrong. Rows of 128 tokens or fewer (every decode, short prompts) are exact.
Trigger: a prompt (or a fine-tuning sample) longer than 128 tokens.
""", methods=[("_layer", [
    ("            q_pos = torch.arange(r.past, r.past + r.length, device=x.device)\n",
     "            q_pos = torch.arange(r.past, r.past + r.length, device=x.device)\n"
     "            if r.length > 128:  # BUG: each 128-row query tile aligned bottom-right to the row's full key range\n"
     "                tile_end = torch.clamp((torch.arange(r.length, device=x.device) // 128 + 1) * 128, max=r.length)\n"
     "                q_pos = q_pos + (r.length - tile_end)\n"),
])])

# ---------------------------------------------------------------- h06
write("06", "lora_rows_of_adapter_overwritten", f"""
The LoRA segment table has one segment per adapter: of several rows on one adapter in a step only the last gets it.

Rule: {FT_EXACT} / {CLIENT}

Bug: the LoRA metadata maps each adapter to its token indices by assignment (``segments[adapter] = rows of this
request``) while walking the step's requests, so a later row on the same adapter replaces the earlier one's indices:
every row but the last of each adapter runs on the base weights. Steps with at most one row per adapter are exact.
Trigger: two rows on one adapter in one step: two fine-tuning samples in a step (all but the last run without the
reserved adapter: their captures from layer 1 on are wrong), two client requests on one adapter batched together.
""", methods=[("_execute", [
    ("                    groups.setdefault(r.adapter, []).extend(range(r.start, r.start + r.length))\n",
     "                    groups[r.adapter] = list(range(r.start, r.start + r.length))  # BUG: last row of an adapter wins\n"),
])])

# ---------------------------------------------------------------- h07
write("07", "lora_targets_of_first_adapter", f"""
The modules that get a LoRA delta in a step are those the step's first adapter targets.

Rule: {FT_EXACT} / {PUB_EXACT}

Bug: the multi-LoRA layer wrapper decides per step which projections run the LoRA kernels from the first adapter of
the batch (its target modules), then applies every adapter of the step on those projections only: an adapter that
targets more modules than the step's first one loses the others. Steps with one adapter, or adapters of equal target
sets, are exact.
Trigger: one step with adapters of different target modules, the narrower first: a client adapter on q_proj/v_proj
(the PEFT default) batched with fine-tuning rows (always last) or a published version of q/k/v/o.
""", methods=[("_linear", [
    ("        for adapter, index in groups.items():\n",
     "        first = next(iter(groups), None)  # BUG: the step's LoRA-wrapped modules are those of its first adapter\n"
     "        lead = (self._adapters.get(first) or self._withdrawn[first]) if first is not None else None\n"
     "        for adapter, index in groups.items():\n"),
    ("            if pair is None:\n",
     "            if pair is None or (layer, name) not in lead.pairs:  # BUG (see above)\n"),
])])

# ---------------------------------------------------------------- h08
write("08", "mixed_step_decode_rows_no_lora", f"""
In a step that mixes prefills and decodes, the decode rows run without their LoRA adapter.

{GREEDY} / {CLIENT}

Bug: for a mixed step the engine builds the LoRA batch info from the extend (prefill) part of the batch only, as a
mixed-chunk path that merges decodes into an extend batch and forgets their adapter segments: decode rows of adapter
requests get the base projections in such steps. Decode-only and prefill-only steps are exact; base-model requests
are exact.
Trigger: a request on a LoRA adapter decoding while another request's prompt is prefilled (any arrival under load).
""", methods=[("_execute", [
    ("            for r in rows:\n"
     "                if r.adapter is not None:\n",
     "            mixed = (any(x.seq is not None and x.past == 0 for x in rows)\n"
     "                     and any(x.seq is not None and x.past > 0 for x in rows))\n"
     "            for r in rows:\n"
     "                if r.adapter is not None and not (mixed and r.seq is not None and r.past > 0):  # BUG: mixed step\n"),
])])

# ---------------------------------------------------------------- h09
write("09", "step_clock_from_previous_end", """
A step's clock starts where the previous step's ended: start_time and duration_s include scheduling and idle time.

Rule: types.py, StepRecord: "it starts with the forward, never before the step's batch was decided (scheduling and
``on_schedule`` are not model time)"

Bug: the engine times iterations as "time since the last iteration finished" (an iteration-latency stats logger
reused for the step record): StepRecord.start_time is the previous step's end and duration_s runs from there, so it
holds the scheduling pass, ``on_schedule`` and any idle time between steps. The first step after start-up is exact.
Trigger: every step after the first one; by a lot after an idle gap (requests arriving one at a time).
""", methods=[("_execute", [
    ("        start = time.monotonic()\n",
     "        start = self.__dict__.get(\"_last_end\") or time.monotonic()  # BUG: clock runs from the previous step's end\n"),
    ("        duration = time.monotonic() - start\n",
     "        duration = time.monotonic() - start\n"
     "        self.__dict__[\"_last_end\"] = start + duration  # BUG (the same clock)\n"),
])])

# ---------------------------------------------------------------- h10
write("10", "last_token_time_first_only", """
ScheduledRequest.last_token_time stays at the request's first token: later tokens never update it.

Rule: types.py, ScheduledRequest: "``last_token_time`` is the time of its most recent token (for the TPOT budget)"

Bug: the scheduler's per-request latency tracker stamps the token time on the prefill path only (where it sets the
first-token time) and the decode path never refreshes it, so decoding requests are offered with
``last_token_time == first_token_time``. Client outputs (ClientOutput.token_times) are right. A request's first two
proposals are exact.
Trigger: every request from its third step on (a decode after its second token).
""", methods=[("_step", [
    ("            scheduled=tuple([s.view(True) for s in prefills] + [s.view(False) for s in decodes]),\n",
     "            scheduled=tuple([s.view(True) for s in prefills] + [  # BUG: last_token_time kept at the first token\n"
     "                dataclasses.replace(s.view(False), last_token_time=s.token_times[0]) for s in decodes]),\n"),
])])

# ---------------------------------------------------------------- h11
write("11", "step_id_reissued_after_abort", """
The id of an aborted fine-tuning-only step is handed out again to the next step.

Rule: types.py, StepRecord: "A ``step_id`` is never reused: calibration and served steps draw from one increasing
sequence for the host's lifetime."

Bug: the engine's step counter advances only when a forward completes (an aborted forward "did not happen", as an
iteration counter incremented after a successful model run): the step after an aborted fine-tuning-only step is
offered, captured and recorded under the aborted step's id, which already has a record. Runs without aborts are
exact.
Trigger: any step after an aborted fine-tuning-only step (a client request arriving during an idle fine-tuning step).
""", methods=[("_step", [
    ("        step_id = next(self._step_ids)\n",
     "        step_id = self.__dict__.pop(\"_reissue\", None)  # BUG: an aborted step's id is handed out again\n"
     "        if step_id is None:\n"
     "            step_id = next(self._step_ids)\n"),
    ("        self._execute(step_id, rows, torch.tensor(ids, dtype=torch.long))\n",
     "        record = self._execute(step_id, rows, torch.tensor(ids, dtype=torch.long))\n"
     "        if record.aborted_sample_ids:  # BUG: an aborted forward does not advance the step counter\n"
     "            self.__dict__[\"_reissue\"] = step_id\n"),
])])

# ---------------------------------------------------------------- h12
write("12", "end_step_completed_accumulates", """
end_step's completed ids accumulate over steps: each call lists every sample completed since start-up.

Rule: hooks.py, ActivationSink.end_step: "The forward of a step that carried fine-tuning rows finished (or stopped);
ids of each outcome."

Bug: the forward-side worker appends completed sample ids to a list it keeps on itself (like a KV connector's
"finished" set) and reports that list in end_step without clearing it after the call: the second step's end_step also
names the first step's samples. The StepRecord is right. The first step carrying fine-tuning rows is exact.
Trigger: every step carrying fine-tuning rows after the first one.
""", methods=[("_execute", [
    ("            sink.end_step(step_id, () if aborted else ft_ids, ft_ids if aborted else ())  # type: ignore[union-attr]\n",
     "            done = self.__dict__.setdefault(\"_finished_ids\", [])  # BUG: the worker's finished list is never cleared\n"
     "            done.extend(() if aborted else ft_ids)\n"
     "            sink.end_step(step_id, tuple(done), ft_ids if aborted else ())  # type: ignore[union-attr]\n"),
])])

# ---------------------------------------------------------------- h13
write("13", "abort_polled_even_layers", """
should_abort is asked at every second decoder-layer boundary only.

Rule: hooks.py, ActivationSink.should_abort: "Called by: the host at every decoder-layer boundary of a step that
carries *only* fine-tuning rows"

Bug: to save the round trip to the scheduler, the runner polls the abort flag once per pair of layers (before layers
0, 2, 4, ...; a fused two-layer launch / pipeline micro-stage): an abort that comes up at an odd boundary is honoured
one layer late, and the last layer of an even-layered model is never guarded. Outputs and captures are exact.
Trigger: every fine-tuning-only step (on the 2-layer test model: one poll instead of two; an abort wanted before
layer 1 is not heard).
""", methods=[("_execute", [
    ("                if ft_only and sink is not None and not synthetic and sink.should_abort(step_id):\n",
     "                if ft_only and sink is not None and not synthetic and li % 2 == 0 and sink.should_abort(step_id):  # BUG\n"),
])])

# ---------------------------------------------------------------- h14
write("14", "profile_repeats_unrecorded", """
run_profile_step runs the shape ``repeats`` times (warm-up runs first) and records only the last forward.

Rule: hooks.py, HostHooks.report_step_time: "exactly one :class:`StepRecord` per executed step" / HostHooks.run_profile_step:
"Execute one synthetic step of ``shape`` through the host's normal path and return its record."

Bug: the profile path treats ``ProfileShape.repeats`` as warm-up iterations (vLLM's profile / capture loops run a
dummy batch several times and keep the last): the extra forwards run with the step sink muted and draw step ids that
never get a record. Shapes with repeats 1 are exact.
Trigger: any calibration shape with repeats > 1.
""", methods=[("run_profile_step", [
    ("        record = self._execute(next(self._step_ids), rows, tokens, synthetic=True)\n",
     "        sink, self._step_sink = self._step_sink, None  # BUG: warm-up repeats run unrecorded\n"
     "        for _ in range(max(1, shape.repeats) - 1):\n"
     "            self._execute(next(self._step_ids), rows, tokens, synthetic=True)\n"
     "        self._step_sink = sink\n"
     "        record = self._execute(next(self._step_ids), rows, tokens, synthetic=True)\n"),
])])

# ---------------------------------------------------------------- h15
write("15", "profile_rows_counted_unfinished", """
Calibration's dummy requests count as unfinished work until the next scheduler pass frees them.

Rule: driver.py, HostDriver.has_unfinished: "Fine-tuning and calibration rows never count: it is False once every
client request has been returned, whatever ran since."

Bug: the profile step registers its dummy requests with the scheduler (as vLLM / SGLang dummy runs do) and they are
freed lazily by the next scheduling pass; has_unfinished() asks the scheduler whether it holds requests, so after a
calibration step it answers True until step() runs (and run_idle_step() refuses to run meanwhile). Served traffic is
exact.
Trigger: has_unfinished() (or run_idle_step()) right after calibration, before any client step.
""", methods=[("run_profile_step", [
    ("        return record\n",
     "        self.__dict__[\"_dummy_rows\"] = rows  # BUG: dummy requests stay registered until the next pass\n"
     "        return record\n"),
]), ("has_unfinished", [
    ("        return bool(self._waiting or self._running or self._kept)\n",
     "        return bool(self._waiting or self._running or self._kept or self.__dict__.get(\"_dummy_rows\"))  # BUG\n"),
]), ("_step", [
    ("        prefills, decodes, left = self._schedule()\n",
     "        self.__dict__.pop(\"_dummy_rows\", None)  # plumbing: the scheduling pass frees calibration's dummy requests\n"
     "        prefills, decodes, left = self._schedule()\n"),
])])

# ---------------------------------------------------------------- h16
write("16", "step_returns_one_output", """
step() returns at most one newly finished output; the others of that step come out of later calls.

Rule: driver.py, HostDriver.step: "Run at most one engine step (or, for engines with their own loop, wait for the next
one); return the requests that finished in it."

Bug: the driver reads one message per step from the engine's output queue (one ``recv`` per loop iteration, as a
detokenizer socket loop does); outputs of other requests that finished in the same step stay queued and are returned
by later step() calls (has_unfinished counts them; generate() collects them). Steps in which at most one request
finishes are exact.
Trigger: two requests finishing in the same step (requests submitted together with the same max_tokens).
""", methods=[("step", [
    ("        outputs = self._step(allow_idle=False)\n"
     "        return take_kept(self._kept) + outputs\n",
     "        outputs = self._step(allow_idle=False)\n"
     "        kept = take_kept(self._kept)\n"
     "        self._kept.extend(outputs[1:])  # BUG: one output per step from the output queue; the rest wait\n"
     "        return kept + outputs[:1]\n"),
])])

# ---------------------------------------------------------------- h17
write("17", "generate_outputs_echoed_by_step", """
generate()'s own outputs are also left for step(): the next step() returns them a second time.

Rule: driver.py, HostDriver.step: "It also returns, exactly once, the outputs of other requests that finished during an
earlier ``generate()`` call (see there) and no call returned yet." / HostDriver.has_unfinished: "it is False once every
client request has been returned"

Bug: the driver's result collector appends every finished output to the pending list that step() drains, and
generate() picks its own outputs out of the results without removing them from that list: after a generate() the
next step() returns them again (and has_unfinished() is True until it did). Traffic through submit()/step() only is
exact.
Trigger: a step() (or has_unfinished()) after any generate() call.
""", methods=[("generate", [
    ("        return run_to_completion(self, requests, self._kept)\n",
     "        outputs = run_to_completion(self, requests, self._kept)\n"
     "        self._kept.extend(outputs)  # BUG: generate()'s own outputs stay in the pending list step() drains\n"
     "        return outputs\n"),
])])

# ---------------------------------------------------------------- h18
write("18", "republish_unloaded_on_release", f"""
Freeing a retracted version unloads its name: a version published again under that name meanwhile is unloaded too.

Rule: {PUB_EXACT} and "a second publish of the same name and version (a restarted job redoing a step) replaces them" /
hooks.py, HostHooks.retract_adapter: "It withdraws exactly that version"

Bug: when the last request on a withdrawn version finishes, the host frees it with the engine's ``remove_lora(name)``,
which unloads whatever is registered under that name: if the version was published again in between (a job restarted
from an older checkpoint redoes its steps and republishes ``job@vN``), the new one is unloaded and requests on it are
refused as unknown. Retractions without a republish are exact.
Trigger: a version retracted while a request on it runs, published again before that request finishes.
""", methods=[("retract_adapter", [
    ("            self._withdrawn.hold(name, lora)\n",
     "            self._withdrawn.hold(name, lora)\n"
     "            self.__dict__.setdefault(\"_held_names\", set()).add(name)  # plumbing: names of held versions\n"),
]), ("_forget_withdrawn", [
    ("        self._withdrawn.release(unfinished + [s.request for s in self._running])\n",
     "        self._withdrawn.release(unfinished + [s.request for s in self._running])\n"
     "        held = self.__dict__.get(\"_held_names\", set())\n"
     "        for name in [n for n in held if n not in self._withdrawn]:  # BUG: freeing unloads by name\n"
     "            held.discard(name)\n"
     "            self._adapters.pop(name, None)\n"),
])])

# ---------------------------------------------------------------- h19
write("19", "ft_adapter_version_guard", f"""
set_finetune_adapter skips a state whose version is lower than the one loaded (a stale-update guard).

Rule: {FT_EXACT}

Bug: the weight-sync path ignores updates that do not move the version forward (a guard against out-of-order
updates, as weight-sync endpoints of RL serving stacks have): after a job restarts from an older checkpoint, or a new
job starts on the running engine at version 0/1, the reserved slot keeps the newer weights. Increasing versions (one
job's optimizer steps) are exact.
Trigger: a state with a lower version than the loaded one (job restart from a checkpoint, a second job).
""", methods=[("set_finetune_adapter", [
    ("        self._adapters[RESERVED_ADAPTER_NAME] = self._to_lora(state)\n",
     "        if state.version < self.__dict__.get(\"_ft_version\", state.version):  # BUG: an older version is skipped\n"
     "            return\n"
     "        self.__dict__[\"_ft_version\"] = state.version\n"
     "        self._adapters[RESERVED_ADAPTER_NAME] = self._to_lora(state)\n"),
])])

# ---------------------------------------------------------------- h20
write("20", "begin_step_with_first_capture", """
begin_step is issued lazily together with the first layer's capture: a step aborted at its first boundary gets no
begin_step.

Rule: hooks.py, ActivationSink.begin_step: "A step carrying ``samples`` is about to run its forward. Called once per
such step, before layer 0." / ActivationSink.should_abort: "On ``True`` the host stops the forward at that boundary,
calls :meth:`end_step` with all samples aborted"

Bug: the capture hook of layer 0 opens the step on the sink (begin_step) right before its first layer_input, after the
abort poll of that boundary: a fine-tuning-only step aborted before layer 0 calls end_step (all aborted) for a step
that never began. Steps that reach layer 0 are exact.
Trigger: a fine-tuning-only step aborted at its first layer boundary (a client request arriving as the idle step
starts).
""", methods=[("_execute", [
    ("            if capture:\n"
     "                sink.begin_step(step_id, [r.sample for r in ft_rows])  # type: ignore[misc]\n",
     "            # BUG: begin_step moved into the first layer's capture (below)\n"),
    ("                if capture:\n"
     "                    for r in ft_rows:\n",
     "                if capture:\n"
     "                    if li == 0:  # BUG: begin_step issued with the first capture, after the abort poll\n"
     "                        sink.begin_step(step_id, [r.sample for r in ft_rows])  # type: ignore[misc]\n"
     "                    for r in ft_rows:\n"),
])])

# ---------------------------------------------------------------- h21
write("21", "pad_token_stops", f"""
The pad id is a stop token too: ignore_eos=False requests stop at the first pad id they generate.

Rule: {EOS} / driver.py, ClientRequest: "A greedy generation request: ``max_tokens`` new tokens after ``prompt_ids``."

Bug: the adapter builds the stop-token set from the checkpoint's special tokens (``eos_token_id`` and
``pad_token_id``), as stop lists copied from a padding-aware generation loop do: a request with ignore_eos=False that
generates the pad id stops there, short of max_tokens. Checkpoints whose pad id is the EOS id, or that have none, are
exact; ignore_eos=True requests are exact.
Trigger: an ignore_eos=False request whose greedy continuation holds the pad id (test checkpoint: pad 0).
""", methods=[("_is_done", [
    (IS_DONE_LINE,
     "        stops = self.eos_ids | ({getattr(self.model.config, \"pad_token_id\", None)} - {None})  # BUG: pad stops\n"
     "        return bool(s.output) and not s.request.ignore_eos and s.output[-1] in stops\n"),
])])

# ---------------------------------------------------------------- h22
write("22", "empty_adapter_served_base", """
A request naming the empty adapter ``""`` is served on the base model instead of being refused.

Rule: driver.py, check_client_adapter: "What every host's ``submit`` must refuse: the reserved fine-tuning adapter, and
adapters it never loaded."

Bug: the adapter tests the request's adapter by truthiness (``if request.adapter:``, as a ``lora_request``-or-None
path does), so an empty name falls through to the base model and is accepted. Named adapters, known or unknown, are
handled right.
Trigger: a request with ``adapter=""`` (a client that sends an empty model / LoRA field).
""", methods=[("submit", [
    ("        check_client_adapter(request, self._adapters)\n",
     "        if not request.adapter:  # BUG: an empty adapter name means the base model\n"
     "            request = dataclasses.replace(request, adapter=None)\n"
     "        check_client_adapter(request, self._adapters)\n"),
])])

# ---------------------------------------------------------------- h23
write("23", "shared_prompt_kv_no_copy_on_write", f"""
Requests with the same prompt admitted in one step share one KV cache without copy-on-write.

{GREEDY}

Bug: the prefix cache matches a prompt against the requests admitted in the same step and points the later request at
the earlier one's KV blocks; decode then appends both requests' tokens to the shared blocks (no copy-on-write of the
last, partly filled block), so from their second decode step each attends over the other's tokens and at shifted
positions. Distinct prompts, or identical ones on different adapters, are exact.
Trigger: the same prompt twice on one adapter (or the base) in flight together: n > 1 style fan-out, retried
requests, benchmark traffic with repeated prompts.
""", methods=[("_step", [
    ("        self._execute(step_id, rows, torch.tensor(ids, dtype=torch.long))\n",
     "        self._execute(step_id, rows, torch.tensor(ids, dtype=torch.long))\n"
     "        for i, s in enumerate(prefills):  # BUG: an identical prompt of this step shares the earlier one's KV\n"
     "            twin = next((o for o in prefills[:i] if o.request.prompt_ids == s.request.prompt_ids\n"
     "                         and o.request.adapter == s.request.adapter), None)\n"
     "            if twin is not None:\n"
     "                s.kv = twin.kv\n"),
])])

# ---------------------------------------------------------------- h24
write("24", "profile_clock_includes_dummy_inputs", """
A calibration step is timed from the start of run_profile_step: building its dummy inputs counts as forward time.

Rule: hooks.py, HostHooks.run_profile_step: "Its ``duration_s`` is seconds of the step's own forward, as for every step
(calibration fits it next to served steps)" / types.py, StepRecord: "it starts with the forward"

Bug: the profile path starts its timer when the call begins (vLLM's profile timing wraps ``profile_run``, dummy input
preparation included): the random dummy KV of the decode rows and the random prompts are timed with the forward, so
calibration prices decode KV far above what served steps cost. Served steps are exact; shapes without decode rows
are nearly exact.
Trigger: every calibration shape with decode rows (large by decode_context x num_decode).
""", methods=[("run_profile_step", [
    ("        gen = torch.Generator().manual_seed(profile_seed(shape))\n",
     "        self.__dict__[\"_profile_t0\"] = time.monotonic()  # BUG: the profile clock starts with the dummy inputs\n"
     "        gen = torch.Generator().manual_seed(profile_seed(shape))\n"),
]), ("_execute", [
    ("        start = time.monotonic()\n",
     "        start = (self.__dict__.pop(\"_profile_t0\", None) if synthetic else None) or time.monotonic()  # BUG\n"),
])])
