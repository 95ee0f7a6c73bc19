/* tsan_main.c: the ThreadSanitizer run, without Criterion (which cannot start
 * under ThreadSanitizer, Snaipe/Criterion#274): streams and events from several
 * host threads, then short training runs of every strategy, DDP on 1 rank and
 * ZeRO-1, 2 and 3 on 3 (the rank threads, the baton, the collectives inside the
 * backward, overlapped on a modeled link), with dropout, clipping, evaluation
 * and sampling.
 * Exits non-zero on a wrong result; ThreadSanitizer exits non-zero on a race. */
#include <stdio.h>

#include "../training/trainer.h"
#include "stream_stress.h"

int main(void) {
    Device *dev = device_create_cpu(1, -1);
    int wrong = stream_stress(dev, 4, 200);
    device_destroy(dev);
    if (wrong) {
        fprintf(stderr, "tsan: %d reads ran before their writes\n", wrong);
        return 1;
    }

    Dataset data;
    char err[256];
    if (dataset_load(&data, "data/tinyshakespeare.txt", 16, err, sizeof err) != 0) {
        fprintf(stderr, "tsan: %s\n", err);
        return 1;
    }
    int status = 0;
    for (int k = 0; k < STRATEGY_KINDS; k++) {
        int zero = STRATEGIES[k].stage;
        StrategyConfig sc = {
            .model = { data.vocab, 16, 2, 2, 16, MODEL_GPT, 0, 0 }, .nranks = zero ? 3 : 1, .batch = 4, .dropout = 0.1f,
            .seed = 1, .beta1 = 0.9f, .beta2 = 0.99f, .eps = 1e-8f, .weight_decay = 0.1f,
            .overlap = { .enabled = 1, .bucket_bytes = 4096 }, .link = { 1.0, 10 },
        };
        Strategy *s = strategy_create(zero, &sc);
        TrainConfig tc = {
            .iters = 6, .schedule = { 1e-3f, 1e-4f, 2, 6 }, .grad_clip = 1.0f, .eval_every = 3,
            .eval_iters = 2, .log_every = 0, .sample_chars = 20,
        };
        TrainResult r;
        status |= train_run(s, &tc, &data, &r);
        s->ops->destroy(s);
    }
    dataset_free(&data);
    printf("tsan: streams, DDP on 1 rank and ZeRO-1, 2 and 3 on 3 ranks finished %s\n",
           status ? "with an error" : "cleanly");
    return status;
}
