/* reuse_threads.c: threads free each other's blocks and the allocator hands the same
 * addresses out again at once (same size class, LIFO caches), so one address passes
 * between threads many times per millisecond. The trace must still merge into an order
 * in which no address is live twice.  usage: reuse_threads [threads=8] [rounds=20000] */
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>

#define SLOTS 64
static _Atomic(void *) slots[SLOTS];
static long rounds;

static void *worker(void *arg) {
    unsigned seed = (unsigned)(size_t)arg * 2654435761u;
    for (long i = 0; i < rounds; i++) {
        seed = seed * 1103515245u + 12345u;
        unsigned k = (seed >> 8) % SLOTS;
        void *mine = malloc(48);
        void *theirs = atomic_exchange(&slots[k], mine);
        free(theirs); /* usually another thread's block; its address comes back soon */
    }
    return NULL;
}

int main(int argc, char **argv) {
    int n = argc > 1 ? atoi(argv[1]) : 8;
    rounds = argc > 2 ? atol(argv[2]) : 20000;
    pthread_t t[64];
    for (int i = 0; i < n && i < 64; i++) pthread_create(&t[i], NULL, worker, (void *)(size_t)(i + 1));
    for (int i = 0; i < n && i < 64; i++) pthread_join(t[i], NULL);
    for (int k = 0; k < SLOTS; k++) free(slots[k]);
    return 0;
}
