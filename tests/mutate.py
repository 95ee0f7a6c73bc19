#!/usr/bin/env python3
"""tests/mutate.py: make mutate, the tests' own test.

Each mutant below is a realistic bug, seeded by replacing one exact piece of
the source. For each one, a scratch copy of the working tree (under
build/mutate, with the CPU build's objects, so only the mutated file is
compiled again) gets that one change, and the tests run on it: first the ones
the mutant names as its catcher (a suite, or a suite's tests matching a
pattern: a few seconds, where the whole of `make CUDA=0 test` takes minutes),
then, if those pass, `make CUDA=0 test` in full. A mutant the tests fail on is
caught; one they all pass survives, and a survivor is a class of bug the tests
cannot see. A mutant only the full run catches is caught, and its line says
that its catcher needs mending. The script prints one line per mutant, then the
survivors, and exits 1 if any survived (2 if a mutant no longer applies: its
text is not in the source exactly once, so the list needs mending).

    tests/mutate.py            every mutant
    tests/mutate.py NAME ...   only these
"""

import os
import shutil
import subprocess
import sys
import time

# name, the class of bug, the tests that catch it (a suite, or SUITE/PATTERN: its
# tests whose names match, as Criterion's --filter), then its edits, one or
# more of: the file, the exact text, its replacement
MUTANTS = [
    ("sum-order-reversed", "the order of every sum: ranks added N-1 .. 0",
     "test_collectives",
     "runtime/device_cpu.c",
     "memcpy(acc, (const float *)a->in[0] + c0, m * sizeof(float));\n    for (int q = 1; q < a->n; q++) {\n"
     "        const float *src = (const float *)a->in[q] + c0;",
     "memcpy(acc, (const float *)a->in[a->n - 1] + c0, m * sizeof(float));\n    for (int q = 1; q < a->n; q++) {\n"
     "        const float *src = (const float *)a->in[a->n - 1 - q] + c0;"),
    ("adam-no-bias-correction", "the optimizer: the first moment's bias correction dropped",
     "test_kernels",
     "kernels/cpu/optimizer.c",
     "float step_size = hp.lr / bias_correction1;",
     "float step_size = hp.lr + 0.0f * bias_correction1;"),
    ("decay-on-every-tensor", "the optimizer: weight decay on the 1-D norm weights too",
     "test_torch",
     "model/optim.h",
     "return t->ndim == 2;",
     "return t->ndim >= 1;"),
    ("warmup-off-by-one", "the learning-rate schedule: warmup one step late",
     "test_train",
     "model/optim.c",
     "return s->lr * (float)(iter + 1) / (float)(s->warmup_iters + 1);",
     "return s->lr * (float)iter / (float)(s->warmup_iters + 1);"),
    ("adam-state-swapped", "checkpoints: m and v swapped on the way out and back in (a round trip hides it)",
     "test_torch",
     "strategies/ranks.c",
     "what == STATE_EXP_AVG ? ranks->m : ranks->v;",
     "what == STATE_EXP_AVG ? ranks->v : ranks->m;"),
    ("adam-parts-permuted", "checkpoints: ZeRO-1's Adam parts written and read in reverse rank order",
     "test_checkpoint",
     "strategies/ranks.c",
     "start = s * held_length(ranks, how);",
     "start = (S - 1 - s) * held_length(ranks, how);"),
    ("ddp-one-bucket", "overlap silently off: DDP all-reduces one bucket after the whole backward",
     "test_trace",
     "strategies/buckets.c",
     "if (t > 0 && (!overlap || bytes < target || tensor->unit == 0)) continue;",
     "if (t > 0 && (overlap || bytes < target || tensor->unit == 0)) continue;"),
    ("ddp-unit-buckets", "DDP's buckets closed only where a unit begins, not at each tensor as PyTorch's",
     "test_strategies/ddp_buckets_*",
     "strategies/buckets.c",
     "bytes < target || tensor->unit == 0)) continue;",
     "bytes < target || tensor->unit == 0 || tensor->offset != layout->units[tensor->unit].offset)) continue;"),
    ("ddp-bucket-per-tensor", "DDP's plan: past the first bucket, one bucket for every tensor, whatever its size",
     "test_strategies/ddp_buckets_*",
     "strategies/buckets.c",
     "(!overlap || bytes < target || tensor->unit == 0)",
     "(!overlap || (bytes < target && nbuckets == 0) || tensor->unit == 0)"),
    ("zero3-no-prefetch", "overlap silently off: ZeRO-3 gathers no unit ahead",
     "test_trace",
     "strategies/sharded.c",
     "for (int next = unit + 1; ranks->base.cfg.overlap.enabled && next",
     "for (int next = unit + 1; ranks->base.cfg.overlap.enabled < 0 && next",
     "strategies/sharded.c",
     "for (int below = unit - 1; ranks->base.cfg.overlap.enabled && below",
     "for (int below = unit - 1; ranks->base.cfg.overlap.enabled < 0 && below"),
    ("reduce-scatter-awaited-at-once", "overlap silently off: ZeRO-2/3's compute waits for each reduce-scatter at once",
     "test_trace",
     "strategies/sharded.c",
     "into,\n                      done_events(d, slot));",
     "into,\n                      NULL);"),
    ("bf16-reduce-scatter-awaited-at-once",
     "overlap silently off for gradients held in bf16: their reduce-scatters awaited at once",
     "test_trace",
     "strategies/sharded.c",
     "scale, into, done_events(d, slot));",
     "scale, into, NULL);"),
    ("slot-reused-too-soon", "a missing event wait: a gradient slot zeroed while its reduce-scatter reads it",
     "test_strategies/overlap_*",
     "strategies/sharded.c",
     "if (d->ranks.base.cfg.overlap.enabled) ranks_wait_all(ref->ranks, ref->rank, slot->done);",
     "(void)slot->done;"),
    ("ranks-left-to-the-os", "ranks timed over a modeled link left to the OS: one races ahead of the others",
     "test_runtime",
     "runtime/process_group_simulator.c",
     "slot = own_cores && sharing == nranks ? r : -1;",
     "slot = own_cores && sharing < nranks ? r : -1;"),
    ("ddp-step-before-reduce", "a missing event wait: AdamW reads the buckets before their all-reduces end",
     "test_strategies/overlap_*",
     "strategies/replicated.c",
     "for (int i = 0; i < d->nbuckets; i++) ranks_wait_all(ref->ranks, ref->rank, d->bucket[i].done);",
     "for (int i = 0; i < 0; i++) ranks_wait_all(ref->ranks, ref->rank, d->bucket[i].done);"),
    ("gather-not-awaited", "a missing event wait: ZeRO-3 computes with a unit before its gather ends",
     "test_strategies/overlap_*",
     "strategies/sharded.c",
     "stream_wait_event(d->ranks.pg->compute[ref->rank], b->done[ref->rank]);",
     "(void)b;"),
    ("link-model-regathers-every-unit", "the registry's cost model: ZeRO-3 charged a backward gather for every unit",
     "test_trace",
     "strategies/strategy.c",
     "int gathers = u == 0 || u == layout.nunits - 1 ? 1 : 2;",
     "int gathers = 2;"),
    ("fault-on-every-step", "the injection module: --inject-fault strikes its rank at every step up to its own",
     "test_faults",
     "runtime/inject.c",
     "fault->rank == rank && fault->step == step;",
     "fault->rank == rank && fault->step >= step;"),
    ("gather-state-ignored", "a gather buffer's state unread: ZeRO-3 keeps last step's weights gathered after AdamW",
     "test_files",
     "strategies/sharded.c",
     "return b->state[0] != BUFFER_EMPTY && b->unit == unit;",
     "return b->unit == unit;"),
    ("simulator-waits-own-rank", "a missing event wait: the simulator waits for its own rank only, as NCCL may",
     "test_collectives",
     "runtime/process_group_order.c",
     "static int first_peer(const ProcessGroup *pg, int r) { return pg->simulated ? 0 : r; }",
     "static int first_peer(const ProcessGroup *pg, int r) { return pg->simulated * 0 + r; }",
     "runtime/process_group_order.c",
     "static int end_peer(const ProcessGroup *pg, int r) { return pg->simulated ? pg->nranks : r + 1; }",
     "static int end_peer(const ProcessGroup *pg, int r) { return pg->simulated * 0 + r + 1; }"),
    ("accumulate-wrong-shard", "a wrong shard offset: micro-steps after the first add rank 0's shard",
     "test_collectives",
     "runtime/process_group_order.c",
     "void *const *reduced = into == REDUCE_ADD ? own : recv;",
     "void *const *reduced = into == REDUCE_ADD ? send : recv;"),
    ("staged-shard-of-rank-0", "past one process: every local rank sums the first local rank's shard from the "
     "other processes",
     "test_multiprocess",
     "runtime/process_group_simulator.c",
     ": exchange_received(pg, held, q, stride, (size_t)r * shard);",
     ": exchange_received(pg, held, q, stride, 0);"),
    ("attention-output-not-rescaled", "the online softmax: the output kept so far not rescaled when a key block "
     "raises the row's max",
     "test_kernels",
     "kernels/cpu/attention.c",
     "        for (int c = 0; c < hs; c++) y[c] *= rescale;",
     "        for (int c = 0; c < hs; c++) y[c] *= 1.0f;"),
    ("save-check-skips-v", "the non-finite check before a save skips Adam's v (the reader then refuses the file)",
     "test_checkpoint",
     "strategies/ranks.c",
     "            nbufs = 3;",
     "            nbufs = 2;"),
    ("shape-rank-loose", "the checkpoint reader: a tensor with more dimensions than asked ([16, 1] for [16]) "
     "accepted",
     "test_files/a_tensor_of_another_shape_*",
     "model/safetensors.c",
     "    int same = entry->ndim == ndim;",
     "    int same = entry->ndim >= ndim;"),
    ("header-float-offsets", "the safetensors reader: 8.0 or 8e0 taken for the whole number 8, which the "
     "reference refuses",
     "test_safetensors",
     "model/safetensors.c",
     "    if (!json_is_integer(x) || json_integer_value(x) < 0) return 0;\n    *out = json_integer_value(x);",
     "    if (!json_is_number(x) || json_number_value(x) < 0) return 0;\n    *out = (json_int_t)json_number_value(x);"),
    ("flags-hash-skips-first", "processes compare their flags but the first: two learning rates pass",
     "test_flags",
     "tools/options.c",
     "        hashes[i] = strcmp(f->name, \"node-rank\") == 0 ? 0 :",
     "        hashes[i] = i == 0 || strcmp(f->name, \"node-rank\") == 0 ? 0 :"),
    ("data-hash-prefix", "processes compare only the first 4096 bytes of each split's tokens",
     "test_multiprocess/processes_that_disagree_*",
     "tools/train.c",
     "            h = options_hash(h, ids, bytes);",
     "            h = options_hash(h, ids, bytes < 4096 ? bytes : 4096);"),
    ("start-verdicts-unshared", "a process that fails a check of the start alone: the others never learn it",
     "test_multiprocess",
     "tools/train.c",
     "        if (first < 0 && all[p].status) first = p;",
     "        if (first < 0 && all[p].status && p == w->proc) first = p;"),
    ("stop-signal-unshared", "past one process, a stop signal obeyed only by the process it reached",
     "test_multiprocess",
     "training/trainer.c",
     "    int sig = world_first_nonzero(*cfg->stop_signal, &result->stopped_in, \"the stop signals\");",
     "    int sig = *cfg->stop_signal;"),
    ("eval-deaf-to-signals", "a stop signal waits for the end of an evaluation, however long",
     "test_faults",
     "training/trainer.c",
     "    for (; i < eval_iters && !stop_requested(cfg, result); i++) {",
     "    for (; i < eval_iters && (cfg || result || 1); i++) {"),
    ("sigpipe-kills", "SIGPIPE left to its default: a reader gone kills the run without a line",
     "test_faults",
     "tools/train.c",
     "    int rc = sigaction(SIGPIPE, &ignore, NULL) != 0 ? errno : 0;",
     "    int rc = 0 * sizeof ignore;"),
    ("same-file-by-name", "an output compared with the other paths by name only: a link or a hard link overwrites",
     "test_files",
     "tools/run_files.c",
     "    if (stat(path, &st) == 0) {",
     "    if (0 && stat(path, &st) == 0) {"),
    ("fresh-run-replaces", "a fresh run replaces the checkpoint already in --out at its first save",
     "test_files",
     "tools/run_files.c",
     "if (!o->out[0] || o->overwrite || stat(ckpt, &st) != 0) return 0;",
     "if (!o->out[0] || o->overwrite || stat(ckpt, &st) == 0) return 0;"),
    ("fifo-log-waits", "a FIFO with no reader as --log: its open waits forever",
     "test_files",
     "tools/run_files.c",
     "O_WRONLY | O_CREAT | O_TRUNC | O_NONBLOCK | O_CLOEXEC",
     "O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC"),
    ("machine-memory-unchecked", "the CPU's allocations not held to the machine's free memory (the OOM killer's "
     "work instead of a line)",
     "test_memory",
     "runtime/device.c",
     "int beyond_machine = !capped && dev->kind == DEVICE_CPU && host_memory_take(bytes) != 0;",
     "int beyond_machine = !capped && dev->kind == DEVICE_CPU && 0 * host_memory_take(0) != 0;"),
    ("data-size-unchecked", "a data file read whole however big",
     "test_memory",
     "model/data.c",
     "host_memory_take(need) != 0",
     "host_memory_take(0) != 0"),
    ("world-abort-exits", "world_abort leaving through exit(): the libraries' teardown under other threads' calls",
     "test_runtime",
     "runtime/world_mpi.c",
     "    if (joined && !finalized) MPI_Abort(MPI_COMM_WORLD, status);\n    _exit(status);",
     "    if (joined && !finalized) MPI_Abort(MPI_COMM_WORLD, status);\n    exit(status);"),
    ("units-aligned-to-64-bytes", "units aligned to 64 bytes, not to the 256 of a fresh GPU buffer",
     "test_runtime",
     "runtime/arena.h",
     "ARENA_ALIGN = 64 };",
     "ARENA_ALIGN = 16 };"),
    ("zero2-scale-dropped", "a dropped scale: ZeRO-2/3's reduce-scatter sums instead of averaging",
     "test_strategies/every_stage_*",
     "strategies/sharded.c",
     "float scale = 1.0f / (float)ranks->nranks;",
     "float scale = 1.0f;"),
    ("bpe-rightmost-first", "merges of one rank taken right to left ('aaa' as a + aa, not aa + a)",
     "test_tokenizer",
     "model/tokenizer.c",
     "(a.rank == b.rank && a.at < b.at)",
     "(a.rank == b.rank && a.at > b.at)"),
    ("pieces-ascii-classes", "the pre-tokenizer's classes in ASCII only: Unicode white space taken for symbols",
     "test_tokenizer",
     "model/tokenizer.c",
     "PCRE2_UTF | PCRE2_UCP",
     "PCRE2_UTF"),
    ("prepare-splits-bytes", "bin/prepare's split at 90% of the bytes, not of the characters",
     "test_tokenizer",
     "tools/prepare.c",
     "chars += (text[i] & 0xC0) != 0x80;",
     "chars += 1;"),
    ("token-id-at-vocab-accepted", "an id equal to the vocabulary's size read as a token (one past the embedding)",
     "test_tokenizer",
     "model/data.c",
     "if (id >= (uint32_t)d->vocab) {",
     "if (id > (uint32_t)d->vocab) {"),
    ("bias-grad-unannounced", "a bias's gradient never said complete: DDP's bucket of it waits or goes early",
     "test_strategies/every_unit_policy_*",
     "model/gpt.c",
     "    if (m->base.cfg.bias) model_grad_done(&m->base, t + 1);\n",
     ""),
    ("bias-grad-dropped", "a bias's gradient left out (every block bias's: the Linears' and the norms')",
     "test_model",
     "model/gpt.c",
     "bias_backward(m->base.stream, made_grad(m, t, (size_t)OC), dout, (int)N, OC);",
     "bias_backward(m->base.stream, made_grad(m, t, (size_t)OC), dout, 0 * (int)N, OC);"),
    ("classifier-ragged-chunk-dropped", "the classifier's backward skips the last chunk when it is short",
     "test_model",
     "model/gpt.c",
     "    for (size_t r0 = 0; r0 < BT; r0 += (size_t)m->classifier_rows)\n        classifier_chunk(m, head, r0, BT, dhead,",
     "    for (size_t r0 = 0; r0 + (size_t)m->classifier_rows <= BT; r0 += (size_t)m->classifier_rows)\n        classifier_chunk(m, head, r0, BT, dhead,"),
    ("gelu-tanh-cubic", "GELU's tanh form with another cubic coefficient (0.04 for 0.044715)",
     "test_kernels",
     "kernels/cpu/elementwise.c",
     "GELU_TANH_SCALE = 0.7978845608028654f, GELU_TANH_CUBIC = 0.044715f;",
     "GELU_TANH_SCALE = 0.7978845608028654f, GELU_TANH_CUBIC = 0.04f;"),
    ("gelu-form-ignored-backward", "the backward runs the exact GELU's derivative under a tanh-form model",
     "test_model",
     "model/gpt.c",
     "gelu_backward(s, a->dfch, b.fch, a->dfch, BT * 4 * C, m->base.cfg.gelu_tanh);",
     "gelu_backward(s, a->dfch, b.fch, a->dfch, BT * 4 * C, 0);"),
    ("gelu-form-not-saved", "a checkpoint's config says nothing of the GELU: a tanh model resumes as an exact one",
     "test_checkpoint",
     "training/checkpoint_file.c",
     "info->model.gelu_tanh ? \"tanh\" : \"erf\");",
     "\"erf\");"),
    ("conv1d-proj-untransposed", "the attention's output projection taken as [out, in] (square: no shape says so)",
     "test_hf",
     "model/hf_gpt2.c",
     "static const char *const parts[] = { \".attn.c_attn.weight\", \".attn.c_proj.weight\", \".mlp.c_fc.weight\",",
     "static const char *const parts[] = { \".attn.c_attn.weight\", \".attn.c_attn.weight\", \".mlp.c_fc.weight\","),
    ("mask-buffers-refused", "an older Hugging Face file's attn.bias buffers taken for strangers",
     "test_hf",
     "model/hf_gpt2.c",
     "    return strcmp(name + end, \"bias\") == 0 || strcmp(name + end, \"masked_bias\") == 0;",
     "    return strcmp(name + end, \"masked_bias\") == 0;"),
    ("hf-block-not-cropped", "a Hugging Face start's --block ignored: the run takes all of n_positions",
     "test_hf",
     "tools/options.c",
     "    if (!options_given(argc, argv, \"block\")) o->block = hf->block_size;",
     "    o->block = hf->block_size;"),
    ("padding-sampled", "generation draws from the model's whole vocabulary, the padding's ids too",
     "test_model",
     "model/sample.c",
     "int V = m->base.cfg.vocab, drawn = how.vocab > 0 && how.vocab < V ? how.vocab : V;",
     "int V = m->base.cfg.vocab, drawn = V;"),
    ("top-k-one-more", "top-k keeps k + 1 ids (the floor one place too far down the sorted logits)",
     "test_model",
     "model/sample.c",
     "floor = sorted[how.top_k - 1];",
     "floor = sorted[how.top_k];"),
    ("init-pair-shifted", "each rank's own init: a part starting at an odd element takes its Box-Muller pair "
     "from that element on, not from the pair's first",
     "test_multiprocess/an_odd_width_*",
     "model/model.c",
     "for (size_t i = first / 2 * 2; i < end; i += 2) {",
     "for (size_t i = first; i < end; i += 2) {"),
    ("generate-follower-short", "generation under ZeRO-3: the ranks but rank 0 skip the last unit's hook",
     "test_strategies/every_stage_evaluates_*",
     "strategies/ranks.c",
     "for (int u = 0; u < m->layout.nunits; u++) model_before_forward(m, u);",
     "for (int u = 0; u + 1 < m->layout.nunits; u++) model_before_forward(m, u);"),
    ("stream-load-one-short", "a streamed load: the last tensor of each state left as it was",
     "test_checkpoint",
     "training/checkpoint.c",
     "        for (int i = 0; i < layout.ntensors; i++) {\n            if (root && read_rc == 0)",
     "        for (int i = 0; i + 1 < layout.ntensors; i++) {\n            if (root && read_rc == 0)"),
    ("gather-parts-reversed", "a tensor's parts from the processes placed in reverse process order",
     "test_multiprocess/a_checkpoint_moves_*",
     "strategies/ranks.c",
     "size_t from, n = process_part(ranks, how, p, t, reading, &from);\n        at[p]",
     "size_t from, n = process_part(ranks, how, world()->nprocs - 1 - p, t, reading, &from);\n        at[p]"),
    ("bf16-truncates", "bf16's rounding: the low half cut off, not rounded to nearest even",
     "test_torch",
     "runtime/bf16.h",
     "return (bf16)((bits + to_even) >> 16);",
     "return (bf16)((bits + 0 * to_even) >> 16);"),
    ("bf16-ties-away", "bf16's rounding: ties away from zero, not to even",
     "test_torch",
     "runtime/bf16.h",
     "uint32_t to_even = 0x7FFFu + ((bits >> 16) & 1u);",
     "uint32_t to_even = 0x8000u;"),
    ("mixed-precision-no-master", "mixed precision's state: the fp32 master weights left out of K",
     "test_strategies/mixed_precision_*",
     "strategies/strategy.c",
     "double optimizer = mixed ? 12.0 : 8.0;",
     "double optimizer = 8.0;"),
    ("bf16-grad-unrounded", "mixed precision: a Linear's weight gradient added in fp32, not made in bf16 first",
     "test_torch",
     "model/gpt.c",
     "    round_to_bf16(m->base.stream, m->acts.dweight_bf16, m->acts.dweight_bf16, n);\n",
     ""),
    ("bf16-residual-unrounded", "mixed precision: the residual stream kept in fp32 after attention's add, not bf16",
     "test_strategies/recompute_*",
     "model/gpt.c",
     "    bf16_values(m, b.resid2, BT * C);\n",
     ""),
    ("bf16-embedding-grads-unrounded", "mixed precision: the embeddings' gradients added in fp32, not made in bf16 "
     "first",
     "test_torch",
     "model/gpt.c",
     "        round_to_bf16(s, made.wte, made.wte, both);\n",
     ""),
    ("bf16-weights-unrounded", "mixed precision: the compute copy not rounded, the fp32 master's values read",
     "test_torch",
     "model/gpt.c",
     "    else round_to_bf16(m->base.stream, unit_copy(m, unit), m->base.unit_weights[unit], used);",
     "    else stream_copy(m->base.stream, unit_copy(m, unit), m->base.unit_weights[unit], used * sizeof(float));"),
    ("store-bf16-drops-a-bit", "mixed precision: the bf16 copy stored with its last bit cleared, not rounded as read",
     "test_torch",
     "kernels/cpu/precision.c",
     "a->out[i] = bf16_from_float(a->in[i]);",
     "a->out[i] = (bf16)(bf16_from_float(a->in[i]) & 0xFFFEu);"),
    ("zero3-link-gathers-fp32", "the link model charges ZeRO-3's gathers fp32's bytes under --dtype=bf16",
     "test_trace",
     "strategies/strategy.c",
     "g++)\n            cost = link_cost_add(cost, gather(cfg, layout.units[u].size, cfg->precision));",
     "g++)\n            cost = link_cost_add(cost, gather(cfg, layout.units[u].size, PRECISION_FP32));"),
    ("zero2-link-gathers-fp32", "the link model charges ZeRO-2's gathers of its bf16 copy fp32's bytes",
     "test_trace",
     "strategies/strategy.c",
     "size));\n        cost = link_cost_add(cost, gather(cfg, layout.units[u].size, cfg->precision));",
     "size));\n        cost = link_cost_add(cost, gather(cfg, layout.units[u].size, PRECISION_FP32));"),
    ("bf16-copy-not-refreshed", "mixed precision: ZeRO-2/3's bf16 copy left as it was after AdamW updates the master",
     "test_strategies/*bf16*",
     "strategies/sharded.c",
     "for (int r = 0; d->copy_bf16 && r < ranks->local; r++) {",
     "for (int r = 0; 0 && d->copy_bf16 && r < ranks->local; r++) {"),
    ("replicated-bf16-copy-not-refreshed", "mixed precision: DDP's and ZeRO-1's bf16 copy left as it was after AdamW",
     "test_strategies/*bf16*",
     "strategies/replicated.c",
     "for (int r = 0; d->copy_bf16 && r < ranks->local; r++) {",
     "for (int r = 0; 0 && d->copy_bf16 && r < ranks->local; r++) {"),
    ("zero1-link-gathers-fp32", "the link model charges ZeRO-1's gather of its bf16 copy fp32's bytes",
     "test_trace",
     "strategies/strategy.c",
     "gather(cfg, layout.total, cfg->precision)",
     "gather(cfg, layout.total, PRECISION_FP32)"),
    ("bf16-copy-stale-after-load", "mixed precision: weights written into the master mid-run, the bf16 copy not made anew",
     "test_strategies/weights_written_*",
     "strategies/ranks.c",
     "if (what == STATE_WEIGHTS && ranks->refresh_copy) ranks->copy_stale = 1;",
     "if (0 && what == STATE_WEIGHTS && ranks->refresh_copy) ranks->copy_stale = 1;"),
    ("bf16-master-counted-as-weights", "memory: ZeRO-2/3's fp32 master shards counted as weights, not with m and v",
     "test_strategies/mixed_precision_*",
     "strategies/sharded.c",
     "(Buffer){ &d->weight_shard[r], NULL, MEM_OPTIMIZER, d->part };  /* the master */",
     "(Buffer){ &d->weight_shard[r], NULL, MEM_WEIGHTS, d->part };  /* the master */"),
    ("exchange-bf16-off-by-one", "between processes: numbers held in bf16 read one number late from each peer",
     "test_multiprocess",
     "runtime/process_group_exchange.c",
     "(size_t)(g % L) * stride + offset);",
     "(size_t)(g % L) * stride + offset + (held == PRECISION_BF16));"),
    ("gather-bf16-copies", "an all-gather in bf16 copies its shards as they are, unrounded",
     "test_collectives",
     "runtime/process_group.c",
     "    if (dtype == PRECISION_FP32 || held == PRECISION_BF16) {",
     "    if (1) {"),
    ("dtype-ignored", "mixed precision: --dtype=bf16 parsed and then ignored, every run fp32",
     "test_train",
     "tools/options.c",
     "Precision options_precision(const TrainOptions *o) { return (Precision)precision_parse(o->dtype); }",
     "Precision options_precision(const TrainOptions *o) { return (Precision)(0 * precision_parse(o->dtype)); }"),
    ("reduce-bf16-partials-unrounded", "a reduction in bf16: the partial sums kept in fp32, rounded only at the end",
     "test_collectives",
     "runtime/device_cpu.c",
     "acc[i] = bf16_rounded(acc[i] + x);",
     "acc[i] = acc[i] + x;"),
    ("openmp-spins-left-to-libgomp", "start-up: OpenMP's idle threads left spinning as libgomp's default",
     "test_train",
     "kernels/cpu/cpu_setup.c",
     "return wait_policy || spin_count ? NULL : OPENMP_SPINS;",
     "return wait_policy || spin_count || 1 ? NULL : OPENMP_SPINS;"),
    ("cpu-setup-never-restarts", "start-up: the spin count chosen but never set (the program not restarted)",
     "test_train",
     "kernels/cpu/cpu_setup.c",
     "if (!restarted && (better || spins)) restart(argv, core, better, spins);",
     "if (!restarted && (better || spins) && restarted) restart(argv, core, better, spins);"),
    ("reduce-dtype-ignored", "--reduce-dtype=bf16 taken by ZeRO-1/2/3's reduce-scatters but not by DDP's all-reduce",
     "test_strategies/*reduced_in_bf16",
     "strategies/replicated.c",
     "pg_all_reduce(ranks->pg, name, grads, b->length, scale, ranks->base.cfg.reduce_precision, done);",
     "pg_all_reduce(ranks->pg, name, grads, b->length, scale, PRECISION_FP32, done);"),
    ("reduce-bf16-skipped-on-one-rank", "a reduction in bf16 on one rank skipped as an fp32 one is, so nothing rounds",
     "test_collectives",
     "runtime/process_group_order.c",
     "int rounds = dtype == PRECISION_BF16 && held == PRECISION_FP32;",
     "int rounds = dtype == PRECISION_BF16 && held == PRECISION_FP32 && 0;"),
    ("wire-bf16-truncated", "a reduction in bf16 between processes: the sender cuts each number to 16 bits, not rounds",
     "test_multiprocess",
     "runtime/process_group_exchange.c",
     "bf16 h = from + i < n ? bf16_from_float(src[from + i]) : 0;",
     "bf16 h = from + i < n ? (bf16)(bf16_from_float(src[from + i]) & 0xFFFEu) : 0;"),
    ("hybrid-chain-free", "the link model: hybrid sharding's chain between the groups costs nothing",
     "test_runtime",
     "runtime/link_model.c",
     "    if (G == 1 || t.gbps <= 0) return (LinkCost){ 0.0, 0.0 };",
     "    if (G >= 1 || t.gbps <= 0) return (LinkCost){ 0.0, 0.0 };"),
    ("hybrid-norm-over-world", "hybrid sharding: clipping's norm gathers a partial from every rank, not every shard",
     "test_strategies/hybrid_*",
     "strategies/ranks.c",
     "own_part, ranks->norm_parts, (size_t)ranks->shards,",
     "own_part, ranks->norm_parts, (size_t)ranks->nranks,"),
    ("link-inter-ignored", "the modeled link: --link-inter parsed, the process group never given its second tier",
     "test_trace",
     "strategies/ranks.c",
     "    pg_set_link_inter(ranks->pg, cfg->link_inter, strategy_link_shape(cfg).node_ranks);\n",
     ""),
    ("exchange-hybrid-shard-by-rank", "hybrid sharding between processes: each rank sent the shard of its global rank",
     "test_multiprocess",
     "runtime/process_group_exchange.c",
     "size_t from = (size_t)pg_shard_of(pg, p * pg->nranks + j) * x->shard;",
     "size_t from = (size_t)(p * pg->nranks + j) % (size_t)pg->world_size * x->shard;"),
    ("link-bf16-full-bytes", "the modeled link: a ring's numbers in bf16 charged 4 bytes each",
     "test_trace",
     "runtime/link_model.c",
     "double N = nranks, bytes = (double)n * (double)number_bytes(dtype);",
     "double N = nranks, bytes = (double)n * (double)number_bytes(dtype == PRECISION_BF16 ? PRECISION_FP32 : dtype);"),
    ("estimate-one-buffer", "the memory estimate: one unit buffer of each kind, whatever --max-live-units",
     "test_memory",
     "strategies/strategy.c",
     "int pool = cfg->overlap.enabled ? strategy_live_units(cfg) : 1;",
     "int pool = 1;"),
    ("add-bf16-drops-the-gradient", "gradients held in bf16: add_bf16 stores the part alone, not the gradient plus it",
     "test_kernels",
     "kernels/cpu/precision.c",
     "a->acc[i] = bf16_from_float(float_from_bf16(a->acc[i]) + a->x[i]);",
     "a->acc[i] = bf16_from_float(a->x[i]);"),
    ("bf16-numbers-read-truncated", "numbers held in bf16 read with their low mantissa bits dropped",
     "test_kernels",
     "runtime/bf16.h",
     "return held == PRECISION_BF16 ? float_from_bf16(((const bf16 *)x)[i]) : ((const float *)x)[i];",
     "return held == PRECISION_BF16 ? float_from_bf16(((const bf16 *)x)[i] & 0xFFF0) : ((const float *)x)[i];"),
    ("bf16-grads-not-zeroed", "gradients held in bf16: DDP's and ZeRO-1's arena not zeroed before a step",
     "test_strategies",
     "strategies/replicated.c",
     "if (m->grads_bf16) fill_zero_bf16(m->stream, m->grads_bf16, m->layout.total);",
     "if (m->grads_bf16) return;"),
    ("bf16-slot-not-zeroed", "gradients held in bf16: ZeRO-2/3's gradient slot not zeroed before a unit's backward",
     "test_strategies",
     "strategies/sharded.c",
     "if (slot->rank_bf16[ref->rank]) fill_zero_bf16(m->stream, slot->rank_bf16[ref->rank], m->layout.units[unit].size);",
     "if (slot->rank_bf16[ref->rank]) (void)unit;"),
    ("bf16-grad-added-at-the-units-start", "gradients held in bf16: every tensor's added at its unit's first number",
     "test_strategies",
     "model/gpt.c",
     "add_bf16(s, held + model_tensor_offset(&m->base, t), made, n);",
     "add_bf16(s, held, made, n);"),
    ("grads-held-fp32-always", "mixed precision reduced in bf16, the gradients still held in fp32",
     "test_strategies/mixed_precision_*",
     "strategies/strategy.c",
     "int both = cfg->precision == PRECISION_BF16 && cfg->reduce_precision == PRECISION_BF16;",
     "int both = 0 && cfg->precision == PRECISION_BF16 && cfg->reduce_precision == PRECISION_BF16;"),
    ("estimate-bf16-grads-as-fp32", "the memory estimate counts gradients held in bf16 at 4 bytes",
     "test_strategies/mixed_precision_*",
     "strategies/strategy.c",
     "double grads = strategy_grads_held(cfg) == PRECISION_BF16 ? 0.5 : 1.0;",
     "double grads = 1.0;"),
    ("nan-injected-as-fp32-bytes", "a NaN injected into a bf16 gradient as the first 2 bytes of an fp32 NaN",
     "test_train",
     "strategies/ranks.c",
     "const void *nan_value = held == PRECISION_BF16 ? (const void *)&nan_bf16 : (const void *)&nan_fp32;",
     "const void *nan_value = held == PRECISION_BF16 && 0 ? (const void *)&nan_bf16 : (const void *)&nan_fp32;"),
    ("kept-bf16-block-0-for-every-block", "bf16 activations: every block's kept internals stored and loaded at block 0's",
     "test_strategies/recompute_*",
     "model/gpt.c",
     "bf16 *kept = (bf16 *)m->acts.kept_storage + (size_t)l * KEPT_WIDTH * BT * C;",
     "bf16 *kept = (bf16 *)m->acts.kept_storage + 0 * (size_t)l * KEPT_WIDTH * BT * C;"),
    ("kept-bf16-not-loaded", "bf16 activations: a block's backward reads the last block's internals, its own not loaded",
     "test_strategies/recompute_*",
     "model/gpt.c",
     "        if (keeps_bf16(compute_of(m))) keep_block(m, l, 1);",
     "        if (0 && keeps_bf16(compute_of(m))) keep_block(m, l, 1);"),
    ("link-clock-at-the-worker", "the modeled link's clock starts when the stream's worker gets there, late or not",
     "test_runtime",
     "runtime/device_cpu.c",
     "s->link_start_ns = latest(a->enqueued_ns, latest(s->link_free_ns, s->inputs_ready_ns));",
     "s->link_start_ns = now_ns();"),
    ("link-clock-ignores-the-inputs", "the modeled link's clock starts before the inputs it waited for were ready",
     "test_runtime",
     "runtime/device_cpu.c",
     "s->link_start_ns = latest(a->enqueued_ns, latest(s->link_free_ns, s->inputs_ready_ns));",
     "s->link_start_ns = latest(a->enqueued_ns, s->link_free_ns);"),
    ("link-clock-ignores-a-busy-link", "the modeled link's clock starts before the link's last hold ended",
     "test_runtime",
     "runtime/device_cpu.c",
     "s->link_start_ns = latest(a->enqueued_ns, latest(s->link_free_ns, s->inputs_ready_ns));",
     "s->link_start_ns = latest(a->enqueued_ns, s->inputs_ready_ns);"),
    ("link-clock-before-the-enqueue", "the modeled link's clock of an idle link starts at its last hold's end, before the host enqueued it",
     "test_runtime",
     "runtime/device_cpu.c",
     "s->link_start_ns = latest(a->enqueued_ns, latest(s->link_free_ns, s->inputs_ready_ns));",
     "s->link_start_ns = latest(s->link_free_ns, s->inputs_ready_ns);"),
    ("branch-grad-skips-dropout", "a branch's gradient read in place under dropout too: its mask never applied",
     "test_model",
     "model/gpt.c",
     "if (drop.p == 0.0f) return dresid;",
     "if (drop.p >= 0.0f) return dresid;"),
    ("matmul-rows-by-thread", "the forward's rows cut by the thread count: its bits follow the team's size",
     "test_train/a_run_gives_the_same_bits_on_any_number_of_threads",
     "kernels/cpu/matmul.c",
     "#include <cblas.h>\n",
     "#include <cblas.h>\n#include <omp.h>\n",
     "kernels/cpu/matmul.c",
     "int blocks = 2 * ((a->N + 2 * MATMUL_ROWS - 1) / (2 * MATMUL_ROWS));",
     "int blocks = omp_get_max_threads();"),
    ("team-never-shrinks", "a stream's OpenMP team kept whole beside a load that leaves a core free",
     "test_runtime/a_stream_*",
     "runtime/device_cpu.c",
     "if (waited_share < TEAM_LOADED) return;",
     "if (waited_share < 2.0) return;"),
    ("team-size-not-applied", "the team's size decided but never given to OpenMP",
     "test_runtime/a_stream_worker_*",
     "runtime/device_cpu.c",
     "if (team_threads(&team->size) != was) omp_set_num_threads(team_threads(&team->size));",
     "(void)was;"),
    ("crowded-team-stays-one", "one thread kept when it waits for a core as much as the team did",
     "test_runtime/a_stream_team_*",
     "runtime/device_cpu.c",
     "if (waited_share >= TEAM_LOADED) {",
     "if (waited_share > 1.0) {"),
    ("team-hold-never-doubles", "the team tries the full size again every window a load is there",
     "test_runtime/a_stream_team_*",
     "runtime/device_cpu.c",
     "team->hold_one = first ? doubled(team->hold_one) : 1;",
     "team->hold_one = 1;"),
]


