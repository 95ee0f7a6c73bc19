/* test_runtime.c: CPU streams and events, the modeled link's clock, memory accounting and its
 * peak, the arena layout, the world's deadlines and its abort. */
#include <criterion/criterion.h>
#include <omp.h>
#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "../runtime/arena.h"
#include "../runtime/device.h"
#include "../runtime/device_cpu.h"
#include "../runtime/host.h"
#include "../runtime/process_group.h"
#include "../runtime/world.h"
#include "../training/trainer.h"
#include "fixtures.h"
#include "stream_stress.h"

static void sleep_us(long us) {
    struct timespec t = { 0, us * 1000 };
    nanosleep(&t, NULL);
}

typedef struct { int *log; int *len; int value; } AppendArgs;

static void append_task(void *p) {
    AppendArgs *a = p;
    a->log[(*a->len)++] = a->value;
}

Test(runtime, stream_runs_tasks_in_fifo_order) {
    Device *dev = device_create_cpu(1, -1);
    Stream *s = stream_create(dev);
    enum { N = 5000 };  /* more than the queue holds: launch must block, not drop */
    static int log[N];
    int len = 0;
    for (int i = 0; i < N; i++) {
        AppendArgs a = { log, &len, i };
        stream_launch(s, append_task, &a, sizeof a);
    }
    stream_synchronize(s);
    cr_assert_eq(len, N);
    for (int i = 0; i < N; i++) cr_assert_eq(log[i], i);
    stream_destroy(s);
    device_destroy(dev);
}

static void affinity_task(void *p) {
    cpu_set_t *cores = *(cpu_set_t **)p;
    cr_assert_eq(sched_getaffinity(0, sizeof *cores, cores), 0);
}

/* The cores a stream's worker may run on. */
static cpu_set_t worker_cores(Device *dev) {
    cpu_set_t cores;
    Stream *s = stream_create(dev);
    cpu_set_t *out = &cores;
    stream_launch(s, affinity_task, &out, sizeof out);
    stream_synchronize(s);
    stream_destroy(s);
    return cores;
}

/* Ranks sharing the cores each keep to their own share (round the cores where
 * they are fewer than the ranks), so that they progress alike; slot -1, and a
 * single core, leave the workers where the process may run. */
Test(runtime, simulated_ranks_keep_to_their_own_cores) {
    enum { SHARING = 4 };
    cpu_set_t allowed, all = { 0 };
    cr_assert_eq(sched_getaffinity(0, sizeof allowed, &allowed), 0);
    int n = CPU_COUNT(&allowed), per = n / SHARING > 1 ? n / SHARING : 1;
    cpu_set_t cores[SHARING];
    for (int k = 0; k < SHARING; k++) {
        Device *dev = device_create_cpu(SHARING, k);
        cores[k] = worker_cores(dev);
        device_destroy(dev);
        cpu_set_t outside;
        CPU_AND(&outside, &cores[k], &allowed);
        cr_expect(CPU_EQUAL(&outside, &cores[k]), "slot %d may run outside the process's cores", k);
        cr_expect_eq(CPU_COUNT(&cores[k]), n < 2 ? n : per, "slot %d has %d cores, not %d", k,
                     CPU_COUNT(&cores[k]), n < 2 ? n : per);
        CPU_OR(&all, &all, &cores[k]);
    }
    if (n >= 2) {
        cpu_set_t both;
        CPU_AND(&both, &cores[0], &cores[1]);
        cr_expect_eq(CPU_COUNT(&both), 0, "slots 0 and 1 share a core");
        if (SHARING * per >= n) cr_expect(CPU_EQUAL(&all, &allowed), "the slots leave some of the cores unused");
    }
    Device *free_dev = device_create_cpu(SHARING, -1);
    cpu_set_t unpinned = worker_cores(free_dev);
    device_destroy(free_dev);
    cr_expect(CPU_EQUAL(&unpinned, &allowed), "slot -1 pinned its worker");
}

/* A process group timed as devices (own_cores, as a modeled link asks) keeps
 * each rank to its share; without, its ranks run where the process may. */
Test(runtime, a_process_group_timed_as_devices_keeps_each_rank_to_its_cores) {
    enum { RANKS = 4 };
    cpu_set_t allowed;
    cr_assert_eq(sched_getaffinity(0, sizeof allowed, &allowed), 0);
    int n = CPU_COUNT(&allowed), per = n / RANKS > 1 ? n / RANKS : 1;
    for (int own_cores = 0; own_cores <= 1; own_cores++) {
        ProcessGroup *pg = pg_create_simulator(RANKS, DEVICE_CPU, own_cores);
        cr_assert_not_null(pg);
        int want = own_cores && n >= 2 ? per : n;
        for (int r = 0; r < RANKS; r++) {
            cpu_set_t cores = worker_cores(pg->device[r]);
            cr_expect_eq(CPU_COUNT(&cores), want, "own_cores=%d: rank %d may run on %d cores, not %d", own_cores,
                         r, CPU_COUNT(&cores), want);
        }
        pg_destroy(pg);
    }
}

