/* locale_first.c: a program whose first malloc is made inside glibc's bindtextdomain,
 * which holds glibc's _nl_state_lock for writing meanwhile, as PostgreSQL's is (through
 * libgpg-error's constructor). Built three ways:
 *   -DLOCALE_LIBRARY -shared: liblocale_first.so, whose constructor calls bindtextdomain;
 *   -DMIDDLE_LIBRARY -shared: libmiddle.so, which needs liblocale_first.so, so that the
 *     constructor above runs before the preloaded interposer's (as libgpg-error's runs
 *     before it in PostgreSQL, which needs it through libsystemd and libgcrypt);
 *   neither: the program, which needs libmiddle.so, then binds its own text domain, sets
 *     its locale, prints "translated: ok" and makes one malloc/free pair of 1000 bytes;
 *     it waits forever in bindtextdomain if the lock was left corrupt. */
#include <libintl.h>
#include <locale.h>
#include <stdio.h>
#include <stdlib.h>

#if defined(LOCALE_LIBRARY)

__attribute__((constructor)) static void bind_early(void) {
    bindtextdomain("fragscope-locale-first-lib", "/nonexistent");
}

#elif defined(MIDDLE_LIBRARY)

int middle_library(void) { return 1; }

#else

int main(void) {
    bindtextdomain("fragscope-locale-first", "/nonexistent");
    textdomain("fragscope-locale-first");
    setlocale(LC_ALL, "");
    printf("translated: %s\n", gettext("ok"));
    void *volatile block = malloc(1000);
    free(block);
    return 0;
}

#endif
