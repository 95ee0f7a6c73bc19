/* device_cpu.c: the CPU backend of device.h.
 *
 * A stream is a worker thread draining a ring of tasks in FIFO order. An event
 * holds two counters: how many times it was recorded, and the highest record
 * that its stream has reached. A wait captures the record count at enqueue time
 * and blocks the waiting stream's worker until that record is reached.
 */
#include "device.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* pthread calls fail only on programming errors or exhausted resources. */
static void check_pthread(int rc, const char *what) {
    if (rc != 0) {
        fprintf(stderr, "fatal: %s failed: %s\n", what, strerror(rc));
        abort();
    }
}

struct Device {
    char name[32];
    pthread_mutex_t mu;
    size_t bytes[MEM_KINDS];
};

Device *device_create_cpu(void) {
    Device *dev = calloc(1, sizeof *dev);
    if (!dev) { fprintf(stderr, "fatal: out of host memory\n"); abort(); }
    snprintf(dev->name, sizeof dev->name, "cpu");
    check_pthread(pthread_mutex_init(&dev->mu, NULL), "pthread_mutex_init");
    return dev;
}

void device_destroy(Device *dev) {
    if (!dev) return;
    pthread_mutex_destroy(&dev->mu);
    free(dev);
}

const char *device_name(const Device *dev) { return dev->name; }

void *device_alloc(Device *dev, MemKind kind, size_t bytes) {
    /* 64-byte alignment keeps BLAS and vector loads on cache lines. */
    size_t rounded = (bytes + 63) / 64 * 64;
    void *p = aligned_alloc(64, rounded ? rounded : 64);
    if (!p) {
        fprintf(stderr, "fatal: cannot allocate %zu bytes on %s\n", bytes, dev->name);
        abort();
    }
    memset(p, 0, rounded);
    pthread_mutex_lock(&dev->mu);
    dev->bytes[kind] += bytes;
    pthread_mutex_unlock(&dev->mu);
    return p;
}

