/* test_gpu.c: the GPU backend against the CPU backend, and what the GPU alone
 * can get wrong.
 *
 * Every op of kernels.h on the GPU against the same op on the CPU (fp32:
 * relative error below 1e-5 for elementwise ops, 1e-4 for matmuls and
 * reductions; the fused cross-entropy the CPU's bytes); a small GPT trained 20 steps on each. Then the gates on the
 * one-GPU simulator (forced: never NCCL, however many GPUs there are): the
 * four strategies bit-identical at N = 2 and 3; overlap on and off bit-identical
 * with 2 micro-steps for every strategy; clipping (every stage DDP's bytes, the
 * norm summed exactly); two identical runs bit-identical; a trace stamped by CUDA events. NCCL
 * against the simulator, bit for bit: at N = 1, both ways of summing; at N = 2
 * where two GPUs are there, both (a sum of two is the same in any order); at
 * N = 3 where three are, the ordered sums (suite gpu_nccl). In children of
 * their own (suite gpu_processes): the NCCL watchdog ending a run whose
 * collective is stuck past --timeout; a file rendezvous that never comes; two
 * processes joined through a file (where two GPUs are), their ordered sums
 * against the host's. Without a GPU the suite
 * prints one SKIP line; with ZF_REQUIRE_GPU=1 (tools/gpu_check.sh) a missing
 * GPU fails instead.
 */
#include <criterion/criterion.h>
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <signal.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "../kernels/kernels.h"
#include "../kernels/packs.h"
#include "../runtime/trace.h"
#include "../runtime/world.h"
#include "../training/trainer.h"
#include "fixtures.h"
#include "reference.h"

static Device *gpu;
/* The collectives' name here, in their spans and lines: "all-reduce test". */
static const CollectiveName TEST = { "test", -1, -1 };
static Stream *gpu_stream;

static void setup(void) {
    test_stream_setup();
    if (device_cuda_count() > 0) {  /* < 0: CUDA failed, and need_gpu fails */
        gpu = device_create_cuda(0);
        gpu_stream = stream_create(gpu);
    }
}

static void teardown(void) {
    stream_destroy(gpu_stream);
    device_destroy(gpu);
    test_stream_teardown();
}

TestSuite(gpu, .init = setup, .fini = teardown);

/* One line for the whole suite, before it runs, where no GPU is there. */
ReportHook(PRE_ALL)(struct criterion_test_set *tests) {
    (void)tests;
    if (device_cuda_count() == 0 && !getenv("ZF_REQUIRE_GPU"))
        printf("SKIP: test_gpu: no GPU visible (or a build without CUDA); every GPU test is skipped\n");
    fflush(stdout);
}

static void need_gpu(void) {
    if (gpu) return;
    if (device_cuda_count() < 0) cr_assert_fail("CUDA is there but failed (its error is printed above)");
    if (getenv("ZF_REQUIRE_GPU")) cr_assert_fail("ZF_REQUIRE_GPU is set, and no GPU is visible to this build");
    cr_skip_test("SKIP: no GPU visible (or a build without CUDA): the GPU tests did not run");
}

static const double ELEMENTWISE_TOL = 1e-5, REDUCTION_TOL = 1e-4;

/* The same data on the CPU (host memory) and on the GPU. */
typedef struct { float *cpu, *gpu; size_t n; } Pair;

static Pair pair_random(size_t n, float lo, float hi, unsigned seed) {
    Pair p = { malloc(n * sizeof(float)), device_alloc(gpu, MEM_WORKING, n * sizeof(float)), n };
    fill_uniform(p.cpu, n, lo, hi, seed);
    stream_copy(gpu_stream, p.gpu, p.cpu, n * sizeof(float));
    stream_synchronize(gpu_stream);
    return p;
}

static void pair_free(Pair p) {
    free(p.cpu);
    device_free(gpu, MEM_WORKING, p.gpu, p.n * sizeof(float));
}

typedef struct { int *cpu, *gpu; size_t n; } IntPair;

static IntPair tokens_random(size_t n, int V, unsigned seed) {
    IntPair p = { malloc(n * sizeof(int)), device_alloc(gpu, MEM_WORKING, n * sizeof(int)), n };
    for (size_t i = 0; i < n; i++) p.cpu[i] = (int)((i * 2654435761u + seed * 40503u) % (unsigned)V);
    stream_copy(gpu_stream, p.gpu, p.cpu, n * sizeof(int));
    stream_synchronize(gpu_stream);
    return p;
}

static void int_pair_free(IntPair p) {
    free(p.cpu);
    device_free(gpu, MEM_WORKING, p.gpu, p.n * sizeof(int));
}

/* A batch's buckets copied to the GPU: its arrays in one allocation. */
typedef struct { TokenBuckets view; int *memory; size_t ints; } GpuBuckets;

static GpuBuckets gpu_buckets(TokenBuckets host, int BT) {
    GpuBuckets g = { host, NULL, 3 * (size_t)BT + 1 };
    g.memory = device_alloc(gpu, MEM_WORKING, g.ints * sizeof(int));
    g.view.token = g.memory;
    g.view.start = g.memory + BT;
    g.view.positions = g.memory + 2 * BT + 1;
    stream_copy(gpu_stream, g.view.token, host.token, (size_t)host.ntokens * sizeof(int));
    stream_copy(gpu_stream, g.view.start, host.start, ((size_t)host.ntokens + 1) * sizeof(int));
    stream_copy(gpu_stream, g.view.positions, host.positions, (size_t)BT * sizeof(int));
    stream_synchronize(gpu_stream);
    return g;
}

static void gpu_buckets_free(GpuBuckets g) { device_free(gpu, MEM_WORKING, g.memory, g.ints * sizeof(int)); }

/* The GPU's copy's error against the CPU's, after both streams are done. */
static double gpu_error(Pair p, double (*error)(const float *got, const double *want, size_t n)) {
    stream_synchronize(test_stream);
    float *got = malloc(p.n * sizeof(float));
    stream_copy(gpu_stream, got, p.gpu, p.n * sizeof(float));
    stream_synchronize(gpu_stream);
    double *want = to_double(p.cpu, p.n);
    double e = error(got, want, p.n);
    free(got);
    free(want);
    return e;
}

/* The GPU's copy against the CPU's, element by element (rel_error). */
static void expect_match(Pair p, double tol, const char *what) {
    double e = gpu_error(p, rel_error);
    cr_expect_lt(e, tol, "%s: GPU against CPU, relative error %g (tolerance %g)", what, e, tol);
}

/* The first `bytes` of p's GPU buffer against its CPU buffer, byte for byte. */
static void expect_same_bytes(Pair p, size_t bytes, const char *what) {
    unsigned char *got = malloc(bytes);
    stream_copy(gpu_stream, got, p.gpu, bytes);
    stream_synchronize(gpu_stream);
    stream_synchronize(test_stream);
    cr_expect_eq(memcmp(got, p.cpu, bytes), 0, "%s", what);
    free(got);
}

/* n bf16 outputs each within one bf16 step of the fp32 ones (2^-7 of each,
 * at least): a product into bf16, where cuBLASLt may pick another kernel than
 * for an fp32 output, so another order of the fp32 sum. */
static void expect_within_a_bf16_step(const bf16 *got, const float *want, size_t n, const char *what) {
    size_t apart = 0;
    for (size_t i = 0; i < n; i++)
        apart += fabsf(float_from_bf16(got[i]) - want[i]) > ldexpf(fabsf(want[i]), -7) + 1e-6f;
    cr_expect_eq(apart, 0, "%s: %zu of %zu numbers past one bf16 step of fp32's", what, apart, n);
}

/* The GPU's copy of p into its CPU side: what later runs must give, byte for
 * byte (expect_same_bytes). */
static void pair_take_gpu(Pair p) {
    stream_copy(gpu_stream, p.cpu, p.gpu, p.n * sizeof(float));
    stream_synchronize(gpu_stream);
}

/* p's values rounded to bf16, on both sides. */
static void pair_round_to_bf16(Pair p) {
    for (size_t i = 0; i < p.n; i++) p.cpu[i] = bf16_rounded(p.cpu[i]);
    stream_copy(gpu_stream, p.gpu, p.cpu, p.n * sizeof(float));
    stream_synchronize(gpu_stream);
}

/* A Linear's products, fp32's (sgemm on both sides), or of bf16 values
 * (the GPU's bf16 tensor cores through cuBLASLt, against the CPU's sgemm). */
static void check_matmul(DType p) {
    int N = 74, C = 48, OC = 80;
    Pair inp = pair_random((size_t)N * C, -1, 1, 1), w = pair_random((size_t)OC * C, -1, 1, 2);
    Pair out = pair_random((size_t)N * OC, -1, 1, 3), dout = pair_random((size_t)N * OC, -1, 1, 4);
    Pair dinp = pair_random((size_t)N * C, -1, 1, 5), dw = pair_random((size_t)OC * C, -1, 1, 6);
    if (p == DTYPE_BF16) {
        pair_round_to_bf16(inp);
        pair_round_to_bf16(w);
        pair_round_to_bf16(dout);
        matmul_forward_bf16(test_stream, fp32_buf(out.cpu), fp32_numbers(inp.cpu), fp32_numbers(w.cpu),
                            fp32_numbers(NULL), N, C, OC);
        matmul_forward_bf16(gpu_stream, fp32_buf(out.gpu), fp32_numbers(inp.gpu), fp32_numbers(w.gpu),
                            fp32_numbers(NULL), N, C, OC);
        matmul_backward_bf16(test_stream, fp32_buf(dinp.cpu), fp32_buf(dw.cpu), fp32_numbers(dout.cpu),
                             fp32_numbers(inp.cpu), fp32_numbers(w.cpu), N, C, OC);
        matmul_backward_bf16(gpu_stream, fp32_buf(dinp.gpu), fp32_buf(dw.gpu), fp32_numbers(dout.gpu),
                             fp32_numbers(inp.gpu), fp32_numbers(w.gpu), N, C, OC);
    } else {
        matmul_forward(test_stream, out.cpu, inp.cpu, w.cpu, N, C, OC);
        matmul_forward(gpu_stream, out.gpu, inp.gpu, w.gpu, N, C, OC);
        matmul_backward(test_stream, dinp.cpu, dw.cpu, dout.cpu, inp.cpu, w.cpu, N, C, OC);
        matmul_backward(gpu_stream, dinp.gpu, dw.gpu, dout.gpu, inp.gpu, w.gpu, N, C, OC);
    }
    expect_match(out, REDUCTION_TOL, "matmul out");
    expect_match(dinp, REDUCTION_TOL, "matmul dinp");
    expect_match(dw, REDUCTION_TOL, "matmul dweight (added)");
    if (p == DTYPE_BF16) {  /* the weight gradient written into bf16 (a Linear's): the fp32 sums from zero, rounded */
        size_t nw = (size_t)OC * C;
        Pair dw16 = pair_random(nw / 2 + 1, 1, 2, 7);  /* not zero: it is written, not added into */
        bf16 *got = malloc(nw * sizeof(bf16));
        memset(dw.cpu, 0, nw * sizeof(float));
        matmul_backward_bf16(test_stream, fp32_buf(dinp.cpu), fp32_buf(dw.cpu), fp32_numbers(dout.cpu),
                             fp32_numbers(inp.cpu), fp32_numbers(w.cpu), N, C, OC);
        stream_synchronize(test_stream);
        matmul_backward_bf16(gpu_stream, fp32_buf(dinp.gpu), bf16_buf((bf16 *)dw16.gpu), fp32_numbers(dout.gpu),
                             fp32_numbers(inp.gpu), fp32_numbers(w.gpu), N, C, OC);
        stream_copy(gpu_stream, got, dw16.gpu, nw * sizeof(bf16));
        stream_synchronize(gpu_stream);
        expect_within_a_bf16_step(got, dw.cpu, nw, "matmul dweight written into bf16");
        free(got);
        pair_free(dw16);
    }
    pair_free(inp); pair_free(w); pair_free(out); pair_free(dout); pair_free(dinp); pair_free(dw);
}

Test(gpu, matmul_forward_backward) {
    need_gpu();
    check_matmul(DTYPE_FP32);
}

Test(gpu, matmul_of_bf16_values_on_the_tensor_cores) {
    need_gpu();
    check_matmul(DTYPE_BF16);
}

/* n bf16 numbers of a fresh GPU buffer from its second on (2-byte aligned,
 * as a row of an odd width may start an operand), stored from p's values. */
static bf16 *bf16_past_one(Pair room, Pair p) {
    bf16 *at = (bf16 *)room.gpu + 1;
    store_bf16(gpu_stream, at, p.gpu, p.n);
    return at;
}

/* A bf16 product whose operands and outputs all start 2 bytes past a
 * boundary (its bias on one, as a model's tensors are): cuBLASLt told so
 * (product_alignment) picks an algorithm that reads them there; the outputs
 * in bf16 within a bf16 step of the CPU's fp32
 * sums and the weight gradient near them, the same bytes on each of three
 * runs (the algorithm chosen once for the shape). */
Test(gpu, a_bf16_product_of_operands_two_bytes_past_a_boundary) {
    need_gpu();
    int N = 37, C = 20, OC = 24;
    size_t nx = (size_t)N * C, nw = (size_t)OC * C, no = (size_t)N * OC;
    Pair x = pair_random(nx, -1, 1, 171), w = pair_random(nw, -1, 1, 172), bias = pair_random((size_t)OC, -1, 1, 173);
    Pair dout = pair_random(no, -1, 1, 174), out = pair_random(no, 0, 1, 175), dinp = pair_random(nx, 0, 1, 176);
    Pair dw = pair_random(nw, 0, 1, 177);
    pair_round_to_bf16(x); pair_round_to_bf16(w); pair_round_to_bf16(bias); pair_round_to_bf16(dout);
    Pair room[6];
    size_t sizes[6] = { nx, nw, (size_t)OC, no, no, nx };
    for (int i = 0; i < 6; i++) room[i] = pair_random(sizes[i] / 2 + 1, 0, 1, 178 + (unsigned)i);
    const bf16 *x16 = bf16_past_one(room[0], x), *w16 = bf16_past_one(room[1], w), *b16 = (const bf16 *)room[2].gpu;
    store_bf16(gpu_stream, (bf16 *)room[2].gpu, bias.gpu, (size_t)OC);
    const bf16 *dout16 = bf16_past_one(room[3], dout);
    bf16 *out16 = (bf16 *)room[4].gpu + 1, *dinp16 = (bf16 *)room[5].gpu + 1;
    matmul_forward_bf16(test_stream, fp32_buf(out.cpu), fp32_numbers(x.cpu), fp32_numbers(w.cpu),
                        fp32_numbers(bias.cpu), N, C, OC);
    fill_zero(test_stream, dw.cpu, nw);
    matmul_backward_bf16(test_stream, fp32_buf(dinp.cpu), fp32_buf(dw.cpu), fp32_numbers(dout.cpu), fp32_numbers(x.cpu),
                         fp32_numbers(w.cpu), N, C, OC);
    stream_synchronize(test_stream);
    bf16 *first = malloc((no + nx) * sizeof(bf16)), *again = malloc((no + nx) * sizeof(bf16));
    float *dw_runs[2] = { malloc(nw * sizeof(float)), malloc(nw * sizeof(float)) };
    for (int run = 0; run < 3; run++) {
        bf16 *got = run ? again : first;
        matmul_forward_bf16(gpu_stream, bf16_buf(out16), bf16_numbers(x16), bf16_numbers(w16), bf16_numbers(b16), N,
                            C, OC);
        fill_zero(gpu_stream, dw.gpu, nw);
        matmul_backward_bf16(gpu_stream, bf16_buf(dinp16), fp32_buf(dw.gpu), bf16_numbers(dout16), bf16_numbers(x16),
                             bf16_numbers(w16), N, C, OC);
        stream_copy(gpu_stream, got, out16, no * sizeof(bf16));
        stream_copy(gpu_stream, got + no, dinp16, nx * sizeof(bf16));
        stream_copy(gpu_stream, dw_runs[run > 0], dw.gpu, nw * sizeof(float));
        stream_synchronize(gpu_stream);
        if (run == 0) continue;
        cr_expect_eq(memcmp(first, again, (no + nx) * sizeof(bf16)), 0, "run %d: other bf16 outputs", run + 1);
        cr_expect_eq(memcmp(dw_runs[0], dw_runs[1], nw * sizeof(float)), 0, "run %d: another weight gradient",
                     run + 1);
    }
    expect_within_a_bf16_step(first, out.cpu, no, "the forward with its bias, 2 bytes past a boundary");
    expect_within_a_bf16_step(first + no, dinp.cpu, nx, "dinp, 2 bytes past a boundary");
    expect_match(dw, REDUCTION_TOL, "the weight gradient, from operands 2 bytes past a boundary");
    free(first); free(again); free(dw_runs[0]); free(dw_runs[1]);
    for (int i = 0; i < 6; i++) pair_free(room[i]);
    pair_free(x); pair_free(w); pair_free(bias); pair_free(dout); pair_free(out); pair_free(dinp); pair_free(dw);
}

Test(gpu, layernorm_forward_backward) {
    need_gpu();
    int N = 300, C = 48;  /* more rows than one part of the weight-gradient sum */
    Pair inp = pair_random((size_t)N * C, -2, 2, 11), w = pair_random((size_t)C, 0.5f, 1.5f, 12);
    Pair out = pair_random((size_t)N * C, -1, 1, 13), mean = pair_random((size_t)N, 0, 1, 14);
    Pair rstd = pair_random((size_t)N, 0, 1, 15), dout = pair_random((size_t)N * C, -1, 1, 16);
    Pair dinp = pair_random((size_t)N * C, -1, 1, 17), dw = pair_random((size_t)C, -1, 1, 18);
    layernorm_forward(test_stream, fp32_buf(out.cpu), mean.cpu, rstd.cpu, fp32_numbers(inp.cpu), fp32_numbers(w.cpu),
                      fp32_numbers(NULL), N, C, DTYPE_FP32);
    layernorm_forward(gpu_stream, fp32_buf(out.gpu), mean.gpu, rstd.gpu, fp32_numbers(inp.gpu), fp32_numbers(w.gpu),
                      fp32_numbers(NULL), N, C, DTYPE_FP32);
    Pair scratch = pair_random(column_sums_scratch_floats(N, C), -1, 1, 19);
    layernorm_backward(test_stream, fp32_buf(dinp.cpu), fp32_buf(dw.cpu), fp32_buf(NULL), fp32_numbers(dout.cpu),
                       fp32_numbers(inp.cpu), fp32_numbers(w.cpu), mean.cpu, rstd.cpu, N, C, scratch.cpu, DTYPE_FP32);
    layernorm_backward(gpu_stream, fp32_buf(dinp.gpu), fp32_buf(dw.gpu), fp32_buf(NULL), fp32_numbers(dout.gpu),
                       fp32_numbers(inp.gpu), fp32_numbers(w.gpu), mean.gpu, rstd.gpu, N, C, scratch.gpu, DTYPE_FP32);
    expect_match(out, REDUCTION_TOL, "layernorm out");
    expect_match(rstd, REDUCTION_TOL, "layernorm rstd");
    expect_match(dinp, REDUCTION_TOL, "layernorm dinp (added)");
    expect_match(dw, REDUCTION_TOL, "layernorm dweight (added)");
    pair_free(inp); pair_free(w); pair_free(out); pair_free(mean); pair_free(rstd); pair_free(dout);
    pair_free(dinp); pair_free(dw); pair_free(scratch);
}

/* p's GPU buffer set back to its CPU buffer's bytes (a gradient's start, again). */
static void pair_reset(Pair p, const float *start) {
    memcpy(p.cpu, start, p.n * sizeof(float));
    stream_copy(gpu_stream, p.gpu, start, p.n * sizeof(float));
    stream_synchronize(gpu_stream);
}

/* n bf16 numbers on the GPU against fp32 ones on the host, stored. */
static void expect_stored_bytes(const void *gpu16, const float *want, size_t n, const char *what) {
    bf16 *got = malloc(n * sizeof(bf16));
    stream_copy(gpu_stream, got, gpu16, n * sizeof(bf16));
    stream_synchronize(gpu_stream);
    size_t bad = 0;
    for (size_t i = 0; i < n; i++) bad += got[i] != bf16_from_float(want[i]);
    cr_expect_eq(bad, 0, "%s: %zu of %zu numbers not the fp32 output's stored", what, bad, n);
    free(got);
}

/* LayerNorm with its bias, and the residual add fused before it, at GPT-2's
 * shape in bf16: on each of three runs the bytes of the GPU's unfused ops
 * (residual_forward, then layernorm_forward without a bias, then
 * bias_forward): sum, output, mean and rstd; and written in bf16 (where a
 * model keeps them), the bytes of those outputs stored, and so a Linear's
 * bias after its product, dropout's and the embeddings'; from a bf16 input
 * (the residual stream, as a bf16 model holds it) the residual add's,
 * LayerNorm's and the fused add's bytes from its fp32 values. */
