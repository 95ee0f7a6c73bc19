/* test_flags.c: the tools' flags and bin/train's data: bad flags and values in one line, --help,
 * each tool's own flags, what tells two processes apart, data it takes as it is. */
#include <criterion/criterion.h>
#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <sys/resource.h>
#include <unistd.h>

#include "../kernels/backend.h"  /* cuda_kernel_ops: whether this build has CUDA */
#include "../model/models.h"
#include "../runtime/host.h"
#include "../training/checkpoint.h"
#include "../training/trainer.h"
#include "../tools/options.h"
#include "fixtures.h"
#include "reference.h"

static Dataset data;

static void setup(void) {
    char err[256];
    cr_assert_eq(dataset_load(&data, "data/tinyshakespeare.txt", 32, err, sizeof err), 0, "%s", err);
}

static void teardown(void) { dataset_free(&data); }

TestSuite(flags, .init = setup, .fini = teardown);

/* Malformed, out-of-range and conflicting values of every tool's flags: each
 * its own one-line message and exit 2 (empty values: the test after next). */
Test(flags, bad_flags_exit_2_with_one_line, .timeout = 60) {
    enum { TRAIN, SAMPLE, ZERO_MEMORY };
    static const struct { int tool; const char *args, *needle; } cases[] = {
        { TRAIN, "--bogus=1", "unknown flag '--bogus'" },
        { TRAIN, "--=", "unknown flag '--'" },
        { TRAIN, "-x", "unexpected argument '-x'" },
        { TRAIN, "stray", "unexpected argument 'stray'" },
        { TRAIN, "--iters", "--iters needs a value" },
        { TRAIN, "--preset=huge", "unknown --preset 'huge'" },
        { TRAIN, "--iters=abc", "--iters expects an integer, got 'abc'" },
        { TRAIN, "--iters=1e3", "--iters expects an integer, got '1e3'" },
        { TRAIN, "--iters=0x10", "--iters expects an integer, got '0x10'" },
        { TRAIN, "--iters=-1", "--iters=-1 must not be negative" },
        { TRAIN, "--seed=1.5", "--seed expects an integer, got '1.5'" },
        { TRAIN, "--lr=fast", "--lr expects a decimal number, got 'fast'" },
        { TRAIN, "--lr=1e-3x", "--lr expects a decimal number, got '1e-3x'" },
        { TRAIN, "--lr=nan", "--lr expects a decimal number, got 'nan'" },
        { TRAIN, "--lr=inf", "--lr expects a decimal number, got 'inf'" },
        { TRAIN, "--lr=1e39", "--lr=1e39 is out of range (a finite 32-bit float)" },
        { TRAIN, "--lr=0x1p-3", "--lr expects a decimal number, got '0x1p-3'" },
        { TRAIN, "--iters=' 5'", "--iters expects an integer, got ' 5'" },
        { TRAIN, "--lr=0", "--lr=0 must be positive" },
        { TRAIN, "--lr=-1", "--lr=-1 must be positive" },
        { TRAIN, "--min-lr=-0.1", "--min-lr=-0.1 must not be negative" },
        { TRAIN, "--warmup=-5", "--warmup=-5 must not be negative" },
        { TRAIN, "--lr-decay-iters=x", "--lr-decay-iters expects an integer, got 'x'" },
        { TRAIN, "--layers=0", "--layers=0 must be in 1..170" },
        { TRAIN, "--layers=200", "--layers=200 must be in 1..170" },
        { TRAIN, "--heads=0", "--heads=0 must be at least 1" },
        { TRAIN, "--heads=-2", "--heads=-2 must be at least 1" },
        { TRAIN, "--embd=0", "--embd=0 must be at least 1" },
        { TRAIN, "--embd=100 --heads=3", "--embd=100 is not divisible by --heads=3" },
        { TRAIN, "--block=0", "--block=0 must be at least 1" },
        { TRAIN, "--batch=0", "--batch=0 (rows per rank) must be at least 1" },
        { TRAIN, "--batch=-3", "--batch=-3 (rows per rank) must be at least 1" },
        { TRAIN, "--embd=600000000 --heads=1", "exceed 2^31 floats" },
        { TRAIN, "--block=100000", "exceed 2^31 floats" },
        { TRAIN, "--gpus=0", "--gpus=0 must be in 1..64" },
        { TRAIN, "--gpus=65", "--gpus=65 must be in 1..64" },
        { TRAIN, "--gpus=x", "--gpus expects an integer, got 'x'" },
        { TRAIN, "--zero=4", "--zero=4 must be 0, 1, 2 or 3" },
        { TRAIN, "--zero=-1", "--zero=-1 must be 0, 1, 2 or 3" },
        { TRAIN, "--zero=x", "--zero expects an integer, got 'x'" },
        { TRAIN, "--device=tpu", "--device=tpu must be auto, cpu or cuda" },
        { TRAIN, "--collectives=ring", "--collectives=ring must be ordered or nccl" },
        { TRAIN, "--collectives=NCCL", "--collectives=NCCL must be ordered or nccl" },
        { TRAIN, "--nodes=0", "--nodes=0 must be in 1..64" },
        { TRAIN, "--nodes=2", "--nodes=2 needs --rendezvous=file:PATH" },
        { TRAIN, "--nodes=2 --node-rank=2 --rendezvous=file:/tmp/zf_never", "--node-rank=2 must be in 0..1" },
        { TRAIN, "--node-rank=-1", "--node-rank=-1 must be in 0..0" },
        { TRAIN, "--rendezvous=tcp:host:29500", "--rendezvous=tcp:host:29500 must be file:PATH" },
        { TRAIN, "--nodes=2 --rendezvous=file:/tmp/zf_never --device=cpu", "across processes need mpirun" },
        { TRAIN, "--tf32=2", "--tf32=2 must be 0 or 1" },
        { TRAIN, "--tf32=1", "--tf32=1 needs a GPU, and the ranks run on the CPU" },
        { TRAIN, "--overlap=2", "--overlap=2 must be 0 or 1" },
        { TRAIN, "--bucket-mb=0", "--bucket-mb=0 must be in (0, 4096]" },
        { TRAIN, "--bucket-mb=5000", "--bucket-mb=5000 must be in (0, 4096]" },
        { TRAIN, "--bucket-mb=nan", "--bucket-mb expects a decimal number, got 'nan'" },
        { TRAIN, "--unit=layer", "--unit=layer must be block, half or tensor" },
        { TRAIN, "--unit=Block", "--unit=Block must be block, half or tensor" },
        { TRAIN, "--unit=tensors", "--unit=tensors must be block, half or tensor" },
        { TRAIN, "--max-live-units=0", "--max-live-units=0 must be in 1..8" },
        { TRAIN, "--max-live-units=9", "--max-live-units=9 must be in 1..8" },
        { TRAIN, "--max-live-units=two", "--max-live-units expects an integer, got 'two'" },
        { TRAIN, "--recompute=2", "--recompute=2 must be 0 or 1" },
        { TRAIN, "--graphs=2", "--graphs=2 must be 0 or 1" },
        { TRAIN, "--graphs=1 --link=5", "--graphs=1 cannot run a modeled link" },
        { TRAIN, "--recompute-gelu=2", "--recompute-gelu=2 must be 0 or 1" },
        { TRAIN, "--recompute-norms=-1", "--recompute-norms=-1 must be 0 or 1" },
        { TRAIN, "--gelu=relu", "--gelu=relu must be erf or tanh" },
        { TRAIN, "--recompute=yes", "--recompute expects an integer, got 'yes'" },
        { TRAIN, "--recompute=1 --unit=half", "--recompute=1 recomputes whole blocks: it needs --unit=block, not half" },
        { TRAIN, "--link=abc", "--link=abc must be GBPS or GBPS,LATENCY_US" },
        { TRAIN, "--link=0", "--link=0 must be GBPS or GBPS,LATENCY_US" },
        { TRAIN, "--link=1,-5", "--link=1,-5 must be GBPS or GBPS,LATENCY_US" },
        { TRAIN, "--link=1,2,3", "--link=1,2,3 must be GBPS or GBPS,LATENCY_US" },
        { TRAIN, "--dropout=1.5", "--dropout=1.5 must be in [0, 1)" },
        { TRAIN, "--dropout=1", "--dropout=1 must be in [0, 1)" },
        { TRAIN, "--dropout=-0.1", "--dropout=-0.1 must be in [0, 1)" },
        { TRAIN, "--dropout=0.5.5", "--dropout expects a decimal number, got '0.5.5'" },
        { TRAIN, "--weight-decay=-1", "--weight-decay=-1 must not be negative" },
        { TRAIN, "--beta2=1", "--beta2=1 must be in [0, 1)" },
        { TRAIN, "--beta2=-0.5", "--beta2=-0.5 must be in [0, 1)" },
        { TRAIN, "--grad-clip=-1", "--grad-clip=-1 must not be negative" },
        { TRAIN, "--eval-every=-1", "--eval-every, --eval-iters and --log-every must not be negative" },
        { TRAIN, "--eval-iters=-1", "--eval-every, --eval-iters and --log-every must not be negative" },
        { TRAIN, "--log-every=-1", "--eval-every, --eval-iters and --log-every must not be negative" },
        { TRAIN, "--sample-chars=-5", "the sample's length (--sample-chars or --sample-tokens) is -5: it must not be "
                                      "negative" },
        { TRAIN, "--sample-tokens=-5", "the sample's length (--sample-chars or --sample-tokens) is -5" },
        { TRAIN, "--trace-steps=0", "--trace-steps=0 must be at least 1" },
        { TRAIN, "--trace-steps=-1", "--trace-steps=-1 must be at least 1" },
        { TRAIN, "--grad-accum=0", "--grad-accum=0 must be in 1..1024" },
        { TRAIN, "--grad-accum=2000", "--grad-accum=2000 must be in 1..1024" },
        { TRAIN, "--always-save=2", "--always-save=2 must be 0 or 1" },
        { TRAIN, "--resume=a --init-from=b", "--resume and --init-from exclude each other" },
        { TRAIN, "--max-skips=x", "--max-skips expects an integer, got 'x'" },
        { TRAIN, "--max-memory-mb=lots", "--max-memory-mb expects a decimal number, got 'lots'" },
        { TRAIN, "--temperature=0", "train: --temperature is a flag of bin/sample, not of bin/train" },
        { TRAIN, "--iters=99999999999", "--iters=99999999999 is out of range" },
        { TRAIN, "--seed=-9999999999999999999999", "is out of range" },
        { TRAIN, "--lr=1e99", "--lr=1e99 is out of range" },
        { TRAIN, "--iters=12x", "--iters expects an integer, got '12x'" },
        { TRAIN, "--min-lr=0.01 --lr=0.001", "--min-lr=0.01 is above --lr=0.001" },
        { TRAIN, "--on-nan=maybe", "--on-nan=maybe must be stop or skip" },
        { TRAIN, "--max-skips=-1", "--max-skips=-1 must not be negative" },
        { TRAIN, "--gpus=2 --link=0.000001", "--link=0.000001 would take" },
        { TRAIN, "--gpus=4 --zero=3 --link=10,100000000", "one step's collectives" },
        { TRAIN, "--inject-fault=1:2", "--inject-fault='1:2' must be RANK:STEP:WHERE" },
        { TRAIN, "--inject-fault=0:1:sideways", "WHERE 'sideways' must be forward, backward, collective, step, save or hang" },
        { TRAIN, "--inject-fault=-1:1:step", "RANK and STEP must not be negative" },
        { TRAIN, "--inject-fault=0:1:step:x", "must be RANK:STEP:WHERE" },
        { TRAIN, "--gpus=2 --inject-fault=2:1:forward", "names rank 2, and the run has ranks 0..1" },
        { TRAIN, "--timeout=0", "--timeout=0 must be in [1, 1e6] seconds" },
        { TRAIN, "--timeout=abc", "--timeout" },
        { TRAIN, "--timeout=0.001", "--timeout=0.001 must be in [1, 1e6] seconds" },
        { TRAIN, "--rendezvous=file:/tmp/zf_never", "--rendezvous=file:/tmp/zf_never needs --nodes" },
        { TRAIN, "--iters=10 --inject-fault=0:10:forward", "names step 10, and the run's steps are 0..9 (--iters=10)" },
        { TRAIN, "--iters=10 --inject-fault=0:11:save", "names step 11, and the run's saves hold steps 1..10" },
        { TRAIN, "--overwrite=2", "--overwrite=2 must be 0 or 1" },
        { TRAIN, "--dtype=fp16", "--dtype=fp16 must be fp32 or bf16" },
        { TRAIN, "--dtype=bf15", "--dtype=bf15 must be fp32 or bf16" },
        { TRAIN, "--reduce-dtype=fp16", "--reduce-dtype=fp16 must be fp32 or bf16" },
        { TRAIN, "--zero=3 --gpus=4 --shard-ranks=3", "--shard-ranks=3 must divide the run's 4 ranks" },
        { TRAIN, "--zero=3 --gpus=4 --shard-ranks=8", "--shard-ranks=8 must divide the run's 4 ranks" },
        { TRAIN, "--zero=3 --gpus=4 --shard-ranks=-2", "--shard-ranks=-2 must divide the run's 4 ranks" },
        { TRAIN, "--gpus=4 --shard-ranks=2", "--shard-ranks=2 shards ZeRO-1, 2 or 3's state over groups of ranks; DDP "
                                             "(--zero=0) shards nothing" },
        { TRAIN, "--zero=3 --gpus=4 --link=5 --link-inter=1", "--link-inter models the link between groups of "
                                                            "--shard-ranks, and all 4 ranks are one group" },
        { TRAIN, "--zero=3 --gpus=4 --shard-ranks=2 --link-inter=1", "--link-inter models the link between nodes; it "
                                                                   "needs --link" },
        { TRAIN, "--link-inter=fast", "--link-inter=fast must be GBPS or GBPS,LATENCY_US" },
        { TRAIN, "--reduce-dtype=", "--reduce-dtype has an empty value" },
        { SAMPLE, "", "--ckpt PATH is required" },
        { SAMPLE, "--bogus", "sample: unknown flag '--bogus'" },
        { SAMPLE, "stray", "sample: unexpected argument 'stray'" },
        { SAMPLE, "--chars", "sample: --chars needs a value" },
        { SAMPLE, "--chars=x", "sample: --chars expects an integer, got 'x'" },
        { SAMPLE, "--chars=-1", "sample: the sample's length (--chars or --tokens) is -1: it must not be negative" },
        { SAMPLE, "--tokens=-1", "sample: the sample's length (--chars or --tokens) is -1" },
        { SAMPLE, "--temperature=0", "sample: --temperature=0 must be positive" },
        { SAMPLE, "--temperature=-1", "sample: --temperature=-1 must be positive" },
        { SAMPLE, "--top-k=-2", "sample: --top-k=-2 must not be negative" },
        { SAMPLE, "--top-k=abc", "sample: --top-k expects an integer, got 'abc'" },
        { SAMPLE, "--device=gpu", "sample: --device=gpu must be auto, cpu or cuda" },
        { SAMPLE, "--seed=99999999999", "sample: --seed=99999999999 is out of range (a 32-bit integer)" },
        { ZERO_MEMORY, "--bogus=1", "zero_memory: unknown flag '--bogus'" },
        { ZERO_MEMORY, "stray", "zero_memory: unexpected argument 'stray'" },
        { ZERO_MEMORY, "--preset=nope", "zero_memory: unknown --preset 'nope'" },
        { ZERO_MEMORY, "--layers=0", "zero_memory: --layers=0 must be in 1..170" },
        { ZERO_MEMORY, "--embd=7 --heads=2", "zero_memory: --embd=7 is not divisible by --heads=2" },
        { ZERO_MEMORY, "--device=tpu", "zero_memory: --device=tpu must be auto, cpu or cuda" },
        { ZERO_MEMORY, "--overlap=3", "zero_memory: --overlap=3 must be 0 or 1" },
        { ZERO_MEMORY, "--bucket-mb=-1", "zero_memory: --bucket-mb=-1 must be in (0, 4096]" },
        { ZERO_MEMORY, "--unit=matrix", "zero_memory: --unit=matrix must be block, half or tensor" },
        { ZERO_MEMORY, "--max-live-units=-1", "zero_memory: --max-live-units=-1 must be in 1..8" },
        { ZERO_MEMORY, "--recompute=1 --unit=tensor", "zero_memory: --recompute=1 recomputes whole blocks" },
        { ZERO_MEMORY, "--estimate=2", "zero_memory: --estimate=2 must be 0 or 1" },
        { ZERO_MEMORY, "--estimate=yes", "zero_memory: --estimate expects an integer, got 'yes'" },
        { ZERO_MEMORY, "--shard-ranks=65", "zero_memory: --shard-ranks=65 must be a group's ranks, 1..64 (0: none)" },
        { ZERO_MEMORY, "--shard-ranks two", "zero_memory: --shard-ranks expects an integer, got 'two'" },
    };
    const char *binaries[] = { [TRAIN] = train_binary(), [SAMPLE] = sample_binary(),
                               [ZERO_MEMORY] = zero_memory_binary() };
    size_t n = sizeof cases / sizeof cases[0];
    cr_expect_geq(n, 60);
    char err[4096];
    for (size_t i = 0; i < n; i++)
        expect_one_line(run_tool(binaries[cases[i].tool], cases[i].args, "/dev/null", err, sizeof err), 2, err,
                        cases[i].needle, cases[i].args);
}