void device_free(Device *dev, MemKind kind, void *ptr, size_t bytes) {
    if (!ptr) return;
    free(ptr);
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

/* ---- streams ---- */

enum { QUEUE_CAPACITY = 1024 };

typedef struct {
    TaskFn fn;
    _Alignas(16) unsigned char args[TASK_ARGS_MAX];
} Task;

struct Stream {
    Device *dev;
    pthread_t worker;
    pthread_mutex_t mu;
    pthread_cond_t has_work, has_space, drained;
    Task ring[QUEUE_CAPACITY];
    size_t head, count;          /* ring[head] is the next task to run */
    uint64_t launched, finished;
    int stopping;
};

static void *stream_worker(void *arg) {
    Stream *s = arg;
    Task task;
    pthread_mutex_lock(&s->mu);
    for (;;) {
        while (s->count == 0 && !s->stopping) pthread_cond_wait(&s->has_work, &s->mu);
        if (s->count == 0) break;  /* stopping and drained */
        task = s->ring[s->head];
        s->head = (s->head + 1) % QUEUE_CAPACITY;
        s->count--;
        pthread_cond_signal(&s->has_space);
        pthread_mutex_unlock(&s->mu);

        task.fn(task.args);

        pthread_mutex_lock(&s->mu);
        s->finished++;
        if (s->finished == s->launched) pthread_cond_broadcast(&s->drained);
    }
    pthread_mutex_unlock(&s->mu);
    return NULL;
}

Stream *stream_create(Device *dev) {
    Stream *s = calloc(1, sizeof *s);
    if (!s) { fprintf(stderr, "fatal: out of host memory\n"); abort(); }
    s->dev = dev;
    check_pthread(pthread_mutex_init(&s->mu, NULL), "pthread_mutex_init");
    check_pthread(pthread_cond_init(&s->has_work, NULL), "pthread_cond_init");
    check_pthread(pthread_cond_init(&s->has_space, NULL), "pthread_cond_init");
    check_pthread(pthread_cond_init(&s->drained, NULL), "pthread_cond_init");
    check_pthread(pthread_create(&s->worker, NULL, stream_worker, s), "pthread_create");
    return s;
}

void stream_destroy(Stream *s) {
    if (!s) return;
    pthread_mutex_lock(&s->mu);
    s->stopping = 1;
    pthread_cond_signal(&s->has_work);
    pthread_mutex_unlock(&s->mu);
    check_pthread(pthread_join(s->worker, NULL), "pthread_join");
    pthread_cond_destroy(&s->has_work);
    pthread_cond_destroy(&s->has_space);
    pthread_cond_destroy(&s->drained);
    pthread_mutex_destroy(&s->mu);
    free(s);
}

Device *stream_device(Stream *s) { return s->dev; }

void stream_launch(Stream *s, TaskFn fn, const void *args, size_t args_size) {
    if (args_size > TASK_ARGS_MAX) {
        fprintf(stderr, "fatal: task arguments of %zu bytes exceed %d\n", args_size, TASK_ARGS_MAX);
        abort();
    }
    pthread_mutex_lock(&s->mu);
    while (s->count == QUEUE_CAPACITY) pthread_cond_wait(&s->has_space, &s->mu);
    Task *t = &s->ring[(s->head + s->count) % QUEUE_CAPACITY];
    t->fn = fn;
    memcpy(t->args, args, args_size);
    s->count++;
    s->launched++;
    pthread_cond_signal(&s->has_work);
    pthread_mutex_unlock(&s->mu);
}

typedef struct { void *dst; const void *src; size_t bytes; } CopyArgs;

static void copy_task(void *p) {
    CopyArgs *a = p;
    memcpy(a->dst, a->src, a->bytes);
}

void stream_copy(Stream *s, void *dst, const void *src, size_t bytes) {
    CopyArgs a = { dst, src, bytes };
    stream_launch(s, copy_task, &a, sizeof a);
}

void stream_synchronize(Stream *s) {
    pthread_mutex_lock(&s->mu);
    uint64_t target = s->launched;
    while (s->finished < target) pthread_cond_wait(&s->drained, &s->mu);
    pthread_mutex_unlock(&s->mu);
}

/* ---- events ---- */

struct Event {
    pthread_mutex_t mu;
    pthread_cond_t reached;
    uint64_t recorded;   /* records enqueued so far */
    uint64_t completed;  /* highest record its stream has run */
};

Event *event_create(void) {
    Event *ev = calloc(1, sizeof *ev);
    if (!ev) { fprintf(stderr, "fatal: out of host memory\n"); abort(); }
    check_pthread(pthread_mutex_init(&ev->mu, NULL), "pthread_mutex_init");
    check_pthread(pthread_cond_init(&ev->reached, NULL), "pthread_cond_init");
    return ev;
}

void event_destroy(Event *ev) {
    if (!ev) return;
    pthread_cond_destroy(&ev->reached);
    pthread_mutex_destroy(&ev->mu);
    free(ev);
}

typedef struct { Event *ev; uint64_t record; } EventArgs;

static void event_mark_task(void *p) {
    EventArgs *a = p;
    pthread_mutex_lock(&a->ev->mu);
    if (a->record > a->ev->completed) a->ev->completed = a->record;
    pthread_cond_broadcast(&a->ev->reached);
    pthread_mutex_unlock(&a->ev->mu);
}

static void event_wait_until(Event *ev, uint64_t record) {
    pthread_mutex_lock(&ev->mu);
    while (ev->completed < record) pthread_cond_wait(&ev->reached, &ev->mu);
    pthread_mutex_unlock(&ev->mu);
}

static void event_wait_task(void *p) {
    EventArgs *a = p;
    event_wait_until(a->ev, a->record);
}

void event_record(Event *ev, Stream *s) {
    pthread_mutex_lock(&ev->mu);
    EventArgs a = { ev, ++ev->recorded };
    pthread_mutex_unlock(&ev->mu);
    stream_launch(s, event_mark_task, &a, sizeof a);
}

void stream_wait_event(Stream *s, Event *ev) {
    pthread_mutex_lock(&ev->mu);
    EventArgs a = { ev, ev->recorded };
    pthread_mutex_unlock(&ev->mu);
    if (a.record > 0) stream_launch(s, event_wait_task, &a, sizeof a);
}

void event_synchronize(Event *ev) {
    pthread_mutex_lock(&ev->mu);
    uint64_t record = ev->recorded;
    pthread_mutex_unlock(&ev->mu);
    event_wait_until(ev, record);
}