/* The team's moves, window by window, for a worker of two threads. */
Test(runtime, a_stream_team_is_one_thread_while_a_load_leaves_a_core_free) {
    TeamSize team = { .full = 2, .state = TEAM_FULL, .hold_one = 1, .hold_crowded = 1 };
    team_size_next(&team, 0.03);  /* a quiet machine's few per cent */
    cr_expect_eq(team_threads(&team), 2);
    team_size_next(&team, 0.30);  /* a load: one thread */
    cr_expect_eq(team.state, TEAM_ONE);
    cr_expect_eq(team_threads(&team), 1);
    cr_expect_eq(team.hold_one, 1, "a full team's longer stay resets its hold");
    team_size_next(&team, 0.10);  /* between the two thresholds: as it was */
    cr_expect_eq(team.state, TEAM_ONE);
    team_size_next(&team, 0.01);  /* free again */
    cr_expect_eq(team.state, TEAM_FULL);
    team_size_next(&team, 0.30);  /* the load was still there: undone at once */
    cr_expect_eq(team.state, TEAM_ONE);
    cr_expect_eq(team.hold_one, 2);
    team_size_next(&team, 0.01);
    cr_expect_eq(team.state, TEAM_ONE, "it held one window of two");
    team_size_next(&team, 0.01);
    cr_expect_eq(team.state, TEAM_FULL);
    for (int undone = 0; undone < 10; undone++) {
        team_size_next(&team, 0.30);
        while (team.state == TEAM_ONE) team_size_next(&team, 0.01);
    }
    cr_expect_eq(team.hold_one, 64, "the hold stops doubling at 64 windows, not %d", team.hold_one);
}

/* One thread waiting as much as the team did: the load takes every core, and
 * the full team gets more of them; tried again after a hold that doubles. */
Test(runtime, a_stream_team_is_full_again_when_one_thread_waits_as_much) {
    TeamSize team = { .full = 4, .state = TEAM_FULL, .hold_one = 1, .hold_crowded = 1 };
    team_size_next(&team, 0.02);
    team_size_next(&team, 0.50);
    cr_expect_eq(team_threads(&team), 1);
    team_size_next(&team, 0.50);
    cr_expect_eq(team.state, TEAM_CROWDED);
    cr_expect_eq(team_threads(&team), 4);
    cr_expect_eq(team.hold_crowded, 2, "one thread was undone in its first window");
    team_size_next(&team, 0.50);
    cr_expect_eq(team.state, TEAM_CROWDED, "it held one window of two");
    team_size_next(&team, 0.50);
    cr_expect_eq(team.state, TEAM_ONE, "tried again after its hold");
    team_size_next(&team, 0.50);
    cr_expect_eq(team.state, TEAM_CROWDED);
    cr_expect_eq(team.hold_crowded, 4);
    team_size_next(&team, 0.01);  /* the load gone */
    cr_expect_eq(team.state, TEAM_FULL);
    cr_expect_eq(team_threads(&team), 4);
}

static atomic_int spinning;

static void *busy_loop(void *unused) {
    (void)unused;
    while (atomic_load(&spinning)) {
    }
    return NULL;
}

/* A task of about a millisecond that says the size of its parallel regions' team. */
static void team_size_task(void *p) {
    int *size = *(int **)p;
    struct timespec t0, t;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    #pragma omp parallel
    {
        #pragma omp single
        *size = omp_get_num_threads();
        do clock_gettime(CLOCK_MONOTONIC, &t);
        while ((t.tv_sec - t0.tv_sec) * 1000000000L + (t.tv_nsec - t0.tv_nsec) < 1000000L);
    }
}

/* Beside busy loops on all cores but one, a stream's worker soon runs its
 * tasks on one thread: it sees its own wait for a core. */