Test(gpu, residual_and_layernorm_with_its_bias_are_the_unfused_ops_bytes_at_gpt2s_shape, .timeout = 300) {
    need_gpu();
    int N = 12 * 1024 + 77, C = 768;
    size_t n = (size_t)N * C;
    Pair a = pair_random(n, -2, 2, 121), b = pair_random(n, -1, 1, 122), w = pair_random(C, 0.5f, 1.5f, 123);
    Pair bias = pair_random(C, -0.5f, 0.5f, 124), sum = pair_random(n, 0, 1, 125), out = pair_random(n, 0, 1, 126);
    Pair stats = pair_random(2 * (size_t)N, 0, 1, 127);
    residual_forward(gpu_stream, fp32_buf(sum.gpu), fp32_numbers(a.gpu), fp32_numbers(b.gpu), n, DTYPE_BF16);
    layernorm_forward(gpu_stream, fp32_buf(out.gpu), stats.gpu, stats.gpu + N, fp32_numbers(sum.gpu),
                      fp32_numbers(w.gpu), fp32_numbers(NULL), N, C, DTYPE_FP32);
    bias_forward(gpu_stream, fp32_buf(out.gpu), out.gpu, fp32_numbers(bias.gpu), N, C, DTYPE_BF16);
    float *want_sum = malloc(n * sizeof(float)), *want_out = malloc(n * sizeof(float));
    float *want_stats = malloc(2 * (size_t)N * sizeof(float));
    stream_copy(gpu_stream, want_sum, sum.gpu, n * sizeof(float));
    stream_copy(gpu_stream, want_out, out.gpu, n * sizeof(float));
    stream_copy(gpu_stream, want_stats, stats.gpu, 2 * (size_t)N * sizeof(float));
    stream_synchronize(gpu_stream);
    memcpy(sum.cpu, want_sum, n * sizeof(float));
    memcpy(out.cpu, want_out, n * sizeof(float));
    memcpy(stats.cpu, want_stats, 2 * (size_t)N * sizeof(float));
    for (int run = 0; run < 3; run++) {
        fill_zero(gpu_stream, sum.gpu, n);
        fill_zero(gpu_stream, out.gpu, n);
        fill_zero(gpu_stream, stats.gpu, 2 * (size_t)N);
        residual_layernorm_forward(gpu_stream, fp32_buf(sum.gpu), fp32_buf(out.gpu), stats.gpu, stats.gpu + N,
                                   fp32_numbers(a.gpu), fp32_numbers(b.gpu), fp32_numbers(w.gpu),
                                   fp32_numbers(bias.gpu), N, C,
                                   DTYPE_BF16);
        expect_same_bytes(sum, n * sizeof(float), "the residual add fused with the LayerNorm: its sum");
        expect_same_bytes(out, n * sizeof(float), "the LayerNorm with its bias after the add: its output");
        expect_same_bytes(stats, 2 * (size_t)N * sizeof(float), "the LayerNorm after the add: mean and rstd");
    }
    Pair held = pair_random(n, 0, 1, 128);  /* two bf16 tensors of n, side by side */
    bf16 *sum16 = (bf16 *)held.gpu, *out16 = sum16 + n;
    for (int run = 0; run < 3; run++) {
        fill_zero(gpu_stream, held.gpu, n);
        fill_zero(gpu_stream, stats.gpu, 2 * (size_t)N);
        residual_layernorm_forward(gpu_stream, bf16_buf(sum16), bf16_buf(out16), stats.gpu, stats.gpu + N,
                                   fp32_numbers(a.gpu), fp32_numbers(b.gpu), fp32_numbers(w.gpu),
                                   fp32_numbers(bias.gpu), N, C,
                                   DTYPE_BF16);
        expect_stored_bytes(sum16, want_sum, n, "the fused add's sum written in bf16");
        expect_stored_bytes(out16, want_out, n, "the LayerNorm after the add written in bf16");
        expect_same_bytes(stats, 2 * (size_t)N * sizeof(float), "the LayerNorm after a bf16 sum: mean and rstd");
    }
    layernorm_forward(gpu_stream, fp32_buf(out.gpu), stats.gpu, stats.gpu + N, fp32_numbers(a.gpu),
                      fp32_numbers(w.gpu), fp32_numbers(bias.gpu), N, C, DTYPE_BF16);
    pair_take_gpu(out);
    layernorm_forward(gpu_stream, bf16_buf(out16), stats.gpu, stats.gpu + N, fp32_numbers(a.gpu), fp32_numbers(w.gpu),
                      fp32_numbers(bias.gpu), N, C, DTYPE_BF16);
    expect_stored_bytes(out16, out.cpu, n, "layernorm_forward written in bf16");
    for (int with_bias = 0; with_bias < 2; with_bias++)  /* a Linear's bias after its product, or none */
        for (int run = 0; run < 3; run++) {
            stream_copy(gpu_stream, out.gpu, a.gpu, n * sizeof(float));
            bias_forward(gpu_stream, fp32_buf(out.gpu), out.gpu, fp32_numbers(with_bias ? bias.gpu : NULL), N, C,
                         DTYPE_BF16);
            pair_take_gpu(out);
            bias_forward(gpu_stream, bf16_buf(out16), a.gpu, fp32_numbers(with_bias ? bias.gpu : NULL), N, C,
                         DTYPE_BF16);
            expect_stored_bytes(out16, out.cpu, n, with_bias ? "bias_forward into bf16" : "no bias into bf16");
        }
    store_bf16(gpu_stream, sum16, a.gpu, n);  /* a's numbers in bf16, and as fp32 values */
    load_bf16(gpu_stream, a.gpu, sum16, n);
    residual_forward(gpu_stream, fp32_buf(out.gpu), fp32_numbers(a.gpu), fp32_numbers(b.gpu), n, DTYPE_BF16);
    pair_take_gpu(out);
    residual_forward(gpu_stream, fp32_buf(out.gpu), bf16_numbers(sum16), fp32_numbers(b.gpu), n, DTYPE_BF16);
    expect_same_bytes(out, n * sizeof(float), "residual_forward from bf16");
    /* from a residual stream held in bf16 (a's numbers now, in sum16): LayerNorm, the fused add, dropout into
     * bf16 in place; and the embeddings into bf16 (wte a's first 50 rows, wpe b's) */
    layernorm_forward(gpu_stream, fp32_buf(out.gpu), stats.gpu, stats.gpu + N, fp32_numbers(a.gpu),
                      fp32_numbers(w.gpu), fp32_numbers(bias.gpu), N, C, DTYPE_BF16);
    pair_take_gpu(out);
    layernorm_forward(gpu_stream, fp32_buf(out.gpu), stats.gpu, stats.gpu + N, bf16_numbers(sum16),
                      fp32_numbers(w.gpu), fp32_numbers(bias.gpu), N, C, DTYPE_BF16);
    expect_same_bytes(out, n * sizeof(float), "layernorm_forward from bf16");
    residual_layernorm_forward(gpu_stream, fp32_buf(sum.gpu), fp32_buf(out.gpu), stats.gpu, stats.gpu + N,
                               fp32_numbers(a.gpu), fp32_numbers(b.gpu), fp32_numbers(w.gpu), fp32_numbers(bias.gpu),
                               N, C,
                               DTYPE_BF16);
    pair_take_gpu(sum);
    pair_take_gpu(out);
    residual_layernorm_forward(gpu_stream, fp32_buf(sum.gpu), fp32_buf(out.gpu), stats.gpu, stats.gpu + N,
                               bf16_numbers(sum16), fp32_numbers(b.gpu), fp32_numbers(w.gpu), fp32_numbers(bias.gpu),
                               N, C,
                               DTYPE_BF16);
    expect_same_bytes(sum, n * sizeof(float), "the fused add from bf16: its sum");
    expect_same_bytes(out, n * sizeof(float), "the fused add from bf16: its LayerNorm");
    Dropout mask = { 0.3f, 7, 1, 5, 0, NULL };
    dropout_forward(gpu_stream, fp32_buf(out.gpu), fp32_numbers(a.gpu), n, mask, DTYPE_BF16);
    pair_take_gpu(out);
    dropout_forward(gpu_stream, bf16_buf(sum16), bf16_numbers(sum16), n, mask, DTYPE_BF16);
    expect_stored_bytes(sum16, out.cpu, n, "dropout_forward in bf16, in place");
    IntPair tokens = tokens_random((size_t)N, 50, 3);
    embedding_forward(gpu_stream, fp32_buf(out.gpu), tokens.gpu, fp32_numbers(a.gpu), fp32_numbers(b.gpu), 1, N, C,
                      DTYPE_BF16);
    pair_take_gpu(out);
    embedding_forward(gpu_stream, bf16_buf(out16), tokens.gpu, fp32_numbers(a.gpu), fp32_numbers(b.gpu), 1, N, C,
                      DTYPE_BF16);
    expect_stored_bytes(out16, out.cpu, n, "embedding_forward into bf16");
    int_pair_free(tokens);
    free(want_sum); free(want_out); free(want_stats);
    pair_free(a); pair_free(b); pair_free(w); pair_free(bias); pair_free(sum); pair_free(out); pair_free(stats);
    pair_free(held);
}

/* A bias's and LayerNorm's weight gradients at GPT-2's shapes (12 x 1024 rows
 * and 77 more, so the last part of 128 is short; the fc bias 3072 wide, the
 * norms 768), in the parts of row_parts.h: the
 * CPU's bytes, and the same bytes on each of three runs. LayerNorm's mean and
 * rstd are given, the same on both sides (their forward's sums are not the
 * CPU's order), so that the weight gradient's adds alone are compared. Then
 * LayerNorm's backward making a bias's gradient beside the weight's, in one
 * pass: the CPU's bias_backward bytes for it, and the weight's as before. */
Test(gpu, bias_and_layernorm_weight_sums_are_the_cpus_bytes_at_gpt2s_shape, .timeout = 300) {
    need_gpu();
    int N = 12 * 1024 + 77, OC = 3072, C = 768;
    Pair dout = pair_random((size_t)N * OC, -1, 1, 61), dbias = pair_random((size_t)OC, -1, 1, 62);
    Pair inp = pair_random((size_t)N * C, -2, 2, 63), mean = pair_random((size_t)N, -0.5f, 0.5f, 64);
    Pair rstd = pair_random((size_t)N, 0.5f, 2, 65), w = pair_random((size_t)C, 0.5f, 1.5f, 66);
    Pair dinp = pair_random((size_t)N * C, -1, 1, 67), dw = pair_random((size_t)C, -1, 1, 68);
    Pair scratch = pair_random(column_sums_scratch_floats(N, OC), -1, 1, 69);
    float *bias_start = malloc(OC * sizeof(float)), *w_start = malloc(C * sizeof(float));
    memcpy(bias_start, dbias.cpu, OC * sizeof(float));
    memcpy(w_start, dw.cpu, C * sizeof(float));
    bias_backward(test_stream, fp32_buf(dbias.cpu), fp32_numbers(dout.cpu), N, OC, scratch.cpu, DTYPE_FP32);
    layernorm_backward(test_stream, fp32_buf(dinp.cpu), fp32_buf(dw.cpu), fp32_buf(NULL), fp32_numbers(dout.cpu),
                       fp32_numbers(inp.cpu), fp32_numbers(w.cpu), mean.cpu, rstd.cpu, N, C, scratch.cpu, DTYPE_FP32);
    stream_synchronize(test_stream);
    float *want_bias = malloc(OC * sizeof(float)), *want_w = malloc(C * sizeof(float));
    memcpy(want_bias, dbias.cpu, OC * sizeof(float));
    memcpy(want_w, dw.cpu, C * sizeof(float));
    for (int run = 0; run < 3; run++) {
        pair_reset(dbias, bias_start);
        pair_reset(dw, w_start);
        bias_backward(gpu_stream, fp32_buf(dbias.gpu), fp32_numbers(dout.gpu), N, OC, scratch.gpu, DTYPE_FP32);
        layernorm_backward(gpu_stream, fp32_buf(dinp.gpu), fp32_buf(dw.gpu), fp32_buf(NULL), fp32_numbers(dout.gpu),
                           fp32_numbers(inp.gpu), fp32_numbers(w.gpu), mean.gpu, rstd.gpu, N, C, scratch.gpu,
                           DTYPE_FP32);
        memcpy(dbias.cpu, want_bias, OC * sizeof(float));
        memcpy(dw.cpu, want_w, C * sizeof(float));
        expect_same_bytes(dbias, OC * sizeof(float), "the bias gradient: GPU against CPU");
        expect_same_bytes(dw, C * sizeof(float), "LayerNorm's weight gradient: GPU against CPU");
    }
    Pair ln_bias = pair_random((size_t)C, -1, 1, 70);  /* the same start on both sides */
    /* ln_bias.cpu: what the GPU's must be */
    bias_backward(test_stream, fp32_buf(ln_bias.cpu), fp32_numbers(dout.cpu), N, C, scratch.cpu, DTYPE_FP32);
    stream_synchronize(test_stream);
    pair_reset(dw, w_start);
    memcpy(dw.cpu, want_w, C * sizeof(float));
    layernorm_backward(gpu_stream, fp32_buf(dinp.gpu), fp32_buf(dw.gpu), fp32_buf(ln_bias.gpu), fp32_numbers(dout.gpu),
                       fp32_numbers(inp.gpu), fp32_numbers(w.gpu), mean.gpu, rstd.gpu, N, C, scratch.gpu, DTYPE_FP32);
    expect_same_bytes(ln_bias, C * sizeof(float), "LayerNorm's backward's bias gradient: GPU against CPU");
    expect_same_bytes(dw, C * sizeof(float), "LayerNorm's weight gradient beside a bias's: GPU against CPU");
    pair_free(ln_bias);
    /* the bias gradient from a gradient held in bf16 (qkv's: attention's input's, held so): the bytes it gives
     * the same values in fp32 */
    size_t nd = (size_t)N * OC;
    pair_round_to_bf16(dout);
    Pair dout16 = pair_random((nd + 1) / 2, 0, 1, 71);
    store_bf16(gpu_stream, (bf16 *)dout16.gpu, dout.gpu, nd);
    pair_reset(dbias, bias_start);
    bias_backward(gpu_stream, fp32_buf(dbias.gpu), fp32_numbers(dout.gpu), N, OC, scratch.gpu, DTYPE_FP32);
    pair_take_gpu(dbias);
    stream_copy(gpu_stream, dbias.gpu, bias_start, OC * sizeof(float));
    bias_backward(gpu_stream, fp32_buf(dbias.gpu), bf16_numbers((const bf16 *)dout16.gpu), N, OC, scratch.gpu,
                  DTYPE_FP32);
    expect_same_bytes(dbias, OC * sizeof(float), "the bias gradient from a bf16 gradient");
    pair_free(dout16);
    /* under autocast each sum rounded to bf16 before its add: into an fp32 gradient, and into one held in bf16
     * (reduced in bf16), the CPU's bytes */
    Pair held = pair_random(((size_t)OC + 1) / 2, 0, 1, 72);
    bf16 *held_start = malloc(OC * sizeof(bf16)), *held_want = malloc(OC * sizeof(bf16));
    bf16 *held_got = malloc(OC * sizeof(bf16));
    for (int c = 0; c < OC; c++) held_start[c] = bf16_from_float(bias_start[c]);
    memcpy(held_want, held_start, OC * sizeof(bf16));
    pair_reset(dbias, bias_start);
    bias_backward(test_stream, bf16_buf(held_want), fp32_numbers(dout.cpu), N, OC, scratch.cpu, DTYPE_BF16);
    bias_backward(test_stream, fp32_buf(dbias.cpu), fp32_numbers(dout.cpu), N, OC, scratch.cpu, DTYPE_BF16);
    stream_synchronize(test_stream);
    stream_copy(gpu_stream, held.gpu, held_start, OC * sizeof(bf16));
    bias_backward(gpu_stream, bf16_buf((bf16 *)held.gpu), fp32_numbers(dout.gpu), N, OC, scratch.gpu, DTYPE_BF16);
    bias_backward(gpu_stream, fp32_buf(dbias.gpu), fp32_numbers(dout.gpu), N, OC, scratch.gpu, DTYPE_BF16);
    stream_copy(gpu_stream, held_got, held.gpu, OC * sizeof(bf16));
    expect_same_bytes(dbias, OC * sizeof(float), "the bias gradient rounded into fp32: GPU against CPU");
    cr_expect_eq(memcmp(held_got, held_want, OC * sizeof(bf16)), 0, "the bias gradient into bf16: GPU against CPU");
    /* LayerNorm's weight and bias sums likewise, into bf16 (held_start's first 2C as their start) */
    memcpy(held_want, held_start, 2 * (size_t)C * sizeof(bf16));
    layernorm_backward(test_stream, fp32_buf(dinp.cpu), bf16_buf(held_want), bf16_buf(held_want + C),
                       fp32_numbers(dout.cpu), fp32_numbers(inp.cpu), fp32_numbers(w.cpu), mean.cpu, rstd.cpu, N, C,
                       scratch.cpu, DTYPE_BF16);
    stream_synchronize(test_stream);
    stream_copy(gpu_stream, held.gpu, held_start, 2 * (size_t)C * sizeof(bf16));
    layernorm_backward(gpu_stream, fp32_buf(dinp.gpu), bf16_buf((bf16 *)held.gpu), bf16_buf((bf16 *)held.gpu + C),
                       fp32_numbers(dout.gpu), fp32_numbers(inp.gpu), fp32_numbers(w.gpu), mean.gpu, rstd.gpu, N, C,
                       scratch.gpu, DTYPE_BF16);
    stream_copy(gpu_stream, held_got, held.gpu, 2 * (size_t)C * sizeof(bf16));
    stream_synchronize(gpu_stream);
    cr_expect_eq(memcmp(held_got, held_want, 2 * (size_t)C * sizeof(bf16)), 0,
                 "LayerNorm's weight and bias gradients into bf16: GPU against CPU");
    pair_free(held);
    free(held_start); free(held_want); free(held_got);
    free(bias_start); free(w_start); free(want_bias); free(want_w);
    pair_free(dout); pair_free(dbias); pair_free(inp); pair_free(mean); pair_free(rstd); pair_free(w);
    pair_free(dinp); pair_free(dw); pair_free(scratch);
}

/* The GPU's copy against the CPU's as a whole (rms_rel_error), where a rare
 * number rounds to the next bf16 on one side only. */
static void expect_near(Pair p, double tol, const char *what) {
    double e = gpu_error(p, rms_rel_error);
    cr_expect_lt(e, tol, "%s: GPU against CPU, rms relative error %g (tolerance %g)", what, e, tol);
}

/* bf16 attention, GPU against CPU: both round the same numbers to bf16, each
 * from its own fp32 sums (the tensor cores', sgemm's), so a rare one lands on
 * the next bf16 on one side only (test_kernels: the fp32 op is 1.2e-3 away). */
static const double BF16_ATTENTION_TOL = 3e-4;

typedef struct { int B, T, C, NH; } AttentionShape;

/* One attention forward and backward on the CPU and the GPU, on bf16 values
 * in bf16: out and dqkv compared (what each keeps for the backward is its own
 * in fp32: buffers as large as the larger). */
