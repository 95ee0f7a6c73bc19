/* device_cpu.c: the CPU backend of device.h.
 *
 * A stream is a worker thread draining a ring of tasks in FIFO order, on an
 * OpenMP team it sizes by the load on the machine (TeamSize below). Each
 * record of an event is a marker: a flag its stream sets when it gets there,
 * with the time it did. The event points at its latest marker; a wait takes
 * that marker at enqueue time and blocks the waiting stream's worker until the
 * flag is set, so a later record, even on another stream, never releases an
 * earlier wait. Markers are reference-counted, so an event may be destroyed
 * while its records are pending. The times the waits saw start the modeled
 * link's clock (stream_timer_start).
 *
 * A graph is the capture's list of actions (a task, a record, a wait), each
 * on a lane: the origin's, or a stream that joined. A launch enqueues them
 * again in their order, the origin's on the origin, each other lane's on a
 * stream of the graph's own (so, as on a GPU, the streams that joined are not
 * ordered with it), each record a new marker that its waits take.
 */
#include "device_cpu.h"

#include <fcntl.h>
#include <omp.h>
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "device_backend.h"
#include "host.h"

/* pthread calls fail only on programming errors or exhausted resources (a
 * thread limit at many ranks): one line and status 1, as memory running out. */
static void check_pthread(int rc, const char *what) {
    if (rc != 0) {
        fprintf(stderr, "error: %s failed: %s; stopping\n", what, strerror(rc));
        exit(1);
    }
}

typedef struct {
    struct Device base;
    int threads;           /* per stream task; 0: OpenMP's default */
    int pinned;            /* 1: its streams' workers keep to `cores` */
    cpu_set_t cores;
} CpuDevice;

static void cpu_destroy(Device *dev) { free(dev); }

static void *cpu_alloc(Device *dev, size_t bytes) {
    (void)dev;
    /* 64-byte alignment keeps BLAS and vector loads on cache lines. */
    size_t rounded = (bytes + 63) / 64 * 64;
    void *p = aligned_alloc(64, rounded ? rounded : 64);
    if (p) memset(p, 0, rounded);
    return p;
}

static void cpu_free(Device *dev, void *ptr) {
    (void)dev;
    free(ptr);
}

/* ---- streams ---- */

enum { QUEUE_CAPACITY = 1024 };

typedef struct {
    TaskFn fn;
    _Alignas(16) unsigned char args[TASK_ARGS_MAX];
} Task;

typedef struct {
    struct Stream base;
    int threads;                 /* the device's, for the worker */
    const cpu_set_t *cores;      /* the device's share of the cores, or NULL */
    pthread_t worker;
    pthread_mutex_t mu;
    pthread_cond_t has_work, has_space, drained;
    Task ring[QUEUE_CAPACITY];
    size_t head, count;          /* ring[head] is the next task to run */
    uint64_t launched, finished;
    uint64_t wake_at;            /* the nearest task count a synchronize waits for */
    int stopping;
    /* The modeled link, the worker's own (stream_timer_start, stream_hold):
     * when its clock started, when its last hold ended (the link free again),
     * and the latest time a marker this stream waited on was reached, since
     * the clock last started (its inputs ready); in ns of CLOCK_MONOTONIC. */
    int64_t link_start_ns, link_free_ns, inputs_ready_ns;
    float *room;                 /* cpu_stream_room's, NULL until an op first widens bf16 */
    size_t room_floats;
    int lane;                    /* while it is in the capture, its lane there (0: the origin); else -1 */
} CpuStream;

/* ---- the capture under way, if any (graphs, below) ---- */

typedef enum { ACTION_TASK, ACTION_RECORD, ACTION_WAIT } ActionKind;

typedef struct {
    ActionKind kind;
    int lane;
    int record;          /* ACTION_WAIT: the action index of the record it waits for */
    int waits;           /* ACTION_RECORD: the waits that take its marker */
    int origin_waits;    /* ACTION_RECORD: 1 once the origin waits on it */
    Task task;           /* ACTION_TASK */
} Action;

typedef struct {
    struct Graph base;
    Action *actions;
    int count, room;
    int lanes;
    Stream **replay;     /* [lanes]: lane 0 runs on the launch's origin; the rest on streams of the graph's own */
    CpuStream **joined;  /* [lanes], while capturing: the streams that joined */
    int *last;           /* [lanes], while capturing: each lane's last action, -1 none */
} CpuGraph;

