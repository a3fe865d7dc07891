/* dlopen.c: loads the library given as argv[1] three times; each time its constructor
 * keeps 10 blocks of 701 bytes, plugin_churn makes 100 malloc/free pairs, and dlclose
 * runs its destructor, which frees the 10 blocks: 330 allocations of 701 bytes in all,
 * each freed. Exits 0, or non-zero if the library misbehaves.
 * usage: dlopen /path/to/libdlopen_plugin.so */
#include <dlfcn.h>
#include <stdio.h>

int main(int argc, char **argv) {
    if (argc < 2) return 2;
    for (int round = 0; round < 3; round++) {
        void *lib = dlopen(argv[1], RTLD_NOW | RTLD_LOCAL);
        if (!lib) {
            fprintf(stderr, "dlopen: %s\n", dlerror());
            return 3;
        }
        void (*churn)(int) = (void (*)(int))dlsym(lib, "plugin_churn");
        if (!churn) return 4;
        churn(100);
        if (dlclose(lib) != 0) return 5;
    }
    return 0;
}
