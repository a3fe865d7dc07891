// One thread allocates blocks of 8..1000 bytes and hands them through a ring of RING
// slots to another, which frees them: every block is freed by a thread other than the
// one that allocated it. Prints blocks handed over per second.
// Usage: producer_consumer [BLOCKS=10000000] [RING=1024]
#include <pthread.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

static void **ring;
static long ring_size, blocks;
static long produced, consumed; // written by one thread each, read by the other

static void *consume(void *arg) {
    (void)arg;
    for (long i = 0; i < blocks; i++) {
        // Waiting yields the core: on a machine with no spare one, spinning would
        // take it from the thread being waited for.
        while (__atomic_load_n(&produced, __ATOMIC_ACQUIRE) == i)
            sched_yield();
        free(ring[i % ring_size]);
        __atomic_store_n(&consumed, i + 1, __ATOMIC_RELEASE);
    }
    return NULL;
}

int main(int argc, char **argv) {
    blocks = argc > 1 ? atol(argv[1]) : 10000000;
    ring_size = argc > 2 ? atol(argv[2]) : 1024;
    ring = calloc(ring_size, sizeof(void *));
    unsigned seed = 2463534242u;
    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    pthread_t consumer;
    pthread_create(&consumer, NULL, consume, NULL);
    for (long i = 0; i < blocks; i++) {
        seed ^= seed << 13;
        seed ^= seed >> 17;
        seed ^= seed << 5;
        void *p = malloc(8 + seed % 993);
        while (i - __atomic_load_n(&consumed, __ATOMIC_ACQUIRE) >= ring_size)
            sched_yield();
        ring[i % ring_size] = p;
        __atomic_store_n(&produced, i + 1, __ATOMIC_RELEASE);
    }
    pthread_join(consumer, NULL);
    clock_gettime(CLOCK_MONOTONIC, &t1);
    double s = (t1.tv_sec - t0.tv_sec) + (t1.tv_nsec - t0.tv_nsec) / 1e9;
    printf("%.0f blocks/s\n", blocks / s);
    return 0;
}
