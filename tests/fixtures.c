/* fixtures.c: the suites' harness (fixtures.h). */
#include "fixtures.h"

#include <criterion/criterion.h>
#include <jansson.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "../model/models.h"
#include "../training/checkpoint.h"

Device *test_device;
Stream *test_stream;

void test_stream_setup(void) {
    test_device = device_create_cpu(1, -1);
    test_stream = stream_create(test_device);
}

void test_stream_teardown(void) {
    stream_destroy(test_stream);
    device_destroy(test_device);
}

Model *test_model(const ModelConfig *cfg, int B, int T) {
    ArenaLayout layout;
    model_layout(cfg, 1, &layout);
    Model *m = model_create(cfg, &layout, (ComputePolicy){ 0 }, test_device, test_stream, B, T);
    model_own_weights(m);
    model_own_grads(m);
    return m;
}

double max_rel_diff(const float *a, const float *b, size_t n) {
    double diff = 0, scale = 0;
    for (size_t i = 0; i < n; i++) {
        diff = fmax(diff, fabs((double)a[i] - b[i]));
        scale = fmax(scale, fabs((double)b[i]));
    }
    return diff / scale;
}

double *to_double(const float *x, size_t n) {
    double *d = malloc(sizeof(double) * (n ? n : 1));
    for (size_t i = 0; i < n; i++) d[i] = x[i];
    return d;
}

double rel_error(const float *got, const double *want, size_t n) {
    double max_diff = 0, max_want = 0;
    for (size_t i = 0; i < n; i++) {
        max_diff = fmax(max_diff, fabs(got[i] - want[i]));
        max_want = fmax(max_want, fabs(want[i]));
    }
    return max_want > 0 ? max_diff / max_want : max_diff;
}

double rms_rel_error(const float *got, const double *want, size_t n) {
    double diff = 0, norm = 0;
    for (size_t i = 0; i < n; i++) {
        diff += (got[i] - want[i]) * (got[i] - want[i]);
        norm += want[i] * want[i];
    }
    return norm > 0 ? sqrt(diff / norm) : sqrt(diff);
}

void expect_rounded(const float *got, float *want, size_t n, const char *what) {
    size_t changed = 0;
    for (size_t i = 0; i < n; i++) {
        float r = bf16_rounded(want[i]);
        changed += memcmp(&r, &want[i], sizeof r) != 0;
        want[i] = r;
    }
    cr_expect_gt(changed, 0, "%s: no value needed rounding: the test could not fail", what);
    cr_expect_eq(memcmp(got, want, n * sizeof(float)), 0, "%s: not its fp32 output rounded to bf16", what);
}

float *train_weights(int zero, const StrategyConfig *sc, const TrainConfig *tc, const Dataset *data,
                     size_t *n) {
    Strategy *s = strategy_create(zero, sc);
    if (!s) return NULL;
    TrainResult r;
    if (train_run(s, tc, data, &r) != 0) {
        s->ops->destroy(s);
        return NULL;
    }
    ArenaLayout layout;
    model_layout(&sc->model, 1, &layout);
    *n = layout.total;
    float *w = malloc(layout.total * sizeof(float));
    strategy_read_all(s, STATE_WEIGHTS, w);
    s->ops->destroy(s);
    return w;
}

void test_skip(const char *why_fmt, ...) {
    char why[512];
    va_list ap;
    va_start(ap, why_fmt);
    vsnprintf(why, sizeof why, why_fmt, ap);
    va_end(ap);
    fprintf(stderr, "SKIP: %s::%s: %s\n", criterion_current_suite->name, criterion_current_test->name, why);
    fflush(stderr);
    cr_skip_test("SKIP: %s", why);
}

void test_batch(const Dataset *d, int split, int purpose, uint32_t seed, uint32_t index, int row0, int rows, int T,
                int *x, int *y) {
    char err[768];
    cr_assert_eq(dataset_batch(d, split, purpose, seed, index, row0, rows, T, x, y, err, sizeof err), 0, "%s", err);
}

const char *test_python(void) {
    const char *p = getenv("ZF_PYTHON");
    if (p) return p;
    return access("/usr/bin/python3", X_OK) == 0 ? "/usr/bin/python3" : "python3";
}