/* The capture under way (graph_capture_begin .. graph_capture_end), and its
 * number: each event notes the capture its latest record was made in (0: none). */
static pthread_mutex_t capture_mu = PTHREAD_MUTEX_INITIALIZER;
static CpuGraph *capturing;
static _Atomic uint64_t capture_serial;

/* Whether this process has begun a capture. Until it has, no stream is in one
 * and no event's record was made in one, so a task's launch, a record, a wait
 * and a synchronize skip capture_mu, which each would otherwise take. */
static int captures_begun(void) { return atomic_load_explicit(&capture_serial, memory_order_acquire) != 0; }

static void capture_fatal(const char *what) {
    fprintf(stderr, "fatal: %s (CUDA would refuse it in a graph's capture)\n", what);
    abort();
}

/* Append an action on s's lane; the caller holds capture_mu. */
static Action *capture_append(CpuGraph *g, ActionKind kind, const CpuStream *s) {
    if (g->count == g->room) {
        g->room = g->room ? 2 * g->room : 256;
        g->actions = realloc(g->actions, (size_t)g->room * sizeof *g->actions);
        if (!g->actions) capture_fatal("no memory for a graph's actions");
    }
    Action *a = &g->actions[g->count];
    memset(a, 0, sizeof *a);
    a->kind = kind;
    a->lane = s->lane;
    g->last[s->lane] = g->count++;
    return a;
}

static int64_t now_ns(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (int64_t)t.tv_sec * 1000000000 + t.tv_nsec;
}

static int64_t latest(int64_t a, int64_t b) { return a > b ? a : b; }

/* The OpenMP team a worker's tasks run on. Under load a parallel region waits
 * at its end for a thread the OS took off its core, often for a time slice
 * (milliseconds) where the kernels take microseconds. Beside one busy loop on
 * two cores, one thread is the better team: char-small's step took 59 ms on one
 * and 77 on two, a tiny model's 6 and 17 (quiet: 30 and 3.6 ms on two). Beside
 * two loops, both threads get a share of every core, and two are the better
 * team for char-small's long regions (85 and 86 ms against 94 and 88 on one).
 *
 * The sign of load is the worker's own wait for a core: the share of the time
 * it wanted one that it spent runnable without one (/proc/thread-self/schedstat),
 * over windows of TEAM_WINDOW_NS holding at least TEAM_WANTED_NS of it. A
 * team that waits TEAM_LOADED of its time or more shrinks to one thread; if one
 * waits as much, the load takes every core and the team is full again, crowded;
 * below TEAM_FREE the cores are free and the team is full. A change undone in
 * its first window doubles the windows the team stays before it tries that
 * change again (to TEAM_HOLD_MAX, about 1.3 s); a longer stay resets them.
 *
 * libgomp's own OMP_DYNAMIC follows the 1-minute load average, too slow for
 * this: a user who sets OMP_DYNAMIC gets OpenMP's way instead of this one. */
enum { TEAM_WINDOW_NS = 20000000, TEAM_WANTED_NS = 5000000, TEAM_HOLD_MAX = 64 };
static const double TEAM_LOADED = 0.15, TEAM_FREE = 0.05;

static int doubled(int hold) { return hold * 2 < TEAM_HOLD_MAX ? hold * 2 : TEAM_HOLD_MAX; }

static void team_move(TeamSize *team, TeamState to) {
    team->state = to;
    team->windows = 0;
}

void team_size_next(TeamSize *team, double waited_share) {
    int first = ++team->windows == 1;
    switch (team->state) {
    case TEAM_FULL:
        if (waited_share < TEAM_LOADED) return;
        team->hold_one = first ? doubled(team->hold_one) : 1;
        team_move(team, TEAM_ONE);
        return;
    case TEAM_ONE:
        if (waited_share >= TEAM_LOADED) {
            team->hold_crowded = first ? doubled(team->hold_crowded) : 1;
            team_move(team, TEAM_CROWDED);
        } else if (waited_share < TEAM_FREE && team->windows >= team->hold_one) {
            team_move(team, TEAM_FULL);
        }
        return;
    case TEAM_CROWDED:
        if (waited_share < TEAM_FREE)
            team_move(team, TEAM_FULL);
        else if (team->windows >= team->hold_crowded)
            team_move(team, TEAM_ONE);
        return;
    }
}

