// A glibc heap of small blocks only (no chunk mmapped alone), and, in memory the program
// maps itself, a page that begins as glibc begins a chunk it mmaps alone (prev_size 0,
// then a size with IS_MMAPPED set), as a Go heap's objects beside a cgo program's glibc
// heap can. Prints "ready" and waits for the end of stdin.
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

int main(void) {
    enum { BLOCKS = 64 };
    void *keep[BLOCKS];
    for (int i = 0; i < BLOCKS; i++)
        keep[i] = malloc(100 + i);
    size_t page = (size_t)sysconf(_SC_PAGESIZE);
    char *m = mmap(NULL, 4 * page, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (m == MAP_FAILED)
        return 1;
    memset(m, 0x5a, 4 * page);
    // Two lookalikes: glibc 2.36 and 2.41 end a chunk's mapping where its size says
    // (pages 1-2 here), 2.43 keeps 8 bytes after it (page 3).
    uint64_t *lookalike = (uint64_t *)(m + page);
    lookalike[0] = 0;
    lookalike[1] = (2 * page) | 2;
    lookalike = (uint64_t *)(m + 3 * page);
    lookalike[0] = 0;
    lookalike[1] = (page - 8) | 2;
    printf("ready\n");
    fflush(stdout);
    char line[64];
    while (fgets(line, sizeof line, stdin))
        ;
    for (int i = 0; i < BLOCKS; i++)
        free(keep[i]);
    return 0;
}
