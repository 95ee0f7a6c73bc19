/* device_cuda.cu: the CUDA backend of device.h.
 *
 * A device is one GPU. Several devices may share a GPU (the simulator on one
 * GPU: one device handle per rank, for the memory counts), each stream is a
 * non-blocking CUDA stream with its own cuBLAS and cuBLASLt handles (the
 * latter with a workspace of its own), and events are CUDA
 * events without timing. Every call makes the GPU current first, so any rank's
 * thread can enqueue on any stream. A trace's stamps are timing events, read
 * against a reference event per GPU.
 */
#include <dlfcn.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "device_backend.h"
#include "device_cuda.h"
#include "gpu_libraries.h"
#include "world.h"

/* A failed CUDA or cuBLAS call (out of memory, a lost device) ends the run as
 * one line and exit 1, as every error does, never a core dump: nothing on the
 * GPU can be trusted after it, and the last checkpoint on disk is untouched.
 * The line is flushed and the process leaves without exit()'s teardown
 * (world_abort), which would run the libraries' destructors under the calls
 * other threads have in flight: a hang or a crash in place of the line. */
void cuda_check(cudaError_t rc, const char *what, const char *file, int line) {
    if (rc == cudaSuccess) return;
    fprintf(stderr, "error: %s failed at %s:%d: %s\n", what, file, line, cudaGetErrorString(rc));
    world_abort(1);
}

void cublas_check(cublasStatus_t rc, const char *what, const char *file, int line) {
    if (rc == CUBLAS_STATUS_SUCCESS) return;
    fprintf(stderr, "error: %s failed at %s:%d: cuBLAS status %d\n", what, file, line, (int)rc);
    world_abort(1);
}

void cuda_check_launch(const char *kernel, const char *file, int line) {
    cuda_check(cudaGetLastError(), kernel, file, line);
}

#define CHECK(call) cuda_check((call), #call, __FILE__, __LINE__)

static int tf32_enabled;

void device_cuda_set_tf32(int on) { tf32_enabled = on; }

typedef struct {
    struct Device base;
} CudaDevice;

typedef struct {
    struct Stream base;
    cudaStream_t stream;
    cublasHandle_t blas;          /* NULL until the first matmul */
    cublasLtHandle_t blaslt;      /* NULL until the first product in bf16 */
    void *blaslt_workspace;       /* its DEVICE_PRODUCT_WORKSPACE_BYTES */
    unsigned long long *timer;    /* device memory: stream_timer_start's point, in GPU ns */
    bf16 *staging;                /* cuda_bf16_staging's, NULL until the first product in bf16 */
    size_t staging_numbers;
} CudaStream;

typedef struct {
    struct Event base;
    cudaEvent_t event;
} CudaEvent;

static void use_device(Device *dev) { CHECK(cudaSetDevice(dev->ordinal)); }

/* Each simulated rank has two streams, and a stream held by the modeled link
 * (hold_kernel) stalls whatever shares its hardware queue. CUDA gives 8 queues
 * unless told otherwise, so 16 ranks' streams would share them and one rank's
 * hold would stall another's compute: ask for the most there are (32, enough
 * for 16 ranks), before the first CUDA call, unless the user chose. */
static void set_max_connections(void) {
    if (setenv("CUDA_DEVICE_MAX_CONNECTIONS", "32", 0) != 0) {
        perror("fatal: setenv CUDA_DEVICE_MAX_CONNECTIONS");
        abort();
    }
}

static pthread_once_t count_once = PTHREAD_ONCE_INIT;
static int gpu_count;
static char absence[512];  /* why gpu_count is 0 */

/* Whether a CUDA driver is installed at all: without one, the runtime reports
 * an insufficient driver, which here means no GPU rather than an old driver.
 * Where it is not, absence says what the loader said. */
static int driver_installed(void) {
    void *driver = dlopen("libcuda.so.1", RTLD_LAZY | RTLD_LOCAL);
    if (!driver) {
        const char *why = dlerror();
        snprintf(absence, sizeof absence, "no CUDA driver (%s)", why ? why : "libcuda.so.1 not found");
        return 0;
    }
    dlclose(driver);
    return 1;
}

