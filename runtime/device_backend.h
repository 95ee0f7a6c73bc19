/* device_backend.h: what a backend of device.h implements (for backends only).
 *
 * A backend's device, stream and event structs begin with struct Device,
 * struct Stream and struct Event below, so device.c reaches the backend's ops
 * through any of them. device.c keeps what every backend shares: the byte
 * counts by kind, and the checks.
 */
#ifndef ZF_DEVICE_BACKEND_H
#define ZF_DEVICE_BACKEND_H

#include <pthread.h>

#include "device.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct {
    void (*destroy)(Device *dev);
    void *(*alloc)(Device *dev, size_t bytes);  /* zero-filled; NULL when out of memory */
    void (*free)(Device *dev, void *ptr);
    Stream *(*stream_create)(Device *dev);
    void (*stream_destroy)(Stream *s);
    void (*copy)(Stream *s, void *dst, const void *src, size_t bytes);
    /* stream_sum_held's */
    void (*sum)(Stream *s, void *out, const void *const *in, DType held, int n, size_t len, float scale,
                DType dtype);
    void (*timer_start)(Stream *s, Stamp *started);
    void (*hold)(Stream *s, double seconds);
    void (*synchronize)(Stream *s);
    Event *(*event_create)(Device *dev);
    void (*event_destroy)(Event *ev);
    void (*event_record)(Event *ev, Stream *s);
    void (*wait_event)(Stream *s, Event *ev);
    void (*event_synchronize)(Event *ev);
    void (*stamp)(Stream *s, Stamp *at);
    void (*stamp_read)(Stamp *at);  /* NULL: the stream wrote at->ns itself */
    int64_t (*stamp_elapsed)(Stamp *from, Stamp *to);  /* NULL: the difference of their reads */
    /* optional (NULL: 0, plain host memory, and no host tasks) */
    void (*host_task)(Stream *s, void (*fn)(void *arg), void *arg);
    size_t (*reported_bytes)(Device *dev);
    void *(*alloc_host)(Device *dev, size_t bytes);  /* zero-filled; aborts when there is none */
    void (*free_host)(Device *dev, void *ptr);
    /* graphs (device.h) */
    void (*capture_begin)(Stream *origin);
    Graph *(*capture_end)(Stream *origin);
    void (*graph_launch)(Graph *g, Stream *origin);
    void (*graph_destroy)(Graph *g);
} DeviceOps;

struct Device {
    const DeviceOps *ops;
    DeviceKind kind;
    int ordinal;                 /* the GPU's index; -1 on the CPU */
    char name[64];
    pthread_mutex_t mu;          /* guards bytes and peak */
    size_t bytes[MEM_KINDS];
    size_t peak;                 /* the most bytes of every kind together in use at once */
    size_t limit;                /* every kind together may not pass it; 0: no cap */
    char owner[96];              /* who allocates here, for a failure's line ("" when unsaid) */
    char hint[160];              /* what to do instead, for that line */
};

struct Stream {
    Device *dev;
    struct TraceLane *trace;     /* where its spans go (runtime/trace.c); NULL: untraced */
    struct ProfileLane *profile; /* where its ops' times go (runtime/profile.c); NULL: unprofiled */
};

struct Event {
    Device *dev;
};

struct Graph {
    Device *dev;  /* its origin's */
};

/* A backend's stream scratch (the CPU's room, a GPU's bf16 staging) about to
 * grow on s: a fatal line while a graph lives, whose recorded ops hold the
 * old one's address (device.h). */
void graph_scratch_grows(const Stream *s);

/* Fill the shared part of a backend's new device. */
void device_init(Device *dev, const DeviceOps *ops, DeviceKind kind, int ordinal, const char *name);

#ifdef __cplusplus
}
#endif

#endif
