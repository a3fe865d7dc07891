/* Keeping tracing alive across exec, exit and descriptor juggling. Included once, by
 * fragscope_preload.c, where this part of it stood: it uses what comes before it there. */

/* ---- keeping tracing alive across exec, exit and descriptor juggling ---- */

/* The environment an exec'd program gets: the caller's, with fragscope's variables put
 * back if the caller dropped them (daemons and sandboxes often pass a clean envp). */
static char **traced_environment(char *const envp[], char **out, size_t cap) {
    static char preload_merged[4096];
    size_t n = 0;
    const char *their_preload = NULL;
    for (size_t i = 0; envp && envp[i] && n + 8 < cap; i++) {
        const char *e = envp[i];
        if (!strncmp(e, "FRAGSCOPE_", 10)) continue;
        if (!strncmp(e, "LD_PRELOAD=", 11)) {
            their_preload = e + 11;
            continue;
        }
        out[n++] = (char *)e;
    }
#define PUT_ENV(name) if (env_##name[0] && strcmp(#name, "LD_PRELOAD")) out[n++] = env_##name;
    ENV_VARS(PUT_ENV)
    const char *ours = env_LD_PRELOAD[0] ? env_LD_PRELOAD + 11 : "";
    if (their_preload && *their_preload && !strstr(their_preload, ours))
        snprintf(preload_merged, sizeof preload_merged, "LD_PRELOAD=%s:%s", ours, their_preload);
    else if (their_preload && *their_preload)
        snprintf(preload_merged, sizeof preload_merged, "LD_PRELOAD=%s", their_preload);
    else
        snprintf(preload_merged, sizeof preload_merged, "%s", env_LD_PRELOAD);
    if (preload_merged[0]) out[n++] = preload_merged;
    out[n] = NULL;
    return out;
}

static size_t count_env(char *const envp[]) {
    size_t n = 0;
    while (envp && envp[n]) n++;
    return n;
}

/* Tells the recorder that process `pid` is about to run `path` as whom (uid, gid) with
 * `argv`, so that it can say why if the image never connects (set-user-ID, statically
 * linked, ...): our own exec, a vfork child's (dash runs commands so; it shares our
 * connection) or a posix_spawn'd child's. */
static void announce_image(uint32_t pid, const char *path, char *const argv[]) {
    char payload[8192];
    size_t path_len = path ? strnlen(path, 4096) : 0;
    uint32_t head[4] = {pid, (uint32_t)getuid(), (uint32_t)getgid(), (uint32_t)path_len};
    memcpy(payload, head, sizeof head);
    size_t len = sizeof head;
    if (path_len) memcpy(payload + len, path, path_len);
    len += path_len;
    for (size_t i = 0; argv && argv[i]; i++) {
        size_t n = strlen(argv[i]) + 1;
        if (len + n > sizeof payload) break;
        memcpy(payload + len, argv[i], n);
        len += n;
    }
    uint64_t tick = current_tick();
    struct msg_header h = {MSG_EXEC, (uint32_t)len, 0, 0, tick, tick};
    send_message(&h, payload, 0);
}

/* Before the program image is replaced: send what is buffered, and what comes next. */
static void before_exec(const char *path, char *const argv[]) {
    if (!tracing) return;
    tls_flags |= TF_FORWARD;
    flush_all();
    announce_image((uint32_t)syscall(SYS_getpid), path, argv);
    tls_flags &= ~TF_FORWARD;
}

/* The exec returned: this image goes on (or, in a vfork child, is about to _exit). */
static void exec_failed(void) {
    if (!tracing) return;
    int saved_errno = errno; /* the exec's, for the caller */
    tls_flags |= TF_FORWARD;
    uint32_t pid = (uint32_t)syscall(SYS_getpid);
    uint64_t tick = current_tick();
    struct msg_header h = {MSG_EXEC_FAILED, sizeof pid, 0, 0, tick, tick};
    send_message(&h, &pid, 0);
    tls_flags &= ~TF_FORWARD;
    errno = saved_errno;
}

extern char **environ;

