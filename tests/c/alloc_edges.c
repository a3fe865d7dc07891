/* alloc_edges.c: the malloc family's edge cases. The program checks what the C standard
 * and POSIX promise (exiting 10+ with a message on the first broken promise) and prints
 * one line per call of what the allocator chose where they leave it open, so a run under
 * fragscope can be compared line for line with a run without it.
 * Sizes are distinct (1001..1009) so the trace's calls can be found by size. Exits 0. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <malloc.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static int failures;
#define CHECK(cond, ...)                                       \
    do {                                                       \
        if (!(cond)) {                                         \
            fprintf(stderr, "alloc_edges: " __VA_ARGS__);      \
            fprintf(stderr, "\n");                             \
            failures++;                                        \
        }                                                      \
    } while (0)

/* Values the compiler cannot see through, so it neither folds nor warns about them. */
static volatile size_t huge = SIZE_MAX / 2 + 2, three = 3, unservable = SIZE_MAX - 4096;
static void *volatile no_block = NULL; /* else GCC turns realloc(NULL, n) into malloc(n) */
static void *volatile sink;           /* keeps GCC from removing a malloc/free pair */

int main(void) {
    /* realloc(NULL, n) is malloc(n). */
    char *p = realloc(no_block, 1001);
    CHECK(p != NULL, "realloc(NULL, 1001) failed");
    memset(p, 1, 1001);
    /* realloc(p, 0): glibc frees and returns NULL; other allocators may return a block. */
    errno = 0;
    void *z = realloc(p, 0);
    printf("realloc(p, 0) returned %s, errno %d\n", z ? "a block" : "NULL", errno);
    free(z);

    /* calloc whose size overflows: NULL with ENOMEM, never a short block. */
    errno = 0;
    void *c = calloc(huge, three);
    CHECK(c == NULL && errno == ENOMEM, "calloc overflow gave %p, errno %d", c, errno);
    errno = 0;
    void *m = malloc(unservable);
    CHECK(m == NULL && errno == ENOMEM, "malloc(SIZE_MAX - 4096) gave %p, errno %d", m, errno);
    char *r = malloc(1002);
    CHECK(r != NULL, "malloc(1002) failed");
    errno = 0;
    void *ra = reallocarray(r, huge, three);
    CHECK(ra == NULL && errno == ENOMEM, "reallocarray overflow gave %p, errno %d", ra, errno);
    free(ra ? ra : r); /* a failed reallocarray leaves the block alone */
    errno = 0;
    void *rh = realloc(no_block, unservable);
    CHECK(rh == NULL && errno == ENOMEM, "realloc(NULL, huge) gave %p, errno %d", rh, errno);

    /* Aligned allocations keep their alignment and their failure codes. */
    void *pm = NULL;
    CHECK(posix_memalign(&pm, 4096, 1003) == 0 && ((uintptr_t)pm & 4095) == 0,
          "posix_memalign(4096) gave %p", pm);
    free(pm);
    void *untouched = (void *)0x1;
    CHECK(posix_memalign(&untouched, 24, 1003) == EINVAL && untouched == (void *)0x1,
          "posix_memalign with alignment 24 must fail with EINVAL and leave *out alone");
    void *aa = aligned_alloc(64, 1024);
    CHECK(aa && ((uintptr_t)aa & 63) == 0, "aligned_alloc(64) gave %p", aa);
    free(aa);
    void *ma = memalign(256, 1005);
    CHECK(ma && ((uintptr_t)ma & 255) == 0, "memalign(256) gave %p", ma);
    free(ma);
    long page = sysconf(_SC_PAGESIZE);
    void *va = valloc(1006);
    CHECK(va && ((uintptr_t)va & (page - 1)) == 0, "valloc gave %p", va);
    free(va);
    /* jemalloc has no pvalloc: glibc's answers, from glibc's heap, so jemalloc's free
     * must never see it. Without fragscope it is the same. */
    int jemalloc = dlsym(RTLD_DEFAULT, "mallctl") != NULL;
    void *pv = pvalloc(1007);
    CHECK(pv && ((uintptr_t)pv & (page - 1)) == 0, "pvalloc gave %p", pv);
    if (!jemalloc) free(pv);

    /* malloc(0) and free(NULL) */
    void *zero = malloc(0);
    printf("malloc(0) returned %s\n", zero ? "a block" : "NULL");
    free(zero);
    free(NULL);

    /* free keeps errno (POSIX.1-2024; glibc since 2.33). */
    sink = malloc(1008);
    errno = 1234;
    free(sink);
    printf("free kept errno: %s\n", errno == 1234 ? "yes" : "no");

    /* realloc grows and shrinks, keeping contents. */
    char *g = malloc(1009);
    CHECK(g != NULL, "malloc(1009) failed");
    memset(g, 7, 1009);
    g = realloc(g, 100000);
    CHECK(g && g[1008] == 7, "realloc lost contents while growing");
    g = realloc(g, 1009);
    CHECK(g && g[0] == 7, "realloc lost contents while shrinking");
    free(g);
    fflush(stdout);
    return failures ? 10 : 0;
}
