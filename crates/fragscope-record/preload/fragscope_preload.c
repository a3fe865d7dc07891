/* fragscope's interposer: preloaded into the traced program (LD_PRELOAD).
 *
 * It forwards every malloc-family call to the next allocator unchanged (no headers, no
 * extra bytes, no changed alignment) and records each call as a compact event in a
 * per-thread buffer. Full buffers go to the `fragscope record` process over a Unix
 * socket; compression, /proc sampling and the trace file are that process's work, off
 * the program's hot path.
 *
 * Why C and not Rust: the hot path reaches its thread buffer through initial-exec TLS
 * (a plain %fs-relative load). A Rust cdylib gets general-dynamic TLS (a call to
 * __tls_get_addr per access), which costs more than the event itself.
 *
 * Time: the recorder bumps the tick (milliseconds since the recording began) in a shared
 * page. Reading it is one load; an event carries no timestamp, a TICK record is written
 * only when a thread sees the tick change. Events of one thread are in program order.
 * Across threads, once a process has a second thread, the word that holds the tick also
 * counts frees: a free takes a value of it (an atomic add) before the real free, an
 * allocation reads it after the real allocation returns, and an ORDER record says so
 * when the value is not the one the thread expects. The reader orders calls by (tick,
 * value): the allocation of a block always comes after the free that gave it back.
 *
 * Record layout: docs/trace-format.md ("Event records"); the decoder is
 * crates/fragscope-trace/src/event.rs. Socket messages: the same document,
 * "Recorder protocol". */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <link.h>
#include <math.h>
#include <pthread.h>
#include <signal.h>
#include <spawn.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <sys/uio.h>
#include <sys/un.h>
#include <poll.h>
#include <unistd.h>
#include <malloc.h>
#include <linux/futex.h>
#include <linux/membarrier.h>

#include "hooks.h"

#define EXPORT __attribute__((visibility("default")))
#define LIKELY(x) __builtin_expect(!!(x), 1)
#define UNLIKELY(x) __builtin_expect(!!(x), 0)

/* ---- event kinds and flags (docs/trace-format.md, "Event records") ---- */
enum {
    KIND_TICK = 10,
    KIND_STACK = 11,
    KIND_USABLE = 12,
    KIND_STATS = 13,
    KIND_LOST = 14,
    KIND_OWN_MEMORY = 15,
    /* KIND_LOST with this flag: `tid:varint`, a thread this one joined. */
    FLAG_JOINED = 0x10,
    /* KIND_LOST with this flag: `mark:varint`, this thread forked here (see mark_fork). */
    FLAG_FORKED = 0x20,
    /* KIND_TICK with this flag: ORDER, `delta:varint`: the order counter this call read
     * is `delta` above what the thread expected (see note_order). */
    FLAG_ORDER = 0x20,
};
enum {
    FLAG_STACK = 0x10,     /* a stack id follows */
    FLAG_UNALIGNED = 0x20, /* address deltas in bytes, not 16-byte units */
    FLAG_NULL = 0x40,      /* the call returned NULL / was given NULL: no address */
    FLAG_USABLE = 0x80,    /* usable size minus requested size follows */
};
enum { KIND_REALLOC = 2, KIND_REALLOCARRAY = 3, KIND_FREE = 9 };
/* realloc's second byte */
enum { REALLOC_OLD_NULL = 1, REALLOC_OLD_UNALIGNED = 2 };

/* ---- socket messages (docs/trace-format.md, "Recorder protocol") ---- */
enum {
    MSG_HELLO = 1,
    MSG_EVENTS = 2,
    MSG_MAPS_CHANGED = 3, /* acknowledged: the recorder reads /proc/PID/maps meanwhile */
    MSG_EXIT = 4,         /* acknowledged: the recorder takes a last snapshot meanwhile */
    MSG_EXEC = 5,
    MSG_EXEC_FAILED = 6, /* the exec announced by MSG_EXEC returned */
    MSG_PYTHON = 7,      /* CPython's sampled objects (cpython.h) */
    MSG_LISP = 8,        /* SBCL's sampled allocation regions (sbcl.h) */
};
/* HELLO_WANTS_CLOCK: the process could not open the clock page for writing (it runs as
 * another user than the recorder); the recorder answers with its descriptor.
 * HELLO_MARKS_IDLE: threads idle for IDLE_TICKS get an idle buffer sent for them
 * (membarrier registered), so a thread the merge has heard nothing from is not idle but
 * still inside a call: preempted, waiting for the socket. */
/* HELLO_ATTACHED: loaded into a running process (attach.h). */
enum { HELLO_RESUMED = 1, HELLO_FORKED = 2, HELLO_WANTS_CLOCK = 4, HELLO_MARKS_IDLE = 8,
       HELLO_ATTACHED = 16 };
/* EXIT_VIA_DETACH: not an exit; `record -p` ends and leaves the process running. */
enum { EXIT_VIA_EXIT = 0, EXIT_VIA__EXIT = 1, EXIT_UNKNOWN_STATUS = 2, EXIT_VIA_DETACH = 3 };

struct msg_header {
    uint32_t type;
    uint32_t len; /* payload bytes after this header */
    uint32_t tid;
    uint32_t seq;
    uint64_t first_tick;
    uint64_t last_tick;
};

/* The page the recorder shares with every traced process. */
struct shared_clock {
    /* The tick (ms since the recording began) above TICK_SHIFT; below it the order
     * counter, which the recorder resets with each tick and every free adds one to (once
     * its process has a second thread). One word, so one read gives both in one order. */
    volatile uint64_t now;
    volatile uint64_t stats_request; /* bumped when the recorder wants allocator stats */
    volatile uint64_t flush_request; /* bumped when the recorder wants buffers flushed */
};

/* ---- sizes ---- */
#define BUF_CAP (128 * 1024)
#define MAX_RECORD 64          /* an event record is never longer */
#define MAX_FRAMES 64
/* Per-thread stack dedup table: powers of two, kept at most half full by doubling, so a
 * program with tens of thousands of distinct stacks defines each once (a fixed table
 * that forgot everything when crowded redefined nearly every stack: 15 M definitions for
 * 16 Ki distinct stacks, a trace three times as large and its analysis 20x as slow). */
