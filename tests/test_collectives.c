/* test_collectives.c: the rank threads and the simulator's collectives. */
#include <criterion/criterion.h>
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../runtime/rank_threads.h"
#include "../runtime/process_group.h"
#include "fixtures.h"
#include "reference.h"

/* ---- collectives against a double-precision reference ---- */

static const size_t LENGTHS[] = { 1, 7, 1000, 4097 };

/* The collectives' name here, in their spans and lines: "all-reduce test". */
static const CollectiveName TEST = { "test", -1, -1 };

typedef struct {
    ProcessGroup *pg;
    size_t n, shard;
    float *host[MAX_RANKS];  /* each rank's input */
    float *buf[MAX_RANKS];   /* each rank's device buffer, n floats */
} Setup;

/* Random inputs, copied to the devices by each rank's compute stream: the
 * collective must wait for those copies. */
static Setup setup(int N, size_t n, unsigned seed) {
    Setup s = { pg_create_simulator(N, DEVICE_CPU, 0), n, pg_shard_size(n, N), { 0 }, { 0 } };
    for (int r = 0; r < N; r++) {
        s.host[r] = malloc(n * sizeof(float));
        fill_uniform(s.host[r], n, -1, 1, seed * 100 + r);
        s.buf[r] = device_alloc(s.pg->device[r], MEM_WORKING, n * sizeof(float));
        stream_copy(s.pg->compute[r], s.buf[r], s.host[r], n * sizeof(float));
    }
    return s;
}

static void teardown_setup(Setup *s) {
    for (int r = 0; r < s->pg->nranks; r++) {
        stream_synchronize(s->pg->compute[r]);
        stream_synchronize(s->pg->comm[r]);
        device_free(s->pg->device[r], MEM_WORKING, s->buf[r], s->n * sizeof(float));
        free(s->host[r]);
    }
    pg_destroy(s->pg);
}

/* Copy back on the compute stream: a later use that must wait for the collective. */
static float *read_back(Setup *s, int r, const float *src, size_t n) {
    float *out = malloc((n ? n : 1) * sizeof(float));
    stream_copy(s->pg->compute[r], out, src, n * sizeof(float));
    stream_synchronize(s->pg->compute[r]);
    return out;
}

static double reference_sum(Setup *s, size_t i, double *abs_sum) {
    double sum = 0;
    *abs_sum = 0;
    for (int q = 0; q < s->pg->nranks; q++) {
        sum += s->host[q][i];
        *abs_sum += fabs(s->host[q][i]);
    }
    return sum;
}

Test(collectives, all_reduce_matches_the_reference) {
    for (int N = 1; N <= 8; N++)
        for (size_t li = 0; li < sizeof LENGTHS / sizeof LENGTHS[0]; li++) {
            size_t n = LENGTHS[li];
            Setup s = setup(N, n, (unsigned)(N * 10 + li));
            float scale = 1.0f / N;
            pg_all_reduce(s.pg, TEST, s.buf, n, scale, DTYPE_FP32, NULL);
            float *rank0 = read_back(&s, 0, s.buf[0], n);
            for (size_t i = 0; i < n; i++) {
                double abs_sum, want = reference_sum(&s, i, &abs_sum) * scale;
                cr_assert(fabs(rank0[i] - want) <= 1e-6 * abs_sum + 1e-12,
                          "N=%d n=%zu i=%zu: %.9g, want %.9g", N, n, i, rank0[i], want);
            }
            for (int r = 1; r < N; r++) {
                float *mine = read_back(&s, r, s.buf[r], n);
                cr_assert(memcmp(mine, rank0, n * sizeof(float)) == 0, "N=%d n=%zu: rank %d differs", N, n, r);
                free(mine);
            }
            free(rank0);
            teardown_setup(&s);
        }
}