/* Each flag's hashes (options_flag_hashes) for a command line, which must parse. */
static int hashes_of(const char *args, uint64_t *hashes, const char **names) {
    char line[512], err[1024], *argv[32];
    snprintf(line, sizeof line, "%s", args);
    int argc = split_args(line, argv, 32);
    TrainOptions o;
    cr_assert_eq(options_read(&o, TOOL_TRAIN, "char-small", argc, argv, err, sizeof err), 0, "'%s': %s", args, err);
    return options_flag_hashes(&o, hashes, names);
}

/* What processes compare before they train (tools/options.h): a change of any
 * single flag's value, whatever the flag, changes that flag's hash, however the
 * value is written, and --node-rank (each process's own) changes none. Each
 * flag of the table needs a line here: a new flag without one fails. */
Test(flags, every_flag_alone_tells_two_processes_apart) {
    static const char NODES[] = "--nodes=2 --rendezvous=file:/tmp/zf_r";
    static const struct { const char *flag, *base, *other; } changes[] = {
        { "preset", "", "--preset=char" }, { "data", "", "--data=other.txt" }, { "zero", "", "--zero=3" },
        { "tokenizer", "", "--tokenizer=t.json" },
        { "gpus", "", "--gpus=2" }, { "device", "", "--device=cpu" }, { "collectives", "", "--collectives=nccl" },
        { "tf32", "", "--tf32=1" }, { "dtype", "", "--dtype=bf16" },
        { "reduce-dtype", "", "--reduce-dtype=bf16" }, { "shard-ranks", "--zero=1 --gpus=2", "--zero=1 --gpus=2 --shard-ranks=1" },
        { "link-inter", "--zero=1 --gpus=2 --shard-ranks=1 --link=5", "--zero=1 --gpus=2 --shard-ranks=1 --link=5 --link-inter=1" }, { "overlap", "", "--overlap=0" }, { "graphs", "", "--graphs=1" },
        { "bucket-mb", "", "--bucket-mb=1" },
        { "unit", "", "--unit=half" }, { "max-live-units", "", "--max-live-units=3" }, { "recompute", "", "--recompute=1" },
        { "recompute-gelu", "", "--recompute-gelu=1" }, { "recompute-norms", "", "--recompute-norms=1" },
        { "link", "", "--link=5" }, { "layers", "", "--layers=3" }, { "heads", "", "--heads=2" }, { "embd", "", "--embd=64" },
        { "bias", "", "--bias=1" }, { "gelu", "", "--gelu=tanh" }, { "pad-vocab", "", "--pad-vocab=64" },
        { "block", "", "--block=32" }, { "batch", "", "--batch=4" }, { "iters", "", "--iters=10" }, { "lr", "", "--lr=2e-3" },
        { "min-lr", "", "--min-lr=2e-4" }, { "warmup", "", "--warmup=5" }, { "lr-decay-iters", "", "--lr-decay-iters=50" },
        { "dropout", "", "--dropout=0.1" }, { "weight-decay", "", "--weight-decay=0.01" }, { "beta2", "", "--beta2=0.95" },
        { "grad-clip", "", "--grad-clip=0.5" }, { "seed", "", "--seed=7" }, { "eval-every", "", "--eval-every=5" },
        { "eval-iters", "", "--eval-iters=3" }, { "log-every", "", "--log-every=2" }, { "sample-chars", "", "--sample-chars=9" },
        { "sample-tokens", "", "--sample-tokens=9" },
        { "log", "", "--log=l.jsonl" }, { "trace", "", "--trace=t.json" }, { "trace-steps", "", "--trace-steps=2" },
        { "out", "", "--out=o" }, { "always-save", "", "--always-save=1" }, { "overwrite", "", "--overwrite=1" },
        { "resume", "", "--resume=r.safetensors" }, { "init-from", "", "--init-from=i.safetensors" },
        { "grad-accum", "", "--grad-accum=2" }, { "on-nan", "", "--on-nan=skip" }, { "max-skips", "", "--max-skips=3" },
        { "max-memory-mb", "", "--max-memory-mb=100" }, { "timeout", "", "--timeout=60" },
        { "nodes", "", NODES }, { "node-rank", NODES, "--nodes=2 --rendezvous=file:/tmp/zf_r --node-rank=1" },
        { "rendezvous", NODES, "--nodes=2 --rendezvous=file:/tmp/zf_s" }, { "inject-fault", "", "--inject-fault=0:1:forward" },
    };
    uint64_t base[MAX_FLAGS], other[MAX_FLAGS];
    const char *names[MAX_FLAGS];
    int n = hashes_of("", base, names);
    for (int i = 0; i < n; i++) {
        size_t k = 0;
        while (k < sizeof changes / sizeof changes[0] && strcmp(changes[k].flag, names[i]) != 0) k++;
        cr_assert_lt(k, sizeof changes / sizeof changes[0], "--%s has no other value in this test: add one", names[i]);
        hashes_of(changes[k].base, base, names);
        hashes_of(changes[k].other, other, names);
        int differ = 0;
        for (int j = 0; j < n; j++) differ |= base[j] != other[j];
        if (strcmp(names[i], "node-rank") == 0) cr_expect(!differ, "--node-rank changed what processes compare");
        else cr_expect_neq(base[i], other[i], "'%s' left --%s's hash as '%s' has it", changes[k].other, names[i],
                           changes[k].base);
    }
    /* one value written two ways, flags in two orders: the same run */
    hashes_of("--lr=1e-3 --seed=5", base, names);
    hashes_of("--seed 5 --lr 0.001", other, names);
    cr_expect_eq(memcmp(base, other, (size_t)n * sizeof base[0]), 0, "--lr=1e-3 and --lr 0.001 told apart");
}

