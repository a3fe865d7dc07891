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
 * when the value is not the one the thread expects; a realloc does both, and a RELEASED
 * record places the old block's release at the value it took. The reader orders calls
 * by (tick, value): the allocation of a block always comes after the free that gave it
 * back.
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
    /* KIND_TICK with this flag and 0x10 (an anchor to older readers, which skip its one
     * varint): RELEASED, `(value << 8 | ticks_back):varint`: the realloc that follows gave
     * its old block back at a counter value taken before the real call (see
     * realloc_common), in the tick `ticks_back` (below 255) before this one: `value` below
     * the call's own reading in the same tick, else the value itself. */
    FLAG_RELEASED = 0x40,
    KIND_RELEASED = KIND_TICK | 0x10 | FLAG_RELEASED,
};
/* write_event's `released` when the call gave no block back before its record. */
#define NO_RELEASE UINT64_MAX
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
/* libunwind's TLS module id (0: none), asked once where libunwind is opened. */
static size_t unwinder_tls_module;
/* The dynamic loader's own lookup of a module's thread-local storage (x86-64 and
 * aarch64 take a {module, offset} pair). */
struct tls_index {
    unsigned long module, offset;
};
extern void *__tls_get_addr(struct tls_index *);

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

/* Right after this thread's first unwinding, so its block exists (`__tls_get_addr`
 * allocates none). Not dlinfo: a dl* call that succeeds frees the thread's pending
 * dlerror message and its state, which a program inside dlerror() is reading (bash's
 * `enable -f` of a missing file, under load: a use after free that crashed it), or
 * about to read (its dlerror() then says nothing). */