Test(collectives, reduce_scatter_and_all_gather_match_the_reference) {
    for (int N = 1; N <= 8; N++)
        for (size_t li = 0; li < sizeof LENGTHS / sizeof LENGTHS[0]; li++) {
            size_t n = LENGTHS[li];
            Setup s = setup(N, n, (unsigned)(N * 10 + li + 5));
            float *shard[MAX_RANKS], *gathered[MAX_RANKS];
            for (int r = 0; r < N; r++) {
                shard[r] = device_alloc(s.pg->device[r], MEM_WORKING, s.shard * sizeof(float));
                gathered[r] = device_alloc(s.pg->device[r], MEM_WORKING, N * s.shard * sizeof(float));
            }
            pg_reduce_scatter(s.pg, TEST, s.buf, shard, n, 2.0f, DTYPE_FP32, REDUCE_WRITE, NULL);
            for (int r = 0; r < N; r++) {
                float *got = read_back(&s, r, shard[r], s.shard);
                for (size_t k = 0; k < s.shard && r * s.shard + k < n; k++) {
                    double abs_sum, want = 2.0 * reference_sum(&s, r * s.shard + k, &abs_sum);
                    cr_assert(fabs(got[k] - want) <= 2e-6 * abs_sum + 1e-12, "N=%d n=%zu rank %d", N, n, r);
                }
                free(got);
            }
            /* gathering the reduced shards gives every rank the whole scaled sum */
            pg_all_gather(s.pg, TEST, shard, gathered, n, DTYPE_FP32, NULL);
            float *rank0 = read_back(&s, 0, gathered[0], n);
            for (int r = 0; r < N; r++) {
                float *got = read_back(&s, r, gathered[r], n);
                float *own = read_back(&s, r, shard[r], s.shard);
                cr_assert(memcmp(got, rank0, n * sizeof(float)) == 0, "N=%d n=%zu: rank %d differs", N, n, r);
                size_t len = r * s.shard >= n ? 0 : (n - r * s.shard < s.shard ? n - r * s.shard : s.shard);
                cr_assert(memcmp(rank0 + r * s.shard, own, len * sizeof(float)) == 0);
                free(got);
                free(own);
            }
            free(rank0);
            for (int r = 0; r < N; r++) {
                device_free(s.pg->device[r], MEM_WORKING, shard[r], s.shard * sizeof(float));
                device_free(s.pg->device[r], MEM_WORKING, gathered[r], N * s.shard * sizeof(float));
            }
            teardown_setup(&s);
        }
}

Test(collectives, all_reduce_sums_in_rank_order_every_time) {
    /* the same inputs twice give the same bytes: the order of the sum is fixed */
    Setup a = setup(5, 4097, 77), b = setup(5, 4097, 77);
    pg_all_reduce(a.pg, TEST, a.buf, 4097, 0.2f, DTYPE_FP32, NULL);
    pg_all_reduce(b.pg, TEST, b.buf, 4097, 0.2f, DTYPE_FP32, NULL);
    float *x = read_back(&a, 3, a.buf[3], 4097), *y = read_back(&b, 3, b.buf[3], 4097);
    cr_expect(memcmp(x, y, 4097 * sizeof(float)) == 0);
    free(x);
    free(y);
    teardown_setup(&a);
    teardown_setup(&b);
}

/* ---- the order of every sum, pinned ---- */

/* Odd lengths, so shards are uneven and the last ones short or empty. */
static const size_t ODD_LENGTHS[] = { 1, 7, 1001, 4097 };

/* The setup of the pinned tests: wide inputs, already on the devices. */
static Setup setup_wide(int N, size_t n, unsigned seed) {
    Setup s = setup(N, n, seed);
    for (int r = 0; r < N; r++) {
        fill_wide(s.host[r], n, seed * 100 + r);
        stream_copy(s.pg->compute[r], s.buf[r], s.host[r], n * sizeof(float));
    }
    return s;
}

static void expect_sum_bytes(const float *got, float *const *host, int N, size_t lo, size_t len, float scale,
                             const char *what) {
    for (size_t k = 0; k < len; k++) {
        float want = ordered_sum(host, N, lo + k, scale);
        cr_assert(memcmp(&got[k], &want, sizeof want) == 0, "%s, N=%d: element %zu is %.9g, the ordered sum %.9g",
                  what, N, lo + k, got[k], want);
    }
}

static size_t valid_length(size_t n, size_t shard, int r) {
    size_t lo = (size_t)r * shard;
    return lo >= n ? 0 : (n - lo < shard ? n - lo : shard);
}

/* The inputs really tell orders apart: the reverse order differs somewhere. */
Test(pinned_order, the_inputs_tell_the_orders_apart) {
    Setup s = setup_wide(3, 4097, 11);
    int differs = 0;
    for (size_t i = 0; i < s.n && !differs; i++) {
        float reverse = s.host[2][i];
        reverse += s.host[1][i];
        reverse += s.host[0][i];
        float forward = ordered_sum(s.host, 3, i, 1.0f);
        differs = memcmp(&reverse, &forward, sizeof reverse) != 0;
    }
    cr_expect(differs, "no element's sum depends on the order: the pinned tests could not fail");
    teardown_setup(&s);
}

