/* test_files.c: the run's files: bad checkpoints, outputs checked before training, no good file
 * overwritten, nanoGPT's state_dict in, resumes across strategies. */
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
#include <sys/resource.h>
#include <unistd.h>

#include "../kernels/backend.h"  /* cuda_kernel_ops: whether this build has CUDA */
#include "../model/data.h"
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

TestSuite(files, .init = setup, .fini = teardown);

/* The good file with `from` replaced by `to` (same length) in its header. */
static void write_replaced(const char *path, const unsigned char *good, size_t n, const char *from, const char *to) {
    unsigned char *bad = malloc(n);
    memcpy(bad, good, n);
    char *at = memmem(bad + 8, n - 8, from, strlen(from));
    cr_assert_not_null(at, "'%s' is not in the header", from);
    memcpy(at, to, strlen(to));
    write_all(path, bad, n);
    free(bad);
}

Test(files, bad_checkpoints_are_one_line_errors_and_overwrite_nothing, .timeout = 300) {
    static const char *model = "--layers=2 --embd=16 --heads=2 --block=16 --batch=2 --eval-iters=1 --sample-chars=0";
    char dir[] = "/tmp/zf_bad_XXXXXX", good_path[256], bad_path[256], args[1024], err[4096];
    cr_assert_not_null(mkdtemp(dir));
    snprintf(good_path, sizeof good_path, "%s/ckpt.safetensors", dir);
    snprintf(bad_path, sizeof bad_path, "%s/bad.safetensors", dir);
    snprintf(args, sizeof args, "%s --iters=2 --out=%s", model, dir);
    cr_assert_eq(run_train(args, err, sizeof err), 0, "%s", err);
    size_t n;
    unsigned char *good = read_all(good_path, &n);

    /* a tensor name, and ln_f's header entry, as the writer lays them out */
    static const char *ln_f = "\"transformer.ln_f.weight\":{\"dtype\":\"F32\",\"shape\":[16]";
    struct { const char *what, *from, *to, *needle; } edits[] = {
        { "wrong dtype", "\"dtype\":\"F32\"", "\"dtype\":\"I32\"", "dtype I32, expected F32" },
        { "missing tensor", "transformer.ln_f.weight", "transformer.ln_x.weight", "missing tensor 'transformer.ln_f.weight'" },
        { "wrong shape", ln_f, "\"transformer.ln_f.weight\":{\"dtype\":\"F32\",\"shape\":[15]", "'transformer.ln_f.weight' has shape [15] of F32 (480 bits)" },
        { "malformed JSON", "{", "#", "the header is not JSON" },
        { "more updates than steps", "\"adam_step\":\"2\"", "\"adam_step\":\"3\"", "its adam_step is above its iter" },
    };
    for (size_t i = 0; i < sizeof edits / sizeof edits[0]; i++) {
        write_replaced(bad_path, good, n, edits[i].from, edits[i].to);
        snprintf(args, sizeof args, "%s --iters=4 --out=%s --overwrite=1 --resume=%s", model, dir, bad_path);
        int rc = run_train(args, err, sizeof err);
        cr_expect_eq(rc, 1, "%s: exit %d", edits[i].what, rc);
        cr_expect(strstr(err, edits[i].needle) != NULL, "%s: stderr was: %s", edits[i].what, err);
        cr_expect_eq(count_lines(err), 1, "%s: stderr was: %s", edits[i].what, err);
    }

    /* truncated; a header length past the end; an extra tensor */
    unsigned char *longer = malloc(n + 128);
    memcpy(longer, good, n);
    memset(longer, 0xff, 8);
    uint64_t header_len = 0;
    for (int b = 0; b < 8; b++) header_len |= (uint64_t)good[b] << (8 * b);
    static const char extra[] = "\"extra\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]},";
    struct { const char *what, *needle; } cases[] = {
        { "truncated", "tensor" }, { "header length past the end", "runs past the end" }, { "extra tensor", "overlap" },
    };
    for (int c = 0; c < 3; c++) {
        if (c == 0) write_all(bad_path, good, n / 2);
        if (c == 1) write_all(bad_path, longer, n);
        if (c == 2) {
            uint64_t len = header_len + strlen(extra);
            for (int b = 0; b < 8; b++) longer[b] = (unsigned char)(len >> (8 * b));
            longer[8] = '{';
            memcpy(longer + 9, extra, strlen(extra));
            memcpy(longer + 9 + strlen(extra), good + 9, n - 9);
            write_all(bad_path, longer, n + strlen(extra));
        }
        snprintf(args, sizeof args, "%s --iters=4 --out=%s --overwrite=1 --resume=%s", model, dir, bad_path);
        int rc = run_train(args, err, sizeof err);
        cr_expect_eq(rc, 1, "%s: exit %d", cases[c].what, rc);
        cr_expect(strstr(err, cases[c].needle) != NULL, "%s: stderr was: %s", cases[c].what, err);
        cr_expect_eq(count_lines(err), 1, "%s: stderr was: %s", cases[c].what, err);
    }

    /* a model the flags disagree with */
    snprintf(args, sizeof args, "%s --layers=3 --iters=4 --out=%s --resume=%s", model, dir, good_path);
    int rc = run_train(args, err, sizeof err);
    cr_expect_eq(rc, 2, "another model (the flags ask it: docs/errors.md): exit %d", rc);
    cr_expect(strstr(err, "holds a model of 2 layers") != NULL, "another model: stderr was: %s", err);
    cr_expect_eq(count_lines(err), 1, "another model: stderr was: %s", err);

    expect_unchanged(good_path, good, n, "the good checkpoint was overwritten");
    free(longer);
    free(good);
    unlink(good_path);
    unlink(bad_path);
    rmdir(dir);
}

