/* leaks.c: known leaks, temporaries and long-lived blocks, each from a function of its
 * own: leak_some leaks 1000 blocks of 100 bytes; use_temporarily allocates and frees 5000
 * blocks of 200 bytes, each freed before anything else is allocated; keep_for_a_while
 * holds 3000 blocks of 300 bytes and frees them at the end (neither). Prints nothing, so
 * stdio allocates nothing. usage: leaks */
#include <stdlib.h>
#include <string.h>

static void *volatile sink;
static void *leaked[1000];
static void *kept[3000];

__attribute__((noinline)) static void leak_some(void) {
    for (int i = 0; i < 1000; i++) leaked[i] = memset(malloc(100), 1, 100);
}

__attribute__((noinline)) static void use_temporarily(int i) {
    char *p = malloc(200);
    memset(p, i, 200);
    sink = p;
    free(p);
}

__attribute__((noinline)) static void keep_for_a_while(int i) {
    kept[i] = memset(malloc(300), 2, 300);
}

int main(void) {
    leak_some();
    for (int i = 0; i < 5000; i++) {
        use_temporarily(i);
        if (i < 3000) keep_for_a_while(i);
    }
    for (int i = 0; i < 3000; i++) free(kept[i]);
    return 0;
}