static void check_attention(float p, DType products, AttentionShape sh) {
    need_gpu();
    int B = sh.B, T = sh.T, C = sh.C, NH = sh.NH;
    Dropout drop = { p, 9, 1, 4, 2, NULL };
    AttentionBuffers cpu_sizes = attention_buffers(DEVICE_CPU, B, T, C, NH, products);
    AttentionBuffers gpu_sizes = attention_buffers(DEVICE_CUDA, B, T, C, NH, products);
    size_t saved_n = cpu_sizes.saved > gpu_sizes.saved ? cpu_sizes.saved : gpu_sizes.saved;
    size_t scratch_n = cpu_sizes.scratch > gpu_sizes.scratch ? cpu_sizes.scratch : gpu_sizes.scratch;
    Pair qkv = pair_random((size_t)B * T * 3 * C, -1, 1, 21), out = pair_random((size_t)B * T * C, -1, 1, 22);
    Pair att = pair_random(saved_n, -1, 1, 23), scratch = pair_random(scratch_n ? scratch_n : 1, -1, 1, 24);
    Pair dout = pair_random((size_t)B * T * C, -1, 1, 25), dqkv = pair_random((size_t)B * T * 3 * C, -1, 1, 26);
    if (products == DTYPE_BF16) {
        pair_round_to_bf16(qkv);
        pair_round_to_bf16(dout);
    }
    attention_forward(test_stream, fp32_buf(out.cpu), att.cpu, scratch.cpu, fp32_numbers(qkv.cpu), B, T, C, NH, drop,
                      products, DTYPE_FP32);
    attention_forward(gpu_stream, fp32_buf(out.gpu), att.gpu, scratch.gpu, fp32_numbers(qkv.gpu), B, T, C, NH, drop,
                      products, DTYPE_FP32);
    attention_backward(test_stream, fp32_buf(dqkv.cpu), scratch.cpu, fp32_numbers(dout.cpu), fp32_numbers(qkv.cpu),
                       fp32_numbers(out.cpu), att.cpu, B, T, C, NH, drop, products, DTYPE_FP32);
    attention_backward(gpu_stream, fp32_buf(dqkv.gpu), scratch.gpu, fp32_numbers(dout.gpu), fp32_numbers(qkv.gpu),
                       fp32_numbers(out.gpu), att.gpu, B, T, C, NH, drop, products, DTYPE_FP32);
    char what[96];
    snprintf(what, sizeof what, "attention %s, head %d, T %d, p %g: out", products ? "bf16" : "fp32", C / NH, T, p);
    if (products == DTYPE_BF16) expect_near(out, BF16_ATTENTION_TOL, what);
    else expect_match(out, REDUCTION_TOL, what);
    snprintf(what, sizeof what, "attention %s, head %d, T %d, p %g: dqkv", products ? "bf16" : "fp32", C / NH, T, p);
    if (products == DTYPE_BF16) expect_near(dqkv, BF16_ATTENTION_TOL, what);
    else expect_match(dqkv, REDUCTION_TOL, what);
    if (products == DTYPE_BF16) {  /* q, k, v and out held in bf16: the backward's bytes from the same values in fp32 */
        size_t n = (size_t)B * T * C;
        Pair held = pair_random(2 * n, 0, 1, 27);  /* qkv's 3n bf16, then out's n */
        bf16 *qkv16 = (bf16 *)held.gpu, *out16 = qkv16 + 3 * n;
        store_bf16(gpu_stream, qkv16, qkv.gpu, 3 * n);
        pair_take_gpu(out);  /* the forward from bf16 into bf16: its fp32 output's bytes stored */
        attention_forward(gpu_stream, bf16_buf(out16), att.gpu, scratch.gpu, bf16_numbers(qkv16), B, T, C, NH, drop,
                          products, DTYPE_FP32);
        snprintf(what, sizeof what, "attention, head %d, T %d, p %g: out from bf16 into bf16", C / NH, T, p);
        expect_stored_bytes(out16, out.cpu, n, what);
        round_to_bf16(gpu_stream, out.gpu, out.gpu, n);
        store_bf16(gpu_stream, out16, out.gpu, n);
        attention_backward(gpu_stream, fp32_buf(dqkv.gpu), scratch.gpu, fp32_numbers(dout.gpu), fp32_numbers(qkv.gpu),
                           fp32_numbers(out.gpu), att.gpu, B, T, C, NH, drop, products, DTYPE_FP32);
        pair_take_gpu(dqkv);
        attention_backward(gpu_stream, fp32_buf(dqkv.gpu), scratch.gpu, fp32_numbers(dout.gpu), bf16_numbers(qkv16),
                           bf16_numbers(out16), att.gpu, B, T, C, NH, drop, products, DTYPE_FP32);
        snprintf(what, sizeof what, "attention, head %d, T %d, p %g: dqkv from bf16", C / NH, T, p);
        expect_same_bytes(dqkv, dqkv.n * sizeof(float), what);
        /* and from a bf16 output gradient into a bf16 dqkv (a model's attention's gradients, held so): the
         * bytes of the fp32 dqkv just taken, stored */
        Pair grads = pair_random(2 * n, 0, 1, 28);  /* dqkv's 3n bf16, then dout's n */
        bf16 *dqkv16 = (bf16 *)grads.gpu, *dout16 = dqkv16 + 3 * n;
        store_bf16(gpu_stream, dout16, dout.gpu, n);
        attention_backward(gpu_stream, bf16_buf(dqkv16), scratch.gpu, bf16_numbers(dout16), bf16_numbers(qkv16),
                           bf16_numbers(out16), att.gpu, B, T, C, NH, drop, products, DTYPE_FP32);
        snprintf(what, sizeof what, "attention, head %d, T %d, p %g: a bf16 dqkv from a bf16 dout", C / NH, T, p);
        expect_stored_bytes(dqkv16, dqkv.cpu, 3 * n, what);
        pair_free(grads);
        pair_free(held);
    }
    pair_free(qkv); pair_free(out); pair_free(att); pair_free(scratch); pair_free(dout); pair_free(dqkv);
}

/* The GPU's bf16 output against its own fp32 output rounded to bf16
 * (expect_rounded; a GPU buffer each). */
static void expect_gpu_rounded(const float *bf, const float *fp, size_t n, const char *what) {
    float *got = malloc(n * sizeof(float)), *want = malloc(n * sizeof(float));
    stream_copy(gpu_stream, got, bf, n * sizeof(float));
    stream_copy(gpu_stream, want, fp, n * sizeof(float));
    stream_synchronize(gpu_stream);
    expect_rounded(got, want, n, what);
    free(got);
    free(want);
}

/* Every op with a rounding, on the GPU: under DTYPE_BF16 the bytes of
 * its DTYPE_FP32 output rounded (test_kernels holds the CPU to the same):
 * the embeddings, LayerNorm, a bias, the residual add, dropout, GELU, the
 * loss (its logits read rounded), LayerNorm's backward (bf16(dinp +
 * bf16(its gradient))), and attention both ways on the tensor cores (a head
 * of 64) and through cuBLAS (a head of 80). */
Test(gpu, every_op_rounds_its_output_as_round_to_bf16_after_it) {
    need_gpu();
    enum { B = 2, T = 150, C = 128, V = 301 };
    size_t BT = (size_t)B * T, n = BT * C;
    Pair x = pair_random(n, -2, 2, 91), y = pair_random(n, -1, 1, 92), w = pair_random(C, 0.5f, 1.5f, 93);
    Pair fp = pair_random(n, 0, 1, 94), bf = pair_random(n, 0, 1, 95), stats = pair_random(2 * BT, 0, 1, 96);
    Pair wte = pair_random((size_t)V * C, -1, 1, 97), dw = pair_random(C, 0, 1, 98);
    Pair scratch = pair_random(column_sums_scratch_floats((int)BT, C), 0, 1, 99);
    IntPair tokens = tokens_random(BT, V, 3);
    Dropout drop = { 0.25f, 9, 1, 4, 2, NULL };
    float *mean = stats.gpu, *rstd = stats.gpu + BT;
    embedding_forward(gpu_stream, fp32_buf(fp.gpu), tokens.gpu, fp32_numbers(wte.gpu), fp32_numbers(y.gpu), B, T, C,
                      DTYPE_FP32);
    embedding_forward(gpu_stream, fp32_buf(bf.gpu), tokens.gpu, fp32_numbers(wte.gpu), fp32_numbers(y.gpu), B, T, C,
                      DTYPE_BF16);
    expect_gpu_rounded(bf.gpu, fp.gpu, n, "embedding_forward");
    layernorm_forward(gpu_stream, fp32_buf(fp.gpu), mean, rstd, fp32_numbers(x.gpu), fp32_numbers(w.gpu),
                      fp32_numbers(NULL), (int)BT, C, DTYPE_FP32);
    layernorm_forward(gpu_stream, fp32_buf(bf.gpu), mean, rstd, fp32_numbers(x.gpu), fp32_numbers(w.gpu),
                      fp32_numbers(NULL), (int)BT, C, DTYPE_BF16);
    expect_gpu_rounded(bf.gpu, fp.gpu, n, "layernorm_forward");
    stream_copy(gpu_stream, fp.gpu, x.gpu, n * sizeof(float));
    stream_copy(gpu_stream, bf.gpu, x.gpu, n * sizeof(float));
    bias_forward(gpu_stream, fp32_buf(fp.gpu), fp.gpu, fp32_numbers(w.gpu), (int)BT, C, DTYPE_FP32);
    bias_forward(gpu_stream, fp32_buf(bf.gpu), bf.gpu, fp32_numbers(w.gpu), (int)BT, C, DTYPE_BF16);
    expect_gpu_rounded(bf.gpu, fp.gpu, n, "bias_forward");
    residual_forward(gpu_stream, fp32_buf(fp.gpu), fp32_numbers(x.gpu), fp32_numbers(y.gpu), n, DTYPE_FP32);
    residual_forward(gpu_stream, fp32_buf(bf.gpu), fp32_numbers(x.gpu), fp32_numbers(y.gpu), n, DTYPE_BF16);
    expect_gpu_rounded(bf.gpu, fp.gpu, n, "residual_forward");
    dropout_forward(gpu_stream, fp32_buf(fp.gpu), fp32_numbers(x.gpu), n, drop, DTYPE_FP32);
    dropout_forward(gpu_stream, fp32_buf(bf.gpu), fp32_numbers(x.gpu), n, drop, DTYPE_BF16);
    expect_gpu_rounded(bf.gpu, fp.gpu, n, "dropout_forward");
    for (int tanh_form = 0; tanh_form < 2; tanh_form++) {
        gelu_forward(gpu_stream, fp32_buf(fp.gpu), fp32_numbers(x.gpu), n, tanh_form, DTYPE_FP32);
        gelu_forward(gpu_stream, fp32_buf(bf.gpu), fp32_numbers(x.gpu), n, tanh_form, DTYPE_BF16);
        expect_gpu_rounded(bf.gpu, fp.gpu, n, tanh_form ? "gelu_forward, tanh form" : "gelu_forward");
    }

    /* LayerNorm's backward: the bf16 add against its gradient alone, added on the host */
    layernorm_forward(gpu_stream, fp32_buf(fp.gpu), mean, rstd, fp32_numbers(x.gpu), fp32_numbers(w.gpu),
                      fp32_numbers(NULL), (int)BT, C, DTYPE_FP32);
    fill_zero(gpu_stream, fp.gpu, n);
    pair_round_to_bf16(y);
    stream_copy(gpu_stream, bf.gpu, y.gpu, n * sizeof(float));
    layernorm_backward(gpu_stream, fp32_buf(fp.gpu), fp32_buf(dw.gpu), fp32_buf(NULL), fp32_numbers(x.gpu),
                       fp32_numbers(x.gpu), fp32_numbers(w.gpu), mean, rstd, (int)BT, C, scratch.gpu, DTYPE_FP32);
    layernorm_backward(gpu_stream, fp32_buf(bf.gpu), fp32_buf(dw.gpu), fp32_buf(NULL), fp32_numbers(x.gpu),
                       fp32_numbers(x.gpu), fp32_numbers(w.gpu), mean, rstd, (int)BT, C, scratch.gpu, DTYPE_BF16);
    float *g = malloc(n * sizeof(float));
    stream_copy(gpu_stream, g, fp.gpu, n * sizeof(float));
    stream_synchronize(gpu_stream);
    for (size_t i = 0; i < n; i++) g[i] = y.cpu[i] + bf16_rounded(g[i]);
    stream_copy(gpu_stream, fp.gpu, g, n * sizeof(float));
    expect_gpu_rounded(bf.gpu, fp.gpu, n, "layernorm_backward's add");
    free(g);

    /* the loss: the logits read rounded (the fp32 op given them rounded), dlogits written rounded */
    size_t nl = BT * V;
    Pair logits = pair_random(nl, -4, 4, 100), rounded = pair_random(nl, -4, 4, 100);
    Pair dfp = pair_random(nl, 0, 1, 101), dbf = pair_random(nl, 0, 1, 102), losses = pair_random(2 * BT, 0, 1, 103);
    pair_round_to_bf16(rounded);
    crossentropy_forward_backward(gpu_stream, losses.gpu, fp32_buf(dfp.gpu), fp32_numbers(rounded.gpu), tokens.gpu,
                                  (int)BT, V, 0.5f, DTYPE_FP32);
    crossentropy_forward_backward(gpu_stream, losses.gpu + BT, fp32_buf(dbf.gpu), fp32_numbers(logits.gpu),
                                  tokens.gpu, (int)BT, V, 0.5f, DTYPE_BF16);
    expect_gpu_rounded(dbf.gpu, dfp.gpu, nl, "crossentropy's dlogits");
    float *both = malloc(2 * BT * sizeof(float));
    stream_copy(gpu_stream, both, losses.gpu, 2 * BT * sizeof(float));
    stream_synchronize(gpu_stream);
    cr_expect_eq(memcmp(both, both + BT, BT * sizeof(float)), 0, "crossentropy: the losses of the rounded logits");
    /* in place, as the model runs it: the same gradient and losses */
    crossentropy_forward_backward(gpu_stream, losses.gpu + BT, fp32_buf(logits.gpu), fp32_numbers(logits.gpu),
                                  tokens.gpu, (int)BT, V, 0.5f, DTYPE_BF16);
    float *in_place = malloc(nl * sizeof(float)), *apart = malloc(nl * sizeof(float));
    stream_copy(gpu_stream, in_place, logits.gpu, nl * sizeof(float));
    stream_copy(gpu_stream, apart, dbf.gpu, nl * sizeof(float));
    stream_copy(gpu_stream, both, losses.gpu, 2 * BT * sizeof(float));
    stream_synchronize(gpu_stream);
    cr_expect_eq(memcmp(in_place, apart, nl * sizeof(float)), 0, "crossentropy in place in bf16: other dlogits");
    cr_expect_eq(memcmp(both, both + BT, BT * sizeof(float)), 0, "crossentropy in place in bf16: other losses");
    free(both); free(in_place); free(apart);

    /* attention, a head of 64 (tensor cores) and of 80 (cuBLAS) */
    const AttentionShape shapes[2] = { { 1, 150, 128, 2 }, { 1, 70, 160, 2 } };
    for (int k = 0; k < 2; k++) {
        AttentionShape sh = shapes[k];
        size_t nout = (size_t)sh.B * sh.T * sh.C, nqkv = 3 * nout;
        AttentionBuffers sizes = attention_buffers(DEVICE_CUDA, sh.B, sh.T, sh.C, sh.NH, DTYPE_BF16);
        Pair qkv = pair_random(nqkv, -1.5f, 1.5f, 104), out_fp = pair_random(nout, 0, 1, 105);
        Pair out_bf = pair_random(nout, 0, 1, 106), dout = pair_random(nout, -1, 1, 107);
        Pair dq_fp = pair_random(nqkv, 0, 1, 108), dq_bf = pair_random(nqkv, 0, 1, 109);
        Pair saved = pair_random(sizes.saved, 0, 1, 110), att_scratch = pair_random(sizes.scratch, 0, 1, 111);
        pair_round_to_bf16(qkv);
        pair_round_to_bf16(dout);
        attention_forward(gpu_stream, fp32_buf(out_fp.gpu), saved.gpu, att_scratch.gpu, fp32_numbers(qkv.gpu), sh.B,
                          sh.T, sh.C, sh.NH, drop, DTYPE_BF16, DTYPE_FP32);
        attention_forward(gpu_stream, fp32_buf(out_bf.gpu), saved.gpu, att_scratch.gpu, fp32_numbers(qkv.gpu), sh.B,
                          sh.T, sh.C, sh.NH, drop, DTYPE_BF16, DTYPE_BF16);
        expect_gpu_rounded(out_bf.gpu, out_fp.gpu, nout, k ? "attention_forward, cuBLAS" : "attention_forward");
        attention_backward(gpu_stream, fp32_buf(dq_fp.gpu), att_scratch.gpu, fp32_numbers(dout.gpu),
                           fp32_numbers(qkv.gpu), fp32_numbers(out_bf.gpu), saved.gpu, sh.B, sh.T, sh.C, sh.NH, drop,
                           DTYPE_BF16, DTYPE_FP32);
        attention_backward(gpu_stream, fp32_buf(dq_bf.gpu), att_scratch.gpu, fp32_numbers(dout.gpu),
                           fp32_numbers(qkv.gpu), fp32_numbers(out_bf.gpu), saved.gpu, sh.B, sh.T, sh.C, sh.NH, drop,
                           DTYPE_BF16, DTYPE_BF16);
        expect_gpu_rounded(dq_bf.gpu, dq_fp.gpu, nqkv, k ? "attention_backward, cuBLAS" : "attention_backward");
        pair_free(qkv); pair_free(out_fp); pair_free(out_bf); pair_free(dout); pair_free(dq_fp); pair_free(dq_bf);
        pair_free(saved); pair_free(att_scratch);
    }
    pair_free(x); pair_free(y); pair_free(w); pair_free(fp); pair_free(bf); pair_free(stats); pair_free(wte);
    pair_free(dw); pair_free(scratch); pair_free(logits); pair_free(rounded); pair_free(dfp); pair_free(dbf);
    pair_free(losses);
    int_pair_free(tokens);
}

static const AttentionShape SMALL_ATTENTION = { 2, 37, 48, 4 };

Test(gpu, attention_forward_backward) { check_attention(0.0f, DTYPE_FP32, SMALL_ATTENTION); }
Test(gpu, attention_with_dropout) { check_attention(0.2f, DTYPE_FP32, SMALL_ATTENTION); }

/* On the tensor cores: heads of 8, 12, 24, 32, 48 and 64 channels (padded
 * to 16, 16, 32, 32, 64, 64), T past two blocks of 64 with a ragged last,
 * with and without dropout; and heads of 80 and 160, past the tensor cores'
 * 64, through cuBLAS with the same roundings (each probability relative to
 * the running max of its block of 64 keys, dS from dy . y); each backward
 * also from q, k, v and out held in bf16, to its bytes from fp32 (at 160,
 * 71 rows of deltas before the room it widens them into). */
Test(gpu, attention_in_bf16_on_the_tensor_cores) {
    const AttentionShape shapes[] = { { 2, 150, 16, 2 }, { 2, 37, 48, 4 }, { 1, 150, 48, 2 }, { 1, 150, 64, 2 },
                                      { 1, 150, 96, 2 }, { 1, 150, 128, 2 }, { 1, 70, 160, 2 }, { 1, 71, 160, 1 } };
    for (size_t i = 0; i < sizeof shapes / sizeof *shapes; i++) {
        check_attention(0.0f, DTYPE_BF16, shapes[i]);
        check_attention(0.2f, DTYPE_BF16, shapes[i]);
    }
}

/* At GPT-2's shape (T = 1024, 12 heads of 64) the tensor cores' attention runs
 * three times to the same bytes (out, the log-sum-exp, dqkv: no atomics, the
 * sums' order fixed by the shapes), each near the CPU's. */
Test(gpu, attention_in_bf16_repeats_bit_for_bit_at_gpt2s_shape) {
    need_gpu();
    int B = 2, T = 1024, C = 768, NH = 12;
    Dropout drop = { 0.0f, 9, 1, 4, 2, NULL };
    AttentionBuffers sizes = attention_buffers(DEVICE_CUDA, B, T, C, NH, DTYPE_BF16);
    cr_assert_eq(sizes.saved, (size_t)B * NH * T, "the GPU keeps one log-sum-exp a row, no T x T matrix");
    Pair qkv = pair_random((size_t)B * T * 3 * C, -1, 1, 61), out = pair_random((size_t)B * T * C, -1, 1, 62);
    Pair lse = pair_random(sizes.saved, -1, 1, 63), scratch = pair_random(sizes.scratch, -1, 1, 64);
    Pair dout = pair_random((size_t)B * T * C, -1, 1, 65), dqkv = pair_random((size_t)B * T * 3 * C, -1, 1, 66);
    pair_round_to_bf16(qkv);
    pair_round_to_bf16(dout);
    attention_forward(test_stream, fp32_buf(out.cpu), lse.cpu, scratch.cpu, fp32_numbers(qkv.cpu), B, T, C, NH,
                      drop, DTYPE_BF16, DTYPE_FP32);
    attention_backward(test_stream, fp32_buf(dqkv.cpu), scratch.cpu, fp32_numbers(dout.cpu), fp32_numbers(qkv.cpu),
                       fp32_numbers(out.cpu), lse.cpu, B, T, C, NH, drop, DTYPE_BF16, DTYPE_FP32);
    stream_synchronize(test_stream);
    for (int run = 0; run < 3; run++) {
        attention_forward(gpu_stream, fp32_buf(out.gpu), lse.gpu, scratch.gpu, fp32_numbers(qkv.gpu), B, T, C, NH,
                          drop, DTYPE_BF16, DTYPE_FP32);
        attention_backward(gpu_stream, fp32_buf(dqkv.gpu), scratch.gpu, fp32_numbers(dout.gpu), fp32_numbers(qkv.gpu),
                           fp32_numbers(out.gpu), lse.gpu, B, T, C, NH, drop, DTYPE_BF16, DTYPE_FP32);
        if (run == 0) {
            expect_near(out, BF16_ATTENTION_TOL, "attention at GPT-2's shape: out");
            expect_near(lse, ELEMENTWISE_TOL, "attention at GPT-2's shape: log-sum-exp");
            expect_near(dqkv, BF16_ATTENTION_TOL, "attention at GPT-2's shape: dqkv");
            /* the first run's bytes are what the next two must give */
            stream_copy(gpu_stream, out.cpu, out.gpu, out.n * sizeof(float));
            stream_copy(gpu_stream, lse.cpu, lse.gpu, lse.n * sizeof(float));
            stream_copy(gpu_stream, dqkv.cpu, dqkv.gpu, dqkv.n * sizeof(float));
            stream_synchronize(gpu_stream);
        } else {
            expect_same_bytes(out, out.n * sizeof(float), "attention's out differs between runs");
            expect_same_bytes(lse, lse.n * sizeof(float), "attention's log-sum-exp differs between runs");
            expect_same_bytes(dqkv, dqkv.n * sizeof(float), "attention's dqkv differs between runs");
        }
    }
    pair_free(qkv); pair_free(out); pair_free(lse); pair_free(scratch); pair_free(dout); pair_free(dqkv);
}

