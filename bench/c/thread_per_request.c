// A server that starts a thread per request, at most CONCURRENT at once: each request
// parses (allocates a few dozen blocks of 16..2000 bytes), builds a reply, frees its
// temporaries and puts one record into a shared cache of CACHE records, evicting the
// oldest. Prints requests per second.
// Usage: thread_per_request [REQUESTS=100000] [CONCURRENT=8] [CACHE=10000]
#include <pthread.h>
#include <semaphore.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static pthread_mutex_t cache_lock = PTHREAD_MUTEX_INITIALIZER;
static char **cache;
static long cache_size, cache_next;
static sem_t free_workers;

static void *request(void *arg) {
    unsigned seed = (unsigned)(long)arg * 2654435761u + 1;
    char *parts[48];
    int n = 16 + seed % 32;
    for (int i = 0; i < n; i++) {
        seed ^= seed << 13;
        seed ^= seed >> 17;
        seed ^= seed << 5;
        size_t size = 16 + seed % 1985;
        parts[i] = malloc(size);
        memset(parts[i], i, size < 64 ? size : 64);
    }
    char *record = malloc(64 + seed % 192);
    memcpy(record, parts[0], 16);
    for (int i = 0; i < n; i++)
        free(parts[i]);
    pthread_mutex_lock(&cache_lock);
    char *evicted = cache[cache_next];
    cache[cache_next] = record;
    cache_next = (cache_next + 1) % cache_size;
    pthread_mutex_unlock(&cache_lock);
    free(evicted);
    sem_post(&free_workers);
    return NULL;
}

int main(int argc, char **argv) {
    long requests = argc > 1 ? atol(argv[1]) : 100000;
    int concurrent = argc > 2 ? atoi(argv[2]) : 8;
    cache_size = argc > 3 ? atol(argv[3]) : 10000;
    cache = calloc(cache_size, sizeof(char *));
    sem_init(&free_workers, 0, concurrent);
    pthread_attr_t detached;
    pthread_attr_init(&detached);
    pthread_attr_setdetachstate(&detached, PTHREAD_CREATE_DETACHED);
    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    for (long r = 0; r < requests; r++) {
        sem_wait(&free_workers);
        pthread_t t;
        pthread_create(&t, &detached, request, (void *)r);
    }
    for (int i = 0; i < concurrent; i++)
        sem_wait(&free_workers);
    clock_gettime(CLOCK_MONOTONIC, &t1);
    double s = (t1.tv_sec - t0.tv_sec) + (t1.tv_nsec - t0.tv_nsec) / 1e9;
    printf("%.0f requests/s\n", requests / s);
    return 0;
}
