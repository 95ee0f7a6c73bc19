/* profile.c: each op's device time, summed over the steps (profile.h).
 *
 * Each profiled stream has a lane: the spans of the step in flight, each two
 * stamps the stream fills as it runs, so a span never moves once begun. At
 * the step's end the stamps are read into the totals, one row per op name,
 * and the lane starts empty again.
 */
#include "profile.h"

#include <stdlib.h>
#include <string.h>

#include "device_backend.h"
#include "host.h"

typedef struct {
    const char *name;
    Stamp start, end;
} ProfileSpan;

struct ProfileLane {
    Profile *profile;
    Stream *stream;
    ProfileSpan *spans;        /* PROFILE_MAX_SPANS, allocated once: untouched pages cost nothing */
    int nspans;
    int open;                  /* a span begun and not ended */
    int open_kept;             /* and kept (not dropped past the bound) */
    long dropped;              /* spans past PROFILE_MAX_SPANS in a step */
};

struct Profile {
    int recording;             /* between profile_step_begin and profile_step_end */
    double step_start;         /* host_seconds at profile_step_begin */
    struct ProfileLane lanes[PROFILE_MAX_LANES];
    int nlanes;
    ProfileRow rows[PROFILE_MAX_OPS];
    int nrows;
    int steps;                 /* kept in the totals */
    int64_t step_ns;           /* their wall time */
    int warmup_left_out;       /* the first step, once the second came */
};

Profile *profile_create(void) { return host_calloc(1, sizeof(Profile)); }

/* Wait for the profiled streams, so that every stamp enqueued is filled. */
static void wait_streams(Profile *p) {
    for (int i = 0; i < p->nlanes; i++)
        if (p->lanes[i].stream) stream_synchronize(p->lanes[i].stream);
}

/* Read (and so free) every stamp of a waited-for lane; each span's time is
 * added to the totals when `keep`. */
static void read_lane(struct ProfileLane *lane, int keep) {
    for (int k = 0; k < lane->nspans; k++) {
        ProfileSpan *span = &lane->spans[k];
        int64_t ns = stamp_elapsed(&span->start, &span->end);
        if (keep) profile_add(lane->profile, span->name, ns);
    }
    lane->nspans = 0;
}

static void read_lanes(Profile *p, int keep) {
    for (int i = 0; i < p->nlanes; i++) read_lane(&p->lanes[i], keep);
}

void profile_detach(Stream *s) {
    struct ProfileLane *lane = s->profile;
    if (!lane) return;
    stream_synchronize(s);
    read_lane(lane, 0);
    lane->stream = NULL;
    s->profile = NULL;
}

void profile_destroy(Profile *p) {
    if (!p) return;
    for (int i = 0; i < p->nlanes; i++) {
        if (p->lanes[i].stream) profile_detach(p->lanes[i].stream);
        free(p->lanes[i].spans);
    }
    free(p);
}

void profile_attach(Profile *p, Stream *s) {
    if (p->nlanes == PROFILE_MAX_LANES) host_fatal("a profile of more than 64 streams");
    struct ProfileLane *lane = &p->lanes[p->nlanes++];
    *lane = (struct ProfileLane){ .profile = p, .stream = s };
    lane->spans = host_calloc(PROFILE_MAX_SPANS, sizeof *lane->spans);
    s->profile = lane;
}

void profile_begin(Stream *s, const char *name) {
    struct ProfileLane *lane = s->profile;
    if (!lane) return;
    if (lane->open) host_fatal("profile_begin inside an op's span");
    lane->open = 1;
    lane->open_kept = lane->profile->recording && lane->nspans < PROFILE_MAX_SPANS;
    if (lane->profile->recording && !lane->open_kept) lane->dropped++;
    if (!lane->open_kept) return;
    ProfileSpan *span = &lane->spans[lane->nspans];
    span->name = name;
    stream_stamp(s, &span->start);
}

