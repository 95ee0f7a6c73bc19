/* strategy.c: choosing a strategy by its ZeRO stage. */
#include <stdio.h>

#include "strategy.h"

Strategy *strategy_create(int zero, const StrategyConfig *cfg) {
    switch (zero) {
    case 0: return ddp_create(cfg);
    case 1: return zero1_create(cfg);
    default:
        fprintf(stderr, "error: --zero=%d: ZeRO-2 and ZeRO-3 arrive in a later issue\n", zero);
        return NULL;
    }
}
