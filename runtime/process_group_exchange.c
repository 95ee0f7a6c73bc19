/* process_group_exchange.c: the exchange between processes of
 * process_group_exchange.h, through world_exchange (runtime/world.h), staged
 * in local rank 0's working memory (its device is the CPU, whose memory MPI
 * moves). */
#include "process_group_exchange.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "host.h"
#include "world.h"

void exchange_create(ProcessGroup *pg) {
    pg->staged = event_create(pg->device[0]);
    for (int r = 0; r < pg->nranks; r++) pg->stage_free[r] = event_create(pg->device[r]);
}

static void free_stage(ProcessGroup *pg) {
    device_free(pg->device[0], MEM_WORKING, pg->stage_send, pg->stage_floats * sizeof(float));
    device_free(pg->device[0], MEM_WORKING, pg->stage_recv, pg->stage_floats * sizeof(float));
}

void exchange_destroy(ProcessGroup *pg) {
    if (pg->staged) event_destroy(pg->staged);
    for (int r = 0; r < pg->nranks; r++)
        if (pg->stage_free[r]) event_destroy(pg->stage_free[r]);
    free_stage(pg);
}

/* What an exchange task moves: the staging buffers are packed by the task
 * itself, on local rank 0's communication stream, once the producers are done. */
typedef struct {
    ProcessGroup *pg;
    const void *send[MAX_RANKS];  /* floats, or bf16 where `held` says */
    size_t n, shard;
    int gather;            /* 0: a reduce-scatter's shards; 1: an all-gather's */
    DType dtype;       /* bf16: 16 bits a number on the wire */
    DType held;        /* how send and the staging hold numbers: fp32, or bf16 (sent as they are) */
    char what[2 * RENDEZVOUS_NAME_MAX];
} Exchange;

/* Floats process p sends another for a reduce-scatter, from each of its L
 * ranks: the other's L shards; for an all-gather, each rank's own shard. */
size_t exchange_stride(const ProcessGroup *pg, size_t shard, int gather) {
    return gather ? shard : (size_t)pg->nranks * shard;
}

/* Staging room for a collective of n floats: P x L strides each way.
 * Grown only between collectives (the first step), never under one. */
static void reserve_stage(ProcessGroup *pg, size_t n) {
    int P = pg->world_size / pg->nranks;
    size_t shard = pg_shard_size(n, pg_shards(pg)), need = (size_t)P * pg->nranks * exchange_stride(pg, shard, 0);
    if (need <= pg->stage_floats) return;
    for (int r = 0; r < pg->nranks; r++) stream_synchronize(pg->comm[r]);
    free_stage(pg);
    pg->stage_send = device_alloc(pg->device[0], MEM_WORKING, need * sizeof(float));
    pg->stage_recv = device_alloc(pg->device[0], MEM_WORKING, need * sizeof(float));
    pg->stage_floats = need;
}

/* Copy the len floats of src from `from` into a staging stride, clipped to
 * the n that src holds, the rest zero: nothing undefined goes on the wire. */
static void pack(float *dst, const float *src, size_t from, size_t len, size_t n) {
    size_t valid = from >= n ? 0 : (n - from < len ? n - from : len);
    memcpy(dst, src + from, valid * sizeof(float));
    memset(dst + valid, 0, (len - valid) * sizeof(float));
}

/* pack's, in bf16: each float rounded to 16 bits at dst (bytes; memcpy, as
 * the same staging holds floats in other exchanges). */
static void pack_bf16(unsigned char *dst, const float *src, size_t from, size_t len, size_t n) {
    for (size_t i = 0; i < len; i++) {
        bf16 h = from + i < n ? bf16_from_float(src[from + i]) : 0;
        memcpy(dst + i * sizeof h, &h, sizeof h);
    }
}

/* A block of count floats whose upper half holds count bf16 as received,
 * widened in place from the front: float i overwrites only bf16 already read. */
static void widen_bf16(float *block, size_t count) {
    const unsigned char *wire = (const unsigned char *)block + count * sizeof(bf16);
    for (size_t i = 0; i < count; i++) {
        bf16 h;
        memcpy(&h, wire + i * sizeof h, sizeof h);
        float x = float_from_bf16(h);
        memcpy(block + i, &x, sizeof x);
    }
}

/* pack's, for numbers held in bf16: copied as they are. */
static void pack_held_bf16(bf16 *dst, const bf16 *src, size_t from, size_t len, size_t n) {
    size_t valid = from >= n ? 0 : (n - from < len ? n - from : len);
    memcpy(dst, src + from, valid * sizeof(bf16));
    memset(dst + valid, 0, (len - valid) * sizeof(bf16));
}

