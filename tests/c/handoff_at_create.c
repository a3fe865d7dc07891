/* handoff_at_create.c: the main thread allocates blocks, starts workers that free them
 * and then allocate on their own, and waits for the workers in pthread_join, making no
 * call meanwhile. Its allocations must reach the trace before the workers' frees.
 * usage: handoff_at_create [blocks=2000] [rounds=300000] */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>

enum { WORKERS = 4 };
static void **blocks;
static int n_blocks;
static long rounds;
static void *volatile sink; /* keeps the compiler from removing malloc/free pairs */

static void *worker(void *arg) {
    long w = (long)arg;
    for (int i = (int)w; i < n_blocks; i += WORKERS) free(blocks[i]);
    for (long i = 0; i < rounds; i++) {
        void *p = malloc(64 + (size_t)(i & 255));
        sink = p;
        free(p);
    }
    return NULL;
}

int main(int argc, char **argv) {
    n_blocks = argc > 1 ? atoi(argv[1]) : 2000;
    rounds = argc > 2 ? atol(argv[2]) : 300000;
    blocks = malloc(sizeof *blocks * (size_t)n_blocks);
    for (int i = 0; i < n_blocks; i++) blocks[i] = malloc(100);
    pthread_t t[WORKERS];
    for (long w = 0; w < WORKERS; w++) pthread_create(&t[w], NULL, worker, (void *)w);
    for (int w = 0; w < WORKERS; w++) pthread_join(t[w], NULL);
    free(blocks);
    puts("done");
    return 0;
}
