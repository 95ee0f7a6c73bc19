/* mpi_collectives.c: the pinned order of every collective, over the processes
 * of an mpirun (test_collectives.c's pinned_order suite, past one process).
 *
 * Why a plain program: MPI is joined once, by the process mpirun started, and
 * Criterion runs each test in a fork of its own. test_multiprocess.c runs this
 * under mpirun -np 2 and -np 3. Each of the P processes holds L = 1, then 2,
 * ranks of a world of W = P x L (pg_create_simulator on the CPU). Global rank
 * g's input is fill_wide(seed * 100 + g), which every process computes for
 * every g, so each checks its own ranks' results against the host's float sum
 * over ranks 0..W-1 in order (ordered_sum), byte for byte: all-reduce,
 * reduce-scatter and all-gather, with and without a scale, in place and not,
 * at lengths 1, 7, 1001 and 4097 (uneven shards, empty ones at W > n); each
 * in fp32 and in bf16 (ordered_sum_in; the gather's shards rounded; 16 bits
 * on the wire); the gather of numbers held in bf16, bit for bit; and the
 * reductions of numbers held in bf16 (16 bits in memory and on the wire).
 * Exit 0, or 1 after printing the first mismatch (every process ends then).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../runtime/process_group.h"
#include "../runtime/world.h"
#include "fixtures.h"
#include "reference.h"

static const size_t LENGTHS[] = { 1, 7, 1001, 4097 };
static const float SCALES[] = { 1.0f, 0.37f };
/* The collectives' name here, in their spans and a timeout's line: "all-reduce test". */
static const CollectiveName TEST = { "test", -1, -1 };

/* One collective's setting: the group, every global rank's input, and this
 * process's ranks' device buffers holding theirs. */
typedef struct {
    ProcessGroup *pg;
    int world_size;
    size_t n, shard;
    float *host[MAX_RANKS];  /* global rank g's input */
    float *buf[MAX_RANKS];   /* local rank r's device buffer, n floats */
} Setup;

static Setup setup(ProcessGroup *pg, size_t n, unsigned seed) {
    Setup s = { .pg = pg, .world_size = pg->world_size, .n = n, .shard = pg_shard_size(n, pg->world_size) };
    for (int g = 0; g < s.world_size; g++) {
        s.host[g] = malloc(n * sizeof(float));
        fill_wide(s.host[g], n, seed * 100 + (unsigned)g);
    }
    for (int r = 0; r < pg->nranks; r++) {
        s.buf[r] = device_alloc(pg->device[r], MEM_WORKING, n * sizeof(float));
        stream_copy(pg->compute[r], s.buf[r], s.host[pg_global_rank(pg, r)], n * sizeof(float));
    }
    return s;
}

static void teardown(Setup *s) {
    for (int r = 0; r < s->pg->nranks; r++) {
        stream_synchronize(s->pg->compute[r]);
        stream_synchronize(s->pg->comm[r]);
        device_free(s->pg->device[r], MEM_WORKING, s->buf[r], s->n * sizeof(float));
    }
    for (int g = 0; g < s->world_size; g++) free(s->host[g]);
}

/* Copied back on the compute stream, which must wait for the collective. */
static float *read_back(const Setup *s, int r, const float *src, size_t n) {
    float *out = malloc((n ? n : 1) * sizeof(float));
    stream_copy(s->pg->compute[r], out, src, n * sizeof(float));
    stream_synchronize(s->pg->compute[r]);
    return out;
}

static size_t valid_length(size_t n, size_t shard, int g) {
    size_t lo = (size_t)g * shard;
    return lo >= n ? 0 : (n - lo < shard ? n - lo : shard);
}

/* got[0, len) against the ordered sums of elements lo.. (want == NULL), or
 * against want's bytes. At the first element that differs: one line, and the
 * end of every process (the others would wait for the next collective). */