/* len numbers of src from `from`, clipped to n, at element `at` of out (floats,
 * or bf16 in bytes). */
static void pack_in(const Exchange *x, void *out, size_t at, const void *src, size_t from, size_t len, size_t n) {
    if (x->held == DTYPE_BF16) pack_held_bf16((bf16 *)out + at, src, from, len, n);
    else if (x->dtype == DTYPE_BF16) pack_bf16((unsigned char *)out + at * sizeof(bf16), src, from, len, n);
    else pack((float *)out + at, src, from, len, n);
}

/* To process p, as the stride of index q at out: the shard each of its ranks
 * holds (pg_shard_of) of our rank q's buffer, or our rank q's own shard. */
static void pack_stride(const Exchange *x, void *out, int p, int q, size_t stride) {
    const ProcessGroup *pg = x->pg;
    int S = pg_shards(pg);
    if (x->gather) {
        size_t valid = pg_shard_length(x->n, S, pg_shard_of(pg, pg->first_rank + q));
        pack_in(x, out, (size_t)q * stride, x->send[q], 0, stride, valid);
        return;
    }
    for (int j = 0; j < pg->nranks; j++) {
        size_t from = (size_t)pg_shard_of(pg, p * pg->nranks + j) * x->shard;
        pack_in(x, out, (size_t)q * stride + (size_t)j * x->shard, x->send[q], from, x->shard, x->n);
    }
}

static void exchange_task(void *arg) {
    Exchange *x = arg;
    ProcessGroup *pg = x->pg;
    int L = pg->nranks, P = pg->world_size / L, me = pg->first_rank / L;
    size_t stride = exchange_stride(pg, x->shard, x->gather), block = (size_t)L * stride;
    int in_bf16 = x->dtype == DTYPE_BF16, widen = in_bf16 && x->held == DTYPE_FP32;
    size_t wire_bytes = block * number_bytes(x->dtype);
    size_t block_bytes = block * number_bytes(x->held);
    WorldChunk to[STREAM_SUM_MAX] = { { 0 } }, from[STREAM_SUM_MAX] = { { 0 } };  /* P <= N <= STREAM_SUM_MAX */
    for (int p = 0; p < P; p++) {
        unsigned char *out = (unsigned char *)pg->stage_send + (size_t)p * block_bytes;
        unsigned char *in = (unsigned char *)pg->stage_recv + (size_t)p * block_bytes;
        for (int q = 0; q < L && p != me; q++) pack_stride(x, out, p, q, stride);
        to[p] = (WorldChunk){ out, wire_bytes };
        /* bf16 bound for floats lands in the upper half of its block, for widen_bf16 */
        from[p] = (WorldChunk){ widen ? in + wire_bytes : in, wire_bytes };
    }
    world_exchange(to, from, x->what);
    for (int p = 0; p < P && widen; p++)
        if (p != me) widen_bf16(pg->stage_recv + (size_t)p * block, block);
    free(x);
}

/* Enqueued on local rank 0's communication stream after the last reads of
 * the staging. */
static void start(ProcessGroup *pg, Exchange *x, const char *label) {
    reserve_stage(pg, x->n);
    snprintf(x->what, sizeof x->what, "%s", label);
    for (int r = 0; r < pg->nranks; r++) stream_wait_event(pg->comm[0], pg->stage_free[r]);
    stream_host_task(pg->comm[0], exchange_task, x);
    event_record(pg->staged, pg->comm[0]);
    for (int r = 1; r < pg->nranks; r++) stream_wait_event(pg->comm[r], pg->staged);
}

void exchange_start(ProcessGroup *pg, void *const *send, DType held, size_t n, int gather, DType dtype,
                    const char *label) {
    Exchange *x = host_calloc(1, sizeof *x);
    *x = (Exchange){ .pg = pg, .n = n, .shard = pg_shard_size(n, pg_shards(pg)), .gather = gather, .dtype = dtype,
                     .held = held };
    for (int r = 0; r < pg->nranks; r++) x->send[r] = send[r];
    start(pg, x, label);
}

void exchange_end(ProcessGroup *pg) {
    for (int r = 0; r < pg->nranks; r++) event_record(pg->stage_free[r], pg->comm[r]);
}

int exchange_is_local(const ProcessGroup *pg, int g) {
    return g >= pg->first_rank && g < pg->first_rank + pg->nranks;
}

/* Process g / L's staging, then g's stride in it. */
void *exchange_received(const ProcessGroup *pg, DType held, int g, size_t stride, size_t offset) {
    int L = pg->nranks;
    return pg_number(pg->stage_recv, held, (size_t)(g / L) * L * stride + (size_t)(g % L) * stride + offset);
}
