/* models.c: the models by kind: layout, creation and estimate, each passed on
 * to the GPT or the MLP as cfg->kind says. */
#include "models.h"

#include "../kernels/kernels.h"
#include "gpt.h"
#include "mlp.h"
#include "optim.h"

void model_layout(const ModelConfig *cfg, int shard_multiple, ArenaLayout *layout) {
    model_layout_units(cfg, UNIT_BLOCK, shard_multiple, layout);
}

void model_layout_units(const ModelConfig *cfg, UnitPolicy unit, int shard_multiple, ArenaLayout *layout) {
    if (cfg->kind == MODEL_MLP)
        mlp_layout(cfg, shard_multiple, layout);
    else
        gpt_layout_units(cfg, unit, shard_multiple, layout);
}

Model *model_create(const ModelConfig *cfg, const ArenaLayout *layout, ComputePolicy compute, Device *dev,
                    Stream *stream, int max_B, int max_T) {
    if (cfg->kind == MODEL_MLP) return &mlp_create(cfg, layout, dev, stream, max_B, max_T)->base;
    return &gpt_create(cfg, layout, compute, dev, stream, max_B, max_T)->base;
}

void model_estimate(const ModelConfig *cfg, UnitPolicy unit, ComputePolicy compute, int shard_multiple, DeviceKind kind,
                    int max_B, int max_T, double bytes[MEM_KINDS]) {
    ArenaLayout layout;
    model_layout_units(cfg, unit, shard_multiple, &layout);
    size_t positions = (size_t)max_B * max_T;
    bytes[MEM_ACTIVATIONS] += (double)gpt_activation_floats(cfg, kind, compute, max_B, max_T) * sizeof(float) +
                              (double)model_batch_ints(positions) * sizeof(int);
    bytes[MEM_WORKING] += (double)column_sums_scratch_floats((int)positions, COLUMN_SUMS_WIDEST * cfg->embd) *
                              sizeof(float) +
                          (double)sumsq_scratch_bytes(layout.total) +
                          (double)adamw_spans_bytes(&layout) +
                          (double)gpt_staging_bytes(cfg, kind, compute, max_B, max_T);
}
