/* thread_exit.c: a second thread makes 200 malloc/free pairs of 619 bytes and calls
 * exit(9) while the main thread either waits in pthread_join ("idle") or keeps making
 * malloc/free pairs of 32 bytes ("busy"). The process must end with status 9 and every
 * call the exiting thread made must be in the trace.
 * usage: thread_exit idle|busy */
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

static void *volatile sink; /* keeps the compiler from removing malloc/free pairs */
static void *volatile main_sink;

static void *exiter(void *arg) {
    (void)arg;
    for (int i = 0; i < 200; i++) {
        sink = malloc(619);
        free(sink);
    }
    exit(9);
}

int main(int argc, char **argv) {
    int busy = argc > 1 && !strcmp(argv[1], "busy");
    pthread_t t;
    if (pthread_create(&t, NULL, exiter, NULL) != 0) return 2;
    if (!busy) pthread_join(t, NULL);
    for (;;) {
        main_sink = malloc(32);
        free(main_sink);
    }
}
