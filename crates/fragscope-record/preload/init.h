/* Initialisation: finding the real functions, the recorder's settings and the
 * connection. Included once, by fragscope_preload.c, where this part of it stood: it
 * uses what comes before it there. */

/* ---- initialisation ---- */
static void resolve_real_functions(void) {
#define RESOLVE_ALLOC(name, kind, ret, params, args) real_##name = real_symbol(#name);
    FRAGSCOPE_ALLOC_HOOKS(RESOLVE_ALLOC)
#define RESOLVE_SYSTEM(name, ret, params) real_##name = real_symbol(#name);
    FRAGSCOPE_SYSTEM_HOOKS(RESOLVE_SYSTEM)
    real_malloc_usable_size = real_symbol("malloc_usable_size");
    Dl_info usable_from, fn_from;
    int known = real_malloc_usable_size && dladdr((void *)real_malloc_usable_size, &usable_from);
#define SAME_OBJECT(name, kind, ret, params, args)                                             \
    usable_size_applies[kind] = known && real_##name && dladdr((void *)real_##name, &fn_from) && \
                                fn_from.dli_fbase == usable_from.dli_fbase;
    FRAGSCOPE_ALLOC_HOOKS(SAME_OBJECT)
}

static void copy_env(char *slot, size_t cap, const char *name) {
    const char *v = setting(name);
    if (!v) return;
    size_t n = strlen(name), m = strlen(v);
    if (n + 1 + m + 1 > cap) return;
    memcpy(slot, name, n);
    slot[n] = '=';
    memcpy(slot + n + 1, v, m + 1);
}

/* The executable segment holding `addr`, found by dl_iterate_phdr. */
struct text_range {
    uintptr_t addr, lo, hi;
};
static int find_text(struct dl_phdr_info *info, size_t size, void *data) {
    (void)size;
    struct text_range *r = data;
    for (int i = 0; i < info->dlpi_phnum; i++) {
        const ElfW(Phdr) *ph = &info->dlpi_phdr[i];
        if (ph->p_type != PT_LOAD || !(ph->p_flags & PF_X)) continue;
        uintptr_t lo = info->dlpi_addr + ph->p_vaddr, hi = lo + ph->p_memsz;
        if (r->addr >= lo && r->addr < hi) {
            r->lo = lo;
            r->hi = hi;
            return 1;
        }
    }
    return 0;
}

/* Lets threads send idle threads' buffers (send_idle_buffers): Linux 4.14+. Registered
 * per process, so again in a forked child. Not under a seccomp filter (a systemd unit's
 * SystemCallFilter, say), which may kill the process for a system call it does not list. */
static void register_membarrier(void) {
    can_send_idle = 0;
    if (prctl(PR_GET_SECCOMP, 0, 0, 0, 0) != 0) return;
    long cmds = syscall(SYS_membarrier, MEMBARRIER_CMD_QUERY, 0);
    can_send_idle = cmds > 0 && (cmds & MEMBARRIER_CMD_PRIVATE_EXPEDITED) &&
                    syscall(SYS_membarrier, MEMBARRIER_CMD_REGISTER_PRIVATE_EXPEDITED, 0) == 0;
}

static void flush_before_waiting(void);

/* A record that marks this thread's place among its calls (a join, a fork), outside any
 * call: 0 from a handler that interrupted a record (rare: the marker is skipped), else 1
 * with TF_BUSY set until end_marker and `*ts` the thread's state (NULL when none can be
 * had), its buffer free to write and room left for a tick, an order and the marker. */
static int begin_marker(struct thread_state **out) {
    if (tls_flags & TF_BUSY) return 0;
    tls_flags |= TF_BUSY;
    __atomic_signal_fence(__ATOMIC_SEQ_CST);
    int saved_errno = errno; /* the program's, around a join or a fork */
    struct thread_state *ts = tls_state;
    if (!ts) ts = thread_state_new();
    if (ts) {
        wait_until_not_taken(ts);
        if (ts->nested_head != ts->nested_tail || ts->nested_lost) drain_nested(ts);
        if (ts->len + 32 > BUF_CAP) flush_thread(ts);
    }
    errno = saved_errno;
    *out = ts;
    return 1;
}

static void end_marker(void) {
    __atomic_signal_fence(__ATOMIC_SEQ_CST);
    tls_flags &= ~TF_BUSY;
}

/* Marks the forking thread's place among its calls: the child's heap is the process's
 * live blocks there, and the child names the mark in its HELLO. The clock is read as a
 * call reads it, so that other threads' calls are ordered against the mark. Not from a
 * handler that interrupted a record (rare): the child then names no mark. */
