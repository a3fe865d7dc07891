/* drop_privileges.c: a daemon as nginx or PHP-FPM run one: as root it makes 100
 * malloc/free pairs of 1001 bytes, drops to UID (and its group, no supplementary groups),
 * then forks a worker that makes 300 pairs of 1003 bytes in each of 4 threads and exits
 * 0; the parent makes 200 pairs of 1002 bytes, waits, and exits 0 if all went as told.
 * usage: drop_privileges [uid=65534] */
#define _GNU_SOURCE
#include <grp.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>

static void *volatile sink; /* keeps the compiler from removing malloc/free pairs */

static void churn(int n, size_t size) {
    for (int i = 0; i < n; i++) {
        sink = malloc(size);
        free(sink);
    }
}

static void *worker_thread(void *arg) {
    (void)arg;
    churn(300, 1003);
    return NULL;
}

int main(int argc, char **argv) {
    uid_t uid = argc > 1 ? (uid_t)atoi(argv[1]) : 65534;
    churn(100, 1001);
    if (setgroups(0, NULL) != 0 || setgid(uid) != 0 || setuid(uid) != 0) {
        perror("dropping privileges");
        return 10;
    }
    if (getuid() != uid || geteuid() != uid) return 11;
    pid_t worker = fork();
    if (worker < 0) return 12;
    if (worker == 0) {
        pthread_t t[4];
        for (int i = 0; i < 4; i++)
            if (pthread_create(&t[i], NULL, worker_thread, NULL) != 0) _exit(13);
        for (int i = 0; i < 4; i++) pthread_join(t[i], NULL);
        exit(0);
    }
    churn(200, 1002);
    int status;
    if (waitpid(worker, &status, 0) != worker) return 14;
    return WIFEXITED(status) && WEXITSTATUS(status) == 0 ? 0 : 15;
}