static void count_gpus(void) {
    set_max_connections();
    cudaError_t rc = cudaGetDeviceCount(&gpu_count);
    if (rc == cudaSuccess && gpu_count == 0) snprintf(absence, sizeof absence, "the driver sees no GPU");
    if (rc == cudaSuccess) return;
    cudaGetLastError();
    if (rc == cudaErrorNoDevice || (rc == cudaErrorInsufficientDriver && !driver_installed())) {
        if (rc == cudaErrorNoDevice) snprintf(absence, sizeof absence, "the driver sees no GPU (%s)",
                                              cudaGetErrorString(rc));
        gpu_count = 0;
        return;
    }
    fprintf(stderr, "error: CUDA cannot count the GPUs: %s (%s, error %d)\n", cudaGetErrorString(rc),
            cudaGetErrorName(rc), (int)rc);
    gpu_count = -1;
}

int device_cuda_count(void) {
    int rc = pthread_once(&count_once, count_gpus);
    if (rc != 0) {
        fprintf(stderr, "fatal: pthread_once failed (%d)\n", rc);
        abort();
    }
    return gpu_count;
}

const char *device_cuda_absence(void) {
    device_cuda_count();
    return absence;
}

void device_cuda_libraries(char *buf, size_t len) {
    gpu_cublas();
    gpu_cublaslt();
    gpu_library_files(buf, len);
}

static void cuda_destroy(Device *dev) { free(dev); }

static void *cuda_alloc(Device *dev, size_t bytes) {
    use_device(dev);
    void *p = NULL;
    if (cudaMalloc(&p, bytes ? bytes : 1) != cudaSuccess) {
        cudaGetLastError();
        return NULL;
    }
    /* cudaMemset may return before it is done, and our streams do not wait for
     * the legacy stream it runs on: wait here (allocations happen at setup). */
    CHECK(cudaMemset(p, 0, bytes));
    CHECK(cudaStreamSynchronize(0));
    return p;
}

static void cuda_free(Device *dev, void *ptr) {
    use_device(dev);
    CHECK(cudaFree(ptr));
}

static Stream *cuda_stream_create(Device *dev) {
    use_device(dev);
    CudaStream *s = (CudaStream *)calloc(1, sizeof *s);
    if (!s) abort();
    s->base.dev = dev;
    CHECK(cudaStreamCreateWithFlags(&s->stream, cudaStreamNonBlocking));
    CHECK(cudaMalloc((void **)&s->timer, sizeof *s->timer));
    /* a hold before any timer_start reads it: from 0, a hold already past */
    CHECK(cudaMemsetAsync(s->timer, 0, sizeof *s->timer, s->stream));
    return &s->base;
}

static void cuda_stream_destroy(Stream *stream) {
    CudaStream *s = (CudaStream *)stream;
    use_device(stream->dev);
    CHECK(cudaStreamSynchronize(s->stream));
    if (s->blas) cublas_check(gpu_cublas()->destroy(s->blas), "cublasDestroy", __FILE__, __LINE__);
    if (s->blaslt) {
        cublas_check(gpu_cublaslt()->destroy(s->blaslt), "cublasLtDestroy", __FILE__, __LINE__);
        device_free(stream->dev, MEM_WORKING, s->blaslt_workspace, DEVICE_PRODUCT_WORKSPACE_BYTES);
    }
    device_free(stream->dev, MEM_WORKING, s->staging, s->staging_numbers * sizeof(bf16));
    CHECK(cudaFree(s->timer));
    CHECK(cudaStreamDestroy(s->stream));
    free(s);
}

cudaStream_t cuda_stream(Stream *s) {
    use_device(s->dev);
    return ((CudaStream *)s)->stream;
}

cublasHandle_t cuda_blas(Stream *stream) {
    CudaStream *s = (CudaStream *)stream;
    use_device(stream->dev);
    if (!s->blas) {
        const Cublas *blas = gpu_cublas();
        cublas_check(blas->create(&s->blas), "cublasCreate", __FILE__, __LINE__);
        cublas_check(blas->set_stream(s->blas, s->stream), "cublasSetStream", __FILE__, __LINE__);
        cublas_check(blas->set_math_mode(s->blas, tf32_enabled ? CUBLAS_TF32_TENSOR_OP_MATH : CUBLAS_DEFAULT_MATH),
                     "cublasSetMathMode", __FILE__, __LINE__);
    }
    return s->blas;
}

