/* A heap of N small blocks (40 bytes), then N mid-size ones (1500 bytes) beside them,
 * then all freed: the blocks a report's live table holds grow bigger between two of its
 * growths (bench/live_table_shift.sh). usage: small_then_big [N=1000000] */
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

int main(int argc, char **argv) {
    size_t n = argc > 1 ? strtoul(argv[1], 0, 10) : 1000000;
    void **small = malloc(n * sizeof *small), **big = malloc(n * sizeof *big);
    if (!small || !big) return 1;
    for (size_t i = 0; i < n; i++) {
        small[i] = malloc(40);
        memset(small[i], 1, 40);
    }
    usleep(300000);
    for (size_t i = 0; i < n; i++) {
        big[i] = malloc(1500);
        memset(big[i], 1, 64);
    }
    usleep(300000);
    for (size_t i = 0; i < n; i++) {
        free(small[i]);
        free(big[i]);
    }
    free(small);
    free(big);
    return 0;
}
