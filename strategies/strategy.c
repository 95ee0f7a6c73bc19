/* strategy.c: choosing a strategy by its ZeRO stage. */
#include <stdio.h>

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
