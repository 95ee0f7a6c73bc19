/* profile.h: the device time of each op, per step, as a table at the end of a run.
 *
 * Why: a step is slow somewhere, and the wall time of the step cannot say
 * where. A trace (trace.h) shows each op of a few steps to a person; a
 * profile sums every op of every step into one table a log can hold: op name,
 * calls per step, ms per step and its share of the step (ZF_PROFILE=1 for
 * bin/train; docs/performance.md).
 *
 * Each op of kernels.h is one span of its stream's work: profile_begin and
 * profile_end each enqueue a stamp (device.h), so the time is the device's:
 * a CPU stream's worker reads the clock as it reaches each stamp, a GPU's
 * records a timing event on the stream. On an unprofiled stream both return
 * at once: one branch.
 *
 * Contract:
 *  1. A stream is profiled once profile_attach gives it a lane: its pending
 *     spans, written by the one thread that enqueues on it at a time (as the
 *     stream's own enqueues are), so lanes of different ranks never race.
 *  2. Spans are kept only between profile_step_begin and profile_step_end
 *     (evaluations and samples between steps are left out), at most
 *     PROFILE_MAX_SPANS a stream a step; later ones are counted, not kept.
 *  3. profile_step_begin and profile_step_end are called from one thread,
 *     while no other enqueues: each waits for the profiled streams (a host
 *     synchronization per step, when profiling only). profile_step_end reads
 *     the step's stamps and adds them to the totals: memory stays bounded.
 *  4. The first step is warm-up (plans, first allocations): once a second is
 *     done it is left out of the totals and the table says so.
 *  5. Profiles never nest: an op's span holds no other op's.
 *  6. A profiled stream is detached (profile_detach) before it is destroyed
 *     (pg_destroy does), or the profile destroyed first.
 */
#ifndef ZF_PROFILE_H
#define ZF_PROFILE_H

#include <stdint.h>
#include <stdio.h>

#include "device.h"

#ifdef __cplusplus
extern "C" {
#endif

enum { PROFILE_MAX_SPANS = 1 << 15, PROFILE_MAX_OPS = 64, PROFILE_MAX_LANES = 64 };

typedef struct Profile Profile;

/* One op's totals over the steps kept. */
typedef struct {
    const char *name;
    long calls;
    int64_t ns;
} ProfileRow;

Profile *profile_create(void);
void profile_destroy(Profile *p);
/* Profile the ops enqueued on s from now on. */
void profile_attach(Profile *p, Stream *s);
/* s is about to go: its spans not yet read are waited for and dropped, and
 * the profile lets it go. Nothing on an unprofiled stream. */
void profile_detach(Stream *s);
/* A span of the op `name` (a string that outlives the profile, as a literal
 * does) from here to the next profile_end on s. */
void profile_begin(Stream *s, const char *name);
void profile_end(Stream *s);
void profile_step_begin(Profile *p);
void profile_step_end(Profile *p);
/* Add one call of `name` taking ns to the totals: profile_step_end's, and the
 * tests'. */
void profile_add(Profile *p, const char *name, int64_t ns);
/* Count a step of `ns` wall time (from profile_step_begin to profile_step_end
 * on the host's clock): profile_step_end's, and the tests'. */
void profile_add_step(Profile *p, int64_t ns);
/* The rows, sorted by total time, most first (ties by name); their count. */
int profile_rows(const Profile *p, ProfileRow rows[PROFILE_MAX_OPS]);
/* The table, headed by what it covers (`whose`: the streams profiled). */
void profile_print(const Profile *p, const char *whose, FILE *f);

#ifdef __cplusplus
}
#endif

#endif