Test(flags, a_value_longer_than_its_flag_holds_is_an_error) {
    char args[700] = "--data=", err[4096];
    memset(args + strlen(args), 'x', 600);  /* longer than any text flag holds */
    int rc = run_train(args, err, sizeof err);
    cr_expect_eq(rc, 2);
    cr_expect(strstr(err, "--data value is too long") != NULL, "%s", err);
    cr_expect_eq(count_lines(err), 1, "%s", err);
}

Test(flags, bad_data_exits_1_with_one_line) {
    char err[4096], args[512];
    int rc = run_train("--data=/nonexistent/file.txt", err, sizeof err);
    cr_expect_eq(rc, 1);
    cr_expect(strstr(err, "/nonexistent/file.txt") != NULL, "%s", err);
    cr_expect_eq(count_lines(err), 1, "%s", err);

    char path[] = "/tmp/zf_short_XXXXXX";
    int fd = mkstemp(path);
    cr_assert_geq(fd, 0);
    cr_assert_eq(write(fd, "too short for a block of 64\n", 28), 28);
    close(fd);
    snprintf(args, sizeof args, "--data=%s", path);
    rc = run_train(args, err, sizeof err);
    cr_expect_eq(rc, 1);
    cr_expect(strstr(err, "each split needs more") != NULL, "%s", err);
    cr_expect_eq(count_lines(err), 1, "%s", err);

    fd = open(path, O_WRONLY | O_TRUNC);
    close(fd);  /* now empty */
    rc = run_train(args, err, sizeof err);
    expect_one_line(rc, 1, err, "has 0 bytes; each split needs more than --block=64", "an empty data file");
    unlink(path);

    /* a FIFO would block an open forever; /dev/zero never ends */
    char fifo[] = "/tmp/zf_fifo_XXXXXX";
    fd = mkstemp(fifo);
    cr_assert_geq(fd, 0);
    close(fd);
    unlink(fifo);
    cr_assert_eq(mkfifo(fifo, 0600), 0);
    const char *specials[] = { fifo, "/dev/zero" };
    for (int i = 0; i < 2; i++) {
        snprintf(args, sizeof args, "--data=%s", specials[i]);
        char needle[128];
        snprintf(needle, sizeof needle, "data file '%s' is not a regular file", specials[i]);
        expect_one_line(run_train(args, err, sizeof err), 1, err, needle, args);
    }
    unlink(fifo);
}

