/* reference.h: double-precision forwards of every op and of the whole models.
 *
 * The tests' independent reference: plain loops in double, written from the
 * definitions, sharing nothing with kernels/ but the dropout mask. Gradients of
 * the float kernels are checked against central finite differences of these.
 */
#ifndef ZF_REFERENCE_H
#define ZF_REFERENCE_H

#include <stddef.h>

#include "../kernels/kernels.h"
#include "../model/gpt.h"
#include "../training/trainer.h"

void ref_embedding(double *out, const int *tokens, const double *wte, const double *wpe, int B, int T, int C);
void ref_layernorm(double *out, const double *inp, const double *weight, int N, int C);
void ref_matmul(double *out, const double *inp, const double *weight, int N, int C, int OC);
/* Causal attention over qkv[B,T,3C]; drop.p > 0 applies the kernels' mask. */
/* lse, where not NULL, gets each row's log-sum-exp of scores [B,NH,T]. */
void ref_attention(double *out, double *lse, const double *qkv, int B, int T, int C, int NH, Dropout drop);
/* Exact GELU, or with tanh_form GPT-2's tanh approximation. */
void ref_gelu(double *out, const double *inp, size_t n, int tanh_form);
void ref_dropout(double *out, const double *inp, size_t n, Dropout drop);
/* Mean cross-entropy of softmax(logits) against targets. */
double ref_crossentropy(const double *logits, const int *targets, int N, int V);
/* The GPT's mean loss in double from params in the arena layout, with the
 * model's dropout sites (0 after the embeddings; 1 + 3l attention weights, 2 + 3l
 * and 3 + 3l the block's output projections) keyed by drop's p, seed, rank, step. */
double ref_gpt_loss(const ModelConfig *cfg, const ArenaLayout *layout, const double *params,
                    const int *tokens, const int *targets, int B, int T, Dropout drop);
/* The loss of either model: the GPT's above, or the MLP's (model/mlp.h). */
double ref_model_loss(const ModelConfig *cfg, const ArenaLayout *layout, const double *params,
                      const int *tokens, const int *targets, int B, int T, Dropout drop);

/* Test helpers. The suites' fixture: one CPU device and stream per test. */
extern Device *test_device;
extern Stream *test_stream;
void test_stream_setup(void);
void test_stream_teardown(void);
/* A model on the test stream, with activations for B x T and its own arenas. */
Model *test_model(const ModelConfig *cfg, int B, int T);
/* Uniform random floats in [lo, hi) from a seeded generator (this and the
 * next two live in inputs.c, free of Criterion). */
void fill_uniform(float *x, size_t n, float lo, float hi, unsigned seed);
/* Inputs whose magnitudes span 2^-12 .. 2^12, so that another order of the
 * same float additions gives other bits (the pinned-order tests). */
void fill_wide(float *x, size_t n, unsigned seed);
/* The pinned reduction, written out: a float sum of host[0][i], host[1][i],
 * ..., host[N-1][i] in that order, then the scale. */
float ordered_sum(float *const *host, int N, size_t i, float scale);
double *to_double(const float *x, size_t n);
/* max |got - want| / max |want|: the relative error of a whole tensor. */
double rel_error(const float *got, const double *want, size_t n);
/* max |a - b| / max |b| over two float arrays: how far a run is from another. */
double max_rel_diff(const float *a, const float *b, size_t n);
/* Train a --zero stage through the trainer; returns the weights (malloc'd, the
 * unpadded layout of *n floats), or NULL when the strategy or the run failed. */
float *train_weights(int zero, const StrategyConfig *sc, const TrainConfig *tc, const Dataset *data,
                     size_t *n);


/* dataset_batch (model/data.h), cr_asserting that the data gave the batch. */
void test_batch(const Dataset *d, int split, int purpose, uint32_t seed, uint32_t index, int row0, int rows, int T,
                int *x, int *y);

/* Skip the calling test, saying "SKIP: suite::test: why" in one line on stderr:
 * cr_skip_test's own message shows only under --verbose, and a test that did
 * not run must say so in make test's output. */