static int file_exists(const char *path) { return access(path, F_OK) == 0; }

Test(files, out_is_checked_writable_before_training, .timeout = 60) {
    char dir[64], file[128], args[512], err[4096];
    temp_dir(dir, sizeof dir, "out");
    snprintf(file, sizeof file, "%s/plain_file", dir);
    write_all(file, "x", 1);
    snprintf(args, sizeof args, "%s --iters=2 --out=%s", TINY, file);
    expect_one_line(run_train(args, err, sizeof err), 1, err, "is a file, not a folder", "--out naming a file");
    /* /proc refuses new files even to root, as a read-only place does */
    snprintf(args, sizeof args, "%s --iters=2 --out=/proc", TINY);
    expect_one_line(run_train(args, err, sizeof err), 1, err, "cannot write in the --out folder '/proc'", "--out=/proc");
    /* a folder that works keeps no probe behind */
    snprintf(args, sizeof args, "%s --iters=2 --out=%s", TINY, dir);
    cr_assert_eq(run_train(args, err, sizeof err), 0, "%s", err);
    char listing[512];
    snprintf(args, sizeof args, "ls -A %s", dir);
    FILE *p = popen(args, "r");
    size_t n = fread(listing, 1, sizeof listing - 1, p);
    listing[n] = 0;
    pclose(p);
    cr_expect_str_eq(listing, "ckpt.safetensors\nplain_file\n", "the folder holds:\n%s", listing);
    snprintf(args, sizeof args, "rm -rf %s", dir);
    cr_expect_eq(system(args), 0);
}

/* A process id no process has now. */
static int dead_pid(void) {
    for (int pid = 4000000;; pid--)
        if (kill(pid, 0) != 0 && errno == ESRCH) return pid;
}

Test(files, stale_temporary_files_of_cut_short_saves_are_removed_at_start, .timeout = 60) {
    char dir[64], stale[128], live[128], other[128], args[512], err[4096];
    temp_dir(dir, sizeof dir, "stale");
    snprintf(stale, sizeof stale, "%s/ckpt.safetensors.tmp.%d", dir, dead_pid());
    snprintf(live, sizeof live, "%s/ckpt.safetensors.tmp.%d", dir, (int)getpid());  /* a live writer's */
    snprintf(other, sizeof other, "%s/notes.tmp.1", dir);
    write_all(stale, "half a checkpoint", 17);
    write_all(live, "a save in flight", 16);
    write_all(other, "not ours", 8);
    snprintf(args, sizeof args, "%s --iters=2 --out=%s", TINY, dir);
    cr_assert_eq(run_train(args, err, sizeof err), 0, "%s", err);
    cr_expect(!file_exists(stale), "%s is still there", stale);
    cr_expect(file_exists(live), "a live process's temporary file was removed");
    cr_expect(file_exists(other), "a file that is not ours was removed");
    snprintf(args, sizeof args, "rm -rf %s", dir);
    cr_expect_eq(system(args), 0);
}

/* bin/export's --hf folder: temporary files of a cut-short export whose writer is gone are removed at start. */
Test(files, stale_temporary_files_of_a_cut_short_export_are_removed_at_start, .timeout = 120) {
    char dir[64], ckpt[128], hf[160], stale[200], live[200], args[512], err[4096];
    train_checkpoint(dir, sizeof dir, ckpt, sizeof ckpt, 2);
    snprintf(hf, sizeof hf, "%s/hf", dir);
    cr_assert_eq(mkdir(hf, 0777), 0);
    snprintf(stale, sizeof stale, "%s/model.safetensors.tmp.%d", hf, dead_pid());
    snprintf(live, sizeof live, "%s/model.safetensors.tmp.%d", hf, (int)getpid());
    write_all(stale, "half an export", 14);
    write_all(live, "an export in flight", 19);
    snprintf(args, sizeof args, "--ckpt=%s --hf=%s", ckpt, hf);
    cr_assert_eq(run_tool(export_binary(), args, "/dev/null", err, sizeof err), 0, "%s", err);
    cr_expect(!file_exists(stale), "%s is still there", stale);
    cr_expect(file_exists(live), "a live process's temporary file was removed");
    remove_dir(dir);
}

Test(files, a_write_error_on_the_log_or_stdout_ends_the_run_with_exit_1, .timeout = 60) {
    char args[512], err[4096];
    snprintf(args, sizeof args, "%s --iters=2 --log-every=1 --log=/dev/full", TINY);
    expect_one_line(run_train(args, err, sizeof err), 1, err, "cannot write the --log file", "--log=/dev/full");
    snprintf(args, sizeof args, "%s --iters=2", TINY);
    expect_one_line(run_tool(train_binary(), args, "/dev/full", err, sizeof err), 1, err,
                    "cannot write the progress output", "stdout on /dev/full");
}