Test(pinned_order, all_reduce_is_the_ordered_host_sum) {
    const float scales[] = { 1.0f, 0.37f };
    for (int N = 1; N <= 8; N++)
        for (size_t li = 0; li < sizeof ODD_LENGTHS / sizeof ODD_LENGTHS[0]; li++)
            for (int k = 0; k < 2; k++) {
                size_t n = ODD_LENGTHS[li];
                Setup s = setup_wide(N, n, (unsigned)(N * 31 + li * 3 + k));
                pg_all_reduce(s.pg, TEST, s.buf, n, scales[k], DTYPE_FP32, NULL);
                for (int r = 0; r < N; r++) {
                    float *got = read_back(&s, r, s.buf[r], n);
                    expect_sum_bytes(got, s.host, N, 0, n, scales[k], "all-reduce");
                    free(got);
                }
                teardown_setup(&s);
            }
}

/* Into shard buffers of their own, and in place (rank r's shard of its send). */
Test(pinned_order, reduce_scatter_is_the_ordered_host_sum) {
    const float scales[] = { 1.0f, 0.37f };
    for (int N = 1; N <= 8; N++)
        for (size_t li = 0; li < sizeof ODD_LENGTHS / sizeof ODD_LENGTHS[0]; li++)
            for (int k = 0; k < 2; k++)
                for (int in_place = 0; in_place <= 1; in_place++) {
                    size_t n = ODD_LENGTHS[li];
                    Setup s = setup_wide(N, n, (unsigned)(N * 37 + li * 5 + k * 2 + in_place));
                    float *recv[MAX_RANKS];
                    for (int r = 0; r < N; r++)
                        recv[r] = in_place ? s.buf[r] + (size_t)r * s.shard
                                           : device_alloc(s.pg->device[r], MEM_WORKING, s.shard * sizeof(float));
                    /* an empty shard of an in-place call points at the buffer's start, never read */
                    for (int r = 0; r < N; r++)
                        if (in_place && (size_t)r * s.shard >= n) recv[r] = s.buf[r];
                    pg_reduce_scatter(s.pg, TEST, s.buf, recv, n, scales[k], DTYPE_FP32, REDUCE_WRITE, NULL);
                    for (int r = 0; r < N; r++) {
                        size_t len = valid_length(n, s.shard, r);
                        float *got = read_back(&s, r, recv[r], len);
                        expect_sum_bytes(got, s.host, N, (size_t)r * s.shard, len, scales[k],
                                         in_place ? "reduce-scatter in place" : "reduce-scatter");
                        free(got);
                        if (!in_place) device_free(s.pg->device[r], MEM_WORKING, recv[r], s.shard * sizeof(float));
                    }
                    teardown_setup(&s);
                }
}

/* REDUCE_ADD: each rank's shard buffer ends up holding what it held plus the
 * ordered sum, byte for byte (the sum rounded first, as a separate add would
 * round it); with and without done events, and on one rank, where there is
 * nothing to reduce and the add runs alone. */