Test(gpu, embedding_forward_backward) {
    need_gpu();
    int B = 3, T = 37, C = 48, V = 65;
    IntPair tokens = tokens_random((size_t)B * T, V, 31);
    Pair wte = pair_random((size_t)V * C, -1, 1, 32), wpe = pair_random((size_t)T * C, -1, 1, 33);
    Pair out = pair_random((size_t)B * T * C, -1, 1, 34), dout = pair_random((size_t)B * T * C, -1, 1, 35);
    Pair dwte = pair_random((size_t)V * C, -1, 1, 36), dwpe = pair_random((size_t)T * C, -1, 1, 37);
    embedding_forward(test_stream, fp32_buf(out.cpu), tokens.cpu, fp32_numbers(wte.cpu), fp32_numbers(wpe.cpu), B, T,
                      C, DTYPE_FP32);
    embedding_forward(gpu_stream, fp32_buf(out.gpu), tokens.gpu, fp32_numbers(wte.gpu), fp32_numbers(wpe.gpu), B, T,
                      C, DTYPE_FP32);
    TokenBuckets host = buckets_of(tokens.cpu, B * T, V);
    GpuBuckets buckets = gpu_buckets(host, B * T);
    embedding_backward(test_stream, fp32_buf(dwte.cpu), fp32_buf(dwpe.cpu), fp32_numbers(dout.cpu), fp32_numbers(NULL),
                       host, B, T, V, C, DTYPE_FP32);
    embedding_backward(gpu_stream, fp32_buf(dwte.gpu), fp32_buf(dwpe.gpu), fp32_numbers(dout.gpu), fp32_numbers(NULL),
                       buckets.view, B, T, V, C, DTYPE_FP32);
    expect_match(out, ELEMENTWISE_TOL, "embedding out");
    expect_same_bytes(dwte, dwte.n * sizeof(float), "embedding dwte (added): GPU against CPU");
    expect_same_bytes(dwpe, dwpe.n * sizeof(float), "embedding dwpe (added): GPU against CPU");
    int_pair_free(tokens);
    buckets_free(host);
    gpu_buckets_free(buckets);
    pair_free(wte); pair_free(wpe); pair_free(out); pair_free(dout); pair_free(dwte); pair_free(dwpe);
}

/* The embedding's backward at GPT-2's shape (V = 50304, 768 wide, 2 x 1024
 * positions of GPT-2's ids, many repeated): the CPU's bytes, three runs. */
Test(gpu, embedding_backward_is_the_cpus_bytes_at_gpt2s_shape, .timeout = 300) {
    need_gpu();
    int B = 2, T = 1024, C = 768, V = 50304;
    IntPair tokens = tokens_random((size_t)B * T, 1000, 71);  /* a thousand ids: most tokens repeat */
    Pair dout = pair_random((size_t)B * T * C, -1, 1, 72);
    Pair dwte = pair_random((size_t)V * C, -1, 1, 73), dwpe = pair_random((size_t)T * C, -1, 1, 74);
    float *wte_start = malloc(dwte.n * sizeof(float)), *wpe_start = malloc(dwpe.n * sizeof(float));
    memcpy(wte_start, dwte.cpu, dwte.n * sizeof(float));
    memcpy(wpe_start, dwpe.cpu, dwpe.n * sizeof(float));
    TokenBuckets host = buckets_of(tokens.cpu, B * T, V);
    GpuBuckets buckets = gpu_buckets(host, B * T);
    embedding_backward(test_stream, fp32_buf(dwte.cpu), fp32_buf(dwpe.cpu), fp32_numbers(dout.cpu), fp32_numbers(NULL),
                       host, B, T, V, C, DTYPE_FP32);
    stream_synchronize(test_stream);
    float *want_wte = malloc(dwte.n * sizeof(float)), *want_wpe = malloc(dwpe.n * sizeof(float));
    memcpy(want_wte, dwte.cpu, dwte.n * sizeof(float));
    memcpy(want_wpe, dwpe.cpu, dwpe.n * sizeof(float));
    for (int run = 0; run < 3; run++) {
        pair_reset(dwte, wte_start);
        pair_reset(dwpe, wpe_start);
        embedding_backward(gpu_stream, fp32_buf(dwte.gpu), fp32_buf(dwpe.gpu), fp32_numbers(dout.gpu),
                           fp32_numbers(NULL), buckets.view, B, T, V, C, DTYPE_FP32);
        memcpy(dwte.cpu, want_wte, dwte.n * sizeof(float));
        memcpy(dwpe.cpu, want_wpe, dwpe.n * sizeof(float));
        expect_same_bytes(dwte, dwte.n * sizeof(float), "dwte at GPT-2's shape: GPU against CPU");
        expect_same_bytes(dwpe, dwpe.n * sizeof(float), "dwpe at GPT-2's shape: GPU against CPU");
    }
    /* from the residual stream's gradient held in bf16 (as a model holds it): the CPU's bytes from its values */
    pair_round_to_bf16(dout);
    Pair dout16 = pair_random((dout.n + 1) / 2, 0, 1, 75);
    store_bf16(gpu_stream, (bf16 *)dout16.gpu, dout.gpu, dout.n);
    pair_reset(dwte, wte_start);
    pair_reset(dwpe, wpe_start);
    embedding_backward(test_stream, fp32_buf(dwte.cpu), fp32_buf(dwpe.cpu), fp32_numbers(dout.cpu), fp32_numbers(NULL),
                       host, B, T, V, C, DTYPE_FP32);
    stream_synchronize(test_stream);
    embedding_backward(gpu_stream, fp32_buf(dwte.gpu), fp32_buf(dwpe.gpu), bf16_numbers((const bf16 *)dout16.gpu),
                       fp32_numbers(NULL), buckets.view, B, T, V, C, DTYPE_FP32);
    expect_same_bytes(dwte, dwte.n * sizeof(float), "dwte from a bf16 gradient at GPT-2's shape: GPU against CPU");
    expect_same_bytes(dwpe, dwpe.n * sizeof(float), "dwpe from a bf16 gradient at GPT-2's shape: GPU against CPU");
    /* under autocast: each sum rounded, wte's joined by the head's bf16 gradient (every row of V), added into the
     * gradient; the CPU's bytes into fp32 */
    Pair head = pair_random(dwte.n, -1, 1, 76), head16 = pair_random((dwte.n + 1) / 2, 0, 1, 77);
    pair_round_to_bf16(head);
    store_bf16(gpu_stream, (bf16 *)head16.gpu, head.gpu, head.n);
    bf16 *head_host = malloc(head.n * sizeof(bf16));
    for (size_t i = 0; i < head.n; i++) head_host[i] = bf16_from_float(head.cpu[i]);
    pair_reset(dwte, wte_start);
    pair_reset(dwpe, wpe_start);
    embedding_backward(test_stream, fp32_buf(dwte.cpu), fp32_buf(dwpe.cpu), fp32_numbers(dout.cpu),
                       bf16_numbers(head_host), host, B, T, V, C, DTYPE_BF16);
    stream_synchronize(test_stream);
    embedding_backward(gpu_stream, fp32_buf(dwte.gpu), fp32_buf(dwpe.gpu), bf16_numbers((const bf16 *)dout16.gpu),
                       bf16_numbers((const bf16 *)head16.gpu), buckets.view, B, T, V, C, DTYPE_BF16);
    expect_same_bytes(dwte, dwte.n * sizeof(float), "dwte in bf16 with the head's: GPU against CPU");
    expect_same_bytes(dwpe, dwpe.n * sizeof(float), "dwpe in bf16: GPU against CPU");
    /* into gradients held in bf16 (reduced in bf16): the CPU's bytes */
    size_t nw = dwte.n + dwpe.n;
    bf16 *held_start = malloc(nw * sizeof(bf16)), *held_want = malloc(nw * sizeof(bf16));
    bf16 *held_got = malloc(nw * sizeof(bf16));
    for (size_t i = 0; i < dwte.n; i++) held_start[i] = bf16_from_float(wte_start[i]);
    for (size_t i = 0; i < dwpe.n; i++) held_start[dwte.n + i] = bf16_from_float(wpe_start[i]);
    memcpy(held_want, held_start, nw * sizeof(bf16));
    embedding_backward(test_stream, bf16_buf(held_want), bf16_buf(held_want + dwte.n), fp32_numbers(dout.cpu),
                       bf16_numbers(head_host), host, B, T, V, C, DTYPE_BF16);
    stream_synchronize(test_stream);
    Pair held = pair_random(nw / 2 + 1, 0, 1, 78);
    stream_copy(gpu_stream, held.gpu, held_start, nw * sizeof(bf16));
    embedding_backward(gpu_stream, bf16_buf((bf16 *)held.gpu), bf16_buf((bf16 *)held.gpu + dwte.n),
                       bf16_numbers((const bf16 *)dout16.gpu), bf16_numbers((const bf16 *)head16.gpu), buckets.view, B,
                       T, V, C, DTYPE_BF16);
    stream_copy(gpu_stream, held_got, held.gpu, nw * sizeof(bf16));
    stream_synchronize(gpu_stream);
    cr_expect_eq(memcmp(held_got, held_want, nw * sizeof(bf16)), 0,
                 "dwte and dwpe in bf16 into bf16 gradients: GPU against CPU");
    pair_free(held);
    free(held_start); free(held_want); free(held_got);
    free(head_host);
    pair_free(head); pair_free(head16);
    pair_free(dout16);
    free(wte_start); free(wpe_start); free(want_wte); free(want_wpe);
    int_pair_free(tokens);
    buckets_free(host);
    gpu_buckets_free(buckets);
    pair_free(dout); pair_free(dwte); pair_free(dwpe);
}

/* GELU's backward with fc's bias at GPT-2's shape (12 x 1024 rows and a
 * short last part, 3072 wide), in place, in both forms, in fp32 and in
 * bf16: three runs of the GPU's fused op, each the bytes of the GPU's ops it
 * stands for (the gradient alone, round_to_bf16 in bf16, then
 * bias_backward rounding alike); and near the CPU's (GELU's transcendentals differ by ulps,
 * so a rare element rounds to the next bf16). */
Test(gpu, gelu_backward_with_the_bias_at_gpt2s_shape, .timeout = 300) {
    need_gpu();
    int N = 12 * 1024 + 77, OC = 3072;
    size_t n = (size_t)N * OC;
    Pair x = pair_random(n, -4, 4, 81), dy = pair_random(n, -1, 1, 82), dinp = pair_random(n, -1, 1, 82);
    Pair apart = pair_random(n, -1, 1, 83), dbias = pair_random((size_t)OC, -1, 1, 84);
    Pair dbias_apart = pair_random((size_t)OC, -1, 1, 84);
    Pair scratch = pair_random(column_sums_scratch_floats(N, OC), -1, 1, 85);
    float *bias_start = malloc(OC * sizeof(float)), *want = malloc(n * sizeof(float));
    float *want_bias = malloc(OC * sizeof(float)), *got = malloc(n * sizeof(float)), *got_bias = malloc(OC * sizeof(float));
    memcpy(bias_start, dbias.cpu, OC * sizeof(float));
    for (int tanh_form = 0; tanh_form < 2; tanh_form++)
        for (int p = 0; p < DTYPES; p++) {
            DType rounding = (DType)p;
            const char *form = tanh_form ? "tanh" : "erf", *dtype = DTYPE_TRAITS[p].name;
            gelu_backward(gpu_stream, fp32_buf(apart.gpu), fp32_buf(NULL), fp32_numbers(x.gpu), fp32_numbers(dy.gpu), N,
                          OC, tanh_form, DTYPE_FP32, NULL);
            if (rounding == DTYPE_BF16) round_to_bf16(gpu_stream, apart.gpu, apart.gpu, n);
            stream_copy(gpu_stream, dbias_apart.gpu, bias_start, OC * sizeof(float));
            bias_backward(gpu_stream, fp32_buf(dbias_apart.gpu), fp32_numbers(apart.gpu), N, OC, scratch.gpu,
                          rounding);
            stream_copy(gpu_stream, want, apart.gpu, n * sizeof(float));
            stream_copy(gpu_stream, want_bias, dbias_apart.gpu, OC * sizeof(float));
            for (int run = 0; run < 3; run++) {
                stream_copy(gpu_stream, dinp.gpu, dy.gpu, n * sizeof(float));
                stream_copy(gpu_stream, dbias.gpu, bias_start, OC * sizeof(float));
                gelu_backward(gpu_stream, fp32_buf(dinp.gpu), fp32_buf(dbias.gpu), fp32_numbers(x.gpu),
                              fp32_numbers(dinp.gpu), N, OC, tanh_form, rounding, scratch.gpu);
                stream_copy(gpu_stream, got, dinp.gpu, n * sizeof(float));
                stream_copy(gpu_stream, got_bias, dbias.gpu, OC * sizeof(float));
                stream_synchronize(gpu_stream);
                cr_expect_eq(memcmp(got, want, n * sizeof(float)), 0, "%s, %s, run %d: the fused gradient", form,
                             dtype, run);
                cr_expect_eq(memcmp(got_bias, want_bias, OC * sizeof(float)), 0, "%s, %s, run %d: the fused bias sums",
                             form, dtype, run);
            }
            memcpy(dinp.cpu, dy.cpu, n * sizeof(float));
            memcpy(dbias.cpu, bias_start, OC * sizeof(float));
            gelu_backward(test_stream, fp32_buf(dinp.cpu), fp32_buf(dbias.cpu), fp32_numbers(x.cpu),
                          fp32_numbers(dinp.cpu), N, OC, tanh_form, rounding, scratch.cpu);
            double e = gpu_error(dinp, rms_rel_error), eb = gpu_error(dbias, rms_rel_error);
            cr_expect_lt(e, 1e-3, "%s, %s: the gradient, GPU against CPU, rms relative error %g", form, dtype, e);
            cr_expect_lt(eb, 1e-3, "%s, %s: the bias sums, GPU against CPU, rms relative error %g", form, dtype, eb);
        }
    free(bias_start); free(want); free(want_bias); free(got); free(got_bias);
    pair_free(x); pair_free(dy); pair_free(dinp); pair_free(apart); pair_free(dbias); pair_free(dbias_apart);
    pair_free(scratch);
}

/* The ops that read an input held in bf16 (what the model keeps of a block,
 * read in place by the backward), at GPT-2's shape (12 x 1024 rows, 768 and
 * 3072 wide): three runs each from bf16, each the bytes of the same op's run
 * from the same values held in fp32; and GELU writing bf16, the bytes of its
 * fp32 output stored. */
Test(gpu, inputs_held_in_bf16_give_the_bytes_of_their_fp32_values_at_gpt2s_shape, .timeout = 300) {
    need_gpu();
    int N = 12 * 1024, C = 768, OC = 3072;
    size_t nx = (size_t)N * OC, nc = (size_t)N * C;
    Pair x = pair_random(nx, -2, 2, 91), dy = pair_random(nx, -1, 1, 92), w = pair_random((size_t)OC * C, -1, 1, 93);
    Pair lw = pair_random((size_t)C, 0.5f, 1.5f, 94), mean = pair_random((size_t)N, -1, 1, 95);
    Pair rstd = pair_random((size_t)N, 0.5f, 2, 96), held = pair_random((nx + 1) / 2, 0, 1, 97);  /* two bf16 a float */
    Pair out = pair_random(nx, -1, 1, 98), dw = pair_random((size_t)OC * C, -1, 1, 99);
    Pair db = pair_random((size_t)OC, -1, 1, 100), gelu16 = pair_random((nx + 1) / 2, 0, 1, 102);
    Pair scratch = pair_random(column_sums_scratch_floats(N, 2 * OC), 0, 1, 101);
    pair_round_to_bf16(x);
    store_bf16(gpu_stream, (bf16 *)held.gpu, x.gpu, nx);
    ConstBuf in[2] = { fp32_numbers(x.gpu), bf16_numbers((const bf16 *)held.gpu) };
    for (int run = 0; run < 4; run++) {  /* run 0 from fp32, the rest from bf16 */
        fill_zero(gpu_stream, out.gpu, nc);
        fill_zero(gpu_stream, dw.gpu, (size_t)C);
        fill_zero(gpu_stream, db.gpu, (size_t)C);
        layernorm_backward(gpu_stream, fp32_buf(out.gpu), fp32_buf(dw.gpu), fp32_buf(db.gpu), fp32_numbers(dy.gpu),
                           in[run > 0], fp32_numbers(lw.gpu), mean.gpu, rstd.gpu, N, C, scratch.gpu, DTYPE_BF16);
        if (run == 0) {
            pair_take_gpu(out);
            pair_take_gpu(dw);
            pair_take_gpu(db);
            continue;
        }
        expect_same_bytes(out, nc * sizeof(float), "layernorm_backward's dinp from bf16");
        expect_same_bytes(dw, C * sizeof(float), "layernorm_backward's weight gradient from bf16");
        expect_same_bytes(db, C * sizeof(float), "layernorm_backward's bias gradient from bf16");
    }
    for (int tanh_form = 0; tanh_form < 2; tanh_form++)
        for (int run = 0; run < 4; run++) {
            gelu_forward(gpu_stream, fp32_buf(out.gpu), in[run > 0], nx, tanh_form, DTYPE_BF16);
            if (run == 0) pair_take_gpu(out);
            else expect_same_bytes(out, nx * sizeof(float), tanh_form ? "gelu_forward, tanh form, from bf16"
                                                                      : "gelu_forward from bf16");
        }
    /* GELU written into bf16 (where the model keeps it), from either: the
     * bytes of its fp32 output (out, the last run's) stored */
    bf16 *want16 = malloc(nx * sizeof(bf16)), *got16 = malloc(nx * sizeof(bf16));
    for (size_t i = 0; i < nx; i++) want16[i] = bf16_from_float(out.cpu[i]);
    for (int run = 0; run < 4; run++) {
        fill_zero(gpu_stream, gelu16.gpu, gelu16.n);
        gelu_forward(gpu_stream, bf16_buf((bf16 *)gelu16.gpu), in[run > 0], nx, 1, DTYPE_BF16);
        stream_copy(gpu_stream, got16, gelu16.gpu, nx * sizeof(bf16));
        stream_synchronize(gpu_stream);
        cr_expect_eq(memcmp(got16, want16, nx * sizeof(bf16)), 0, "gelu_forward into bf16, from %s",
                     run ? "bf16" : "fp32");
    }
    free(want16);
    free(got16);
    for (int run = 0; run < 4; run++) {
        fill_zero(gpu_stream, db.gpu, (size_t)OC);
        gelu_backward(gpu_stream, fp32_buf(out.gpu), fp32_buf(db.gpu), in[run > 0], fp32_numbers(dy.gpu), N, OC, 1,
                      DTYPE_BF16, scratch.gpu);
        if (run == 0) {
            pair_take_gpu(out);
            pair_take_gpu(db);
            continue;
        }
        expect_same_bytes(out, nx * sizeof(float), "gelu_backward from bf16");
        expect_same_bytes(db, OC * sizeof(float), "gelu_backward's bias sums from bf16");
    }
    pair_round_to_bf16(w);
    pair_round_to_bf16(dy);
    for (int run = 0; run < 4; run++) {  /* the product's input: x's first N x C */
        matmul_forward_bf16(gpu_stream, fp32_buf(out.gpu), in[run > 0], fp32_numbers(w.gpu), fp32_numbers(NULL), N, C,
                            OC);
        if (run == 0) pair_take_gpu(out);
        else expect_same_bytes(out, nx * sizeof(float), "matmul_forward_bf16 from bf16");
    }
    for (int run = 0; run < 4; run++) {
        fill_zero(gpu_stream, dw.gpu, (size_t)OC * C);
        matmul_backward_bf16(gpu_stream, fp32_buf(out.gpu), fp32_buf(dw.gpu), fp32_numbers(dy.gpu), in[run > 0],
                             fp32_numbers(w.gpu), N, C, OC);
        if (run == 0) {
            pair_take_gpu(out);
            pair_take_gpu(dw);
            continue;
        }
        expect_same_bytes(out, nc * sizeof(float), "matmul_backward_bf16's dinp from bf16");
        expect_same_bytes(dw, (size_t)OC * C * sizeof(float), "matmul_backward_bf16's weight gradient from bf16");
    }
    pair_free(x); pair_free(dy); pair_free(w); pair_free(lw); pair_free(mean); pair_free(rstd); pair_free(held);
    pair_free(out); pair_free(dw); pair_free(db); pair_free(scratch); pair_free(gelu16);
}