Test(runtime, a_stream_worker_runs_on_one_thread_beside_a_load, .timeout = 30) {
    cpu_set_t allowed;
    cr_assert_eq(sched_getaffinity(0, sizeof allowed, &allowed), 0);
    int cores = CPU_COUNT(&allowed);
    if (cores < 2 || omp_get_max_threads() < 2 || getenv("OMP_DYNAMIC"))
        test_skip("a stream's team has one thread here (%d cores), or OMP_DYNAMIC is set", cores);
    if (access("/proc/thread-self/schedstat", R_OK) != 0)
        test_skip("this kernel has no /proc/thread-self/schedstat: a stream's team stays whole");
    Device *dev = device_create_cpu(1, -1);
    Stream *s = stream_create(dev);
    int size = 0, *out = &size, seen_one = 0;
    atomic_store(&spinning, 1);
    pthread_t loops[CPU_SETSIZE];
    for (int i = 0; i < cores - 1; i++) cr_assert_eq(pthread_create(&loops[i], NULL, busy_loop, NULL), 0);
    for (int task = 0; task < 2000 && !seen_one; task++) {  /* at most 2 s */
        stream_launch(s, team_size_task, &out, sizeof out);
        stream_synchronize(s);
        seen_one = size == 1;
    }
    atomic_store(&spinning, 0);
    for (int i = 0; i < cores - 1; i++) pthread_join(loops[i], NULL);
    stream_destroy(s);
    device_destroy(dev);
    cr_expect(seen_one, "the worker kept its full team beside %d busy loops", cores - 1);
}

/* A slow producer on one stream, a consumer on another that waits on its event. */
typedef struct { atomic_int *cell; int value; long delay_us; } WriteArgs;
typedef struct { atomic_int *cell; int *seen; } ReadArgs;

static void slow_write_task(void *p) {
    WriteArgs *a = p;
    sleep_us(a->delay_us);
    atomic_store(a->cell, a->value);
}

static void read_task(void *p) {
    ReadArgs *a = p;
    *a->seen = atomic_load(a->cell);
}

Test(runtime, stream_wait_event_orders_streams) {
    Device *dev = device_create_cpu(1, -1);
    Stream *producer = stream_create(dev), *consumer = stream_create(dev);
    Event *ev = event_create(dev);
    atomic_int cell = 0;
    int seen[50];
    for (int round = 0; round < 50; round++) {
        WriteArgs w = { &cell, round + 1, 200 };
        stream_launch(producer, slow_write_task, &w, sizeof w);
        event_record(ev, producer);
        stream_wait_event(consumer, ev);
        ReadArgs r = { &cell, &seen[round] };
        stream_launch(consumer, read_task, &r, sizeof r);
    }
    stream_synchronize(consumer);
    /* every read ran after its own round's write (and maybe later ones) */
    for (int round = 0; round < 50; round++) cr_expect_geq(seen[round], round + 1, "round %d saw %d", round, seen[round]);
    stream_synchronize(producer);
    event_destroy(ev);
    stream_destroy(producer);
    stream_destroy(consumer);
    device_destroy(dev);
}

/* ---- graphs (device.h): a capture runs nothing; each launch runs it again ---- */

typedef struct { int *log; atomic_int *len; const int *from; int plus; } LogFromArgs;

static void log_from_task(void *p) {
    LogFromArgs *a = p;
    a->log[atomic_fetch_add(a->len, 1)] = *a->from + a->plus;
}

/* The origin logs a value the host set, a stream that joined logs it plus
 * 100 after a slow write, and the origin waits for it before logging plus
 * 200: each launch logs the launch's own values, in that order. */
Test(runtime, a_graph_runs_its_captured_work_again_on_each_launch) {
    Device *dev = device_create_cpu(1, -1);
    Stream *origin = stream_create(dev), *side = stream_create(dev);
    Event *fork = event_create(dev), *join = event_create(dev);
    static int log[64];
    atomic_int len = 0, cell = 0;
    int value = 0;
    graph_capture_begin(origin);
    cr_expect(graph_capturing());
    LogFromArgs first = { log, &len, &value, 0 }, second = { log, &len, &value, 100 };
    LogFromArgs third = { log, &len, &value, 200 };
    stream_launch(origin, log_from_task, &first, sizeof first);
    event_record(fork, origin);
    stream_wait_event(side, fork);
    WriteArgs w = { &cell, 1, 2000 };
    stream_launch(side, slow_write_task, &w, sizeof w);
    stream_launch(side, log_from_task, &second, sizeof second);
    event_record(join, side);
    stream_wait_event(origin, join);
    stream_launch(origin, log_from_task, &third, sizeof third);
    Graph *g = graph_capture_end(origin);
    cr_expect(!graph_capturing());
    stream_synchronize(origin);
    stream_synchronize(side);
    cr_assert_eq(atomic_load(&len), 0, "the capture ran %d tasks", atomic_load(&len));
    for (int launch = 0; launch < 3; launch++) {
        value = 10 * (launch + 1);
        graph_launch(g, origin);
        stream_synchronize(origin);  /* the whole graph: the origin waited for the side's part */
        cr_assert_eq(atomic_load(&len), 3 * (launch + 1));
        for (int i = 0; i < 3; i++)
            cr_expect_eq(log[3 * launch + i], value + 100 * i, "launch %d, entry %d", launch, i);
    }
    graph_destroy(g);
    event_destroy(fork);
    event_destroy(join);
    stream_destroy(origin);
    stream_destroy(side);
    device_destroy(dev);
}

