/* no_calls.c: allocates and frees a block it never uses, which compilers remove at -O1
 * and above, so the program makes no malloc-family call at all.
 * usage: no_calls [rounds=1000] */
#include <stdlib.h>

int main(int argc, char **argv) {
    long rounds = argc > 1 ? atol(argv[1]) : 1000;
    for (long i = 0; i < rounds; i++) free(malloc(64));
    return 0;
}