static void expect_bytes(const Setup *s, const char *what, DType dtype, int r, const float *got,
                         const float *want, size_t lo, size_t len, float scale) {
    for (size_t k = 0; k < len; k++) {
        float expected = want ? want[k] : ordered_sum_in(dtype, s->host, s->world_size, lo + k, scale);
        if (memcmp(&got[k], &expected, sizeof expected) == 0) continue;
        printf("mismatch: %s in %s, W=%d (L=%d) n=%zu scale %g: rank %d's element %zu is %.9g, want %.9g\n", what,
               dtype == DTYPE_BF16 ? "bf16" : "fp32", s->world_size, s->pg->nranks, s->n, (double)scale,
               pg_global_rank(s->pg, r), lo + k, (double)got[k], (double)expected);
        world_abort(1);
    }
}

static void check_all_reduce(ProcessGroup *pg, size_t n, float scale, DType dtype, unsigned seed) {
    Setup s = setup(pg, n, seed);
    pg_all_reduce(pg, TEST, s.buf, n, scale, dtype, NULL);
    for (int r = 0; r < pg->nranks; r++) {
        float *got = read_back(&s, r, s.buf[r], n);
        expect_bytes(&s, "all-reduce", dtype, r, got, NULL, 0, n, scale);
        free(got);
    }
    teardown(&s);
}

/* Into shard buffers of their own, or in place (rank g's shard of its send;
 * an empty shard points at the buffer's start, never read). */
static void check_reduce_scatter(ProcessGroup *pg, size_t n, float scale, DType dtype, int in_place,
                                 unsigned seed) {
    Setup s = setup(pg, n, seed);
    float *recv[MAX_RANKS];
    for (int r = 0; r < pg->nranks; r++) {
        size_t lo = (size_t)pg_global_rank(pg, r) * s.shard;
        recv[r] = !in_place ? device_alloc(pg->device[r], MEM_WORKING, s.shard * sizeof(float))
                            : s.buf[r] + (lo < n ? lo : 0);
    }
    pg_reduce_scatter(pg, TEST, s.buf, recv, n, scale, dtype, REDUCE_WRITE, NULL);
    for (int r = 0; r < pg->nranks; r++) {
        int g = pg_global_rank(pg, r);
        size_t len = valid_length(n, s.shard, g);
        float *got = read_back(&s, r, recv[r], len);
        expect_bytes(&s, in_place ? "reduce-scatter in place" : "reduce-scatter", dtype, r, got, NULL,
                     (size_t)g * s.shard, len, scale);
        free(got);
        if (!in_place) device_free(pg->device[r], MEM_WORKING, recv[r], s.shard * sizeof(float));
    }
    teardown(&s);
}

/* Every rank ends up with every rank's shard: not in place, rank q sends the
 * first shard-length of its input; in place, its own shard of its buffer; in
 * bf16, each shard rounded (16 bits on the wire between the processes). */
static void check_all_gather(ProcessGroup *pg, size_t n, int in_place, DType dtype, unsigned seed) {
    Setup s = setup(pg, n, seed);
    size_t gathered = (size_t)s.world_size * s.shard;
    float *send[MAX_RANKS], *recv[MAX_RANKS];
    for (int r = 0; r < pg->nranks; r++) {
        size_t lo = (size_t)pg_global_rank(pg, r) * s.shard;
        send[r] = in_place ? s.buf[r] + (lo < n ? lo : 0) : s.buf[r];
        recv[r] = in_place ? s.buf[r] : device_alloc(pg->device[r], MEM_WORKING, gathered * sizeof(float));
    }
    pg_all_gather(pg, TEST, send, recv, n, dtype, NULL);
    float *want = malloc(s.shard * sizeof(float) + 1);
    for (int r = 0; r < pg->nranks; r++) {
        float *got = read_back(&s, r, recv[r], n);
        for (int q = 0; q < s.world_size; q++) {
            size_t at = (size_t)q * s.shard, len = valid_length(n, s.shard, q);
            const float *sent = s.host[q] + (in_place ? at : 0);
            for (size_t k = 0; k < len; k++) want[k] = dtype == DTYPE_BF16 ? bf16_rounded(sent[k]) : sent[k];
            expect_bytes(&s, in_place ? "all-gather in place" : "all-gather", dtype, r, got + at, want, at, len, 1.0f);
        }
        free(got);
        if (!in_place) device_free(pg->device[r], MEM_WORKING, recv[r], gathered * sizeof(float));
    }
    free(want);
    teardown(&s);
}

