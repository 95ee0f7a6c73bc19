/* test_profile.c: the per-op profile (runtime/profile.h) on the CPU backend.
 *
 * Its totals and its table from given times; the spans of a real stream, each
 * op's time within its step and the ops outside a step left out; and bin/train
 * with ZF_PROFILE=1, whose table names the model's ops and whose times add up
 * to no more than the step's, and without it, no table; on a GPU, where one
 * is visible, the same table from CUDA's events (bf16: the tensor cores'
 * attention among the ops).
 */
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../kernels/kernels.h"
#include "../runtime/profile.h"
#include "fixtures.h"

/* The table profile_print writes (malloc'd). */
static char *table_of(const Profile *p) {
    char *text = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&text, &len);
    cr_assert_not_null(f);
    profile_print(p, "the test's", f);
    fclose(f);
    return text;
}

/* The ms of the table's row `name` ("| name | calls | ms | share |"), and its calls per step; -1 if absent. */
static double row_ms(const char *table, const char *name, double *calls) {
    char key[64];
    snprintf(key, sizeof key, "| %-22s |", name);
    const char *at = strstr(table, key);
    double ms = -1.0;
    if (at && sscanf(at + strlen(key), " %lf | %lf |", calls, &ms) != 2) ms = -1.0;
    return ms;
}

/* The wall ms a step from the table's head ("..., X ms a step (wall)"). */
static double step_ms(const char *table) {
    const char *at = strstr(table, " ms a step (wall)");
    cr_assert_not_null(at, "no step time in:\n%s", table);
    while (at > table && at[-1] != ' ') at--;
    return atof(at);
}

Test(profile, the_totals_are_per_op_sorted_by_time_with_calls_and_shares_per_step) {
    Profile *p = profile_create();
    profile_add(p, "gelu_forward", 1000000);
    profile_add(p, "matmul_forward", 3000000);
    profile_add(p, "matmul_forward", 3000000);
    profile_add(p, "attention_forward", 2000000);
    profile_add(p, "layernorm_forward", 2000000);
    profile_add_step(p, 10000000);
    profile_add_step(p, 10000000);
    ProfileRow rows[PROFILE_MAX_OPS];
    cr_assert_eq(profile_rows(p, rows), 4);
    const char *order[] = { "matmul_forward", "attention_forward", "layernorm_forward", "gelu_forward" };
    for (int i = 0; i < 4; i++) cr_expect_str_eq(rows[i].name, order[i], "row %d", i);  /* ties by name */
    cr_expect_eq(rows[0].calls, 2);
    cr_expect_eq(rows[0].ns, 6000000);
    char *table = table_of(p);
    cr_expect(strstr(table, "profile: the test's, 2 steps, 10.000 ms a step (wall)\n"), "%s", table);
    cr_expect(strstr(table, "| matmul_forward         |        1.0 |     3.000 |  30.0% |\n"), "%s", table);
    cr_expect(strstr(table, "| gelu_forward           |        0.5 |     0.500 |   5.0% |\n"), "%s", table);
    cr_expect(strstr(table, "| all ops                |        2.5 |     5.500 |  55.0% |\n"), "%s", table);
    cr_expect(strstr(table, "| op ") < strstr(table, "| matmul_forward"), "%s", table);
    free(table);
    profile_destroy(p);
}

Test(profile, a_profile_of_no_step_says_so) {
    Profile *p = profile_create();
    char *table = table_of(p);
    cr_expect_str_eq(table, "profile: no step done\n");
    free(table);
    profile_destroy(p);
}

/* Two steps of ops on a CPU stream, an op between them: each step's ops
 * timed by the stream's own stamps, the first step left out, the op outside
 * a step not counted, every op's time within the step's. */
