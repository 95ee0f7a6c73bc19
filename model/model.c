/* model.c: what every model shares: unit policies, init, unit tables, arenas,
 * activations, the batch upload, the reductions' scratch, loss (the models by
 * kind are model/models.c's). */
#include "model.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "../kernels/kernels.h"
#include "../kernels/philox.h"
#include "optim.h"
#include "../runtime/host.h"

static const char *const UNIT_POLICY_NAMES[UNIT_POLICIES] = {
    [UNIT_BLOCK] = "block", [UNIT_HALF] = "half", [UNIT_TENSOR] = "tensor",
};

const char *unit_policy_name(UnitPolicy unit) { return UNIT_POLICY_NAMES[unit]; }

int unit_policy_parse(const char *name) {
    for (int u = 0; u < UNIT_POLICIES; u++)
        if (strcmp(name, UNIT_POLICY_NAMES[u]) == 0) return u;
    return -1;
}

void model_init_tensor_part(const ModelConfig *cfg, const ArenaLayout *layout, int tensor, uint32_t seed,
                            size_t first, size_t count, float *out) {
    const TensorSpec *t = &layout->tensors[tensor];
    if (t->ndim == 1) {  /* norm weights 1, biases 0, as nanoGPT's _init_weights */
        float value = strstr(t->name, ".bias") ? 0.0f : 1.0f;
        for (size_t i = 0; i < count; i++) out[i] = value;
        return;
    }
    double std = 0.02;
    if (strstr(t->name, "c_proj.weight")) std = 0.02 / sqrt(2.0 * cfg->layers);
    /* Box-Muller on Philox: element pair i, i + 1 from counter (i / 2, tensor index) */
    size_t end = first + count;
    for (size_t i = first / 2 * 2; i < end; i += 2) {
        Philox4 ctr = {{ (uint32_t)(i / 2), (uint32_t)((uint64_t)i >> 33), (uint32_t)tensor, 0 }};
        Philox4 bits = philox4x32_10(ctr, seed, PHILOX_STREAM_INIT);
        double u1 = ((double)bits.v[0] + 1.0) / 4294967296.0;  /* (0, 1] */
        double u2 = (double)bits.v[1] / 4294967296.0;
        double r = sqrt(-2.0 * log(u1));
        if (i >= first) out[i - first] = (float)(std * r * cos(2.0 * M_PI * u2));
        if (i + 1 >= first && i + 1 < end) out[i + 1 - first] = (float)(std * r * sin(2.0 * M_PI * u2));
    }
}

void model_init_params(const ModelConfig *cfg, const ArenaLayout *layout, uint32_t seed, float *host) {
    memset(host, 0, layout->total * sizeof(float));
    for (int t = 0; t < layout->ntensors; t++)
        model_init_tensor_part(cfg, layout, t, seed, 0, layout->tensors[t].numel, host + layout->tensors[t].offset);
}

void model_init(Model *m, const ModelOps *ops, const ModelConfig *cfg, const ArenaLayout *layout, Device *dev,
                Stream *stream) {
    m->ops = ops;
    m->cfg = *cfg;
    m->dev = dev;
    m->stream = stream;
    m->layout = *layout;
    m->unit_weights = host_calloc(m->layout.nunits, sizeof *m->unit_weights);
    m->unit_weights_bf16 = host_calloc(m->layout.nunits, sizeof *m->unit_weights_bf16);
    m->unit_grads = host_calloc(m->layout.nunits, sizeof *m->unit_grads);
    m->unit_grads_bf16 = host_calloc(m->layout.nunits, sizeof *m->unit_grads_bf16);
}

static size_t column_sums_scratch_bytes(const Model *m) {
    return column_sums_scratch_floats((int)m->positions, COLUMN_SUMS_WIDEST * m->cfg.embd) * sizeof(float);
}

/* tokens and targets, then the buckets' token, start and positions, then the step */
size_t model_batch_ints(size_t positions) { return 5 * positions + 2; }

/* Where the step is in the staging: after the batch's ints. */
static size_t staged_step_at(size_t positions) { return model_batch_ints(positions) - 1; }

/* The buckets' arrays laid out in `ints` (3 x positions + 1 of them). */
static TokenBuckets buckets_in(int *ints, size_t positions) {
    return (TokenBuckets){ 0, ints, ints + positions, ints + 2 * positions + 1 };
}

