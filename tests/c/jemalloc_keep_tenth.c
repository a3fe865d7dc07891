// A program on jemalloc (link with -ljemalloc) that keeps one block in ten: N blocks
// (argv[1], 2000000 by default), most of 16 to 400 bytes, some of up to 4 KiB and a few
// large ones (16 to 80 KiB), every tenth kept, the rest freed, so the survivors pin slabs
// whose other regions stay free and the freed large extents leave dirty pages.
// It then prints jemalloc's own figures, one per line as NAME=VALUE (mallctl's stats.*
// after refreshing "epoch"; sums over every arena and bin), and waits until the end of
// stdin: for `fragscope snapshot PID`.
#include <jemalloc/jemalloc.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static size_t stat_size(const char *name) {
    size_t v = 0, len = sizeof v;
    if (mallctl(name, &v, &len, NULL, 0) != 0) {
        fprintf(stderr, "mallctl %s failed\n", name);
        exit(2);
    }
    return v;
}

static uint32_t stat_u32(const char *name) {
    uint32_t v = 0;
    size_t len = sizeof v;
    if (mallctl(name, &v, &len, NULL, 0) != 0) {
        fprintf(stderr, "mallctl %s failed\n", name);
        exit(2);
    }
    return v;
}

int main(int argc, char **argv) {
    // The output buffer first, so that the figures printed count it.
    printf("start\n");
    fflush(stdout);
    long n = argc > 1 ? atol(argv[1]) : 2000000;
    char **all = malloc(sizeof(char *) * (size_t)n);
    unsigned seed = 7;
    for (long i = 0; i < n; i++) {
        seed = seed * 1103515245u + 12345u;
        unsigned r = seed >> 16;
        size_t size = i % 1000 == 999 ? 16384 + r % 65536
                    : i % 10 == 9    ? 400 + r % 3700
                                     : 16 + r % 385;
        all[i] = malloc(size);
        memset(all[i], 1, size);
    }
    long kept = 0;
    for (long i = 0; i < n; i++) {
        if (i % 10 == 0) {
            all[kept++] = all[i];
        } else {
            free(all[i]);
        }
    }
    uint64_t epoch = 1;
    size_t len = sizeof epoch;
    mallctl("epoch", &epoch, &len, &epoch, len);
    static const char *const TOTALS[] = {
        "stats.allocated", "stats.active", "stats.resident", "stats.mapped",
        "stats.metadata",  "stats.arenas.4096.pdirty", "stats.arenas.4096.pmuzzy",
        "stats.arenas.4096.tcache_bytes", "stats.arenas.4096.large.allocated",
        "stats.arenas.4096.small.allocated",
    };
    size_t values[sizeof TOTALS / sizeof *TOTALS];
    for (size_t t = 0; t < sizeof TOTALS / sizeof *TOTALS; t++) {
        values[t] = stat_size(TOTALS[t]);
    }
    size_t curregs = 0, curslabs = 0, nonfull = 0, free_regions = 0;
    unsigned nbins = stat_u32("arenas.nbins");
    for (unsigned b = 0; b < nbins; b++) {
        char name[128];
        snprintf(name, sizeof name, "arenas.bin.%u.nregs", b);
        uint32_t nregs = stat_u32(name);
        snprintf(name, sizeof name, "stats.arenas.4096.bins.%u.curregs", b);
        size_t regs = stat_size(name);
        snprintf(name, sizeof name, "stats.arenas.4096.bins.%u.curslabs", b);
        size_t slabs = stat_size(name);
        snprintf(name, sizeof name, "stats.arenas.4096.bins.%u.nonfull_slabs", b);
        nonfull += stat_size(name);
        curregs += regs;
        curslabs += slabs;
        free_regions += slabs * nregs - regs;
    }
    for (size_t t = 0; t < sizeof TOTALS / sizeof *TOTALS; t++) {
        printf("%s=%zu\n", TOTALS[t], values[t]);
    }
    printf("bins.curregs=%zu\nbins.curslabs=%zu\nbins.nonfull_slabs=%zu\n"
           "bins.free_regions=%zu\n",
           curregs, curslabs, nonfull, free_regions);
    printf("kept=%ld\n", kept);
    fflush(stdout);
    // read(2), not stdio: stdin's buffer would be allocated after the figures.
    char line[64];
    while (read(0, line, sizeof line) > 0) {
    }
    return (int)(all[0][0] != 1);
}
