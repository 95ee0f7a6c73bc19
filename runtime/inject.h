/* inject.h: failures injected on purpose, for the tests and for checking a setup.
 *
 * Two kinds, each parsed here once:
 *  - --inject-fault=RANK:STEP:WHERE makes a rank fail at one site of one step,
 *    as a real error there would (fault_parse, at start-up; the Fault travels
 *    in the strategy's config). Every site asks fault_strikes, which also
 *    writes the one report of a fault that struck.
 *  - ZF_INJECT_NAN=WHAT:ITER[:COUNT] makes a value NaN after steps ITER ..
 *    ITER + COUNT - 1 (COUNT 1 if absent), to test what a non-finite step or
 *    state does (strategies/ranks.h says which value). It is read from the
 *    environment at the first call of nan_injected_at, and kept.
 *  - ZF_INJECT_SIGNAL=SIGNAL:ITER names a signal (its number) the trainer
 *    raises while it saves at ITER: a test's signal that lands in a save,
 *    with no race against the clock.
 * Nothing here knows a strategy: the sites are named, and the callers act.
 */
#ifndef ZF_INJECT_H
#define ZF_INJECT_H

#include <stddef.h>
#include <stdint.h>

/* Where --inject-fault makes a rank fail: inside its forward, its backward or
 * its first collective of the step (through rank_threads_fail, as a real error
 * there would), or in the trainer's optimizer step or save; or where it hangs
 * at the start of its forward, as a stuck peer would (for the timeout's test:
 * it fails after the timeout and a minute more). */
typedef enum {
    FAULT_NONE, FAULT_FORWARD, FAULT_BACKWARD, FAULT_COLLECTIVE, FAULT_STEP, FAULT_SAVE, FAULT_HANG, FAULT_SITES
} FaultSite;
typedef struct {
    FaultSite where;        /* FAULT_NONE: no fault */
    int rank;
    int step;               /* the iter of the progress lines; for a save, the steps it would hold */
} Fault;

/* "forward", "backward", "collective", "step", "save", "hang". */
const char *fault_site_name(FaultSite where);
/* Parse RANK:STEP:WHERE into *fault; 0, or -1 with what is wrong in err. */
int fault_parse(const char *text, Fault *fault, char *err, size_t errlen);
/* Whether `fault` strikes rank `rank` at `step` in `where`. If it does and
 * report is not NULL, report gets what to say, after the "rank R: " that
 * names a failing rank (runtime/rank_threads.h): "injected fault (--inject-fault)
 * at step S in the WHERE", and " 'NAME'" for a collective's rendezvous
 * (rendezvous NULL: none). */
int fault_strikes(const Fault *fault, int rank, int step, FaultSite where, const char *rendezvous, char *report,
                  size_t report_len);

/* What ZF_INJECT_NAN poisons. */
typedef enum { NAN_NONE, NAN_LOSS, NAN_GRAD, NAN_WEIGHT } NanTarget;
/* What ZF_INJECT_NAN poisons after `step`: NAN_NONE when it is unset, does
 * not parse, or names other steps. */
NanTarget nan_injected_at(uint32_t step);

/* The signal ZF_INJECT_SIGNAL raises in a save at `iter`; 0 when it is unset,
 * does not parse, or names another iter. */
int signal_injected_at(int iter);

#endif
