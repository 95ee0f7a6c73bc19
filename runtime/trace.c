/* trace.c: spans of stream work, and the Chrome trace-event file (trace.h).
 *
 * Each traced stream has a lane: its row in the file and the stack of its open
 * spans. A span's two stamps are filled by the stream as it runs, so a span
 * never moves once begun: the spans live in one array of max_spans, allocated
 * at creation (untouched pages cost nothing).
 */
#include "trace.h"

#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "device_backend.h"
#include "host.h"

enum { TRACE_NAME_MAX = 48, TRACE_DEPTH = 8, TRACE_MAX_LANES = 1024, TRACE_MAX_PROCESSES = 512,
       TRACE_ROW_NAME_MAX = 64 };

typedef struct {
    char name[TRACE_NAME_MAX];
    int pid, tid, unit;
    Stamp start, end;
    int ended;                 /* its end stamp is enqueued */
    int read;                  /* its stamps are read into start_ns, end_ns */
    int64_t start_ns, end_ns;
} Span;

struct TraceLane {
    Trace *trace;
    Stream *stream;            /* NULL once collected */
    int pid, tid;
    char thread_name[TRACE_ROW_NAME_MAX];
    int depth;
    Span *open[TRACE_DEPTH];   /* NULL: begun while the trace was not recording */
    int open_unit[TRACE_DEPTH];
};

struct Trace {
    pthread_mutex_t mu;        /* guards the span count: spans are begun from the rank threads */
    int recording;
    Span *spans;
    size_t max_spans, nspans, dropped;
    struct TraceLane lanes[TRACE_MAX_LANES];
    int nlanes;
    char process[TRACE_MAX_PROCESSES][TRACE_ROW_NAME_MAX];
    int nprocesses;
};

Trace *trace_create(size_t max_spans) {
    Trace *t = host_calloc(1, sizeof *t);
    t->spans = host_calloc(max_spans, sizeof *t->spans);
    t->max_spans = max_spans;
    int rc = pthread_mutex_init(&t->mu, NULL);
    if (rc != 0) host_fatal("pthread_mutex_init failed for a trace");
    return t;
}

void trace_destroy(Trace *t) {
    if (!t) return;
    trace_collect(t);
    pthread_mutex_destroy(&t->mu);
    free(t->spans);
    free(t);
}

int trace_add_process(Trace *t, const char *name) {
    if (t->nprocesses == TRACE_MAX_PROCESSES) host_fatal("a trace of more than 512 processes");
    snprintf(t->process[t->nprocesses], TRACE_ROW_NAME_MAX, "%s", name);
    return t->nprocesses++;
}

void trace_attach(Trace *t, Stream *s, int pid, int tid, const char *thread_name) {
    if (t->nlanes == TRACE_MAX_LANES) host_fatal("a trace of more than 1024 streams");
    struct TraceLane *lane = &t->lanes[t->nlanes++];
    *lane = (struct TraceLane){ .trace = t, .stream = s, .pid = pid, .tid = tid };
    snprintf(lane->thread_name, sizeof lane->thread_name, "%s", thread_name);
    s->trace = lane;
}

void trace_record(Trace *t, int on) { t->recording = on; }

/* A fresh span, or NULL (counted) when the trace is full. */
static Span *new_span(Trace *t) {
    pthread_mutex_lock(&t->mu);
    Span *span = t->nspans < t->max_spans ? &t->spans[t->nspans++] : NULL;
    if (!span) t->dropped++;
    pthread_mutex_unlock(&t->mu);
    return span;
}

/* trace_begin's and trace_begin_link's: the span's start stamped where the
 * stream gets to it, or where the modeled link's clock starts (and started). */
static void begin_span(Stream *s, const char *name, int unit, int link_clock) {
    struct TraceLane *lane = s->trace;
    if (!lane) {
        if (link_clock) stream_timer_start(s, NULL);
        return;
    }
    if (lane->depth == TRACE_DEPTH) host_fatal("trace spans nested more than 8 deep");
    if (unit < 0 && lane->depth > 0) unit = lane->open_unit[lane->depth - 1];
    Span *span = lane->trace->recording ? new_span(lane->trace) : NULL;
    if (span) {
        snprintf(span->name, sizeof span->name, "%s", name);
        span->pid = lane->pid;
        span->tid = lane->tid;
        span->unit = unit;
    }
    if (link_clock) stream_timer_start(s, span ? &span->start : NULL);
    else if (span) stream_stamp(s, &span->start);
    lane->open[lane->depth] = span;
    lane->open_unit[lane->depth] = unit;
    lane->depth++;
}