Test(gpu, elementwise_ops) {
    need_gpu();
    size_t n = 100003;
    Dropout drop = { 0.3f, 5, 2, 7, 3, NULL };
    Pair x = pair_random(n, -3, 3, 41), y = pair_random(n, -1, 1, 42), out = pair_random(n, -1, 1, 43);
    for (int tanh_form = 0; tanh_form < 2; tanh_form++) {
        gelu_forward(test_stream, fp32_buf(out.cpu), fp32_numbers(x.cpu), n, tanh_form, DTYPE_FP32);
        gelu_forward(gpu_stream, fp32_buf(out.gpu), fp32_numbers(x.gpu), n, tanh_form, DTYPE_FP32);
        expect_match(out, ELEMENTWISE_TOL, tanh_form ? "gelu forward, tanh form" : "gelu forward");
        gelu_backward(test_stream, fp32_buf(out.cpu), fp32_buf(NULL), fp32_numbers(x.cpu), fp32_numbers(y.cpu), 1,
                      (int)n, tanh_form, DTYPE_FP32, NULL);
        gelu_backward(gpu_stream, fp32_buf(out.gpu), fp32_buf(NULL), fp32_numbers(x.gpu), fp32_numbers(y.gpu), 1,
                      (int)n, tanh_form, DTYPE_FP32, NULL);
        expect_match(out, ELEMENTWISE_TOL, tanh_form ? "gelu backward, tanh form" : "gelu backward");
    }
    residual_forward(test_stream, fp32_buf(out.cpu), fp32_numbers(x.cpu), fp32_numbers(y.cpu), n, DTYPE_FP32);
    residual_forward(gpu_stream, fp32_buf(out.gpu), fp32_numbers(x.gpu), fp32_numbers(y.gpu), n, DTYPE_FP32);
    expect_match(out, ELEMENTWISE_TOL, "residual");
    dropout_forward(test_stream, fp32_buf(out.cpu), fp32_numbers(x.cpu), n, drop, DTYPE_FP32);
    dropout_forward(gpu_stream, fp32_buf(out.gpu), fp32_numbers(x.gpu), n, drop, DTYPE_FP32);
    expect_match(out, ELEMENTWISE_TOL, "dropout (the same Philox mask)");
    fill_zero(test_stream, out.cpu, n);
    fill_zero(gpu_stream, out.gpu, n);
    expect_match(y, ELEMENTWISE_TOL, "an untouched input");
    float *zeros = malloc(n * sizeof(float));
    stream_copy(gpu_stream, zeros, out.gpu, n * sizeof(float));
    stream_synchronize(gpu_stream);
    size_t nonzero = 0;
    for (size_t i = 0; i < n; i++) nonzero += zeros[i] != 0.0f;
    cr_expect_eq(nonzero, 0, "fill_zero left %zu values", nonzero);
    free(zeros);
    pair_free(x); pair_free(y); pair_free(out);
}

/* The elementwise ops that take 8 numbers a thread (kernels/packs.h). */
enum { PACKED_GELU, PACKED_GELU_BACKWARD, PACKED_RESIDUAL, PACKED_DROPOUT, PACKED_BIAS, PACKED_CONVERT,
       PACKED_OPS };
static const char *const PACKED_NAMES[PACKED_OPS] = { "gelu_forward", "gelu_backward", "residual_forward",
                                                      "dropout_forward", "bias_forward", "a conversion" };

/* Op `op` over n numbers in precision `held`, its inputs x and y copied as
 * held to `in` numbers into xs and ys, its output `out` numbers into outs:
 * the output's bytes into got, their count returned. The conversions: in
 * fp32 round_to_bf16, in bf16 store_bf16 (from fp32 x) and load_bf16 after it
 * (back into fp32, in ys). bias_forward reads its input in fp32, as its op
 * does, and its bias from y's first C, in rows of a width no pack divides. */
static size_t packed_op_bytes(int op, DType held, size_t in, size_t out, Pair x, Pair y, float *xs, float *ys,
                              float *outs, size_t n, void *got) {
    size_t size = number_bytes(held);
    void *xa = (char *)xs + in * size, *ya = (char *)ys + in * size, *oa = (char *)outs + out * size;
    if (held == DTYPE_BF16) {
        store_bf16(gpu_stream, xa, x.gpu, n);
        store_bf16(gpu_stream, ya, y.gpu, n);
    } else {
        stream_copy(gpu_stream, xa, x.gpu, n * sizeof(float));
        stream_copy(gpu_stream, ya, y.gpu, n * sizeof(float));
    }
    ConstBuf X = { xa, held }, Y = { ya, held };
    Buf O = { oa, held };
    Dropout drop = { 0.3f, 5, 2, 7, 3, NULL };
    int C = 33334, N = (int)(n / C);
    switch (op) {
    case PACKED_GELU: gelu_forward(gpu_stream, O, X, n, 0, held); break;
    case PACKED_GELU_BACKWARD: gelu_backward(gpu_stream, O, fp32_buf(NULL), X, Y, 1, (int)n, 1, held, NULL); break;
    case PACKED_RESIDUAL: residual_forward(gpu_stream, O, X, Y, n, held); break;
    case PACKED_DROPOUT: dropout_forward(gpu_stream, O, X, n, drop, held); break;
    case PACKED_BIAS:
        stream_copy(gpu_stream, xs + in, x.gpu, n * sizeof(float));
        bias_forward(gpu_stream, O, xs + in, Y, N, C, held);
        n = (size_t)N * C;
        break;
    default:
        if (held == DTYPE_FP32) {
            round_to_bf16(gpu_stream, (float *)oa, xs + in, n);
        } else {
            store_bf16(gpu_stream, oa, x.gpu, n);
            load_bf16(gpu_stream, ys + in, oa, n);
            oa = ys + in;
            size = sizeof(float);
        }
    }
    stream_copy(gpu_stream, got, oa, n * size);
    stream_synchronize(gpu_stream);
    return n * size;
}

/* Every packed op over n = 100003 numbers (a short last tile), in fp32 and
 * in bf16, with every buffer on a 16-byte boundary (8 numbers a thread by
 * 16-byte loads and stores, the last tile one at a time), with the inputs
 * one number past it, and with the output one past it (each tile one at a
 * time, 256 apart): the same bytes. */
Test(gpu, packed_ops_give_the_same_bytes_on_a_boundary_and_off_it) {
    need_gpu();
    size_t n = 100003, room = n + PACK_NUMBERS;
    Pair x = pair_random(n, -3, 3, 61), y = pair_random(n, -1, 1, 62);
    Pair xs = pair_random(room, 0, 1, 63), ys = pair_random(room, 0, 1, 64), outs = pair_random(room, 0, 1, 65);
    const size_t in[3] = { 0, 1, 0 }, out[3] = { 0, 0, 1 };
    const char *where[3] = { "", "the inputs one past a boundary", "the output one past a boundary" };
    unsigned char *got[3];
    for (int w = 0; w < 3; w++) {
        got[w] = malloc(room * sizeof(float));
        cr_assert(got[w]);
    }
    for (int p = 0; p < DTYPES; p++)
        for (int op = 0; op < PACKED_OPS; op++) {
            size_t bytes[3];
            for (int w = 0; w < 3; w++)
                bytes[w] = packed_op_bytes(op, (DType)p, in[w], out[w], x, y, xs.gpu, ys.gpu, outs.gpu, n, got[w]);
            for (int w = 1; w < 3; w++)
                cr_expect(bytes[w] == bytes[0] && memcmp(got[w], got[0], bytes[0]) == 0,
                          "%s in %s: %s differs from every buffer on its boundary", PACKED_NAMES[op],
                          DTYPE_TRAITS[p].name, where[w]);
        }
    for (int w = 0; w < 3; w++) free(got[w]);
    pair_free(x); pair_free(y); pair_free(xs); pair_free(ys); pair_free(outs);
}

/* The fused classifier at GPT-2's shape (V = 50304, 2048 rows; row 1's
 * largest logit last, so that the online max grows at the end): the GPU's
 * losses and dlogits are the CPU's bytes (the same partials, tree and
 * arithmetic: online_softmax.h), out of place and in place over the logits
 * as the model runs it; three more runs on the GPU, each the first's bytes;
 * the mean loss within REDUCTION_TOL (a tree in double here, in order there).
 * Within ELEMENTWISE_TOL first, so that a failure says how far off it is. */
Test(gpu, crossentropy_forward_backward) {
    need_gpu();
    int N = 2048, V = 50304;
    size_t n = (size_t)N * V;
    float dloss = 1.0f / (float)N;
    IntPair targets = tokens_random((size_t)N, V, 51);
    Pair logits = pair_random(n, -8, 8, 52), dlogits = pair_random(n, -1, 1, 56);
    Pair losses = pair_random((size_t)N, 0, 1, 54), mean = pair_random(1, 0, 1, 55);
    logits.cpu[2 * (size_t)V - 1] = 20.0f;
    stream_copy(gpu_stream, logits.gpu + 2 * (size_t)V - 1, logits.cpu + 2 * (size_t)V - 1, sizeof(float));
    crossentropy_forward_backward(test_stream, losses.cpu, fp32_buf(dlogits.cpu), fp32_numbers(logits.cpu),
                                  targets.cpu, N, V, dloss, DTYPE_FP32);
    crossentropy_forward_backward(gpu_stream, losses.gpu, fp32_buf(dlogits.gpu), fp32_numbers(logits.gpu),
                                  targets.gpu, N, V, dloss, DTYPE_FP32);
    mean_forward(test_stream, mean.cpu, losses.cpu, N);
    mean_forward(gpu_stream, mean.gpu, losses.gpu, N);
    expect_match(losses, ELEMENTWISE_TOL, "losses");
    expect_match(dlogits, ELEMENTWISE_TOL, "dlogits");
    expect_match(mean, REDUCTION_TOL, "mean loss");
    expect_same_bytes(losses, (size_t)N * sizeof(float), "the GPU's losses differ from the CPU's");
    expect_same_bytes(dlogits, n * sizeof(float), "the GPU's dlogits differ from the CPU's");

    float *first = malloc(n * sizeof(float)), *again = malloc(n * sizeof(float));
    stream_copy(gpu_stream, first, dlogits.gpu, n * sizeof(float));
    for (int run = 0; run < 3; run++) {
        fill_zero(gpu_stream, dlogits.gpu, n);
        crossentropy_forward_backward(gpu_stream, losses.gpu, fp32_buf(dlogits.gpu), fp32_numbers(logits.gpu),
                                      targets.gpu, N, V, dloss, DTYPE_FP32);
        stream_copy(gpu_stream, again, dlogits.gpu, n * sizeof(float));
        stream_synchronize(gpu_stream);
        cr_expect_eq(memcmp(first, again, n * sizeof(float)), 0, "run %d: other dlogits than the first run's", run + 2);
    }

    crossentropy_forward_backward(test_stream, losses.cpu, fp32_buf(NULL), fp32_numbers(logits.cpu), targets.cpu, N,
                                  V, dloss, DTYPE_FP32);
    crossentropy_forward_backward(gpu_stream, losses.gpu, fp32_buf(NULL), fp32_numbers(logits.gpu), targets.gpu, N, V,
                                  dloss, DTYPE_FP32);
    expect_same_bytes(losses, (size_t)N * sizeof(float), "the losses alone (no gradient): the GPU's differ");
    crossentropy_forward_backward(test_stream, losses.cpu, fp32_buf(logits.cpu), fp32_numbers(logits.cpu),
                                  targets.cpu, N, V, dloss, DTYPE_FP32);
    crossentropy_forward_backward(gpu_stream, losses.gpu, fp32_buf(logits.gpu), fp32_numbers(logits.gpu), targets.gpu,
                                  N, V, dloss, DTYPE_FP32);
    expect_same_bytes(logits, n * sizeof(float), "in place, the GPU's dlogits differ from the CPU's");
    expect_same_bytes(losses, (size_t)N * sizeof(float), "in place, the GPU's losses differ from the CPU's");
    cr_expect_eq(memcmp(logits.cpu, dlogits.cpu, n * sizeof(float)), 0, "in place gives other dlogits");
    free(first); free(again);
    int_pair_free(targets);
    pair_free(logits); pair_free(losses); pair_free(mean); pair_free(dlogits);
}

/* Run k of an op: the first's GPU bytes taken (k = 0), the second's held to them. */
static void take_or_expect(Pair p, int k, const char *what) {
    if (k == 0) pair_take_gpu(p);
    else expect_same_bytes(p, p.n * sizeof(float), what);
}

/* The weights held in bf16 (a model's compute copy under autocast) at
 * GPT-2's shape (12 x 1024 rows, 768 wide, the MLP's 3072, V = 50304): every
 * op that reads a weight gives the bytes it gives the same values held in
 * fp32; the product reads its bf16 weight in place where it staged the fp32
 * one (both on a 256-byte boundary: the same cuBLASLt algorithm). */
Test(gpu, weights_held_in_bf16_give_the_bytes_of_their_fp32_values_at_gpt2s_shape, .timeout = 300) {
    need_gpu();
    int B = 12, T = 1024, N = B * T, C = 768, OC = 3072, V = 50304;
    size_t n = (size_t)N * C, nw = (size_t)OC * C, nv = (size_t)V * C + (size_t)T * C;  /* wte, then wpe */
    Pair x = pair_random(n, -2, 2, 141), b = pair_random(n, -1, 1, 142), dy = pair_random((size_t)N * OC, -1, 1, 143);
    Pair w = pair_random(nw, -1, 1, 144), lw = pair_random(2 * (size_t)C, 0.5f, 1.5f, 145);
    Pair emb = pair_random(nv, -1, 1, 146);
    Pair out = pair_random((size_t)N * OC, 0, 1, 147), out2 = pair_random(n, 0, 1, 148);
    Pair dw = pair_random(nw, 0, 1, 149), db = pair_random(2 * (size_t)C, 0, 1, 150);
    Pair stats = pair_random(2 * (size_t)N, 0.5f, 2, 151);
    Pair scratch = pair_random(column_sums_scratch_floats(N, 2 * C), 0, 1, 152);
    Pair w16 = pair_random((nw + 1) / 2, 0, 1, 153), lw16 = pair_random((size_t)C, 0, 1, 154);
    Pair emb16 = pair_random((nv + 1) / 2, 0, 1, 155);
    IntPair tokens = tokens_random((size_t)N, V, 156);
    pair_round_to_bf16(w);
    pair_round_to_bf16(lw);
    pair_round_to_bf16(emb);
    store_bf16(gpu_stream, (bf16 *)w16.gpu, w.gpu, nw);
    store_bf16(gpu_stream, (bf16 *)lw16.gpu, lw.gpu, 2 * (size_t)C);
    store_bf16(gpu_stream, (bf16 *)emb16.gpu, emb.gpu, nv);
    const bf16 *lw_held = (const bf16 *)lw16.gpu, *emb_held = (const bf16 *)emb16.gpu;
    ConstBuf weight[2] = { fp32_numbers(lw.gpu), bf16_numbers(lw_held) };
    ConstBuf bias[2] = { fp32_numbers(lw.gpu + C), bf16_numbers(lw_held + C) };
    ConstBuf product_weight[2] = { fp32_numbers(w.gpu), bf16_numbers((const bf16 *)w16.gpu) };
    ConstBuf wte[2] = { fp32_numbers(emb.gpu), bf16_numbers(emb_held) };
    ConstBuf wpe[2] = { fp32_numbers(emb.gpu + (size_t)V * C), bf16_numbers(emb_held + (size_t)V * C) };
    for (int k = 0; k < 2; k++) {
        layernorm_forward(gpu_stream, fp32_buf(out2.gpu), stats.gpu, stats.gpu + N, fp32_numbers(x.gpu), weight[k],
                          bias[k], N, C, DTYPE_BF16);
        take_or_expect(out2, k, "layernorm_forward with a bf16 weight and bias");
    }
    for (int k = 0; k < 2; k++) {
        residual_layernorm_forward(gpu_stream, fp32_buf(out.gpu), fp32_buf(out2.gpu), stats.gpu, stats.gpu + N,
                                   fp32_numbers(x.gpu), fp32_numbers(b.gpu), weight[k], bias[k], N, C, DTYPE_BF16);
        take_or_expect(out2, k, "residual_layernorm_forward with a bf16 weight and bias");
    }
    for (int k = 0; k < 2; k++) {
        fill_zero(gpu_stream, out2.gpu, n);
        fill_zero(gpu_stream, db.gpu, 2 * (size_t)C);
        layernorm_backward(gpu_stream, fp32_buf(out2.gpu), fp32_buf(db.gpu), fp32_buf(db.gpu + C), fp32_numbers(dy.gpu),
                           fp32_numbers(x.gpu), weight[k], stats.gpu, stats.gpu + N, N, C, scratch.gpu, DTYPE_BF16);
        take_or_expect(out2, k, "layernorm_backward's dinp from a bf16 weight");
        take_or_expect(db, k, "layernorm_backward's weight and bias gradients from a bf16 weight");
    }
    for (int k = 0; k < 2; k++) {
        bias_forward(gpu_stream, fp32_buf(out2.gpu), b.gpu, bias[k], N, C, DTYPE_BF16);
        take_or_expect(out2, k, "bias_forward with a bf16 bias");
    }
    for (int k = 0; k < 2; k++) {
        embedding_forward(gpu_stream, fp32_buf(out2.gpu), tokens.gpu, wte[k], wpe[k], B, T, C, DTYPE_BF16);
        take_or_expect(out2, k, "embedding_forward from bf16 wte and wpe");
    }
    for (int k = 0; k < 2; k++) {
        matmul_forward_bf16(gpu_stream, fp32_buf(out.gpu), fp32_numbers(x.gpu), product_weight[k], fp32_numbers(NULL),
                            N, C, OC);
        take_or_expect(out, k, "matmul_forward_bf16 from a bf16 weight in place");
    }
    /* with a bias into bf16 (a kept Linear's output): within one bf16 step of the fp32 product with
     * bias_forward's rounding (cuBLASLt's kernel with the bias epilogue may sum in another order), and the same
     * bytes on each of three runs */
    Pair bias_oc = pair_random((size_t)OC, -1, 1, 157), bias16 = pair_random(((size_t)OC + 1) / 2, 0, 1, 158);
    Pair out16 = pair_random(((size_t)N * OC + 1) / 2, 0, 1, 159);
    pair_round_to_bf16(bias_oc);
    store_bf16(gpu_stream, (bf16 *)bias16.gpu, bias_oc.gpu, (size_t)OC);
    matmul_forward_bf16(gpu_stream, fp32_buf(out.gpu), fp32_numbers(x.gpu), product_weight[1], fp32_numbers(NULL), N,
                        C, OC);
    bias_forward(gpu_stream, fp32_buf(out.gpu), out.gpu, fp32_numbers(bias_oc.gpu), N, OC, DTYPE_BF16);
    pair_take_gpu(out);
    size_t nout = (size_t)N * OC;
    bf16 *first = malloc(nout * sizeof(bf16)), *again = malloc(nout * sizeof(bf16));
    for (int run = 0; run < 3; run++) {
        matmul_forward_bf16(gpu_stream, bf16_buf((bf16 *)out16.gpu), fp32_numbers(x.gpu), product_weight[1],
                            bf16_numbers((const bf16 *)bias16.gpu), N, C, OC);
        stream_copy(gpu_stream, run ? again : first, out16.gpu, nout * sizeof(bf16));
        stream_synchronize(gpu_stream);
        if (run) cr_expect_eq(memcmp(first, again, nout * sizeof(bf16)), 0, "run %d: other bf16 outputs", run + 1);
    }
    expect_within_a_bf16_step(first, out.cpu, nout, "matmul_forward_bf16 with its bias into bf16");
    free(first);
    free(again);
    pair_free(bias_oc);
    pair_free(bias16);
    pair_free(out16);
    for (int k = 0; k < 2; k++) {
        fill_zero(gpu_stream, dw.gpu, nw);
        matmul_backward_bf16(gpu_stream, fp32_buf(out2.gpu), fp32_buf(dw.gpu), fp32_numbers(dy.gpu),
                             fp32_numbers(x.gpu), product_weight[k], N, C, OC);
        take_or_expect(out2, k, "matmul_backward_bf16's dinp from a bf16 weight in place");
        take_or_expect(dw, k, "matmul_backward_bf16's weight gradient from a bf16 weight in place");
    }
    /* a branch's output held in bf16 (b's values): the residual add and the fused add the bytes of fp32's */
    Pair b16 = pair_random((n + 1) / 2, 0, 1, 160);
    pair_round_to_bf16(b);
    store_bf16(gpu_stream, (bf16 *)b16.gpu, b.gpu, n);
    ConstBuf branch[2] = { fp32_numbers(b.gpu), bf16_numbers((const bf16 *)b16.gpu) };
    for (int k = 0; k < 2; k++) {
        residual_forward(gpu_stream, fp32_buf(out2.gpu), fp32_numbers(x.gpu), branch[k], n, DTYPE_BF16);
        take_or_expect(out2, k, "residual_forward from a bf16 branch");
    }
    for (int k = 0; k < 2; k++) {
        residual_layernorm_forward(gpu_stream, fp32_buf(out.gpu), fp32_buf(out2.gpu), stats.gpu, stats.gpu + N,
                                   fp32_numbers(x.gpu), branch[k], weight[0], bias[0], N, C, DTYPE_BF16);
        take_or_expect(out2, k, "residual_layernorm_forward from a bf16 branch");
    }
    pair_free(b16);
    int_pair_free(tokens);
    pair_free(x); pair_free(b); pair_free(dy); pair_free(w); pair_free(lw); pair_free(emb); pair_free(out);
    pair_free(out2); pair_free(dw); pair_free(db); pair_free(stats); pair_free(scratch); pair_free(w16);
    pair_free(lw16); pair_free(emb16);
}

