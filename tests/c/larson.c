/* larson.c: a larson-style server load. Each thread swaps a fresh block of 8..1007 bytes
 * into a random slot of one shared array and frees the block that was there (usually
 * another thread's), so blocks keep changing threads. Halfway, every worker waits at a
 * barrier while the main thread sums the blocks then in the slots and marks the moment
 * with free(malloc(MARK_BYTES)); at the end the main thread frees every slot, so the
 * program itself leaves nothing live. "bursts" makes each thread work in bursts of 2000
 * operations with a 20-40 ms sleep between them, like a thread pool.
 * Prints "mid: BYTES bytes in BLOCKS blocks" to stderr: the program's live blocks at the mark.
 * usage: larson [threads=8] [operations per thread=100000] [saturate|bursts] */
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define MARK_BYTES 1234567
enum { SLOTS = 4096, BURST = 2000 };
static _Atomic(size_t *) slots[SLOTS];
static long operations;
static int bursts;
static pthread_barrier_t halfway, resume;
static void *volatile mark; /* keeps the compiler from removing the mark's malloc/free */

static void swap_one(unsigned *seed) {
    *seed = *seed * 1103515245u + 12345u;
    size_t size = 8 + (*seed >> 4) % 1000;
    size_t *mine = malloc(size);
    *mine = size; /* the block remembers its size, for the sum at the mark */
    *seed = *seed * 1103515245u + 12345u;
    size_t *theirs = atomic_exchange(&slots[(*seed >> 8) % SLOTS], mine);
    free(theirs);
}

static void run(unsigned *seed, long n) {
    for (long i = 0; i < n; i++) {
        swap_one(seed);
        if (bursts && (i + 1) % BURST == 0) {
            *seed = *seed * 1103515245u + 12345u;
            struct timespec pause = {0, (20 + (long)((*seed >> 8) % 21)) * 1000000L};
            nanosleep(&pause, NULL);
        }
    }
}

static void *worker(void *arg) {
    unsigned seed = (unsigned)(uintptr_t)arg * 2654435761u;
    run(&seed, operations / 2);
    pthread_barrier_wait(&halfway);
    pthread_barrier_wait(&resume);
    run(&seed, operations - operations / 2);
    return NULL;
}

int main(int argc, char **argv) {
    int n = argc > 1 ? atoi(argv[1]) : 8;
    operations = argc > 2 ? atol(argv[2]) : 100000;
    bursts = argc > 3 && strcmp(argv[3], "bursts") == 0;
    if (n < 1 || operations < 0) {
        fprintf(stderr, "usage: larson [threads] [operations] [saturate|bursts]\n");
        return 2;
    }
    pthread_t *t = calloc((size_t)n, sizeof *t);
    pthread_barrier_init(&halfway, NULL, (unsigned)n + 1);
    pthread_barrier_init(&resume, NULL, (unsigned)n + 1);
    for (int i = 0; i < n; i++) {
        if (pthread_create(&t[i], NULL, worker, (void *)(uintptr_t)(i + 1)) != 0) {
            perror("pthread_create");
            return 1;
        }
    }
    pthread_barrier_wait(&halfway);
    size_t bytes = 0, blocks = 0;
    for (int k = 0; k < SLOTS; k++) {
        size_t *b = atomic_load(&slots[k]);
        if (b) bytes += *b, blocks++;
    }
    mark = malloc(MARK_BYTES);
    free(mark);
    fprintf(stderr, "mid: %zu bytes in %zu blocks\n", bytes, blocks);
    pthread_barrier_wait(&resume);
    for (int i = 0; i < n; i++) pthread_join(t[i], NULL);
    for (int k = 0; k < SLOTS; k++) free(atomic_load(&slots[k]));
    free(t);
    return 0;
}