#define STACK_TABLE_FIRST_SLOTS 4096
#define STACK_TABLE_MAX_SLOTS (1u << 20)
#define USABLE_TABLE 32768     /* requested sizes whose usable size is cached */
#define NESTED_CAP 256         /* events recorded from a signal handler mid-record */
#define TICK_SHIFT 32
#define ORDER_MASK ((1ULL << TICK_SHIFT) - 1)
#define BOOTSTRAP_BYTES (64 * 1024)
#define FD_FLOOR 500           /* the trace socket lives at or above this fd */

/* ---- the real functions ---- */
#define DECLARE_REAL_ALLOC(name, kind, ret, params, args) static ret(*real_##name) params;
FRAGSCOPE_ALLOC_HOOKS(DECLARE_REAL_ALLOC)
#define DECLARE_REAL_SYSTEM(name, ret, params) static ret(*real_##name) params;
FRAGSCOPE_SYSTEM_HOOKS(DECLARE_REAL_SYSTEM)
static size_t (*real_malloc_usable_size)(void *);
/* Per event kind: the real function lives in the same object as malloc_usable_size, so
 * it may be asked about the function's blocks. Not so for jemalloc, which has no pvalloc:
 * glibc's answers from glibc's heap, and jemalloc's malloc_usable_size crashes on it. */
static uint8_t usable_size_applies[16];

/* allocator statistics, when the allocator offers them */
static int (*je_mallctl)(const char *, void *, size_t *, void *, size_t);
static int (*tc_get_numeric)(const char *, size_t *);
static void (*mi_process_info_fn)(size_t *, size_t *, size_t *, size_t *, size_t *, size_t *,
                                  size_t *, size_t *);
static struct mallinfo2 (*glibc_mallinfo2)(void);

/* stack unwinding: libunwind, opened RTLD_LOCAL so its _Unwind_* and backtrace symbols
 * never replace the program's own (libunwind.so exports both). */
static int (*unwind_backtrace)(void **, int);
static void *unwinder_lib;

/* libunwind is opened at run time, so the dynamic loader malloc's its thread-local
 * storage in every thread on first use: inside our unwinding, under TF_FORWARD, never
 * recorded. glibc frees it through the program's free when the thread is joined, when a
 * new thread reuses its cached stack, or as a detached thread exits; those frees must not
 * be recorded either, or the trace would hold frees of blocks it never saw. The blocks
 * are kept here (lock-free: a free from a signal handler may look), 0 for a free entry.
 * (Preloading libunwind would make the storage static, but it exports
 * _Unwind_RaiseException and would take over the program's C++ exceptions.) */
#define UNWINDER_TLS_CAP 1024
static _Atomic uintptr_t unwinder_tls[UNWINDER_TLS_CAP];

static void note_unwinder_tls(void) {
    void *block = NULL;
    if (!unwinder_lib || dlinfo(unwinder_lib, RTLD_DI_TLS_DATA, &block) != 0 || !block) return;
    for (unsigned i = 0; i < UNWINDER_TLS_CAP; i++) {
        uintptr_t empty = 0;
        if (atomic_compare_exchange_strong(&unwinder_tls[i], &empty, (uintptr_t)block)) return;
    }
}

/* Whether `addr` is the unwinder's storage of some thread (then forgotten). */
static int take_unwinder_tls(uintptr_t addr) {
    for (unsigned i = 0; i < UNWINDER_TLS_CAP; i++) {
        uintptr_t want = addr;
        if (atomic_load_explicit(&unwinder_tls[i], memory_order_relaxed) == addr &&
            atomic_compare_exchange_strong(&unwinder_tls[i], &want, 0))
            return 1;
    }
    return 0;
}

/* ---- per-thread state ---- */
struct nested_event {
    uint8_t kind;
    uintptr_t addr, old_addr;
    size_t size, align;
};

/* Stacks this thread has defined, by the 64-bit hash of their frames (0: empty slot). */
struct stack_slot {
    uint64_t hash;
    uint32_t id;
    uint32_t unused;
};
struct stack_table {
    uint32_t slots, used;
    struct stack_slot slot[];
};

struct thread_state {
    uint32_t len; /* committed bytes in buf */
    uint32_t tid;
    uint32_t seq;
    uint32_t has_usable; /* buf holds a usable record: SEQ_HAS_USABLE */
    uint32_t next_stack_id;
    uint64_t tick;             /* the tick of the last TICK record */
    uint64_t chunk_first_tick; /* tick at the start of buf */
    uint64_t last_flush_tick;
    uint64_t seen_flush_request;
    uintptr_t prev_addr; /* address deltas are relative to this; 0 at a chunk start */
    int64_t sample_countdown;
    uint64_t rng;
    uint32_t retired; /* the thread exited; the state may be reused once it is gone */
    uint32_t gone_told; /* retired, gone, and the recorder told so (see tell_gone) */
    pthread_t thread; /* pthread_self() of the thread that holds the state */
    /* The order counter value this thread expects to read next (its last reading, plus
     * one after a free), counted from 0 at each buffer and tick as the reader does; and
     * whether this buffer has an ORDER record yet (its first ordered call writes one,
     * which tells the reader the calls from there on are ordered). */
    uint64_t order_next;
    uint8_t order_written;
    uint8_t unwinder_tls_noted; /* this thread's unwinder storage is in unwinder_tls */
    unsigned *flags_of_holder; /* the holder's tls_flags */
    uint64_t birth;   /* when the state was claimed: a later holder has a larger one */
    /* Calls a signal handler made while this thread was writing a record, in a ring:
     * handlers add at the tail, only the writer (with TF_BUSY held) takes from the head. */
    uint32_t nested_head, nested_tail;
    uint64_t nested_lost;
    /* This thread claimed a statistics request: it answers at its current call (see
     * write_event for where). */
    /* `taken`: another thread is sending this one's buffer (see send_idle_buffers), and
     * the holder waits for it to be cleared before it touches its buffer. `exited`: the
     * thread sent its last buffer; what glibc frees after that is sent call by call.
     * `idle`: another thread told the recorder this one was idle, so its next call is
     * sent at once. One word with `stats_due`, so that the fast path tests all four with
     * one load. */
    union {
        struct {
            uint8_t stats_due;
            uint8_t taken;
            uint8_t exited;
            uint8_t idle;
        };
        uint32_t attention;
    };
    struct nested_event nested[NESTED_CAP];
    struct thread_state *next_in_registry;
    struct stack_table *stacks;
    uint64_t usable_known[USABLE_TABLE / 64];
    uint8_t buf[BUF_CAP];
};

