// The same malloc/free calls over a heap of LIVE blocks, for bench/report_scaling.sh:
// LIVE blocks of 16..271 bytes are allocated, then N times a random one is freed and
// allocated again (2 calls each), then all are freed. Each slot keeps its size: glibc
// hands the chunk back from its thread cache, so the heap neither grows nor fragments
// (under fragmentation, glibc's mallinfo2, which the recording calls at each snapshot,
// walks every free chunk). The calls differ between two LIVE only in which slot they
// touch, so a report's cost that grows with LIVE is the cost of the heap held, not of
// the calls. With THREADS above 1, as many threads make these calls at once, each over a
// heap of its own of LIVE blocks (the merge of several threads' calls over a big heap).
// With RATE, each thread makes at most RATE calls a second (it sleeps when ahead), a
// server's steady load rather than a loop's fastest.
// usage: held_churn LIVE N [THREADS [RATE]]
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

static size_t live = 4096;
static long n = 10000000;
static double rate = 0;

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + t.tv_nsec * 1e-9;
}

// Sleeps until `calls` calls from `start` are due at `rate` a second.
static void pace(double start, long calls) {
    double ahead = start + calls / rate - now();
    if (ahead > 0) {
        struct timespec t = {(time_t)ahead, (long)((ahead - (time_t)ahead) * 1e9)};
        nanosleep(&t, 0);
    }
}

static void *run(void *arg) {
    void **slots = malloc(live * sizeof *slots);
    uint16_t *sizes = malloc(live * sizeof *sizes);
    uint64_t x = 88172645463325252ULL + (uintptr_t)arg;
    for (size_t i = 0; i < live; i++) {
        x ^= x << 13; x ^= x >> 7; x ^= x << 17;
        sizes[i] = 16 + (x >> 32) % 256;
        slots[i] = malloc(sizes[i]);
    }
    long sum = 0;
    double start = now();
    for (long i = 0; i < n; i++) {
        if (rate > 0 && (i & 4095) == 0) pace(start, 2 * i);
        x ^= x << 13; x ^= x >> 7; x ^= x << 17;
        size_t k = x % live;
        free(slots[k]);
        slots[k] = malloc(sizes[k]);
        sum += (long)((uintptr_t)slots[k] & 16);
    }
    for (size_t i = 0; i < live; i++) free(slots[i]);
    free(slots);
    free(sizes);
    return (void *)sum;
}

int main(int argc, char **argv) {
    if (argc > 1) live = strtoul(argv[1], 0, 10);
    if (argc > 2) n = atol(argv[2]);
    int threads = argc > 3 ? atoi(argv[3]) : 1;
    if (argc > 4) rate = atof(argv[4]);
    if (threads < 1 || threads > 64) return 2;
    long sum = 0;
    if (threads == 1) {
        sum = (long)run(0);
    } else {
        pthread_t t[64];
        for (int i = 0; i < threads; i++) pthread_create(&t[i], 0, run, (void *)(uintptr_t)i);
        for (int i = 0; i < threads; i++) {
            void *r;
            pthread_join(t[i], &r);
            sum += (long)r;
        }
    }
    printf("%ld\n", sum);
    return 0;
}