Test(pinned_order, reduce_scatter_adds_the_ordered_host_sum_into_its_output) {
    const float scales[] = { 1.0f, 0.37f };
    for (int N = 1; N <= 8; N++)
        for (size_t li = 0; li < sizeof ODD_LENGTHS / sizeof ODD_LENGTHS[0]; li++)
            for (int k = 0; k < 2; k++)
                for (int with_done = 0; with_done <= 1; with_done++) {
                    size_t n = ODD_LENGTHS[li];
                    unsigned seed = (unsigned)(N * 43 + li * 7 + k * 2 + with_done);
                    Setup s = setup_wide(N, n, seed);
                    float *recv[MAX_RANKS], *before[MAX_RANKS];
                    Event *done[MAX_RANKS];
                    for (int r = 0; r < N; r++) {
                        before[r] = malloc(s.shard * sizeof(float));
                        fill_wide(before[r], s.shard, seed * 100 + 50 + r);
                        recv[r] = device_alloc(s.pg->device[r], MEM_WORKING, s.shard * sizeof(float));
                        stream_copy(s.pg->compute[r], recv[r], before[r], s.shard * sizeof(float));
                        done[r] = event_create(s.pg->device[r]);
                    }
                    pg_reduce_scatter(s.pg, TEST, s.buf, recv, n, scales[k], DTYPE_FP32, REDUCE_ADD, with_done ? done : NULL);
                    for (int r = 0; r < N; r++) {
                        if (with_done) pg_wait_parts(s.pg, r, s.pg->compute[r], done);
                        size_t len = valid_length(n, s.shard, r);
                        float *got = read_back(&s, r, recv[r], len);
                        for (size_t i = 0; i < len; i++) {
                            float want = before[r][i] + ordered_sum(s.host, N, (size_t)r * s.shard + i, scales[k]);
                            cr_assert(memcmp(&got[i], &want, sizeof want) == 0,
                                      "reduce-scatter adding, N=%d n=%zu: rank %d's element %zu is %.9g, not %.9g",
                                      N, n, r, i, got[i], want);
                        }
                        free(got);
                    }
                    for (int r = 0; r < N; r++) {
                        stream_synchronize(s.pg->comm[r]);
                        device_free(s.pg->device[r], MEM_WORKING, recv[r], s.shard * sizeof(float));
                        event_destroy(done[r]);
                        free(before[r]);
                    }
                    teardown_setup(&s);
                }
}

/* Reductions in bf16 (--reduce-dtype): the all-reduce on every rank, and the
 * reduce-scatter writing and adding (the add in fp32), are the plain loop's
 * bf16 sum, byte for byte, every result a bf16 value; on one rank too, where
 * an fp32 reduction would be skipped. The inputs tell a bf16 sum from an fp32
 * sum rounded once. */
Test(pinned_order, reductions_in_bf16_are_the_ordered_bf16_sum) {
    const float scales[] = { 1.0f, 0.37f };
    int partials_matter = 0;
    for (int N = 1; N <= 8; N++)
        for (size_t li = 0; li < sizeof ODD_LENGTHS / sizeof ODD_LENGTHS[0]; li++)
            for (int k = 0; k < 2; k++) {
                size_t n = ODD_LENGTHS[li];
                unsigned seed = (unsigned)(N * 47 + li * 3 + k);
                Setup s = setup_wide(N, n, seed);
                float *before = malloc(s.shard * sizeof(float)), *added[MAX_RANKS];
                fill_wide(before, s.shard, seed + 5);
                for (int r = 0; r < N; r++) {
                    added[r] = device_alloc(s.pg->device[r], MEM_WORKING, s.shard * sizeof(float));
                    stream_copy(s.pg->compute[r], added[r], before, s.shard * sizeof(float));
                }
                pg_reduce_scatter(s.pg, TEST, s.buf, added, n, scales[k], DTYPE_BF16, REDUCE_ADD, NULL);
                for (int r = 0; r < N; r++) {
                    size_t len = valid_length(n, s.shard, r);
                    float *got = read_back(&s, r, added[r], len);
                    for (size_t i = 0; i < len; i++) {
                        float want = before[i] + ordered_sum_in(DTYPE_BF16, s.host, N, (size_t)r * s.shard + i,
                                                                scales[k]);
                        cr_assert(memcmp(&got[i], &want, sizeof want) == 0, "reduce-scatter adding in bf16, N=%d "
                                  "n=%zu: rank %d's element %zu is %.9g, not %.9g", N, n, r, i, got[i], want);
                    }
                    free(got);
                }
                Setup a = setup_wide(N, n, seed);
                pg_all_reduce(a.pg, TEST, a.buf, n, scales[k], DTYPE_BF16, NULL);
                for (int r = 0; r < N; r++) {
                    float *got = read_back(&a, r, a.buf[r], n);
                    for (size_t i = 0; i < n; i++) {
                        float want = ordered_sum_in(DTYPE_BF16, a.host, N, i, scales[k]);
                        cr_assert(memcmp(&got[i], &want, sizeof want) == 0 && got[i] == float_from_bf16(
                                  bf16_from_float(got[i])), "all-reduce in bf16, N=%d n=%zu: rank %d's element %zu is "
                                  "%.9g, not %.9g", N, n, r, i, got[i], want);
                        float once = float_from_bf16(bf16_from_float(ordered_sum(a.host, N, i, scales[k])));
                        partials_matter |= memcmp(&once, &want, sizeof want) != 0;
                    }
                    free(got);
                }
                teardown_setup(&a);
                for (int r = 0; r < N; r++) {
                    stream_synchronize(s.pg->comm[r]);
                    device_free(s.pg->device[r], MEM_WORKING, added[r], s.shard * sizeof(float));
                }
                free(before);
                teardown_setup(&s);
            }
    cr_expect(partials_matter, "no bf16 sum differs from the fp32 sum rounded once: the test could not fail");
}