/* The activation gradients held in bf16 at GPT-2's shape (12 x 1024 rows,
 * the MLP's 3072 wide): GELU's backward in place over a bf16 gradient, the
 * bytes of its fp32 output stored (and its bias sums the same); LayerNorm's
 * backward from a bf16 gradient, the bytes of the same values in fp32; the
 * MLP's projection's backward writing the hidden gradient in bf16, within
 * one bf16 step of its fp32 output (cuBLASLt may pick another kernel for a
 * bf16 output), the same bytes on each of three runs. */
Test(gpu, activation_gradients_held_in_bf16_at_gpt2s_shape, .timeout = 300) {
    need_gpu();
    int N = 12 * 1024, C = 768, OC = 3072;
    size_t n = (size_t)N * OC, nc = (size_t)N * C, nw = (size_t)OC * C;
    Pair x = pair_random(n, -2, 2, 171), dy = pair_random(n, -1, 1, 172), w = pair_random(nw, -1, 1, 173);
    Pair out = pair_random(n, 0, 1, 174), db = pair_random(2 * (size_t)OC, 0, 1, 175);
    Pair lw = pair_random((size_t)C, 0.5f, 1.5f, 176);
    Pair x16 = pair_random((n + 1) / 2, 0, 1, 177), dy16 = pair_random((n + 1) / 2, 0, 1, 178);
    Pair got16 = pair_random((n + 1) / 2, 0, 1, 179), stats = pair_random(2 * (size_t)N, 0.5f, 2, 180);
    Pair scratch = pair_random(column_sums_scratch_floats(N, 2 * OC), 0, 1, 181), dw = pair_random(nw, 0, 1, 182);
    pair_round_to_bf16(x);
    pair_round_to_bf16(dy);
    pair_round_to_bf16(w);
    store_bf16(gpu_stream, (bf16 *)x16.gpu, x.gpu, n);
    store_bf16(gpu_stream, (bf16 *)dy16.gpu, dy.gpu, n);
    const bf16 *x_held = (const bf16 *)x16.gpu, *dy_held = (const bf16 *)dy16.gpu;
    bf16 *got_held = (bf16 *)got16.gpu;
    fill_zero(gpu_stream, db.gpu, 2 * (size_t)OC);
    gelu_backward(gpu_stream, fp32_buf(out.gpu), fp32_buf(db.gpu), fp32_numbers(x.gpu), fp32_numbers(dy.gpu), N, OC, 1,
                  DTYPE_BF16, scratch.gpu);
    stream_copy(gpu_stream, got16.gpu, dy16.gpu, n * sizeof(bf16));
    gelu_backward(gpu_stream, bf16_buf(got_held), fp32_buf(db.gpu + OC), bf16_numbers(x_held), bf16_numbers(got_held),
                  N, OC, 1, DTYPE_BF16, scratch.gpu);
    pair_take_gpu(out);
    pair_take_gpu(db);
    expect_stored_bytes(got16.gpu, out.cpu, n, "gelu_backward into bf16, in place");
    cr_expect_eq(memcmp(db.cpu, db.cpu + OC, OC * sizeof(float)), 0, "gelu_backward's bias sums into bf16");
    for (int k = 0; k < 2; k++) {
        fill_zero(gpu_stream, out.gpu, nc);
        fill_zero(gpu_stream, db.gpu, 2 * (size_t)C);
        layernorm_backward(gpu_stream, fp32_buf(out.gpu), fp32_buf(db.gpu), fp32_buf(db.gpu + C),
                           k ? bf16_numbers(dy_held) : fp32_numbers(dy.gpu), fp32_numbers(x.gpu), fp32_numbers(lw.gpu),
                           stats.gpu, stats.gpu + N, N, C, scratch.gpu, DTYPE_BF16);
        take_or_expect(out, k, "layernorm_backward's dinp from a bf16 gradient");
        take_or_expect(db, k, "layernorm_backward's weight and bias gradients from a bf16 gradient");
    }
    /* added into a bf16 dinp (the residual stream's gradient, held so: dy's first N x C as its value so far),
     * the bytes of the same add into fp32 stored */
    stream_copy(gpu_stream, out.gpu, dy.gpu, nc * sizeof(float));
    store_bf16(gpu_stream, got_held, dy.gpu, nc);
    layernorm_backward(gpu_stream, fp32_buf(out.gpu), fp32_buf(db.gpu), fp32_buf(db.gpu + C), bf16_numbers(dy_held),
                       fp32_numbers(x.gpu), fp32_numbers(lw.gpu), stats.gpu, stats.gpu + N, N, C, scratch.gpu,
                       DTYPE_BF16);
    layernorm_backward(gpu_stream, bf16_buf(got_held), fp32_buf(db.gpu), fp32_buf(db.gpu + C), bf16_numbers(dy_held),
                       fp32_numbers(x.gpu), fp32_numbers(lw.gpu), stats.gpu, stats.gpu + N, N, C, scratch.gpu,
                       DTYPE_BF16);
    pair_take_gpu(out);
    expect_stored_bytes(got16.gpu, out.cpu, nc, "layernorm_backward added into a bf16 dinp");
    /* a branch's gradient through its dropout, from the residual stream's, both in bf16 */
    Dropout drop = { 0.1f, 7, 0, 3, 4, NULL };
    dropout_backward(gpu_stream, fp32_buf(out.gpu), fp32_numbers(dy.gpu), nc, drop, DTYPE_BF16);
    dropout_backward(gpu_stream, bf16_buf(got_held), bf16_numbers(dy_held), nc, drop, DTYPE_BF16);
    pair_take_gpu(out);
    expect_stored_bytes(got16.gpu, out.cpu, nc, "dropout_backward from bf16 into bf16");
    /* the MLP's projection: dinp [N, 3072] from dout [N, 768] */
    fill_zero(gpu_stream, dw.gpu, nw);
    matmul_backward_bf16(gpu_stream, fp32_buf(out.gpu), fp32_buf(dw.gpu), fp32_numbers(dy.gpu), fp32_numbers(x.gpu),
                         fp32_numbers(w.gpu), N, OC, C);
    pair_take_gpu(out);
    bf16 *first = malloc(n * sizeof(bf16)), *again = malloc(n * sizeof(bf16));
    for (int run = 0; run < 3; run++) {
        matmul_backward_bf16(gpu_stream, bf16_buf(got_held), fp32_buf(dw.gpu), fp32_numbers(dy.gpu),
                             fp32_numbers(x.gpu), fp32_numbers(w.gpu), N, OC, C);
        stream_copy(gpu_stream, run ? again : first, got16.gpu, n * sizeof(bf16));
        stream_synchronize(gpu_stream);
        if (run) cr_expect_eq(memcmp(first, again, n * sizeof(bf16)), 0, "run %d: another bf16 dinp", run + 1);
    }
    expect_within_a_bf16_step(first, out.cpu, n, "matmul_backward_bf16's dinp into bf16");
    free(first); free(again);
    pair_free(x); pair_free(dy); pair_free(w); pair_free(out); pair_free(db); pair_free(lw); pair_free(x16);
    pair_free(dy16); pair_free(got16); pair_free(stats); pair_free(scratch); pair_free(dw);
}

/* The head in bf16 at GPT-2's shape (a chunk of 1024 rows, C = 768, V =
 * 50304): the product writes the logits in bf16, each within one bf16 step
 * of its fp32 output (cuBLASLt may pick another kernel for a bf16 output, so
 * another order of the fp32 sum), and the same bytes on each of three runs;
 * the loss over them in place gives the CPU op's losses and dlogits, bytes
 * (the same arithmetic: online_softmax.h); the product's backward from those
 * dlogits read in place gives the bytes of the same values staged from fp32. */
Test(gpu, the_heads_logits_and_dlogits_in_bf16_at_gpt2s_shape, .timeout = 300) {
    need_gpu();
    int N = 1024, C = 768, V = 50304;
    size_t nl = (size_t)N * V, nx = (size_t)N * C, nw = (size_t)V * C;
    float dloss = 1.0f / 3.0f;
    IntPair targets = tokens_random((size_t)N, V, 121);
    Pair x = pair_random(nx, -2, 2, 122), w = pair_random(nw, -0.2f, 0.2f, 123), out = pair_random(nl, 0, 1, 124);
    Pair logits16 = pair_random((nl + 1) / 2, 0, 1, 125), losses = pair_random((size_t)N, 0, 1, 126);
    Pair dx = pair_random(nx, 0, 1, 127), dw = pair_random(nw, 0, 1, 128);
    pair_round_to_bf16(x);
    pair_round_to_bf16(w);
    bf16 *first = malloc(nl * sizeof(bf16)), *again = malloc(nl * sizeof(bf16));
    matmul_forward_bf16(gpu_stream, fp32_buf(out.gpu), fp32_numbers(x.gpu), fp32_numbers(w.gpu), fp32_numbers(NULL),
                        N, C, V);
    pair_take_gpu(out);
    for (int run = 0; run < 3; run++) {
        matmul_forward_bf16(gpu_stream, bf16_buf((bf16 *)logits16.gpu), fp32_numbers(x.gpu), fp32_numbers(w.gpu),
                            fp32_numbers(NULL), N, C, V);
        stream_copy(gpu_stream, run ? again : first, logits16.gpu, nl * sizeof(bf16));
        stream_synchronize(gpu_stream);
        if (run) cr_expect_eq(memcmp(first, again, nl * sizeof(bf16)), 0, "run %d: other bf16 logits", run + 1);
    }
    expect_within_a_bf16_step(first, out.cpu, nl, "matmul_forward_bf16 into bf16 (the logits)");
    /* the loss in place over the bf16 logits, on both devices from the same bytes */
    bf16 *cpu16 = (bf16 *)logits16.cpu;
    memcpy(cpu16, first, nl * sizeof(bf16));
    crossentropy_forward_backward(test_stream, losses.cpu, bf16_buf(cpu16), bf16_numbers(cpu16), targets.cpu, N, V,
                                  dloss, DTYPE_BF16);
    crossentropy_forward_backward(gpu_stream, losses.gpu, bf16_buf((bf16 *)logits16.gpu),
                                  bf16_numbers((const bf16 *)logits16.gpu), targets.gpu, N, V, dloss, DTYPE_BF16);
    expect_same_bytes(losses, (size_t)N * sizeof(float), "the losses of bf16 logits: the GPU's differ from the CPU's");
    expect_same_bytes(logits16, nl * sizeof(bf16), "dlogits in bf16 in place: the GPU's differ from the CPU's");
    /* the backward from those dlogits in place, and from their values in fp32 (staged) */
    for (size_t i = 0; i < nl; i++) out.cpu[i] = float_from_bf16(cpu16[i]);
    stream_copy(gpu_stream, out.gpu, out.cpu, nl * sizeof(float));
    fill_zero(gpu_stream, dw.gpu, nw);
    matmul_backward_bf16(gpu_stream, fp32_buf(dx.gpu), fp32_buf(dw.gpu), fp32_numbers(out.gpu), fp32_numbers(x.gpu),
                         fp32_numbers(w.gpu), N, C, V);
    pair_take_gpu(dx);
    pair_take_gpu(dw);
    fill_zero(gpu_stream, dw.gpu, nw);
    matmul_backward_bf16(gpu_stream, fp32_buf(dx.gpu), fp32_buf(dw.gpu), bf16_numbers((const bf16 *)logits16.gpu),
                         fp32_numbers(x.gpu), fp32_numbers(w.gpu), N, C, V);
    expect_same_bytes(dx, nx * sizeof(float), "matmul_backward_bf16's dinp from bf16 dlogits");
    expect_same_bytes(dw, nw * sizeof(float), "matmul_backward_bf16's weight gradient from bf16 dlogits");
    free(first); free(again);
    int_pair_free(targets);
    pair_free(x); pair_free(w); pair_free(out); pair_free(logits16); pair_free(losses); pair_free(dx); pair_free(dw);
}

/* AdamW's table of an arena on both devices: tensors of 30000 numbers that
 * decay and of 7 that do not, in turn, 9 numbers of padding after each. */
enum { ADAMW_SPANS = 6 };
static Pair adamw_table(void) {
    size_t floats = (ADAMW_SPANS * sizeof(AdamWSpan) + sizeof(float) - 1) / sizeof(float);
    Pair table = pair_random(floats, 0, 1, 60);
    AdamWSpan *spans = (AdamWSpan *)table.cpu;
    for (size_t t = 0, at = 0; t < ADAMW_SPANS; t++) {
        size_t numel = t % 2 ? 7 : 30000;
        spans[t] = (AdamWSpan){ at, at + numel, t % 2 == 0 };
        at += numel + 9;
    }
    stream_copy(gpu_stream, table.gpu, table.cpu, floats * sizeof(float));
    return table;
}

/* AdamW over a range of the table's arena that starts inside its first
 * tensor, with the bf16 copy written, the GPU's the CPU's bytes; then the
 * norm's exact sum, the CPU's bytes, and AdamW again with the clip folded in,
 * from two parts (the sum twice), the CPU's bytes. */
Test(gpu, adamw_sumsq_and_clip) {
    need_gpu();
    size_t n = 70001, lo = 5000;
    Pair param = pair_random(n, -1, 1, 61), grad = pair_random(n, -1, 1, 62);
    Pair m = pair_random(n, -0.1f, 0.1f, 63), v = pair_random(n, 0, 0.01f, 64);
    Pair sumsq = pair_random(2 * SQUARE_SUM_FLOATS, 0, 1, 65);  /* two SquareSums, as floats */
    Pair copy = pair_random((n + 1) / 2, 0, 1, 59), table = adamw_table();
    Pair scratch = pair_random(sumsq_scratch_bytes(n) / sizeof(float), -1, 1, 66);
    AdamWParams hp = { 1e-3f, 0.9f, 0.95f, 1e-8f, 0.1f, 3 };
    adamw_arena(test_stream, param.cpu, (bf16 *)copy.cpu, grad.cpu, DTYPE_FP32, m.cpu, v.cpu, lo, n,
                (const AdamWSpan *)table.cpu, ADAMW_SPANS, hp, NO_CLIP);
    adamw_arena(gpu_stream, param.gpu, (bf16 *)copy.gpu, grad.gpu, DTYPE_FP32, m.gpu, v.gpu, lo, n,
                (const AdamWSpan *)table.gpu, ADAMW_SPANS, hp, NO_CLIP);
    expect_same_bytes(param, n * sizeof(float), "the GPU's AdamW weights differ from the CPU's");
    expect_same_bytes(m, n * sizeof(float), "the GPU's AdamW m differs from the CPU's");
    expect_same_bytes(v, n * sizeof(float), "the GPU's AdamW v differs from the CPU's");
    expect_same_bytes(copy, n * sizeof(bf16), "the GPU's bf16 copy of AdamW's weights differs from the CPU's");
    /* a second step, on the GPU its first element alone and the rest from one past a 16-byte boundary (each tile
     * one number at a time, packs.h): the CPU's bytes still */
    adamw_arena(test_stream, param.cpu, (bf16 *)copy.cpu, grad.cpu, DTYPE_FP32, m.cpu, v.cpu, lo, n,
                (const AdamWSpan *)table.cpu, ADAMW_SPANS, hp, NO_CLIP);
    for (size_t at = 0; at < 2; at++)
        adamw_arena(gpu_stream, param.gpu + at, (bf16 *)copy.gpu + at, grad.gpu + at, DTYPE_FP32, m.gpu + at,
                    v.gpu + at, lo + at, at ? n - 1 : 1, (const AdamWSpan *)table.gpu, ADAMW_SPANS, hp, NO_CLIP);
    expect_same_bytes(param, n * sizeof(float), "off a boundary, the GPU's AdamW weights differ from the CPU's");
    expect_same_bytes(m, n * sizeof(float), "off a boundary, the GPU's AdamW m differs from the CPU's");
    expect_same_bytes(v, n * sizeof(float), "off a boundary, the GPU's AdamW v differs from the CPU's");
    expect_same_bytes(copy, n * sizeof(bf16), "off a boundary, the GPU's bf16 copy differs from the CPU's");
    SquareSum *sums_cpu = (SquareSum *)sumsq.cpu, *sums_gpu = (SquareSum *)sumsq.gpu;
    sumsq_reduce(test_stream, sums_cpu, grad.cpu, DTYPE_FP32, n, scratch.cpu);
    sumsq_reduce(gpu_stream, sums_gpu, grad.gpu, DTYPE_FP32, n, scratch.gpu);
    expect_same_bytes(sumsq, sizeof(SquareSum), "the GPU's exact sum of squares differs from the CPU's");
    sums_cpu[1] = sums_cpu[0];
    stream_copy(gpu_stream, sums_gpu, sums_cpu, 2 * sizeof(SquareSum));
    adamw_arena(test_stream, param.cpu, (bf16 *)copy.cpu, grad.cpu, DTYPE_FP32, m.cpu, v.cpu, lo, n,
                (const AdamWSpan *)table.cpu, ADAMW_SPANS, hp, (AdamWClip){ sums_cpu, 2, 1.0f });
    adamw_arena(gpu_stream, param.gpu, (bf16 *)copy.gpu, grad.gpu, DTYPE_FP32, m.gpu, v.gpu, lo, n,
                (const AdamWSpan *)table.gpu, ADAMW_SPANS, hp, (AdamWClip){ sums_gpu, 2, 1.0f });
    expect_same_bytes(param, n * sizeof(float), "the GPU's clipped AdamW weights differ from the CPU's");
    expect_same_bytes(m, n * sizeof(float), "the GPU's clipped AdamW m differs from the CPU's");
    expect_same_bytes(v, n * sizeof(float), "the GPU's clipped AdamW v differs from the CPU's");
    pair_free(param); pair_free(grad); pair_free(m); pair_free(v); pair_free(sumsq); pair_free(scratch);
    pair_free(copy); pair_free(table);
}

/* Gradients held in bf16 (2 bytes each, in a Pair of half as many floats):
 * AdamW reading them, their norm, AdamW clipping them (each product rounded
 * to bf16) and a part added into them (residual_forward in place, as the
 * model adds a parameter's gradient), the GPU's against the CPU's; the
 * clipped step and the 16-bit sums byte for byte. */
