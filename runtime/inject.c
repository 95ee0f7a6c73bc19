/* inject.c: --inject-fault, ZF_INJECT_NAN and ZF_INJECT_SIGNAL parsed, asked and reported (inject.h). */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "inject.h"

static const char *const FAULT_SITE_NAMES[FAULT_SITES] = {
    [FAULT_NONE] = "none", [FAULT_FORWARD] = "forward", [FAULT_BACKWARD] = "backward",
    [FAULT_COLLECTIVE] = "collective", [FAULT_STEP] = "step", [FAULT_SAVE] = "save",
    [FAULT_HANG] = "hang",
};

const char *fault_site_name(FaultSite where) { return FAULT_SITE_NAMES[where]; }

int fault_parse(const char *text, Fault *fault, char *err, size_t errlen) {
    char where[16];
    int rank, step, used = 0;
    if (sscanf(text, "%d:%d:%15[a-z]%n", &rank, &step, where, &used) != 3 || text[used] != 0) {
        snprintf(err, errlen, "'%s' must be RANK:STEP:WHERE (WHERE: forward, backward, collective, step, save, hang)", text);
        return -1;
    }
    if (rank < 0 || step < 0) {
        snprintf(err, errlen, "'%s': RANK and STEP must not be negative", text);
        return -1;
    }
    for (int w = FAULT_FORWARD; w < FAULT_SITES; w++) {
        if (strcmp(where, FAULT_SITE_NAMES[w]) == 0) {
            *fault = (Fault){ .where = (FaultSite)w, .rank = rank, .step = step };
            return 0;
        }
    }
    snprintf(err, errlen, "'%s': WHERE '%s' must be forward, backward, collective, step, save or hang", text,
             where);
    return -1;
}

int fault_strikes(const Fault *fault, int rank, int step, FaultSite where, const char *rendezvous, char *report,
                  size_t report_len) {
    int strikes = fault->where == where && where != FAULT_NONE && fault->rank == rank && fault->step == step;
    if (strikes && report)
        snprintf(report, report_len, "injected fault (--inject-fault) at step %d in the %s%s%s%s", step,
                 fault_site_name(where), rendezvous ? " '" : "", rendezvous ? rendezvous : "", rendezvous ? "'" : "");
    return strikes;
}

/* ZF_INJECT_NAN as parsed: NAN_NONE when unset or malformed. */
static struct {
    NanTarget what;
    unsigned first, count;
} nan_spec;
static pthread_once_t nan_spec_once = PTHREAD_ONCE_INIT;

static void nan_spec_read(void) {
    const char *spec = getenv("ZF_INJECT_NAN");
    char what[8];
    unsigned first, count = 1;
    if (!spec || sscanf(spec, "%7[a-z]:%u:%u", what, &first, &count) < 2) return;
    nan_spec.what = strcmp(what, "loss") == 0     ? NAN_LOSS
                    : strcmp(what, "grad") == 0   ? NAN_GRAD
                    : strcmp(what, "weight") == 0 ? NAN_WEIGHT
                                                  : NAN_NONE;
    nan_spec.first = first;
    nan_spec.count = count;
}

NanTarget nan_injected_at(uint32_t step) {
    pthread_once(&nan_spec_once, nan_spec_read);
    if (step < nan_spec.first || step - nan_spec.first >= nan_spec.count) return NAN_NONE;
    return nan_spec.what;
}

int signal_injected_at(int iter) {
    const char *spec = getenv("ZF_INJECT_SIGNAL");
    int sig, at;
    return spec && sscanf(spec, "%d:%d", &sig, &at) == 2 && at == iter ? sig : 0;
}
