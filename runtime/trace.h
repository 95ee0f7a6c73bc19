/* trace.h: a timeline of stream work, written as Chrome trace-event JSON.
 *
 * Why: overlap is a claim about time, that a collective runs on a rank's
 * communication stream while its compute stream computes, and equal bits
 * cannot show it. A trace shows it to a person (Perfetto, chrome://tracing)
 * and to the tests.
 *
 * A span is a range of one stream's work with a name and a unit (-1: none):
 * trace_begin and trace_end each enqueue a stamp (runtime/device.h), and the
 * stream notes the time it reaches it: the CPU backend's worker reads
 * CLOCK_MONOTONIC, the CUDA backend records an event. Spans nest on a stream
 * (a unit's backward holds its ops). The layer that enqueues names the work:
 * the kernels name their ops, the model its units' forward and backward, the
 * process group its collectives.
 *
 * Contract:
 *  1. A stream is traced once trace_attach gives it a row (a thread of a
 *     process: for the ranks, process "rank r", threads "compute" and "comm").
 *     Spans are recorded only while the trace is recording (trace_record);
 *     on an untraced stream trace_begin and trace_end do nothing.
 *  2. trace_begin and trace_end pair up on a stream, as the stream's enqueues
 *     do: from one thread at a time (the baton holder, runtime/rank_threads.h).
 *  3. trace_collect waits for every traced stream, reads every stamp and lets
 *     the streams go: call it before they are destroyed (pg_destroy does).
 *  4. A trace holds at most max_spans spans; later ones are counted, not kept.
 */
#ifndef ZF_TRACE_H
#define ZF_TRACE_H

#include <stddef.h>

#include "device.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct Trace Trace;

Trace *trace_create(size_t max_spans);
void trace_destroy(Trace *t);
/* A new process row (pids 0, 1, ... in the order asked): its pid. */
int trace_add_process(Trace *t, const char *name);
/* Record the spans of s's work on thread tid of process pid, named thread_name. */
void trace_attach(Trace *t, Stream *s, int pid, int tid, const char *thread_name);
/* Spans begun from now on are recorded (on = 1) or not (0). */
void trace_record(Trace *t, int on);
/* A span of the work enqueued on s from here to its trace_end. unit < 0 takes
 * the unit of the span it is inside, if any. name: plain text, at most 47
 * characters, no quotes or backslashes. */
void trace_begin(Stream *s, const char *name, int unit);
/* The same for a collective on the modeled link: it starts the link's clock
 * (stream_timer_start, traced or not), and the span starts where the clock
 * does, so it shows the link's time, not the stream worker's lateness. */
void trace_begin_link(Stream *s, const char *name, int unit);
void trace_end(Stream *s);
void trace_collect(Trace *t);
/* Spans kept, and spans dropped past max_spans. */
size_t trace_spans(const Trace *t);
size_t trace_dropped(const Trace *t);
/* Collect, then write every span as a complete event ("ph": "X", ts and dur in
 * microseconds from the first span, pid, tid, name, args.unit) and every row's
 * name as metadata. 0, or -1 with a message in err. */
int trace_write(Trace *t, const char *path, char *err, size_t errlen);

#ifdef __cplusplus
}
#endif

#endif
