/* prefork_many.c: a pre-fork server's shape at scale, for bench/prefork_report.sh. The
 * parent builds BLOCKS blocks of 48 bytes and forks WORKERS workers; each frees CHURN of
 * its parent's blocks, allocates CHURN of its own, waits MS milliseconds (snapshots come)
 * and exits. Prints each worker's pid.
 * usage: prefork_many [BLOCKS=2000000] [WORKERS=8] [CHURN=1000] [MS=1500] */
#include <stdio.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>

int main(int argc, char **argv) {
    long blocks = argc > 1 ? atol(argv[1]) : 2000000;
    int workers = argc > 2 ? atoi(argv[2]) : 8;
    long churn = argc > 3 ? atol(argv[3]) : 1000;
    int ms = argc > 4 ? atoi(argv[4]) : 1500;
    void **heap = malloc(blocks * sizeof *heap);
    for (long i = 0; i < blocks; i++) heap[i] = malloc(48);
    for (int w = 0; w < workers; w++) {
        pid_t pid = fork();
        if (pid == 0) {
            /* A different stretch of the parent's blocks in each worker. */
            for (long i = 0; i < churn; i++) free(heap[(w * churn + i) * 7 % blocks]);
            void **own = malloc(churn * sizeof *own);
            for (long i = 0; i < churn; i++) own[i] = malloc(64);
            usleep(ms * 1000);
            _exit(0);
        }
        printf("worker %d\n", (int)pid);
    }
    fflush(stdout);
    int status = 0, failed = 0;
    while (wait(&status) > 0) failed |= !WIFEXITED(status) || WEXITSTATUS(status);
    return failed;
}
