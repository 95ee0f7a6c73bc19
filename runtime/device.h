/* device.h: devices, memory, streams and events: the one header a backend implements.
 *
 * The model is CUDA's: every op is enqueued on a Stream and returns at once; an
 * Event records a point in a stream; a stream can wait on an event; the host can
 * synchronize on a stream or an event. Two backends implement it: CUDA
 * (device_cuda.cu), and the CPU (device_cpu.c), which keeps these semantics for
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

#include "bf16.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef enum { DEVICE_CPU, DEVICE_CUDA } DeviceKind;

typedef enum {
    MEM_WEIGHTS,      /* parameters (full replicas or shards) */
    MEM_GRADS,        /* parameter gradients */
    MEM_OPTIMIZER,    /* Adam m and v */
    MEM_WORKING,      /* unit-sized working buffers: gradient slots, gather buffers */
    MEM_ACTIVATIONS,  /* forward activations and their gradients */
    MEM_KINDS
} MemKind;

/* A GPU stream's workspace for its products in bf16 (cuBLASLt's; MEM_WORKING,
 * made at its first such product): one size on every stream, so that the
 * algorithm chosen for a product's shape is chosen for the same room. */
enum { DEVICE_PRODUCT_WORKSPACE_BYTES = 32 << 20 };

typedef struct Device Device;
typedef struct Stream Stream;
typedef struct Event Event;

/* A CPU device shared by `sharing` devices (the simulated ranks): each of its
 * streams runs its tasks on cores / sharing threads (at least one), so N ranks'
 * streams together use the cores once rather than N times over. With slot >= 0
 * (this device's index among them, all in one process), its streams keep to
 * their own share of the cores, so that the ranks progress alike; -1 leaves
 * that to the OS. */
Device *device_create_cpu(int sharing, int slot);
/* GPUs this process can use: 0 without any (no GPU, no driver, or a build
 * without CUDA); -1 after a one-line message when CUDA is there but fails (an
 * old driver, a fabric manager that is not running): that is no reason to fall
 * back to the CPU. Asked once; later calls give the same answer, silently. */
int device_cuda_count(void);
/* Why device_cuda_count() is 0, in words: "this build has no CUDA", "no CUDA
 * driver (libcuda.so.1: ...)" with the loader's reason, or "the driver sees
 * no GPU"; "" when there are GPUs. */
const char *device_cuda_absence(void);
/* The files cuBLAS, cuBLASLt and NCCL were loaded from (runtime/gpu_libraries.h),
 * cuBLAS and cuBLASLt loaded now if they were not: for the lines that describe a
 * run on GPUs. */
void device_cuda_libraries(char *buf, size_t len);
/* GPU `ordinal` (0 .. device_cuda_count() - 1); NULL with a message otherwise. */
Device *device_create_cuda(int ordinal);
/* Let GPU matmuls use TF32 tensor cores (--tf32); off by default: exact fp32,
 * close to the CPU. It holds for the streams whose first matmul comes after
 * the call: call it before training. */
void device_cuda_set_tf32(int on);
void device_destroy(Device *dev);
const char *device_name(const Device *dev);
DeviceKind device_kind(const Device *dev);
/* The GPU's index; -1 for the CPU. */
int device_ordinal(const Device *dev);

/* Zero-filled memory of one kind (when there is none, or it would pass the
 * device's cap: a one-line error naming the bytes, the kind, the device, its
 * owner and the hint, and exit status 1); device_free takes the same size back. */
void *device_alloc(Device *dev, MemKind kind, size_t bytes);
void device_free(Device *dev, MemKind kind, void *ptr, size_t bytes);
size_t device_bytes_in_use(const Device *dev, MemKind kind);
/* The high-water mark: the most bytes of every kind together that were in
 * use at once on dev since it was made, on every backend (the accounting is
 * device.c's, not the hardware's). */
size_t device_peak_bytes(const Device *dev);
/* Cap the bytes of every kind together at `bytes` (--max-memory-mb; 0: none),
 * on any backend, so that a device of a given size can be played on the CPU. */
void device_set_limit(Device *dev, size_t bytes);
size_t device_limit(const Device *dev);
/* Who allocates on dev ("DDP, N=3, rank 1") and what to do if it runs out
 * (a stage that fits, fewer rows), for the line of a failed allocation. */
void device_set_owner(Device *dev, const char *owner, const char *hint);
/* What the device's own runtime reports in use on its hardware: every handle
 * and process on it, and the runtime's own (a GPU's context, cuBLAS's
 * workspaces, NCCL's buffers); 0 where nothing reports it (the CPU). */
size_t device_reported_bytes(Device *dev);
/* Host memory the device copies from without the host waiting (pinned on a
 * GPU; plain on the CPU), zeroed; not counted by kind. */
void *device_alloc_host(Device *dev, size_t bytes);
void device_free_host(Device *dev, void *ptr);

Stream *stream_create(Device *dev);
void stream_destroy(Stream *s);
Device *stream_device(Stream *s);
/* Enqueue a copy of bytes from src to dst (either may be host or device memory).
 * src must stay valid and unchanged until the copy has run. */
