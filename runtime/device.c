/* device.c: what every backend of device.h shares: memory accounting by kind,
 * and the calls that reach the backend of a device, stream or event. */
#include <stdio.h>
#include <stdlib.h>

#include "device_backend.h"
#include "host.h"

void device_init(Device *dev, const DeviceOps *ops, DeviceKind kind, int ordinal, const char *name) {
    dev->ops = ops;
    dev->kind = kind;
    dev->ordinal = ordinal;
    snprintf(dev->name, sizeof dev->name, "%s", name);
    int rc = pthread_mutex_init(&dev->mu, NULL);
    if (rc != 0) {
        fprintf(stderr, "fatal: pthread_mutex_init failed (%d)\n", rc);
        abort();
    }
}

void device_destroy(Device *dev) {
    if (!dev) return;
    pthread_mutex_destroy(&dev->mu);
    dev->ops->destroy(dev);
}

const char *device_name(const Device *dev) { return dev->name; }
DeviceKind device_kind(const Device *dev) { return dev->kind; }
int device_ordinal(const Device *dev) { return dev->ordinal; }

/* Bytes allocated on dev, every kind together. */
static double device_total_bytes(Device *dev) {
    size_t total = 0;
    for (int k = 0; k < MEM_KINDS; k++) total += device_bytes_in_use(dev, (MemKind)k);
    return (double)total;
}

void *device_alloc(Device *dev, MemKind kind, size_t bytes) {
    static const char *const kind_names[MEM_KINDS] = {
        [MEM_WEIGHTS] = "weights", [MEM_GRADS] = "gradients", [MEM_OPTIMIZER] = "optimizer state",
        [MEM_WORKING] = "working buffers", [MEM_ACTIVATIONS] = "activations",
    };
    if (graph_capturing()) {  /* a graph's work holds the addresses it was captured with */
        fprintf(stderr, "fatal: %zu bytes of %s allocated on %s during a graph's capture\n", bytes,
                kind_names[kind], dev->name);
        abort();
    }
    double in_use = device_total_bytes(dev);
    int capped = dev->limit > 0 && in_use + (double)bytes > (double)dev->limit;
    /* the CPU's devices share the machine's memory, taken before it is touched */
    int beyond_machine = !capped && dev->kind == DEVICE_CPU && host_memory_take(bytes) != 0;
    void *p = capped || beyond_machine ? NULL : dev->ops->alloc(dev, bytes);
    if (!p && !capped && !beyond_machine && dev->kind == DEVICE_CPU) host_memory_give_back(bytes);
    if (!p) {
        /* a clear line and status 1, not an abort: the run's state is on disk */
        char cap[96] = "";
        if (beyond_machine)
            snprintf(cap, sizeof cap, ", of the %.1f MB the machine had free for the run", host_memory_budget() / 1e6);
        else if (dev->limit > 0)
            snprintf(cap, sizeof cap, ", of the %.1f MB --max-memory-mb allows", dev->limit / 1e6);
        fprintf(stderr,
                "error: out of memory on %s%s%s: cannot allocate %zu bytes for %s (%.1f MB in use there%s)%s%s\n",
                dev->name, dev->owner[0] ? " for " : "", dev->owner, bytes, kind_names[kind], in_use / 1e6, cap,
                dev->hint[0] ? "; " : "", dev->hint);
        exit(1);
    }
    pthread_mutex_lock(&dev->mu);
    dev->bytes[kind] += bytes;
    size_t total = 0;
    for (int k = 0; k < MEM_KINDS; k++) total += dev->bytes[k];
    if (total > dev->peak) dev->peak = total;
    pthread_mutex_unlock(&dev->mu);
    return p;
}

void device_free(Device *dev, MemKind kind, void *ptr, size_t bytes) {
    if (!ptr) return;
    dev->ops->free(dev, ptr);
    if (dev->kind == DEVICE_CPU) host_memory_give_back(bytes);
    pthread_mutex_lock(&dev->mu);
    dev->bytes[kind] -= bytes;
    pthread_mutex_unlock(&dev->mu);
}

size_t device_bytes_in_use(const Device *dev, MemKind kind) {
    pthread_mutex_lock((pthread_mutex_t *)&dev->mu);
    size_t n = dev->bytes[kind];
    pthread_mutex_unlock((pthread_mutex_t *)&dev->mu);
    return n;
}

size_t device_peak_bytes(const Device *dev) {
    pthread_mutex_lock((pthread_mutex_t *)&dev->mu);
    size_t n = dev->peak;
    pthread_mutex_unlock((pthread_mutex_t *)&dev->mu);
    return n;
}

void device_set_limit(Device *dev, size_t bytes) { dev->limit = bytes; }
size_t device_limit(const Device *dev) { return dev->limit; }

void device_set_owner(Device *dev, const char *owner, const char *hint) {
    snprintf(dev->owner, sizeof dev->owner, "%s", owner);
    snprintf(dev->hint, sizeof dev->hint, "%s", hint);
}

size_t device_reported_bytes(Device *dev) { return dev->ops->reported_bytes ? dev->ops->reported_bytes(dev) : 0; }

void *device_alloc_host(Device *dev, size_t bytes) {
    return dev->ops->alloc_host ? dev->ops->alloc_host(dev, bytes) : host_calloc(bytes, 1);
}