/* Initial-exec TLS: one %fs-relative load on the hot path. */
static __thread struct thread_state *tls_state __attribute__((tls_model("initial-exec")));
/* BUSY: this thread is writing a record (a nested call is a signal handler's: queue it).
 * FORWARD: this thread is inside our own machinery (a nested call is ours, not the
 * program's: forward it unrecorded).
 * REAL: this thread is inside the real allocator for one of the program's calls. A nested
 * call is the allocator calling itself (forwarded unrecorded) or a signal handler that
 * interrupted it (the program's own call: recorded); `forward_nested` tells them apart. */
static __thread unsigned tls_flags __attribute__((tls_model("initial-exec")));
enum { TF_BUSY = 1, TF_FORWARD = 2, TF_REAL = 4, TF_TLS_RELEASE = 8 };
/* TLS_RELEASE: glibc may free thread-local storage here (pthread_join, pthread_create
 * reusing a cached stack, a thread's own exit): a free of the unwinder's storage is ours
 * (see take_unwinder_tls). Any flag set sends calls to the general path. */
/* Allocation-family calls this thread has recorded: an operator new records its block
 * only if the real one recorded nothing through our malloc-family hooks (libstdc++'s
 * calls malloc; jemalloc's aligned new calls aligned_alloc, its plain new nothing). */
static __thread uint64_t tls_recorded_calls __attribute__((tls_model("initial-exec")));
/* The mark this thread recorded at its last fork (0: none), which the child names. */
static __thread uint32_t tls_fork_mark __attribute__((tls_model("initial-exec")));

/* ---- process state ---- */
static atomic_int init_state; /* 0 none, 1 resolving, 2 resolved */
static int tracing;            /* recording to a recorder */
static int finished;           /* the process is exiting: flush after every event */
static int attached;           /* loaded into a running process (attach.h), not preloaded */
/* Without a shared clock (none given) time stands still at tick 0. */
static struct shared_clock no_clock;
static struct shared_clock *clock_page = &no_clock;
static int sock_fd = -1;
static pthread_mutex_t sock_lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_mutex_t registry_lock = PTHREAD_MUTEX_INITIALIZER;
static struct thread_state *registry;
static pthread_key_t thread_exit_key;
static int stacks_mode; /* 0 none, 1 sampled, 2 all */
static double sample_mean_bytes = 512 * 1024;
static uint64_t flush_interval_ticks = 200;
static atomic_uint_fast64_t stats_answered;
static atomic_uint_fast64_t own_bytes;
static atomic_uint_fast64_t lost_events;
static atomic_uint_fast64_t state_births;
static atomic_uint fork_marks; /* marks recorded at forks so far (see mark_fork) */
/* The process may have a second thread: frees take order counter values and calls
 * record what they read (one thread alone needs no order, its program order is the
 * order). Never switched off: a buffer's records must mean the same to the reader. */
static int ordering_on;
/* Idle threads' buffers can be sent by other threads (membarrier registered). */
static int can_send_idle;
static uint64_t next_idle_scan; /* the tick at which a thread next looks for idle ones */
#define IDLE_TICKS 10
/* The clock page could be mapped writable (the order counter needs atomic adds). */
static int clock_writable;
static atomic_uint usable_for_size[USABLE_TABLE];
static int exit_status = -1;
static int exit_status_known;
static pid_t my_pid;
static uintptr_t self_text_lo, self_text_hi;
static uintptr_t allocator_text_lo, allocator_text_hi; /* the code of the real malloc */
static char sock_path[108];

/* "NAME=value" strings of our environment, re-added to an exec'd program's environment. */
#define ENV_VARS(X) X(LD_PRELOAD) X(FRAGSCOPE_SOCK) X(FRAGSCOPE_CLOCK) X(FRAGSCOPE_STACKS) \
    X(FRAGSCOPE_SAMPLE_BYTES) X(FRAGSCOPE_FLUSH_MS) X(FRAGSCOPE_TOKEN)
#define ENV_SLOT(n) static char env_##n[512];
ENV_VARS(ENV_SLOT)

/* ---- bootstrap arena: dlsym may allocate before the real allocator is known ---- */
static char bootstrap[BOOTSTRAP_BYTES] __attribute__((aligned(64)));
static size_t bootstrap_used;
static void *bootstrap_alloc(size_t size) {
    size_t off = (bootstrap_used + 15) & ~(size_t)15;
    if (off + size > sizeof bootstrap) return NULL;
    bootstrap_used = off + size;
    return bootstrap + off;
}
static int in_bootstrap(const void *p) {
    return (const char *)p >= bootstrap && (const char *)p < bootstrap + sizeof bootstrap;
}

/* ---- small helpers ---- */
static inline uint64_t current_tick(void) { return clock_page->now >> TICK_SHIFT; }

/* One frame into a stack's 64-bit hash (seeded with the depth): stacks are told apart by
 * it alone. */
static inline uint64_t stack_hash_step(uint64_t h, uint64_t frame) {
    h ^= frame;
    h *= 0x100000001B3ULL;
    return h ^ (h >> 29);
}

static inline uint8_t *put_varint(uint8_t *o, uint64_t v) {
    while (v >= 0x80) {
        *o++ = (uint8_t)(v | 0x80);
        v >>= 7;
    }
    *o++ = (uint8_t)v;
    return o;
}

/* A varint below 2^21 (up to 3 bytes: sizes, and address deltas within 32 MiB) written
 * without branching on its length: lengths vary from call to call, and a mispredicted
 * loop exit cost more than the rest of the record (churn.c recorded 2.01x -> 1.91x of
 * bare, min of 15 interleaved rounds). Stores 4 bytes whatever the length: records are
 * written with MAX_RECORD + 32 bytes of room. Longer values, and big-endian machines,
 * take the loop. (A 4-byte version, six instructions more per value, was as slow as the
 * loop.) */
static inline uint8_t *put_varint_short(uint8_t *o, uint64_t v) {
#if __BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__
    if (LIKELY(v < (1u << 21))) {
        uint32_t two = v >= 0x80, three = v >= 0x4000;
        uint32_t x = (uint32_t)(v & 0x7f) | (uint32_t)((v << 1) & 0x7f00) |
                     (uint32_t)((v << 2) & 0x7f0000) | two << 7 | three << 15;
        memcpy(o, &x, 4);
        return o + 1 + two + three;
    }
#endif
    return put_varint(o, v);
}

