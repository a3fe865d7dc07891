/* realloc_ring.c: 4 threads take blocks out of a shared ring (under a mutex), realloc
 * them (in place or moved) or free and malloc anew, and put them back, freeing what they
 * displace: blocks change threads between reallocs, and a realloc frees its old block
 * inside the call.  usage: realloc_ring [rounds per thread, 100000] */
#include <pthread.h>
#include <stdlib.h>
#include <stdint.h>
#define RING 64
static void *ring[RING];
static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
static int rounds = 100000;
static void *work(void *arg) {
    uint64_t x = (uintptr_t)arg * 2654435761u + 1;
    for (int i = 0; i < rounds; i++) {
        x ^= x << 13; x ^= x >> 7; x ^= x << 17;
        unsigned k = x % RING;
        pthread_mutex_lock(&mu);
        void *p = ring[k];
        ring[k] = NULL;
        pthread_mutex_unlock(&mu);
        if (x & 1) p = realloc(p, 16 + (x >> 40) % 300);
        else { free(p); p = malloc(16 + (x >> 40) % 300); }
        pthread_mutex_lock(&mu);
        void *old = ring[k];
        ring[k] = p;
        pthread_mutex_unlock(&mu);
        free(old);
    }
    return 0;
}
int main(int argc, char **argv) {
    if (argc > 1) rounds = atoi(argv[1]);
    pthread_t t[4];
    for (long i = 0; i < 4; i++) pthread_create(&t[i], 0, work, (void *)(i + 1));
    for (int i = 0; i < 4; i++) pthread_join(t[i], 0);
    for (int k = 0; k < RING; k++) free(ring[k]);
    return 0;
}
