// A process with a large glibc heap for `bench/snapshot_stop.sh`: MIB MiB in blocks of
// SIZE bytes, every other one freed (a fragmented heap of many chunks), then it waits on
// stdin, printing "ready" once built. usage: big_heap MIB SIZE
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int main(int argc, char **argv) {
    size_t mib = argc > 1 ? strtoul(argv[1], 0, 10) : 1024;
    size_t size = argc > 2 ? strtoul(argv[2], 0, 10) : 1024;
    size_t n = (mib << 20) / (size + 16);
    char **blocks = malloc(n * sizeof *blocks);
    for (size_t i = 0; i < n; i++) {
        blocks[i] = malloc(size);
        memset(blocks[i], (int)i, size);
    }
    for (size_t i = 0; i < n; i += 2) free(blocks[i]);
    printf("ready\n");
    fflush(stdout);
    char line[64];
    while (fgets(line, sizeof line, stdin)) {
    }
    return 0;
}