/* What CUDA refuses in a capture stops the process on the CPU too: each test
 * provokes one refusal with an origin, another stream and an event. */
typedef struct {
    Device *dev;
    Stream *origin, *other;
    Event *ev;
} CaptureParts;

static CaptureParts capture_parts(void) {
    CaptureParts p = { device_create_cpu(1, -1), NULL, NULL, NULL };
    p.origin = stream_create(p.dev);
    p.other = stream_create(p.dev);
    p.ev = event_create(p.dev);
    return p;
}

Test(runtime, a_synchronize_in_a_capture_stops_the_process, .signal = SIGABRT) {
    CaptureParts p = capture_parts();
    graph_capture_begin(p.origin);
    stream_synchronize(p.origin);
}

Test(runtime, an_allocation_in_a_capture_stops_the_process, .signal = SIGABRT) {
    CaptureParts p = capture_parts();
    graph_capture_begin(p.origin);
    device_alloc(p.dev, MEM_WORKING, 64);
}

Test(runtime, a_wait_in_a_capture_on_an_earlier_record_stops_the_process, .signal = SIGABRT) {
    CaptureParts p = capture_parts();
    event_record(p.ev, p.other);
    graph_capture_begin(p.origin);
    stream_wait_event(p.origin, p.ev);
}

Test(runtime, a_wait_after_a_capture_on_a_record_in_it_stops_the_process, .signal = SIGABRT) {
    CaptureParts p = capture_parts();
    graph_capture_begin(p.origin);
    event_record(p.ev, p.origin);
    graph_capture_end(p.origin);
    stream_wait_event(p.other, p.ev);
}

Test(runtime, a_stream_that_does_not_join_back_stops_the_process, .signal = SIGABRT) {
    CaptureParts p = capture_parts();
    graph_capture_begin(p.origin);
    event_record(p.ev, p.origin);
    stream_wait_event(p.other, p.ev);  /* it joins, and never records for the origin to wait on */
    graph_capture_end(p.origin);
}

/* A graph's ops hold the address of the stream's room they were recorded
 * with: the room may not grow while a graph lives, and may once it is gone. */
Test(runtime, a_room_that_grows_while_a_graph_lives_stops_the_process, .signal = SIGABRT) {
    CaptureParts p = capture_parts();
    cpu_stream_room(p.origin, 16);
    graph_capture_begin(p.origin);
    Graph *g = graph_capture_end(p.origin);
    graph_launch(g, p.origin);
    cpu_stream_room(p.origin, 16);  /* the room there is: no growth */
    cpu_stream_room(p.origin, 32);
}

Test(runtime, a_room_grows_again_once_its_graph_is_destroyed) {
    CaptureParts p = capture_parts();
    graph_capture_begin(p.origin);
    graph_destroy(graph_capture_end(p.origin));
    cr_expect_not_null(cpu_stream_room(p.origin, 64));
    stream_synchronize(p.origin);
    event_destroy(p.ev);
    stream_destroy(p.other);
    stream_destroy(p.origin);
    device_destroy(p.dev);
}

Test(runtime, event_synchronize_waits_for_the_recorded_point) {
    Device *dev = device_create_cpu(1, -1);
    Stream *s = stream_create(dev);
    Event *ev = event_create(dev);
    atomic_int cell = 0;
    WriteArgs w = { &cell, 7, 20000 };
    stream_launch(s, slow_write_task, &w, sizeof w);
    event_record(ev, s);
    event_synchronize(ev);
    cr_expect_eq(atomic_load(&cell), 7);
    /* waiting on an event never recorded is a no-op, as in CUDA */
    Event *never = event_create(dev);
    stream_wait_event(s, never);
    event_synchronize(never);
    stream_synchronize(s);
    event_destroy(never);
    event_destroy(ev);
    stream_destroy(s);
    device_destroy(dev);
}

/* Several host threads, each driving its own streams with cross waits, all at
 * once: what the rank threads will do. */
Test(runtime, streams_under_concurrent_host_threads) {
    Device *dev = device_create_cpu(1, -1);
    cr_expect_eq(stream_stress(dev, 4, 100), 0, "a read ran before its write");
    device_destroy(dev);
}