cublasLtHandle_t cuda_blaslt(Stream *stream, void **workspace) {
    CudaStream *s = (CudaStream *)stream;
    use_device(stream->dev);
    if (!s->blaslt) {
        cublas_check(gpu_cublaslt()->create(&s->blaslt), "cublasLtCreate", __FILE__, __LINE__);
        s->blaslt_workspace = device_alloc(stream->dev, MEM_WORKING, DEVICE_PRODUCT_WORKSPACE_BYTES);
    }
    *workspace = s->blaslt_workspace;
    return s->blaslt;
}

bf16 *cuda_bf16_staging(Stream *stream, size_t n) {
    CudaStream *s = (CudaStream *)stream;
    if (n <= s->staging_numbers) return s->staging;
    graph_scratch_grows(stream);
    CHECK(cudaStreamSynchronize(s->stream));  /* the old staging's readers are done */
    device_free(stream->dev, MEM_WORKING, s->staging, s->staging_numbers * sizeof(bf16));
    s->staging = (bf16 *)device_alloc(stream->dev, MEM_WORKING, n * sizeof(bf16));
    s->staging_numbers = n;
    return s->staging;
}

static void cuda_copy(Stream *s, void *dst, const void *src, size_t bytes) {
    CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDefault, cuda_stream(s)));
}

typedef struct {
    const void *in[STREAM_SUM_MAX];
} SumInputs;

/* One element per thread, summed in rank order, then scaled: out may be an input. */
__global__ static void sum_kernel(float *out, SumInputs in, int n, size_t len, float scale) {
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= len) return;
    float acc = ((const float *)in.in[0])[i];
    for (int q = 1; q < n; q++) acc = __fadd_rn(acc, ((const float *)in.in[q])[i]);
    out[i] = __fmul_rn(acc, scale);
}

/* The same in bf16: every input, partial sum and result rounded (device.h);
 * in and out held as `held` says. */
__global__ static void sum_bf16_kernel(void *out, SumInputs in, DType held, int n, size_t len, float scale) {
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= len) return;
    float acc = bf16_rounded(number_at(in.in[0], held, i));
    for (int q = 1; q < n; q++) acc = bf16_rounded(__fadd_rn(acc, bf16_rounded(number_at(in.in[q], held, i))));
    number_put(out, held, i, bf16_rounded(__fmul_rn(acc, scale)));
}

static void cuda_sum(Stream *s, void *out, const void *const *in, DType held, int n, size_t len, float scale,
                     DType dtype) {
    SumInputs inputs;
    for (int q = 0; q < n; q++) inputs.in[q] = in[q];
    unsigned blocks = (unsigned)((len + 255) / 256);
    if (dtype == DTYPE_BF16) {
        sum_bf16_kernel<<<blocks, 256, 0, cuda_stream(s)>>>(out, inputs, held, n, len, scale);
        cuda_check_launch("sum_bf16_kernel", __FILE__, __LINE__);
        return;
    }
    sum_kernel<<<blocks, 256, 0, cuda_stream(s)>>>((float *)out, inputs, n, len, scale);
    cuda_check_launch("sum_kernel", __FILE__, __LINE__);
}

__device__ static unsigned long long gpu_time_ns(void) {
    unsigned long long t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
    return t;
}

__global__ static void timer_start_kernel(unsigned long long *timer) { *timer = gpu_time_ns(); }

/* One thread that spins until the GPU's clock passes the timer plus ns, in
 * naps of __nanosleep(500) (each at most twice that: 1 us), so a 20 us hold
 * ends within about a microsecond of its time and the SMs stay free meanwhile.
 * A kernel, not a host function: CUDA may run the host functions of all
 * streams on one thread, one at a time, so N ranks' holds would add up. */
__global__ static void hold_kernel(const unsigned long long *timer, unsigned long long ns) {
    unsigned long long until = *timer + ns;
    while (gpu_time_ns() < until) __nanosleep(500);
}

static void cuda_stamp(Stream *s, Stamp *at);

/* The stream gets here once its inputs are done and its last hold is over:
 * the link's start, as device.h has it, so a stamp here is that start. */
static void cuda_timer_start(Stream *s, Stamp *started) {
    if (started) cuda_stamp(s, started);
    timer_start_kernel<<<1, 1, 0, cuda_stream(s)>>>(((CudaStream *)s)->timer);
    cuda_check_launch("timer_start_kernel", __FILE__, __LINE__);
}