int team_threads(const TeamSize *team) { return team->state == TEAM_ONE ? 1 : team->full; }

typedef struct {
    TeamSize size;
    int schedstat;       /* the worker's /proc/thread-self/schedstat, or -1: the team stays full */
    int64_t window_ns, ran_ns, waited_ns;  /* when the window started, and the worker's times then */
} Team;

/* The worker's time on a core and time runnable without one, in ns; 0 when unreadable. */
static int read_schedstat(int fd, int64_t *ran_ns, int64_t *waited_ns) {
    char buf[96];
    ssize_t n = pread(fd, buf, sizeof buf - 1, 0);
    if (n <= 0) return 0;
    buf[n] = '\0';
    long long ran, waited;
    if (sscanf(buf, "%lld %lld", &ran, &waited) != 2) return 0;
    *ran_ns = ran;
    *waited_ns = waited;
    return 1;
}

/* `threads` as the device has it: 0 for OpenMP's default. */
static void team_start(Team *team, int threads) {
    int full = threads > 0 ? threads : omp_get_max_threads();
    team->size = (TeamSize){ .full = full, .state = TEAM_FULL, .hold_one = 1, .hold_crowded = 1 };
    omp_set_num_threads(full);
    team->schedstat = -1;
    if (full < 2 || getenv("OMP_DYNAMIC")) return;
    team->schedstat = open("/proc/thread-self/schedstat", O_RDONLY | O_CLOEXEC);
    team->window_ns = now_ns();
    if (team->schedstat >= 0 && !read_schedstat(team->schedstat, &team->ran_ns, &team->waited_ns)) {
        close(team->schedstat);
        team->schedstat = -1;
    }
}

/* Before each task: at a window's end, the team's size for the next. */
static void team_adapt(Team *team) {
    if (team->schedstat < 0) return;
    int64_t t = now_ns(), ran_ns, waited_ns;
    if (t - team->window_ns < TEAM_WINDOW_NS || !read_schedstat(team->schedstat, &ran_ns, &waited_ns)) return;
    int64_t waited = waited_ns - team->waited_ns, wanted = ran_ns - team->ran_ns + waited;
    if (wanted < TEAM_WANTED_NS) return;
    int was = team_threads(&team->size);
    team_size_next(&team->size, (double)waited / (double)wanted);
    if (team_threads(&team->size) != was) omp_set_num_threads(team_threads(&team->size));
    team->window_ns = t;
    team->ran_ns = ran_ns;
    team->waited_ns = waited_ns;
}

static void *stream_worker(void *arg) {
    CpuStream *s = arg;
    Task task;
    Team team = { 0 };
    /* Not fatal if refused: the ranks then share the cores as the OS has them.
     * Set before the first task, so OpenMP's threads inherit it. */
    if (s->cores) (void)pthread_setaffinity_np(pthread_self(), sizeof *s->cores, s->cores);
    team_start(&team, s->threads);
    pthread_mutex_lock(&s->mu);
    for (;;) {
        while (s->count == 0 && !s->stopping) pthread_cond_wait(&s->has_work, &s->mu);
        if (s->count == 0) break;  /* stopping and drained */
        task = s->ring[s->head];
        s->head = (s->head + 1) % QUEUE_CAPACITY;
        s->count--;
        pthread_cond_signal(&s->has_space);
        pthread_mutex_unlock(&s->mu);

        team_adapt(&team);
        task.fn(task.args);

        pthread_mutex_lock(&s->mu);
        s->finished++;
        /* Wake the synchronizers only when the nearest of their targets is reached:
         * waking the host at every task would steal a core from the kernels. */
        if (s->finished == s->wake_at) pthread_cond_broadcast(&s->drained);
    }
    pthread_mutex_unlock(&s->mu);
    if (team.schedstat >= 0) close(team.schedstat);
    return NULL;
}

