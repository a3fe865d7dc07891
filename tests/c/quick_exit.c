/* quick_exit.c: the main thread and two others each make 300 malloc/free pairs of 621
 * bytes (the others then wait forever, their buffers unsent), and the main thread leaves
 * without running exit handlers: with _exit, _Exit or quick_exit (argv[1]), status 11.
 * All 900 pairs must reach the trace.
 * usage: quick_exit _exit|_Exit|quick_exit */
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static void *volatile sink; /* keeps the compiler from removing malloc/free pairs */
static pthread_barrier_t churned;

static void churn(int n) {
    for (int i = 0; i < n; i++) {
        sink = malloc(621);
        free(sink);
    }
}

static void *worker(void *arg) {
    (void)arg;
    churn(300);
    pthread_barrier_wait(&churned);
    for (;;) pause();
    return NULL;
}

int main(int argc, char **argv) {
    const char *how = argc > 1 ? argv[1] : "_exit";
    pthread_barrier_init(&churned, NULL, 3);
    pthread_t t[2];
    for (int i = 0; i < 2; i++)
        if (pthread_create(&t[i], NULL, worker, NULL) != 0) return 2;
    churn(300);
    pthread_barrier_wait(&churned);
    if (!strcmp(how, "_Exit")) _Exit(11);
    if (!strcmp(how, "quick_exit")) quick_exit(11);
    _exit(11);
}