/* The good file with tensor `name`'s shape set to `shape` (JSON), its data as it was. */
static void write_reshaped(const char *path, const unsigned char *good, size_t n, const char *name, const char *shape) {
    uint64_t header_len = 0;
    for (int b = 0; b < 8; b++) header_len |= (uint64_t)good[b] << (8 * b);
    json_t *header = json_loadb((const char *)good + 8, (size_t)header_len, 0, NULL);
    json_t *entry = json_object_get(header, name);
    cr_assert_not_null(entry, "no tensor '%s'", name);
    cr_assert_eq(json_object_set_new(entry, "shape", json_loads(shape, 0, NULL)), 0, "%s", shape);
    char *text = json_dumps(header, JSON_COMPACT);
    size_t len = strlen(text);
    FILE *f = fopen(path, "wb");
    cr_assert_not_null(f);
    for (int b = 0; b < 8; b++) fputc((int)((uint64_t)len >> (8 * b)) & 0xff, f);
    fputs(text, f);
    fwrite(good + 8 + header_len, 1, n - 8 - (size_t)header_len, f);
    cr_assert_eq(fclose(f), 0);
    free(text);
    json_decref(header);
}

/* Every tensor of a shape other than the flags' is a one-line error (exit 1)
 * naming it, from --resume, --init-from and bin/sample alike, and nothing is
 * written: a rank more or less ([16] as [16, 1], [48, 16] as [768] or
 * [48, 16, 1]), the same rank with other sizes of the same bytes ([16, 48]),
 * and other bytes ([15], [17]), for a 1-D weight, a 2-D weight and Adam's v. */
Test(files, a_tensor_of_another_shape_is_refused_by_every_reader, .timeout = 300) {
    char dir[64], ckpt[128], bad[160], args[1024], err[4096], what[256];
    train_checkpoint(dir, sizeof dir, ckpt, sizeof ckpt, 2);
    snprintf(bad, sizeof bad, "%s/bad.safetensors", dir);
    size_t n;
    unsigned char *good = read_all(ckpt, &n);
    static const char *const LN_F = "transformer.ln_f.weight", *const ATTN = "transformer.h.0.attn.c_attn.weight",
                             *const V_FC = "optim.exp_avg_sq.transformer.h.1.mlp.c_fc.weight";
    static const struct { const char *tensor, *shape, *needle; } cases[] = {
        { LN_F, "[16,1]", "has shape [16,1], expected [16]" },
        { LN_F, "[1,16]", "has shape [1,16], expected [16]" },
        { LN_F, "[2,8]", "has shape [2,8], expected [16]" },
        { LN_F, "[16,1,1]", "has shape [16,1,1], expected [16]" },
        { LN_F, "[15]", "has shape [15] of F32 (480 bits)" },
        { LN_F, "[17]", "has shape [17] of F32 (544 bits)" },
        { ATTN, "[768]", "has shape [768], expected [48,16]" },
        { ATTN, "[16,48]", "has shape [16,48], expected [48,16]" },
        { ATTN, "[96,8]", "has shape [96,8], expected [48,16]" },
        { ATTN, "[48,16,1]", "has shape [48,16,1], expected [48,16]" },
        { ATTN, "[1,48,16]", "has shape [1,48,16], expected [48,16]" },
        { V_FC, "[64,16,1]", "has shape [64,16,1], expected [64,16]" },
        { V_FC, "[1024]", "has shape [1024], expected [64,16]" },
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        write_reshaped(bad, good, n, cases[i].tensor, cases[i].shape);
        char needle[256];
        snprintf(needle, sizeof needle, "'%s' %s", cases[i].tensor, cases[i].needle);
        snprintf(args, sizeof args, "%s --iters=4 --out=%s --overwrite=1 --resume=%s", TINY, dir, bad);
        snprintf(what, sizeof what, "--resume, %s as %s", cases[i].tensor, cases[i].shape);
        expect_one_line(run_train(args, err, sizeof err), 1, err, needle, what);
        snprintf(args, sizeof args, "%s --iters=2 --init-from=%s", TINY, bad);
        snprintf(what, sizeof what, "--init-from, %s as %s", cases[i].tensor, cases[i].shape);
        expect_one_line(run_train(args, err, sizeof err), 1, err, needle, what);
        snprintf(args, sizeof args, "--ckpt=%s --chars=4", bad);
        snprintf(what, sizeof what, "bin/sample, %s as %s", cases[i].tensor, cases[i].shape);
        expect_one_line(run_tool(sample_binary(), args, "/dev/null", err, sizeof err), 1, err, needle, what);
    }
    expect_unchanged(ckpt, good, n, "the good checkpoint was overwritten");
    free(good);
    remove_dir(dir);
}

/* Adam's v is a mean of squares: a file with a negative element in it is
 * refused at load, naming the tensor, not trained on until a save fails. */
Test(files, a_negative_second_moment_is_refused_at_load, .timeout = 60) {
    char dir[64], ckpt[128], bad[160], args[1024], err[4096];
    train_checkpoint(dir, sizeof dir, ckpt, sizeof ckpt, 2);
    snprintf(bad, sizeof bad, "%s/bad.safetensors", dir);
    size_t n;
    unsigned char *bytes = read_all(ckpt, &n);
    StFile f;
    unsigned char *copy = malloc(n);
    memcpy(copy, bytes, n);
    cr_assert_eq(safetensors_parse(&f, copy, n, ckpt, err, sizeof err), 0, "%s", err);
    int64_t shape[2] = { 64, 16 };
    const unsigned char *v = safetensors_tensor(&f, "optim.exp_avg_sq.transformer.h.1.mlp.c_fc.weight", "F32", 2,
                                                shape, err, sizeof err);
    cr_assert_not_null(v, "%s", err);
    float minus = -1e-3f;
    memcpy(bytes + (v - f.bytes) + 5 * sizeof(float), &minus, sizeof minus);
    safetensors_close(&f);
    write_all(bad, bytes, n);
    snprintf(args, sizeof args, "%s --iters=4 --out=%s --overwrite=1 --resume=%s", TINY, dir, bad);
    expect_one_line(run_train(args, err, sizeof err), 1, err,
                    "tensor 'optim.exp_avg_sq.transformer.h.1.mlp.c_fc.weight' holds a negative value (element 5 is "
                    "-0.001)", "a negative v");
    free(bytes);
    remove_dir(dir);
}

