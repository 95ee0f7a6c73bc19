/* device_cpu.h: the CPU backend's own calls: a host task on a stream, and how
 * many threads a stream's tasks run on.
 *
 * Every CPU kernel is a task: a function and a copy of its arguments, run by the
 * stream's worker thread in FIFO order. */
#ifndef ZF_DEVICE_CPU_H
#define ZF_DEVICE_CPU_H

#include "device.h"

typedef void (*TaskFn)(void *args);
enum { TASK_ARGS_MAX = 640 };  /* room for one pointer per rank, 64 ranks */

/* Enqueue fn(args) on a CPU stream; args_size bytes of args are copied, at most
 * TASK_ARGS_MAX. */
void stream_launch(Stream *s, TaskFn fn, const void *args, size_t args_size);

/* A stream's room of at least `floats` fp32 numbers (the device's working
 * memory), where its ops widen an input held in bf16 (kernels/cpu's
 * cpu_fp32_of); it grows, after the stream's tasks so far, where a call
 * asks for more than it holds. */
float *cpu_stream_room(Stream *s, size_t floats);

/* The OpenMP team a stream's worker runs its tasks on: `full` threads on free
 * cores (TEAM_FULL); one while a load leaves a core free (TEAM_ONE); `full`
 * again while the load takes every core (TEAM_CROWDED), where more threads get
 * more of the cores. device_cpu.c says how the load is seen. */
typedef enum { TEAM_FULL, TEAM_ONE, TEAM_CROWDED } TeamState;

typedef struct {
    int full;
    TeamState state;
    int windows;       /* windows in this state so far */
    int hold_one;      /* windows at one thread before the full team is tried again */
    int hold_crowded;  /* windows crowded before one thread is tried again */
} TeamSize;

/* After a window in which the worker spent `waited_share` of the time it
 * wanted a core waiting for one: from TEAM_FULL to TEAM_ONE at 0.15 and up;
 * from TEAM_ONE to TEAM_CROWDED at 0.15 and up, or back to TEAM_FULL below
 * 0.05 once it has held `hold_one` windows; from TEAM_CROWDED to TEAM_FULL
 * below 0.05, else to TEAM_ONE once it has held `hold_crowded` windows. A
 * change undone in its first window doubles the hold before it is made again
 * (to 64 windows); a longer stay sets it back to 1. */
void team_size_next(TeamSize *team, double waited_share);
/* The team's threads in its state. */
int team_threads(const TeamSize *team);

#endif