Test(flags, help_lists_every_flag_and_exits_0) {
    char cmd[512];
    snprintf(cmd, sizeof cmd, "%s --help", train_binary());
    FILE *p = popen(cmd, "r");
    cr_assert_not_null(p);
    char out[8192];
    size_t n = fread(out, 1, sizeof out - 1, p);
    out[n] = 0;
    cr_expect_eq(pclose(p), 0);
    static const char *flags[] = { "--layers", "--heads", "--embd", "--block", "--batch", "--iters",
        "--lr", "--min-lr", "--warmup", "--dropout", "--weight-decay", "--beta2", "--grad-clip",
        "--seed", "--eval-every", "--eval-iters", "--sample-chars", "--log", "--data", "--preset" };
    for (size_t i = 0; i < sizeof flags / sizeof flags[0]; i++)
        cr_expect(strstr(out, flags[i]) != NULL, "--help does not list %s", flags[i]);
}

/* Bytes that are no text train as the data they are: every byte value, or a
 * single one repeated (a vocabulary of one, whose sample can only be it). */
Test(flags, binary_data_and_a_single_byte_train_as_they_are, .timeout = 60) {
    char path[] = "/tmp/zf_bytes_XXXXXX", out[] = "/tmp/zf_bytes_out_XXXXXX", args[512], err[4096];
    int fd = mkstemp(path), out_fd = mkstemp(out);
    cr_assert(fd >= 0 && out_fd >= 0);
    close(out_fd);
    unsigned char bytes[4096];
    for (size_t i = 0; i < sizeof bytes; i++) bytes[i] = (unsigned char)(i * 7919 % 256);
    cr_assert_eq(write(fd, bytes, sizeof bytes), (ssize_t)sizeof bytes);
    close(fd);
    snprintf(args, sizeof args, "--layers=1 --embd=16 --heads=2 --block=16 --batch=2 --eval-iters=1 --iters=2 "
             "--sample-chars=16 --data=%s", path);
    cr_expect_eq(run_tool(train_binary(), args, out, err, sizeof err), 0, "binary data: %s", err);
    memset(bytes, 'q', sizeof bytes);
    write_all(path, bytes, sizeof bytes);
    cr_expect_eq(run_tool(train_binary(), args, out, err, sizeof err), 0, "one byte: %s", err);
    size_t n;
    char *text = (char *)read_all(out, &n);
    text[n] = 0;
    cr_expect(strstr(text, "vocabulary 1,") && strstr(text, "at a time):\nqqqqqqqqqqqqqqqq\n"), "%s", text);
    free(text);
    unlink(path);
    unlink(out);
}