void trace_begin(Stream *s, const char *name, int unit) { begin_span(s, name, unit, 0); }

void trace_begin_link(Stream *s, const char *name, int unit) { begin_span(s, name, unit, 1); }

void trace_end(Stream *s) {
    struct TraceLane *lane = s->trace;
    if (!lane) return;
    if (lane->depth == 0) host_fatal("trace_end without its trace_begin");
    Span *span = lane->open[--lane->depth];
    if (!span) return;
    stream_stamp(s, &span->end);
    span->ended = 1;
}

void trace_collect(Trace *t) {
    for (int i = 0; i < t->nlanes; i++)
        if (t->lanes[i].stream) stream_synchronize(t->lanes[i].stream);
    for (size_t i = 0; i < t->nspans; i++) {
        Span *span = &t->spans[i];
        if (span->read) continue;
        span->start_ns = stamp_read(&span->start);
        if (span->ended) span->end_ns = stamp_read(&span->end);
        span->read = 1;
    }
    for (int i = 0; i < t->nlanes; i++) {
        if (t->lanes[i].stream) t->lanes[i].stream->trace = NULL;
        t->lanes[i].stream = NULL;
    }
}

size_t trace_spans(const Trace *t) { return t->nspans; }
size_t trace_dropped(const Trace *t) { return t->dropped; }

/* The rows' names: Perfetto and chrome://tracing show processes as groups of
 * rows and threads as rows, sorted by the sort indices. */
static void write_rows(const Trace *t, FILE *f, const char **sep) {
    for (int p = 0; p < t->nprocesses; p++) {
        fprintf(f, "%s{\"name\": \"process_name\", \"ph\": \"M\", \"pid\": %d, \"args\": {\"name\": \"%s\"}}",
                *sep, p, t->process[p]);
        *sep = ",\n";
        fprintf(f, "%s{\"name\": \"process_sort_index\", \"ph\": \"M\", \"pid\": %d, \"args\": {\"sort_index\": %d}}",
                *sep, p, p);
    }
    for (int i = 0; i < t->nlanes; i++) {
        const struct TraceLane *lane = &t->lanes[i];
        fprintf(f, "%s{\"name\": \"thread_name\", \"ph\": \"M\", \"pid\": %d, \"tid\": %d, "
                "\"args\": {\"name\": \"%s\"}}", *sep, lane->pid, lane->tid, lane->thread_name);
        *sep = ",\n";
        fprintf(f, "%s{\"name\": \"thread_sort_index\", \"ph\": \"M\", \"pid\": %d, \"tid\": %d, "
                "\"args\": {\"sort_index\": %d}}", *sep, lane->pid, lane->tid, lane->tid);
    }
}

int trace_write(Trace *t, const char *path, char *err, size_t errlen) {
    trace_collect(t);
    FILE *f = fopen(path, "w");
    if (!f) {
        snprintf(err, errlen, "cannot write the trace '%s': %s", path, strerror(errno));
        return -1;
    }
    int64_t first = INT64_MAX;
    for (size_t i = 0; i < t->nspans; i++)
        if (t->spans[i].ended && t->spans[i].start_ns < first) first = t->spans[i].start_ns;
    const char *sep = "";
    fprintf(f, "{\"displayTimeUnit\": \"ms\", \"traceEvents\": [\n");
    write_rows(t, f, &sep);
    for (size_t i = 0; i < t->nspans; i++) {
        const Span *span = &t->spans[i];
        if (!span->ended) continue;
        fprintf(f, "%s{\"name\": \"%s\", \"ph\": \"X\", \"pid\": %d, \"tid\": %d, \"ts\": %.3f, \"dur\": %.3f, "
                "\"args\": {\"unit\": %d}}", sep, span->name, span->pid, span->tid,
                (double)(span->start_ns - first) / 1e3, (double)(span->end_ns - span->start_ns) / 1e3, span->unit);
        sep = ",\n";
    }
    fprintf(f, "\n]}\n");
    int failed = ferror(f);
    if (fclose(f) != 0 || failed) {
        snprintf(err, errlen, "cannot write the trace '%s': %s", path, strerror(errno));
        return -1;
    }
    return 0;
}
