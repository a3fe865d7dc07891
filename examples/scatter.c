/* scatter.c: the classic way to fragment a heap. Allocate two million 48-byte records,
 * then keep every 16th: the survivors are a sixteenth of the data, yet they sit on every
 * page the records filled, so almost none of that memory can go back to the system.
 * Prints live bytes and VmRSS before and after, then holds the survivors for a while, as a
 * server would, before it exits. usage: scatter [count] [hold_ms] */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static long rss_kib(void) {
    FILE *f = fopen("/proc/self/status", "r");
    char line[256];
    long kib = -1;
    while (f && fgets(line, sizeof line, f))
        if (!strncmp(line, "VmRSS:", 6)) kib = atol(line + 6);
    if (f) fclose(f);
    return kib;
}

int main(int argc, char **argv) {
    long n = argc > 1 ? atol(argv[1]) : 2000000;
    char **rec = malloc(n * sizeof *rec);
    for (long i = 0; i < n; i++) rec[i] = memset(malloc(48), 1, 48);
    printf("all:      live %8.1f MiB, RSS %8.1f MiB\n", n * 48 / 1048576.0, rss_kib() / 1024.0);
    long kept = 0;
    for (long i = 0; i < n; i++) {
        if (i % 16 == 0) rec[kept++] = rec[i];
        else free(rec[i]);
    }
    printf("scatter:  live %8.1f MiB, RSS %8.1f MiB\n", kept * 48 / 1048576.0, rss_kib() / 1024.0);
    long hold_ms = argc > 2 ? atol(argv[2]) : 1500;
    struct timespec hold = {hold_ms / 1000, (hold_ms % 1000) * 1000000L};
    nanosleep(&hold, NULL);
    for (long i = 0; i < kept; i++) free(rec[i]);
    free(rec);
    return 0;
}