void test_skip(const char *why_fmt, ...) __attribute__((format(printf, 1, 2)));
/* The Python that runs tests/torch_gpt.py: ZF_PYTHON, else Debian's
 * /usr/bin/python3 (the one python3-torch installs into), else python3. */
const char *test_python(void);
/* Skip the calling test (test_skip) when test_python() cannot import torch and
 * numpy; with ZF_REQUIRE_TORCH set (as .ci/run sets it) fail it instead. */
void need_torch(void);
/* need_torch, and the safetensors package that make deps installs into
 * build/pylib (PyPI; Debian 12 has none): test_python() with PYTHONPATH set
 * there must import safetensors.torch, or the test skips (fails under
 * ZF_REQUIRE_TORCH). */
void need_safetensors(void);
/* The tokenizers package that make deps installs into build/pylib (PyPI):
 * test_python() with PYTHONPATH set there must import it, or the test skips
 * (fails under ZF_REQUIRE_TORCH, which CI sets). No PyTorch needed. */
void need_tokenizers(void);
/* The Python of the venv that `make venv` makes once per machine, outside the
 * clone (ZF_VENV, else ~/.cache/zerofiber/venv): PyTorch 2.x and transformers
 * from PyPI. */
const char *venv_python(void);
/* Skip the calling test (test_skip) when venv_python() cannot import torch and
 * transformers; with ZF_REQUIRE_TORCH set (as .ci/run sets it, after make venv)
 * fail it instead. */
void need_transformers(void);
/* cmd = "<test_python()> tests/torch_gpt.py " and the formatted arguments;
 * cr_asserts that it fits. */
void torch_gpt_command(char *cmd, size_t len, const char *args_fmt, ...) __attribute__((format(printf, 3, 4)));
/* The binary under test: bin/train, or the sanitizer build's (ZF_TRAIN). */
const char *train_binary(void);
/* bin/prepare and bin/sample, or the sanitizer build's (ZF_PREPARE, ZF_SAMPLE). */
const char *prepare_binary(void);
const char *sample_binary(void);
/* bin/export, or the sanitizer build's (ZF_EXPORT). */
const char *export_binary(void);
/* Run `binary args` through the shell, its stdout to the file `out`, its
 * stderr into err; its exit status (-1 unless it exited). */
int run_tool(const char *binary, const char *args, const char *out, char *err, size_t errlen);
/* The first len - 1 bytes of the file, NUL-terminated in text (empty if it
 * cannot be read), and the file removed: a child's captured stderr. */
void take_text(const char *path, char *text, size_t len);
/* The whole file (malloc'd, NUL after its *n bytes); cr_asserts it is readable. */
unsigned char *read_all(const char *path, size_t *n);
/* A fresh folder /tmp/zf_STEM_XXXXXX (mkdtemp) in dir; and its removal. */
void temp_dir(char *dir, size_t len, const char *stem);
void remove_dir(const char *dir);
/* The command that starts processes: ZF_MPIRUN, else
 * "mpirun --allow-run-as-root --oversubscribe" (more processes than cores, as root in CI). */
const char *test_mpirun(void);
/* Skip the calling test (test_skip) when test_mpirun() cannot start a
 * process, or train_binary() (a build with MPI=0); with ZF_REQUIRE_MPI set
 * (as .ci/run sets it) fail it instead. */
void need_mpi(void);
/* One span of a Chrome trace file (runtime/trace.h): a complete event. */
typedef struct {
    char name[48];
    int pid, tid, unit;
    double ts, dur;  /* microseconds */
} TraceSpan;
/* The complete events of a trace file, checked against the trace-event format
 * as Perfetto reads it: a "traceEvents" array of objects, each with a string
 * "ph" and "name" and a number "pid"; complete events ("X") with numbers
 * "tid", "ts" and "dur" >= 0 and "args": {"unit": number}; metadata ("M")
 * naming a process or a thread in "args": {"name": string}. Returns the spans
 * (malloc'd, *n of them), or NULL with what was wrong in err. */
TraceSpan *trace_read_spans(const char *path, int *n, char *err, size_t errlen);
/* 1 if on every row (pid, tid) any two spans nest or are disjoint, as Perfetto
 * draws a row's spans as a stack. */
int trace_spans_nest(const TraceSpan *spans, int n);

#endif