Test(files, a_non_finite_state_is_never_saved_for_any_strategy, .timeout = 300) {
    char dir[64], ckpt[128], args[1024], err[4096];
    train_checkpoint(dir, sizeof dir, ckpt, sizeof ckpt, 4);
    size_t n;
    unsigned char *good = read_all(ckpt, &n);
    /* a weight turns NaN in the last step: the final save must refuse it */
    setenv("ZF_INJECT_NAN", "weight:5", 1);
    for (int k = 0; k < STRATEGY_KINDS; k++) {
        int zero = STRATEGIES[k].stage;
        snprintf(args, sizeof args, "%s --iters=6 --zero=%d --gpus=3 --out=%s --resume=%s", TINY, zero, dir, ckpt);
        expect_one_line(run_train(args, err, sizeof err), 1, err,
                        "saving at iter 6: the state is not finite ('transformer.wte.weight' element 0 is nan)",
                        "final save");
    }
    /* and the saves at evaluations, --always-save included */
    snprintf(args, sizeof args, "%s --iters=8 --eval-every=6 --always-save=1 --out=%s --resume=%s", TINY, dir, ckpt);
    expect_one_line(run_train(args, err, sizeof err), 1, err, "saving at iter 6: the state is not finite",
                    "--always-save");
    unsetenv("ZF_INJECT_NAN");
    expect_unchanged(ckpt, good, n, "the good checkpoint was overwritten");
    free(good);
    remove_dir(dir);
}

/* A command line whose output is the same file as another of its paths is
 * refused at start (exit 2, one line naming both flags), and the file is as it
 * was: the same path, a hard link and a symbolic link alike, for every output
 * against every other path (--log, --trace, --out's checkpoint; --data,
 * --resume, --init-from). Two outputs to /dev/null are no such case. */
Test(files, an_output_over_another_file_of_the_run_is_refused, .timeout = 120) {
    char dir[64], ckpt[128], data[160], hard[160], soft[160], fresh[160], args[2048], err[4096], what[1024];
    train_checkpoint(dir, sizeof dir, ckpt, sizeof ckpt, 2);
    snprintf(data, sizeof data, "%s/data.txt", dir);
    snprintf(hard, sizeof hard, "%s/hard", dir);
    snprintf(soft, sizeof soft, "%s/soft", dir);
    snprintf(fresh, sizeof fresh, "%s/fresh.jsonl", dir);
    size_t n_ckpt, n_data;
    unsigned char *good_ckpt = read_all(ckpt, &n_ckpt), *good_data = read_all("data/tinyshakespeare.txt", &n_data);
    write_all(data, good_data, n_data);
    cr_assert_eq(link(ckpt, hard), 0);
    cr_assert_eq(symlink(ckpt, soft), 0);
    /* (with --out, the output is also the same file as --out's checkpoint, which may be named first) */
    const struct { const char *output, *input, *needle; } cases[] = {
        { "--log=%s", "--resume=%s --out=%s", "--log '%s' is the same file as --" },
        { "--trace=%s", "--resume=%s --out=%s", "--trace '%s' is the same file as --" },
        { "--log=%s", "--init-from=%s", "--log '%s' is the same file as --init-from '%s'" },
        { "--trace=%s", "--init-from=%s", "--trace '%s' is the same file as --init-from '%s'" },
    };
    const char *aliases[] = { ckpt, hard, soft };
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++)
        for (int a = 0; a < 3; a++) {
            char output[256], input[512], needle[512];
            snprintf(output, sizeof output, cases[c].output, aliases[a]);
            snprintf(input, sizeof input, cases[c].input, ckpt, dir);
            snprintf(needle, sizeof needle, cases[c].needle, aliases[a], ckpt);
            snprintf(args, sizeof args, "%s --iters=4 --data=%s %s %s --overwrite=1", TINY, data, output, input);
            snprintf(what, sizeof what, "%s %s", output, input);
            expect_one_line(run_train(args, err, sizeof err), 2, err, needle, what);
        }
    /* the data, and the checkpoint's own path as the log of its --out */
    cr_assert_eq(unlink(hard), 0);
    cr_assert_eq(link(data, hard), 0);
    snprintf(args, sizeof args, "%s --iters=2 --data=%s --log=%s", TINY, data, hard);
    expect_one_line(run_train(args, err, sizeof err), 2, err, "is the same file as --data", "--log over --data");
    snprintf(args, sizeof args, "%s --iters=2 --data=%s --trace=%s", TINY, data, data);
    expect_one_line(run_train(args, err, sizeof err), 2, err, "is the same file as --data", "--trace over --data");
    snprintf(args, sizeof args, "%s --iters=4 --data=%s --out=%s --log=%s --resume=%s", TINY, data, dir, ckpt, ckpt);
    expect_one_line(run_train(args, err, sizeof err), 2, err, "is the same file as --out's checkpoint",
                    "--log over --out's checkpoint");
    /* two outputs of one new file; two outputs to a device */
    snprintf(args, sizeof args, "%s --iters=2 --data=%s --log=%s --trace=%s/./fresh.jsonl", TINY, data, fresh, dir);
    expect_one_line(run_train(args, err, sizeof err), 2, err, "--log", "--log and --trace of one new file");
    cr_expect_neq(access(fresh, F_OK), 0, "the refused run made %s", fresh);
    snprintf(args, sizeof args, "%s --iters=2 --data=%s --log=/dev/null --trace=/dev/null", TINY, data);
    cr_expect_eq(run_train(args, err, sizeof err), 0, "/dev/null twice: %s", err);
    expect_unchanged(ckpt, good_ckpt, n_ckpt, "the checkpoint changed");
    expect_unchanged(data, good_data, n_data, "the data changed");
    free(good_ckpt);
    free(good_data);
    remove_dir(dir);
}