EXPORT int execve(const char *path, char *const argv[], char *const envp[]) {
    if (!real_execve) ensure_init();
    before_exec(path, argv);
    if (!tracing) return real_execve(path, argv, envp);
    char **env = alloca((count_env(envp) + 16) * sizeof(char *));
    int rc = real_execve(path, argv, traced_environment(envp, env, count_env(envp) + 16));
    exec_failed();
    return rc;
}
EXPORT int execvpe(const char *file, char *const argv[], char *const envp[]) {
    if (!real_execvpe) ensure_init();
    before_exec(file, argv);
    if (!tracing) return real_execvpe(file, argv, envp);
    char **env = alloca((count_env(envp) + 16) * sizeof(char *));
    int rc = real_execvpe(file, argv, traced_environment(envp, env, count_env(envp) + 16));
    exec_failed();
    return rc;
}
EXPORT int execv(const char *path, char *const argv[]) { return execve(path, argv, environ); }
EXPORT int execvp(const char *file, char *const argv[]) { return execvpe(file, argv, environ); }

/* execl, execlp and execle: their argument lists as an argv for the hooks above. */
#define COLLECT_ARGV(first, args, argv)                                                \
    size_t argc_ = 1;                                                                  \
    va_start(args, first);                                                             \
    while (va_arg(args, char *)) argc_++;                                              \
    va_end(args);                                                                      \
    char **argv = alloca((argc_ + 1) * sizeof(char *));                                \
    argv[0] = (char *)(first);                                                         \
    va_start(args, first);                                                             \
    for (size_t i_ = 1; i_ <= argc_; i_++) argv[i_] = va_arg(args, char *);

EXPORT int execl(const char *path, const char *arg, ...) {
    va_list args;
    COLLECT_ARGV(arg, args, argv)
    va_end(args);
    return execve(path, argv, environ);
}
EXPORT int execlp(const char *file, const char *arg, ...) {
    va_list args;
    COLLECT_ARGV(arg, args, argv)
    va_end(args);
    return execvpe(file, argv, environ);
}
EXPORT int execle(const char *path, const char *arg, ...) {
    va_list args;
    COLLECT_ARGV(arg, args, argv)
    char *const *envp = va_arg(args, char *const *); /* after the NULL that ends argv */
    va_end(args);
    return execve(path, argv, envp);
}

/* A spawned child runs `path` (its exec succeeded, or posix_spawn says it failed). */
static void after_spawn(int rc, const pid_t *pid, const char *path, char *const argv[]) {
    if (rc != 0 || !pid || !tracing) return;
    int saved_errno = errno;
    tls_flags |= TF_FORWARD;
    announce_image((uint32_t)*pid, path, argv);
    tls_flags &= ~TF_FORWARD;
    errno = saved_errno;
}

EXPORT int posix_spawn(pid_t *pid, const char *path, const posix_spawn_file_actions_t *fa,
                       const posix_spawnattr_t *attr, char *const argv[], char *const envp[]) {
    if (!real_posix_spawn) ensure_init();
    if (!tracing) return real_posix_spawn(pid, path, fa, attr, argv, envp);
    char **env = alloca((count_env(envp) + 16) * sizeof(char *));
    int rc = real_posix_spawn(pid, path, fa, attr, argv,
                              traced_environment(envp, env, count_env(envp) + 16));
    after_spawn(rc, pid, path, argv);
    return rc;
}
EXPORT int posix_spawnp(pid_t *pid, const char *file, const posix_spawn_file_actions_t *fa,
                        const posix_spawnattr_t *attr, char *const argv[], char *const envp[]) {
    if (!real_posix_spawnp) ensure_init();
    if (!tracing) return real_posix_spawnp(pid, file, fa, attr, argv, envp);
    char **env = alloca((count_env(envp) + 16) * sizeof(char *));
    int rc = real_posix_spawnp(pid, file, fa, attr, argv,
                               traced_environment(envp, env, count_env(envp) + 16));
    after_spawn(rc, pid, file, argv);
    return rc;
}

EXPORT void exit(int status) {
    if (!real_exit) ensure_init();
    exit_status = status;
    exit_status_known = 1;
    real_exit(status);
    __builtin_unreachable();
}
/* quick_exit runs the at_quick_exit handlers and leaves through glibc's internal _exit,
 * which we cannot see: our own handler, registered first and so run last, says goodbye. */
EXPORT void quick_exit(int status) {
    if (!real_quick_exit) ensure_init();
    exit_status = status;
    exit_status_known = 1;
    real_quick_exit(status);
    __builtin_unreachable();
}
static void on_quick_exit(void) {
    send_exit(exit_status_known ? exit_status : 0,
              exit_status_known ? EXIT_VIA__EXIT : EXIT_UNKNOWN_STATUS);
}

/* A program that returns from main leaves through glibc's internal call of exit, which
 * we cannot see either: main is wrapped to learn the status it returns. */
