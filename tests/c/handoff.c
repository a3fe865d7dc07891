/* handoff.c: the main thread allocates blocks and hands them to workers that free them
 * and then allocate on their own, while it waits for them in pthread_join, making no
 * call meanwhile. It allocates before starting the workers ("before") or after, while
 * they wait for a flag ("after"). Its allocations must reach the trace before the
 * workers' frees.  usage: handoff before|after [blocks=2000] [rounds=300000] */
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

enum { WORKERS = 4 };
static void **blocks;
static int n_blocks;
static long rounds;
static atomic_int handed_over;
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
    return NULL;
}

static void allocate(void) {
    blocks = malloc(sizeof *blocks * (size_t)n_blocks);
    for (int i = 0; i < n_blocks; i++) blocks[i] = malloc(100);
    atomic_store(&handed_over, 1);
}

int main(int argc, char **argv) {
    int before = argc < 2 || strcmp(argv[1], "after") != 0;
    n_blocks = argc > 2 ? atoi(argv[2]) : 2000;
    rounds = argc > 3 ? atol(argv[3]) : 300000;
    if (before) allocate();
    pthread_t t[WORKERS];
    for (long w = 0; w < WORKERS; w++) pthread_create(&t[w], NULL, worker, (void *)w);
    if (!before) allocate();
    for (int w = 0; w < WORKERS; w++) pthread_join(t[w], NULL);
    free(blocks);
    puts("done");
    return 0;
}