static void mark_fork(void) {
    tls_fork_mark = 0;
    struct thread_state *ts;
    if (!begin_marker(&ts)) return;
    int saved_errno = errno;
    if (ts) {
        /* As at a call: the merge, told the thread was idle, must wait for it again. */
        if (ts->idle) {
            ts->idle = 0;
            announce_awake(ts);
        }
        uint64_t now = clock_page->now, tick = now >> TICK_SHIFT;
        if (tick != ts->tick) {
            put_tagged(ts, KIND_TICK, tick - ts->tick);
            ts->tick = tick;
            ts->order_next = 0; /* the recorder started the counter again with the tick */
        }
        if (__atomic_load_n(&ordering_on, __ATOMIC_RELAXED)) note_order(ts, now, 0);
        uint32_t mark = atomic_fetch_add(&fork_marks, 1) + 1;
        put_tagged(ts, KIND_LOST | FLAG_FORKED, mark);
        tls_fork_mark = mark;
    }
    errno = saved_errno;
    end_marker();
}

static void atfork_prepare(void) {
    if (tracing) mark_fork();
    pthread_mutex_lock(&registry_lock);
    pthread_mutex_lock(&sock_lock);
}
static void atfork_parent(void) {
    pthread_mutex_unlock(&sock_lock);
    pthread_mutex_unlock(&registry_lock);
    /* Sent now: the merge of the child's calls waits for the mark. */
    if (tls_fork_mark) {
        int saved_errno = errno; /* a failed fork's */
        flush_before_waiting();
        errno = saved_errno;
    }
}
/* The child is a process of its own: its own connection and stream. The buffers it
 * inherited hold the parent's events, which the parent sends itself. */
static void atfork_child(void) {
    uint32_t fork_mark = tls_fork_mark;
    pthread_mutex_init(&sock_lock, NULL);
    pthread_mutex_init(&registry_lock, NULL);
    my_pid = getpid();
    if (!tracing) return;
    py_after_fork();
    lisp_after_fork();
    struct thread_state *mine = tls_state;
    for (struct thread_state *r = registry, *next; r; r = next) {
        next = r->next_in_registry;
        if (r != mine) {
            stack_table_free(r->stacks);
            munmap(r, sizeof *r);
        }
    }
    registry = mine;
    departed_next = 0; /* the parent's threads are not the child's to join */
    atomic_store(&own_bytes, mine ? sizeof *mine + (mine->stacks ? stack_table_bytes(mine->stacks->slots) : 0) : 0);
    if (mine) {
        mine->next_in_registry = NULL;
        mine->idle = 0;
        start_buffer(mine);
        mine->seq = 0;
        mine->tid = (uint32_t)syscall(SYS_gettid);
        mine->next_stack_id = 1;
        mine->nested_head = mine->nested_tail = 0;
        stack_table_forget(mine);
        memset(mine->usable_known, 0, sizeof mine->usable_known);
        mine->chunk_first_tick = mine->tick = current_tick();
    }
    syscall(SYS_close, sock_fd);
    register_membarrier(); /* before the HELLO, which says whether it is */
    sock_fd = connect_recorder();
    if (sock_fd < 0 || send_hello_locked(HELLO_FORKED, fork_mark) != 0) tracing = 0;
    /* A process, and a report, of its own: told again why its runtime is unsampled. */
    if (tracing) py_tell_unsampled();
    lisp_tell_unsampled();
    next_idle_scan = 0;
    if (mine) emit_own_memory(mine);
}

