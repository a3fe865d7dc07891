/* Each thread's buffer of event records, and sending it to the recorder when full.
 * Included once, by fragscope_preload.c, where this part of it stood: it uses what comes
 * before it there. */

/* ---- thread buffers ---- */
/* A buffer's seq with this bit set is the thread's last: it is gone (see tell_gone). */
#define SEQ_THREAD_EXITED 0x80000000u
/* A copy of another thread's buffer (see send_thread_copy). */
#define SEQ_COPY 0x40000000u
/* An empty buffer sent for an idle thread (see send_idle_buffers). */
#define SEQ_IDLE 0x20000000u
/* The buffer holds a usable-size record: a recorder that stores it raw must still learn
 * it, since the thread does not say it again and later buffers may be packed. */
#define SEQ_HAS_USABLE 0x10000000u

/* An empty buffer: what its records count from starts again (the reader decodes each
 * buffer on its own). */
static void start_buffer(struct thread_state *ts) {
    ts->len = 0;
    ts->has_usable = 0;
    ts->prev_addr = 0;
    ts->order_next = 0;
    ts->order_written = 0;
}

/* Under sock_lock from the seq to the reset, so that a copy (send_thread_copy) sees a
 * buffer either before it was sent or after, never sent but not yet emptied. */
static void send_thread_buffer(struct thread_state *ts, uint32_t seq_flags) {
    pthread_mutex_lock(&sock_lock);
    if (ts->has_usable) seq_flags |= SEQ_HAS_USABLE;
    struct msg_header h = {MSG_EVENTS, ts->len, ts->tid, ts->seq++ | seq_flags, ts->chunk_first_tick, ts->tick};
    send_message_locked(&h, ts->buf, 0);
    start_buffer(ts);
    ts->chunk_first_tick = ts->tick;
    ts->last_flush_tick = ts->tick;
    pthread_mutex_unlock(&sock_lock);
}

static void flush_thread(struct thread_state *ts) {
    if (ts->len > 0) send_thread_buffer(ts, 0);
}

/* Sends a retired thread's last buffer, flagged: the thread is gone, so the merge stops
 * waiting for it. It holds the calls the thread made since its last full buffer, and
 * what glibc freed after its last key destructor. Not at its exit (thread_exited): such
 * a call, recorded and then preempted before it is sent, would reach the merge after
 * later calls of other threads had gone. Under registry_lock, so that no new thread
 * claims the state meanwhile. */
static void tell_gone(struct thread_state *ts) {
    if (ts->gone_told) return;
    send_thread_buffer(ts, SEQ_THREAD_EXITED);
    ts->gone_told = 1;
}

/* The holder of `ts`, with a flag of tls_flags set, waits while another thread sends its
 * buffer (only ever after the holder made no call for IDLE_TICKS). Asleep on a futex, not
 * yielding in a loop: with many more threads than cores the sender is often preempted,
 * and 128 threads on 2 cores made 108 000 sched_yield calls a second waiting for it. */
static inline void wait_until_not_taken(struct thread_state *ts) {
    for (;;) {
        uint32_t seen = __atomic_load_n(&ts->attention, __ATOMIC_ACQUIRE);
        if (LIKELY(!__atomic_load_n(&ts->taken, __ATOMIC_ACQUIRE))) return;
        /* Woken by release_taken, or at once if the word changed since `seen`. */
        int saved_errno = errno;
        syscall(SYS_futex, &ts->attention, FUTEX_WAIT_PRIVATE, seen, NULL, NULL, 0);
        errno = saved_errno;
    }
}

/* Gives a taken buffer back to its holder and wakes it if it waits for it. */
static void release_taken(struct thread_state *ts) {
    __atomic_store_n(&ts->taken, 0, __ATOMIC_RELEASE);
    syscall(SYS_futex, &ts->attention, FUTEX_WAKE_PRIVATE, 1, NULL, NULL, 0);
}

/* Sends what another thread, which may be running, has buffered, leaving its state alone:
 * resetting it under its feet would let it send those records again. The recorder keeps
 * the copy until the thread sends the same buffer (seq) itself, or the process exits. */
static void send_thread_copy(struct thread_state *ts) {
    pthread_mutex_lock(&sock_lock);
    uint32_t len = __atomic_load_n(&ts->len, __ATOMIC_ACQUIRE);
    if (len > 0) {
        /* The holder may be writing: whether the copy holds a usable record is not known. */
        struct msg_header h = {MSG_EVENTS, len, ts->tid, ts->seq | SEQ_COPY | SEQ_HAS_USABLE,
                               ts->chunk_first_tick, ts->tick};
        send_message_locked(&h, ts->buf, 0);
    }
    pthread_mutex_unlock(&sock_lock);
}

static uint64_t next_sample_interval(struct thread_state *ts) {
    if (stacks_mode == 2) return 0;
    if (stacks_mode == 0) return INT64_MAX;
    return poisson_interval(&ts->rng, sample_mean_bytes);
}