/* An output of bin/export (config.json, model.safetensors in --hf) that is
 * the same file as its --ckpt, by the same path, a symbolic link, a hard link
 * or --hf reached through a linked folder: refused, exit 2, --overwrite=1 or
 * not, the checkpoint byte for byte as it was. */
Test(files, export_refuses_an_output_that_is_its_checkpoint, .timeout = 120) {
    char dir[64], ckpt[128], cmd[512], args[1024], err[4096];
    train_checkpoint(dir, sizeof dir, ckpt, sizeof ckpt, 2);
    size_t n;
    unsigned char *good = read_all(ckpt, &n);
    /* the copy of the checkpoint, the link made to it ("" for none, '@' a symbolic one), the flags (%s: the folder) */
    const struct { const char *real, *link, *flags; } cases[] = {
        { "hf/model.safetensors", "", "--ckpt=%s/hf/model.safetensors --hf=%s/hf" },
        { "hf/model.safetensors", "@link", "--ckpt=%s/link --hf=%s/hf" },
        { "copy.safetensors", "hf/model.safetensors", "--ckpt=%s/copy.safetensors --hf=%s/hf" },
        { "hf/config.json", "", "--ckpt=%s/hf/config.json --hf=%s/via" },
    };
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++)
        for (int overwrite = 0; overwrite < 2; overwrite++) {
            snprintf(cmd, sizeof cmd, "cd %s && rm -rf hf via link copy.safetensors && mkdir hf && ln -s hf via", dir);
            cr_assert_eq(system(cmd), 0);
            char real[200], flags[512];
            write_linked(dir, cases[c].real, cases[c].link, good, n, real, sizeof real);
            snprintf(flags, sizeof flags, cases[c].flags, dir, dir);
            snprintf(args, sizeof args, "%s --overwrite=%d", flags, overwrite);
            int rc = run_tool(export_binary(), args, "/dev/null", err, sizeof err);
            expect_one_line(rc, 2, err, "is the same file as --ckpt", args);
            expect_unchanged(real, good, n, args);
        }
    free(good);
    remove_dir(dir);
}

/* bin/export's exit status, as docs/errors.md's table: 2 for a command line
 * no run can use (a --vocab past the checkpoint's rows, a model.safetensors
 * there already), 1 for files it cannot use (a missing --ckpt, an --hf it
 * cannot make). */
Test(files, export_exit_status_follows_the_one_rule, .timeout = 120) {
    char dir[64], ckpt[128], args[1024], err[4096];
    train_checkpoint(dir, sizeof dir, ckpt, sizeof ckpt, 2);
    snprintf(args, sizeof args, "--ckpt=%s --hf=%s/hf --vocab=100000", ckpt, dir);
    expect_one_line(run_tool(export_binary(), args, "/dev/null", err, sizeof err), 2, err, "--vocab=100000, and",
                    "--vocab past the rows");
    snprintf(args, sizeof args, "--ckpt=%s/none.safetensors --hf=%s/hf", dir, dir);
    expect_one_line(run_tool(export_binary(), args, "/dev/null", err, sizeof err), 1, err, "none.safetensors",
                    "a missing --ckpt");
    snprintf(args, sizeof args, "--ckpt=%s --hf=/proc/zf_hf", ckpt);
    expect_one_line(run_tool(export_binary(), args, "/dev/null", err, sizeof err), 1, err, "/proc/zf_hf",
                    "an --hf it cannot make");
    snprintf(args, sizeof args, "--ckpt=%s --hf=%s/hf", ckpt, dir);
    cr_assert_eq(run_tool(export_binary(), args, "/dev/null", err, sizeof err), 0, "%s", err);
    expect_one_line(run_tool(export_binary(), args, "/dev/null", err, sizeof err), 2, err, "is there already",
                    "a model.safetensors there");
    remove_dir(dir);
}

/* A checkpoint in --out is another run's state: a run that does not resume it
 * (fresh, --init-from it, or --resume of another file) is refused at start,
 * exit 2, the file as it was (--init-from it as an input the save would
 * replace, --overwrite=1 or not); --resume it, or --overwrite=1, and the run
 * goes. */