static inline uint64_t zigzag(int64_t v) { return ((uint64_t)v << 1) ^ (uint64_t)(v >> 63); }

static void write_all(int fd, const void *data, size_t len) {
    const char *p = data;
    while (len > 0) {
        ssize_t n = syscall(SYS_write, fd, p, len);
        if (n < 0 && errno == EINTR) continue;
        if (n <= 0) return;
        p += n;
        len -= (size_t)n;
    }
}
static void warn(const char *msg) {
    write_all(2, "fragscope: ", 11);
    write_all(2, msg, strlen(msg));
    write_all(2, "\n", 1);
}

static void *own_mmap(size_t bytes) {
    void *p = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED) return NULL;
    /* Named so /proc/PID/smaps shows fragscope's own memory apart from the program's
     * (Linux 5.17+; older kernels refuse and the recorder falls back on the byte count). */
    prctl(PR_SET_VMA, PR_SET_VMA_ANON_NAME, (unsigned long)p, bytes, (unsigned long)"fragscope");
    atomic_fetch_add(&own_bytes, bytes);
    return p;
}

static void own_munmap(void *p, size_t bytes) {
    munmap(p, bytes);
    atomic_fetch_sub(&own_bytes, bytes);
}

static size_t stack_table_bytes(uint32_t slots) {
    return sizeof(struct stack_table) + (size_t)slots * sizeof(struct stack_slot);
}

static struct stack_table *stack_table_new(uint32_t slots) {
    struct stack_table *t = own_mmap(stack_table_bytes(slots));
    if (t) t->slots = slots; /* mapped zeroed: every slot empty */
    return t;
}

static void stack_table_free(struct stack_table *t) {
    if (t) own_munmap(t, stack_table_bytes(t->slots));
}

static void stack_table_clear(struct stack_table *t) {
    memset(t->slot, 0, (size_t)t->slots * sizeof t->slot[0]);
    t->used = 0;
}

/* A thread's state is reused by another thread, or kept by a forked child: its stack ids
 * start again. A grown table goes back to the system. */
static void stack_table_forget(struct thread_state *ts) {
    struct stack_table *t = ts->stacks;
    if (t && t->slots > STACK_TABLE_FIRST_SLOTS) {
        stack_table_free(t);
        ts->stacks = NULL;
    } else if (t) {
        stack_table_clear(t);
    }
}

/* The slot of `hash` in `t`: where it is, or the empty slot where it would go. */
static struct stack_slot *stack_slot_of(struct stack_table *t, uint64_t hash) {
    uint32_t mask = t->slots - 1;
    for (uint32_t s = (uint32_t)hash & mask;; s = (s + 1) & mask)
        if (t->slot[s].hash == hash || t->slot[s].hash == 0) return &t->slot[s];
}

/* Makes room for one more stack in a table that would be over half full: doubles it, or,
 * at the largest size (or with no memory for a larger one), forgets every stack; ids keep
 * counting up, so the reader's old ids stay valid. */
static struct stack_table *stack_table_grow(struct thread_state *ts) {
    struct stack_table *t = ts->stacks;
    struct stack_table *g =
        t->slots < STACK_TABLE_MAX_SLOTS ? stack_table_new(t->slots * 2) : NULL;
    if (!g) {
        stack_table_clear(t);
        return t;
    }
    for (uint32_t s = 0; s < t->slots; s++)
        if (t->slot[s].hash) *stack_slot_of(g, t->slot[s].hash) = t->slot[s];
    g->used = t->used;
    stack_table_free(t);
    return ts->stacks = g;
}

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

