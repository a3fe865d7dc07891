/* run_spawned.c: starts PROGRAM ARGS with posix_spawn, waits for it and exits 0 when it
 * ran (whatever its status). usage: run_spawned PROGRAM [ARGS...] */
#include <spawn.h>
#include <sys/wait.h>

extern char **environ;

int main(int argc, char **argv) {
    if (argc < 2) return 2;
    pid_t pid;
    if (posix_spawn(&pid, argv[1], NULL, NULL, argv + 1, environ) != 0) return 3;
    int status;
    return waitpid(pid, &status, 0) == pid ? 0 : 4;
}
