/* dlopen_plugin.c: a shared library for dlopen.c. Its constructor keeps 10 blocks of 701
 * bytes, plugin_churn(n) makes n malloc/free pairs of 701 bytes, and its destructor
 * (run by dlclose) frees the 10 blocks. */
#include <stdlib.h>

static void *kept[10];
static void *volatile sink; /* keeps the compiler from removing malloc/free pairs */

__attribute__((constructor)) static void plugin_load(void) {
    for (int i = 0; i < 10; i++) kept[i] = malloc(701);
}

__attribute__((destructor)) static void plugin_unload(void) {
    for (int i = 0; i < 10; i++) free(kept[i]);
}

void plugin_churn(int n) {
    for (int i = 0; i < n; i++) {
        sink = malloc(701);
        free(sink);
    }
}