/* The gather of numbers held in bf16: every rank ends up with every rank's
 * 16 bits as they were sent (bf16_pattern of its global rank: NaN payloads
 * and all), over the processes too. At the first difference: one line, and
 * the end of every process. */
static void check_all_gather_bf16(ProcessGroup *pg, size_t n, int in_place, unsigned seed) {
    size_t shard = pg_shard_size(n, pg->world_size), gathered = (size_t)pg->world_size * shard;
    bf16 *full[MAX_RANKS], *own[MAX_RANKS] = { 0 }, *send[MAX_RANKS];
    bf16 *host = calloc(gathered + 1, sizeof(bf16));
    for (int r = 0; r < pg->nranks; r++) {
        int g = pg_global_rank(pg, r);
        size_t lo = (size_t)g * shard < n ? (size_t)g * shard : 0;
        for (size_t k = 0; k < gathered; k++) host[k] = bf16_pattern(seed * 100 + (unsigned)g, k);
        full[r] = device_alloc(pg->device[r], MEM_WORKING, gathered * sizeof(bf16));
        stream_copy(pg->compute[r], full[r], host, gathered * sizeof(bf16));
        if (!in_place) {
            own[r] = device_alloc(pg->device[r], MEM_WORKING, shard * sizeof(bf16));
            stream_copy(pg->compute[r], own[r], host, shard * sizeof(bf16));
        }
        send[r] = in_place ? full[r] + lo : own[r];
        stream_synchronize(pg->compute[r]);
    }
    pg_all_gather_bf16(pg, TEST, send, full, n, NULL);
    for (int r = 0; r < pg->nranks; r++) {
        stream_copy(pg->compute[r], host, full[r], n * sizeof(bf16));
        stream_synchronize(pg->compute[r]);
        for (int q = 0; q < pg->world_size; q++)
            for (size_t k = 0, at = (size_t)q * shard; k < valid_length(n, shard, q); k++) {
                bf16 want = bf16_pattern(seed * 100 + (unsigned)q, (in_place ? at : 0) + k);
                if (host[at + k] == want) continue;
                fprintf(stderr, "process %d: bf16 all-gather%s over %d ranks, n=%zu: rank %d's copy of rank %d's "
                        "shard is 0x%04x at %zu, want 0x%04x\n", world()->proc, in_place ? " in place" : "",
                        pg->world_size, n, pg_global_rank(pg, r), q, host[at + k], k, want);
                world_abort(1);
            }
    }
    for (int r = 0; r < pg->nranks; r++) {
        device_free(pg->device[r], MEM_WORKING, full[r], gathered * sizeof(bf16));
        if (own[r]) device_free(pg->device[r], MEM_WORKING, own[r], shard * sizeof(bf16));
    }
    free(host);
}

/* Global rank g's input rounded into bf16 (host too, for the reference),
 * on each local rank's device. */
static bf16 **held_in_bf16(Setup *s) {
    bf16 **held = calloc(MAX_RANKS, sizeof *held), *host = malloc(s->n * sizeof(bf16) + 1);
    for (int g = 0; g < s->world_size; g++)
        for (size_t i = 0; i < s->n; i++) s->host[g][i] = float_from_bf16(bf16_from_float(s->host[g][i]));
    for (int r = 0; r < s->pg->nranks; r++) {
        const float *mine = s->host[pg_global_rank(s->pg, r)];
        for (size_t i = 0; i < s->n; i++) host[i] = bf16_from_float(mine[i]);
        held[r] = device_alloc(s->pg->device[r], MEM_WORKING, s->n * sizeof(bf16));
        stream_copy(s->pg->compute[r], held[r], host, s->n * sizeof(bf16));
        stream_synchronize(s->pg->compute[r]);
    }
    free(host);
    return held;
}

