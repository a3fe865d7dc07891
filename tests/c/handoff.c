/* handoff.c: the main thread allocates blocks and hands them to workers that free them
 * and then allocate on their own, while it waits for them, making no call meanwhile. It
 * allocates before starting the workers ("before") or after, while they wait for a flag
 * ("after"), and waits in pthread_join, or ("sleep") allocates after and sleeps until
 * they are done. Its allocations must reach the trace before the workers' frees.
 * usage: handoff before|after|sleep [blocks=2000] [rounds=300000] */
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

enum { WORKERS = 4 };
static void **blocks;
static int n_blocks;
static long rounds;
static atomic_int handed_over, done;
static void *volatile sink; /* keeps the compiler from removing malloc/free pairs */

static void *worker(void *arg) {
    long w = (long)arg;
    while (!atomic_load(&handed_over)) {
    }
    for (int i = (int)w; i < n_blocks; i += WORKERS) free(blocks[i]);
    for (long i = 0; i < rounds; i++) {
        void *p = malloc(64 + (size_t)(i & 255));
        sink = p;
        free(p);
    }
    atomic_fetch_add(&done, 1);
    return NULL;
}

static void allocate(void) {
    blocks = malloc(sizeof *blocks * (size_t)n_blocks);
    for (int i = 0; i < n_blocks; i++) blocks[i] = malloc(100);
    atomic_store(&handed_over, 1);
}

int main(int argc, char **argv) {
    const char *mode = argc > 1 ? argv[1] : "before";
    int before = strcmp(mode, "before") == 0;
    n_blocks = argc > 2 ? atoi(argv[2]) : 2000;
    rounds = argc > 3 ? atol(argv[3]) : 300000;
    if (before) allocate();
    pthread_t t[WORKERS];
    for (long w = 0; w < WORKERS; w++) pthread_create(&t[w], NULL, worker, (void *)w);
    if (!before) allocate();
    if (strcmp(mode, "sleep") == 0) {
        struct timespec ms = {0, 1000000};
        while (atomic_load(&done) < WORKERS) nanosleep(&ms, NULL);
    }
    for (int w = 0; w < WORKERS; w++) pthread_join(t[w], NULL);
    free(blocks);
    puts("done");
    return 0;
}