Test(gpu, gradients_held_in_bf16_match_the_cpu) {
    need_gpu();
    size_t n = 70001, floats = (n + 1) / 2;
    Pair param = pair_random(n, -1, 1, 71), m = pair_random(n, -0.1f, 0.1f, 72), v = pair_random(n, 0, 0.01f, 73);
    Pair x = pair_random(n, -1, 1, 74), held = pair_random(floats, 0, 1, 76);
    Pair sumsq = pair_random(2 * SQUARE_SUM_FLOATS, 0, 1, 75);  /* two SquareSums, as floats */
    Pair scratch = pair_random(sumsq_scratch_bytes(n) / sizeof(float), -1, 1, 77);
    bf16 *grad = (bf16 *)held.cpu;
    for (size_t i = 0; i < n; i++) grad[i] = bf16_from_float(x.cpu[i] * 3.0f);
    stream_copy(gpu_stream, held.gpu, held.cpu, floats * sizeof(float));
    AdamWParams hp = { 1e-3f, 0.9f, 0.95f, 1e-8f, 0.1f, 3 };
    Pair table = adamw_table();
    adamw_arena(test_stream, param.cpu, NULL, held.cpu, DTYPE_BF16, m.cpu, v.cpu, 0, n,
                (const AdamWSpan *)table.cpu, ADAMW_SPANS, hp, NO_CLIP);
    adamw_arena(gpu_stream, param.gpu, NULL, held.gpu, DTYPE_BF16, m.gpu, v.gpu, 0, n,
                (const AdamWSpan *)table.gpu, ADAMW_SPANS, hp, NO_CLIP);
    expect_match(param, ELEMENTWISE_TOL, "adamw param, bf16 gradient");
    expect_match(v, ELEMENTWISE_TOL, "adamw v, bf16 gradient");
    SquareSum *sums_cpu = (SquareSum *)sumsq.cpu, *sums_gpu = (SquareSum *)sumsq.gpu;
    sumsq_reduce(test_stream, sums_cpu, held.cpu, DTYPE_BF16, n, scratch.cpu);
    sumsq_reduce(gpu_stream, sums_gpu, held.gpu, DTYPE_BF16, n, scratch.gpu);
    expect_same_bytes(sumsq, sizeof(SquareSum), "the GPU's exact sum of squares of a bf16 gradient differs");
    sums_cpu[1] = square_sum_zero();
    stream_copy(gpu_stream, sums_gpu, sums_cpu, 2 * sizeof(SquareSum));
    stream_copy(gpu_stream, param.gpu, param.cpu, n * sizeof(float));
    stream_copy(gpu_stream, m.gpu, m.cpu, n * sizeof(float));
    stream_copy(gpu_stream, v.gpu, v.cpu, n * sizeof(float));
    adamw_arena(test_stream, param.cpu, NULL, held.cpu, DTYPE_BF16, m.cpu, v.cpu, 0, n,
                (const AdamWSpan *)table.cpu, ADAMW_SPANS, hp, (AdamWClip){ sums_cpu, 2, 1.0f });
    adamw_arena(gpu_stream, param.gpu, NULL, held.gpu, DTYPE_BF16, m.gpu, v.gpu, 0, n,
                (const AdamWSpan *)table.gpu, ADAMW_SPANS, hp, (AdamWClip){ sums_gpu, 2, 1.0f });
    expect_same_bytes(param, n * sizeof(float), "the GPU's AdamW clipping a bf16 gradient differs from the CPU's");
    residual_forward(test_stream, bf16_buf((bf16 *)held.cpu), bf16_numbers((const bf16 *)held.cpu),
                     fp32_numbers(x.cpu), n, DTYPE_BF16);
    residual_forward(gpu_stream, bf16_buf((bf16 *)held.gpu), bf16_numbers((const bf16 *)held.gpu),
                     fp32_numbers(x.gpu), n, DTYPE_BF16);
    expect_same_bytes(held, n * sizeof(bf16), "the GPU's added bf16 gradient differs from the CPU's");
    pair_free(param); pair_free(m); pair_free(v); pair_free(x); pair_free(sumsq); pair_free(held); pair_free(scratch);
    pair_free(table);
}

Test(gpu, count_nonfinite) {
    need_gpu();
    size_t n = 70001;
    Pair x = pair_random(n, -1, 1, 66), count = pair_random(1, 0, 1, 67);
    static const float bad[3] = { NAN, INFINITY, -INFINITY };
    static const size_t at[3] = { 0, 40000, 70000 };
    for (int i = 0; i < 3; i++) {
        x.cpu[at[i]] = bad[i];
        stream_copy(gpu_stream, x.gpu + at[i], &bad[i], sizeof(float));
    }
    float on_gpu = -1;
    Pair scratch = pair_random(sumsq_scratch_bytes(n) / sizeof(float), -1, 1, 68);
    count_nonfinite(test_stream, count.cpu, x.cpu, DTYPE_FP32, n, scratch.cpu);
    count_nonfinite(gpu_stream, count.gpu, x.gpu, DTYPE_FP32, n, scratch.gpu);
    stream_copy(gpu_stream, &on_gpu, count.gpu, sizeof on_gpu);
    stream_synchronize(gpu_stream);
    stream_synchronize(test_stream);
    cr_expect_eq(count.cpu[0], 3.0f, "CPU: %g", count.cpu[0]);
    cr_expect_eq(on_gpu, 3.0f, "GPU: %g", on_gpu);
    pair_free(x); pair_free(count); pair_free(scratch);
}

/* The norm and the count over more chunks than the final sum's block has
 * threads (GPT-2's gradient has 7,600), its values over 60 binades: the
 * norm's exact sum the CPU's bytes, the count exact; then a NaN makes the
 * sum infinite. */
Test(gpu, the_norm_over_many_chunks_is_the_cpus_and_counts) {
    need_gpu();
    size_t n = 300 * (size_t)SUMSQ_CHUNK + 7;
    Pair x = pair_random(n, -1, 1, 57), out = pair_random(SQUARE_SUM_FLOATS, 0, 1, 58);
    for (size_t i = 0; i < n; i++) x.cpu[i] = ldexpf(x.cpu[i], (int)(i * 7919 % 61) - 40);
    stream_copy(gpu_stream, x.gpu, x.cpu, n * sizeof(float));
    Pair scratch = pair_random(sumsq_scratch_bytes(n) / sizeof(float), -1, 1, 56);
    SquareSum with_nan;
    float count = -1;
    sumsq_reduce(test_stream, (SquareSum *)out.cpu, x.cpu, DTYPE_FP32, n, scratch.cpu);
    sumsq_reduce(gpu_stream, (SquareSum *)out.gpu, x.gpu, DTYPE_FP32, n, scratch.gpu);
    expect_same_bytes(out, sizeof(SquareSum), "the GPU's exact sum over 301 chunks differs from the CPU's");
    static const float nan_value = NAN;
    stream_copy(gpu_stream, x.gpu + n - 1, &nan_value, sizeof nan_value);
    sumsq_reduce(gpu_stream, (SquareSum *)out.gpu, x.gpu, DTYPE_FP32, n, scratch.gpu);
    stream_copy(gpu_stream, &with_nan, out.gpu, sizeof with_nan);
    count_nonfinite(gpu_stream, out.gpu, x.gpu, DTYPE_FP32, n, scratch.gpu);
    stream_copy(gpu_stream, &count, out.gpu, sizeof count);
    stream_synchronize(gpu_stream);
    cr_expect(square_sum_infinite(with_nan), "a NaN in the last chunk left the sum finite");
    cr_expect_eq(count, 1.0f, "one NaN in the last chunk counted %g times", count);
    pair_free(x); pair_free(out); pair_free(scratch);
}

/* Every fp32 whose top half is any bf16 pattern, under the low halves of each
 * rounding case, rounded to bf16: the GPU's bits against the CPU's
 * (test_torch holds the CPU's to PyTorch's). */
Test(gpu, rounding_to_bf16_matches_the_cpu_bit_for_bit) {
    need_gpu();
    enum { PATTERNS = 1 << 16, LOWS = 5 };
    static const uint32_t low[LOWS] = { 0x0000, 0x7FFF, 0x8000, 0x8001, 0xFFFF };
    size_t n = PATTERNS * LOWS;
    Pair x = pair_random(n, 0, 1, 69), rounded = pair_random(n, 0, 1, 70);
    for (uint32_t top = 0; top < PATTERNS; top++)
        for (int k = 0; k < LOWS; k++) {
            uint32_t bits = top << 16 | low[k];
            memcpy(&x.cpu[top * LOWS + k], &bits, sizeof bits);
        }
    stream_copy(gpu_stream, x.gpu, x.cpu, n * sizeof(float));
    round_to_bf16(gpu_stream, rounded.gpu, x.gpu, n);
    round_to_bf16(test_stream, rounded.cpu, x.cpu, n);
    expect_same_bytes(rounded, n * sizeof(float), "the GPU rounds to other bf16 bits than the CPU");
    pair_free(x);
    pair_free(rounded);
}

/* ---- whole runs ---- */

static Dataset data;

static void load_data(void) {
    char err[256];
    cr_assert_eq(dataset_load(&data, "data/tinyshakespeare.txt", 32, err, sizeof err), 0, "%s", err);
}

/* Two blocks 32 wide over rows of 32, four rows a rank, on the ranks' devices. */
static StrategyConfig placed_gpt(int nranks, Placement where, float dropout) {
    static const GptShape shape = { 2, 32, 32, 7 };
    StrategyConfig sc = small_gpt(data.vocab, shape, nranks, 4, dropout);
    sc.device = where;
    return sc;
}

/* Twenty steps by hand, returning each step's training loss. */
static void train_losses(StrategyConfig sc, float *losses, int steps) {
    Strategy *s = strategy_create(0, &sc);
    cr_assert_not_null(s);
    LRSchedule schedule = { 1e-3f, 1e-4f, 5, steps };
    int rows = sc.nranks * sc.batch, T = sc.model.block_size;
    int *x = malloc(sizeof(int) * rows * T), *y = malloc(sizeof(int) * rows * T);
    for (int it = 0; it < steps; it++) {
        test_batch(&data, SPLIT_TRAIN, BATCH_TRAIN, sc.seed, (uint32_t)it, 0, rows, T, x, y);
        s->ops->set_lr(s, lr_at(&schedule, it));
        cr_assert_eq(s->ops->forward_backward(s, x, y, (uint32_t)it, 0, 1), 0);
        s->ops->clip_grads(s, 1.0f);
        s->ops->step(s);
        losses[it] = s->ops->train_loss(s);
    }
    s->ops->destroy(s);
    free(x);
    free(y);
}

Test(gpu, a_small_gpt_trains_on_the_gpu_as_on_the_cpu) {
    need_gpu();
    load_data();
    enum { STEPS = 20 };
    float cpu[STEPS], cuda[STEPS];
    train_losses(placed_gpt(1, PLACE_CPU, 0.1f), cpu, STEPS);
    train_losses(placed_gpt(1, PLACE_CUDA, 0.1f), cuda, STEPS);
    for (int i = 0; i < STEPS; i++)
        cr_expect(fabsf(cuda[i] - cpu[i]) <= 1e-4f * cpu[i], "step %d: GPU loss %.7g, CPU %.7g", i, cuda[i], cpu[i]);
    cr_expect_lt(cuda[STEPS - 1], cuda[0], "the loss falls");
    dataset_free(&data);
}

/* The strategies' run of the gates: 6 steps, dropout on. */
static TrainConfig short_run(float grad_clip, int grad_accum) {
    TrainConfig tc = { .iters = 6, .grad_accum = grad_accum, .schedule = { 1e-2f, 1e-3f, 2, 6 },
                       .grad_clip = grad_clip };
    return tc;
}

static float *weights_of(int zero, const StrategyConfig *sc, const TrainConfig *tc, size_t *n) {
    float *w = train_weights(zero, sc, tc, &data, n);
    cr_assert_not_null(w, "--zero=%d on %d ranks (%d) failed", zero, sc->nranks, (int)sc->device);
    return w;
}

Test(gpu, four_strategies_are_bit_identical_on_the_gpu_simulator) {
    need_gpu();
    load_data();
    TrainConfig tc = short_run(0.0f, 1);
    for (int N = 2; N <= 3; N++) {
        StrategyConfig sc = placed_gpt(N, PLACE_CUDA_SIMULATOR, 0.1f);
        size_t n;
        float *ddp = weights_of(0, &sc, &tc, &n);
        for (int k = 0; k < STRATEGY_KINDS; k++) {
            if (!STRATEGIES[k].shards_adam) continue;
            int zero = STRATEGIES[k].stage;
            float *w = weights_of(zero, &sc, &tc, &n);
            cr_expect(memcmp(ddp, w, n * sizeof(float)) == 0, "N=%d: --zero=%d differs from DDP on the GPU", N, zero);
            free(w);
        }
        free(ddp);
    }
    dataset_free(&data);
}

/* In bf16 (the tensor cores' attention, heads of 16, with dropout, biases as
 * GPT-2's), overlap on: every ZeRO stage, whole-block recompute, GELU
 * recomputed, units of a tensor with one live and the LayerNorms recomputed
 * and with three live, each gives DDP's bits on the GPU simulator at N = 2;
 * and every ZeRO stage, and GELU and the LayerNorms recomputed, at a ragged
 * shape (3 rows of 25 by 40 channels a rank, heads
 * of 20: no tensor a multiple of 128 numbers, so each one a bf16 block keeps
 * and each block's residual stream is padded to its 256-byte boundary, and
 * each weight starts on its boundary after a gap in the arena); and every
 * ZeRO stage, whole blocks and units of a tensor, 128 channels wide. Each
 * model reads its strategy's bf16 weights in place (DDP's whole arena,
 * ZeRO-3's gathered units: the products the same alignment). */
Test(gpu, every_setting_gives_ddps_bits_in_bf16_on_the_gpu_simulator) {
    need_gpu();
    load_data();
    TrainConfig tc = short_run(0.0f, 1);
    StrategyConfig base = placed_gpt(2, PLACE_CUDA_SIMULATOR, 0.1f);
    base.precision = DTYPE_BF16;
    base.model.bias = 1;
    base.overlap.enabled = 1;
    size_t n;
    float *ddp = weights_of(0, &base, &tc, &n);
    for (int k = 0; k < STRATEGY_KINDS; k++) {
        if (!STRATEGIES[k].shards_adam) continue;
        float *w = weights_of(STRATEGIES[k].stage, &base, &tc, &n);
        cr_expect(memcmp(ddp, w, n * sizeof(float)) == 0, "bf16: --zero=%d differs from DDP on the GPU",
                  STRATEGIES[k].stage);
        free(w);
    }
    /* the gradients held in bf16 (reduced in bf16), where the ops add a bias's, a LayerNorm's, a matrix's and
     * the embeddings' gradients into bf16: every stage DDP's bytes, reduced alike */
    StrategyConfig held = base;
    held.reduce_precision = DTYPE_BF16;
    float *ddp_held = weights_of(0, &held, &tc, &n);
    for (int k = 0; k < STRATEGY_KINDS; k++) {
        if (!STRATEGIES[k].shards_adam) continue;
        float *w = weights_of(STRATEGIES[k].stage, &held, &tc, &n);
        cr_expect(memcmp(ddp_held, w, n * sizeof(float)) == 0,
                  "bf16 reduced in bf16: --zero=%d differs from DDP on the GPU", STRATEGIES[k].stage);
        free(w);
    }
    free(ddp_held);
    for (int v = 0; v < 4; v++) {
        StrategyConfig sc = base;
        const char *what = v == 0 ? "--recompute=1" : v == 1 ? "--recompute-gelu=1" : v == 2 ? "--unit=tensor "
                           "--max-live-units=1 --recompute-norms=1" : "--unit=tensor --max-live-units=3";
        if (v == 0) sc.units.recompute = 1;
        if (v == 1) sc.units.recompute_gelu = 1;
        if (v == 2) sc.units.recompute_norms = 1;
        if (v >= 2) {
            sc.units.cut = UNIT_TENSOR;
            sc.overlap.max_live_units = v == 2 ? 1 : 3;
        }
        float *w = weights_of(3, &sc, &tc, &n);
        cr_expect(memcmp(ddp, w, n * sizeof(float)) == 0, "bf16: --zero=3 %s differs from DDP on the GPU", what);
        free(w);
    }
    free(ddp);
    StrategyConfig ragged = base;
    ragged.model.block_size = 25;
    ragged.model.embd = 40;
    ragged.batch = 3;
    cr_assert(strategy_compute(&STRATEGIES[0], &ragged).weights_in_place, "40 wide: the weights not read in place");
    ddp = weights_of(0, &ragged, &tc, &n);
    for (int k = 0; k <= STRATEGY_KINDS; k++) {
        if (k < STRATEGY_KINDS && !STRATEGIES[k].shards_adam) continue;
        StrategyConfig sc = ragged;
        sc.units.recompute_gelu = sc.units.recompute_norms = k == STRATEGY_KINDS;  /* last: ZeRO-3, both made again */
        int zero = k < STRATEGY_KINDS ? STRATEGIES[k].stage : 3;
        float *w = weights_of(zero, &sc, &tc, &n);
        cr_expect(memcmp(ddp, w, n * sizeof(float)) == 0, "bf16, a ragged shape: --zero=%d%s differs from DDP on the "
                  "GPU", zero, sc.units.recompute_gelu ? " --recompute-gelu=1 --recompute-norms=1" : "");
        free(w);
    }
    free(ddp);
    StrategyConfig wide = base;
    wide.model.embd = 128;
    cr_assert(strategy_compute(&STRATEGIES[0], &wide).weights_in_place, "128 wide: the weights not read in place");
    ddp = weights_of(0, &wide, &tc, &n);
    for (int k = 0; k <= STRATEGY_KINDS; k++) {
        if (k < STRATEGY_KINDS && !STRATEGIES[k].shards_adam) continue;
        StrategyConfig sc = wide;
        if (k == STRATEGY_KINDS) sc.units.cut = UNIT_TENSOR;  /* last: ZeRO-3 in units of a tensor */
        int zero = k < STRATEGY_KINDS ? STRATEGIES[k].stage : 3;
        float *w = weights_of(zero, &sc, &tc, &n);
        cr_expect(memcmp(ddp, w, n * sizeof(float)) == 0, "bf16, 128 wide, weights read in place: --zero=%d%s differs "
                  "from DDP on the GPU", zero, k == STRATEGY_KINDS ? " --unit=tensor" : "");
        free(w);
    }
    free(ddp);
    dataset_free(&data);
}

/* Hybrid sharding on the GPU simulator (4 ranks in groups of 2, the sums in
 * bf16 too): every ZeRO stage gives DDP's bits, overlap on, a shard's
 * replicas copying the first one's sum between the GPU's streams. */
Test(gpu, hybrid_sharding_is_bit_identical_to_ddp_on_the_gpu_simulator) {
    need_gpu();
    load_data();
    TrainConfig tc = short_run(0.0f, 1);
    for (int p = 0; p < DTYPES; p++) {
        StrategyConfig sc = placed_gpt(4, PLACE_CUDA_SIMULATOR, 0.1f);
        sc.overlap.enabled = 1;
        sc.reduce_precision = (DType)p;
        size_t n;
        float *ddp = weights_of(0, &sc, &tc, &n);
        sc.shard_ranks = 2;
        for (int k = 0; k < STRATEGY_KINDS; k++) {
            if (!STRATEGIES[k].shards_adam) continue;
            float *w = weights_of(STRATEGIES[k].stage, &sc, &tc, &n);
            cr_expect(memcmp(ddp, w, n * sizeof(float)) == 0, "--zero=%d --shard-ranks=2, reduced in %s: other bits "
                      "than DDP on the GPU", STRATEGIES[k].stage, p ? "bf16" : "fp32");
            free(w);
        }
        free(ddp);
    }
    dataset_free(&data);
}

/* Small buckets, so DDP has several; a slow modeled link, so the collectives
 * really run under the backward, on the GPU's own streams. */
Test(gpu, overlap_on_and_off_give_the_same_bits_with_two_micro_steps) {
    need_gpu();
    load_data();
    TrainConfig tc = short_run(0.0f, 2);
    for (int k = 0; k < STRATEGY_KINDS; k++) {
        int zero = STRATEGIES[k].stage;
        StrategyConfig sc = placed_gpt(2, PLACE_CUDA_SIMULATOR, 0.1f);
        size_t n;
        float *off = weights_of(zero, &sc, &tc, &n);
        sc.overlap.enabled = 1;
        sc.overlap.bucket_bytes = 8 << 10;
        sc.link.gbps = 0.2;
        sc.link.latency_us = 20;
        float *on = weights_of(zero, &sc, &tc, &n);
        cr_expect(memcmp(off, on, n * sizeof(float)) == 0, "--zero=%d: overlap changed the weights on the GPU", zero);
        free(off);
        free(on);
    }
    dataset_free(&data);
}

/* Dropout's step read from device memory (step_at) by the kernel as it runs:
 * one CUDA graph of the step's copy from pinned memory and the op, launched
 * after each step is written there, draws that step's mask: the bytes of the
 * op run eagerly with the step given by value. */