/* Reductions of numbers held in bf16 (mixed precision's gradients): the
 * reduce-scatter writing into a buffer of its own and adding (the add in
 * bf16, the sum rounded), and the all-reduce in place, are the plain loop's
 * bf16 sum of the same values, every result stored in 16 bits; on one rank
 * too. */
Test(pinned_order, reductions_of_numbers_held_in_bf16_are_the_ordered_bf16_sum) {
    const float scales[] = { 1.0f, 0.37f };
    for (int N = 1; N <= 8; N++)
        for (size_t li = 0; li < sizeof ODD_LENGTHS / sizeof ODD_LENGTHS[0]; li++)
            for (int k = 0; k < 2; k++) {
                size_t n = ODD_LENGTHS[li];
                unsigned seed = (unsigned)(N * 53 + li * 3 + k);
                Setup s = setup_wide(N, n, seed);  /* fp32 inputs, rounded below into bf16 ones */
                bf16 *held = malloc(n * sizeof(bf16)), *before = malloc(s.shard * sizeof(bf16));
                bf16 *buf[MAX_RANKS], *written[MAX_RANKS], *added[MAX_RANKS];
                for (size_t i = 0; i < s.shard; i++) before[i] = bf16_from_float((float)i * 0.01f - 3.0f);
                for (int r = 0; r < N; r++) {
                    for (size_t i = 0; i < n; i++) {
                        held[i] = bf16_from_float(s.host[r][i]);
                        s.host[r][i] = float_from_bf16(held[i]);  /* the values the reference sums */
                    }
                    buf[r] = device_alloc(s.pg->device[r], MEM_WORKING, n * sizeof(bf16));
                    written[r] = device_alloc(s.pg->device[r], MEM_WORKING, s.shard * sizeof(bf16));
                    added[r] = device_alloc(s.pg->device[r], MEM_WORKING, s.shard * sizeof(bf16));
                    stream_copy(s.pg->compute[r], buf[r], held, n * sizeof(bf16));
                    stream_copy(s.pg->compute[r], added[r], before, s.shard * sizeof(bf16));
                    stream_synchronize(s.pg->compute[r]);
                }
                pg_reduce_scatter_bf16(s.pg, TEST, buf, written, n, scales[k], REDUCE_WRITE, NULL);
                pg_reduce_scatter_bf16(s.pg, TEST, buf, added, n, scales[k], REDUCE_ADD, NULL);
                for (int r = 0; r < N; r++) {  /* REDUCE_ADD reduced into buf's own shard: the inputs again */
                    for (size_t i = 0; i < n; i++) held[i] = bf16_from_float(s.host[r][i]);
                    stream_copy(s.pg->compute[r], buf[r], held, n * sizeof(bf16));
                    stream_synchronize(s.pg->compute[r]);
                }
                pg_all_reduce_bf16(s.pg, TEST, buf, n, scales[k], NULL);
                for (int r = 0; r < N; r++) {
                    bf16 *got_written = malloc(s.shard * sizeof(bf16)), *got_added = malloc(s.shard * sizeof(bf16));
                    stream_copy(s.pg->compute[r], got_written, written[r], s.shard * sizeof(bf16));
                    stream_copy(s.pg->compute[r], got_added, added[r], s.shard * sizeof(bf16));
                    stream_copy(s.pg->compute[r], held, buf[r], n * sizeof(bf16));
                    stream_synchronize(s.pg->compute[r]);
                    for (size_t i = 0; i < valid_length(n, s.shard, r); i++) {
                        float sum = ordered_sum_in(DTYPE_BF16, s.host, N, (size_t)r * s.shard + i, scales[k]);
                        bf16 want = bf16_from_float(sum);
                        bf16 want_added = bf16_from_float(float_from_bf16(before[i]) + sum);
                        cr_assert_eq(got_written[i], want, "bf16-held reduce-scatter, N=%d n=%zu: rank %d's element "
                                     "%zu is 0x%04x, not 0x%04x", N, n, r, i, got_written[i], want);
                        cr_assert_eq(got_added[i], want_added, "bf16-held reduce-scatter adding, N=%d n=%zu: rank %d's "
                                     "element %zu is 0x%04x, not 0x%04x", N, n, r, i, got_added[i], want_added);
                    }
                    for (size_t i = 0; i < n; i++) {
                        bf16 want = bf16_from_float(ordered_sum_in(DTYPE_BF16, s.host, N, i, scales[k]));
                        cr_assert_eq(held[i], want, "bf16-held all-reduce, N=%d n=%zu: rank %d's element %zu is "
                                     "0x%04x, not 0x%04x", N, n, r, i, held[i], want);
                    }
                    free(got_written);
                    free(got_added);
                }
                for (int r = 0; r < N; r++) {
                    stream_synchronize(s.pg->comm[r]);
                    device_free(s.pg->device[r], MEM_WORKING, buf[r], n * sizeof(bf16));
                    device_free(s.pg->device[r], MEM_WORKING, written[r], s.shard * sizeof(bf16));
                    device_free(s.pg->device[r], MEM_WORKING, added[r], s.shard * sizeof(bf16));
                }
                free(held);
                free(before);
                teardown_setup(&s);
            }
}

