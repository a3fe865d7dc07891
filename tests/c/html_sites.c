/* html_sites.c: three allocation sites with clear winners, for the HTML report and the
 * exports. big_buffers allocates the most bytes (and frees them); scatter_records keeps
 * every 16th of many small records, pinning their pages; the third site's symbol and
 * source file name are markup, as a hostile program could make them.
 * usage: html_sites [hold_ms] */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define RECORDS 200000

__attribute__((noinline)) void big_buffers(void) {
    for (int i = 0; i < 64; i++) {
        char *p = malloc(1 << 20);
        memset(p, 1, 4096);
        __asm__ volatile("" ::: "memory");
        free(p);
    }
}

__attribute__((noinline)) char **scatter_records(long *kept) {
    char **rec = malloc(RECORDS * sizeof *rec);
    for (long i = 0; i < RECORDS; i++) rec[i] = memset(malloc(48), 1, 48);
    *kept = 0;
    for (long i = 0; i < RECORDS; i++) {
        if (i % 16 == 0) rec[(*kept)++] = rec[i];
        else free(rec[i]);
    }
    return rec;
}

#line 1 "</script><img src=x onerror=alert(1)>.c"
__attribute__((noinline)) void *hostile(size_t n) __asm__("\"</script><img src=x onerror=alert(2)>\"");
__attribute__((noinline)) void *hostile(size_t n) {
    void *p = malloc(n);
    __asm__ volatile("" ::: "memory");
    return memset(p, 2, n);
}

int main(int argc, char **argv) {
    long hold_ms = argc > 1 ? atol(argv[1]) : 300;
    big_buffers();
    long kept;
    char **rec = scatter_records(&kept);
    void *h = hostile(1000);
    struct timespec hold = {hold_ms / 1000, (hold_ms % 1000) * 1000000L};
    nanosleep(&hold, NULL);
    printf("kept %ld records\n", kept);
    for (long i = 0; i < kept; i++) free(rec[i]);
    free(rec);
    free(h);
    return 0;
}
