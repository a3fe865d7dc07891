/* close_fds.c: makes 100 malloc/free pairs of 617 bytes after each way a program can
 * close every descriptor it has: a close() loop over 0..1023, close_range(0, ~0U),
 * closefrom(0), and close_range as a raw system call, which no interposer can see.
 * 500 pairs in all, every one of which must reach the trace. Exits 0.
 * usage: close_fds */
#define _GNU_SOURCE
#include <stdlib.h>
#include <sys/syscall.h>
#include <unistd.h>

static void *volatile sink; /* keeps the compiler from removing malloc/free pairs */

static void churn(int n) {
    for (int i = 0; i < n; i++) {
        sink = malloc(617);
        free(sink);
    }
}

int main(void) {
    churn(100);
    for (int fd = 0; fd < 1024; fd++) close(fd);
    churn(100);
    close_range(0, ~0U, 0);
    churn(100);
    closefrom(0);
    churn(100);
    syscall(SYS_close_range, 0, ~0U, 0);
    churn(100);
    return 0;
}