Test(gpu, dropout_reads_its_step_from_device_memory_at_each_graph_launch) {
    need_gpu();
    size_t n = 1001, bytes = n * sizeof(float);
    Pair x = pair_random(n, 0.5f, 1.5f, 81), out = pair_random(n, -1, 1, 82), want = pair_random(n, -1, 1, 83);
    uint32_t *step = device_alloc(gpu, MEM_WORKING, sizeof *step), *staged = device_alloc_host(gpu, sizeof *staged);
    Dropout from_memory = { 0.3f, 7, 1, 0, 2, step };
    graph_capture_begin(gpu_stream);
    stream_copy(gpu_stream, step, staged, sizeof *step);
    dropout_forward(gpu_stream, fp32_buf(out.gpu), fp32_numbers(x.gpu), n, from_memory, DTYPE_FP32);
    Graph *g = graph_capture_end(gpu_stream);
    for (uint32_t s = 4; s <= 6; s++) {
        *staged = s;
        graph_launch(g, gpu_stream);
        Dropout by_value = { 0.3f, 7, 1, s, 2, NULL };
        dropout_forward(gpu_stream, fp32_buf(want.gpu), fp32_numbers(x.gpu), n, by_value, DTYPE_FP32);
        stream_copy(gpu_stream, out.cpu, out.gpu, bytes);
        stream_copy(gpu_stream, want.cpu, want.gpu, bytes);
        stream_synchronize(gpu_stream);
        cr_expect(memcmp(out.cpu, want.cpu, bytes) == 0, "the launch at step %u drew another mask", s);
    }
    graph_destroy(g);
    device_free(gpu, MEM_WORKING, step, sizeof *step);
    device_free_host(gpu, staged);
    pair_free(x); pair_free(out); pair_free(want);
}

/* Each kind of micro-step captured once as a CUDA graph and launched after
 * (strategies/rank_graphs.h) gives the eager run's bytes: every stage on 2
 * ranks simulated on the GPU, with overlap, clipping, dropout (its step read
 * from memory by each launch's kernels) and three micro-steps, in fp32 and
 * bf16 (the tensor cores' attention, cuBLASLt's products). */
Test(gpu, graphs_give_the_eager_runs_bits) {
    need_gpu();
    load_data();
    TrainConfig tc = short_run(1.0f, 3);
    for (int p = 0; p < 2; p++)
        for (int k = 0; k < STRATEGY_KINDS; k++) {
            int zero = STRATEGIES[k].stage;
            StrategyConfig sc = placed_gpt(2, PLACE_CUDA_SIMULATOR, 0.1f);
            sc.precision = p ? DTYPE_BF16 : DTYPE_FP32;
            sc.overlap.enabled = 1;
            sc.overlap.bucket_bytes = 8 << 10;
            size_t n;
            float *eager = weights_of(zero, &sc, &tc, &n);
            sc.graphs = 1;
            float *graphs = weights_of(zero, &sc, &tc, &n);
            cr_expect(memcmp(eager, graphs, n * sizeof(float)) == 0, "--zero=%d in %s: graphs changed the weights on "
                      "the GPU", zero, p ? "bf16" : "fp32");
            free(eager);
            free(graphs);
        }
    dataset_free(&data);
}

/* A limit the gradient's norm passes at every step, so every step clips; the
 * norm's sum is exact, so every stage gives DDP's bytes. (Clipping on the
 * GPU against the CPU: the small GPT's 20 steps above clip at 1.) */
Test(gpu, clipping_is_bit_identical_across_strategies) {
    need_gpu();
    load_data();
    TrainConfig tc = short_run(0.05f, 1), unclipped = short_run(0.0f, 1);
    StrategyConfig sc = placed_gpt(2, PLACE_CUDA_SIMULATOR, 0.0f);
    size_t n;
    float *ddp = weights_of(0, &sc, &tc, &n), *free_run = weights_of(0, &sc, &unclipped, &n);
    cr_expect(memcmp(ddp, free_run, n * sizeof(float)) != 0, "a norm limit of 0.05 changed nothing");
    for (int k = 0; k < STRATEGY_KINDS; k++) {
        if (!STRATEGIES[k].shards_adam) continue;
        int zero = STRATEGIES[k].stage;
        float *w = weights_of(zero, &sc, &tc, &n);
        cr_expect(memcmp(ddp, w, n * sizeof(float)) == 0, "--zero=%d with clipping: %g from DDP on the GPU", zero,
                  max_rel_diff(ddp, w, n));
        free(w);
    }
    free(ddp);
    free(free_run);
    dataset_free(&data);
}

Test(gpu, two_identical_runs_give_the_same_bits) {
    need_gpu();
    load_data();
    TrainConfig tc = short_run(1.0f, 2);
    int stages[2] = { 0, 3 };
    for (int i = 0; i < 2; i++) {
        StrategyConfig sc = placed_gpt(3, PLACE_CUDA_SIMULATOR, 0.1f);
        sc.overlap.enabled = 1;
        size_t n;
        float *first = weights_of(stages[i], &sc, &tc, &n), *second = weights_of(stages[i], &sc, &tc, &n);
        cr_expect(memcmp(first, second, n * sizeof(float)) == 0, "--zero=%d: two runs on the GPU differ", stages[i]);
        free(first);
        free(second);
    }
    dataset_free(&data);
}

/* Reduce-scatter (scaled), all-gather and all-reduce through a process group,
 * the reductions in dtype, each rank's buffer n floats of its own random
 * values (the last shard short where N does not divide n); returns every
 * rank's bytes. */
static float *collectives_on(ProcessGroup *pg, size_t n, DType dtype) {
    int N = pg->nranks;
    float *host = malloc((size_t)N * n * sizeof(float)), *buf[MAX_RANKS];
    fill_uniform(host, (size_t)N * n, -1, 1, 71);
    for (int r = 0; r < N; r++) {
        buf[r] = device_alloc(pg->device[r], MEM_WORKING, n * sizeof(float));
        stream_copy(pg->compute[r], buf[r], host + (size_t)r * n, n * sizeof(float));
    }
    size_t shard = pg_shard_size(n, N);
    float *shards[MAX_RANKS];
    for (int r = 0; r < N; r++) shards[r] = buf[r] + (size_t)r * shard;
    pg_reduce_scatter(pg, TEST, buf, shards, n, 0.3f, dtype, REDUCE_WRITE, NULL);
    pg_all_gather(pg, TEST, shards, buf, n, DTYPE_FP32, NULL);
    pg_all_reduce(pg, TEST, buf, n, 0.7f, dtype, NULL);
    for (int r = 0; r < N; r++) {
        stream_copy(pg->compute[r], host + (size_t)r * n, buf[r], n * sizeof(float));
        stream_synchronize(pg->compute[r]);
        device_free(pg->device[r], MEM_WORKING, buf[r], n * sizeof(float));
    }
    return host;
}

/* N ranks through NCCL, summing as asked, against N simulated on one GPU, over
 * n floats: the same bytes; and with the reductions in bf16, which take the
 * ordered path whatever the sums. */
static void expect_nccl_matches_the_simulator(int N, SumOrder sums, size_t n) {
    ProcessGroup *nccl = pg_create_nccl(N), *sim = pg_create_simulator(N, DEVICE_CUDA, 0);
    cr_assert_not_null(nccl);
    cr_assert_not_null(sim);
    pg_set_sums(nccl, sums);
    for (int p = 0; p < DTYPES; p++) {
        float *a = collectives_on(nccl, n, (DType)p), *b = collectives_on(sim, n, (DType)p);
        cr_expect(memcmp(a, b, (size_t)N * n * sizeof(float)) == 0, "N=%d, %s sums, n=%zu, reduced in %s: NCCL and "
                  "the simulator differ", N, sums == SUMS_ORDERED ? "ordered" : "NCCL's own", n, p ? "bf16" : "fp32");
        free(a);
        free(b);
    }
    pg_destroy(nccl);
    pg_destroy(sim);
}

/* The GPU simulator's reductions against the CPU simulator's, in fp32 and in
 * bf16 (stream_sum's two kernels): the same bytes. */
Test(gpu, the_gpus_reductions_are_the_cpus_in_either_precision) {
    need_gpu();
    for (int N = 1; N <= 5; N += 2)
        for (int p = 0; p < DTYPES; p++) {
            ProcessGroup *gpu = pg_create_simulator(N, DEVICE_CUDA, 0), *cpu = pg_create_simulator(N, DEVICE_CPU, 0);
            cr_assert_not_null(gpu);
            cr_assert_not_null(cpu);
            float *a = collectives_on(gpu, 4097, (DType)p), *b = collectives_on(cpu, 4097, (DType)p);
            cr_expect(memcmp(a, b, (size_t)N * 4097 * sizeof(float)) == 0, "N=%d, reduced in %s: the GPU's bytes "
                      "differ from the CPU's", N, p ? "bf16" : "fp32");
            free(a);
            free(b);
            pg_destroy(gpu);
            pg_destroy(cpu);
        }
}

/* Training through NCCL on N GPUs, summing as asked, against the simulator on
 * one: DDP and ZeRO-2/3 with overlap on, the same weights to the bit. */
static void expect_nccl_trains_as_the_simulator(int N, SumOrder sums) {
    load_data();
    TrainConfig tc = short_run(0.0f, 1);
    int stages[3] = { 0, 2, 3 };
    for (int i = 0; i < 3; i++) {
        StrategyConfig sim_sc = placed_gpt(N, PLACE_CUDA_SIMULATOR, 0.1f), nccl_sc = sim_sc;
        nccl_sc.device = PLACE_CUDA;
        nccl_sc.sums = sums;
        nccl_sc.overlap.enabled = 1;
        size_t n;
        float *sim = weights_of(stages[i], &sim_sc, &tc, &n), *nccl = weights_of(stages[i], &nccl_sc, &tc, &n);
        cr_expect(memcmp(sim, nccl, n * sizeof(float)) == 0, "--zero=%d: NCCL on %d GPUs differs from the simulator",
                  stages[i], N);
        free(sim);
        free(nccl);
    }
    dataset_free(&data);
}

static void need_gpus(int count) {
    need_gpu();
    if (device_cuda_count() < count)
        cr_skip_test("NCCL on %d GPUs: %d GPU%s visible", count, device_cuda_count(),
                     device_cuda_count() == 1 ? "" : "s");
}

/* A trace of ZeRO-3 on the GPU simulator, stamped by timing events: every
 * rank's compute and comm rows hold spans, and each row's spans nest. */
Test(gpu, a_trace_of_zero3_on_the_gpu_simulator) {
    need_gpu();
    load_data();
    Trace *t = trace_create(1 << 14);
    StrategyConfig sc = placed_gpt(2, PLACE_CUDA_SIMULATOR, 0.0f);
    sc.overlap.enabled = 1;
    sc.link.gbps = 0.05;
    sc.diagnostics.trace = t;
    TrainConfig tc = { .iters = 2, .schedule = { 1e-3f, 1e-4f, 1, 2 }, .trace = t, .trace_steps = 2 };
    size_t n;
    float *w = train_weights(3, &sc, &tc, &data, &n);
    cr_assert_not_null(w);
    free(w);
    char path[64];
    snprintf(path, sizeof path, "/tmp/zf_gpu_trace_%d.json", (int)getpid());
    char err[512];
    cr_assert_eq(trace_write(t, path, err, sizeof err), 0, "%s", err);
    trace_destroy(t);
    int count;
    TraceSpan *spans = trace_read_spans(path, &count, err, sizeof err);
    cr_assert_not_null(spans, "%s", err);
    for (int rank = 0; rank < 2; rank++)
        for (int tid = 0; tid < 2; tid++) {
            int on_row = 0;
            for (int i = 0; i < count; i++) on_row += spans[i].pid == rank && spans[i].tid == tid;
            cr_expect_gt(on_row, 0, "rank %d, thread %d: no spans", rank, tid);
        }
    cr_expect(trace_spans_nest(spans, count), "spans of one stream overlap without nesting");
    free(spans);
    unlink(path);
}

/* ---- NCCL against the simulator: a suite of its own, so that gpu_check runs
 * it with a limit of its own (an NCCL hang takes no other test with it) ---- */

TestSuite(gpu_nccl, .init = setup, .fini = teardown);

/* One rank: both ways of summing are the simulator's, on lengths that divide
 * and one that does not (the all-gather's send/recv path). And the files
 * cuBLAS, cuBLASLt and NCCL came from, loaded at their first use, are named. */
Test(gpu_nccl, nccl_on_one_rank_matches_the_gpu_simulator) {
    need_gpu();
    char files[1200];
    device_cuda_libraries(files, sizeof files);
    cr_expect(strstr(files, "cuBLAS from /") && strstr(files, "libcublas.so."), "%s", files);
    cr_expect(strstr(files, "cuBLASLt from /") && strstr(files, "libcublasLt.so."), "%s", files);
    expect_nccl_matches_the_simulator(1, SUMS_ORDERED, 4096);
    expect_nccl_matches_the_simulator(1, SUMS_ORDERED, 4099);
    expect_nccl_matches_the_simulator(1, SUMS_NCCL, 4096);
    device_cuda_libraries(files, sizeof files);
    cr_expect(strstr(files, "NCCL from /") && strstr(files, "libnccl.so."), "%s", files);
}

/* Two ranks through NCCL, against the simulator on one GPU: the collectives
 * (uneven shards too), then training. NCCL's own sums agree here as well: a
 * sum of two is the same in either order. */
Test(gpu_nccl, nccl_on_two_gpus_matches_the_gpu_simulator) {
    need_gpus(2);
    expect_nccl_matches_the_simulator(2, SUMS_ORDERED, 8192);
    expect_nccl_matches_the_simulator(2, SUMS_ORDERED, 8193);
    expect_nccl_matches_the_simulator(2, SUMS_NCCL, 8192);
    expect_nccl_trains_as_the_simulator(2, SUMS_ORDERED);
    expect_nccl_trains_as_the_simulator(2, SUMS_NCCL);
}

/* Three ranks: only the ordered sums promise the simulator's bits (NCCL's
 * own add three in an order of their own). */
Test(gpu_nccl, ordered_nccl_on_three_gpus_matches_the_gpu_simulator) {
    need_gpus(3);
    expect_nccl_matches_the_simulator(3, SUMS_ORDERED, 3 * 4096);
    expect_nccl_matches_the_simulator(3, SUMS_ORDERED, 3 * 4096 + 1);
    expect_nccl_trains_as_the_simulator(3, SUMS_ORDERED);
}

/* ---- faults and processes: a suite of its own, whose process starts no CUDA
 * before it forks (a child of a process that did could not use the GPU). A
 * child exits 77 where the GPUs it needs are not there. ---- */

TestSuite(gpu_processes);

static void skip_without_gpus(int status, const char *what) {
    if (status == 77 && !getenv("ZF_REQUIRE_GPU")) cr_skip_test("SKIP: %s: the GPUs it needs are not visible", what);
}

/* One rank through NCCL, its communication stream held 4 s by the modeled
 * link's kernel before an all-reduce, a 1 s --timeout: the watchdog must end
 * the child, exit 1, within its 1 s of aborts, long before the hold is over.
 * The child finishes as bin/train does (world_finalize, then the exit) if
 * the all-reduce ever completes: exit 0 unless the watchdog's end holds it. The 1 s is
 * set once NCCL's init is done (a cold init takes about as long), and a first
 * all-reduce grows the staging (which waits for the stream) before the hold. */
static void hold_an_all_reduce_past_the_timeout(int child) {
    (void)child;
    if (device_cuda_count() <= 0) _exit(77);
    ProcessGroup *pg = pg_create_nccl(1);
    if (!pg) _exit(3);
    world_set_timeout(1.0);
    size_t n = 4096;
    float *buf = device_alloc(pg->device[0], MEM_WORKING, n * sizeof(float));
    pg_all_reduce(pg, TEST, &buf, n, 0.5f, DTYPE_FP32, NULL);
    stream_synchronize(pg->compute[0]);
    stream_timer_start(pg->comm[0], NULL);
    stream_hold(pg->comm[0], 4.0);
    pg_all_reduce(pg, (CollectiveName){ "unit", 7, 7 }, &buf, n, 0.5f, DTYPE_FP32, NULL);
    stream_synchronize(pg->compute[0]);
    world_finalize();  /* as bin/train ends: where the watchdog fired, this waits for its end */
    _exit(0);
}

Test(gpu_processes, a_stuck_collective_ends_the_run_naming_it, .timeout = 60) {
    char text[4096];
    int status = child_end(child_start(hold_an_all_reduce_past_the_timeout, 0), 0, text, sizeof text);
    skip_without_gpus(status, "the watchdog");
    cr_expect_eq(status, 1, "exit %d, stderr: %s", status, text);
    cr_expect(strstr(text, "'all-reduce unit 7' did not complete within 1 s (--timeout)") != NULL, "stderr: %s",
              text);
    cr_expect_eq(count_error_lines(text), 1, "stderr: %s", text);
}

/* Process 1 of 2 waits for a rendezvous file that process 0 never writes. */
static void wait_for_a_rendezvous_that_never_comes(int child) {
    (void)child;
    if (device_cuda_count() <= 0) _exit(77);
    world_set_timeout(1.0);
    _exit(world_join_file(2, 1, "/tmp/zf_gpu_no_such_rendezvous") == -1 ? 1 : 0);
}

Test(gpu_processes, a_rendezvous_file_that_never_comes_is_one_line, .timeout = 60) {
    char text[4096];
    int status = child_end(child_start(wait_for_a_rendezvous_that_never_comes, 0), 0, text, sizeof text);
    skip_without_gpus(status, "the file rendezvous");
    cr_expect_eq(status, 1, "exit %d, stderr: %s", status, text);
    cr_expect(strstr(text, "no --rendezvous file /tmp/zf_gpu_no_such_rendezvous from process 0 within 1 s") != NULL,
              "stderr: %s", text);
    cr_expect_eq(count_error_lines(text), 1, "stderr: %s", text);
}

/* Process `child` of 2, on GPU `child` alone, joined through a file: the
 * world's all-gather, then an ordered reduce-scatter (scaled) and an
 * all-gather of 4097 floats (uneven shards) through NCCL, against the sum in
 * rank order on the host, byte for byte. Exits 0 when all agree. */
enum { RENDEZVOUS_FLOATS = 4097 };

static void rank_of_two_processes(int child) {
    char visible[8];
    snprintf(visible, sizeof visible, "%d", child);
    if (setenv("CUDA_VISIBLE_DEVICES", visible, 1) != 0) _exit(4);
    if (device_cuda_count() <= 0) _exit(77);
    world_set_timeout(30.0);
    char path[64];
    snprintf(path, sizeof path, "/tmp/zf_gpu_rendezvous_%d", (int)getppid());
    if (world_join_file(2, child, path) != 0) _exit(3);
    int procs[2] = { -1, -1 };
    world_all_gather(&child, procs, sizeof child, "the test's all-gather");
    if (procs[0] != 0 || procs[1] != 1) _exit(5);
    ProcessGroup *pg = pg_create_nccl(2);
    if (!pg) _exit(3);
    size_t n = RENDEZVOUS_FLOATS, shard = pg_shard_size(n, 2);
    float *mine = malloc(n * sizeof(float)), *other = malloc(n * sizeof(float)), *got = malloc(n * sizeof(float));
    fill_uniform(mine, n, -1, 1, 71 + (unsigned)child);
    fill_uniform(other, n, -1, 1, 71 + (unsigned)(1 - child));
    float *buf = device_alloc(pg->device[0], MEM_WORKING, n * sizeof(float)), *own = buf + (size_t)child * shard;
    stream_copy(pg->compute[0], buf, mine, n * sizeof(float));
    pg_reduce_scatter(pg, TEST, &buf, &own, n, 0.3f, DTYPE_FP32, REDUCE_WRITE, NULL);
    pg_all_gather(pg, TEST, &own, &buf, n, DTYPE_FP32, NULL);
    stream_copy(pg->compute[0], got, buf, n * sizeof(float));
    stream_synchronize(pg->compute[0]);
    const float *rank0 = child == 0 ? mine : other, *rank1 = child == 0 ? other : mine;
    for (size_t i = 0; i < n; i++) {
        float want = (rank0[i] + rank1[i]) * 0.3f;
        if (memcmp(&want, &got[i], sizeof want) != 0) _exit(6);
    }
    pg_destroy(pg);
    _exit(0);
}

/* One GPU (gpu_check's machine) is not a failure here: the test needs two. */
Test(gpu_processes, two_processes_through_a_rendezvous_file_sum_in_rank_order, .timeout = 120) {
    char path[64];
    snprintf(path, sizeof path, "/tmp/zf_gpu_rendezvous_%d", (int)getpid());
    unlink(path);
    pid_t first = child_start(rank_of_two_processes, 0), second = child_start(rank_of_two_processes, 1);
    char text[2][4096];
    int status1 = child_end(second, 1, text[1], sizeof text[1]);
    if (status1 == 77)  /* process 0 may wait in NCCL's init for a peer that never comes */
        cr_assert(kill(first, SIGKILL) == 0 || errno == ESRCH, "kill failed");
    int status0 = child_end(first, 0, text[0], sizeof text[0]);
    unlink(path);
    if (status1 == 77) cr_skip_test("SKIP: two processes on two GPUs: fewer than two GPUs visible");
    cr_expect_eq(status0, 0, "process 0: exit %d, stderr: %s", status0, text[0]);
    cr_expect_eq(status1, 0, "process 1: exit %d, stderr: %s", status1, text[1]);
}
