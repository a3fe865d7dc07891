/* fork_exec.c: the parent makes 100 malloc/free pairs of 611 bytes, then once per exec
 * function (execv, execvp, execve, execl, execlp, execle) forks a child that makes 50
 * pairs and replaces itself with this program in role "image", which makes 25 pairs and
 * exits 4. A last child ("at-once") calls execv without allocating first, as shells do.
 * The parent checks every child's status and exits 0.
 * usage: fork_exec  (the image role is internal: fork_exec image) */
#define _GNU_SOURCE
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

extern char **environ;
static void *volatile sink; /* keeps the compiler from removing malloc/free pairs */

static void churn(int n) {
    for (int i = 0; i < n; i++) {
        sink = malloc(611);
        free(sink);
    }
}

static const char *const methods[] = {"execv", "execvp", "execve", "execl", "execlp", "execle", "at-once"};
enum { METHODS = sizeof methods / sizeof *methods };

static void become_image(const char *self, const char *method) {
    char *argv[] = {(char *)self, "image", (char *)method, NULL};
    if (!strcmp(method, "execv") || !strcmp(method, "at-once")) execv(self, argv);
    if (!strcmp(method, "execvp")) execvp(self, argv);
    if (!strcmp(method, "execve")) execve(self, argv, environ);
    if (!strcmp(method, "execl")) execl(self, self, "image", method, (char *)NULL);
    if (!strcmp(method, "execlp")) execlp(self, self, "image", method, (char *)NULL);
    if (!strcmp(method, "execle")) execle(self, self, "image", method, (char *)NULL, environ);
    _exit(97); /* exec failed */
}

int main(int argc, char **argv) {
    if (argc > 1 && !strcmp(argv[1], "image")) {
        churn(25);
        return 4;
    }
    char self[4096];
    ssize_t n = readlink("/proc/self/exe", self, sizeof self - 1);
    if (n <= 0) return 98;
    self[n] = 0;
    churn(100);
    for (int m = 0; m < METHODS; m++) {
        pid_t pid = fork();
        if (pid < 0) return 96;
        if (pid == 0) {
            if (strcmp(methods[m], "at-once")) churn(50);
            become_image(self, methods[m]);
        }
        int status = 0;
        waitpid(pid, &status, 0);
        if (!WIFEXITED(status) || WEXITSTATUS(status) != 4) {
            fprintf(stderr, "fork_exec: %s child ended with status %#x\n", methods[m], status);
            return 10 + m;
        }
    }
    return 0;
}