/* Every rank's buffer ends up holding every rank's shard, byte for byte: into
 * buffers of their own, and in place (each rank's shard already in its buffer);
 * in bf16, each shard rounded to bf16 (bf16.h's rounding of every float), on
 * inputs that are not bf16 values. */
Test(pinned_order, all_gather_copies_every_shard_exactly) {
    size_t rounded = 0;
    for (int p = 0; p < DTYPES; p++)
        for (int N = 1; N <= 8; N++)
            for (size_t li = 0; li < sizeof ODD_LENGTHS / sizeof ODD_LENGTHS[0]; li++)
                for (int in_place = 0; in_place <= 1; in_place++) {
                    size_t n = ODD_LENGTHS[li];
                    Setup s = setup_wide(N, n, (unsigned)(N * 41 + li * 2 + in_place));
                    float *send[MAX_RANKS], *recv[MAX_RANKS];
                    for (int r = 0; r < N; r++) {
                        size_t lo = (size_t)r * s.shard < n ? (size_t)r * s.shard : 0;
                        send[r] = in_place ? s.buf[r] + lo : s.buf[r];
                        recv[r] = in_place ? s.buf[r]
                                           : device_alloc(s.pg->device[r], MEM_WORKING, N * s.shard * sizeof(float));
                    }
                    /* not in place, rank q sends the first shard-length of its input */
                    pg_all_gather(s.pg, TEST, send, recv, n, (DType)p, NULL);
                    for (int r = 0; r < N; r++) {
                        float *got = read_back(&s, r, recv[r], n);
                        for (int q = 0; q < N; q++) {
                            size_t len = valid_length(n, s.shard, q), at = (size_t)q * s.shard;
                            const float *sent = s.host[q] + (in_place ? at : 0);
                            for (size_t k = 0; k < len; k++) {
                                float want = p == DTYPE_BF16 ? bf16_rounded(sent[k]) : sent[k];
                                cr_assert(memcmp(&got[at + k], &want, sizeof want) == 0,
                                          "all-gather%s in %s, N=%d n=%zu: rank %d's copy of rank %d's shard "
                                          "differs at %zu", in_place ? " in place" : "", p ? "bf16" : "fp32", N, n,
                                          r, q, k);
                                rounded += want != sent[k];
                            }
                        }
                        free(got);
                        if (!in_place) device_free(s.pg->device[r], MEM_WORKING, recv[r], N * s.shard * sizeof(float));
                    }
                    teardown_setup(&s);
                }
    cr_expect_gt(rounded, 0, "every input was a bf16 value already: the bf16 gather could not fail");
}

/* The gather of numbers held in bf16 moves every shard's 16 bits as they are,
 * NaN payloads and all (no rounding, no widening): into buffers of their own
 * and in place, at every N and odd length. */