/* got[0, len), numbers held in bf16, against the bf16 ordered sums of elements lo.. */
static void expect_bf16_sums(const Setup *s, const char *what, int r, const bf16 *dev, size_t lo, size_t len,
                             float scale) {
    bf16 *got = malloc(len * sizeof(bf16) + 1);
    stream_copy(s->pg->compute[r], got, dev, len * sizeof(bf16));
    stream_synchronize(s->pg->compute[r]);
    for (size_t k = 0; k < len; k++) {
        bf16 want = bf16_from_float(ordered_sum_in(DTYPE_BF16, s->host, s->world_size, lo + k, scale));
        if (got[k] == want) continue;
        printf("mismatch: %s of numbers held in bf16, W=%d (L=%d) n=%zu scale %g: rank %d's element %zu is 0x%04x, "
               "want 0x%04x\n", what, s->world_size, s->pg->nranks, s->n, (double)scale, pg_global_rank(s->pg, r),
               lo + k, got[k], want);
        world_abort(1);
    }
    free(got);
}

/* The reduce-scatter (into buffers of their own, or in place) and the
 * all-reduce of numbers held in bf16: 16 bits each in memory and on the wire. */
static void check_reductions_held_in_bf16(ProcessGroup *pg, size_t n, float scale, int in_place, unsigned seed) {
    Setup s = setup(pg, n, seed);
    bf16 **held = held_in_bf16(&s), *recv[MAX_RANKS];
    for (int r = 0; r < pg->nranks; r++) {
        size_t lo = (size_t)pg_global_rank(pg, r) * s.shard;
        recv[r] = !in_place ? device_alloc(pg->device[r], MEM_WORKING, s.shard * sizeof(bf16))
                            : held[r] + (lo < n ? lo : 0);
    }
    pg_reduce_scatter_bf16(pg, TEST, held, recv, n, scale, REDUCE_WRITE, NULL);
    for (int r = 0; r < pg->nranks; r++) {
        int g = pg_global_rank(pg, r);
        expect_bf16_sums(&s, in_place ? "reduce-scatter in place" : "reduce-scatter", r, recv[r],
                         (size_t)g * s.shard, valid_length(n, s.shard, g), scale);
        if (!in_place) device_free(pg->device[r], MEM_WORKING, recv[r], s.shard * sizeof(bf16));
        device_free(pg->device[r], MEM_WORKING, held[r], n * sizeof(bf16));
    }
    free(held);
    held = held_in_bf16(&s);
    pg_all_reduce_bf16(pg, TEST, held, n, scale, NULL);
    for (int r = 0; r < pg->nranks; r++) {
        expect_bf16_sums(&s, "all-reduce", r, held[r], 0, n, scale);
        device_free(pg->device[r], MEM_WORKING, held[r], n * sizeof(bf16));
    }
    free(held);
    teardown(&s);
}

/* Every collective at every length over a world of P x L ranks. */
static void check_world(int local_ranks) {
    int world_size = world()->nprocs * local_ranks;
    world_set_local_ranks(local_ranks);
    ProcessGroup *pg = pg_create_simulator(world_size, DEVICE_CPU, 0);
    if (!pg) world_abort(1);
    for (size_t li = 0; li < sizeof LENGTHS / sizeof LENGTHS[0]; li++)
        for (int k = 0; k < 2; k++) {
            size_t n = LENGTHS[li];
            unsigned seed = (unsigned)(world_size * 31 + li * 3 + k);
            for (int p = 0; p < DTYPES; p++) check_all_reduce(pg, n, SCALES[k], (DType)p, seed);
            for (int in_place = 0; in_place <= 1; in_place++) {
                for (int p = 0; p < DTYPES; p++)
                    check_reduce_scatter(pg, n, SCALES[k], (DType)p, in_place, seed + 1);
                for (int p = 0; p < DTYPES; p++) check_all_gather(pg, n, in_place, (DType)p, seed + 2);
                check_all_gather_bf16(pg, n, in_place, seed + 3);
                check_reductions_held_in_bf16(pg, n, SCALES[k], in_place, seed + 4);
            }
        }
    pg_destroy(pg);
}

int main(int argc, char **argv) {
    if (world_init(&argc, &argv) != 0) return 1;
    world_set_timeout(60);
    for (int local_ranks = 1; local_ranks <= 2; local_ranks++) check_world(local_ranks);
    if (world()->proc == 0) printf("ok: every collective is the ordered host sum over %d processes\n", world()->nprocs);
    world_finalize();
    return 0;
}