Test(runtime, stream_copy_and_memory_accounting) {
    Device *dev = device_create_cpu(1, -1);
    Stream *s = stream_create(dev);
    float *a = device_alloc(dev, MEM_WEIGHTS, 1000 * sizeof(float));
    float *b = device_alloc(dev, MEM_GRADS, 10 * sizeof(float));
    cr_expect_eq(device_bytes_in_use(dev, MEM_WEIGHTS), 4000);
    cr_expect_eq(device_bytes_in_use(dev, MEM_GRADS), 40);
    cr_expect_eq(device_bytes_in_use(dev, MEM_OPTIMIZER), 0);
    for (int i = 0; i < 1000; i++) cr_assert_eq(a[i], 0.0f, "allocations are zeroed");
    float host[10] = { 1, 2, 3, 4, 5, 6, 7, 8, 9, 10 };
    stream_copy(s, b, host, sizeof host);
    stream_copy(s, a + 500, b, sizeof host);
    stream_synchronize(s);
    for (int i = 0; i < 10; i++) cr_expect_eq(a[500 + i], host[i]);
    device_free(dev, MEM_WEIGHTS, a, 1000 * sizeof(float));
    device_free(dev, MEM_GRADS, b, 10 * sizeof(float));
    cr_expect_eq(device_bytes_in_use(dev, MEM_WEIGHTS), 0);
    /* the high-water mark: every kind at once, kept past the frees */
    cr_expect_eq(device_peak_bytes(dev), 4040);
    float *c = device_alloc(dev, MEM_WORKING, 2000 * sizeof(float));
    cr_expect_eq(device_peak_bytes(dev), 8000, "a larger allocation later raises it");
    device_free(dev, MEM_WORKING, c, 2000 * sizeof(float));
    stream_destroy(s);
    device_destroy(dev);
}

/* Units pad to lcm(3, ARENA_ALIGN = 128) = 384 numbers: 1536 bytes in fp32,
 * so every unit starts 256-byte aligned, as a fresh cudaMalloc buffer does;
 * and each tensor starts on a multiple of 128 numbers within its unit, the
 * gap before it in `used`: 256 bytes in a bf16 copy, a product's operand
 * boundary. */
Test(runtime, arena_pads_units_to_the_shard_multiple_and_tensors_to_the_alignment) {
    ArenaLayout a;
    arena_init(&a, 3);
    arena_begin_unit(&a);
    arena_add_tensor(&a, "x", 2, 5);   /* 10 floats */
    arena_add_tensor(&a, "n", 4, 0);   /* 4 floats, 1-D, at 128 */
    arena_end_unit(&a);
    arena_begin_unit(&a);
    arena_add_tensor(&a, "y", 24, 16);  /* 384 floats, already a multiple of 384 */
    arena_end_unit(&a);
    cr_expect_eq(a.units[0].used, 132);
    cr_expect_eq(a.units[0].size, 384);
    cr_expect_eq(a.units[1].offset, 384);
    cr_expect_eq(a.units[1].offset * sizeof(float) % 256, 0);
    cr_expect_eq(a.units[1].size, 384);
    cr_expect_eq(a.total, 768);
    cr_expect_eq(a.numel, 398);
    int y = arena_find(&a, "y"), n = arena_find(&a, "n");
    cr_expect_eq(a.tensors[y].offset, 384);
    cr_expect_eq(a.tensors[n].ndim, 1);
    cr_expect_eq(a.tensors[n].offset, 128);
    cr_expect_eq(a.tensors[n].offset * 2 % 256, 0, "a tensor off its operand boundary in bf16 (2 bytes a number)");
    cr_expect_eq(arena_find(&a, "missing"), -1);
}

/* A wait refers to the record it saw: a later record of the same event on an
 * idle stream must not release it early. */
Test(runtime, a_later_record_on_another_stream_does_not_release_a_wait) {
    Device *dev = device_create_cpu(1, -1);
    Stream *slow = stream_create(dev), *idle = stream_create(dev), *waiter = stream_create(dev);
    Event *ev = event_create(dev);
    for (int round = 0; round < 20; round++) {
        atomic_int cell = 0;
        int seen = -1;
        WriteArgs w = { &cell, 1, 5000 };
        stream_launch(slow, slow_write_task, &w, sizeof w);
        event_record(ev, slow);
        stream_wait_event(waiter, ev);  /* waits for the slow write */
        event_record(ev, idle);         /* completes at once */
        ReadArgs r = { &cell, &seen };
        stream_launch(waiter, read_task, &r, sizeof r);
        stream_synchronize(waiter);
        cr_assert_eq(seen, 1, "round %d: the wait was released by the later record", round);
        stream_synchronize(slow);
    }
    event_destroy(ev);
    stream_destroy(slow);
    stream_destroy(idle);
    stream_destroy(waiter);
    device_destroy(dev);
}

/* stream_synchronize waits for what was launched before it, even while another
 * host thread keeps launching. */
typedef struct { Stream *s, *other; Event *gate; atomic_int *released; } LauncherArgs;

static void wait_for_flag_task(void *p) {
    atomic_int *flag = *(atomic_int **)p;
    while (!atomic_load(flag)) sleep_us(100);
}

