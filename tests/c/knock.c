/* knock.c: opens N connections to the recorder's socket SOCK, each sending a HELLO that
 * carries TOKEN, as a process of another user might. Exits 0 whatever the answers.
 * usage: knock SOCK TOKEN N */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

int main(int argc, char **argv) {
    if (argc < 4) return 2;
    struct sockaddr_un addr = {.sun_family = AF_UNIX};
    strncpy(addr.sun_path, argv[1], sizeof addr.sun_path - 1);
    uint32_t token_len = (uint32_t)strlen(argv[2]);
    char msg[32 + 32 + 256] = {0};
    uint32_t header[4] = {1 /* HELLO */, 32 + token_len, 0, 0};
    uint32_t hello[4] = {(uint32_t)getpid(), (uint32_t)getppid(), 0, token_len};
    if (token_len > 256) return 2;
    memcpy(msg, header, sizeof header);
    memcpy(msg + 32, hello, sizeof hello);
    memcpy(msg + 64, argv[2], token_len);
    for (int i = 0, n = atoi(argv[3]); i < n; i++) {
        int fd = socket(AF_UNIX, SOCK_STREAM, 0);
        if (fd < 0) return 3;
        if (connect(fd, (struct sockaddr *)&addr, sizeof addr) == 0)
            (void)!send(fd, msg, 64 + token_len, MSG_NOSIGNAL);
        close(fd);
    }
    return 0;
}