/* Point unit u of `units` at its range of a full arena. */
static float *own_arena(Model *m, MemKind kind, float **units) {
    float *arena = device_alloc(m->dev, kind, m->layout.total * sizeof(float));
    for (int u = 0; u < m->layout.nunits; u++) units[u] = arena + m->layout.units[u].offset;
    return arena;
}

/* A buffer's floats up to the next 256-byte boundary: so that an operand a
 * model keeps there starts where the GPU's staging of one does (kernels.h's
 * aligned_numbers), and cuBLAS picks the same kernel for both. */
static size_t slot_floats(size_t floats) { return aligned_numbers(floats, sizeof(float)); }

size_t model_activation_floats(const ActivationSlot *table, int n) {
    size_t floats = 0;
    for (int i = 0; i < n; i++) floats += slot_floats(table[i].floats);
    return floats;
}

void model_alloc_activations(Model *m, const ActivationSlot *table, int n, size_t positions) {
    m->acts_floats = model_activation_floats(table, n);
    m->acts_memory = device_alloc(m->dev, MEM_ACTIVATIONS, m->acts_floats * sizeof(float));
    float *next = m->acts_memory;
    for (int i = 0; i < n; i++) {
        *table[i].ptr = next;
        next += slot_floats(table[i].floats);
    }
    m->positions = positions;
    m->tokens = device_alloc(m->dev, MEM_ACTIVATIONS, positions * sizeof(int));
    m->targets = device_alloc(m->dev, MEM_ACTIVATIONS, positions * sizeof(int));
    m->step_at = device_alloc(m->dev, MEM_ACTIVATIONS, sizeof(uint32_t));
    m->bucket_memory = device_alloc(m->dev, MEM_ACTIVATIONS, (3 * positions + 1) * sizeof(int));
    m->buckets = buckets_in(m->bucket_memory, positions);
    m->buckets.ntokens = (int)positions;  /* every upload pads its tokens to this count (token_buckets_pad) */
    m->bucket_counts = host_calloc((size_t)m->cfg.vocab + 1, sizeof(int));
    m->upload = device_alloc_host(m->dev, model_batch_ints(positions) * sizeof(int));
    m->uploaded = event_create(m->dev);
    m->column_sums_scratch = device_alloc(m->dev, MEM_WORKING, column_sums_scratch_bytes(m));
    m->sumsq_scratch = device_alloc(m->dev, MEM_WORKING, sumsq_scratch_bytes(m->layout.total));
    AdamWSpan *spans = host_calloc((size_t)m->layout.ntensors, sizeof *spans);
    adamw_spans(&m->layout, spans);
    m->adamw_spans = device_alloc(m->dev, MEM_WORKING, adamw_spans_bytes(&m->layout));
    stream_copy(m->stream, m->adamw_spans, spans, adamw_spans_bytes(&m->layout));
    stream_synchronize(m->stream);  /* the host table is freed below */
    free(spans);
}

/* Through the staging buffer: a copy from pageable memory would make CUDA
 * stage it itself, synchronously. The host waits for the last upload from
 * the buffer (long done: a step reads its loss in between) before refilling it. */
void model_stage_batch(Model *m, const int *tokens, const int *targets, size_t BT, uint32_t step) {
    event_synchronize(m->uploaded);
    memcpy(m->upload + staged_step_at(m->positions), &step, sizeof step);
    memcpy(m->upload, tokens, BT * sizeof(int));
    if (!targets) return;
    memcpy(m->upload + m->positions, targets, BT * sizeof(int));
    TokenBuckets staged = buckets_in(m->upload + 2 * m->positions, m->positions);
    token_buckets_build(tokens, (int)BT, m->cfg.vocab, m->bucket_counts, &staged);
    token_buckets_pad(&staged, (int)m->positions);
}

void model_upload_batch(Model *m, const int *tokens, const int *targets, size_t BT, uint32_t step) {
    model_stage_batch(m, tokens, targets, BT, step);
    stream_copy(m->stream, m->step_at, m->upload + staged_step_at(m->positions), sizeof(uint32_t));
    stream_copy(m->stream, m->tokens, m->upload, BT * sizeof(int));
    if (targets) {
        stream_copy(m->stream, m->targets, m->upload + m->positions, BT * sizeof(int));
        stream_copy(m->stream, m->bucket_memory, m->upload + 2 * m->positions, (3 * m->positions + 1) * sizeof(int));
    }
    event_record(m->uploaded, m->stream);
}