Test(pinned_order, all_gather_bf16_moves_every_shard_bit_for_bit) {
    for (int N = 1; N <= 8; N++)
        for (size_t li = 0; li < sizeof ODD_LENGTHS / sizeof ODD_LENGTHS[0]; li++)
            for (int in_place = 0; in_place <= 1; in_place++) {
                size_t n = ODD_LENGTHS[li];
                unsigned seed = (unsigned)(N * 43 + li * 2 + in_place);
                Setup s = setup(N, n, seed);
                size_t gathered = (size_t)N * s.shard;
                bf16 *full[MAX_RANKS], *own[MAX_RANKS] = { 0 }, *send[MAX_RANKS];
                bf16 *host = calloc(gathered + 1, sizeof(bf16));
                for (int r = 0; r < N; r++) {
                    size_t lo = (size_t)r * s.shard < n ? (size_t)r * s.shard : 0;
                    for (size_t k = 0; k < gathered; k++) host[k] = bf16_pattern(seed * 100 + (unsigned)r, k);
                    full[r] = device_alloc(s.pg->device[r], MEM_WORKING, gathered * sizeof(bf16));
                    stream_copy(s.pg->compute[r], full[r], host, gathered * sizeof(bf16));
                    if (!in_place) {  /* rank r sends the first shard-length of its own pattern */
                        own[r] = device_alloc(s.pg->device[r], MEM_WORKING, s.shard * sizeof(bf16));
                        stream_copy(s.pg->compute[r], own[r], host, s.shard * sizeof(bf16));
                    }
                    send[r] = in_place ? full[r] + lo : own[r];
                    stream_synchronize(s.pg->compute[r]);
                }
                pg_all_gather_bf16(s.pg, TEST, send, full, n, NULL);
                for (int r = 0; r < N; r++) {
                    stream_copy(s.pg->compute[r], host, full[r], n * sizeof(bf16));
                    stream_synchronize(s.pg->compute[r]);
                    for (int q = 0; q < N; q++) {
                        size_t len = valid_length(n, s.shard, q), at = (size_t)q * s.shard;
                        for (size_t k = 0; k < len; k++) {
                            bf16 want = bf16_pattern(seed * 100 + (unsigned)q, (in_place ? at : 0) + k);
                            cr_assert_eq(host[at + k], want, "bf16 all-gather%s, N=%d n=%zu: rank %d's copy of "
                                         "rank %d's shard is 0x%04x at %zu, want 0x%04x", in_place ? " in place" : "",
                                         N, n, r, q, host[at + k], k, want);
                        }
                    }
                }
                for (int r = 0; r < N; r++) {
                    device_free(s.pg->device[r], MEM_WORKING, full[r], gathered * sizeof(bf16));
                    if (own[r]) device_free(s.pg->device[r], MEM_WORKING, own[r], s.shard * sizeof(bf16));
                }
                free(host);
                teardown_setup(&s);
            }
}

/* ---- rank threads ---- */

enum { LOG_MAX = 4096 };

typedef struct {
    int units;
    int log[LOG_MAX];        /* rank * 100 + unit for work, 10000 + unit for a collective */
    int len;
    int fail_rank, fail_unit;  /* rank that fails at the start of a unit (-1: none) */
    int skip_rank, skip_unit;  /* rank that skips a unit's rendezvous (-1: none) */
    int extra_rank;            /* rank that does one more rendezvous (-1: none) */
} Script;

static int scripted_body(RankThreads *f, int rank, void *ctx) {
    Script *s = ctx;
    int units = s->units + (rank == s->extra_rank);
    for (int u = 0; u < units; u++) {
        if (rank == s->fail_rank && u == s->fail_unit) return rank_threads_fail(f, rank, "injected failure at unit %d", u);
        s->log[s->len++] = rank * 100 + u;  /* only the baton holder runs: no race */
        if (rank == s->skip_rank && u == s->skip_unit) continue;
        char name[RENDEZVOUS_NAME_MAX];
        snprintf(name, sizeof name, "unit %d", u);
        int rc = rank_threads_arrive(f, rank, name);
        if (rc < 0) return -1;
        if (rc == 1) {
            s->log[s->len++] = 10000 + u;
            if (rank_threads_depart(f, rank) < 0) return -1;
        }
    }
    return 0;
}

static Script script(int units) {
    Script s;
    memset(&s, 0, sizeof s);
    s.units = units;
    s.fail_rank = s.skip_rank = s.extra_rank = -1;
    return s;
}