void stream_copy(Stream *s, void *dst, const void *src, size_t bytes);
/* Enqueue fn(arg), run by the host in s's order: after s's earlier work, before
 * its later work. A CPU stream's worker runs it; a stream whose backend runs no
 * host work (CUDA's) stops the process with a fatal line. */
void stream_host_task(Stream *s, void (*fn)(void *arg), void *arg);
/* out[i] = scale * (in[0][i] + in[1][i] + ... + in[n-1][i]) for i < len, summed
 * in that order, then scaled: the simulator's reduction. out may be one of in;
 * 1 <= n <= STREAM_SUM_MAX. In DTYPE_BF16 every number is a bf16, as a
 * bf16 reduction (NCCL's, FSDP's reduce_dtype) makes it: each input rounded
 * to bf16, each partial sum rounded as it is made, the scaled sum rounded,
 * the result bf16 values in fp32. */
enum { STREAM_SUM_MAX = 64 };
void stream_sum(Stream *s, float *out, float *const *in, int n, size_t len, float scale, DType dtype);
/* The same of numbers held as `held` says, out too: fp32 (stream_sum), or
 * bf16, 2 bytes each (mixed precision's gradients), summed in DTYPE_BF16
 * only: the bits of stream_sum's bf16 sum of the same values. */
void stream_sum_held(Stream *s, void *out, const void *const *in, DType held, int n, size_t len, float scale,
                     DType dtype);
/* The modeled link's time, with no processor busy. The link's clock starts
 * at stream_timer_start as a link would: at the latest of when the host
 * enqueued it, when this stream's last hold ended (the link free again) and
 * when the work this stream waited on since was done; not when the stream gets
 * there (a CPU stream's worker may be late, off its core; a GPU's stream gets
 * there then). stream_hold holds the stream until `seconds` after that start
 * (at once if that is past). Work in between runs meanwhile, so an operation
 * takes the longer of its own time and the modeled one. `started`, if not
 * NULL, is stamped (stream_stamp, below) with the clock's start. */
typedef struct Stamp Stamp;
void stream_timer_start(Stream *s, Stamp *started);
void stream_hold(Stream *s, double seconds);
void stream_synchronize(Stream *s);

/* A stamp: when a stream reached a point of its work, for traces
 * (runtime/trace.h). stream_stamp enqueues the point; once the stream is past
 * it (after a synchronize), stamp_read gives that time in ns on the host's
 * CLOCK_MONOTONIC (a GPU's events are placed on it) and frees what the stamp
 * held. A stamp must not move until it is read. */
struct Stamp {
    int64_t ns;
    void *event;   /* the backend's, until read */
    Device *dev;
};
void stream_stamp(Stream *s, Stamp *at);
int64_t stamp_read(Stamp *at);
/* The ns from stamp `from` to a later stamp `to` of one stream, both freed
 * (on the CPU read as stamp_read reads them). On a GPU it is the two events'
 * own elapsed time (about 0.5 us resolution), not the difference of their
 * places on the host's clock, which loses microseconds late in a long run;
 * it holds any time the stream sat idle between them, waiting for the host. */
int64_t stamp_elapsed(Stamp *from, Stamp *to);

/* An event of dev's kind, recorded and waited on by dev's streams (waits may
 * come from streams of other devices of the same kind). */
Event *event_create(Device *dev);
void event_destroy(Event *ev);
/* Mark the point in s that later waits on ev refer to (the latest record wins). */
void event_record(Event *ev, Stream *s);
/* Work enqueued on s after this call starts only once ev's recorded point is done. */
void stream_wait_event(Stream *s, Event *ev);
void event_synchronize(Event *ev);

/* ---- graphs: a stretch of work recorded once and run again (CUDA graphs) ----
 *
 * Between graph_capture_begin(origin) and graph_capture_end(origin), work
 * enqueued on origin is recorded, not run, and so is the work of every stream
 * that joins the capture by waiting on an event recorded in it. Every stream
 * that joined must join back: its last work recorded, then waited on by origin.
 * graph_launch runs the recorded work again, on origin after origin's earlier
 * work, and origin's later work after all of it; a stream that joined is not
 * ordered with it, unless it waits on an event recorded on origin after the
 * launch. Each op reads its arguments as they were when it was recorded: what
 * changes from run to run is read from memory, which a copy from host memory
 * the device copies from (device_alloc_host), recorded too, may bring.
 *
 * CUDA's rules hold on every backend (the CPU's stops the process with a fatal
 * line where CUDA would fail): one capture at a time, in one process; while
 * capturing, no synchronize on a stream that joined, no allocation, and no
 * wait on an event recorded outside the capture; after it, no wait on or
 * synchronize of an event whose latest record was captured, until it is
 * recorded again. And this project's own: while a graph lives, no stream's
 * scratch grows (the CPU's room, a GPU's bf16 staging), whose old address its
 * recorded ops hold: the first run of each kind of work, before a capture,
 * sizes it. */
typedef struct Graph Graph;
void graph_capture_begin(Stream *origin);
Graph *graph_capture_end(Stream *origin);
void graph_launch(Graph *g, Stream *origin);
void graph_destroy(Graph *g);
/* Whether a capture is under way in this process. */
int graph_capturing(void);

#ifdef __cplusplus
}
#endif

#endif
