// A program on jemalloc (link with -ljemalloc) that keeps one block in ten: N blocks
// (argv[1], 2000000 by default), most of 16 to 400 bytes, some of up to 4 KiB and a few
// large ones (16 to 80 KiB), every tenth kept, the rest freed, so the survivors pin slabs
// whose other regions stay free and the freed large extents leave dirty pages. With T
// threads (argv[2], 1 by default) each does a share and stays alive, so that several
// arenas and threads' caches hold them.
// It then prints jemalloc's own figures, one per line as NAME=VALUE (mallctl's stats.*
// after refreshing "epoch"; sums over every arena and bin), and waits until the end of
// stdin: for `fragscope snapshot PID`.
#include <jemalloc/jemalloc.h>
#include <pthread.h>
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

static char **all;
static long kept_per_share[64];
static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t changed = PTHREAD_COND_INITIALIZER;
static int shares_done, finished;

struct share {
    int index;
    long lo, hi;
};

// Allocates blocks lo..hi, keeps every tenth (moved to the front of the range), frees
// the rest.
static void allocate_and_keep_tenth(struct share *s) {
    unsigned seed = 7 + (unsigned)s->index;
    for (long i = s->lo; i < s->hi; i++) {
        seed = seed * 1103515245u + 12345u;
        unsigned r = seed >> 16;
        size_t size = i % 1000 == 999 ? 16384 + r % 65536
                    : i % 10 == 9    ? 400 + r % 3700
                                     : 16 + r % 385;
        all[i] = malloc(size);
        memset(all[i], 1, size);
    }
    long kept = 0;
    for (long i = s->lo; i < s->hi; i++) {
        if ((i - s->lo) % 10 == 0) {
            all[s->lo + kept++] = all[i];
        } else {
            free(all[i]);
        }
    }
    kept_per_share[s->index] = kept;
}

// A thread's share; it then waits, alive (its cache and arena kept), until the end.
static void *worker(void *arg) {
    allocate_and_keep_tenth(arg);
    pthread_mutex_lock(&lock);
    shares_done++;
    pthread_cond_broadcast(&changed);
    while (!finished) {
        pthread_cond_wait(&changed, &lock);
    }
    pthread_mutex_unlock(&lock);
    return NULL;
}

int main(int argc, char **argv) {
    // The output buffer first, so that the figures printed count it.
    printf("start\n");
    fflush(stdout);
    long n = argc > 1 ? atol(argv[1]) : 2000000;
    int threads = argc > 2 ? atoi(argv[2]) : 1;
    if (threads < 1 || threads > 64) {
        fprintf(stderr, "1 to 64 threads\n");
        return 2;
    }
    all = malloc(sizeof(char *) * (size_t)n);
    struct share shares[64];
    pthread_t ids[64];
    for (int t = 0; t < threads; t++) {
        shares[t] = (struct share){t, n * t / threads, n * (t + 1) / threads};
    }
    if (threads == 1) {
        allocate_and_keep_tenth(&shares[0]);
    } else {
        for (int t = 0; t < threads; t++) {
            pthread_create(&ids[t], NULL, worker, &shares[t]);
        }
        pthread_mutex_lock(&lock);
        while (shares_done < threads) {
            pthread_cond_wait(&changed, &lock);
        }
        pthread_mutex_unlock(&lock);
    }
    long kept = 0;
    for (int t = 0; t < threads; t++) {
        kept += kept_per_share[t];
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
    if (threads > 1) {
        pthread_mutex_lock(&lock);
        finished = 1;
        pthread_cond_broadcast(&changed);
        pthread_mutex_unlock(&lock);
        for (int t = 0; t < threads; t++) {
            pthread_join(ids[t], NULL);
        }
    }
    return (int)(all[0][0] != 1);
}