#include "samples.h"
#include "cpython.h"

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
 * waiting for it. Not at its exit (thread_exited): glibc still frees after the last key
 * destructor, and such a call, recorded and then preempted before it is sent, would
 * reach the merge after later calls of other threads had gone. Under registry_lock, so
 * that no new thread claims the state meanwhile. */
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
            r->exited = 0;
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
    flush_thread(ts);
    ts->exited = 1;
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
             * allocator, to record after with a later reading; TLS_RELEASE: in a join). */
            /* Read without trusting the address: a thread that ended without retiring
             * (its key destructor not run yet) may have had its TLS unmapped already, as
             * a runtime that gives threads stacks of its own does (SBCL). */
            unsigned holder = 0;
            int readable = read_own_word(r->flags_of_holder, &holder);
            if (fenced && readable && !(holder & (TF_BUSY | TF_FORWARD))) {
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

/* ---- stacks ---- */
static __attribute__((noinline)) uint32_t capture_stack(struct thread_state *ts) {
    void *frames[MAX_FRAMES + 8];
    if (!unwind_backtrace) return 0;
    int saved_errno = errno;
    tls_flags |= TF_FORWARD;
    int n = unwind_backtrace(frames, MAX_FRAMES + 8);
    if (!ts->unwinder_tls_noted) {
        ts->unwinder_tls_noted = 1;
        note_unwinder_tls();
    }
    tls_flags &= ~TF_FORWARD;
    errno = saved_errno;
    int first = 0;
    while (first < n && (uintptr_t)frames[first] >= self_text_lo &&
           (uintptr_t)frames[first] < self_text_hi)
        first++;
    int depth = n - first;
    if (depth > MAX_FRAMES) depth = MAX_FRAMES;
    uint64_t h = 0x84222325CBF29CE4ULL ^ (uint64_t)depth;
    for (int i = 0; i < depth; i++) h = stack_hash_step(h, (uintptr_t)frames[first + i]);
    if (h == 0) h = 1;
    /* Stacks are told apart by a 64-bit hash of their frames; a collision would merge two
     * stacks, with odds of about n^2 / 2^65 for n distinct stacks. */
    if (!ts->stacks && !(ts->stacks = stack_table_new(STACK_TABLE_FIRST_SLOTS))) return 0;
    struct stack_slot *slot = stack_slot_of(ts->stacks, h);
    if (slot->hash == h) return slot->id;
    if ((ts->stacks->used + 1) * 2 > ts->stacks->slots)
        slot = stack_slot_of(stack_table_grow(ts), h);
    uint32_t id = ts->next_stack_id++;
    slot->hash = h;
    slot->id = id;
    ts->stacks->used++;
    if (ts->len + 16 + (size_t)depth * 10 > BUF_CAP) flush_thread(ts);
    uint8_t *o = ts->buf + ts->len;
    *o++ = KIND_STACK;
    o = put_varint(o, id);
    o = put_varint(o, (uint64_t)depth);
    uintptr_t prev = 0;
    for (int i = 0; i < depth; i++) {
        uintptr_t ip = (uintptr_t)frames[first + i];
        o = put_varint(o, zigzag((int64_t)(ip - prev)));
        prev = ip;
    }
    ts->len = (uint32_t)(o - ts->buf);
    return id;
}

/* ---- recording ---- */
static inline uint8_t *put_addr(uint8_t *o, uint8_t *tag, uintptr_t addr, uintptr_t *prev) {
    int64_t d = (int64_t)(addr - *prev);
    *prev = addr;
    if (LIKELY((d & 15) == 0)) return put_varint_short(o, zigzag(d >> 4));
    *tag |= FLAG_UNALIGNED;
    return put_varint(o, zigzag(d));
}

/* Turns ordering on, before a second thread can make a call. One counter value is taken
 * first: this thread's calls so far have no place (the reader gives them 0), and every
 * ordered call of this tick reads a higher value. */
static void order_calls(void) {
    if (!clock_writable || __atomic_load_n(&ordering_on, __ATOMIC_RELAXED)) return;
    __atomic_fetch_add(&clock_page->now, 1, __ATOMIC_RELAXED);
    __atomic_store_n(&ordering_on, 1, __ATOMIC_RELAXED);
}

/* Writes an ORDER record if this call read another value than the thread expects, and
 * always at a buffer's first ordered call; the caller has made room. */
static inline void note_order(struct thread_state *ts, uint64_t now, int is_free) {
    uint64_t read = now & ORDER_MASK;
    /* A place never goes back (a signal handler's call written out of turn). */
    if (read < ts->order_next) read = ts->order_next;
    if (read != ts->order_next || !ts->order_written) {
        put_tagged(ts, KIND_TICK | FLAG_ORDER, read - ts->order_next);
        ts->order_written = 1;
    }
    ts->order_next = read + (uint64_t)is_free;
}

/* The clock word for a call: a free takes a counter value, anything else reads it. */
static inline uint64_t clock_for(uint8_t kind, int ordering) {
    if (ordering && kind == KIND_FREE)
        return __atomic_fetch_add(&clock_page->now, 1, __ATOMIC_RELAXED);
    return clock_page->now;
}

/* A thread the merge was told is idle is back: an empty buffer says so at the current
 * tick before its call reads the clock, so that the merge waits for it from here. Sent
 * after the call instead, it could reach the merge behind calls of other threads made
 * ticks later (the thread preempted between its call and the send: with 128 threads on
 * 2 cores, 1 to 6 late calls in a third of bursty runs). */
static void announce_awake(struct thread_state *ts) {
    if (ts->len == 0) {
        uint64_t tick = current_tick();
        if (tick != ts->tick) {
            ts->tick = tick;
            ts->order_next = 0; /* the recorder started the counter again with the tick */
        }
        ts->chunk_first_tick = ts->tick;
    }
    send_thread_buffer(ts, 0);
}

/* Writes one call's record into the thread's buffer; the caller holds TF_BUSY. */
static void write_event(struct thread_state *ts, uint8_t kind, uintptr_t addr, uintptr_t old_addr,
                        size_t size, size_t align) {
    int ordering = __atomic_load_n(&ordering_on, __ATOMIC_RELAXED);
    uint64_t now = clock_for(kind, ordering);
    if (UNLIKELY(now >> TICK_SHIFT != ts->tick)) tick_changed(ts, now >> TICK_SHIFT);
    if (UNLIKELY(ts->len + MAX_RECORD + 32 > BUF_CAP)) flush_thread(ts);
    if (ordering) note_order(ts, now, kind == KIND_FREE);

    uint8_t tag = kind;
    if (kind == KIND_FREE) {
        /* A free is recorded before the real free: the allocator still counts the block,
         * so its statistics go before the free's record, where fragscope does too. */
        if (UNLIKELY(ts->stats_due)) emit_due_stats(ts);
        uint8_t *o = ts->buf + ts->len + 1;
        if (addr) o = put_addr(o, &tag, addr, &ts->prev_addr);
        else tag |= FLAG_NULL;
        ts->buf[ts->len] = tag;
        ts->len = (uint32_t)(o - ts->buf);
        return;
    }

    /* An allocation. */
    uint32_t stack = 0;
    if (addr && (ts->sample_countdown -= (int64_t)size) < 0) {
        ts->sample_countdown = (int64_t)next_sample_interval(ts);
        stack = capture_stack(ts);
    }
    size_t usable = 0;
    int explicit_usable = 0;
    if (addr && real_malloc_usable_size && usable_size_applies[kind]) {
        if (size < USABLE_TABLE && kind <= 1 /* malloc, calloc */) {
            uint64_t bit = 1ULL << (size & 63);
            if (UNLIKELY(!(ts->usable_known[size >> 6] & bit))) {
                unsigned u = atomic_load_explicit(&usable_for_size[size], memory_order_relaxed);
                if (!u) {
                    u = (unsigned)real_malloc_usable_size((void *)addr);
                    atomic_store_explicit(&usable_for_size[size], u, memory_order_relaxed);
                }
                uint8_t *o = ts->buf + ts->len;
                *o++ = KIND_USABLE;
                o = put_varint(o, size);
                o = put_varint(o, u);
                ts->len = (uint32_t)(o - ts->buf);
                ts->has_usable = 1;
                ts->usable_known[size >> 6] |= bit;
            }
        } else {
            /* Aligned and resized blocks, and large ones, vary: ask every time. */
            usable = real_malloc_usable_size((void *)addr);
            explicit_usable = usable >= size;
        }
    }
    uint8_t *start = ts->buf + ts->len;
    uint8_t *o = start + 1;
    if (kind == KIND_REALLOC || kind == KIND_REALLOCARRAY) {
        uint8_t *rflags = o++;
        *rflags = 0;
        if (old_addr) {
            uint8_t t = 0;
            o = put_addr(o, &t, old_addr, &ts->prev_addr);
            if (t & FLAG_UNALIGNED) *rflags |= REALLOC_OLD_UNALIGNED;
        } else {
            *rflags |= REALLOC_OLD_NULL;
        }
    }
    if (addr) o = put_addr(o, &tag, addr, &ts->prev_addr);
    else tag |= FLAG_NULL;
    o = put_varint_short(o, size);
    if (align) o = put_varint(o, align);
    if (explicit_usable) {
        tag |= FLAG_USABLE;
        o = put_varint(o, usable - size);
    }
    if (stack) {
        tag |= FLAG_STACK;
        o = put_varint(o, stack);
    }
    *start = tag;
    ts->len = (uint32_t)(o - ts->buf);
    /* An allocation is recorded after the real call: the allocator already counts the
     * block, so its statistics go after the record. */
    if (UNLIKELY(ts->stats_due)) emit_due_stats(ts);
}

/* Writes the calls signal handlers queued, oldest first; the caller holds TF_BUSY, so a
 * handler that runs meanwhile queues behind them instead of writing ahead of them. */
static void drain_nested(struct thread_state *ts) {
    while (ts->nested_head != ts->nested_tail) {
        struct nested_event e = ts->nested[ts->nested_head % NESTED_CAP];
        __atomic_signal_fence(__ATOMIC_SEQ_CST);
        ts->nested_head++;
        write_event(ts, e.kind, e.addr, e.old_addr, e.size, e.align);
    }
    uint64_t lost = ts->nested_lost;
    if (lost) {
        if (ts->len + 16 > BUF_CAP) flush_thread(ts);
        put_tagged(ts, KIND_LOST, lost);
        ts->nested_lost -= lost;
    }
}

/* Queues an event recorded while this thread was mid-record (a signal handler). */
static void record_nested(uint8_t kind, uintptr_t addr, uintptr_t old_addr, size_t size, size_t align) {
    struct thread_state *ts = tls_state;
    if (!ts) {
        atomic_fetch_add(&lost_events, 1);
        return;
    }
    if (ts->nested_tail - ts->nested_head >= NESTED_CAP) {
        ts->nested_lost++;
        return;
    }
    struct nested_event *e = &ts->nested[ts->nested_tail % NESTED_CAP];
    e->kind = kind, e->addr = addr, e->old_addr = old_addr, e->size = size, e->align = align;
    __atomic_signal_fence(__ATOMIC_SEQ_CST);
    ts->nested_tail++;
}

/* Records one call. `addr` is the result (0 for NULL); for realloc `old_addr` is the
 * block given; for free `addr` is the block freed. Calls that handlers queued are
 * written first (they came before this one: queued while an earlier record was being
 * written, after its last drain) and after (queued while this one was). */
static void record(uint8_t kind, uintptr_t addr, uintptr_t old_addr, size_t size, size_t align) {
    if (UNLIKELY(tls_flags & TF_BUSY)) {
        record_nested(kind, addr, old_addr, size, align);
        return;
    }
    tls_flags |= TF_BUSY;
    __atomic_signal_fence(__ATOMIC_SEQ_CST);
    tls_recorded_calls++;
    struct thread_state *ts = tls_state;
    if (UNLIKELY(!ts)) {
        int saved_errno = errno;
        ts = thread_state_new();
        errno = saved_errno;
        if (!ts) goto out;
    }
    wait_until_not_taken(ts);
    int woke = ts->idle;
    ts->idle = 0;
    if (UNLIKELY(woke)) announce_awake(ts);
    if (UNLIKELY(ts->nested_head != ts->nested_tail || ts->nested_lost)) drain_nested(ts);
    write_event(ts, kind, addr, old_addr, size, align);
    if (UNLIKELY(ts->nested_head != ts->nested_tail || ts->nested_lost)) drain_nested(ts);
    if (UNLIKELY(finished || ts->exited || woke)) flush_thread(ts);
out:
    __atomic_signal_fence(__ATOMIC_SEQ_CST);
    tls_flags &= ~TF_BUSY;
}

/* The common call, written inline in the malloc, calloc and free hooks: this thread's own
 * call, outside any handler or machinery of ours, the tick unchanged, room in the buffer,
 * nothing queued, no stack due and the usable size already told. The general path's two
 * calls and their frames cost more than the record itself. Returns 0 when the call needs
 * the general path (`record`). */
static inline __attribute__((always_inline)) int record_common(uint8_t kind, uintptr_t addr,
                                                               size_t size) {
    struct thread_state *ts = tls_state;
    if (UNLIKELY(!ts || tls_flags)) return 0;
    tls_flags = TF_BUSY;
    __atomic_signal_fence(__ATOMIC_SEQ_CST);
    /* Before anything of the buffer is read: another thread may be sending it. */
    if (UNLIKELY(__atomic_load_n(&ts->attention, __ATOMIC_ACQUIRE))) {
        __atomic_signal_fence(__ATOMIC_SEQ_CST);
        tls_flags = 0;
        return 0;
    }
    /* Read after BUSY is set: a handler that ran before wrote through the general path. */
    int64_t countdown = ts->sample_countdown - (int64_t)size;
    /* An ordered free takes its counter value here, in the one access to the shared word:
     * a read followed by the increment made two transfers of its cache line between
     * cores. If this path then leaves the call to the general one, that path takes
     * another value; a value no call kept leaves the order as it was (places are
     * compared, never counted). */
    int ordering = __atomic_load_n(&ordering_on, __ATOMIC_RELAXED);
    uint64_t now = clock_for(kind, ordering);
    int plain = addr && !finished && ts->nested_head == ts->nested_tail && !ts->nested_lost &&
                now >> TICK_SHIFT == ts->tick &&
                ts->len + MAX_RECORD + 32 <= BUF_CAP;
    if (kind != KIND_FREE)
        plain = plain && countdown >= 0 &&
                (!usable_size_applies[kind] ||
                 (size < USABLE_TABLE && (ts->usable_known[size >> 6] >> (size & 63) & 1)));
    if (UNLIKELY(!plain)) {
        __atomic_signal_fence(__ATOMIC_SEQ_CST);
        tls_flags = 0;
        return 0;
    }
    if (UNLIKELY(ordering)) note_order(ts, now, kind == KIND_FREE);
    uint8_t tag = kind;
    uint8_t *start = ts->buf + ts->len;
    uint8_t *o = put_addr(start + 1, &tag, addr, &ts->prev_addr);
    if (kind != KIND_FREE) {
        o = put_varint_short(o, size);
        ts->sample_countdown = countdown;
    }
    *start = tag;
    ts->len = (uint32_t)(o - ts->buf);
    tls_recorded_calls++;
    if (UNLIKELY(ts->nested_head != ts->nested_tail || ts->nested_lost)) drain_nested(ts);
    __atomic_signal_fence(__ATOMIC_SEQ_CST);
    tls_flags = 0;
    return 1;
}

/* Records a malloc, calloc or free. */
static inline __attribute__((always_inline)) void record_plain(uint8_t kind, uintptr_t addr,
                                                              size_t size) {
    if (record_common(kind, addr, size)) return;
    if (kind == KIND_FREE && (tls_flags & TF_TLS_RELEASE) && addr && take_unwinder_tls(addr))
        return;
    record(kind, addr, 0, size, 0);
}

static void send_exit(int status, uint32_t how);
#include "attach.h"
#include "sbcl.h"

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
            unwinder_lib = lib;
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

/* ---- the malloc family ---- */

/* A call made while this thread is inside our machinery or the real allocator: forward
 * it unrecorded? Yes for ours and for the allocator calling itself (its code is the
 * caller; until that code is known, every such call counts as the allocator's); no for
 * a signal handler that interrupted the allocator: that is the program's own call. */
static __attribute__((noinline)) int forward_nested(const void *caller) {
    if (tls_flags & TF_FORWARD) return 1;
    uintptr_t c = (uintptr_t)caller;
    return !allocator_text_hi || (c >= allocator_text_lo && c < allocator_text_hi);
}
#define FORWARD_NESTED() \
    (UNLIKELY(tls_flags & (TF_FORWARD | TF_REAL)) && forward_nested(__builtin_return_address(0)))

/* Around a real call: saved and restored, not cleared, as a signal handler's call may
 * run inside another's. */
#define ENTER_REAL() unsigned flags_before_real = tls_flags; tls_flags |= TF_REAL
#define LEAVE_REAL() tls_flags = flags_before_real

EXPORT void *malloc(size_t size) {
    if (UNLIKELY(!real_malloc) && !ensure_init()) return bootstrap_alloc(size);
    if (FORWARD_NESTED()) return real_malloc(size);
    ENTER_REAL();
    void *p = real_malloc(size);
    LEAVE_REAL();
    if (LIKELY(tracing)) record_plain(0, (uintptr_t)p, size);
    return p;
}

EXPORT void free(void *ptr) {
    if (UNLIKELY(in_bootstrap(ptr))) return;
    if (UNLIKELY(!real_free) && !ensure_init()) return;
    if (FORWARD_NESTED()) {
        real_free(ptr);
        return;
    }
    /* Recorded before the block is given back, so no other thread can be handed the same
     * address and record it first. */
    if (LIKELY(tracing)) record_plain(KIND_FREE, (uintptr_t)ptr, 0);
    ENTER_REAL();
    real_free(ptr);
    LEAVE_REAL();
}

EXPORT void *calloc(size_t nmemb, size_t size) {
    if (UNLIKELY(!real_calloc) && !ensure_init()) {
        size_t total;
        if (__builtin_mul_overflow(nmemb, size, &total)) return NULL;
        return bootstrap_alloc(total); /* static storage: already zero */
    }
    if (FORWARD_NESTED()) return real_calloc(nmemb, size);
    ENTER_REAL();
    void *p = real_calloc(nmemb, size);
    LEAVE_REAL();
    size_t total;
    if (__builtin_mul_overflow(nmemb, size, &total)) total = SIZE_MAX;
    if (LIKELY(tracing)) record_plain(1, (uintptr_t)p, total);
    return p;
}

static void *realloc_common(uint8_t kind, void *ptr, size_t nmemb, size_t size, int nested) {
    size_t total = size;
    if (kind == KIND_REALLOCARRAY && __builtin_mul_overflow(nmemb, size, &total)) total = SIZE_MAX;
    if (UNLIKELY(in_bootstrap(ptr))) {
        /* A bootstrap block grows into a real one; the arena itself is never reused. */
        size_t room = (size_t)(bootstrap + sizeof bootstrap - (char *)ptr);
        void *p = malloc(total);
        if (p) memcpy(p, ptr, room < total ? room : total);
        return p;
    }
    if (UNLIKELY(!real_realloc) && !ensure_init()) return NULL;
    /* Recorded after the call: the reader's merge lets another thread's reuse of `ptr`
     * wait for this record even when it carries a slightly later tick. */
    ENTER_REAL();
    void *p = kind == KIND_REALLOCARRAY ? real_reallocarray(ptr, nmemb, size) : real_realloc(ptr, size);
    LEAVE_REAL();
    if (!nested && LIKELY(tracing)) record(kind, (uintptr_t)p, (uintptr_t)ptr, total, 0);
    return p;
}

EXPORT void *realloc(void *ptr, size_t size) {
    return realloc_common(KIND_REALLOC, ptr, 1, size, FORWARD_NESTED());
}
EXPORT void *reallocarray(void *ptr, size_t nmemb, size_t size) {
    if (UNLIKELY(!real_reallocarray) && ensure_init() && !real_reallocarray) {
        errno = ENOMEM;
        return NULL;
    }
    return realloc_common(KIND_REALLOCARRAY, ptr, nmemb, size, FORWARD_NESTED());
}

/* aligned allocations share one shape: forward, then record with the alignment */
#define ALIGNED_HOOK(name, kind, call, align_expr)                                    \
    if (UNLIKELY(!real_##name) && !ensure_init()) return NULL;                        \
    if (FORWARD_NESTED()) return call;                                                \
    ENTER_REAL();                                                                     \
    void *p = call;                                                                   \
    LEAVE_REAL();                                                                     \
    if (LIKELY(tracing)) record(kind, (uintptr_t)p, 0, size, align_expr);             \
    return p;

EXPORT void *aligned_alloc(size_t align, size_t size) {
    ALIGNED_HOOK(aligned_alloc, 5, real_aligned_alloc(align, size), align)
}
EXPORT void *memalign(size_t align, size_t size) {
    ALIGNED_HOOK(memalign, 6, real_memalign(align, size), align)
}
EXPORT void *valloc(size_t size) { ALIGNED_HOOK(valloc, 7, real_valloc(size), 4096) }
EXPORT void *pvalloc(size_t size) { ALIGNED_HOOK(pvalloc, 8, real_pvalloc(size), 4096) }

EXPORT int posix_memalign(void **out, size_t align, size_t size) {
    if (UNLIKELY(!real_posix_memalign) && !ensure_init()) return ENOMEM;
    if (FORWARD_NESTED()) return real_posix_memalign(out, align, size);
    ENTER_REAL();
    int rc = real_posix_memalign(out, align, size);
    LEAVE_REAL();
    if (LIKELY(tracing)) record(4, rc == 0 ? (uintptr_t)*out : 0, 0, size, align);
    return rc;
}

/* ---- C++ operators new and delete ---- */

/* The next definition of a C++ operator. A C program that dlopens a C++ library with
 * RTLD_LOCAL binds that library's operators to ours while the C++ runtime stays out of
 * RTLD_NEXT's reach: then ask the runtime's own handle. */
static void *next_cxx_operator(void **slot, const char *name) {
    void *f = __atomic_load_n(slot, __ATOMIC_ACQUIRE);
    if (LIKELY(f)) return f;
    unsigned saved = tls_flags;
    tls_flags |= TF_FORWARD;
    f = real_symbol(name);
    static const char *const runtimes[] = {"libstdc++.so.6", "libc++.so.1"};
    for (unsigned i = 0; !f && i < sizeof runtimes / sizeof *runtimes; i++) {
        void *lib = real_dlopen ? real_dlopen(runtimes[i], RTLD_LAZY | RTLD_NOLOAD) : NULL;
        if (lib) f = dlsym(lib, name);
    }
    tls_flags = saved;
    __atomic_store_n(slot, f, __ATOMIC_RELEASE);
    return f;
}

/* Parameters, arguments, and what the operator records, per shape. */
#define CXX_SHAPE_NEW (size_t size), (size), 0, 0
#define CXX_SHAPE_NEW_NOTHROW (size_t size, const void *tag), (size, tag), 0, 0
#define CXX_SHAPE_NEW_ALIGNED (size_t size, size_t align), (size, align), 5, align
#define CXX_SHAPE_NEW_ALIGNED_NOTHROW (size_t size, size_t align, const void *tag), \
    (size, align, tag), 5, align
#define CXX_SHAPE_DELETE (void *ptr), (ptr)
#define CXX_SHAPE_DELETE_SIZED (void *ptr, size_t size), (ptr, size)
#define CXX_SHAPE_DELETE_NOTHROW (void *ptr, const void *tag), (ptr, tag)
#define CXX_SHAPE_DELETE_ALIGNED (void *ptr, size_t align), (ptr, align)
#define CXX_SHAPE_DELETE_SIZED_ALIGNED (void *ptr, size_t size, size_t align), (ptr, size, align)
#define CXX_SHAPE_DELETE_ALIGNED_NOTHROW (void *ptr, size_t align, const void *tag), \
    (ptr, align, tag)

/* A throwing new may leave by an exception from the real one: nothing of ours is left
 * set across that call (no TF_FORWARD), and the block is recorded after it returns. */
#define CXX_NEW_BODY(sym, params, args, kind, align_expr)                                \
    static void *real_##sym;                                                             \
    EXPORT void *sym params {                                                            \
        void *(*real) params = next_cxx_operator(&real_##sym, #sym);                      \
        if (UNLIKELY(!real)) { /* no C++ runtime at all: as libstdc++ would, nearly */   \
            void *p = malloc(size);                                                      \
            if (!p) abort();                                                             \
            return p;                                                                    \
        }                                                                                \
        if (!tracing || (tls_flags & TF_FORWARD)) return real args;                      \
        uint64_t before = tls_recorded_calls;                                            \
        void *p = real args;                                                             \
        if (tls_recorded_calls == before) record(kind, (uintptr_t)p, 0, size, align_expr); \
        return p;                                                                        \
    }
/* A delete is recorded before the block goes back, as free is; the real one's own free,
 * if it calls it, is then forwarded unrecorded. */
#define CXX_DELETE_BODY(sym, params, args)                                               \
    static void *real_##sym;                                                             \
    EXPORT void sym params {                                                             \
        void (*real) params = next_cxx_operator(&real_##sym, #sym);                       \
        if (UNLIKELY(!real)) {                                                           \
            free(ptr);                                                                   \
            return;                                                                      \
        }                                                                                \
        if (!tracing || (tls_flags & TF_FORWARD) || !ptr) {                              \
            real args;                                                                   \
            return;                                                                      \
        }                                                                                \
        record(KIND_FREE, (uintptr_t)ptr, 0, 0, 0);                                      \
        tls_flags |= TF_FORWARD;                                                         \
        real args;                                                                       \
        tls_flags &= ~TF_FORWARD;                                                        \
    }
#define CXX_BODY_NEW(sym, shape) CXX_NEW_BODY(sym, shape)
#define CXX_BODY_NEW_NOTHROW(sym, shape) CXX_NEW_BODY(sym, shape)
#define CXX_BODY_NEW_ALIGNED(sym, shape) CXX_NEW_BODY(sym, shape)
#define CXX_BODY_NEW_ALIGNED_NOTHROW(sym, shape) CXX_NEW_BODY(sym, shape)
#define CXX_BODY_DELETE(sym, shape) CXX_DELETE_BODY(sym, shape)
#define CXX_BODY_DELETE_SIZED(sym, shape) CXX_DELETE_BODY(sym, shape)
#define CXX_BODY_DELETE_NOTHROW(sym, shape) CXX_DELETE_BODY(sym, shape)
#define CXX_BODY_DELETE_ALIGNED(sym, shape) CXX_DELETE_BODY(sym, shape)
#define CXX_BODY_DELETE_SIZED_ALIGNED(sym, shape) CXX_DELETE_BODY(sym, shape)
#define CXX_BODY_DELETE_ALIGNED_NOTHROW(sym, shape) CXX_DELETE_BODY(sym, shape)
#define CXX_HOOK(sym, shape) CXX_BODY_##shape(sym, CXX_SHAPE_##shape)
FRAGSCOPE_CXX_HOOKS(CXX_HOOK)

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
