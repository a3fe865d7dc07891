/* The allocator's own statistics, asked at snapshots (mallinfo2 and its peers). Included
 * once, by fragscope_preload.c, where this part of it stood: it uses what comes before
 * it there. */

/* ---- allocator statistics ---- */
static uint8_t *put_stat(uint8_t *o, const char *name, uint64_t value) {
    size_t n = strlen(name);
    *o++ = (uint8_t)n;
    memcpy(o, name, n);
    return put_varint(o + n, value);
}

static void emit_allocator_stats_unmasked(struct thread_state *ts) {
    uint8_t rec[1024], *o = rec + 3; /* kind, source, count */
    unsigned count = 0;
    uint8_t source = 1;
    if (tc_get_numeric) {
        static const char *names[] = {
            "generic.current_allocated_bytes", "generic.heap_size",
            "tcmalloc.pageheap_free_bytes", "tcmalloc.pageheap_unmapped_bytes",
            "tcmalloc.central_cache_free_bytes", "tcmalloc.transfer_cache_free_bytes",
            "tcmalloc.thread_cache_free_bytes", "tcmalloc.current_total_thread_cache_bytes"};
        source = 3;
        for (unsigned i = 0; i < sizeof names / sizeof *names; i++) {
            size_t v = 0;
            if (tc_get_numeric(names[i], &v)) o = put_stat(o, names[i], v), count++;
        }
    } else if (je_mallctl) {
        static const char *names[] = {"stats.allocated", "stats.active", "stats.resident",
                                      "stats.mapped", "stats.retained", "stats.metadata"};
        source = 2;
        uint64_t epoch = 1;
        size_t sz = sizeof epoch;
        je_mallctl("epoch", &epoch, &sz, &epoch, sz);
        for (unsigned i = 0; i < sizeof names / sizeof *names; i++) {
            size_t v = 0, l = sizeof v;
            if (je_mallctl(names[i], &v, &l, NULL, 0) == 0) o = put_stat(o, names[i], v), count++;
        }
    } else if (mi_process_info_fn) {
        size_t elapsed, user, sys, rss, peak_rss, commit, peak_commit, faults;
        source = 4;
        mi_process_info_fn(&elapsed, &user, &sys, &rss, &peak_rss, &commit, &peak_commit, &faults);
        o = put_stat(o, "current_commit", commit), count++;
        o = put_stat(o, "peak_commit", peak_commit), count++;
    } else if (glibc_mallinfo2) {
        struct mallinfo2 mi = glibc_mallinfo2();
        source = 1;
        o = put_stat(o, "arena", mi.arena), count++;
        o = put_stat(o, "uordblks", mi.uordblks), count++;
        o = put_stat(o, "fordblks", mi.fordblks), count++;
        o = put_stat(o, "keepcost", mi.keepcost), count++;
        o = put_stat(o, "hblkhd", mi.hblkhd), count++;
        o = put_stat(o, "ordblks", mi.ordblks), count++;
    }
    if (count == 0) return; /* no allocator answered (not resolved yet): say nothing */
    rec[0] = KIND_STATS;
    rec[1] = source;
    rec[2] = (uint8_t)count;
    size_t n = (size_t)(o - rec);
    if (ts->len + n > BUF_CAP) flush_thread(ts);
    memcpy(ts->buf + ts->len, rec, n);
    ts->len += (uint32_t)n;
}

/* The statistics calls run under TF_FORWARD (the allocator may allocate inside them), where
 * a nested call counts as the allocator's own: signals wait meanwhile, so that a handler's
 * calls are never taken for it and dropped. (jemalloc's epoch refresh takes long enough
 * for a frequent timer to land in it.) */
static void emit_allocator_stats(struct thread_state *ts) {
    sigset_t all, old;
    sigfillset(&all);
    pthread_sigmask(SIG_BLOCK, &all, &old);
    unsigned saved = tls_flags;
    tls_flags |= TF_FORWARD;
    emit_allocator_stats_unmasked(ts);
    tls_flags = saved; /* before a pending signal is let in */
    pthread_sigmask(SIG_SETMASK, &old, NULL);
}

/* Answers a claimed statistics request, keeping errno as the program left it. */
static __attribute__((noinline)) void emit_due_stats(struct thread_state *ts) {
    int saved_errno = errno;
    ts->stats_due = 0;
    emit_allocator_stats(ts);
    errno = saved_errno;
}

/* The slow path of every event: the shared tick moved since this thread's last record. */
/* Reads a word of this process's memory that may have been unmapped meanwhile: 1 when
 * read, 0 (instead of a fault) when the address is gone. */