void model_own_weights(Model *m) { m->params = own_arena(m, MEM_WEIGHTS, m->unit_weights); }
void model_own_grads(Model *m) { m->grads = own_arena(m, MEM_GRADS, m->unit_grads); }

/* A full bf16 arena of one kind, every unit of the table pointed into it. */
static bf16 *own_arena_bf16(Model *m, MemKind kind, bf16 **units) {
    bf16 *arena = device_alloc(m->dev, kind, m->layout.total * sizeof(bf16));
    for (int u = 0; u < m->layout.nunits; u++) units[u] = arena + m->layout.units[u].offset;
    return arena;
}

void model_own_weights_bf16(Model *m) { m->params_bf16 = own_arena_bf16(m, MEM_WEIGHTS, m->unit_weights_bf16); }
void model_own_grads_bf16(Model *m) { m->grads_bf16 = own_arena_bf16(m, MEM_GRADS, m->unit_grads_bf16); }

void model_destroy(Model *m) {
    if (!m) return;
    stream_synchronize(m->stream);  /* nothing queued may still use what is freed below */
    device_free(m->dev, MEM_WEIGHTS, m->params, m->layout.total * sizeof(float));
    device_free(m->dev, MEM_WEIGHTS, m->params_bf16, m->layout.total * sizeof(bf16));
    device_free(m->dev, MEM_GRADS, m->grads, m->layout.total * sizeof(float));
    device_free(m->dev, MEM_GRADS, m->grads_bf16, m->layout.total * sizeof(bf16));
    device_free(m->dev, MEM_ACTIVATIONS, m->acts_memory, m->acts_floats * sizeof(float));
    device_free(m->dev, MEM_ACTIVATIONS, m->tokens, m->positions * sizeof(int));
    device_free(m->dev, MEM_ACTIVATIONS, m->targets, m->positions * sizeof(int));
    device_free(m->dev, MEM_ACTIVATIONS, m->step_at, sizeof(uint32_t));
    device_free(m->dev, MEM_ACTIVATIONS, m->bucket_memory, (3 * m->positions + 1) * sizeof(int));
    free(m->bucket_counts);
    event_destroy(m->uploaded);
    device_free_host(m->dev, m->upload);
    device_free(m->dev, MEM_WORKING, m->column_sums_scratch, column_sums_scratch_bytes(m));
    device_free(m->dev, MEM_WORKING, m->sumsq_scratch, sumsq_scratch_bytes(m->layout.total));
    device_free(m->dev, MEM_WORKING, m->adamw_spans, adamw_spans_bytes(&m->layout));
    free(m->unit_weights);
    free(m->unit_weights_bf16);
    free(m->unit_grads);
    free(m->unit_grads_bf16);
    m->ops->destroy(m);
}

size_t model_tensor_offset(const Model *m, int tensor) {
    const TensorSpec *t = &m->layout.tensors[tensor];
    return t->offset - m->layout.units[t->unit].offset;
}

float *model_tensor(const Model *m, float *const *units, int tensor) {
    return units[m->layout.tensors[tensor].unit] + model_tensor_offset(m, tensor);
}

int model_opens_unit(const Model *m, int tensor) {
    const TensorSpec *t = &m->layout.tensors[tensor];
    return t->offset == m->layout.units[t->unit].offset;
}

int model_closes_unit(const Model *m, int tensor) {
    const TensorSpec *t = &m->layout.tensors[tensor];
    const UnitSpec *u = &m->layout.units[t->unit];
    return t->offset + t->numel == u->offset + u->used;
}

void model_before_forward(Model *m, int unit) {
    if (m->hooks.before_forward) m->hooks.before_forward(m->hooks.ctx, unit);
}

void model_before_backward(Model *m, int unit) {
    if (m->hooks.before_backward) m->hooks.before_backward(m->hooks.ctx, unit);
}

void model_after_backward(Model *m, int unit) {
    if (m->hooks.after_backward) m->hooks.after_backward(m->hooks.ctx, unit);
}

void model_grad_done(Model *m, int tensor) {
    if (m->hooks.grad_done) m->hooks.grad_done(m->hooks.ctx, tensor);
}

float model_read_loss(Model *m) {
    float loss;
    stream_copy(m->stream, &loss, m->mean_loss, sizeof loss);
    stream_synchronize(m->stream);
    return loss;
}