static Stream *cpu_stream_create(Device *dev) {
    CpuStream *s = host_calloc(1, sizeof *s);
    s->base.dev = dev;
    s->threads = ((CpuDevice *)dev)->threads;
    s->cores = ((CpuDevice *)dev)->pinned ? &((CpuDevice *)dev)->cores : NULL;
    s->lane = -1;
    check_pthread(pthread_mutex_init(&s->mu, NULL), "pthread_mutex_init");
    check_pthread(pthread_cond_init(&s->has_work, NULL), "pthread_cond_init");
    check_pthread(pthread_cond_init(&s->has_space, NULL), "pthread_cond_init");
    check_pthread(pthread_cond_init(&s->drained, NULL), "pthread_cond_init");
    check_pthread(host_thread_create(&s->worker, stream_worker, s), "pthread_create");
    return &s->base;
}

static void cpu_stream_destroy(Stream *stream) {
    CpuStream *s = (CpuStream *)stream;
    pthread_mutex_lock(&s->mu);
    s->stopping = 1;
    pthread_cond_signal(&s->has_work);
    pthread_mutex_unlock(&s->mu);
    check_pthread(pthread_join(s->worker, NULL), "pthread_join");
    device_free(stream->dev, MEM_WORKING, s->room, s->room_floats * sizeof(float));
    pthread_cond_destroy(&s->has_work);
    pthread_cond_destroy(&s->has_space);
    pthread_cond_destroy(&s->drained);
    pthread_mutex_destroy(&s->mu);
    free(s);
}

float *cpu_stream_room(Stream *stream, size_t floats) {
    CpuStream *s = (CpuStream *)stream;
    if (floats <= s->room_floats) return s->room;
    graph_scratch_grows(stream);
    stream_synchronize(stream);  /* the old room's readers are done */
    device_free(stream->dev, MEM_WORKING, s->room, s->room_floats * sizeof(float));
    s->room = device_alloc(stream->dev, MEM_WORKING, floats * sizeof(float));
    s->room_floats = floats;
    return s->room;
}

/* A task on a stream in the capture under way: recorded, not run (1); else 0. */
static int captured_task(CpuStream *s, TaskFn fn, const void *args, size_t args_size) {
    pthread_mutex_lock(&capture_mu);
    int in_capture = s->lane >= 0;
    if (in_capture) {
        Action *a = capture_append(capturing, ACTION_TASK, s);
        a->task.fn = fn;
        memcpy(a->task.args, args, args_size);
    }
    pthread_mutex_unlock(&capture_mu);
    return in_capture;
}

