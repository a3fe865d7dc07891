// held_churn.c's calls in THREADS threads at once, each over a heap of its own of LIVE
// blocks: the merge of several threads' calls (each call checked against the live
// blocks before it is taken) over a big heap. usage: held_churn_threads LIVE N THREADS
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

static size_t live = 500000;
static long n = 5000000;

static void *run(void *arg) {
    uint64_t x = 88172645463325252ULL + (uintptr_t)arg;
    void **slots = malloc(live * sizeof *slots);
    uint16_t *sizes = malloc(live * sizeof *sizes);
    for (size_t i = 0; i < live; i++) {
        x ^= x << 13; x ^= x >> 7; x ^= x << 17;
        sizes[i] = 16 + (x >> 32) % 256;
        slots[i] = malloc(sizes[i]);
    }
    long sum = 0;
    for (long i = 0; i < n; i++) {
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
    int threads = argc > 3 ? atoi(argv[3]) : 2;
    pthread_t t[64];
    if (threads < 1 || threads > 64) return 2;
    for (int i = 0; i < threads; i++) pthread_create(&t[i], 0, run, (void *)(uintptr_t)i);
    long sum = 0;
    for (int i = 0; i < threads; i++) {
        void *r;
        pthread_join(t[i], &r);
        sum += (long)r;
    }
    printf("%ld\n", sum);
    return 0;
}