void device_free_host(Device *dev, void *ptr) {
    if (!ptr) return;
    if (dev->ops->free_host) dev->ops->free_host(dev, ptr);
    else free(ptr);
}

Stream *stream_create(Device *dev) { return dev->ops->stream_create(dev); }

void stream_destroy(Stream *s) {
    if (s) s->dev->ops->stream_destroy(s);
}

Device *stream_device(Stream *s) { return s->dev; }

void stream_copy(Stream *s, void *dst, const void *src, size_t bytes) {
    if (bytes) s->dev->ops->copy(s, dst, src, bytes);
}

void stream_host_task(Stream *s, void (*fn)(void *arg), void *arg) {
    if (!s->dev->ops->host_task) {
        fprintf(stderr, "fatal: a host task on %s, whose streams run none\n", s->dev->name);
        abort();
    }
    s->dev->ops->host_task(s, fn, arg);
}

void stream_sum_held(Stream *s, void *out, const void *const *in, DType held, int n, size_t len, float scale,
                     DType dtype) {
    if (n < 1 || n > STREAM_SUM_MAX) {
        fprintf(stderr, "fatal: a sum of %d buffers (1..%d)\n", n, STREAM_SUM_MAX);
        abort();
    }
    if (len) s->dev->ops->sum(s, out, in, held, n, len, scale, dtype);
}

void stream_sum(Stream *s, float *out, float *const *in, int n, size_t len, float scale, DType dtype) {
    const void *inputs[STREAM_SUM_MAX];
    for (int q = 0; q < n && q < STREAM_SUM_MAX; q++) inputs[q] = in[q];
    stream_sum_held(s, out, inputs, DTYPE_FP32, n, len, scale, dtype);
}

void stream_timer_start(Stream *s, Stamp *started) {
    if (started) started->dev = s->dev;
    s->dev->ops->timer_start(s, started);
}

void stream_hold(Stream *s, double seconds) {
    if (seconds > 0) s->dev->ops->hold(s, seconds);
}

void stream_synchronize(Stream *s) { s->dev->ops->synchronize(s); }

void stream_stamp(Stream *s, Stamp *at) {
    at->dev = s->dev;
    s->dev->ops->stamp(s, at);
}

int64_t stamp_read(Stamp *at) {
    if (at->dev->ops->stamp_read) at->dev->ops->stamp_read(at);
    return at->ns;
}

int64_t stamp_elapsed(Stamp *from, Stamp *to) {
    if (from->dev->ops->stamp_elapsed) return from->dev->ops->stamp_elapsed(from, to);
    int64_t start = stamp_read(from);
    return stamp_read(to) - start;
}

Event *event_create(Device *dev) { return dev->ops->event_create(dev); }

void event_destroy(Event *ev) {
    if (ev) ev->dev->ops->event_destroy(ev);
}

void event_record(Event *ev, Stream *s) { s->dev->ops->event_record(ev, s); }
void stream_wait_event(Stream *s, Event *ev) { s->dev->ops->wait_event(s, ev); }
void event_synchronize(Event *ev) { ev->dev->ops->event_synchronize(ev); }

/* The stream a capture began on, while one is under way: one at a time;
 * and the graphs made and not yet destroyed. */
static pthread_mutex_t capture_mu = PTHREAD_MUTEX_INITIALIZER;
static Stream *capture_origin;
static int graphs_live;

static void graph_fatal(const char *what, const Stream *s) {
    fprintf(stderr, "fatal: %s on %s\n", what, s->dev->name);
    abort();
}

int graph_capturing(void) {
    pthread_mutex_lock(&capture_mu);
    int capturing = capture_origin != NULL;
    pthread_mutex_unlock(&capture_mu);
    return capturing;
}

void graph_capture_begin(Stream *origin) {
    if (!origin->dev->ops->capture_begin) graph_fatal("a graph's capture, which this backend has not", origin);
    pthread_mutex_lock(&capture_mu);
    int busy = capture_origin != NULL;
    if (!busy) capture_origin = origin;
    pthread_mutex_unlock(&capture_mu);
    if (busy) graph_fatal("a capture begun while another is under way", origin);
    origin->dev->ops->capture_begin(origin);
}

Graph *graph_capture_end(Stream *origin) {
    pthread_mutex_lock(&capture_mu);
    int ours = capture_origin == origin;
    pthread_mutex_unlock(&capture_mu);
    if (!ours) graph_fatal("a capture ended on a stream it did not begin on", origin);
    Graph *g = origin->dev->ops->capture_end(origin);
    pthread_mutex_lock(&capture_mu);
    capture_origin = NULL;
    graphs_live++;
    pthread_mutex_unlock(&capture_mu);
    return g;
}

void graph_launch(Graph *g, Stream *origin) {
    if (graph_capturing()) graph_fatal("a graph launched during a capture", origin);
    origin->dev->ops->graph_launch(g, origin);
}

void graph_destroy(Graph *g) {
    if (!g) return;
    g->dev->ops->graph_destroy(g);
    pthread_mutex_lock(&capture_mu);
    graphs_live--;
    pthread_mutex_unlock(&capture_mu);
}

void graph_scratch_grows(const Stream *s) {
    pthread_mutex_lock(&capture_mu);
    int live = graphs_live;
    pthread_mutex_unlock(&capture_mu);
    if (live) graph_fatal("a stream's scratch grew while a graph holds the old one's address (size it before the "
                          "capture)", s);
}
