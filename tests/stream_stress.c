/* stream_stress.c: the multi-threaded stream workout of stream_stress.h. */
#include "stream_stress.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <time.h>

typedef struct { atomic_int *cell; int value; } WriteArgs;
typedef struct { atomic_int *cell; int *seen; } ReadArgs;

static void slow_write_task(void *p) {
    WriteArgs *a = p;
    struct timespec t = { 0, 50 * 1000 };
    nanosleep(&t, NULL);
    atomic_store(a->cell, a->value);
}

static void read_task(void *p) {
    ReadArgs *a = p;
    *a->seen = atomic_load(a->cell);
}

typedef struct { Device *dev; int rounds; int wrong; } DriverArgs;

static void *driver(void *p) {
    DriverArgs *d = p;
    Stream *a = stream_create(d->dev), *b = stream_create(d->dev);
    Event *written = event_create(d->dev), *read = event_create(d->dev);
    atomic_int cell = 0;
    int seen = 0;
    for (int round = 1; round <= d->rounds; round++) {
        WriteArgs w = { &cell, round };
        stream_launch(a, slow_write_task, &w, sizeof w);
        event_record(written, a);
        stream_wait_event(b, written);
        ReadArgs r = { &cell, &seen };
        stream_launch(b, read_task, &r, sizeof r);
        event_record(read, b);
        stream_wait_event(a, read);  /* the next write waits for this read */
        stream_synchronize(b);
        if (seen != round) d->wrong++;
    }
    stream_synchronize(a);
    event_destroy(written);
    event_destroy(read);
    stream_destroy(a);
    stream_destroy(b);
    return NULL;
}

int stream_stress(Device *dev, int threads, int rounds) {
    pthread_t *t = malloc(sizeof *t * threads);
    DriverArgs *args = malloc(sizeof *args * threads);
    for (int i = 0; i < threads; i++) {
        args[i] = (DriverArgs){ dev, rounds, 0 };
        pthread_create(&t[i], NULL, driver, &args[i]);
    }
    int wrong = 0;
    for (int i = 0; i < threads; i++) {
        pthread_join(t[i], NULL);
        wrong += args[i].wrong;
    }
    free(t);
    free(args);
    return wrong;
}
