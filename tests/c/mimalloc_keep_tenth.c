// A program on a mimalloc that replaces malloc (run with LD_PRELOAD=libmimalloc.so.3, as
// Debian's package is used) that keeps one block in ten: N blocks (argv[1], 1000000 by
// default) of 16 to 400 bytes, every tenth kept, the rest freed, so the survivors pin
// pages whose other blocks wait on their free lists, and one block of 40 MiB (which
// mimalloc 3.0 takes from the OS outside its arenas). It then prints mimalloc's own
// account of the main thread's heap, one per line as NAME=VALUE (its area visitor:
// pages, blocks in use, their bytes, the pages' committed and reserved bytes), the
// usable bytes it holds (malloc_usable_size, mimalloc's), mimalloc's version, and waits
// until the end of stdin: for `fragscope snapshot PID`. mimalloc's API is looked up at
// run time, so the program builds without mimalloc's headers and runs on any release.
#define _GNU_SOURCE
#include <dlfcn.h>
#include <malloc.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

// mimalloc.h's mi_heap_area_t.
typedef struct {
    void *blocks;
    size_t reserved;
    size_t committed;
    size_t used;
    size_t block_size;
    size_t full_block_size;
    int heap_tag;
} area_t;

typedef bool visit_fn(const void *heap, const area_t *area, void *block, size_t size, void *arg);

struct sums {
    size_t pages, blocks, used_bytes, committed, reserved;
};

static bool count(const void *heap, const area_t *area, void *block, size_t size, void *arg) {
    (void)heap;
    (void)size;
    struct sums *s = arg;
    if (block == NULL) {
        s->pages++;
        s->blocks += area->used;
        s->used_bytes += area->used * area->full_block_size;
        s->committed += area->committed;
        s->reserved += area->reserved;
    }
    return true;
}

static void *need(const char *name) {
    void *f = dlsym(RTLD_DEFAULT, name);
    if (f == NULL) {
        fprintf(stderr, "%s not found: run with LD_PRELOAD=libmimalloc.so.3\n", name);
        exit(2);
    }
    return f;
}

int main(int argc, char **argv) {
    int (*version)(void) = (int (*)(void))need("mi_version");
    void *(*get_default)(void) = (void *(*)(void))need("mi_heap_get_default");
    bool (*visit)(const void *, bool, visit_fn *, void *) =
        (bool (*)(const void *, bool, visit_fn *, void *))need("mi_heap_visit_blocks");
    long n = argc > 1 ? atol(argv[1]) : 1000000;
    char **all = malloc(sizeof(char *) * (size_t)n);
    unsigned seed = 7;
    for (long i = 0; i < n; i++) {
        seed = seed * 1103515245u + 12345u;
        size_t size = 16 + (seed >> 16) % 385;
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
    char *big = malloc(40 << 20);
    memset(big, 1, 40 << 20);
    size_t usable = malloc_usable_size(all) + malloc_usable_size(big);
    for (long i = 0; i < kept; i++) {
        usable += malloc_usable_size(all[i]);
    }
    // Whatever printf allocates, allocated before the heap is visited.
    printf("mi.version=%d\n", version());
    struct sums s = {0};
    visit(get_default(), false, count, &s);
    printf("mi.pages=%zu\nmi.blocks=%zu\nmi.used_bytes=%zu\n", s.pages, s.blocks, s.used_bytes);
    printf("mi.committed=%zu\nmi.reserved=%zu\n", s.committed, s.reserved);
    printf("usable=%zu\nkept=%ld\n", usable, kept);
    fflush(stdout);
    char line[64];
    while (fgets(line, sizeof line, stdin)) {
    }
    return (int)(all[0][0] != 1 || big[0] != 1);
}