def sh(cmd, **kw):
    return subprocess.run(cmd, shell=True, **kw)


def end_leftovers(src):
    """Kill what a mutant's tests left running in the scratch tree (mpirun's processes have
    process groups of their own, so a timed-out test can leave them): a bin/train still
    running there would keep the next mutant from copying its build over it."""
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            cwd = os.readlink(f"/proc/{pid}/cwd")
        except OSError:
            continue
        if (cwd == src or cwd.startswith(src + "/")) and int(pid) != os.getpid():
            try:
                os.kill(int(pid), 9)
            except OSError:
                pass


def scratch_copy(root, scratch):
    """The working tree's files (tracked and untracked, not ignored), the CPU build's objects, and the PyPI
    packages of build/pylib (without them the safetensors and tokenizers tests would skip, and a mutant that only
    they catch would survive)."""
    files = subprocess.run(["git", "ls-files", "-co", "--exclude-standard", "-z"], cwd=root, check=True,
                           capture_output=True).stdout.decode().split("\0")
    src = os.path.join(scratch, "src")
    shutil.rmtree(src, ignore_errors=True)
    for f in filter(None, files):
        if not os.path.isfile(os.path.join(root, f)):
            continue  # deleted in the working tree
        os.makedirs(os.path.dirname(os.path.join(src, f)) or src, exist_ok=True)
        shutil.copy2(os.path.join(root, f), os.path.join(src, f))
    for built in ("build/cpu", "build/pylib"):
        if os.path.isdir(os.path.join(root, built)):
            shutil.copytree(os.path.join(root, built), os.path.join(src, built), symlinks=True)
    return src