static void *late_launcher(void *p) {
    LauncherArgs *a = p;
    sleep_us(2000);                     /* the main thread is inside synchronize now */
    stream_wait_event(a->s, a->gate);   /* blocks s until the main thread's sync returns */
    return NULL;
}

Test(runtime, synchronize_ignores_work_launched_after_it, .timeout = 10) {
    Device *dev = device_create_cpu(1, -1);
    Stream *s = stream_create(dev), *other = stream_create(dev);
    Event *gate = event_create(dev);
    atomic_int released = 0;
    atomic_int *flag = &released;
    stream_launch(other, wait_for_flag_task, &flag, sizeof flag);
    event_record(gate, other);
    atomic_int cell = 0;
    WriteArgs w = { &cell, 1, 20000 };
    stream_launch(s, slow_write_task, &w, sizeof w);
    LauncherArgs la = { s, other, gate, &released };
    pthread_t t;
    pthread_create(&t, NULL, late_launcher, &la);
    stream_synchronize(s);              /* must return after the slow write alone */
    cr_expect_eq(atomic_load(&cell), 1);
    atomic_store(&released, 1);
    pthread_join(t, NULL);
    stream_synchronize(s);
    stream_synchronize(other);
    event_destroy(gate);
    stream_destroy(s);
    stream_destroy(other);
    device_destroy(dev);
}

Test(runtime, an_event_may_be_destroyed_while_its_record_is_pending) {
    Device *dev = device_create_cpu(1, -1);
    Stream *a = stream_create(dev), *b = stream_create(dev);
    atomic_int cell = 0;
    int seen = 0;
    WriteArgs w = { &cell, 9, 5000 };
    stream_launch(a, slow_write_task, &w, sizeof w);
    Event *ev = event_create(dev);
    event_record(ev, a);
    stream_wait_event(b, ev);
    event_destroy(ev);                  /* pending mark and wait keep their marker */
    ReadArgs r = { &cell, &seen };
    stream_launch(b, read_task, &r, sizeof r);
    stream_synchronize(b);
    cr_expect_eq(seen, 9);
    stream_destroy(a);
    stream_destroy(b);
    device_destroy(dev);
}

/* A call bounded by world_deadline_start that outlasts the timeout ends the
 * process, exit 1 (NCCL's init waiting for a peer that never comes). */
Test(runtime, a_deadline_past_the_timeout_ends_the_process, .exit_code = 1, .timeout = 30) {
    world_set_timeout(0.2);
    world_deadline_start("a test's wait");
    for (int i = 0; i < 50; i++) sleep_us(100000);  /* 5 s: the deadline must have ended it by now */
}

/* One ended in time is over: nothing happens past it. */
Test(runtime, a_deadline_ended_in_time_does_nothing) {
    world_set_timeout(0.2);
    world_deadline_start("a test's wait");
    world_deadline_end();
    sleep_us(400000);
    cr_expect(1, "still here past the deadline");
}

/* ---- world_abort: from any thread, at once ---- */

static void say_teardown(void) { fputs("teardown ran\n", stdout); }

static void *abort_from_a_thread(void *arg) {
    (void)arg;
    world_abort(3);
}

/* World_abort from a thread other than main (a watchdog's, a stream worker's):
 * what was printed is flushed, the status is the one asked, and exit()'s
 * teardown (atexit handlers, the libraries' destructors) does not run under the
 * other threads' calls, the main thread here busy in its own. */
Test(runtime, world_abort_flushes_and_leaves_without_the_teardown, .timeout = 30) {
    char path[64];
    snprintf(path, sizeof path, "/tmp/zf_abort_%d.txt", (int)getpid());
    pid_t pid = fork();
    cr_assert_geq(pid, 0);
    if (pid == 0) {
        if (!freopen(path, "w", stdout)) _exit(9);
        atexit(say_teardown);
        printf("flushed\n");  /* buffered: a file */
        pthread_t t;
        if (pthread_create(&t, NULL, abort_from_a_thread, NULL) != 0) _exit(8);
        for (;;) sleep_us(100000);
    }
    int status = 0;
    cr_assert_eq(waitpid(pid, &status, 0), pid);
    char text[256] = "";
    FILE *f = fopen(path, "r");
    size_t n = f ? fread(text, 1, sizeof text - 1, f) : 0;
    text[n] = 0;
    if (f) fclose(f);
    unlink(path);
    cr_expect(WIFEXITED(status) && WEXITSTATUS(status) == 3, "status %d", status);
    cr_expect_str_eq(text, "flushed\n", "the output was: %s", text);
}

/* ---- a watchdog's end against a run that finishes; the rendezvous's wait ---- */

static void cleanup_that_hangs(void *arg) {
    (void)arg;
    for (;;) sleep_us(100000);  /* as ncclCommAbort waiting for the kernel that hangs */
}

