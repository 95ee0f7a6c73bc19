/* fixtures.h: the suites' harness, beside the reference maths of reference.h:
 * the test device and stream, inputs, the comparisons, training a strategy
 * through the trainer, the small GPT of the gates, skips, the binaries and
 * Pythons under test, files and folders, forked children, traces, and
 * running bin/train. */
#ifndef ZF_FIXTURES_H
#define ZF_FIXTURES_H

#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#include "../model/gpt.h"
#include "../training/trainer.h"

/* The suites' fixture: one CPU device and stream per test. */
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
/* Element k of a pattern of 16-bit numbers of every kind a bf16 can be
 * (normals, subnormals, zeros, infinities, NaNs of any payload), as a gather
 * of numbers held in bf16 must move them: bit for bit. */
bf16 bf16_pattern(unsigned seed, size_t k);
/* The pinned reduction, written out: a float sum of host[0][i], host[1][i],
 * ..., host[N-1][i] in that order, then the scale; in a precision: fp32 as
 * ordered_sum, or bf16, where every input, partial sum and the scaled sum is
 * rounded to bf16 (a reduction in bf16, --reduce-dtype). */
float ordered_sum(float *const *host, int N, size_t i, float scale);
float ordered_sum_in(DType dtype, float *const *host, int N, size_t i, float scale);
double *to_double(const float *x, size_t n);
/* max |got - want| / max |want|: the relative error of a whole tensor. */
double rel_error(const float *got, const double *want, size_t n);
/* sqrt(sum (got - want)^2 / sum want^2): how far a whole tensor is, where a
 * rare element may round to the next bf16 on one side only. */
double rms_rel_error(const float *got, const double *want, size_t n);
/* max |a - b| / max |b| over two float arrays: how far a run is from another. */
double max_rel_diff(const float *a, const float *b, size_t n);
/* An op's output under autocast's rounding: got[0, n) is want[0, n) (the
 * same op's fp32 output) rounded to bf16, byte for byte (want is rounded in
 * place), and some value needed the rounding, or the test could not fail. */
void expect_rounded(const float *got, float *want, size_t n, const char *what);
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
/* Start `body(child)` in a forked child whose stderr goes to a file of its
 * own, unbuffered (as a terminal's or a pipe's: the child may leave by _exit,
 * which flushes nothing); and the child's exit status (-1 for a signal) with
 * that stderr read into text. */
pid_t child_start(void (*body)(int), int child);
int child_end(pid_t pid, int child, char *text, size_t len);
/* How many lines of text begin with "error:". */
int count_error_lines(const char *text);
/* The buckets of tokens[0, BT) (kernels/token_buckets.h) in host memory
 * (the CPU device's); and their end. */
TokenBuckets buckets_of(const int *tokens, int BT, int V);
void buckets_free(TokenBuckets b);
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

/* The gates' GPT: `layers` blocks `width` wide (2 heads) over rows of `block`
 * positions of a vocabulary of `vocab`, for nranks ranks of `batch` rows, with
 * AdamW's settings of the gates (betas 0.9 and 0.99, eps 1e-8, weight decay
 * 0.1) and the init's seed. */
typedef struct { int layers, width, block; uint32_t seed; } GptShape;
StrategyConfig small_gpt(int vocab, GptShape shape, int nranks, int batch, float dropout);

/* Running bin/train from the suites. */
/* A run of `iters` steps that evaluates, logs and samples nothing. */
TrainConfig quiet_run(int iters);
/* bin/train with args, its stdout dropped and its stderr in err; its exit status. */
int run_train(const char *args, char *err, size_t errlen);
/* The newlines of a text. */
int count_lines(const char *text);
/* The binary under test: bin/zero_memory, or the sanitizer build's. */
const char *zero_memory_binary(void);
/* exit status `want`, one line on stderr holding `needle` */
void expect_one_line(int rc, int want, const char *err, const char *needle, const char *what);
/* Split a command line at its spaces into argv[1..] (argv[0] "train"); argc. */
int split_args(char *line, char **argv, int max);
/* The file at path still holds exactly the n bytes of `good`. */
void expect_unchanged(const char *path, const unsigned char *good, size_t n, const char *what);
/* A file of exactly these n bytes (cr_asserted). */
void write_all(const char *path, const void *bytes, size_t n);
/* dir/real holding the n bytes (its path in path), and dir/link_name made to
 * it: nothing for "", a symbolic link for "@NAME", else a hard link NAME. */
void write_linked(const char *dir, const char *real, const char *link_name, const void *bytes, size_t n, char *path,
                  size_t len);
/* A small model, every eval one batch, nothing sampled. */
extern const char TINY[];
/* A trained checkpoint of TINY in a fresh folder: its path in ckpt. */
void train_checkpoint(char *dir, size_t dirlen, char *ckpt, size_t len, int iters);
/* The steps the optimizer took, as the checkpoint says. */
int adam_steps_of(const char *ckpt);

#endif