def main(argv):
    root = subprocess.run(["git", "rev-parse", "--show-toplevel"], check=True, capture_output=True,
                          text=True).stdout.strip()
    chosen = [m for m in MUTANTS if not argv or m[0] in argv]
    if argv and len(chosen) != len(argv):
        print("mutate: unknown mutant among", " ".join(argv), file=sys.stderr)
        return 2
    for name, _, catcher, *edits in chosen:
        if not os.path.isfile(os.path.join(root, "tests", catcher.partition("/")[0] + ".c")):
            print(f"mutate: {name}: its catcher {catcher} names no suite in tests/: mend the list", file=sys.stderr)
            return 2
        for path, old, _ in zip(edits[0::3], edits[1::3], edits[2::3]):
            count = open(os.path.join(root, path)).read().count(old)
            if count != 1:
                print(f"mutate: {name}: its text is in {path} {count} times, not once: mend the list",
                      file=sys.stderr)
                return 2
    scratch = os.path.join(root, "build/mutate")
    os.makedirs(scratch, exist_ok=True)
    src = scratch_copy(root, scratch)
    print(f"mutate: {len(chosen)} mutants, each its catcher, then `make CUDA=0 test` if it passes, in {src} "
          f"(logs in {scratch})", flush=True)
    if sh("make CUDA=0 -j2 all >/dev/null", cwd=src).returncode != 0:
        print("mutate: the unmutated tree does not build", file=sys.stderr)
        return 2
    survivors = []
    for name, why, catcher, *edits in chosen:
        originals = {}
        for path, old, new in zip(edits[0::3], edits[1::3], edits[2::3]):
            target = os.path.join(src, path)
            originals.setdefault(target, open(target).read())
            text = open(target).read()
            open(target, "w").write(text.replace(old, new))
        log = os.path.join(scratch, name + ".log")
        t0 = time.time()
        with open(log, "w") as out:
            built = sh("make CUDA=0 -j2 all", cwd=src, stdout=out, stderr=subprocess.STDOUT).returncode == 0
            suite, _, pattern = catcher.partition("/")
            first = f"timeout 900 ./build/cpu/bin/{suite} --jobs 2" + (f" --filter='*/{pattern}'" if pattern else "")
            by = catcher
            rc = sh(first, cwd=src, stdout=out, stderr=subprocess.STDOUT).returncode if built else 0
            if built and rc == 0:
                by = f"make test, not {catcher}: mend its catcher"
                rc = sh("timeout 900 make CUDA=0 test", cwd=src, stdout=out, stderr=subprocess.STDOUT).returncode
        end_leftovers(src)
        for target, original in originals.items():
            open(target, "w").write(original)
        if not built:
            print(f"mutate: {name} does not compile (see {log}): mend the list", file=sys.stderr)
            return 2
        if rc == 0:
            survivors.append(name)
        verdict = f"caught   {name:34s} {time.time() - t0:5.0f} s  by {by}" if rc else \
            f"SURVIVED {name:34s} {time.time() - t0:5.0f} s  {why}"
        print(verdict, flush=True)
    if survivors:
        print(f"mutate: {len(survivors)} of {len(chosen)} survived: {' '.join(survivors)}")
        return 1
    print(f"mutate: all {len(chosen)} mutants caught")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