Test(files, a_checkpoint_in_out_is_replaced_only_by_its_own_resume, .timeout = 120) {
    char dir[64], ckpt[128], other[160], args[2048], err[4096];
    train_checkpoint(dir, sizeof dir, ckpt, sizeof ckpt, 2);
    snprintf(other, sizeof other, "%s/other.safetensors", dir);
    size_t n;
    unsigned char *good = read_all(ckpt, &n);
    write_all(other, good, n);
    const char *refused[] = { "", "--init-from=%s", "--resume=%s", "--init-from=%s --overwrite=1" };
    const char *paths[] = { "", ckpt, other, ckpt };
    const char *why[] = { "holds a checkpoint already", "is the same file as --init-from", "holds a checkpoint already",
                          "is the same file as --init-from" };
    for (int i = 0; i < 4; i++) {
        char start[256];
        snprintf(start, sizeof start, refused[i], paths[i]);
        snprintf(args, sizeof args, "%s --iters=4 --out=%s %s", TINY, dir, start);
        expect_one_line(run_train(args, err, sizeof err), 2, err, why[i], start);
        expect_unchanged(ckpt, good, n, "a refused run changed the checkpoint");
    }
    snprintf(args, sizeof args, "%s --iters=4 --out=%s --resume=%s", TINY, dir, ckpt);
    cr_expect_eq(run_train(args, err, sizeof err), 0, "its own resume: %s", err);
    cr_expect_eq(adam_steps_of(ckpt), 4);
    snprintf(args, sizeof args, "%s --iters=3 --out=%s --overwrite=1", TINY, dir);
    cr_expect_eq(run_train(args, err, sizeof err), 0, "--overwrite=1: %s", err);
    cr_expect_eq(adam_steps_of(ckpt), 3);
    free(good);
    remove_dir(dir);
}

/* A FIFO that nothing reads, as --log, fails at once with one line rather
 * than wait in its open (exit 1); one that something reads takes the log; a
 * FIFO as --trace, written whole at the end, is refused. */
Test(files, a_fifo_log_needs_a_reader_and_a_trace_a_file, .timeout = 60) {
    char dir[64], fifo[128], args[1024], err[4096];
    temp_dir(dir, sizeof dir, "fifo");
    snprintf(fifo, sizeof fifo, "%s/fifo", dir);
    cr_assert_eq(mkfifo(fifo, 0666), 0);
    snprintf(args, sizeof args, "%s --iters=2 --log=%s", TINY, fifo);
    double t0 = wall_seconds();
    expect_one_line(run_train(args, err, sizeof err), 1, err, "is a FIFO or a socket that nothing reads", "--log");
    cr_expect_lt(wall_seconds() - t0, 20.0, "the refusal took %.1f s", wall_seconds() - t0);
    snprintf(args, sizeof args, "%s --iters=2 --trace=%s", TINY, fifo);
    expect_one_line(run_train(args, err, sizeof err), 1, err, "the trace is written whole at the end", "--trace");
    char cmd[512];
    snprintf(cmd, sizeof cmd, "cat %s > %s/read.jsonl & sleep 0.2; %s %s --iters=2 --log-every=1 --log=%s >/dev/null; "
             "status=$?; wait; exit $status", fifo, dir, train_binary(), TINY, fifo);
    cr_expect_eq(system(cmd), 0, "a FIFO with a reader");
    char read_path[128];
    snprintf(read_path, sizeof read_path, "%s/read.jsonl", dir);
    size_t n;
    char *text = (char *)read_all(read_path, &n);
    cr_expect(strstr(text, "\"iter\": 1") != NULL, "the reader got: %s", text);
    free(text);
    remove_dir(dir);
}

/* ckpt with the first float of its data section (transformer.wte.weight's
 * first element, as the writer lays them out) made NaN, at bad. */
static void write_nan_checkpoint(const char *ckpt, const char *bad) {
    size_t n;
    unsigned char *bytes = read_all(ckpt, &n);
    uint64_t header_len = 0;
    for (int b = 0; b < 8; b++) header_len |= (uint64_t)bytes[b] << (8 * b);
    static const unsigned char nan_bits[4] = { 0x00, 0x00, 0xc0, 0x7f };
    memcpy(bytes + 8 + header_len, nan_bits, 4);
    write_all(bad, bytes, n);
    free(bytes);
}

Test(files, checkpoints_with_non_finite_values_are_refused, .timeout = 60) {
    char dir[64], ckpt[128], bad[160], args[1024], err[4096];
    train_checkpoint(dir, sizeof dir, ckpt, sizeof ckpt, 2);
    snprintf(bad, sizeof bad, "%s/nan.safetensors", dir);
    write_nan_checkpoint(ckpt, bad);
    snprintf(args, sizeof args, "--ckpt=%s --chars=10", bad);
    expect_one_line(run_tool(sample_binary(), args, "/dev/null", err, sizeof err), 1, err,
                    "tensor 'transformer.wte.weight' is not finite (element 0 is nan)", "bin/sample");
    snprintf(args, sizeof args, "%s --iters=4 --init-from=%s", TINY, bad);
    expect_one_line(run_train(args, err, sizeof err), 1, err, "tensor 'transformer.wte.weight' is not finite",
                    "--init-from");
    remove_dir(dir);
}

/* nanoGPT's state_dict (tests/torch_gpt.py's copy of the model, PyTorch's own
 * init) written by safetensors.torch.save_file, with no metadata of ours:
 * --init-from takes it, and the weights it starts from are the file's, byte
 * for byte (saved after 0 steps). A file of other shapes than the flags' is a
 * one-line error naming the tensor. */
