/* prefork_threads.c: as prefork.c, but a second thread of the parent allocates and frees
 * without pause while the main thread forks three workers one after another. Each
 * worker frees every other one of the parent's 100 000 blocks of 100 bytes and allocates
 * 50 000 of 64 bytes. Prints each worker's pid. */
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>

enum { N = 100000, WORKERS = 3, RING = 1024 };
static void *blocks[N];
static atomic_int stop;
static atomic_long churned;

static void *churn(void *arg) {
    (void)arg;
    void *ring[RING] = {0};
    unsigned long i = 0;
    while (!atomic_load(&stop)) {
        free(ring[i % RING]);
        ring[i % RING] = malloc(16 + i % 64);
        atomic_store(&churned, (long)++i);
    }
    for (int k = 0; k < RING; k++) free(ring[k]);
    return NULL;
}

int main(void) {
    for (int i = 0; i < N; i++) blocks[i] = malloc(100);
    pthread_t t;
    if (pthread_create(&t, NULL, churn, NULL) != 0) return 2;
    while (atomic_load(&churned) < 100000) usleep(1000);
    pid_t pids[WORKERS];
    for (int w = 0; w < WORKERS; w++) {
        pids[w] = fork();
        if (pids[w] == 0) {
            for (int i = 0; i < N; i += 2) free(blocks[i]);
            for (int i = 0; i < N / 2; i++) blocks[i] = malloc(64);
            usleep(200000);
            _exit(0);
        }
        if (pids[w] < 0) return 3;
        printf("worker %d\n", (int)pids[w]);
        fflush(stdout);
        usleep(20000);
    }
    int failed = 0;
    for (int w = 0; w < WORKERS; w++) {
        int status = 0;
        waitpid(pids[w], &status, 0);
        failed |= !WIFEXITED(status) || WEXITSTATUS(status) != 0;
    }
    atomic_store(&stop, 1);
    pthread_join(t, NULL);
    return failed;
}
