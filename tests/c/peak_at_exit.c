/* peak_at_exit.c: live data peaks just before the program frees it all and exits, so
 * the peak and the snapshot taken at exit fall in the same few milliseconds.
 * usage: peak_at_exit [blocks=2000] */
#include <stdlib.h>
#include <string.h>

int main(int argc, char **argv) {
    int n = argc > 1 ? atoi(argv[1]) : 2000;
    char **b = malloc(sizeof *b * (size_t)n);
    for (int i = 0; i < n; i++) b[i] = memset(malloc(4096), 1, 4096);
    for (int i = 0; i < n; i++) free(b[i]);
    free(b);
    return 0;
}
