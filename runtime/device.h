/* device.h: devices, memory, streams and events: the one header a backend implements.
 *
 * The model is CUDA's: every op is enqueued on a Stream and returns at once; an
 * Event records a point in a stream; a stream can wait on an event; the host can
 * synchronize on a stream or an event. The CPU backend keeps these semantics for
 * real: a stream is a worker thread draining a FIFO of tasks, so a missing wait is
 * a real race that the tests and ThreadSanitizer can catch without a GPU.
 *
 * Memory is allocated per device and per kind, and the device counts the bytes
 * of each kind in use, so memory tables come from the allocations themselves.
 */
#ifndef ZF_DEVICE_H
#define ZF_DEVICE_H

#include <stddef.h>
#include <stdint.h>

typedef enum {
    MEM_WEIGHTS,      /* parameters (full replicas or shards) */
    MEM_GRADS,        /* parameter gradients */
    MEM_OPTIMIZER,    /* Adam m and v */
    MEM_WORKING,      /* unit-sized working buffers: gradient slots, gather buffers */
    MEM_ACTIVATIONS,  /* forward activations and their gradients */
    MEM_KINDS
} MemKind;

typedef struct Device Device;
typedef struct Stream Stream;
typedef struct Event Event;

/* A task runs on the stream's worker; its arguments are copied at launch. */
typedef void (*TaskFn)(void *args);
enum { TASK_ARGS_MAX = 640 };  /* room for one pointer per rank, 64 ranks */

/* A CPU device shared by `sharing` devices (the simulated ranks): each of its
 * streams runs its tasks on cores / sharing threads (at least one), so N ranks'
 * streams together use the cores once rather than N times over. */
Device *device_create_cpu(int sharing);
void device_destroy(Device *dev);
const char *device_name(const Device *dev);

/* Zero-filled memory of one kind; device_free takes the same size back. */
void *device_alloc(Device *dev, MemKind kind, size_t bytes);
void device_free(Device *dev, MemKind kind, void *ptr, size_t bytes);
size_t device_bytes_in_use(const Device *dev, MemKind kind);

Stream *stream_create(Device *dev);
void stream_destroy(Stream *s);
Device *stream_device(Stream *s);
/* Enqueue fn(args); args_size bytes of args are copied, at most TASK_ARGS_MAX. */
void stream_launch(Stream *s, TaskFn fn, const void *args, size_t args_size);
/* Enqueue a copy of bytes from src to dst (either may be host or device memory).
 * src must stay valid and unchanged until the copy has run. */
void stream_copy(Stream *s, void *dst, const void *src, size_t bytes);
void stream_synchronize(Stream *s);

Event *event_create(void);
void event_destroy(Event *ev);
/* Mark the point in s that later waits on ev refer to (the latest record wins). */
void event_record(Event *ev, Stream *s);
/* Work enqueued on s after this call starts only once ev's recorded point is done. */
void stream_wait_event(Stream *s, Event *ev);
void event_synchronize(Event *ev);

#endif