static void cuda_hold(Stream *s, double seconds) {
    hold_kernel<<<1, 1, 0, cuda_stream(s)>>>(((CudaStream *)s)->timer, (unsigned long long)(seconds * 1e9));
    cuda_check_launch("hold_kernel", __FILE__, __LINE__);
}

static void cuda_synchronize(Stream *s) { CHECK(cudaStreamSynchronize(cuda_stream(s))); }

static Event *cuda_event_create(Device *dev) {
    use_device(dev);
    CudaEvent *ev = (CudaEvent *)calloc(1, sizeof *ev);
    if (!ev) abort();
    ev->base.dev = dev;
    CHECK(cudaEventCreateWithFlags(&ev->event, cudaEventDisableTiming));
    return &ev->base;
}

static void cuda_event_destroy(Event *event) {
    use_device(event->dev);
    CHECK(cudaEventDestroy(((CudaEvent *)event)->event));
    free(event);
}

static void cuda_event_record(Event *ev, Stream *s) {
    CHECK(cudaEventRecord(((CudaEvent *)ev)->event, cuda_stream(s)));
}

static void cuda_wait_event(Stream *s, Event *ev) {
    CHECK(cudaStreamWaitEvent(cuda_stream(s), ((CudaEvent *)ev)->event, 0));
}

static void cuda_event_synchronize(Event *ev) {
    use_device(ev->dev);
    CHECK(cudaEventSynchronize(((CudaEvent *)ev)->event));
}

/* ---- stamps (traces): a timing event each, placed on the host's clock ---- */

enum { STAMP_MAX_GPUS = 64 };

/* Per GPU, an event recorded before its first stamp, and the host's clock then. */
typedef struct {
    int set;
    cudaEvent_t event;
    int64_t ns;
} StampReference;

static StampReference stamp_references[STAMP_MAX_GPUS];
static pthread_mutex_t stamp_references_mu = PTHREAD_MUTEX_INITIALIZER;

static int64_t host_ns(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (int64_t)t.tv_sec * 1000000000 + t.tv_nsec;
}

/* Recorded on the legacy stream, which our non-blocking streams leave idle, so
 * it completes at once: the host's clock just after it is the event's time. */
static StampReference *stamp_reference(Device *dev) {
    if (dev->ordinal < 0 || dev->ordinal >= STAMP_MAX_GPUS) {
        fprintf(stderr, "fatal: a trace stamp on GPU %d (0..%d)\n", dev->ordinal, STAMP_MAX_GPUS - 1);
        abort();
    }
    StampReference *ref = &stamp_references[dev->ordinal];
    if (pthread_mutex_lock(&stamp_references_mu) != 0) {
        fprintf(stderr, "fatal: pthread_mutex_lock failed for the trace stamps\n");
        abort();
    }
    if (!ref->set) {
        use_device(dev);
        CHECK(cudaEventCreate(&ref->event));
        CHECK(cudaEventRecord(ref->event, cudaStreamLegacy));
        CHECK(cudaEventSynchronize(ref->event));
        ref->ns = host_ns();
        ref->set = 1;
    }
    pthread_mutex_unlock(&stamp_references_mu);
    return ref;
}

static void cuda_stamp(Stream *s, Stamp *at) {
    stamp_reference(s->dev);
    cudaEvent_t ev;
    use_device(s->dev);
    CHECK(cudaEventCreate(&ev));
    CHECK(cudaEventRecord(ev, cuda_stream(s)));
    at->event = ev;
}

static void cuda_stamp_read(Stamp *at) {
    StampReference *ref = stamp_reference(at->dev);
    cudaEvent_t ev = (cudaEvent_t)at->event;
    float ms;
    use_device(at->dev);
    CHECK(cudaEventElapsedTime(&ms, ref->event, ev));
    CHECK(cudaEventDestroy(ev));
    at->event = NULL;
    at->ns = ref->ns + (int64_t)((double)ms * 1e6);
}

/* The two events' own elapsed time, then both freed (their places on the
 * host's clock are not wanted: two fewer readings and no reference taken). */
static int64_t cuda_stamp_elapsed(Stamp *from, Stamp *to) {
    float ms;
    use_device(from->dev);
    CHECK(cudaEventElapsedTime(&ms, (cudaEvent_t)from->event, (cudaEvent_t)to->event));
    CHECK(cudaEventDestroy((cudaEvent_t)from->event));
    CHECK(cudaEventDestroy((cudaEvent_t)to->event));
    from->event = to->event = NULL;
    return (int64_t)((double)ms * 1e6);
}

