/* A server-like program for `fragscope record -p`: it fills a table of 4096 blocks,
 * prints "ready", then its worker threads keep swapping blocks into random slots and
 * freeing what was there (so a block one thread allocated is often freed by another),
 * until a line "quit" arrives on stdin. Then it prints "done <operations>" and
 * "live <blocks> <bytes>" (what the table holds), frees everything and exits 0.
 * A line "count" prints "ops <operations so far> <bytes the table holds>".
 *
 * usage: attach_target [threads=4] [microseconds to sleep after each operation=0: 500
 * after every 1000] */
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define SLOTS 4096
static atomic_int stop;
static atomic_long operations;
static void *slots[SLOTS];
static size_t sizes[SLOTS];
static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static int nap_us;

static void *worker(void *arg) {
    unsigned r = (unsigned)(long)arg * 2654435761u;
    while (!atomic_load(&stop)) {
        r = r * 1103515245 + 12345;
        unsigned i = (r >> 8) % SLOTS;
        size_t size = 16 + (r >> 20) % 500;
        void *p = malloc(size);
        memset(p, 1, 16);
        pthread_mutex_lock(&lock);
        void *old = slots[i];
        slots[i] = p;
        sizes[i] = size;
        pthread_mutex_unlock(&lock);
        free(old);
        long done = atomic_fetch_add(&operations, 1);
        if (nap_us) usleep(nap_us);
        else if (done % 1000 == 999) usleep(500);
    }
    return NULL;
}

int main(int argc, char **argv) {
    int threads = argc > 1 ? atoi(argv[1]) : 4;
    if (threads < 1 || threads > 256) threads = 4;
    nap_us = argc > 2 ? atoi(argv[2]) : 0;
    for (int i = 0; i < SLOTS; i++) {
        sizes[i] = 100;
        slots[i] = malloc(100);
    }
    pthread_t t[256];
    for (int i = 0; i < threads; i++) pthread_create(&t[i], NULL, worker, (void *)(long)(i + 1));
    printf("ready\n");
    fflush(stdout);
    char line[64];
    while (fgets(line, sizeof line, stdin)) {
        if (!strncmp(line, "quit", 4)) break;
        if (!strncmp(line, "count", 5)) {
            pthread_mutex_lock(&lock);
            size_t held = 0;
            for (int i = 0; i < SLOTS; i++) held += sizes[i];
            pthread_mutex_unlock(&lock);
            printf("ops %ld %zu\n", atomic_load(&operations), held);
            fflush(stdout);
        }
    }
    atomic_store(&stop, 1);
    for (int i = 0; i < threads; i++) pthread_join(t[i], NULL);
    size_t bytes = 0;
    for (int i = 0; i < SLOTS; i++) bytes += sizes[i];
    printf("done %ld\nlive %d %zu\n", atomic_load(&operations), SLOTS, bytes);
    fflush(stdout);
    for (int i = 0; i < SLOTS; i++) free(slots[i]);
    return 0;
}