void stream_launch(Stream *stream, TaskFn fn, const void *args, size_t args_size) {
    CpuStream *s = (CpuStream *)stream;
    if (stream->dev->kind != DEVICE_CPU) {
        fprintf(stderr, "fatal: a CPU task launched on %s\n", stream->dev->name);
        abort();
    }
    if (args_size > TASK_ARGS_MAX) {
        fprintf(stderr, "fatal: task arguments of %zu bytes exceed %d\n", args_size, TASK_ARGS_MAX);
        abort();
    }
    if (captures_begun() && captured_task(s, fn, args, args_size)) return;
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

static void cpu_copy(Stream *s, void *dst, const void *src, size_t bytes) {
    CopyArgs a = { dst, src, bytes };
    stream_launch(s, copy_task, &a, sizeof a);
}

typedef struct { void (*fn)(void *arg); void *arg; } HostTaskArgs;

static void run_host_task(void *p) {
    HostTaskArgs *a = p;
    a->fn(a->arg);
}

static void cpu_host_task(Stream *s, void (*fn)(void *arg), void *arg) {
    HostTaskArgs a = { fn, arg };
    stream_launch(s, run_host_task, &a, sizeof a);
}

enum { SUM_CHUNK = 1024 };

typedef struct {
    void *out;
    const void *in[STREAM_SUM_MAX];
    DType held;  /* of in and out: fp32, or bf16 (stream_sum_held) */
    int n;
    size_t len;
    float scale;
    DType dtype;
} SumArgs;

/* A chunk of the sum in fp32 (of fp32 numbers): acc = in[0] + in[1] + ...,
 * then out = acc * scale. */
static void sum_chunk_fp32(const SumArgs *a, size_t c0, size_t m, float *acc) {
    memcpy(acc, (const float *)a->in[0] + c0, m * sizeof(float));
    for (int q = 1; q < a->n; q++) {
        const float *src = (const float *)a->in[q] + c0;
        for (size_t i = 0; i < m; i++) acc[i] += src[i];
    }
    float *out = a->out;
    for (size_t i = 0; i < m; i++) out[c0 + i] = acc[i] * a->scale;
}

/* The same in bf16: every input, partial sum and result rounded (the inputs
 * of numbers held in bf16 are bf16 already). */
static void sum_chunk_bf16(const SumArgs *a, size_t c0, size_t m, float *acc) {
    for (size_t i = 0; i < m; i++) acc[i] = bf16_rounded(number_at(a->in[0], a->held, c0 + i));
    for (int q = 1; q < a->n; q++)
        for (size_t i = 0; i < m; i++) {
            float x = bf16_rounded(number_at(a->in[q], a->held, c0 + i));
            acc[i] = bf16_rounded(acc[i] + x);
        }
    for (size_t i = 0; i < m; i++) number_put(a->out, a->held, c0 + i, bf16_rounded(acc[i] * a->scale));
}

/* Through a stack buffer, a chunk at a time, so out may be one of in. */
static void sum_task(void *p) {
    SumArgs *a = p;
    float acc[SUM_CHUNK];
    for (size_t c0 = 0; c0 < a->len; c0 += SUM_CHUNK) {
        size_t m = a->len - c0 < SUM_CHUNK ? a->len - c0 : SUM_CHUNK;
        if (a->dtype == DTYPE_BF16)
            sum_chunk_bf16(a, c0, m, acc);
        else
            sum_chunk_fp32(a, c0, m, acc);
    }
}

static void cpu_sum(Stream *s, void *out, const void *const *in, DType held, int n, size_t len, float scale,
                    DType dtype) {
    SumArgs a = { .out = out, .held = held, .n = n, .len = len, .scale = scale, .dtype = dtype };
    memcpy(a.in, in, sizeof(void *) * n);
    stream_launch(s, sum_task, &a, sizeof a);
}

/* Waits for the tasks launched before the call, not for later ones. Each waiter
 * keeps wake_at at the nearest target still pending. */
static void cpu_synchronize(Stream *stream) {
    CpuStream *s = (CpuStream *)stream;
    if (captures_begun()) {
        pthread_mutex_lock(&capture_mu);
        int captured = s->lane >= 0;
        pthread_mutex_unlock(&capture_mu);
        if (captured) capture_fatal("a synchronize of a stream in a capture");
    }
    pthread_mutex_lock(&s->mu);
    uint64_t target = s->launched;
    while (s->finished < target) {
        if (s->wake_at <= s->finished || target < s->wake_at) s->wake_at = target;
        pthread_cond_wait(&s->drained, &s->mu);
    }
    pthread_mutex_unlock(&s->mu);
}

/* ---- events ---- */

typedef struct {
    pthread_mutex_t mu;
    pthread_cond_t reached;
    int done;
    int64_t reached_ns;  /* when its stream got there, once done */
    int refs;  /* the event while it is the latest record, and each pending task */
} Marker;

static Marker *marker_create(int refs) {
    Marker *m = host_calloc(1, sizeof *m);
    check_pthread(pthread_mutex_init(&m->mu, NULL), "pthread_mutex_init");
    check_pthread(pthread_cond_init(&m->reached, NULL), "pthread_cond_init");
    m->refs = refs;
    return m;
}

static void marker_retain(Marker *m) {
    pthread_mutex_lock(&m->mu);
    m->refs++;
    pthread_mutex_unlock(&m->mu);
}

static void marker_release(Marker *m) {
    if (!m) return;
    pthread_mutex_lock(&m->mu);
    int last = --m->refs == 0;
    pthread_mutex_unlock(&m->mu);
    if (!last) return;
    pthread_cond_destroy(&m->reached);
    pthread_mutex_destroy(&m->mu);
    free(m);
}

/* Blocks until the marker is reached; returns when its stream got there. */
static int64_t marker_wait(Marker *m) {
    pthread_mutex_lock(&m->mu);
    while (!m->done) pthread_cond_wait(&m->reached, &m->mu);
    int64_t reached = m->reached_ns;
    pthread_mutex_unlock(&m->mu);
    return reached;
}

typedef struct {
    struct Event base;
    pthread_mutex_t mu;
    Marker *latest;  /* NULL until the first record */
    /* The capture its latest record was made in (0: none, latest is it), and
     * there that record's action: guarded by capture_mu. */
    uint64_t captured_in;
    int record;
} CpuEvent;

static Event *cpu_event_create(Device *dev) {
    CpuEvent *ev = host_calloc(1, sizeof *ev);
    ev->base.dev = dev;
    check_pthread(pthread_mutex_init(&ev->mu, NULL), "pthread_mutex_init");
    return &ev->base;
}

static void cpu_event_destroy(Event *event) {
    CpuEvent *ev = (CpuEvent *)event;
    marker_release(ev->latest);
    pthread_mutex_destroy(&ev->mu);
    free(ev);
}

/* The latest marker, retained for the caller; NULL if never recorded. */
static Marker *latest_marker(CpuEvent *ev) {
    pthread_mutex_lock(&ev->mu);
    Marker *m = ev->latest;
    if (m) marker_retain(m);
    pthread_mutex_unlock(&ev->mu);
    return m;
}

/* A marker, and for a wait the stream that waits (its inputs ready then). */
typedef struct { Marker *marker; CpuStream *waiter; } MarkerArgs;

static void mark_task(void *p) {
    Marker *m = ((MarkerArgs *)p)->marker;
    int64_t reached = now_ns();
    pthread_mutex_lock(&m->mu);
    m->done = 1;
    m->reached_ns = reached;
    pthread_cond_broadcast(&m->reached);
    pthread_mutex_unlock(&m->mu);
    marker_release(m);
}

static void wait_task(void *p) {
    MarkerArgs *a = p;
    a->waiter->inputs_ready_ns = latest(a->waiter->inputs_ready_ns, marker_wait(a->marker));
    marker_release(a->marker);
}

/* A record on a stream in the capture under way, recorded there (1); else
 * the event's latest record is no longer a captured one (0). */
static int captured_record(CpuEvent *ev, CpuStream *s) {
    pthread_mutex_lock(&capture_mu);
    int in_capture = s->lane >= 0;
    if (in_capture) {
        ev->record = capturing->count;
        ev->captured_in = capture_serial;
        capture_append(capturing, ACTION_RECORD, s);
    } else {
        ev->captured_in = 0;
    }
    pthread_mutex_unlock(&capture_mu);
    return in_capture;
}

/* The mark task is queued before the marker is published, so no wait can be
 * queued on that stream ahead of the mark it waits for. */
static void cpu_event_record(Event *event, Stream *s) {
    CpuEvent *ev = (CpuEvent *)event;
    if (captures_begun() && captured_record(ev, (CpuStream *)s)) return;
    MarkerArgs a = { marker_create(2), NULL };  /* the event's reference and the mark task's */
    stream_launch(s, mark_task, &a, sizeof a);
    pthread_mutex_lock(&ev->mu);
    Marker *previous = ev->latest;
    ev->latest = a.marker;
    pthread_mutex_unlock(&ev->mu);
    marker_release(previous);
}

/* A wait on a record made in the capture under way joins the capture (the
 * waiting stream's later work is recorded too); a wait in a capture on any
 * other record, or after one on a captured record, is CUDA's error. 1 where
 * the wait was recorded in the capture, 0 where it is to run. */
static int captured_wait(CpuStream *s, CpuEvent *ev) {
    pthread_mutex_lock(&capture_mu);
    int in_this_capture = capturing && ev->captured_in == capture_serial;
    if (s->lane >= 0 && !in_this_capture) capture_fatal("a wait in a capture on an event recorded outside it");
    if (s->lane < 0 && ev->captured_in && !in_this_capture)
        capture_fatal("a wait on an event whose latest record was captured");
    if (in_this_capture) {
        if (s->lane < 0) {  /* it joins */
            s->lane = capturing->lanes++;
            capturing->joined = realloc(capturing->joined, (size_t)capturing->lanes * sizeof *capturing->joined);
            capturing->last = realloc(capturing->last, (size_t)capturing->lanes * sizeof *capturing->last);
            if (!capturing->joined || !capturing->last) capture_fatal("no memory for a graph's lanes");
            capturing->joined[s->lane] = s;
            capturing->last[s->lane] = -1;
        }
        Action *record = &capturing->actions[ev->record];
        record->waits++;
        if (s->lane == 0) record->origin_waits = 1;
        capture_append(capturing, ACTION_WAIT, s)->record = ev->record;
        pthread_mutex_unlock(&capture_mu);
        return 1;
    }
    pthread_mutex_unlock(&capture_mu);
    return 0;
}

static void cpu_wait_event(Stream *stream, Event *event) {
    CpuStream *s = (CpuStream *)stream;
    CpuEvent *ev = (CpuEvent *)event;
    if (captures_begun() && captured_wait(s, ev)) return;
    MarkerArgs a = { latest_marker(ev), s };
    if (a.marker) stream_launch(stream, wait_task, &a, sizeof a);
}

static void cpu_event_synchronize(Event *ev) {
    if (captures_begun()) {
        pthread_mutex_lock(&capture_mu);
        int captured = ((CpuEvent *)ev)->captured_in != 0;
        pthread_mutex_unlock(&capture_mu);
        if (captured) capture_fatal("a synchronize of an event whose latest record was captured");
    }
    Marker *m = latest_marker((CpuEvent *)ev);
    if (!m) return;
    marker_wait(m);
    marker_release(m);
}

/* ---- the modeled link's clock ---- */

/* The link starts a collective when it can: once the host has enqueued it,
 * the link is free and the inputs are ready, not when the worker gets there
 * (on shared cores it may be late, taken off its core); the work in between
 * runs under the hold, which ends `seconds` after that start. */
typedef struct { CpuStream *s; double seconds; int64_t enqueued_ns; Stamp *started; } TimerArgs;

static void timer_start_task(void *p) {
    TimerArgs *a = p;
    CpuStream *s = a->s;
    s->link_start_ns = latest(a->enqueued_ns, latest(s->link_free_ns, s->inputs_ready_ns));
    s->inputs_ready_ns = 0;
    if (a->started) a->started->ns = s->link_start_ns;
}

/* Sleep to an absolute time: resumed sleeps after a signal do not drift. */
static void hold_task(void *p) {
    TimerArgs *a = p;
    CpuStream *s = a->s;
    s->link_free_ns = s->link_start_ns + (int64_t)(a->seconds * 1e9);
    struct timespec until = { (time_t)(s->link_free_ns / 1000000000), (long)(s->link_free_ns % 1000000000) };
    while (clock_nanosleep(CLOCK_MONOTONIC, TIMER_ABSTIME, &until, NULL) != 0) continue;
}

static void cpu_timer_start(Stream *s, Stamp *started) {
    TimerArgs a = { (CpuStream *)s, 0.0, now_ns(), started };
    stream_launch(s, timer_start_task, &a, sizeof a);
}

static void cpu_hold(Stream *s, double seconds) {
    TimerArgs a = { (CpuStream *)s, seconds, 0, NULL };
    stream_launch(s, hold_task, &a, sizeof a);
}

/* ---- stamps: the worker notes the time it reaches one ---- */

typedef struct { Stamp *at; } StampArgs;

static void stamp_task(void *p) { ((StampArgs *)p)->at->ns = now_ns(); }

static void cpu_stamp(Stream *s, Stamp *at) {
    StampArgs a = { at };
    stream_launch(s, stamp_task, &a, sizeof a);
}

/* ---- graphs (device.h) ---- */

static void cpu_capture_begin(Stream *origin) {
    CpuGraph *g = host_calloc(1, sizeof *g);
    g->base.dev = origin->dev;
    g->lanes = 1;
    g->joined = host_calloc(1, sizeof *g->joined);
    g->last = host_calloc(1, sizeof *g->last);
    g->joined[0] = (CpuStream *)origin;
    g->last[0] = -1;
    pthread_mutex_lock(&capture_mu);
    capturing = g;
    capture_serial++;
    ((CpuStream *)origin)->lane = 0;
    pthread_mutex_unlock(&capture_mu);
}

/* Every lane but the origin's must end on a record the origin waited on. */
static Graph *cpu_capture_end(Stream *origin) {
    pthread_mutex_lock(&capture_mu);
    CpuGraph *g = capturing;
    for (int lane = 1; lane < g->lanes; lane++) {
        int last = g->last[lane];
        if (last < 0 || g->actions[last].kind != ACTION_RECORD || !g->actions[last].origin_waits)
            capture_fatal("a stream joined a capture and did not join back to its origin");
    }
    for (int lane = 0; lane < g->lanes; lane++) g->joined[lane]->lane = -1;
    capturing = NULL;
    pthread_mutex_unlock(&capture_mu);
    g->replay = host_calloc((size_t)g->lanes, sizeof *g->replay);
    for (int lane = 1; lane < g->lanes; lane++) g->replay[lane] = cpu_stream_create(g->joined[lane]->base.dev);
    free(g->joined);
    free(g->last);
    g->joined = NULL;
    g->last = NULL;
    (void)origin;
    return &g->base;
}

static void cpu_graph_launch(Graph *graph, Stream *origin) {
    CpuGraph *g = (CpuGraph *)graph;
    Marker **markers = host_calloc((size_t)g->count + 1, sizeof *markers);
    g->replay[0] = origin;
    for (int i = 0; i < g->count; i++) {
        const Action *a = &g->actions[i];
        Stream *lane = g->replay[a->lane];
        if (a->kind == ACTION_TASK) {
            stream_launch(lane, a->task.fn, a->task.args, sizeof a->task.args);
        } else if (a->kind == ACTION_RECORD) {
            MarkerArgs m = { marker_create(1 + a->waits), NULL };  /* the mark task's and each wait's */
            markers[i] = m.marker;
            stream_launch(lane, mark_task, &m, sizeof m);
        } else {
            MarkerArgs w = { markers[a->record], (CpuStream *)lane };
            stream_launch(lane, wait_task, &w, sizeof w);
        }
    }
    g->replay[0] = NULL;
    free(markers);
}

static void cpu_graph_destroy(Graph *graph) {
    CpuGraph *g = (CpuGraph *)graph;
    for (int lane = 1; lane < g->lanes; lane++) cpu_stream_destroy(g->replay[lane]);  /* after their tasks */
    free(g->replay);
    free(g->actions);
    free(g);
}

static const DeviceOps cpu_ops = {
    .destroy = cpu_destroy, .alloc = cpu_alloc, .free = cpu_free,
    .stream_create = cpu_stream_create, .stream_destroy = cpu_stream_destroy,
    .copy = cpu_copy, .host_task = cpu_host_task, .sum = cpu_sum, .timer_start = cpu_timer_start, .hold = cpu_hold,
    .synchronize = cpu_synchronize, .event_create = cpu_event_create, .event_destroy = cpu_event_destroy,
    .event_record = cpu_event_record, .wait_event = cpu_wait_event, .event_synchronize = cpu_event_synchronize,
    .stamp = cpu_stamp, .stamp_read = NULL,
    .capture_begin = cpu_capture_begin, .capture_end = cpu_capture_end, .graph_launch = cpu_graph_launch,
    .graph_destroy = cpu_graph_destroy,
};

/* Slot `slot` of `sharing` devices takes its own `per` of the cores this
 * process may use (round the list, where there are fewer cores than devices).
 * Left to the OS, ranks sharing cores do not progress alike: one rank's forward
 * ran in 50 ms while three others shared what was left and took 130, and every
 * collective waits for the slowest. */
static void share_cores(CpuDevice *dev, int slot, int per) {
    cpu_set_t allowed;
    if (sched_getaffinity(0, sizeof allowed, &allowed) != 0) return;
    int cpus[CPU_SETSIZE], n = 0;
    for (int c = 0; c < CPU_SETSIZE; c++)
        if (CPU_ISSET(c, &allowed)) cpus[n++] = c;
    if (n < 2) return;
    CPU_ZERO(&dev->cores);
    for (int i = 0; i < per; i++) CPU_SET(cpus[((size_t)slot * per + i) % n], &dev->cores);
    dev->pinned = 1;
}

Device *device_create_cpu(int sharing, int slot) {
    CpuDevice *dev = host_calloc(1, sizeof *dev);
    device_init(&dev->base, &cpu_ops, DEVICE_CPU, -1, "cpu");
    if (sharing > 1) {
        int per_device = omp_get_num_procs() / sharing;
        dev->threads = per_device > 1 ? per_device : 1;
        if (slot >= 0) share_cores(dev, slot, dev->threads);
    }
    return &dev->base;
}