/* Everything on the GPU in use, as CUDA sees it: this process's context,
 * allocations and libraries' buffers, and other processes'. */
static size_t cuda_reported_bytes(Device *dev) {
    use_device(dev);
    size_t free_bytes = 0, total_bytes = 0;
    CHECK(cudaMemGetInfo(&free_bytes, &total_bytes));
    return total_bytes - free_bytes;
}

/* Pinned, so that a copy from it is a DMA the host does not wait for. */
static void *cuda_alloc_host(Device *dev, size_t bytes) {
    use_device(dev);
    void *p = NULL;
    CHECK(cudaHostAlloc(&p, bytes ? bytes : 1, cudaHostAllocPortable));
    memset(p, 0, bytes);
    return p;
}

static void cuda_free_host(Device *dev, void *ptr) {
    use_device(dev);
    CHECK(cudaFreeHost(ptr));
}

/* ---- graphs: CUDA's stream capture, relaxed, since other threads (the
 * ranks') enqueue into the capture and some of them look up, unenqueued,
 * what the capture's mode would refuse (cuBLASLt's algorithm, once a shape) ---- */

typedef struct {
    struct Graph base;
    cudaGraphExec_t exec;
} CudaGraph;

static void cuda_capture_begin(Stream *origin) {
    use_device(origin->dev);
    CHECK(cudaStreamBeginCapture(cuda_stream(origin), cudaStreamCaptureModeRelaxed));
}

static Graph *cuda_capture_end(Stream *origin) {
    use_device(origin->dev);
    cudaGraph_t graph;
    CHECK(cudaStreamEndCapture(cuda_stream(origin), &graph));
    CudaGraph *g = (CudaGraph *)calloc(1, sizeof *g);
    if (!g) abort();
    g->base.dev = origin->dev;
    CHECK(cudaGraphInstantiate(&g->exec, graph, 0));
    CHECK(cudaGraphDestroy(graph));
    return &g->base;
}

static void cuda_graph_launch(Graph *g, Stream *origin) {
    use_device(origin->dev);
    CHECK(cudaGraphLaunch(((CudaGraph *)g)->exec, cuda_stream(origin)));
}

static void cuda_graph_destroy(Graph *g) {
    use_device(g->dev);
    CHECK(cudaGraphExecDestroy(((CudaGraph *)g)->exec));
    free(g);
}

static const DeviceOps cuda_ops = {
    .destroy = cuda_destroy, .alloc = cuda_alloc, .free = cuda_free, .stream_create = cuda_stream_create,
    .stream_destroy = cuda_stream_destroy, .copy = cuda_copy, .sum = cuda_sum, .timer_start = cuda_timer_start,
    .hold = cuda_hold, .synchronize = cuda_synchronize, .event_create = cuda_event_create,
    .event_destroy = cuda_event_destroy, .event_record = cuda_event_record, .wait_event = cuda_wait_event,
    .event_synchronize = cuda_event_synchronize, .stamp = cuda_stamp, .stamp_read = cuda_stamp_read,
    .stamp_elapsed = cuda_stamp_elapsed, .host_task = NULL,
    .reported_bytes = cuda_reported_bytes, .alloc_host = cuda_alloc_host, .free_host = cuda_free_host,
    .capture_begin = cuda_capture_begin, .capture_end = cuda_capture_end, .graph_launch = cuda_graph_launch,
    .graph_destroy = cuda_graph_destroy,
};

Device *device_create_cuda(int ordinal) {
    int n = device_cuda_count();
    if (n < 0) return NULL;  /* the reason is printed */
    if (ordinal < 0 || ordinal >= n) {
        fprintf(stderr, "error: GPU %d asked for, %d visible\n", ordinal, n);
        return NULL;
    }
    cudaDeviceProp prop;
    CHECK(cudaGetDeviceProperties(&prop, ordinal));
    char name[sizeof ((Device *)0)->name];
    snprintf(name, sizeof name, "cuda:%d (%.40s)", ordinal, prop.name);
    CudaDevice *dev = (CudaDevice *)calloc(1, sizeof *dev);
    if (!dev) abort();
    device_init(&dev->base, &cuda_ops, DEVICE_CUDA, ordinal, name);
    return &dev->base;
}
