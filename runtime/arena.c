/* arena.c: building the unit-by-unit size table of arena.h. */
#include "arena.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

void arena_init(ArenaLayout *a, int shard_multiple) {
    memset(a, 0, sizeof *a);
    a->shard_multiple = shard_multiple > 0 ? shard_multiple : 1;
}

void arena_begin_unit(ArenaLayout *a) {
    if (a->nunits == ARENA_MAX_UNITS) { fprintf(stderr, "fatal: too many units\n"); abort(); }
    UnitSpec *u = &a->units[a->nunits++];
    u->offset = a->total;
    u->used = 0;
    u->size = 0;
}

/* n rounded up to a multiple of m. */
static size_t round_up(size_t n, size_t m) { return (n + m - 1) / m * m; }

int arena_add_tensor(ArenaLayout *a, const char *name, int rows, int cols) {
    if (a->ntensors == ARENA_MAX_TENSORS) { fprintf(stderr, "fatal: too many tensors\n"); abort(); }
    UnitSpec *u = &a->units[a->nunits - 1];
    TensorSpec *t = &a->tensors[a->ntensors];
    snprintf(t->name, sizeof t->name, "%s", name);
    t->unit = a->nunits - 1;
    t->ndim = cols > 0 ? 2 : 1;
    t->shape[0] = rows;
    t->shape[1] = cols > 0 ? cols : 1;
    t->numel = (size_t)rows * (size_t)t->shape[1];
    size_t start = round_up(u->used, ARENA_ALIGN);  /* the tensor's boundary, a gap of zeros before it */
    t->offset = u->offset + start;
    u->used = start + t->numel;
    a->numel += t->numel;
    return a->ntensors++;
}

static size_t gcd(size_t a, size_t b) { return b ? gcd(b, a % b) : a; }

void arena_end_unit(ArenaLayout *a) {
    UnitSpec *u = &a->units[a->nunits - 1];
    size_t m = (size_t)a->shard_multiple / gcd((size_t)a->shard_multiple, ARENA_ALIGN) * ARENA_ALIGN;
    u->size = round_up(u->used, m);
    a->total = u->offset + u->size;
}

int arena_find(const ArenaLayout *a, const char *name) {
    for (int i = 0; i < a->ntensors; i++)
        if (strcmp(a->tensors[i].name, name) == 0) return i;
    return -1;
}

size_t arena_largest_tensor(const ArenaLayout *a) {
    size_t most = 0;
    for (int i = 0; i < a->ntensors; i++)
        if (a->tensors[i].numel > most) most = a->tensors[i].numel;
    return most;
}