static void note_unwinder_tls(void) {
    if (!unwinder_tls_module) return;
    void *block = __tls_get_addr(&(struct tls_index){unwinder_tls_module, 0});
    if (!block) return;
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
     * the holder waits for it to be cleared before it touches its buffer. `idle`: another
     * thread told the recorder this one was idle, so its next call is sent at once. One
     * word with `stats_due`, so that the fast path tests all three with one load. */
    union {
        struct {
            uint8_t stats_due;
            uint8_t taken;
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
enum { TF_BUSY = 1, TF_FORWARD = 2, TF_REAL = 4, TF_TLS_RELEASE = 8, TF_RELEASING = 16 };
/* RELEASING: inside a realloc that took an order counter value for the block it may give
 * back (see realloc_common): the thread is not idle, its release will be placed there. */
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

#include "connection.h"

#include "samples.h"
#include "cpython.h"

#include "buffers.h"

#include "allocator_stats.h"

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
                        size_t size, size_t align, uint64_t released) {
    int ordering = __atomic_load_n(&ordering_on, __ATOMIC_RELAXED);
    uint64_t now = clock_for(kind, ordering);
    if (UNLIKELY(now >> TICK_SHIFT != ts->tick)) tick_changed(ts, now >> TICK_SHIFT);
    if (UNLIKELY(ts->len + MAX_RECORD + 48 > BUF_CAP)) flush_thread(ts);
    if (ordering) note_order(ts, now, kind == KIND_FREE);
    /* A realloc that gave its old block back did so at the value it took before the call,
     * which a RELEASED record places, in its own tick; the call's reading places the
     * call. Written after any tick, order record and flush, right before the call's. */
    if (UNLIKELY(released != NO_RELEASE) && ordering && released >> TICK_SHIFT <= ts->tick) {
        uint64_t back = ts->tick - (released >> TICK_SHIFT), value = released & ORDER_MASK;
        /* In the same tick the value is below the call's reading, which it preceded. */
        if (back < 255 && (back || value < ts->order_next)) {
            uint64_t told = back ? value : ts->order_next - value;
            put_tagged(ts, KIND_RELEASED, told << 8 | back);
        }
    }

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
        write_event(ts, e.kind, e.addr, e.old_addr, e.size, e.align, NO_RELEASE);
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
static void record_released(uint8_t kind, uintptr_t addr, uintptr_t old_addr, size_t size,
                            size_t align, uint64_t released) {
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
    /* A thread told idle after it took `released` (inside the real call, which another
     * thread's scan does not wait for): the merge may have gone past that value since,
     * so the call is placed by its reading alone. */
    write_event(ts, kind, addr, old_addr, size, align, woke ? NO_RELEASE : released);
    if (UNLIKELY(ts->nested_head != ts->nested_tail || ts->nested_lost)) drain_nested(ts);
    if (UNLIKELY(finished || woke)) flush_thread(ts);
out:
    __atomic_signal_fence(__ATOMIC_SEQ_CST);
    tls_flags &= ~TF_BUSY;
}

/* Records a call that gave no block back before its record was taken. */
static void record(uint8_t kind, uintptr_t addr, uintptr_t old_addr, size_t size, size_t align) {
    record_released(kind, addr, old_addr, size, align, NO_RELEASE);
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

#include "init.h"

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
    /* Recorded after the call, but a block it moves is given back inside it, where
     * another thread can be handed the old address and read the order counter before
     * this call does. So, once calls are ordered, a realloc of a block takes a counter
     * value first, as a free does, and the record places the release there when the
     * block moved or was freed. */
    int ordered = ptr && !nested && LIKELY(tracing) && __atomic_load_n(&ordering_on, __ATOMIC_RELAXED);
    unsigned releasing_before = tls_flags & TF_RELEASING;
    uint64_t before = NO_RELEASE;
    if (ordered) {
        tls_flags |= TF_RELEASING;
        __atomic_signal_fence(__ATOMIC_SEQ_CST);
        before = __atomic_fetch_add(&clock_page->now, 1, __ATOMIC_RELAXED);
    }
    ENTER_REAL();
    void *p = kind == KIND_REALLOCARRAY ? real_reallocarray(ptr, nmemb, size) : real_realloc(ptr, size);
    LEAVE_REAL();
    /* As the reader counts it: moved, or freed by a size of 0; a failure keeps `ptr`. */
    int gave_back = p != ptr && (p || total == 0);
    if (!nested && LIKELY(tracing))
        record_released(kind, (uintptr_t)p, (uintptr_t)ptr, total, 0, gave_back ? before : NO_RELEASE);
    tls_flags = (tls_flags & ~TF_RELEASING) | releasing_before;
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

/* The C++ runtimes whose operators ours forward to, by soname. */
static const char *const cxx_runtimes[] = {"libstdc++.so.6", "libc++.so.1"};

/* The next definition of a C++ operator. A C program that dlopens a C++ library with
 * RTLD_LOCAL binds that library's operators to ours while the C++ runtime stays out of
 * RTLD_NEXT's reach: then ask the runtime's own handle. */
static void *next_cxx_operator(void **slot, const char *name) {
    void *f = __atomic_load_n(slot, __ATOMIC_ACQUIRE);
    if (LIKELY(f)) return f;
    unsigned saved = tls_flags;
    tls_flags |= TF_FORWARD;
    f = real_symbol(name);
    for (unsigned i = 0; !f && i < sizeof cxx_runtimes / sizeof *cxx_runtimes; i++) {
        void *lib = real_dlopen ? real_dlopen(cxx_runtimes[i], RTLD_LAZY | RTLD_NOLOAD) : NULL;
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

/* Whether the object is a C++ runtime (its path ends in one of `cxx_runtimes`). */
static int is_cxx_runtime(struct dl_phdr_info *info, size_t size, void *unused) {
    (void)size, (void)unused;
    for (unsigned i = 0; info->dlpi_name && i < sizeof cxx_runtimes / sizeof *cxx_runtimes; i++)
        if (strstr(info->dlpi_name, cxx_runtimes[i])) return 1;
    return 0;
}

/* Every operator's next definition, looked up where no pending dlerror message of the
 * program can be lost (a dl* call that succeeds frees it): at load, and after a dlopen
 * that succeeded, which cleared it; only once a C++ runtime is loaded (each lookup that
 * fails costs a search of every object). An operator called before its runtime was found
 * still looks it up then. */
static void resolve_cxx_operators(void) {
    if (!dl_iterate_phdr(is_cxx_runtime, NULL)) return;
    unsigned saved = tls_flags;
    tls_flags |= TF_FORWARD;
#define CXX_RESOLVE(sym, shape) next_cxx_operator(&real_##sym, #sym);
    FRAGSCOPE_CXX_HOOKS(CXX_RESOLVE)
#undef CXX_RESOLVE
    forget_dl_error();
    tls_flags = saved;
}

__attribute__((constructor)) static void resolve_cxx_operators_at_load(void) {
    if (ensure_init()) resolve_cxx_operators();
}

#include "survival.h"