Test(rank_threads, enqueue_order_is_block_major_and_deterministic, .timeout = 20) {
    int N = 4, U = 3;
    RankThreads *f = rank_threads_create(N);
    for (int run = 0; run < 3; run++) {
        Script s = script(U);
        cr_assert_eq(rank_threads_run(f, scripted_body, &s), 0, "%s", rank_threads_error(f));
        int k = 0;
        for (int u = 0; u < U; u++) {
            for (int r = 0; r < N; r++) cr_assert_eq(s.log[k++], r * 100 + u, "run %d entry %d", run, k - 1);
            cr_assert_eq(s.log[k++], 10000 + u);
        }
        cr_assert_eq(s.len, k);
    }
    rank_threads_destroy(f);
}

Test(rank_threads, an_error_in_any_rank_ends_the_run_naming_it, .timeout = 30) {
    int N = 4;
    RankThreads *f = rank_threads_create(N);
    for (int bad = 0; bad < N; bad++)
        for (int unit = 0; unit < 3; unit++) {
            Script s = script(3);
            s.fail_rank = bad;
            s.fail_unit = unit;
            cr_assert_eq(rank_threads_run(f, scripted_body, &s), -1);
            cr_expect_eq(rank_threads_error_rank(f), bad);
            cr_expect(strstr(rank_threads_error(f), "injected failure") != NULL, "%s", rank_threads_error(f));
            char prefix[32];
            snprintf(prefix, sizeof prefix, "rank %d: ", bad);
            cr_expect(strncmp(rank_threads_error(f), prefix, strlen(prefix)) == 0, "%s", rank_threads_error(f));
        }
    /* after a failed run the same rank threads run cleanly again */
    Script ok = script(2);
    cr_expect_eq(rank_threads_run(f, scripted_body, &ok), 0, "%s", rank_threads_error(f));
    rank_threads_destroy(f);
}

Test(rank_threads, a_skipped_rendezvous_is_a_mismatch_not_a_hang, .timeout = 30) {
    int N = 3;
    RankThreads *f = rank_threads_create(N);
    for (int r = 0; r < N; r++) {
        Script s = script(3);
        s.skip_rank = r;
        s.skip_unit = 1;
        cr_assert_eq(rank_threads_run(f, scripted_body, &s), -1);
        const char *e = rank_threads_error(f);
        cr_expect(strstr(e, "mismatch") && strstr(e, "'unit 1'") && strstr(e, "'unit 2'"),
                  "the error names both rendezvous: %s", e);
    }
    for (int r = 0; r < N; r++) {
        Script s = script(2);
        s.extra_rank = r;  /* one rank waits at a rendezvous the others never reach */
        cr_assert_eq(rank_threads_run(f, scripted_body, &s), -1);
        cr_expect(strstr(rank_threads_error(f), "mismatch") != NULL, "%s", rank_threads_error(f));
    }
    rank_threads_destroy(f);
}

/* Each rank's thread lives for the rank threads, not for a run: every run of a rank
 * is on the same thread, and the ranks' threads differ. */
typedef struct { pthread_t thread[2][MAX_RANKS]; int run; } ThreadLog;

static int note_thread(RankThreads *f, int rank, void *ctx) {
    (void)f;
    ThreadLog *log = ctx;
    log->thread[log->run][rank] = pthread_self();
    return 0;
}

Test(rank_threads, each_rank_keeps_its_thread_from_run_to_run, .timeout = 20) {
    int N = 5;
    RankThreads *f = rank_threads_create(N);
    ThreadLog log = { .run = 0 };
    cr_assert_eq(rank_threads_run(f, note_thread, &log), 0);
    log.run = 1;
    cr_assert_eq(rank_threads_run(f, note_thread, &log), 0);
    for (int r = 0; r < N; r++) {
        cr_expect(pthread_equal(log.thread[0][r], log.thread[1][r]), "rank %d ran on another thread", r);
        for (int q = 0; q < r; q++) cr_expect(!pthread_equal(log.thread[0][r], log.thread[0][q]), "ranks %d and %d", q, r);
    }
    rank_threads_destroy(f);
}

Test(rank_threads, sixty_four_ranks, .timeout = 60) {
    RankThreads *f = rank_threads_create(MAX_RANKS);
    Script s = script(5);
    cr_assert_eq(rank_threads_run(f, scripted_body, &s), 0, "%s", rank_threads_error(f));
    cr_expect_eq(s.len, 5 * (MAX_RANKS + 1));
    cr_expect_eq(s.log[MAX_RANKS], 10000, "the first collective follows every rank's first unit");
    rank_threads_destroy(f);
    cr_expect_null(rank_threads_create(0));
    cr_expect_null(rank_threads_create(MAX_RANKS + 1));
}
