/* The connection to the recorder: the socket, its messages and the shared clock's ticks.
 * Included once, by fragscope_preload.c, where this part of it stood: it uses what comes
 * before it there. */

/* ---- the connection to the recorder ---- */
static ssize_t read_file(const char *path, char *buf, size_t cap) {
    int fd = (int)syscall(SYS_openat, AT_FDCWD, path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return -1;
    size_t got = 0;
    while (got < cap) {
        ssize_t n = syscall(SYS_read, fd, buf + got, cap - got);
        if (n < 0 && errno == EINTR) continue;
        if (n <= 0) break;
        got += (size_t)n;
    }
    syscall(SYS_close, fd);
    return (ssize_t)got;
}

/* Sends header and payload; the caller holds sock_lock. Returns 0 on success. */
static int send_locked_once(const struct msg_header *h, const void *payload) {
    if (sock_fd < 0) return -1;
    struct iovec iov[2] = {{(void *)h, sizeof *h}, {(void *)payload, h->len}};
    struct msghdr m = {.msg_iov = iov, .msg_iovlen = payload && h->len ? 2 : 1};
    size_t left = sizeof *h + (payload ? h->len : 0);
    while (left > 0) {
        ssize_t n = sendmsg(sock_fd, &m, MSG_NOSIGNAL);
        if (n < 0 && errno == EINTR) continue;
        if (n <= 0) return -1;
        left -= (size_t)n;
        while (m.msg_iovlen > 0 && (size_t)n >= m.msg_iov[0].iov_len) {
            n -= (ssize_t)m.msg_iov[0].iov_len;
            m.msg_iov++;
            m.msg_iovlen--;
        }
        if (m.msg_iovlen > 0) {
            m.msg_iov[0].iov_base = (char *)m.msg_iov[0].iov_base + n;
            m.msg_iov[0].iov_len -= (size_t)n;
        }
    }
    return 0;
}

static int connect_recorder(void) {
    int fd = (int)socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0) return -1;
    struct sockaddr_un addr = {.sun_family = AF_UNIX};
    memcpy(addr.sun_path, sock_path, sizeof addr.sun_path);
    if (connect(fd, (struct sockaddr *)&addr, sizeof addr) != 0) {
        syscall(SYS_close, fd);
        return -1;
    }
    /* Out of the way of programs that use low descriptors or close them wholesale. */
    int high = fcntl(fd, F_DUPFD_CLOEXEC, FD_FLOOR);
    if (high >= 0) {
        syscall(SYS_close, fd);
        fd = high;
    }
    return fd;
}

/* HELLO: pid, ppid, flags, token length, fork tick, then argv (as in /proc/PID/cmdline),
 * exe path, the recording's token (FRAGSCOPE_TOKEN: the recorder serves no one who
 * does not know it) and, in a forked child, the mark its parent recorded at the fork
 * (0: none). */
static int send_hello_locked(uint32_t flags, uint32_t fork_mark) {
    static char payload[16384];
    const char *token = env_FRAGSCOPE_TOKEN[0] ? env_FRAGSCOPE_TOKEN + sizeof "FRAGSCOPE_TOKEN" : "";
    size_t token_len = strlen(token);
    uint32_t *w = (uint32_t *)payload;
    w[0] = (uint32_t)my_pid;
    w[1] = (uint32_t)getppid();
    w[2] = flags | (can_send_idle ? HELLO_MARKS_IDLE : 0) | (attached ? HELLO_ATTACHED : 0);
    w[3] = (uint32_t)token_len;
    uint64_t tick = current_tick();
    memcpy(payload + 16, &tick, 8);
    char *cmd = payload + 32;
    ssize_t cmd_len = read_file("/proc/self/cmdline", cmd, 8192);
    if (cmd_len < 0) cmd_len = 0;
    char *exe = cmd + cmd_len;
    ssize_t exe_len = readlink("/proc/self/exe", exe, 4096);
    if (exe_len < 0) exe_len = 0;
    uint32_t lens[2] = {(uint32_t)cmd_len, (uint32_t)exe_len};
    memcpy(payload + 24, lens, 8);
    memcpy(exe + exe_len, token, token_len);
    memcpy(exe + exe_len + token_len, &fork_mark, 4);
    struct msg_header h = {MSG_HELLO, (uint32_t)(32 + cmd_len + exe_len + token_len + 4), 0, 0, tick, tick};
    return send_locked_once(&h, payload);
}

/* Sends a message, reconnecting once if the program closed our descriptor behind our
 * back (a raw close syscall, or a close_range we could not see). */
static void send_message_locked(const struct msg_header *h, const void *payload, int want_ack) {
    int ok = send_locked_once(h, payload) == 0;
    if (!ok && sock_path[0]) {
        int fd = connect_recorder();
        if (fd >= 0) {
            sock_fd = fd;
            ok = send_hello_locked(HELLO_RESUMED, 0) == 0 && send_locked_once(h, payload) == 0;
        }
    }
    if (ok && want_ack) {
        /* The recorder answers one byte when it has read /proc for us. */
        struct pollfd p = {sock_fd, POLLIN, 0};
        char ack;
        while (poll(&p, 1, 10000) < 0 && errno == EINTR) {
        }
        if (p.revents & POLLIN) (void)!syscall(SYS_read, sock_fd, &ack, 1);
    }
}

static void send_message(const struct msg_header *h, const void *payload, int want_ack) {
    pthread_mutex_lock(&sock_lock);
    send_message_locked(h, payload, want_ack);
    pthread_mutex_unlock(&sock_lock);
}

/* Bytes to the next sample of a Poisson process over allocated bytes with this mean, as
 * jemalloc's and tcmalloc's heap samplers; `rng` is the caller's xorshift state. */
static uint64_t poisson_interval(uint64_t *rng, double mean) {
    *rng ^= *rng << 13;
    *rng ^= *rng >> 7;
    *rng ^= *rng << 17;
    double u = ((*rng >> 11) + 1) * (1.0 / 9007199254740993.0); /* (0, 1] */
    return (uint64_t)(-log(u) * mean) + 1;
}
