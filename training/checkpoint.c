/* checkpoint.c: a strategy's state to and from the checkpoint file (checkpoint.h). */
#include "checkpoint.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../model/hf_gpt2.h"
#include "../model/models.h"
#include "../runtime/host.h"
#include "../runtime/world.h"

/* The file's tensors in the order their data is written: the weights, the
 * head (a copy of the token embedding) right after it, then Adam's m, then
 * v: so a save holds one tensor at a time. */
typedef struct {
    int n;
    StTensor *specs;          /* the header's entries, data unset */
    StateOf *what;
    int *tensor;              /* of the layout at nranks = 1 */
    int head;                 /* the head's entry */
    char (*names)[CHECKPOINT_NAME_MAX];
    size_t most;              /* floats of the largest tensor */
} FileOrder;

static FileOrder file_order(const ArenaLayout *layout) {
    FileOrder o = { .n = 3 * layout->ntensors + 1, .most = arena_largest_tensor(layout) };
    o.specs = host_calloc((size_t)o.n, sizeof *o.specs);
    o.what = host_calloc((size_t)o.n, sizeof *o.what);
    o.tensor = host_calloc((size_t)o.n, sizeof *o.tensor);
    o.names = host_calloc((size_t)o.n, CHECKPOINT_NAME_MAX);
    int wte = arena_find(layout, "transformer.wte.weight"), k = 0;
    static const char *const prefix[STATE_KINDS] = { "", CHECKPOINT_M_PREFIX, CHECKPOINT_V_PREFIX };
    for (int what = STATE_WEIGHTS; what < STATE_KINDS; what++) {
        for (int i = 0; i < layout->ntensors; i++) {
            const TensorSpec *ts = &layout->tensors[i];
            for (int copy = 0; copy < (what == STATE_WEIGHTS && i == wte ? 2 : 1); copy++, k++) {
                if (copy) o.head = k;
                snprintf(o.names[k], CHECKPOINT_NAME_MAX, "%s%s", prefix[what], copy ? CHECKPOINT_HEAD : ts->name);
                o.specs[k] = (StTensor){ o.names[k], "F32", ts->ndim, { ts->shape[0], ts->shape[1] }, NULL };
                o.what[k] = (StateOf)what;
                o.tensor[k] = i;
            }
        }
    }
    return o;
}

static void file_order_free(FileOrder *o) {
    free(o->specs);
    free(o->what);
    free(o->tensor);
    free(o->names);
}

/* The message of a state that must not be saved: its first tensor, in the
 * file's order, that holds a NaN or an infinity; 1 once named. */
static int name_nonfinite(const StTensor *spec, const float *x, size_t numel, char *err, size_t errlen) {
    size_t bad = safetensors_first_nonfinite(x, numel);
    if (bad == numel) return 0;
    snprintf(err, errlen, "the state is not finite ('%s' element %zu is %g); nothing was saved", spec->name, bad,
             x[bad]);
    return 1;
}

int checkpoint_save(Strategy *s, const char *path, const CheckpointInfo *info, char *err, size_t errlen) {
    if (s->cfg.model.kind != MODEL_GPT) {
        snprintf(err, errlen, "checkpoints hold GPTs only");
        return -1;
    }
    if (errlen > 0) err[0] = 0;
    /* every rank checks its shards before anything is gathered or written */
    size_t nonfinite = s->ops->count_nonfinite(s, NONFINITE_STATE);
    int root = world()->proc == 0, faulty_rank = s->cfg.diagnostics.fault.rank;
    char report[200];
    if (faulty_rank < s->cfg.nranks &&
        fault_strikes(&s->cfg.diagnostics.fault, faulty_rank, info->iter, FAULT_SAVE, NULL, report, sizeof report)) {
        snprintf(err, errlen, "rank %d: %s; nothing was saved", faulty_rank, report);
        return -1;
    }
    ArenaLayout layout;
    model_layout(&s->cfg.model, 1, &layout);
    FileOrder order = file_order(&layout);
    StWriter writer;
    int rc = 0;
    if (root && nonfinite == 0) {
        char *meta = checkpoint_metadata_json(info);
        rc = safetensors_begin(&writer, path, order.specs, order.n, meta, err, errlen);
        free(meta);
    }
    world_broadcast(&rc, sizeof rc, "the save's start");
    float *tensor = root ? host_calloc(order.most, sizeof(float)) : NULL;
    int named = 0;
    for (int k = 0; rc == 0 && k < order.n; k++) {
        const TensorSpec *ts = &layout.tensors[order.tensor[k]];
        if (k != order.head) s->ops->read_tensor(s, order.what[k], order.tensor[k], tensor);  /* the head: the same */
        if (root && nonfinite == 0) safetensors_append(&writer, tensor, ts->numel * sizeof(float));
        else if (root && !named) named = name_nonfinite(&order.specs[k], tensor, ts->numel, err, errlen);
    }
    if (rc == 0 && nonfinite > 0) {
        if (!named) snprintf(err, errlen, "the state is not finite (in its padding); nothing was saved");
        rc = -1;
    } else if (rc == 0 && root) {
        rc = safetensors_finish(&writer, err, errlen);
    }
    world_broadcast(&rc, sizeof rc, "the save's outcome");
    world_broadcast(err, errlen, "the save's outcome");
    free(tensor);
    file_order_free(&order);
    return rc;
}

