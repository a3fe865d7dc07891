/* signal_malloc.c: the main thread makes malloc/free pairs of 32 bytes as fast as it can
 * while an interval timer's SIGALRM handler makes a malloc/free pair of 500 bytes, until
 * the handler has run HANDLER_RUNS times. It prints "main M handler H": the pairs each
 * made, for the trace to match exactly. The two sizes use different size classes, so the
 * handler never touches the allocator state the interrupted call may be changing.
 * With "free-null", the main thread calls free(NULL) instead: the handler then interrupts
 * the recording of calls but never the allocator itself. (Allocators are not
 * async-signal-safe: under jemalloc, malloc from a handler that interrupted malloc crashes
 * or deadlocks now and then, with or without fragscope.)
 * usage: signal_malloc [handler_runs=2000] [free-null] */
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/time.h>

static void *volatile sink;
static void *volatile sink_null; /* always NULL */         /* keeps the compiler from removing malloc/free pairs */
static void *volatile handler_sink; /* the handler's own, so it never frees main's block */
static volatile sig_atomic_t handler_pairs;

static void on_alarm(int sig) {
    (void)sig;
    handler_sink = malloc(500);
    free(handler_sink);
    handler_pairs++;
}

int main(int argc, char **argv) {
    long want = argc > 1 ? atol(argv[1]) : 2000;
    int free_null = argc > 2 && strcmp(argv[2], "free-null") == 0;
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_alarm;
    sa.sa_flags = SA_RESTART;
    sigemptyset(&sa.sa_mask);
    if (sigaction(SIGALRM, &sa, NULL) != 0) return 2;
    /* Warm both size classes before the timer starts. */
    on_alarm(0);
    handler_pairs = 0;
    struct itimerval every = {{0, 200}, {0, 200}};
    if (setitimer(ITIMER_REAL, &every, NULL) != 0) return 3;
    long main_pairs = 0;
    while (handler_pairs < want) {
        if (free_null) {
            free(sink_null);
        } else {
            sink = malloc(32);
            free(sink);
        }
        main_pairs++;
    }
    struct itimerval off = {{0, 0}, {0, 0}};
    setitimer(ITIMER_REAL, &off, NULL);
    sigset_t alarm;
    sigemptyset(&alarm);
    sigaddset(&alarm, SIGALRM);
    sigprocmask(SIG_BLOCK, &alarm, NULL); /* a pending alarm must not run after the count */
    long handler_total = handler_pairs + 1; /* and the warm-up call */
    printf("main %ld handler %ld\n", main_pairs, handler_total);
    return 0;
}