typedef int (*main_fn)(int, char **, char **);
static main_fn program_main;
static int main_with_status(int argc, char **argv, char **envp) {
    int status = program_main(argc, argv, envp);
    exit_status = status;
    exit_status_known = 1;
    return status;
}
EXPORT int __libc_start_main(main_fn main, int argc, char **argv, void (*init)(void),
                             void (*fini)(void), void (*rtld_fini)(void), void *stack_end) {
    /* Ours: its lookup frees the messages of lookups that failed during our start-up. */
    unsigned saved = tls_flags;
    tls_flags |= TF_FORWARD;
    int (*real_start)(main_fn, int, char **, void (*)(void), void (*)(void), void (*)(void),
                      void *) = dlsym(RTLD_NEXT, "__libc_start_main");
    forget_dl_error();
    tls_flags = saved;
    program_main = main;
    return real_start(main_with_status, argc, argv, init, fini, rtld_fini, stack_end);
}

EXPORT void _exit(int status) {
    if (!real__exit) ensure_init();
    send_exit(status, EXIT_VIA__EXIT);
    real__exit(status);
    __builtin_unreachable();
}
EXPORT void _Exit(int status) {
    if (!real__Exit) ensure_init();
    send_exit(status, EXIT_VIA__EXIT);
    real__Exit(status);
    __builtin_unreachable();
}

/* Descriptor hooks: our socket is not the program's to close. */
EXPORT int close(int fd) {
    if (!real_close) ensure_init();
    if (tracing && fd == sock_fd && fd >= 0) return 0;
    return real_close ? real_close(fd) : (int)syscall(SYS_close, fd);
}

static int close_range_raw(unsigned first, unsigned last, int flags) {
    if (first > last) return 0;
    return (int)syscall(SYS_close_range, first, last, flags);
}

EXPORT int close_range(unsigned first, unsigned last, int flags) {
    if (!real_close_range) ensure_init();
    if (tracing && sock_fd >= 0 && (unsigned)sock_fd >= first && (unsigned)sock_fd <= last) {
        int a = sock_fd > 0 ? close_range_raw(first, (unsigned)sock_fd - 1, flags) : 0;
        int b = (unsigned)sock_fd < ~0U ? close_range_raw((unsigned)sock_fd + 1, last, flags) : 0;
        return a ? a : b;
    }
    return close_range_raw(first, last, flags);
}

EXPORT void closefrom(int lowfd) {
    if (lowfd < 0) lowfd = 0;
    close_range((unsigned)lowfd, ~0U, 0);
}

/* If the program wants our descriptor's number, our socket moves elsewhere first. */
static void move_socket_from(int fd) {
    if (!tracing || fd != sock_fd || fd < 0) return;
    pthread_mutex_lock(&sock_lock);
    int moved = fcntl(sock_fd, F_DUPFD_CLOEXEC, sock_fd + 1);
    if (moved >= 0) {
        syscall(SYS_close, sock_fd);
        sock_fd = moved;
    }
    pthread_mutex_unlock(&sock_lock);
}
EXPORT int dup2(int oldfd, int newfd) {
    if (!real_dup2) ensure_init();
    move_socket_from(newfd);
    return real_dup2(oldfd, newfd);
}
EXPORT int dup3(int oldfd, int newfd, int flags) {
    if (!real_dup3) ensure_init();
    move_socket_from(newfd);
    return real_dup3(oldfd, newfd, flags);
}

/* Of the threads that held `want`, keeps the latest in `best`. */
static void latest_holder(pthread_t want, struct thread_identity holder,
                          struct thread_identity *best) {
    if (pthread_equal(holder.thread, want) && (best->tid == 0 || holder.birth > best->birth))
        *best = holder;
}

/* The kernel tid of a thread of this process by its pthread_t, 0 if it never recorded a
 * call. A pthread_t is reused only once its thread was joined or detached, so of the
 * threads that had this one, the latest is the one being joined. Its state may since
 * have gone to another thread: then it is among the departed. */
static uint32_t tid_of_thread(pthread_t thread) {
    struct thread_identity best = {0};
    pthread_mutex_lock(&registry_lock);
    for (struct thread_state *r = registry; r; r = r->next_in_registry)
        latest_holder(thread, (struct thread_identity){r->thread, r->tid, r->birth}, &best);
    unsigned kept = departed_next < DEPARTED_CAP ? departed_next : DEPARTED_CAP;
    for (unsigned i = 0; i < kept; i++) latest_holder(thread, departed[i], &best);
    pthread_mutex_unlock(&registry_lock);
    return best.tid;
}