/* Appends a record of a tag and one varint (a tick, an order, lost calls, a join, own
 * memory); the caller has made room. */
static inline void put_tagged(struct thread_state *ts, uint8_t tag, uint64_t value) {
    uint8_t *o = ts->buf + ts->len;
    *o++ = tag;
    o = put_varint(o, value);
    ts->len = (uint32_t)(o - ts->buf);
}

static void emit_own_memory(struct thread_state *ts) {
    put_tagged(ts, KIND_OWN_MEMORY, atomic_load(&own_bytes));
}

static void thread_exited(void *arg);

/* Threads whose state a later thread took over: a thread that has exited may still be
 * joined, and pthread_join must find its tid by its pthread_t (see tid_of_thread). Under
 * registry_lock. */
#define DEPARTED_CAP 1024
struct thread_identity {
    pthread_t thread;
    uint32_t tid;
    uint64_t birth; /* the holder's thread_state.birth */
};
static struct thread_identity departed[DEPARTED_CAP];
static unsigned departed_next;

static void order_calls(void);

static struct thread_state *thread_state_new(void) {
    struct thread_state *ts = NULL;
    pid_t tid = (pid_t)syscall(SYS_gettid);
    pthread_mutex_lock(&registry_lock);
    /* Reuse the state of a thread that is gone (tgkill says so), after sending what its
     * last destructors recorded. */
    for (struct thread_state *r = registry; r; r = r->next_in_registry) {
        if (r->retired && syscall(SYS_tgkill, my_pid, r->tid, 0) != 0 && errno == ESRCH) {
            tell_gone(r);
            r->gone_told = 0;
            r->retired = 0; /* claimed under the lock: no other new thread can take it */
            r->idle = 0;
            r->flags_of_holder = &tls_flags;
            departed[departed_next++ % DEPARTED_CAP] =
                (struct thread_identity){r->thread, r->tid, r->birth};
            ts = r;
            break;
        }
    }
    pthread_mutex_unlock(&registry_lock);
    if (!ts) {
        ts = own_mmap(sizeof *ts);
        if (!ts) return NULL;
        ts->flags_of_holder = &tls_flags;
        pthread_mutex_lock(&registry_lock);
        ts->next_in_registry = registry;
        registry = ts;
        pthread_mutex_unlock(&registry_lock);
    }
    /* Another thread holds a state too: calls must now be ordered across threads (if
     * pthread_create, which does this first, was not how this thread began). */
    if (registry != ts || ts->next_in_registry) order_calls();
    stack_table_forget(ts);
    memset(ts->usable_known, 0, sizeof ts->usable_known);
    ts->tid = (uint32_t)tid;
    ts->thread = pthread_self();
    ts->birth = atomic_fetch_add(&state_births, 1);
    ts->seq = 0;
    ts->next_stack_id = 1;
    start_buffer(ts);
    ts->unwinder_tls_noted = 0;
    ts->tick = ts->chunk_first_tick = ts->last_flush_tick = current_tick();
    ts->seen_flush_request = clock_page->flush_request;
    ts->rng = 0x9E3779B97F4A7C15ULL ^ ((uint64_t)tid << 17) ^ (uintptr_t)ts;
    ts->sample_countdown = (int64_t)next_sample_interval(ts);
    ts->nested_head = ts->nested_tail = 0;
    tls_state = ts;
    pthread_setspecific(thread_exit_key, ts);
    emit_own_memory(ts);
    /* Sent at once: it tells the reader's merge this thread exists, so no other thread's
     * calls are merged past this tick before this thread's calls are in. */
    flush_thread(ts);
    return ts;
}

static void thread_exited(void *arg) {
    struct thread_state *ts = arg;
    if (!ts) return;
    unsigned saved = tls_flags;
    tls_flags |= TF_FORWARD;
    __atomic_signal_fence(__ATOMIC_SEQ_CST);
    wait_until_not_taken(ts);
    /* Its buffer is not sent here but once the thread is gone (tell_gone), with what glibc
     * frees after this: the merge waits for that last buffer anyway, and a thread per
     * request sent five buffers in its short life, most of them a call or two. */
    /* Under the lock: send_idle_buffers reads the flags of a thread it sees unretired. */
    pthread_mutex_lock(&registry_lock);
    ts->retired = 1;
    pthread_mutex_unlock(&registry_lock);
    /* What glibc frees from here on may be the unwinder's storage (a detached thread). */
    tls_flags = saved | TF_TLS_RELEASE;
}

/* Flushes every thread's buffer: at exit, exec and _exit. Threads still running may add
 * to their own buffers meanwhile; what they add after this is lost, as at any exit. */
static void flush_all(void) {
    pthread_mutex_lock(&registry_lock);
    for (struct thread_state *r = registry; r; r = r->next_in_registry) {
        if (r->retired) tell_gone(r);
        else if (r == tls_state) flush_thread(r);
        else send_thread_copy(r);
    }
    pthread_mutex_unlock(&registry_lock);
}