Test(flags, an_empty_value_is_an_error_for_every_flag) {
    char cmd[512], out[16384], args[128], err[4096];
    snprintf(cmd, sizeof cmd, "%s --help", train_binary());
    FILE *p = popen(cmd, "r");
    cr_assert_not_null(p);
    size_t n = fread(out, 1, sizeof out - 1, p);
    out[n] = 0;
    cr_assert_eq(pclose(p), 0);
    int flags = 0;
    for (const char *line = out; (line = strstr(line, "\n  --")) != NULL; line++) {
        char name[64];
        cr_assert_eq(sscanf(line + 5, "%63[a-z0-9-]", name), 1);
        snprintf(args, sizeof args, "--%s=", name);
        snprintf(cmd, sizeof cmd, "--%s has an empty value", name);
        expect_one_line(run_train(args, err, sizeof err), 2, err, cmd, args);
        flags++;
    }
    cr_expect_geq(flags, 40, "--help listed %d flags", flags);
    /* the form with a space, as `--resume "$UNSET"` writes it */
    expect_one_line(run_train("--resume ''", err, sizeof err), 2, err, "--resume has an empty value", "--resume ''");
}

Test(flags, a_directory_given_as_a_file_says_so) {
    char err[4096];
    /* a folder is a token folder's place (model/data.h): it says what it lacks */
    expect_one_line(run_train("--data=/tmp", err, sizeof err), 1, err, "cannot open '/tmp/train.bin': No such file or "
                    "directory (a token folder holds train.bin and val.bin", "--data=/tmp");
    expect_one_line(run_train("--resume=/tmp --iters=1", err, sizeof err), 1, err, "'/tmp' is a folder without config.json: neither a Hugging Face folder nor a checkpoint file",
                    "--resume=/tmp");
    expect_one_line(run_train("--log=/tmp --iters=1", err, sizeof err), 1, err,
                    "cannot write --log file '/tmp': Is a directory", "--log=/tmp");
}

