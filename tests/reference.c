/* reference.c: the double-precision reference of reference.h. */
#include "reference.h"

#include <criterion/criterion.h>
#include <jansson.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "../kernels/dropout.h"
#include "../model/models.h"

void ref_embedding(double *out, const int *tokens, const double *wte, const double *wpe, int B, int T, int C) {
    for (int b = 0; b < B; b++)
        for (int t = 0; t < T; t++)
            for (int c = 0; c < C; c++)
                out[((size_t)b * T + t) * C + c] = wte[(size_t)tokens[b * T + t] * C + c] + wpe[(size_t)t * C + c];
}

void ref_layernorm(double *out, const double *inp, const double *weight, int N, int C) {
    for (int i = 0; i < N; i++) {
        const double *x = inp + (size_t)i * C;
        double mean = 0, var = 0;
        for (int c = 0; c < C; c++) mean += x[c];
        mean /= C;
        for (int c = 0; c < C; c++) var += (x[c] - mean) * (x[c] - mean);
        var /= C;
        for (int c = 0; c < C; c++) out[(size_t)i * C + c] = (x[c] - mean) / sqrt(var + 1e-5) * weight[c];
    }
}

void ref_matmul(double *out, const double *inp, const double *weight, int N, int C, int OC) {
    for (int i = 0; i < N; i++)
        for (int o = 0; o < OC; o++) {
            double acc = 0;
            for (int c = 0; c < C; c++) acc += inp[(size_t)i * C + c] * weight[(size_t)o * C + c];
            out[(size_t)i * OC + o] = acc;
        }
}

void ref_attention(double *out, double *lse, const double *qkv, int B, int T, int C, int NH, Dropout drop) {
    int hs = C / NH;
    double *w = malloc(sizeof(double) * T);
    float *mask = malloc(sizeof(float) * T);
    for (int b = 0; b < B; b++)
        for (int h = 0; h < NH; h++)
            for (int t = 0; t < T; t++) {
                const double *q = qkv + ((size_t)b * T + t) * 3 * C + h * hs;
                double maxval = -INFINITY, sum = 0;
                for (int j = 0; j <= t; j++) {
                    const double *k = qkv + ((size_t)b * T + j) * 3 * C + C + h * hs;
                    double dot = 0;
                    for (int d = 0; d < hs; d++) dot += q[d] * k[d];
                    w[j] = dot / sqrt((double)hs);
                    if (w[j] > maxval) maxval = w[j];
                }
                for (int j = 0; j <= t; j++) { w[j] = exp(w[j] - maxval); sum += w[j]; }
                if (lse) lse[((size_t)b * NH + h) * T + t] = maxval + log(sum);
                if (drop.p > 0) dropout_scales(drop, (((size_t)b * NH + h) * T + t) * T, (size_t)T, mask);
                for (int d = 0; d < hs; d++) {
                    double acc = 0;
                    for (int j = 0; j <= t; j++) {
                        const double *v = qkv + ((size_t)b * T + j) * 3 * C + 2 * C + h * hs;
                        acc += w[j] / sum * (drop.p > 0 ? mask[j] : 1.0) * v[d];
                    }
                    out[((size_t)b * T + t) * C + h * hs + d] = acc;
                }
            }
    free(w);
    free(mask);
}

void ref_gelu(double *out, const double *inp, size_t n, int tanh_form) {
    for (size_t i = 0; i < n; i++) {
        double x = inp[i];
        out[i] = tanh_form ? 0.5 * x * (1.0 + tanh(sqrt(2.0 / M_PI) * (x + 0.044715 * x * x * x)))
                           : 0.5 * x * (1.0 + erf(x / sqrt(2.0)));
    }
}

void ref_dropout(double *out, const double *inp, size_t n, Dropout drop) {
    float *mask = malloc(sizeof(float) * (n ? n : 1));
    dropout_scales(drop, 0, n, mask);
    for (size_t i = 0; i < n; i++) out[i] = inp[i] * mask[i];
    free(mask);
}

double ref_crossentropy(const double *logits, const int *targets, int N, int V) {
    double total = 0;
    for (int i = 0; i < N; i++) {
        const double *l = logits + (size_t)i * V;
        double maxval = l[0], sum = 0;
        for (int j = 1; j < V; j++) if (l[j] > maxval) maxval = l[j];
        for (int j = 0; j < V; j++) sum += exp(l[j] - maxval);
        total += log(sum) - (l[targets[i]] - maxval);
    }
    return total / N;
}

/* The tensor named by fmt (with layer l) in a double arena. */
static const double *param(const ArenaLayout *layout, const double *params, const char *fmt, int l) {
    char name[ARENA_NAME_MAX];
    snprintf(name, sizeof name, fmt, l);
    return params + layout->tensors[arena_find(layout, name)].offset;
}

/* out[N,OC] += the bias of that name, where the layout has one (a model with biases). */
static void add_bias(double *out, const ArenaLayout *layout, const double *params, const char *fmt, int l, size_t N,
                     int OC) {
    char name[ARENA_NAME_MAX];
    snprintf(name, sizeof name, fmt, l);
    if (arena_find(layout, name) < 0) return;
    const double *b = params + layout->tensors[arena_find(layout, name)].offset;
    for (size_t n = 0; n < N; n++)
        for (int c = 0; c < OC; c++) out[n * OC + c] += b[c];
}

/* drop at one site */
static Dropout at_site(Dropout drop, uint32_t site) {
    drop.site = site;
    return drop;
}

