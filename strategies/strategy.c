/* strategy.c: choosing a strategy by its ZeRO stage; the injected faults. */
#include <stdio.h>
#include <string.h>

#include "strategy.h"

Strategy *strategy_create(int zero, const StrategyConfig *cfg) {
    switch (zero) {
    case 0: return ddp_create(cfg);
    case 1: return zero1_create(cfg);
    case 2: return zero2_create(cfg);
    case 3: return zero3_create(cfg);
    default:
        fprintf(stderr, "error: --zero=%d: expected 0 (DDP), 1, 2 or 3\n", zero);
        return NULL;
    }
}

static const char *const FAULT_SITE_NAMES[FAULT_SITES] = {
    [FAULT_NONE] = "none", [FAULT_FORWARD] = "forward", [FAULT_BACKWARD] = "backward",
    [FAULT_COLLECTIVE] = "collective", [FAULT_STEP] = "step", [FAULT_SAVE] = "save",
};

const char *fault_site_name(FaultSite where) { return FAULT_SITE_NAMES[where]; }

int fault_parse(const char *text, Fault *fault, char *err, size_t errlen) {
    char where[16];
    int rank, step, used = 0;
    if (sscanf(text, "%d:%d:%15[a-z]%n", &rank, &step, where, &used) != 3 || text[used] != 0) {
        snprintf(err, errlen, "'%s' must be RANK:STEP:WHERE (WHERE: forward, backward, collective, step, save)", text);
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
    snprintf(err, errlen, "'%s': WHERE '%s' must be forward, backward, collective, step or save", text, where);
    return -1;
}

int fault_strikes(const StrategyConfig *cfg, int rank, int step, FaultSite where) {
    return cfg->fault.where == where && where != FAULT_NONE && cfg->fault.rank == rank && cfg->fault.step == step;
}
