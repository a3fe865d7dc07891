/* wait_for_file.c: writes its pid to PIDFILE, then makes a malloc/free pair of 901 bytes
 * every millisecond until GOFILE exists, and exits 0. Lets a test act while it is recorded.
 * usage: wait_for_file PIDFILE GOFILE */
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

static void *volatile sink; /* keeps the compiler from removing malloc/free pairs */

int main(int argc, char **argv) {
    if (argc < 3) return 2;
    char tmp[4096];
    snprintf(tmp, sizeof tmp, "%s.tmp", argv[1]);
    FILE *f = fopen(tmp, "w");
    if (!f) return 3;
    fprintf(f, "%d\n", (int)getpid());
    fclose(f);
    if (rename(tmp, argv[1]) != 0) return 4;
    for (int ms = 0; access(argv[2], F_OK) != 0; ms++) {
        if (ms > 60000) return 5;
        sink = malloc(901);
        free(sink);
        usleep(1000);
    }
    return 0;
}
