/* paced.c: allocates at a modest pace, as most programs do: ROUNDS rounds of PAIRS
 * malloc/free pairs of varied sizes, each round followed by a pause of PAUSE_US
 * microseconds.  usage: paced ROUNDS PAIRS PAUSE_US */
#include <stdlib.h>
#include <unistd.h>

static void *volatile sink; /* keeps the compiler from removing the pairs */

int main(int argc, char **argv) {
    if (argc < 4) return 2;
    long rounds = atol(argv[1]), pairs = atol(argv[2]), pause_us = atol(argv[3]);
    enum { KEEP = 256 };
    static void *kept[KEEP];
    for (long r = 0; r < rounds; r++) {
        for (long i = 0; i < pairs; i++) {
            size_t k = (size_t)(r * pairs + i) % KEEP;
            free(kept[k]);
            kept[k] = malloc(16 + (size_t)(i * 37 % 500));
            sink = kept[k];
        }
        usleep((useconds_t)pause_us);
    }
    for (int k = 0; k < KEEP; k++) free(kept[k]);
    return 0;
}