void need_torch(void) {
    char cmd[1024];
    snprintf(cmd, sizeof cmd, "%s -c 'import torch, numpy' >/dev/null 2>&1", test_python());
    if (system(cmd) == 0) return;
    if (getenv("ZF_REQUIRE_TORCH"))
        cr_assert_fail("ZF_REQUIRE_TORCH is set, and %s cannot import torch and numpy (make deps installs "
                       "python3-torch and python3-numpy)", test_python());
    test_skip("PyTorch is not importable by %s (install python3-torch: make deps; ZF_REQUIRE_TORCH=1 makes "
              "this a failure)", test_python());
}

/* The package `module` of build/pylib, importable, or the test skips (fails under ZF_REQUIRE_TORCH). */
static void need_pylib(const char *module) {
    char cmd[1024];
    snprintf(cmd, sizeof cmd, "PYTHONPATH=build/pylib %s -c 'import %s' >/dev/null 2>&1", test_python(), module);
    if (system(cmd) == 0) return;
    if (getenv("ZF_REQUIRE_TORCH"))
        cr_assert_fail("ZF_REQUIRE_TORCH is set, and %s cannot import %s from build/pylib (make deps "
                       "installs it there from PyPI)", test_python(), module);
    test_skip("the %s package is not in build/pylib (make deps installs it from PyPI; "
              "ZF_REQUIRE_TORCH=1 makes this a failure)", module);
}

void need_safetensors(void) {
    need_torch();
    need_pylib("safetensors.torch");
}

void need_tokenizers(void) { need_pylib("tokenizers"); }

const char *venv_python(void) {
    static char path[1024];
    const char *venv = getenv("ZF_VENV"), *home = getenv("HOME");
    if (venv) snprintf(path, sizeof path, "%s/bin/python", venv);
    else snprintf(path, sizeof path, "%s/.cache/zerofiber/venv/bin/python", home ? home : "");
    return path;
}

void need_transformers(void) {
    char cmd[1200];
    snprintf(cmd, sizeof cmd, "%s -c 'import torch, transformers' >/dev/null 2>&1", venv_python());
    if (system(cmd) == 0) return;
    if (getenv("ZF_REQUIRE_TORCH"))
        cr_assert_fail("ZF_REQUIRE_TORCH is set, and %s cannot import torch and transformers (make venv makes it)",
                       venv_python());
    test_skip("transformers is not importable by %s (make venv installs PyTorch 2.x and transformers there, about "
              "5.6 GB; ZF_REQUIRE_TORCH=1 makes this a failure)", venv_python());
}

void torch_gpt_command(char *cmd, size_t len, const char *args_fmt, ...) {
    int head = snprintf(cmd, len, "%s tests/torch_gpt.py ", test_python());
    cr_assert(head > 0 && (size_t)head < len, "the command does not fit in %zu bytes", len);
    va_list ap;
    va_start(ap, args_fmt);
    int tail = vsnprintf(cmd + head, len - (size_t)head, args_fmt, ap);
    va_end(ap);
    cr_assert(tail >= 0 && (size_t)tail < len - (size_t)head, "the command does not fit in %zu bytes", len);
}

const char *train_binary(void) {
    const char *path = getenv("ZF_TRAIN");
    return path ? path : "./bin/train";
}

const char *prepare_binary(void) {
    const char *path = getenv("ZF_PREPARE");
    return path ? path : "./bin/prepare";
}

const char *sample_binary(void) {
    const char *path = getenv("ZF_SAMPLE");
    return path ? path : "./bin/sample";
}

const char *export_binary(void) {
    const char *path = getenv("ZF_EXPORT");
    return path ? path : "./bin/export";
}