/* What tool's --help prints (the test fails unless it exits 0). */
static void help_of(const char *binary, char *out, size_t len) {
    char cmd[512];
    snprintf(cmd, sizeof cmd, "%s --help", binary);
    FILE *p = popen(cmd, "r");
    cr_assert_not_null(p);
    size_t n = fread(out, 1, len - 1, p);
    out[n] = 0;
    cr_assert_eq(pclose(p), 0, "'%s' did not exit 0", cmd);
}

/* The flags a --help lists, one a line ("  --name ..."), as " name " words in names. */
static int listed_flags(const char *help, char *names, size_t len) {
    int n = 0;
    names[0] = 0;
    for (const char *line = help; (line = strstr(line, "\n  --")) != NULL; line++) {
        char name[64];
        cr_assert_eq(sscanf(line + 5, "%63[a-z0-9-]", name), 1);
        snprintf(names + strlen(names), len - strlen(names), " %s ", name);
        n++;
    }
    return n;
}

static int lists(const char *names, const char *flag) {
    char word[80];
    snprintf(word, sizeof word, " %s ", flag);
    return strstr(names, word) != NULL;
}

/* Each tool takes and lists only its own flags (issue 44, item 10): the
 * tools of one job list exactly theirs; bin/train lists none of theirs; a
 * flag another tool lists is refused in one line naming it, exit 2; every
 * flag a tool lists is taken (before --help, which then prints). */
