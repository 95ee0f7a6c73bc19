/* gpt_layout.c: the GPT's shape checks and its parameter table, by nanoGPT's
 * names (apart from gpt.c, so that a checkpoint's reader needs no kernels). */
#include <stdio.h>

#include "gpt.h"

const char *gpt_config_error(const ModelConfig *cfg) {
    static char msg[128];
    if (cfg->vocab < 1 || cfg->vocab > (1 << 24)) return "vocab must be in 1..16777216";
    if (cfg->block_size < 1) return "--block must be at least 1";
    if (cfg->layers < 1) return "--layers must be at least 1";
    long per_block = cfg->bias ? 12 : 6, root = cfg->bias ? 4 : 3;
    if (root + per_block * cfg->layers > ARENA_MAX_TENSORS || 1 + 4 * (long)cfg->layers > ARENA_MAX_UNITS) {  /* the finest units */
        snprintf(msg, sizeof msg, "--layers=%d is more than the arena's tables hold (at most %ld%s)", cfg->layers,
                 (ARENA_MAX_TENSORS - root) / per_block, cfg->bias ? " with --bias=1" : "");
        return msg;
    }
    if (cfg->bias != 0 && cfg->bias != 1) return "--bias must be 0 or 1";
    if (cfg->heads < 1) return "--heads must be at least 1";
    if (cfg->embd < 1) return "--embd must be at least 1";
    if (cfg->embd % cfg->heads != 0) {
        snprintf(msg, sizeof msg, "--embd=%d is not divisible by --heads=%d", cfg->embd, cfg->heads);
        return msg;
    }
    return NULL;
}

void gpt_layout(const ModelConfig *cfg, int shard_multiple, ArenaLayout *layout) {
    gpt_layout_units(cfg, UNIT_BLOCK, shard_multiple, layout);
}

void gpt_layout_units(const ModelConfig *cfg, UnitPolicy unit, int shard_multiple, ArenaLayout *layout) {
    int C = cfg->embd;
    char name[ARENA_NAME_MAX];
    arena_init(layout, shard_multiple);
    arena_begin_unit(layout);
    arena_add_tensor(layout, "transformer.wte.weight", cfg->vocab, C);
    arena_add_tensor(layout, "transformer.wpe.weight", cfg->block_size, C);
    arena_add_tensor(layout, "transformer.ln_f.weight", C, 0);
    if (cfg->bias) arena_add_tensor(layout, "transformer.ln_f.bias", C, 0);
    arena_end_unit(layout);
    /* per block, in the order the forward uses them, each weight followed by
     * its bias (with cfg->bias, in the weight's unit); which policies open a
     * unit there */
    static const struct { const char *part; int rows, cols; int opens[UNIT_POLICIES]; } block[] = {
        { "ln_1", 1, 0, .opens = { [UNIT_BLOCK] = 1, [UNIT_HALF] = 1, [UNIT_TENSOR] = 1 } },
        { "attn.c_attn", 3, 1, .opens = { 0 } },
        { "attn.c_proj", 1, 1, .opens = { [UNIT_TENSOR] = 1 } },
        { "ln_2", 1, 0, .opens = { [UNIT_HALF] = 1, [UNIT_TENSOR] = 1 } },
        { "mlp.c_fc", 4, 1, .opens = { 0 } },
        { "mlp.c_proj", 1, 4, .opens = { [UNIT_TENSOR] = 1 } },
    };
    for (int l = 0; l < cfg->layers; l++) {
        for (int i = 0; i < 6; i++) {
            if (block[i].opens[unit]) {
                if (i > 0) arena_end_unit(layout);
                arena_begin_unit(layout);
            }
            snprintf(name, sizeof name, "transformer.h.%d.%s.weight", l, block[i].part);
            arena_add_tensor(layout, name, block[i].rows * C, block[i].cols * C);
            if (!cfg->bias) continue;
            snprintf(name, sizeof name, "transformer.h.%d.%s.bias", l, block[i].part);
            arena_add_tensor(layout, name, block[i].rows * C, 0);
        }
        arena_end_unit(layout);
    }
}