Test(profile, a_streams_ops_are_timed_within_their_steps_the_first_left_out) {
    enum { N = 1 << 20 };
    Device *dev = device_create_cpu(1, -1);
    Stream *s = stream_create(dev);
    float *a = device_alloc(dev, MEM_ACTIVATIONS, N * sizeof(float));
    float *b = device_alloc(dev, MEM_ACTIVATIONS, N * sizeof(float));
    Profile *p = profile_create();
    profile_attach(p, s);
    for (int step = 0; step < 3; step++) {
        profile_step_begin(p);
        fill_zero(s, a, N);
        for (int k = 0; k <= step; k++)  /* more calls each step */
            residual_forward(s, fp32_buf(b), fp32_numbers(a), fp32_numbers(a), N, DTYPE_FP32);
        profile_step_end(p);
        gelu_forward(s, fp32_buf(b), fp32_numbers(a), N, 1, DTYPE_FP32);  /* between steps: an evaluation's, left out */
    }
    char *table = table_of(p);
    cr_expect(strstr(table, ", 2 steps (the first left out), "), "%s", table);
    double calls, fill = row_ms(table, "fill_zero", &calls);
    cr_expect(fill >= 0 && calls == 1.0, "%s", table);
    double residual = row_ms(table, "residual_forward", &calls);
    cr_expect(residual > 0 && calls == 2.5, "steps 2 and 3: 2 and 3 calls\n%s", table);  /* not step 1's one */
    cr_expect_lt(row_ms(table, "gelu_forward", &calls), 0.0, "%s", table);
    double all = row_ms(table, "all ops", &calls);
    cr_expect(all >= residual && all <= step_ms(table), "%s", table);
    free(table);
    profile_detach(s);
    stream_synchronize(s);
    gelu_forward(s, fp32_buf(b), fp32_numbers(a), N, 1, DTYPE_FP32);  /* detached: nothing recorded, nothing read */
    profile_destroy(p);
    stream_synchronize(s);
    device_free(dev, MEM_ACTIVATIONS, a, N * sizeof(float));
    device_free(dev, MEM_ACTIVATIONS, b, N * sizeof(float));
    stream_destroy(s);
    device_destroy(dev);
}

/* bin/train's stdout with ZF_PROFILE set to `profile` (NULL: unset), into text. */
static void train_output(const char *profile, const char *args, char *text, size_t len) {
    char dir[256], out[512], err[2048];
    temp_dir(dir, sizeof dir, "profile");
    snprintf(out, sizeof out, "%s/out.txt", dir);
    if (profile) setenv("ZF_PROFILE", profile, 1);
    else unsetenv("ZF_PROFILE");
    int rc = run_tool(train_binary(), args, out, err, sizeof err);
    unsetenv("ZF_PROFILE");
    cr_assert_eq(rc, 0, "%s", err);
    take_text(out, text, len);
    remove_dir(dir);
}

/* bin/train's table with ZF_PROFILE=1 for these flags: the model's ops each
 * there, and their times adding up to no more than the step's. */
static void expect_profile_table(const char *args) {
    char text[16384];
    train_output("1", args, text, sizeof text);
    cr_assert(strstr(text, "profile: rank 0's compute stream, 2 steps (the first left out), "), "%s", text);
    const char *ops[] = { "matmul_forward", "matmul_backward", "attention_forward", "attention_backward",
                          "layernorm_forward", "layernorm_backward", "gelu_forward", "embedding_forward",
                          "adamw_arena" };
    double calls, sum = 0.0;
    for (size_t i = 0; i < sizeof ops / sizeof ops[0]; i++) {
        double ms = row_ms(text, ops[i], &calls);
        cr_expect(ms >= 0 && calls >= 1.0, "%s: %.3f ms, %.1f calls\n%s", ops[i], ms, calls, text);
        sum += ms;
    }
    /* the gradient's squared norm made once a step, by the non-finite check,
     * and reused by the clip, which AdamW applies as it reads (no clip_scale) */
    cr_expect(row_ms(text, "sumsq_reduce", &calls) >= 0 && calls == 1.0, "sumsq_reduce: %.1f calls a step\n%s", calls,
              text);
    cr_expect(row_ms(text, "clip_scale", &calls) < 0, "a clip_scale op\n%s", text);
    double all = row_ms(text, "all ops", &calls);
    cr_expect(all >= sum - 0.01 && all <= step_ms(text), "all ops %.3f ms, the step %.3f ms\n%s", all,
              step_ms(text), text);
}

Test(profile, bin_train_prints_the_table_with_zf_profile_and_nothing_without, .timeout = 120) {
    char args[512], text[16384];
    snprintf(args, sizeof args, "%s --iters=3 --eval-every=0 --zero=3 --gpus=2", TINY);
    expect_profile_table(args);
    train_output(NULL, args, text, sizeof text);
    cr_expect_null(strstr(text, "profile"), "%s", text);
    train_output("0", args, text, sizeof text);
    cr_expect_null(strstr(text, "profile"), "%s", text);
}

Test(profile, bin_train_profiles_a_gpus_ops_from_its_events, .timeout = 120) {
    if (device_cuda_count() <= 0) test_skip("no GPU visible: the CUDA events' profile did not run");
    char args[512];
    snprintf(args, sizeof args, "%s --iters=3 --eval-every=0 --zero=3 --gpus=2 --device=cuda --dtype=bf16", TINY);
    expect_profile_table(args);
}