/* A joined thread made its last call before the join returned: the merge need not wait
 * for it past what it sent (its state may already be another thread's, told then). */
static void tell_joined_gone(uint32_t tid) {
    pthread_mutex_lock(&registry_lock);
    for (struct thread_state *r = registry; r; r = r->next_in_registry)
        if (r->retired && r->tid == tid) tell_gone(r);
    pthread_mutex_unlock(&registry_lock);
}

/* Writes a JOINED record: everything `tid` recorded came before this thread's next call. */
static void record_joined(uint32_t tid) {
    struct thread_state *ts;
    if (!begin_marker(&ts)) return;
    if (ts) put_tagged(ts, KIND_LOST | FLAG_JOINED, tid);
    end_marker();
}

/* Sends what this thread has buffered, before it starts a thread (which may free this
 * one's blocks at once) or waits for one: a thread that waits makes no call that would
 * send its buffer, so the blocks it handed over would reach the recorder after their
 * frees, which the merge could then only force (and the blocks would stay live). */
static void flush_before_waiting(void) {
    struct thread_state *ts = tls_state;
    if (!ts || (tls_flags & TF_BUSY)) return;
    tls_flags |= TF_BUSY;
    __atomic_signal_fence(__ATOMIC_SEQ_CST);
    wait_until_not_taken(ts);
    if (ts->nested_head != ts->nested_tail || ts->nested_lost) drain_nested(ts);
    flush_thread(ts);
    __atomic_signal_fence(__ATOMIC_SEQ_CST);
    tls_flags &= ~TF_BUSY;
}

/* After a join, the joined thread's calls all came before this thread's next one; without
 * the record, the merge could only go by the millisecond tick, and could put a worker's
 * last calls after the frees of the thread that joined it. */
EXPORT int pthread_join(pthread_t thread, void **retval) {
    if (!real_pthread_join) ensure_init();
    uint32_t joined = tracing ? tid_of_thread(thread) : 0;
    if (tracing) flush_before_waiting();
    unsigned saved = tls_flags;
    tls_flags |= TF_TLS_RELEASE;
    int rc = real_pthread_join(thread, retval);
    tls_flags = saved;
    /* A thread joined before it first allocated had no state to find before: it has one
     * now if it recorded anything (and nothing to wait for if not). */
    if (rc == 0 && !joined && tracing) joined = tid_of_thread(thread);
    if (rc == 0 && joined && tracing) {
        int saved_errno = errno;
        tell_joined_gone(joined);
        record_joined(joined);
        errno = saved_errno;
    }
    return rc;
}

/* The new thread's calls must be ordered with this one's from its first (order_calls).
 * A new thread on a cached stack has the last one's thread-local storage freed here. */
EXPORT int pthread_create(pthread_t *thread, const pthread_attr_t *attr, void *(*start)(void *),
                          void *arg) {
    if (!real_pthread_create) ensure_init();
    if (tracing) {
        order_calls();
        flush_before_waiting();
    }
    unsigned saved = tls_flags;
    tls_flags |= TF_TLS_RELEASE;
    int rc = real_pthread_create(thread, attr, start, arg);
    tls_flags = saved;
    return rc;
}

/* dlopen and dlclose change the memory map; the recorder reads it while we wait, so the
 * library's addresses are known before its code runs and after it is gone. */
static void notify_maps_changed(void) {
    if (!tracing) return;
    tls_flags |= TF_FORWARD;
    __atomic_signal_fence(__ATOMIC_SEQ_CST);
    struct thread_state *ts = tls_state;
    if (ts) {
        wait_until_not_taken(ts);
        flush_thread(ts);
    }
    uint64_t tick = current_tick();
    struct msg_header h = {MSG_MAPS_CHANGED, 0, 0, 0, tick, tick};
    send_message(&h, NULL, 1);
    tls_flags &= ~TF_FORWARD;
}
EXPORT void *dlopen(const char *file, int mode) {
    if (!real_dlopen) ensure_init();
    void *h = real_dlopen(file, mode);
    if (h && file) {
        notify_maps_changed();
        attach_rebind();
        resolve_cxx_operators();
    }
    return h;
}
EXPORT int dlclose(void *handle) {
    if (!real_dlclose) ensure_init();
    notify_maps_changed();
    int rc = real_dlclose(handle);
    notify_maps_changed();
    return rc;
}
