/* Allocations from many distinct call stacks, each reached again and again: a recursion
 * of depth DEPTH through two functions picks its path from the bits of the iteration's
 * number, so 2^DEPTH stacks come round in turn (DEPTH 13: 8192 stacks, twice the first
 * size of the interposer's per-thread stack table). Each allocation frees the block of
 * its ring slot. usage: many_stacks [iterations=100000] */
#include <stdint.h>
#include <stdlib.h>

#define DEPTH 13
static void *ring[4096];
static unsigned turn;

__attribute__((noinline)) static void allocate(void) {
    unsigned k = turn++ % 4096;
    free(ring[k]);
    ring[k] = malloc(16 + turn % 200);
}

__attribute__((noinline)) static void left(int depth, unsigned path);
__attribute__((noinline)) static void right(int depth, unsigned path);

__attribute__((noinline)) static void left(int depth, unsigned path) {
    if (depth == 0) allocate();
    else if (path & 1) left(depth - 1, path >> 1);
    else right(depth - 1, path >> 1);
    __asm__ volatile("" ::: "memory"); /* not a tail call: every frame stays */
}

__attribute__((noinline)) static void right(int depth, unsigned path) {
    if (depth == 0) allocate();
    else if (path & 1) right(depth - 1, path >> 1);
    else left(depth - 1, path >> 1);
    __asm__ volatile("" ::: "memory");
}

int main(int argc, char **argv) {
    long n = argc > 1 ? atol(argv[1]) : 100000;
    for (long i = 0; i < n; i++) left(DEPTH, (unsigned)i & ((1u << DEPTH) - 1));
    for (int k = 0; k < 4096; k++) free(ring[k]);
    return 0;
}