int run_tool(const char *binary, const char *args, const char *out, char *err, size_t errlen) {
    char cmd[4096];
    snprintf(cmd, sizeof cmd, "%s %s >%s 2>/tmp/zf_train_err_%d", binary, args, out, (int)getpid());
    int status = system(cmd);
    snprintf(cmd, sizeof cmd, "/tmp/zf_train_err_%d", (int)getpid());
    take_text(cmd, err, errlen);
    return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

void take_text(const char *path, char *text, size_t len) {
    FILE *f = fopen(path, "r");
    size_t n = f ? fread(text, 1, len - 1, f) : 0;
    text[n] = 0;
    if (f) fclose(f);
    unlink(path);
}

TokenBuckets buckets_of(const int *tokens, int BT, int V) {
    TokenBuckets b = { 0, malloc(((size_t)BT + 1) * sizeof(int)), malloc(((size_t)BT + 1) * sizeof(int)),
                       malloc(((size_t)BT + 1) * sizeof(int)) };
    int *counts = malloc(((size_t)V + 1) * sizeof(int));
    cr_assert(b.token && b.start && b.positions && counts, "out of memory");
    token_buckets_build(tokens, BT, V, counts, &b);
    free(counts);
    return b;
}

void buckets_free(TokenBuckets b) {
    free(b.token);
    free(b.start);
    free(b.positions);
}

/* Where a child's stderr goes, named by the parent's pid and the child's index. */
static void child_err_path(char *path, size_t len, int child) {
    snprintf(path, len, "/tmp/zf_child_%d_%d.err", (int)getpid(), child);
}

/* freopen leaves stderr fully buffered (glibc): set it unbuffered again. */
pid_t child_start(void (*body)(int), int child) {
    char path[64];
    child_err_path(path, sizeof path, child);
    pid_t pid = fork();
    cr_assert_neq(pid, -1, "fork failed");
    if (pid == 0) {
        if (!freopen(path, "w", stderr) || setvbuf(stderr, NULL, _IONBF, 0) != 0) _exit(4);
        body(child);
        _exit(0);
    }
    return pid;
}

int child_end(pid_t pid, int child, char *text, size_t len) {
    int status = 0;
    cr_assert_eq(waitpid(pid, &status, 0), pid, "waitpid failed");
    char path[64];
    child_err_path(path, sizeof path, child);
    take_text(path, text, len);
    return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

int count_error_lines(const char *text) {
    int errors = strncmp(text, "error:", 6) == 0;
    for (const char *nl = strchr(text, '\n'); nl; nl = strchr(nl + 1, '\n'))
        errors += strncmp(nl + 1, "error:", 6) == 0;
    return errors;
}

unsigned char *read_all(const char *path, size_t *n) {
    FILE *f = fopen(path, "rb");
    cr_assert_not_null(f, "cannot read %s", path);
    fseek(f, 0, SEEK_END);
    *n = (size_t)ftell(f);
    fseek(f, 0, SEEK_SET);
    unsigned char *bytes = malloc(*n + 1);
    cr_assert_eq(fread(bytes, 1, *n, f), *n);
    bytes[*n] = 0;
    fclose(f);
    return bytes;
}

void temp_dir(char *dir, size_t len, const char *stem) {
    snprintf(dir, len, "/tmp/zf_%s_XXXXXX", stem);
    cr_assert_not_null(mkdtemp(dir));
}

void remove_dir(const char *dir) {
    char cmd[256];
    snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
    cr_expect_eq(system(cmd), 0);
}

const char *test_mpirun(void) {
    const char *cmd = getenv("ZF_MPIRUN");
    return cmd ? cmd : "mpirun --allow-run-as-root --oversubscribe";
}

void need_mpi(void) {
    char cmd[1024];
    snprintf(cmd, sizeof cmd, "%s -np 1 true >/dev/null 2>&1", test_mpirun());
    const char *missing = system(cmd) == 0 ? NULL : "cannot start a process (make deps installs openmpi-bin)";
    snprintf(cmd, sizeof cmd, "%s -np 1 %s --help >/dev/null 2>&1", test_mpirun(), train_binary());
    if (!missing && system(cmd) != 0) missing = "cannot start bin/train (a build without MPI: MPI=0?)";
    if (!missing) return;
    if (getenv("ZF_REQUIRE_MPI")) cr_assert_fail("ZF_REQUIRE_MPI is set, and '%s' %s", test_mpirun(), missing);
    test_skip("'%s' %s; ZF_REQUIRE_MPI=1 makes this a failure", test_mpirun(), missing);
}

/* The whole file as text (malloc'd), or NULL. */
static char *read_text(const char *path) {
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    fseek(f, 0, SEEK_END);
    long size = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *text = calloc((size_t)size + 1, 1);
    if (text && fread(text, 1, (size_t)size, f) != (size_t)size) {
        free(text);
        text = NULL;
    }
    fclose(f);
    return text;
}

/* What is wrong with event i, or NULL; a complete event goes to *span. */
static const char *trace_event_error(const json_t *ev, TraceSpan *span, int *is_span) {
    const json_t *ph = json_object_get(ev, "ph"), *name = json_object_get(ev, "name");
    const json_t *pid = json_object_get(ev, "pid"), *args = json_object_get(ev, "args");
    if (!json_is_string(ph) || !json_is_string(name) || !json_is_number(pid) || !json_is_object(args))
        return "an event without a string ph and name, a number pid and an args object";
    *is_span = strcmp(json_string_value(ph), "X") == 0;
    if (strcmp(json_string_value(ph), "M") == 0) {
        const char *what = json_string_value(name);
        const int names_a_row = !strcmp(what, "process_name") || !strcmp(what, "thread_name");
        if (names_a_row && !json_is_string(json_object_get(args, "name")))
            return "a process_name or thread_name event without args.name";
        return NULL;
    }
    if (!*is_span) return "an event neither complete (X) nor metadata (M)";
    const json_t *tid = json_object_get(ev, "tid"), *ts = json_object_get(ev, "ts");
    const json_t *dur = json_object_get(ev, "dur"), *unit = json_object_get(args, "unit");
    if (!json_is_number(tid) || !json_is_number(ts) || !json_is_number(dur) || !json_is_number(unit))
        return "a complete event without numbers tid, ts, dur and args.unit";
    if (json_number_value(ts) < 0 || json_number_value(dur) < 0) return "a complete event with a negative ts or dur";
    snprintf(span->name, sizeof span->name, "%s", json_string_value(name));
    span->pid = (int)json_number_value(pid);
    span->tid = (int)json_number_value(tid);
    span->unit = (int)json_number_value(unit);
    span->ts = json_number_value(ts);
    span->dur = json_number_value(dur);
    return NULL;
}

TraceSpan *trace_read_spans(const char *path, int *n, char *err, size_t errlen) {
    char *text = read_text(path);
    json_t *root = text ? json_loads(text, JSON_REJECT_DUPLICATES, NULL) : NULL;
    free(text);
    const json_t *events = json_object_get(root, "traceEvents");
    if (!json_is_array(events)) {
        snprintf(err, errlen, "%s: %s", path, root ? "no traceEvents array" : "not readable JSON");
        json_decref(root);
        return NULL;
    }
    TraceSpan *spans = calloc(json_array_size(events) + 1, sizeof *spans);
    *n = 0;
    size_t i;
    const json_t *ev;
    json_array_foreach(events, i, ev) {
        int is_span = 0;
        const char *bad = trace_event_error(ev, &spans[*n], &is_span);
        if (bad) {
            snprintf(err, errlen, "%s: event %zu: %s", path, i, bad);
            free(spans);
            json_decref(root);
            return NULL;
        }
        *n += is_span;
    }
    json_decref(root);
    return spans;
}

int trace_spans_nest(const TraceSpan *spans, int n) {
    const double eps = 5e-4;  /* ts and dur are whole ns, in us */
    for (int i = 0; i < n; i++)
        for (int j = 0; j < n; j++) {
            const TraceSpan *a = &spans[i], *b = &spans[j];
            if (i == j || a->pid != b->pid || a->tid != b->tid) continue;
            int disjoint = a->ts + a->dur <= b->ts + eps || b->ts + b->dur <= a->ts + eps;
            int a_in_b = a->ts >= b->ts - eps && a->ts + a->dur <= b->ts + b->dur + eps;
            int b_in_a = b->ts >= a->ts - eps && b->ts + b->dur <= a->ts + a->dur + eps;
            if (!disjoint && !a_in_b && !b_in_a) return 0;
        }
    return 1;
}

StrategyConfig small_gpt(int vocab, GptShape shape, int nranks, int batch, float dropout) {
    StrategyConfig sc = {
        .model = { vocab, shape.block, shape.layers, 2, shape.width, MODEL_GPT, 0, 0 }, .nranks = nranks,
        .batch = batch, .dropout = dropout, .seed = shape.seed, .beta1 = 0.9f, .beta2 = 0.99f, .eps = 1e-8f,
        .weight_decay = 0.1f,
    };
    return sc;
}

TrainConfig quiet_run(int iters) {
    TrainConfig tc = {
        .iters = iters, .schedule = { 1e-2f, 1e-3f, 5, iters }, .grad_clip = 1.0f,
        .eval_every = 0, .eval_iters = 4, .log_every = 0, .sample_chars = 0,
    };
    return tc;
}

int run_train(const char *args, char *err, size_t errlen) {
    return run_tool(train_binary(), args, "/dev/null", err, errlen);
}

int count_lines(const char *text) {
    int n = 0;
    for (; *text; text++) n += *text == '\n';
    return n;
}

/* The binary under test: bin/zero_memory, or the sanitizer build's. */
const char *zero_memory_binary(void) {
    const char *path = getenv("ZF_ZERO_MEMORY");
    return path ? path : "./bin/zero_memory";
}

/* exit status `want`, one line on stderr holding `needle` */
void expect_one_line(int rc, int want, const char *err, const char *needle, const char *what) {
    cr_expect_eq(rc, want, "%s: exit %d, stderr: %s", what, rc, err);
    cr_expect(strstr(err, needle) != NULL, "%s: no '%s' in stderr: %s", what, needle, err);
    cr_expect_eq(count_lines(err), 1, "%s: stderr: %s", what, err);
}

/* Split a command line at its spaces into argv[1..] (argv[0] "train"); argc. */
int split_args(char *line, char **argv, int max) {
    int argc = 0;
    argv[argc++] = "train";
    for (char *word = strtok(line, " "); word && argc < max; word = strtok(NULL, " ")) argv[argc++] = word;
    return argc;
}

/* The file at path still holds exactly the n bytes of `good`. */
void expect_unchanged(const char *path, const unsigned char *good, size_t n, const char *what) {
    size_t after_n;
    unsigned char *after = read_all(path, &after_n);
    cr_expect(after_n == n && memcmp(after, good, n) == 0, "%s", what);
    free(after);
}

void write_all(const char *path, const void *bytes, size_t n) {
    FILE *f = fopen(path, "wb");
    cr_assert_not_null(f);
    cr_assert_eq(fwrite(bytes, 1, n, f), n);
    fclose(f);
}

void write_linked(const char *dir, const char *real, const char *link_name, const void *bytes, size_t n, char *path,
                  size_t len) {
    char link_path[1024];
    snprintf(path, len, "%s/%s", dir, real);
    write_all(path, bytes, n);
    if (!link_name[0]) return;
    snprintf(link_path, sizeof link_path, "%s/%s", dir, link_name + (link_name[0] == '@'));
    cr_assert_eq(link_name[0] == '@' ? symlink(path, link_path) : link(path, link_path), 0, "%s", link_path);
}

/* A small model, every eval one batch, nothing sampled. */
const char TINY[] = "--layers=2 --embd=16 --heads=2 --block=16 --batch=2 --eval-iters=1 --sample-chars=0";

/* A trained checkpoint of TINY in a fresh folder: its path in ckpt. */
void train_checkpoint(char *dir, size_t dirlen, char *ckpt, size_t len, int iters) {
    char args[512], err[4096];
    temp_dir(dir, dirlen, "ckpt");
    snprintf(ckpt, len, "%s/ckpt.safetensors", dir);
    snprintf(args, sizeof args, "%s --iters=%d --out=%s", TINY, iters, dir);
    cr_assert_eq(run_train(args, err, sizeof err), 0, "%s", err);
}

/* The steps the optimizer took, as the checkpoint says. */
int adam_steps_of(const char *ckpt) {
    CheckpointInfo info;
    char err[512];
    cr_assert_eq(checkpoint_read_info(ckpt, &info, err, sizeof err), 0, "%s", err);
    return info.adam_step;
}
