/* cross_free_threads.c: THREADS threads each make ROUNDS malloc(40) calls and free a block
 * another thread allocated (handed over through shared slots). Every 40-byte block is
 * freed exactly once, so the trace must hold exactly THREADS * ROUNDS allocations and as
 * many frees of them, plus exactly SLOTS free(NULL) calls (each slot is empty once).
 * usage: cross_free_threads [threads=8] [rounds=20000] */
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>

#define SLOTS 64
static _Atomic(void *) slots[SLOTS];
static long rounds;

static void *worker(void *arg) {
    unsigned seed = (unsigned)(size_t)arg * 2654435761u;
    for (long i = 0; i < rounds; i++) {
        seed = seed * 1103515245u + 12345u;
        void *mine = malloc(40);
        free(atomic_exchange(&slots[(seed >> 8) % SLOTS], mine));
    }
    return NULL;
}

int main(int argc, char **argv) {
    int n = argc > 1 ? atoi(argv[1]) : 8;
    rounds = argc > 2 ? atol(argv[2]) : 20000;
    if (n < 1 || n > 64) return 2;
    pthread_t t[64];
    for (int i = 0; i < n; i++)
        if (pthread_create(&t[i], NULL, worker, (void *)(size_t)(i + 1)) != 0) return 3;
    for (int i = 0; i < n; i++) pthread_join(t[i], NULL);
    for (int k = 0; k < SLOTS; k++) free(atomic_exchange(&slots[k], NULL));
    return 0;
}
