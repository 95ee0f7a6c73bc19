/* device_cpu.h: the CPU backend's own call: a host task on a stream.
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

#endif