static void *watchdog_that_fires(void *arg) {
    (void)arg;
    sleep_us(100000);
    world_end_run("error: a test's watchdog fired", cleanup_that_hangs, NULL, 0.5);
}

/* The watchdog's thread ends the run while the main thread finishes its work
 * and reaches world_finalize, as bin/train's does once a stuck collective
 * completes after all (the GPU's first run: exit 0, the line said): the exit
 * is 1, within the cleanup's half second of the line, whatever the cleanup
 * does, and the line is said once. */
static void finish_while_a_watchdog_fires(int child) {
    (void)child;
    pthread_t t;
    if (pthread_create(&t, NULL, watchdog_that_fires, NULL) != 0) _exit(8);
    sleep_us(300000);
    world_finalize();
    _exit(0);
}

Test(runtime, a_watchdogs_end_is_the_runs_status_whatever_the_main_thread_does, .timeout = 30) {
    double start = host_seconds();
    char text[1024];
    int status = child_end(child_start(finish_while_a_watchdog_fires, 0), 0, text, sizeof text);
    double seconds = host_seconds() - start;
    cr_expect_eq(status, 1, "exit %d, stderr: %s", status, text);
    cr_expect_lt(seconds, 2.0, "the run ended %.1f s after it began", seconds);
    cr_expect_str_eq(text, "error: a test's watchdog fired; stopping every process\n");
    cr_expect_eq(count_error_lines(text), 1, "stderr: %s", text);
}

/* Process 1 of 2 waits for a rendezvous file that process 0 never writes, and
 * leaves by _exit as the GPU test's child does: the line naming the file and
 * the timeout reaches the harness (on the GPU's first run it was lost in
 * stderr's buffer, which freopen had made a full one). */
static void wait_for_a_file_that_never_comes(int child) {
    (void)child;
    world_set_timeout(0.3);
    char id[16];
    _exit(world_read_rendezvous("/tmp/zf_no_such_rendezvous", id, sizeof id, "a test's id") == -1 ? 1 : 0);
}

Test(runtime, a_rendezvous_file_that_never_comes_is_one_line, .timeout = 30) {
    char text[1024];
    int status = child_end(child_start(wait_for_a_file_that_never_comes, 0), 0, text, sizeof text);
    cr_expect_eq(status, 1, "exit %d, stderr: %s", status, text);
    cr_expect(strstr(text, "error: process 0: no --rendezvous file /tmp/zf_no_such_rendezvous from process 0 within "
                           "0.3 s (--timeout)\n") != NULL, "stderr: %s", text);
    cr_expect_eq(count_error_lines(text), 1, "stderr: %s", text);
}

/* A file of the wrong size is named, not waited for. */
static void read_a_rendezvous_of_the_wrong_size(int child) {
    (void)child;
    char path[64], id[16];
    snprintf(path, sizeof path, "/tmp/zf_short_rendezvous_%d", (int)getpid());
    FILE *f = fopen(path, "wb");
    if (!f || fwrite("short", 5, 1, f) != 1 || fclose(f) != 0) _exit(9);
    int rc = world_read_rendezvous(path, id, sizeof id, "a test's id");
    unlink(path);
    _exit(rc == -1 ? 1 : 0);
}

Test(runtime, a_rendezvous_file_of_another_size_is_named) {
    char text[1024];
    int status = child_end(child_start(read_a_rendezvous_of_the_wrong_size, 0), 0, text, sizeof text);
    cr_expect_eq(status, 1, "exit %d, stderr: %s", status, text);
    cr_expect(strstr(text, " is not a test's id (16 bytes)\n") != NULL, "stderr: %s", text);
}

/* The link model (runtime/link_model.h) against its formulas worked by hand:
 * 8 ranks, nodes of 4, 100 GB/s and 2 us inside a node, 10 GB/s and 20 us
 * between, a million floats. Hybrid sharding in groups of 4: the gather a
 * ring inside the node; the reduce-scatter that ring, then the ordered chain
 * between the 2 groups, two legs of a shard each, 8 MB between the nodes.
 * Full sharding: every ring spans the nodes, on the slow tier, 2 hops across.
 * One tier: DDP's all-reduce as a plain ring; bf16 halves the bandwidth terms. */
