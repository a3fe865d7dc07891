// Larson's server load as its paper describes it: THREADS threads, each with an array of
// SLOTS blocks of its own, free a random slot's block and put a fresh one of 8..1000
// bytes there, ROUNDS times; then each hands its array to a successor thread, which goes
// on with the blocks its predecessor allocated (so frees cross threads), GENERATIONS times.
// Prints operations per second (an operation is one free and one malloc).
// Usage: larson_handover [THREADS=2] [ROUNDS=500000] [GENERATIONS=8] [SLOTS=5000]
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

static long rounds, generations, slots;

struct worker {
    void **blocks;
    unsigned seed;
    long generation;
};

static unsigned next_random(unsigned *s) {
    *s ^= *s << 13;
    *s ^= *s >> 17;
    *s ^= *s << 5;
    return *s;
}

static void *run(void *arg) {
    struct worker *w = arg;
    for (long i = 0; i < rounds; i++) {
        long slot = next_random(&w->seed) % slots;
        free(w->blocks[slot]);
        w->blocks[slot] = malloc(8 + next_random(&w->seed) % 993);
    }
    if (++w->generation < generations) {
        pthread_t successor;
        pthread_create(&successor, NULL, run, w);
        pthread_detach(successor);
        return NULL;
    }
    return w;
}

int main(int argc, char **argv) {
    int threads = argc > 1 ? atoi(argv[1]) : 2;
    rounds = argc > 2 ? atol(argv[2]) : 500000;
    generations = argc > 3 ? atol(argv[3]) : 8;
    slots = argc > 4 ? atol(argv[4]) : 5000;
    struct worker *w = calloc(threads, sizeof *w);
    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    for (int t = 0; t < threads; t++) {
        w[t].blocks = calloc(slots, sizeof(void *));
        w[t].seed = 2463534242u + t;
        for (long s = 0; s < slots; s++)
            w[t].blocks[s] = malloc(8 + next_random(&w[t].seed) % 993);
    }
    // Each line of successors ends by setting its generation to GENERATIONS.
    for (int t = 0; t < threads; t++) {
        pthread_t first;
        pthread_create(&first, NULL, run, &w[t]);
        pthread_detach(first);
    }
    for (int t = 0; t < threads; t++)
        while (__atomic_load_n(&w[t].generation, __ATOMIC_ACQUIRE) < generations) {
            struct timespec nap = {0, 1000000};
            nanosleep(&nap, NULL);
        }
    clock_gettime(CLOCK_MONOTONIC, &t1);
    double s = (t1.tv_sec - t0.tv_sec) + (t1.tv_nsec - t0.tv_nsec) / 1e9;
    printf("%.0f operations/s\n", threads * rounds * generations / s);
    return 0;
}