Test(flags, each_tool_takes_and_lists_only_its_own_flags, .timeout = 120) {
    static const struct { const char *name, *own; } tools[] = {
        { "train", NULL },
        { "sample", "ckpt tokenizer prompt chars tokens temperature top-k seed device" },
        { "prepare", "tokenizer newlines data out overwrite" },
        { "export", "ckpt hf vocab overwrite" },
        { "zero_memory", "preset data gpus device dtype reduce-dtype overlap bucket-mb unit max-live-units recompute "
                         "recompute-gelu recompute-norms layers heads embd bias gelu pad-vocab block batch dropout "
                         "weight-decay beta2 seed estimate shard-ranks" },
    };
    static const char NOT_TRAINS[] = "ckpt prompt chars tokens temperature top-k hf vocab estimate";
    enum { TOOLS = sizeof tools / sizeof tools[0] };
    const char *binaries[TOOLS] = { train_binary(), sample_binary(), prepare_binary(), export_binary(),
                                    zero_memory_binary() };
    static char help[TOOLS][16384], names[TOOLS][4096];
    for (int t = 0; t < TOOLS; t++) {
        help_of(binaries[t], help[t], sizeof help[t]);
        int n = listed_flags(help[t], names[t], sizeof names[t]);
        char own[512], *save = NULL;
        snprintf(own, sizeof own, "%s", tools[t].own ? tools[t].own : NOT_TRAINS);
        int owned = 0;
        for (char *flag = strtok_r(own, " ", &save); flag; flag = strtok_r(NULL, " ", &save), owned++)
            cr_expect(lists(names[t], flag) == (tools[t].own != NULL), "bin/%s's --help %s --%s", tools[t].name,
                      tools[t].own ? "does not list" : "lists", flag);
        if (tools[t].own) cr_expect_eq(n, owned, "bin/%s's --help lists %d flags:%s", tools[t].name, n, names[t]);
        else cr_expect_geq(n, 50, "bin/train's --help lists %d flags", n);
    }
    char args[160], err[4096], needle[96];
    for (int t = 0; t < TOOLS; t++)
        for (int other = 0; other < TOOLS; other++) {
            char copy[sizeof names[0]], *save = NULL;
            memcpy(copy, names[other], sizeof copy);
            for (char *flag = strtok_r(copy, " ", &save); flag; flag = strtok_r(NULL, " ", &save)) {
                int own = lists(names[t], flag);
                snprintf(args, sizeof args, "--%s=%s --help", flag, strcmp(flag, "preset") ? "1" : "char");
                int rc = run_tool(binaries[t], args, "/dev/null", err, sizeof err);
                if (own) {
                    cr_expect_eq(rc, 0, "bin/%s lists --%s and refused '%s': %s", tools[t].name, flag, args, err);
                    continue;
                }
                snprintf(needle, sizeof needle, "--%s", flag);
                snprintf(args, sizeof args, "bin/%s --%s=1 (bin/%s's flag)", tools[t].name, flag, tools[other].name);
                expect_one_line(rc, 2, err, needle, args);
            }
        }
    expect_one_line(run_tool(prepare_binary(), "--zero=3 --dtype=bf16", "/dev/null", err, sizeof err), 2, err,
                    "prepare: --zero is a flag of bin/train, not of bin/prepare", "bin/prepare --zero=3");
}