/* Maps the clock page from `fd` (closed here; -1: none). */
static void map_clock(int fd) {
    if (fd < 0) return;
    void *p = mmap(NULL, 4096, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (p != MAP_FAILED) {
        clock_page = p;
        clock_writable = 1;
    }
    syscall(SYS_close, fd);
}

/* The descriptor the recorder sends with a one-byte answer (SCM_RIGHTS), or -1. */
static int receive_descriptor(int sock) {
    char byte;
    struct iovec iov = {&byte, 1};
    union {
        struct cmsghdr align;
        char buf[CMSG_SPACE(sizeof(int))];
    } control;
    struct msghdr m = {.msg_iov = &iov, .msg_iovlen = 1, .msg_control = control.buf,
                       .msg_controllen = sizeof control.buf};
    struct pollfd p = {sock, POLLIN, 0};
    while (poll(&p, 1, 10000) < 0 && errno == EINTR) {
    }
    if (!(p.revents & POLLIN)) return -1;
    ssize_t n;
    while ((n = recvmsg(sock, &m, MSG_CMSG_CLOEXEC)) < 0 && errno == EINTR) {
    }
    struct cmsghdr *c = n == 1 ? CMSG_FIRSTHDR(&m) : NULL;
    if (!c || c->cmsg_level != SOL_SOCKET || c->cmsg_type != SCM_RIGHTS) return -1;
    int fd;
    memcpy(&fd, CMSG_DATA(c), sizeof fd);
    return fd;
}

static void init_tracing(void) {
    const char *path = setting("FRAGSCOPE_SOCK");
    if (!path || !*path || strlen(path) >= sizeof sock_path) return;
    memcpy(sock_path, path, strlen(path) + 1);
#define COPY_ENV(n) copy_env(env_##n, sizeof env_##n, #n);
    ENV_VARS(COPY_ENV)
    my_pid = getpid();
    const char *clock_path = setting("FRAGSCOPE_CLOCK");
    if (clock_path) map_clock((int)syscall(SYS_openat, AT_FDCWD, clock_path, O_RDWR | O_CLOEXEC));
    const char *stacks = setting("FRAGSCOPE_STACKS");
    stacks_mode = !stacks ? 1 : !strcmp(stacks, "all") ? 2 : !strcmp(stacks, "none") ? 0 : 1;
    const char *mean = setting("FRAGSCOPE_SAMPLE_BYTES");
    if (mean && atof(mean) >= 1) sample_mean_bytes = atof(mean);
    const char *flush = setting("FRAGSCOPE_FLUSH_MS");
    if (flush && atol(flush) > 0) flush_interval_ticks = (uint64_t)atol(flush);
    if (pthread_key_create(&thread_exit_key, thread_exited) != 0) return;
    sock_fd = connect_recorder();
    if (sock_fd < 0) {
        warn("cannot reach the recorder; this process runs untraced");
        return;
    }
    /* A process that became another user than the recorder (setpriv, su, a daemon's
     * setuid before an exec) cannot open the clock: the recorder hands it over. */
    uint32_t hello_flags = clock_page == &no_clock ? HELLO_WANTS_CLOCK : 0;
    register_membarrier(); /* before the HELLO, which says whether it is */
    if (send_hello_locked(hello_flags, 0) != 0) return;
    if (hello_flags & HELLO_WANTS_CLOCK) map_clock(receive_descriptor(sock_fd));
    atomic_store(&stats_answered, clock_page->stats_request);
    tracing = 1;
    py_detect();
    py_tell_unsampled();
}

/* A dlsym or dlopen that fails leaves the thread an error message, malloc'ed then (under
 * TF_FORWARD: unrecorded) and freed by the thread's next dl* call, which may be the
 * program's: a free of a block the trace never saw. So after our own lookups, one lookup
 * that succeeds frees the message and its state (glibc's _dlerror_run: 2.34+; before,
 * the state is static), still under TF_FORWARD. Not dlerror(): it translates the message
 * with gettext, which read-locks glibc's _nl_state_lock and __libc_setlocale_lock, and
 * our first malloc may come from inside bindtextdomain or newlocale, which hold them for
 * writing (libgpg-error's constructor, in PostgreSQL and gdb). The same thread's read
 * lock fails, gettext's unlock then releases the writer's lock, the writer's own unlock
 * leaves it corrupt, and the next bindtextdomain or setlocale waits forever. */
static void forget_dl_error(void) {
    (void)dlsym(RTLD_DEFAULT, "malloc");
}

/* Called by every hook until the real functions are known. Returns 1 when the caller
 * may forward to the real function, 0 when it must use the bootstrap arena (dlsym itself
 * allocating while we resolve). */
static __attribute__((noinline)) int ensure_init(void) {
    int state = atomic_load(&init_state);
    if (state == 2) return 1;
    int expected = 0;
    if (atomic_compare_exchange_strong(&init_state, &expected, 1)) {
        tls_flags |= TF_FORWARD;
        attach_detect();
        resolve_real_functions();
        atomic_store(&init_state, 2);
        init_tracing();
        forget_dl_error();
        tls_flags &= ~TF_FORWARD;
        return 1;
    }
    if (tls_flags & TF_FORWARD) return atomic_load(&init_state) == 2;
    while (atomic_load(&init_state) != 2) sched_yield();
    return 1;
}

static void on_quick_exit(void);

/* Work that needs a fully loaded program (dlopen of libunwind, atfork handlers). */
__attribute__((constructor)) static void on_load(void) {
    if (!ensure_init() || !tracing) return;
    tls_flags |= TF_FORWARD;
    struct text_range self = {(uintptr_t)&on_load, 0, 0};
    dl_iterate_phdr(find_text, &self);
    self_text_lo = self.lo;
    self_text_hi = self.hi;
    struct text_range allocator = {(uintptr_t)real_malloc, 0, 0};
    dl_iterate_phdr(find_text, &allocator);
    allocator_text_lo = allocator.lo;
    allocator_text_hi = allocator.hi;
    if (stacks_mode) {
        /* Not through our dlopen hook: the program would wait for the recorder to read
         * its memory map, and libunwind is ours, never unloaded; the next snapshot's map
         * shows it. (Its thread-local storage, 16 bytes, is then malloc'ed in each thread
         * that samples a stack, under TF_FORWARD, unrecorded; glibc frees it through the
         * program's free when the thread is joined: a free of a block the trace never
         * saw. Preloading libunwind would make that storage static, but it exports
         * _Unwind_RaiseException and would take over the program's C++ exceptions.) */
        void *lib = real_dlopen ? real_dlopen("libunwind.so.8", RTLD_NOW | RTLD_LOCAL) : NULL;
        if (lib) {
            if (dlinfo(lib, RTLD_DI_TLS_MODID, &unwinder_tls_module) != 0) unwinder_tls_module = 0;
            unwind_backtrace = dlsym(lib, "unw_backtrace");
            int (*set_policy)(void *, int) = dlsym(lib, "_ULx86_64_set_caching_policy");
            int (*set_cache_size)(void *, size_t, int) = dlsym(lib, "_ULx86_64_set_cache_size");
            void **space = dlsym(lib, "_ULx86_64_local_addr_space");
            if (set_policy && space) set_policy(*space, 2 /* UNW_CACHE_PER_THREAD */);
            if (set_cache_size && space) set_cache_size(*space, 1024, 0);
        }
        if (!unwind_backtrace) {
            warn("libunwind.so.8 not found (Debian: libunwind8); stacks use glibc's backtrace");
            unwind_backtrace = dlsym(RTLD_DEFAULT, "backtrace");
        }
    }
    je_mallctl = dlsym(RTLD_DEFAULT, "mallctl");
    tc_get_numeric = dlsym(RTLD_DEFAULT, "MallocExtension_GetNumericProperty");
    mi_process_info_fn = dlsym(RTLD_DEFAULT, "mi_process_info");
    glibc_mallinfo2 = dlsym(RTLD_DEFAULT, "mallinfo2");
    pthread_atfork(atfork_prepare, atfork_parent, atfork_child);
    at_quick_exit(on_quick_exit);
    attach_start();
    lisp_detect();
    forget_dl_error();
    tls_flags &= ~TF_FORWARD;
}

static void send_exit(int status, uint32_t how) {
    /* A vfork child leaving (its exec failed) shares our connection: not our exit. */
    if (!tracing || (pid_t)syscall(SYS_getpid) != my_pid) return;
    tls_flags |= TF_FORWARD;
    /* The allocator's view at exit, for the exit snapshot: a short run may end before
     * any periodic request was answered. */
    struct thread_state *ts = tls_state;
    if (ts && !(tls_flags & TF_BUSY)) {
        tls_flags |= TF_BUSY;
        __atomic_signal_fence(__ATOMIC_SEQ_CST);
        wait_until_not_taken(ts);
        uint64_t tick = current_tick();
        if (tick != ts->tick) tick_changed(ts, tick);
        tls_flags |= TF_FORWARD; /* tick_changed may have cleared it */
        ts->stats_due = 0;
        emit_allocator_stats(ts);
        if (ts->nested_head != ts->nested_tail || ts->nested_lost) drain_nested(ts);
        __atomic_signal_fence(__ATOMIC_SEQ_CST);
        tls_flags &= ~TF_BUSY;
    }
    log_flush(&py_log);
    lisp_flush();
    flush_all();
    int32_t payload[2] = {status, (int32_t)how};
    uint64_t tick = current_tick();
    struct msg_header h = {MSG_EXIT, sizeof payload, 0, 0, tick, tick};
    send_message(&h, payload, 1);
    finished = 1;
    tls_flags &= ~TF_FORWARD;
}

__attribute__((destructor)) static void on_unload(void) {
    if (finished) return;
    send_exit(exit_status_known ? exit_status : 0,
              exit_status_known ? EXIT_VIA_EXIT : EXIT_UNKNOWN_STATUS);
}
