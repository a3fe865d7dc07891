// An idle program whose heap is known to the byte, for comparing `fragscope snapshot`
// with a recording: it allocates N blocks (argv[1], 200000 by default) of mixed sizes,
// a quarter of them 16 bytes (where glibc's 8-byte chunk headers weigh most), frees one
// in three, allocates a few blocks above the mmap threshold, fills every block it keeps
// to its usable size (so that all of them are resident), then prints one line
//   usable=SUM blocks=COUNT pid=PID
// SUM: malloc_usable_size summed over every block it holds (the array of pointers
// included), COUNT: those blocks. It waits until the end of stdin and exits.
#include <malloc.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define BIG 4

int main(int argc, char **argv) {
    // stdio's buffers are static: glibc would otherwise malloc them at the first write,
    // after the sum is taken.
    static char inbuf[4096], outbuf[4096];
    setvbuf(stdin, inbuf, _IOLBF, sizeof inbuf);
    setvbuf(stdout, outbuf, _IOLBF, sizeof outbuf);
    long n = argc > 1 ? atol(argv[1]) : 200000;
    void **keep = calloc((size_t)n + BIG, sizeof(void *));
    unsigned seed = 1;
    for (long i = 0; i < n; i++) {
        seed = seed * 1103515245u + 12345u;
        size_t size = i % 4 == 0 ? 16 : 1 + (seed >> 16) % 600;
        keep[i] = malloc(size);
    }
    for (long i = 0; i < n; i += 3) {
        free(keep[i]);
        keep[i] = NULL;
    }
    for (int i = 0; i < BIG; i++) keep[n + i] = malloc((size_t)(200 + 300 * i) << 10);
    size_t usable = malloc_usable_size(keep);
    long blocks = 1;
    for (long i = 0; i < n + BIG; i++) {
        if (!keep[i]) continue;
        size_t u = malloc_usable_size(keep[i]);
        memset(keep[i], 0x5a, u);
        usable += u;
        blocks++;
    }
    printf("usable=%zu blocks=%ld pid=%d\n", usable, blocks, (int)getpid());
    char line[64];
    while (fgets(line, sizeof line, stdin)) {
    }
    return 0;
}