static int read_own_word(const unsigned *p, unsigned *out) {
    struct iovec local = {out, sizeof *out}, remote = {(void *)p, sizeof *p};
    return syscall(SYS_process_vm_readv, my_pid, &local, 1UL, &remote, 1UL, 0UL) ==
           (long)sizeof *out;
}

/* Sends the buffers of threads that have made no call for IDLE_TICKS: a thread that
 * handed blocks to others and then waits (in accept, epoll_wait, a condition variable)
 * would otherwise keep their allocations while the others' frees of them reach the
 * recorder, which could then only force the frees. Runs in one active thread at a time.
 * A holder marks its calls in its tls_flags, without a fence; the membarrier makes the
 * pair a Dekker handshake: either the holder sees `taken` before it touches its buffer
 * (and waits), or this thread sees the holder's flag (and leaves that buffer alone). */
static __attribute__((noinline)) void send_idle_buffers(struct thread_state *self, uint64_t now) {
    uint64_t due = __atomic_load_n(&next_idle_scan, __ATOMIC_RELAXED);
    if (now < due || !__atomic_compare_exchange_n(&next_idle_scan, &due, now + IDLE_TICKS, 0,
                                                  __ATOMIC_RELAXED, __ATOMIC_RELAXED))
        return;
    /* Under the lock a thread cannot retire, so its tls_flags stay readable. */
    if (pthread_mutex_trylock(&registry_lock) != 0) return;
    int asked = 0;
    for (struct thread_state *r = registry; r; r = r->next_in_registry) {
        /* A thread gone since it retired (as thread_state_new tells it when it takes
         * the state over, and pthread_join when it joins it). */
        if (r->retired) {
            if (!r->gone_told && syscall(SYS_tgkill, my_pid, r->tid, 0) != 0 && errno == ESRCH)
                tell_gone(r);
            continue;
        }
        if (r != self && !r->retired && r->flags_of_holder && (r->len > 0 || !r->idle) &&
            now - r->tick >= IDLE_TICKS) {
            __atomic_store_n(&r->taken, 1, __ATOMIC_SEQ_CST);
            asked = 1;
        }
    }
    if (asked) {
        int fenced = syscall(SYS_membarrier, MEMBARRIER_CMD_PRIVATE_EXPEDITED, 0) == 0;
        for (struct thread_state *r = registry; r; r = r->next_in_registry) {
            if (!__atomic_load_n(&r->taken, __ATOMIC_RELAXED)) continue;
            /* Only BUSY and FORWARD mark a holder at its buffer (REAL: inside the real
             * allocator, to record after with a later reading; TLS_RELEASE: in a join);
             * RELEASING, a holder that will place a release at a value it took already. */
            /* Read without trusting the address: a thread that ended without retiring
             * (its key destructor not run yet) may have had its TLS unmapped already, as
             * a runtime that gives threads stacks of its own does (SBCL). */
            unsigned holder = 0;
            int readable = read_own_word(r->flags_of_holder, &holder);
            if (fenced && readable && !(holder & (TF_BUSY | TF_FORWARD | TF_RELEASING))) {
                /* With nothing buffered, the merge is told not to wait for the thread
                 * until its next call, which it then sends at once. */
                if (r->len > 0) {
                    send_thread_buffer(r, 0);
                } else {
                    send_thread_buffer(r, SEQ_IDLE);
                    r->idle = 1;
                }
            }
            release_taken(r);
        }
    }
    pthread_mutex_unlock(&registry_lock);
}

static __attribute__((noinline)) void tick_changed(struct thread_state *ts, uint64_t tick) {
    int saved_errno = errno;
    if (tick - ts->last_flush_tick >= flush_interval_ticks) flush_thread(ts);
    if (clock_page->flush_request != ts->seen_flush_request) {
        ts->seen_flush_request = clock_page->flush_request;
        flush_thread(ts);
    }
    if (can_send_idle) send_idle_buffers(ts, tick);
    if (UNLIKELY(py_state == 1) && !(tls_flags & TF_REAL)) py_try_wrap();
    put_tagged(ts, KIND_TICK, tick - ts->tick);
    ts->tick = tick;
    ts->order_next = 0; /* the recorder started the counter again with the tick */
    /* Not from a signal handler that interrupted the allocator (TF_REAL): its statistics
     * calls are not reentrant there. The next call answers instead. */
    uint64_t want = clock_page->stats_request, had = atomic_load(&stats_answered);
    if (want != had && !(tls_flags & TF_REAL) &&
        atomic_compare_exchange_strong(&stats_answered, &had, want)) {
        ts->stats_due = 1;
    }
    errno = saved_errno;
}
