/* spawn.c: the parent makes 100 malloc/free pairs of 613 bytes, then starts this program
 * in role "image" four times: posix_spawn and posix_spawnp with its own environment, and
 * again with a clean environment that has no LD_PRELOAD (as daemons and sandboxes pass).
 * Each image makes 25 pairs and exits 6; the parent checks each status and exits 0.
 * usage: spawn  (the image role is internal: spawn image ENV-KIND) */
#define _GNU_SOURCE
#include <spawn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

extern char **environ;
static void *volatile sink; /* keeps the compiler from removing malloc/free pairs */

static void churn(int n) {
    for (int i = 0; i < n; i++) {
        sink = malloc(613);
        free(sink);
    }
}

int main(int argc, char **argv) {
    if (argc > 2 && !strcmp(argv[1], "image")) {
        churn(25);
        return 6;
    }
    char self[4096];
    ssize_t n = readlink("/proc/self/exe", self, sizeof self - 1);
    if (n <= 0) return 98;
    self[n] = 0;
    churn(100);
    char *clean_env[] = {"PATH=/usr/bin:/bin", "SPAWN_TEST=clean", NULL};
    for (int i = 0; i < 4; i++) {
        int use_path = i & 1, clean = i >> 1;
        char *child_argv[] = {self, "image", clean ? "clean" : "inherited", NULL};
        char *const *env = clean ? clean_env : environ;
        pid_t pid;
        int rc = use_path ? posix_spawnp(&pid, self, NULL, NULL, child_argv, env)
                          : posix_spawn(&pid, self, NULL, NULL, child_argv, env);
        if (rc != 0) return 20 + i;
        int status = 0;
        waitpid(pid, &status, 0);
        if (!WIFEXITED(status) || WEXITSTATUS(status) != 6) {
            fprintf(stderr, "spawn: child %d ended with status %#x\n", i, status);
            return 10 + i;
        }
    }
    return 0;
}