/* A folder of token ids (model/data.h) of a vocabulary of 50, in dir. */
static void token_folder(const char *dir) {
    uint16_t ids[4096];
    for (size_t i = 0; i < sizeof ids / sizeof ids[0]; i++) ids[i] = (uint16_t)(i * 7 % 50);
    char path[160];
    static const char META[] = "{\"vocab_size\": 50, \"dtype\": \"uint16\"}\n";
    snprintf(path, sizeof path, "%s/train.bin", dir);
    write_all(path, ids, sizeof ids);
    snprintf(path, sizeof path, "%s/val.bin", dir);
    write_all(path, ids, sizeof ids);
    snprintf(path, sizeof path, "%s/meta.json", dir);
    write_all(path, META, strlen(META));
}

/* The sample's length is named for what it counts (issue 44, item 11):
 * bin/train's --sample-tokens on token ids, --sample-chars on a text file's
 * bytes, bin/sample's --tokens and --chars the same; the other refused in one
 * line naming the one to use; a length of 0 (no sample) under either name. */
Test(flags, the_sample_length_is_named_for_what_it_counts, .timeout = 300) {
    char dir[64], ckpt[128], args[1024], err[4096];
    temp_dir(dir, sizeof dir, "lengths");
    token_folder(dir);
    snprintf(args, sizeof args, "%s --iters=1 --data=%s --sample-chars=5", TINY, dir);
    expect_one_line(run_train(args, err, sizeof err), 2, err,
                    "train: --sample-chars counts characters, and this model's tokens are ids of a tokenizer: use "
                    "--sample-tokens", "--sample-chars on token ids");
    snprintf(args, sizeof args, "%s --iters=1 --data=%s --sample-tokens=5", TINY, dir);
    cr_expect_eq(run_train(args, err, sizeof err), 0, "--sample-tokens on token ids: %s", err);
    snprintf(args, sizeof args, "%s --iters=1 --data=%s --sample-tokens=5 --sample-chars=0", TINY, dir);
    cr_expect_eq(run_train(args, err, sizeof err), 0, "no sample, under either name: %s", err);
    snprintf(args, sizeof args, "%s --iters=1 --sample-tokens=5", TINY);
    expect_one_line(run_train(args, err, sizeof err), 2, err,
                    "train: --sample-tokens counts tokens, and this model's tokens are a text file's bytes: use "
                    "--sample-chars", "--sample-tokens on a text file");
    remove_dir(dir);

    train_checkpoint(dir, sizeof dir, ckpt, sizeof ckpt, 1);
    snprintf(args, sizeof args, "--ckpt=%s --tokens=5", ckpt);
    expect_one_line(run_tool(sample_binary(), args, "/dev/null", err, sizeof err), 2, err,
                    "sample: --tokens counts tokens, and this model's tokens are a text file's bytes: use --chars",
                    "bin/sample --tokens on a character model");
    snprintf(args, sizeof args, "--ckpt=%s --chars=5", ckpt);
    cr_expect_eq(run_tool(sample_binary(), args, "/dev/null", err, sizeof err), 0, "--chars: %s", err);
    remove_dir(dir);
}

/* bin/sample's prompt holds at most 511 bytes: --help says so, and a longer
 * one, here 256 characters of two bytes each, is refused in one line that
 * counts in bytes as the limit does (issue 44, item 11). */
Test(flags, a_prompt_past_511_bytes_is_documented_and_refused) {
    char help[8192], args[700] = "--ckpt=none.safetensors --prompt=", err[4096];
    help_of(sample_binary(), help, sizeof help);
    cr_expect(strstr(help, "at most 511 bytes") != NULL, "bin/sample's --help leaves out the prompt's limit: %s", help);
    for (int i = 0; i < 256; i++) strcat(args, "\xc3\xa9");  /* U+00E9 */
    expect_one_line(run_tool(sample_binary(), args, "/dev/null", err, sizeof err), 2, err,
                    "sample: --prompt value is too long (at most 511 bytes)", "a prompt of 256 characters, 512 bytes");
}

/* A model whose weights and optimizer state alone pass what the machine has
 * (a width of 2^20: petabytes) is refused in one line, out of memory (exit 1),
 * at once: not after minutes of zeroing its activations (issue 44). */
Test(flags, a_model_past_the_machine_is_refused_at_once, .timeout = 60) {
    char cmd[512], err[4096];
    snprintf(cmd, sizeof cmd, "timeout -k 2 20 %s", train_binary());
    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    int rc = run_tool(cmd, "--embd=1048576 --batch=1 --iters=1 --device=cpu", "/dev/null", err, sizeof err);
    clock_gettime(CLOCK_MONOTONIC, &t1);
    double seconds = (double)(t1.tv_sec - t0.tv_sec) + 1e-9 * (double)(t1.tv_nsec - t0.tv_nsec);
    expect_one_line(rc, 1, err, "error: out of memory on cpu", "--embd=1048576");
    cr_expect_lt(seconds, 3.0, "%.1f s to refuse --embd=1048576", seconds);
}
