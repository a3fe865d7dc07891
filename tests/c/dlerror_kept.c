/* dlerror_kept.c: a thread's failed dlsym leaves an error message that its next dlerror()
 * returns, with a large allocation (whose stack is sampled, the thread's first) between
 * them: the interposer's own work at a thread's first stack must not clear the program's
 * pending dlerror state (glibc frees it at any dl* call that succeeds). Exits 3 if the
 * message is lost.  usage: dlerror_kept */
#include <dlfcn.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>

static char *volatile kept; /* so that the compiler keeps the allocation */

static void *work(void *arg) {
    (void)arg;
    if (dlsym(RTLD_DEFAULT, "fragscope_no_such_symbol")) return (void *)1;
    kept = malloc(64 << 20); /* sampled surely: 64 MiB past any sampling distance */
    const char *message = dlerror();
    free(kept);
    if (!message) {
        fprintf(stderr, "dlerror_kept: dlerror() lost the failed dlsym's message\n");
        return (void *)3;
    }
    return NULL;
}

int main(void) {
    pthread_t t;
    void *status;
    if (pthread_create(&t, NULL, work, NULL) != 0 || pthread_join(t, &status) != 0) return 2;
    return (int)(long)status;
}