Test(files, init_from_takes_nanogpts_state_dict_saved_by_the_safetensors_package, .timeout = 300) {
    need_safetensors();
    char dir[64], torch_file[128], ckpt[128], cmd[2048], args[1024], err[4096];
    temp_dir(dir, sizeof dir, "torch_st");
    snprintf(torch_file, sizeof torch_file, "%s/nanogpt.safetensors", dir);
    snprintf(ckpt, sizeof ckpt, "%s/ckpt.safetensors", dir);
    snprintf(cmd, sizeof cmd, "PYTHONPATH=build/pylib:tests %s -c '"
             "import torch, torch_gpt\n"
             "from safetensors.torch import save_file\n"
             "torch.manual_seed(0)\n"
             "m = torch_gpt.GPT(%d, 16, 2, 2, 16)\n"
             "save_file({k: v.detach().clone().contiguous() for k, v in m.state_dict().items()}, \"%s\")'",
             test_python(), data.vocab, torch_file);
    cr_assert_eq(system(cmd), 0, "%s", cmd);
    snprintf(args, sizeof args, "%s --iters=0 --init-from=%s --out=%s", TINY, torch_file, dir);
    cr_assert_eq(run_train(args, err, sizeof err), 0, "%s", err);
    ModelConfig model = { data.vocab, 16, 2, 2, 16, MODEL_GPT, 0, 0 };
    ArenaLayout layout;
    gpt_layout(&model, 1, &layout);
    StFile theirs, ours;
    cr_assert_eq(safetensors_open(&theirs, torch_file, err, sizeof err), 0, "%s", err);
    cr_assert_eq(safetensors_open(&ours, ckpt, err, sizeof err), 0, "%s", err);
    for (int i = 0; i < layout.ntensors; i++) {
        const TensorSpec *ts = &layout.tensors[i];
        int64_t shape[2] = { ts->shape[0], ts->shape[1] };
        const void *a = safetensors_tensor(&theirs, ts->name, "F32", ts->ndim, shape, err, sizeof err);
        const void *b = safetensors_tensor(&ours, ts->name, "F32", ts->ndim, shape, err, sizeof err);
        cr_assert(a && b, "%s: %s", ts->name, err);
        cr_expect(memcmp(a, b, ts->numel * sizeof(float)) == 0, "%s is not the file's", ts->name);
    }
    safetensors_close(&theirs);
    safetensors_close(&ours);
    snprintf(args, sizeof args, "%s --embd=32 --iters=1 --init-from=%s", TINY, torch_file);
    expect_one_line(run_train(args, err, sizeof err), 1, err,
                    "tensor 'transformer.wte.weight' has shape [65,16], expected [65,32]", "other shapes");
    remove_dir(dir);
}

/* GPT-2's biases through the checkpoint: 3 steps of ZeRO-3 on 2 ranks, resumed
 * by DDP on 2 for 3 more, save the file an unbroken run of 6 saves, byte for
 * byte; a run without biases refuses it. Without clipping: a clipped step's
 * global norm is summed over each strategy's own shards, so its last bit may
 * differ between strategies (docs/strategies.md), and with it every weight. */
Test(files, a_checkpoint_with_biases_resumes_under_another_strategy_to_the_same_bytes, .timeout = 120) {
    char dir[64], args[1024], err[4096], whole[160], resumed[160];
    temp_dir(dir, sizeof dir, "bias");
    static const char MODEL[] = "--layers=2 --embd=16 --heads=2 --block=16 --batch=2 --eval-iters=1 --sample-chars=0 "
                                "--dropout=0.1 --bias=1 --gpus=2 --grad-clip=0";
    snprintf(whole, sizeof whole, "%s/whole/%s", dir, CHECKPOINT_FILE_NAME);
    snprintf(resumed, sizeof resumed, "%s/parts/%s", dir, CHECKPOINT_FILE_NAME);
    snprintf(args, sizeof args, "%s --zero=3 --iters=6 --out=%s/whole", MODEL, dir);
    cr_assert_eq(run_train(args, err, sizeof err), 0, "%s", err);
    snprintf(args, sizeof args, "%s --zero=3 --iters=3 --out=%s/parts", MODEL, dir);
    cr_assert_eq(run_train(args, err, sizeof err), 0, "%s", err);
    snprintf(args, sizeof args, "%s --zero=0 --iters=6 --out=%s/parts --resume=%s", MODEL, dir, resumed);
    cr_assert_eq(run_train(args, err, sizeof err), 0, "%s", err);
    size_t na, nb;
    unsigned char *a = read_all(whole, &na), *b = read_all(resumed, &nb);
    cr_expect(na == nb && memcmp(a, b, na) == 0, "the resumed run's checkpoint differs from the unbroken run's");
    free(a);
    free(b);
    snprintf(args, sizeof args, "--layers=2 --embd=16 --heads=2 --block=16 --iters=8 --init-from=%s", whole);
    expect_one_line(run_train(args, err, sizeof err), 2, err,
                    "bias 1, GELU erf; this run's is 2, 2, 16, 16, 65, 0, erf",
                    "a run without biases from a checkpoint with them");
    remove_dir(dir);
}

/* ---- what the hostile-input probe found: a token folder's files, links
 * that lead nowhere yet, and inputs that are not files ---- */

/* A token folder of 65 ids, 2000 in each split, in dir/name (its meta.json
 * too); the three files' bytes into good[] to compare after. */
static void write_token_folder(const char *dir, const char *name) {
    char path[256];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    cr_assert_eq(mkdir(path, 0777), 0);
    uint16_t ids[2000];
    for (int i = 0; i < 2000; i++) ids[i] = (uint16_t)((i * 37 + i / 11) % 65);
    for (int f = 0; f < 2; f++) {
        snprintf(path, sizeof path, "%s/%s/%s", dir, name, TOKEN_FOLDER_FILE[f]);
        write_all(path, ids, sizeof ids);
    }
    snprintf(path, sizeof path, "%s/%s/%s", dir, name, TOKEN_FOLDER_FILE[2]);
    const char meta[] = "{\"vocab_size\": 65, \"dtype\": \"uint16\"}\n";
    write_all(path, meta, sizeof meta - 1);
}

