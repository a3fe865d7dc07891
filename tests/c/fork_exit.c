/* fork_exit.c: the parent makes 1000 malloc/free pairs of 777 bytes, forks a child that
 * makes 500 pairs and leaves with exit(3), then exec's nothing and exits with the code
 * given as argv[1] (default 0). Checks fork following and exit-status propagation. */
#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>

static void *volatile sink; /* keeps the compiler from removing malloc/free pairs */

static void churn(int n) {
    for (int i = 0; i < n; i++) {
        sink = malloc(777);
        free(sink);
    }
}

int main(int argc, char **argv) {
    churn(1000);
    pid_t pid = fork();
    if (pid == 0) {
        churn(500);
        exit(3);
    }
    int status = 0;
    waitpid(pid, &status, 0);
    if (!WIFEXITED(status) || WEXITSTATUS(status) != 3) return 99;
    return argc > 1 ? atoi(argv[1]) : 0;
}
