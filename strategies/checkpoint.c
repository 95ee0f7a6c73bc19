/* checkpoint.c: a strategy's state to and from the checkpoint file (checkpoint.h). */
#include "checkpoint.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../model/hf_gpt2.h"
#include "../runtime/host.h"
#include "../runtime/world.h"

/* The message of a state that must not be saved: the first tensor, in the
 * file's order, that holds a NaN or an infinity. */
static void name_first_nonfinite(const StTensor *t, int n, char *err, size_t errlen) {
    for (int i = 0; i < n; i++) {
        size_t numel = (size_t)(t[i].ndim > 0 ? t[i].shape[0] : 1) * (size_t)(t[i].ndim > 1 ? t[i].shape[1] : 1);
        const float *x = t[i].data;
        size_t bad = safetensors_first_nonfinite(x, numel);
        if (bad < numel) {
            snprintf(err, errlen, "the state is not finite ('%s' element %zu is %g); nothing was saved", t[i].name,
                     bad, x[bad]);
            return;
        }
    }
    snprintf(err, errlen, "the state is not finite (in its padding); nothing was saved");
}

int checkpoint_save(Strategy *s, const char *path, const CheckpointInfo *info, char *err, size_t errlen) {
    if (s->cfg.model.kind != MODEL_GPT) {
        snprintf(err, errlen, "checkpoints hold GPTs only");
        return -1;
    }
    if (errlen > 0) err[0] = 0;
    /* every rank checks its shards before anything is gathered or written */
    size_t nonfinite = s->ops->count_nonfinite(s, NONFINITE_STATE);
    ArenaLayout layout;
    model_layout(&s->cfg.model, 1, &layout);
    float *w = host_calloc(layout.total, sizeof(float)), *m = host_calloc(layout.total, sizeof(float)),
          *v = host_calloc(layout.total, sizeof(float));
    s->ops->read_weights(s, w);
    s->ops->read_state(s, m, v);
    int n = 3 * layout.ntensors + 1;
    StTensor *t = host_calloc((size_t)n, sizeof *t);
    char (*names)[CHECKPOINT_NAME_MAX] = host_calloc((size_t)2 * layout.ntensors, CHECKPOINT_NAME_MAX);
    for (int i = 0; i < layout.ntensors; i++) {
        const TensorSpec *ts = &layout.tensors[i];
        snprintf(names[2 * i], CHECKPOINT_NAME_MAX, "%s%s", CHECKPOINT_M_PREFIX, ts->name);
        snprintf(names[2 * i + 1], CHECKPOINT_NAME_MAX, "%s%s", CHECKPOINT_V_PREFIX, ts->name);
        StTensor spec = { ts->name, "F32", ts->ndim, { ts->shape[0], ts->shape[1] }, w + ts->offset };
        t[i] = spec;
        spec.name = names[2 * i];
        spec.data = m + ts->offset;
        t[layout.ntensors + 1 + 2 * i] = spec;
        spec.name = names[2 * i + 1];
        spec.data = v + ts->offset;
        t[layout.ntensors + 2 + 2 * i] = spec;
    }
    const TensorSpec *wte = &layout.tensors[arena_find(&layout, "transformer.wte.weight")];
    t[layout.ntensors] = (StTensor){ CHECKPOINT_HEAD, "F32", 2, { wte->shape[0], wte->shape[1] }, w + wte->offset };
    int rc = -1;
    int faulty_rank = s->cfg.fault.rank;
    if (fault_strikes(&s->cfg, faulty_rank, info->iter, FAULT_SAVE) && faulty_rank < s->cfg.nranks) {
        /* its shards gathered, the rank fails before anything is written */
        snprintf(err, errlen, "rank %d: injected fault (--inject-fault) at step %d in the save; nothing was saved",
                 faulty_rank, info->iter);
    } else if (nonfinite == 0 && world()->proc == 0) {
        char *meta = checkpoint_metadata_json(info);
        rc = safetensors_write(path, t, n, meta, err, errlen);
        free(meta);
    } else if (nonfinite == 0) {
        rc = 0;  /* process 0 writes; its outcome is every process's, below */
    } else {
        name_first_nonfinite(t, n, err, errlen);
    }
    world_broadcast(&rc, sizeof rc, "the save's outcome");
    world_broadcast(err, errlen, "the save's outcome");
    free(names);
    free(t);
    free(w);
    free(m);
    free(v);
    return rc;
}

int checkpoint_load(Strategy *s, const char *path, int with_state, CheckpointInfo *info, char *err,
                    size_t errlen) {
    StFile f;
    if (s->cfg.model.kind != MODEL_GPT) {
        snprintf(err, errlen, "checkpoints hold GPTs only");
        return -1;
    }
    ArenaLayout layout;
    model_layout(&s->cfg.model, 1, &layout);
    float *w = host_calloc(layout.total, sizeof(float)), *m = host_calloc(layout.total, sizeof(float)),
          *v = host_calloc(layout.total, sizeof(float));
    /* process 0 alone reads the file (no shared filesystem needed); the
     * write_* ops send every process its part */
    int rc = -1;
    memset(info, 0, sizeof *info);
    if (errlen > 0) err[0] = 0;
    HfGpt2 hf;
    if (world()->proc == 0 && !with_state && hf_gpt2_at(path)) {
        rc = hf_gpt2_open(path, &hf, err, errlen) == 0 ? hf_gpt2_read_weights(&hf, &s->cfg.model, w, err, errlen) : -1;
        *info = (CheckpointInfo){ .model = s->cfg.model, .foreign = 1, .hf_vocab = hf.model.vocab };
    } else if (world()->proc == 0 && safetensors_open(&f, path, err, errlen) == 0) {
        rc = checkpoint_check(&f, path, &s->cfg.model, with_state, info, w, m, v, err, errlen);
        safetensors_close(&f);
    }
    world_broadcast(&rc, sizeof rc, "the checkpoint's check");
    world_broadcast(err, errlen, "the checkpoint's check");
    world_broadcast(info, sizeof *info, "the checkpoint's metadata");
    if (rc == 0) {
        s->ops->write_weights(s, w);
        if (with_state) {
            s->ops->write_state(s, m, v);
            s->adam_step = info->adam_step;
        }
    }
    free(w);
    free(m);
    free(v);
    return rc;
}
