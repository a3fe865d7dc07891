// A program on tcmalloc (link with -ltcmalloc) that keeps one block in ten: N blocks
// (argv[1], 2000000 by default) of 16 to 400 bytes, every tenth kept, the rest freed, so
// the survivors pin spans whose other objects wait in tcmalloc's central free lists.
// It then prints tcmalloc's own figures, one per line as NAME=BYTES (MallocExtension's
// properties), and waits until the end of stdin: for `fragscope snapshot PID`.
#include <gperftools/malloc_extension_c.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const char *const PROPERTIES[] = {
    "generic.current_allocated_bytes",  "generic.heap_size",
    "tcmalloc.pageheap_free_bytes",     "tcmalloc.pageheap_unmapped_bytes",
    "tcmalloc.central_cache_free_bytes", "tcmalloc.transfer_cache_free_bytes",
    "tcmalloc.thread_cache_free_bytes",
};

int main(int argc, char **argv) {
    long n = argc > 1 ? atol(argv[1]) : 2000000;
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
    for (size_t p = 0; p < sizeof PROPERTIES / sizeof *PROPERTIES; p++) {
        size_t v = 0;
        MallocExtension_GetNumericProperty(PROPERTIES[p], &v);
        printf("%s=%zu\n", PROPERTIES[p], v);
    }
    printf("kept=%ld\n", kept);
    fflush(stdout);
    char line[64];
    while (fgets(line, sizeof line, stdin)) {
    }
    return (int)(all[0][0] != 1);
}