double ref_gpt_loss(const ModelConfig *cfg, const ArenaLayout *layout, const double *params,
                    const int *tokens, const int *targets, int B, int T, Dropout drop) {
    int C = cfg->embd, NH = cfg->heads, V = cfg->vocab;
    size_t BT = (size_t)B * T;
    double *x = malloc(sizeof(double) * BT * C), *ln = malloc(sizeof(double) * BT * C);
    double *qkv = malloc(sizeof(double) * BT * 3 * C), *y = malloc(sizeof(double) * BT * C);
    double *proj = malloc(sizeof(double) * BT * C), *fc = malloc(sizeof(double) * BT * 4 * C);
    double *act = malloc(sizeof(double) * BT * 4 * C), *logits = malloc(sizeof(double) * BT * V);
    ref_embedding(x, tokens, param(layout, params, "transformer.wte.weight", 0), param(layout, params, "transformer.wpe.weight", 0), B, T, C);
    ref_dropout(x, x, BT * C, at_site(drop, 0));
    for (int l = 0; l < cfg->layers; l++) {
        ref_layernorm(ln, x, param(layout, params, "transformer.h.%d.ln_1.weight", l), BT, C);
        add_bias(ln, layout, params, "transformer.h.%d.ln_1.bias", l, BT, C);
        ref_matmul(qkv, ln, param(layout, params, "transformer.h.%d.attn.c_attn.weight", l), BT, C, 3 * C);
        add_bias(qkv, layout, params, "transformer.h.%d.attn.c_attn.bias", l, BT, 3 * C);
        uint32_t site = 1 + 3 * (uint32_t)l;
        ref_attention(y, NULL, qkv, B, T, C, NH, at_site(drop, site));
        ref_matmul(proj, y, param(layout, params, "transformer.h.%d.attn.c_proj.weight", l), BT, C, C);
        add_bias(proj, layout, params, "transformer.h.%d.attn.c_proj.bias", l, BT, C);
        ref_dropout(proj, proj, BT * C, at_site(drop, site + 1));
        for (size_t i = 0; i < BT * C; i++) x[i] += proj[i];
        ref_layernorm(ln, x, param(layout, params, "transformer.h.%d.ln_2.weight", l), BT, C);
        add_bias(ln, layout, params, "transformer.h.%d.ln_2.bias", l, BT, C);
        ref_matmul(fc, ln, param(layout, params, "transformer.h.%d.mlp.c_fc.weight", l), BT, C, 4 * C);
        add_bias(fc, layout, params, "transformer.h.%d.mlp.c_fc.bias", l, BT, 4 * C);
        ref_gelu(act, fc, BT * 4 * C, cfg->gelu_tanh);
        ref_matmul(proj, act, param(layout, params, "transformer.h.%d.mlp.c_proj.weight", l), BT, 4 * C, C);
        add_bias(proj, layout, params, "transformer.h.%d.mlp.c_proj.bias", l, BT, C);
        ref_dropout(proj, proj, BT * C, at_site(drop, site + 2));
        for (size_t i = 0; i < BT * C; i++) x[i] += proj[i];
    }
    ref_layernorm(ln, x, param(layout, params, "transformer.ln_f.weight", 0), BT, C);
    add_bias(ln, layout, params, "transformer.ln_f.bias", 0, BT, C);
    ref_matmul(logits, ln, param(layout, params, "transformer.wte.weight", 0), BT, C, V);
    double loss = ref_crossentropy(logits, targets, BT, V);
    free(x); free(ln); free(qkv); free(y); free(proj); free(fc); free(act); free(logits);
    return loss;
}

static double ref_mlp_loss(const ModelConfig *cfg, const ArenaLayout *layout, const double *params,
                           const int *tokens, const int *targets, int B, int T) {
    int C = cfg->embd, V = cfg->vocab;
    size_t BT = (size_t)B * T;
    double *x = malloc(sizeof(double) * BT * C), *ln = malloc(sizeof(double) * BT * C);
    double *h = malloc(sizeof(double) * BT * C), *logits = malloc(sizeof(double) * BT * V);
    ref_embedding(x, tokens, param(layout, params, "transformer.wte.weight", 0),
                  param(layout, params, "transformer.wpe.weight", 0), B, T, C);
    for (int l = 0; l < cfg->layers; l++) {
        ref_layernorm(ln, x, param(layout, params, "layers.%d.ln.weight", l), BT, C);
        ref_matmul(h, ln, param(layout, params, "layers.%d.fc.weight", l), BT, C, C);
        ref_gelu(h, h, BT * C, 0);
        for (size_t i = 0; i < BT * C; i++) x[i] += h[i];
    }
    ref_matmul(logits, x, param(layout, params, "transformer.wte.weight", 0), BT, C, V);
    double loss = ref_crossentropy(logits, targets, BT, V);
    free(x); free(ln); free(h); free(logits);
    return loss;
}

double ref_model_loss(const ModelConfig *cfg, const ArenaLayout *layout, const double *params,
                      const int *tokens, const int *targets, int B, int T, Dropout drop) {
    if (cfg->kind == MODEL_MLP) return ref_mlp_loss(cfg, layout, params, tokens, targets, B, T);
    return ref_gpt_loss(cfg, layout, params, tokens, targets, B, T, drop);
}

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
    Model *m = model_create(cfg, &layout, 0, test_device, test_stream, B, T);
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
