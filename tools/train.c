/* train.c: bin/train, the trainer's command line. */
#include <stdio.h>
#include <stdlib.h>

#include "../kernels/cpu/blas_setup.h"
#include "../model/gpt.h"
#include "../strategies/trainer.h"
#include "options.h"

int main(int argc, char **argv) {
    const char *blas = blas_ensure_core(argv);
    TrainOptions o;
    int rc = options_parse(&o, "train", "char-small", argc, argv);
    if (rc) return rc == 1 ? 0 : 2;

    Dataset data;
    char err[512];
    if (dataset_load(&data, o.data, o.block, err, sizeof err) != 0) {
        fprintf(stderr, "train: %s\n", err);
        return 1;
    }
    StrategyConfig sc = {
        .model = { data.vocab, o.block, o.layers, o.heads, o.embd, MODEL_GPT },
        .nranks = o.gpus, .device = options_placement(&o), .batch = o.batch, .dropout = o.dropout, .seed = (uint32_t)o.seed,
        .beta1 = 0.9f, .beta2 = o.beta2, .eps = 1e-8f, .weight_decay = o.weight_decay,
        .overlap = o.overlap, .bucket_bytes = (size_t)(o.bucket_mb * 1e6),
    };
    options_link(&o, &sc.link_gbps, &sc.link_latency_us);
    const char *bad = gpt_config_error(&sc.model);
    if (bad) {
        fprintf(stderr, "train: %s\n", bad);
        dataset_free(&data);
        return 2;
    }
    FILE *log = NULL;
    if (o.log[0] && !(log = fopen(o.log, "w"))) {
        fprintf(stderr, "train: cannot write --log file '%s'\n", o.log);
        dataset_free(&data);
        return 1;
    }

    Strategy *s = strategy_create(o.zero, &sc);
    if (!s) {
        dataset_free(&data);
        if (log) fclose(log);
        return 2;
    }

    const char *refused = NULL;
    if (o.tf32 && s->device_kind != DEVICE_CUDA) refused = "--tf32=1 needs a GPU, and the ranks run on the CPU";
    if (sc.link_gbps > 0 && !s->simulated) refused = "--link models a link for simulated ranks; these run on GPUs through NCCL";
    if (refused) {
        fprintf(stderr, "train: %s\n", refused);
        s->ops->destroy(s);
        dataset_free(&data);
        if (log) fclose(log);
        return 2;
    }
    device_cuda_set_tf32(o.tf32);
    printf("device: %s\n", s->placement);
    if (sc.link_gbps > 0)
        printf("link: modeled, %g GB/s and %g us per hop, ring collectives (simulated ranks share one device)\n",
               sc.link_gbps, sc.link_latency_us);
    printf("blas: %s\n", blas);
    ArenaLayout layout;
    model_layout(&sc.model, 1, &layout);
    printf("data: %s, %zu characters, vocabulary %d, %zu train / %zu val tokens\n",
           o.data, data.ntokens, data.vocab, data.ntrain, data.ntokens - data.ntrain);
    printf("model: preset %s, %d layers, %d heads, %d wide, block %d, %.2fM parameters\n",
           o.preset, o.layers, o.heads, o.embd, o.block, layout.numel / 1e6);
    printf("training: %s, %d iters, batch %d x %d ranks, lr %g -> %g, warmup %d, dropout %g, "
           "grad clip %g, seed %d, overlap %s\n", s->name, o.iters, o.batch, o.gpus, o.lr, o.min_lr,
           o.warmup, o.dropout, o.grad_clip, o.seed, o.overlap ? "on" : "off");
    fflush(stdout);

    printf("memory of rank 0: weights %.1f MB, gradients %.1f MB, optimizer %.1f MB, "
           "working %.1f MB, activations %.1f MB\n", s->ops->rank_bytes(s, 0, MEM_WEIGHTS) / 1e6,
           s->ops->rank_bytes(s, 0, MEM_GRADS) / 1e6, s->ops->rank_bytes(s, 0, MEM_OPTIMIZER) / 1e6,
           s->ops->rank_bytes(s, 0, MEM_WORKING) / 1e6, s->ops->rank_bytes(s, 0, MEM_ACTIVATIONS) / 1e6);
    TrainConfig tc = {
        .iters = o.iters,
        .schedule = { o.lr, o.min_lr, o.warmup, o.decay_iters < 0 ? o.iters : o.decay_iters },
        .grad_clip = o.grad_clip, .eval_every = o.eval_every, .eval_iters = o.eval_iters,
        .log_every = o.log_every, .sample_chars = o.sample_chars, .out = stdout, .log = log,
    };
    TrainResult result;
    int status = train_run(s, &tc, &data, &result);
    if (status == 0 && o.eval_iters > 0)
        printf("done: %d iters in %.1f s of steps, final val loss %.4f\n",
               o.iters, result.seconds, result.val_loss);
    else if (status == 0)
        printf("done: %d iters in %.1f s of steps (no evaluation: --eval-iters=0)\n",
               o.iters, result.seconds);
    s->ops->destroy(s);
    dataset_free(&data);
    if (log) fclose(log);
    return status;
}