void profile_end(Stream *s) {
    struct ProfileLane *lane = s->profile;
    if (!lane) return;
    if (!lane->open) host_fatal("profile_end without its profile_begin");
    lane->open = 0;
    if (!lane->open_kept) return;
    stream_stamp(s, &lane->spans[lane->nspans].end);
    lane->nspans++;
}

void profile_step_begin(Profile *p) {
    wait_streams(p);
    p->recording = 1;
    p->step_start = host_seconds();
}

/* The first step's totals go once a second step is done. */
static void leave_out_warmup(Profile *p) {
    if (p->warmup_left_out || p->steps != 1) return;
    p->nrows = 0;
    p->steps = 0;
    p->step_ns = 0;
    p->warmup_left_out = 1;
}

void profile_step_end(Profile *p) {
    wait_streams(p);
    int64_t ns = (int64_t)((host_seconds() - p->step_start) * 1e9);
    p->recording = 0;
    leave_out_warmup(p);
    read_lanes(p, 1);
    profile_add_step(p, ns);
}

static ProfileRow *row_of(Profile *p, const char *name) {
    for (int i = 0; i < p->nrows; i++)
        if (strcmp(p->rows[i].name, name) == 0) return &p->rows[i];
    if (p->nrows == PROFILE_MAX_OPS) host_fatal("a profile of more than 64 op names");
    p->rows[p->nrows] = (ProfileRow){ .name = name };
    return &p->rows[p->nrows++];
}

void profile_add(Profile *p, const char *name, int64_t ns) {
    ProfileRow *row = row_of(p, name);
    row->calls++;
    row->ns += ns;
}

void profile_add_step(Profile *p, int64_t ns) {
    p->steps++;
    p->step_ns += ns;
}

static int most_time_first(const void *a, const void *b) {
    const ProfileRow *x = a, *y = b;
    if (x->ns != y->ns) return x->ns > y->ns ? -1 : 1;
    return strcmp(x->name, y->name);
}

int profile_rows(const Profile *p, ProfileRow rows[PROFILE_MAX_OPS]) {
    memcpy(rows, p->rows, (size_t)p->nrows * sizeof *rows);
    qsort(rows, (size_t)p->nrows, sizeof *rows, most_time_first);
    return p->nrows;
}

static void print_row(FILE *f, const char *name, double calls, double ms, double step_ms) {
    fprintf(f, "| %-22s | %10.1f | %9.3f | %5.1f%% |\n", name, calls, ms, step_ms > 0 ? 100.0 * ms / step_ms : 0.0);
}

void profile_print(const Profile *p, const char *whose, FILE *f) {
    if (p->steps == 0) {
        fprintf(f, "profile: no step done\n");
        return;
    }
    double steps = p->steps, step_ms = (double)p->step_ns / 1e6 / steps;
    fprintf(f, "profile: %s, %d steps%s, %.3f ms a step (wall)\n", whose, p->steps,
            p->warmup_left_out ? " (the first left out)" : "", step_ms);
    fprintf(f, "| %-22s | %10s | %9s | %6s |\n", "op", "calls/step", "ms/step", "share");
    fprintf(f, "|------------------------|------------|-----------|--------|\n");
    ProfileRow rows[PROFILE_MAX_OPS];
    int n = profile_rows(p, rows);
    long calls = 0;
    int64_t ns = 0;
    for (int i = 0; i < n; i++) {
        print_row(f, rows[i].name, (double)rows[i].calls / steps, (double)rows[i].ns / 1e6 / steps, step_ms);
        calls += rows[i].calls;
        ns += rows[i].ns;
    }
    print_row(f, "all ops", (double)calls / steps, (double)ns / 1e6 / steps, step_ms);
    long dropped = 0;
    for (int i = 0; i < p->nlanes; i++) dropped += p->lanes[i].dropped;
    if (dropped) fprintf(f, "profile: %ld spans dropped past %d a stream a step\n", dropped, PROFILE_MAX_SPANS);
}
