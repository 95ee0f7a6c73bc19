/* models.h: the models by kind: what dispatches on cfg->kind to nanoGPT's GPT
 * (model/gpt.h) or the small MLP (model/mlp.h).
 *
 * Why a file of its own: gpt.c and mlp.c build on the base every model shares
 * (model/model.h), so the table of kinds sits above all three, and the base
 * names neither model.
 */
#ifndef ZF_MODELS_H
#define ZF_MODELS_H

#include "model.h"

/* The unit-by-unit layout, units padded to shard_multiple: whole blocks
 * (UNIT_BLOCK), as the host's copies of a state and checkpoints lay it out. */
void model_layout(const ModelConfig *cfg, int shard_multiple, ArenaLayout *layout);
/* The same tensors in the units of a policy. */
void model_layout_units(const ModelConfig *cfg, UnitPolicy unit, int shard_multiple, ArenaLayout *layout);

/* What model_create and model_alloc_activations will take from a device of
 * that kind for a GPT of cfg (the MLP's are not estimated), added to bytes[kind]:
 * its activations and batch buffers (MEM_ACTIVATIONS), and its reductions'
 * scratch (MEM_WORKING). Nothing is allocated. */
void model_estimate(const ModelConfig *cfg, UnitPolicy unit, ComputePolicy compute, int shard_multiple, DeviceKind kind,
                    int max_B, int max_T, double bytes[MEM_KINDS]);
/* A model of cfg->kind over a layout of cfg from model_layout_units (which
 * the model copies), with activations for up to max_B x max_T, no arenas;
 * computing as gpt_create's. */
Model *model_create(const ModelConfig *cfg, const ArenaLayout *layout, ComputePolicy compute, Device *dev, Stream *stream,
                    int max_B, int max_T);

#endif