int checkpoint_load(Strategy *s, const char *path, int with_state, CheckpointInfo *info, char *err,
                    size_t errlen) {
    if (s->cfg.model.kind != MODEL_GPT) {
        snprintf(err, errlen, "checkpoints hold GPTs only");
        return -1;
    }
    /* process 0 alone reads the file (no shared filesystem needed): it checks
     * every tensor, then reads each again and write_tensor sends every rank
     * its part */
    int rc = -1, root = world()->proc == 0, from_hf = root && !with_state && hf_gpt2_at(path);
    memset(info, 0, sizeof *info);
    if (errlen > 0) err[0] = 0;
    HfGpt2 hf;
    StFile f;
    memset(&f, 0, sizeof f);
    if (from_hf) {
        rc = hf_gpt2_open(path, &hf, err, errlen) == 0 && safetensors_open_header(&f, hf.weights_path, err, errlen) == 0
                 ? hf_gpt2_check(&hf, &f, &s->cfg.model, err, errlen)
                 : -1;
        if (rc == HF_GPT2_OTHER_MODEL) rc = CHECKPOINT_OTHER_MODEL;
        *info = (CheckpointInfo){ .model = s->cfg.model, .foreign = 1, .hf_vocab = hf.model.vocab };
    } else if (root && safetensors_open_header(&f, path, err, errlen) == 0) {
        rc = checkpoint_check(&f, path, &s->cfg.model, with_state, info, NULL, NULL, NULL, err, errlen);
    }
    world_broadcast(&rc, sizeof rc, "the checkpoint's check");
    world_broadcast(err, errlen, "the checkpoint's check");
    world_broadcast(info, sizeof *info, "the checkpoint's metadata");
    ArenaLayout layout;
    model_layout(&s->cfg.model, 1, &layout);
    size_t most = arena_largest_tensor(&layout);
    float *tensor = root && rc == 0 ? host_calloc(most, sizeof(float)) : NULL;
    int read_rc = 0;
    for (int what = STATE_WEIGHTS; rc == 0 && what < (with_state ? STATE_KINDS : STATE_EXP_AVG); what++) {
        for (int i = 0; i < layout.ntensors; i++) {
            if (root && read_rc == 0)
                read_rc = from_hf ? hf_gpt2_read_tensor(&hf, &f, &s->cfg.model, i, tensor, err, errlen)
                                  : checkpoint_read_tensor(&f, path, (StateOf)what, &layout.tensors[i], tensor, err,
                                                           errlen);
            s->ops->write_tensor(s, (StateOf)what, i, tensor);
        }
    }
    if (rc == 0) {
        /* a file changed under the load since its check */
        world_broadcast(&read_rc, sizeof read_rc, "the checkpoint's load");
        world_broadcast(err, errlen, "the checkpoint's load");
        rc = read_rc;
    }
    if (rc == 0 && with_state) s->adam_step = info->adam_step;
    free(tensor);
    safetensors_close(&f);
    return rc;
}
