/* prefork.c: a parent builds 100 000 blocks of 100 bytes and forks a worker that frees
 * every other one of them and allocates 50 000 of 64 bytes of its own, as a pre-fork
 * server's worker starts from its parent's heap. Prints the worker's pid. */
#include <stdio.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>

enum { N = 100000 };
static void *blocks[N];

int main(void) {
    for (int i = 0; i < N; i++) blocks[i] = malloc(100);
    pid_t pid = fork();
    if (pid == 0) {
        for (int i = 0; i < N; i += 2) free(blocks[i]);
        for (int i = 0; i < N / 2; i++) blocks[i] = malloc(64);
        usleep(300000);
        _exit(0);
    }
    printf("worker %d\n", (int)pid);
    fflush(stdout);
    int status = 0;
    waitpid(pid, &status, 0);
    return WIFEXITED(status) ? WEXITSTATUS(status) : 1;
}
