/* killed.c: makes malloc/free pairs of 623 bytes until killed, and after every 1000 pairs
 * appends "MS PAIRS\n" to the file argv[1] (milliseconds since start, pairs made so far),
 * so whoever kills it knows how many calls were made, and when. Its pid is the first
 * line of the file.  usage: killed PROGRESS-FILE */
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

static void *volatile sink; /* keeps the compiler from removing malloc/free pairs */

static long ms_since(const struct timespec *t0) {
    struct timespec now;
    clock_gettime(CLOCK_MONOTONIC, &now);
    return (now.tv_sec - t0->tv_sec) * 1000 + (now.tv_nsec - t0->tv_nsec) / 1000000;
}

int main(int argc, char **argv) {
    if (argc < 2) return 2;
    int fd = open(argv[1], O_WRONLY | O_CREAT | O_TRUNC | O_APPEND, 0644);
    if (fd < 0) return 3;
    char line[64];
    int n = snprintf(line, sizeof line, "%d\n", (int)getpid());
    if (write(fd, line, (size_t)n) != n) return 4;
    struct timespec t0;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    for (long pairs = 0;;) {
        for (int i = 0; i < 1000; i++) {
            sink = malloc(623);
            free(sink);
        }
        pairs += 1000;
        n = snprintf(line, sizeof line, "%ld %ld\n", ms_since(&t0), pairs);
        if (write(fd, line, (size_t)n) != n) return 5;
    }
}