/* --log or --trace over a token folder's train.bin, val.bin or meta.json (by
 * its path, a hard link, or a folder reached through a link): refused, exit
 * 2, the file as it was. Before, the log truncated the mapped train.bin under
 * the run (SIGBUS) and the trace replaced meta.json (exit 0). */
Test(files, an_output_over_a_token_folders_file_is_refused, .timeout = 120) {
    char dir[64], cmd[512], args[1024], err[4096], path[256];
    temp_dir(dir, sizeof dir, "tokout");
    write_token_folder(dir, "tok");
    snprintf(cmd, sizeof cmd, "cd %s && ln -s tok via && ln tok/train.bin hard.bin", dir);
    cr_assert_eq(system(cmd), 0);
    const char *outputs[] = { "--log=%s/tok/train.bin", "--log=%s/via/val.bin", "--trace=%s/via/meta.json",
                              "--log=%s/hard.bin" };
    for (int f = 0; f < TOKEN_FOLDER_FILES; f++) {
        snprintf(path, sizeof path, "%s/tok/%s", dir, TOKEN_FOLDER_FILE[f]);
        size_t n;
        unsigned char *good = read_all(path, &n);
        for (size_t i = 0; i < sizeof outputs / sizeof outputs[0]; i++) {
            char output[300];
            snprintf(output, sizeof output, outputs[i], dir);
            snprintf(args, sizeof args, "%s --iters=2 --data=%s/tok %s", TINY, dir, output);
            expect_one_line(run_train(args, err, sizeof err), 2, err, "is the same file as --data's", output);
            expect_unchanged(path, good, n, "a refused run changed the token folder");
        }
        free(good);
    }
    remove_dir(dir);
}

/* Outputs through symbolic links that lead nowhere yet are the files the
 * links would make: --log and --trace through two links to one new file, and
 * --log through a link to where --out's checkpoint will be. Refused, exit 2. */
Test(files, outputs_through_links_to_one_new_file_are_refused, .timeout = 60) {
    char dir[64], cmd[512], args[1024], err[4096];
    temp_dir(dir, sizeof dir, "dangling");
    snprintf(cmd, sizeof cmd, "cd %s && ln -s new.txt a && ln -s %s/new.txt b && mkdir run && ln -s run/%s c", dir,
             dir, CHECKPOINT_FILE_NAME);
    cr_assert_eq(system(cmd), 0);
    snprintf(args, sizeof args, "%s --iters=2 --log=%s/a --trace=%s/b", TINY, dir, dir);
    expect_one_line(run_train(args, err, sizeof err), 2, err, "is the same file as --trace", "two links to new.txt");
    snprintf(args, sizeof args, "%s --iters=2 --log=%s/c --out=%s/run", TINY, dir, dir);
    expect_one_line(run_train(args, err, sizeof err), 2, err, "is the same file as --out's checkpoint",
                    "a link to the checkpoint to be");
    remove_dir(dir);
}

/* Every file a tool reads, given as a FIFO that nothing writes: one line and
 * exit 1 at once, never an open that waits for a writer (before, each tool
 * hung there, bin/train deaf to SIGTERM). */
Test(files, an_input_that_is_a_fifo_is_refused_at_once, .timeout = 120) {
    char dir[64], fifo[128], cmd[512], args[1024], err[4096];
    temp_dir(dir, sizeof dir, "fifoin");
    snprintf(fifo, sizeof fifo, "%s/fifo", dir);
    cr_assert_eq(mkfifo(fifo, 0666), 0);
    write_token_folder(dir, "tok");
    snprintf(cmd, sizeof cmd, "cd %s && rm tok/meta.json && mkfifo tok/meta.json", dir);
    cr_assert_eq(system(cmd), 0);
    struct { const char *(*binary)(void); const char *args; } cases[] = {
        { train_binary, "--iters=2 --resume=%s" },
        { train_binary, "--iters=2 --init-from=%s" }, { sample_binary, "--ckpt=%s" },
        { export_binary, "--ckpt=%s --hf=%s.hf" }, { prepare_binary, "--tokenizer=%s --data=data/tinyshakespeare.txt "
                                                                        "--out=%s.out" },
    };
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        char flags[512];
        snprintf(flags, sizeof flags, cases[c].args, fifo, fifo);
        int is_train = cases[c].binary == train_binary;
        snprintf(args, sizeof args, "%s %s", is_train ? TINY : "", flags);
        snprintf(cmd, sizeof cmd, "timeout -k 1 20 %s", cases[c].binary());
        expect_one_line(run_tool(cmd, args, "/dev/null", err, sizeof err), 1, err, "is not a regular file", flags);
    }
    snprintf(cmd, sizeof cmd, "timeout -k 1 20 %s", train_binary());
    snprintf(args, sizeof args, "%s --iters=2 --data=%s/tok", TINY, dir);
    expect_one_line(run_tool(cmd, args, "/dev/null", err, sizeof err), 1, err, "is not a regular file",
                    "a token folder's meta.json");
    write_token_folder(dir, "tok2");
    snprintf(args, sizeof args, "%s --iters=2 --data=%s/tok2 --tokenizer=%s", TINY, dir, fifo);
    expect_one_line(run_tool(cmd, args, "/dev/null", err, sizeof err), 1, err, "is not a regular file",
                    "--tokenizer");
    remove_dir(dir);
}