Test(runtime, the_link_model_is_its_formulas) {
    const size_t n = 1000000;
    const double bytes = 4.0 * n, eps = 1e-12;
    LinkShape hybrid = { { 100, 2 }, { 10, 20 }, 8, 4, 4 }, full = hybrid;
    full.shards = 8;
    LinkCost gather = link_cost(&hybrid, LINK_ALL_GATHER, n, DTYPE_FP32);
    double ring4 = 3 * 2e-6 + 0.75 * bytes / 100e9;
    cr_expect_float_eq(gather.seconds, ring4, eps, "%.9g", gather.seconds);
    cr_expect_float_eq(gather.inter_bytes, 0.0, eps);
    LinkCost scatter = link_cost(&hybrid, LINK_REDUCE_SCATTER, n, DTYPE_FP32);
    double leg = 1 * 20e-6 + bytes / 4 / 10e9;
    cr_expect_float_eq(scatter.seconds, ring4 + 2 * leg, eps, "%.9g", scatter.seconds);
    cr_expect_float_eq(scatter.inter_bytes, 2 * bytes, 1e-3, "%.9g", scatter.inter_bytes);
    LinkCost full_scatter = link_cost(&full, LINK_REDUCE_SCATTER, n, DTYPE_FP32);
    cr_expect_float_eq(full_scatter.seconds, 7 * 20e-6 + 0.875 * bytes / 10e9, eps, "%.9g", full_scatter.seconds);
    cr_expect_float_eq(full_scatter.inter_bytes, 2 * 0.875 * bytes, 1e-3, "%.9g", full_scatter.inter_bytes);
    LinkCost in_bf16 = link_cost(&hybrid, LINK_REDUCE_SCATTER, n, DTYPE_BF16);
    double ring4_bf16 = 3 * 2e-6 + 0.75 * bytes / 2 / 100e9, leg_bf16 = 20e-6 + bytes / 8 / 10e9;
    cr_expect_float_eq(in_bf16.seconds, ring4_bf16 + 2 * leg_bf16, eps, "%.9g", in_bf16.seconds);
    LinkShape one_tier = { { 100, 2 }, { 0, 0 }, 8, 8, 8 };
    LinkCost ddp = link_cost(&one_tier, LINK_ALL_REDUCE, n, DTYPE_FP32);
    cr_expect_float_eq(ddp.seconds, 7 * 2e-6 + 2 * 0.875 * bytes / 100e9, eps, "%.9g", ddp.seconds);
    cr_expect_float_eq(ddp.inter_bytes, 0.0, eps);
    cr_expect_float_eq(ring_seconds(one_tier.intra, 8, 1, n, DTYPE_FP32), ddp.seconds, eps);
}

static void sleep_300_ms(void *arg) {
    (void)arg;
    sleep_us(300000);
}

/* The modeled link's clock starts when a link could start the collective: once
 * it is enqueued, the link free and the inputs ready; not when a late worker
 * gets there (a simulated rank's comm thread off its core). */
Test(runtime, the_link_clock_starts_when_the_link_could_start, .timeout = 30) {
    Device *dev = device_create_cpu(1, -1);
    Stream *comm = stream_create(dev), *compute = stream_create(dev);
    Event *ready = event_create(dev);
    /* inputs ready at once, the worker 300 ms late: the 200 ms hold is past */
    double t0 = wall_seconds();
    event_record(ready, compute);
    stream_wait_event(comm, ready);
    stream_host_task(comm, sleep_300_ms, NULL);
    stream_timer_start(comm, NULL);
    stream_hold(comm, 0.2);
    stream_synchronize(comm);
    double late = wall_seconds() - t0;
    cr_expect_lt(late, 0.45, "a late worker's hold took %.3f s, not the 0.3 s of its lateness", late);
    cr_expect_geq(late, 0.3);
    /* inputs ready after 300 ms: the hold counts from then */
    t0 = wall_seconds();
    stream_host_task(compute, sleep_300_ms, NULL);
    event_record(ready, compute);
    stream_wait_event(comm, ready);
    stream_timer_start(comm, NULL);
    stream_hold(comm, 0.2);
    stream_synchronize(comm);
    double waited = wall_seconds() - t0;
    cr_expect_geq(waited, 0.49, "a hold after inputs ready at 0.3 s ended at %.3f s", waited);
    /* back to back, the second starts when the link is free */
    t0 = wall_seconds();
    for (int i = 0; i < 2; i++) {
        stream_timer_start(comm, NULL);
        stream_hold(comm, 0.2);
    }
    stream_synchronize(comm);
    double both = wall_seconds() - t0;
    cr_expect_geq(both, 0.39, "two 0.2 s holds took %.3f s", both);
    /* a link idle since long ago: the hold still counts from its enqueue */
    sleep_us(300000);
    t0 = wall_seconds();
    stream_timer_start(comm, NULL);
    stream_hold(comm, 0.2);
    stream_synchronize(comm);
    double fresh = wall_seconds() - t0;
    cr_expect_geq(fresh, 0.19, "a hold on an idle link took %.3f s", fresh);
    stream_synchronize(compute);
    event_destroy(ready);
    stream_destroy(comm);
    stream_destroy(compute);
    device_destroy(dev);
}
