/* CPython's object allocator, sampled with Python call sites. Included once, by
 * fragscope_preload.c, after the socket and clock helpers it uses.
 *
 * Objects of 512 bytes or less come from pymalloc's arenas, which malloc never sees: the
 * recorder's census counts their pools, and this part says which Python lines allocated
 * the objects that keep them. Once the interpreter runs (Py_IsInitialized, and this
 * thread holds the GIL), the object and memory domains' allocators are wrapped with
 * PyMem_SetAllocator, as tracemalloc.start() does at run time; PYTHONMALLOC and pymalloc
 * itself are left as they are. Allocations are sampled like native ones (a Poisson
 * process over bytes, a mean of FRAGSCOPE_SAMPLE_BYTES / 8), each sample with the Python
 * stack read from the thread's frames in place (layouts of 3.8 to 3.14, checked against
 * PyCode_Type at every frame), never by materialising frame objects, which would
 * allocate and could run the collector inside an allocation. A sampled object's free is
 * recorded too (one table lookup per free), so the reader knows which samples survive.
 *
 * Every wrapped call runs with the GIL held (CPython requires it for these domains), so
 * the tables and the buffer need no lock of their own. Records go to one process-wide
 * buffer (samples.h), sent as MSG_PYTHON (docs/trace-format.md, chunk 18): their order is
 * the order of the calls. */

typedef struct {
    void *ctx;
    void *(*malloc)(void *ctx, size_t size);
    void *(*calloc)(void *ctx, size_t nelem, size_t elsize);
    void *(*realloc)(void *ctx, void *ptr, size_t new_size);
    void (*free)(void *ctx, void *ptr);
} py_allocator;
enum { PY_DOMAIN_MEM = 1, PY_DOMAIN_OBJ = 2 };
/* pymalloc serves requests up to this size; larger ones go to malloc (recorded there). */
#define PY_SMALL_REQUEST 512
#define PY_MAX_FRAMES 64

/* Where a thread's current frame, its caller, code object and instruction are, by
 * release. `chain`: 0 PyFrameObjects from tstate->frame (3.8-3.10); 1 interpreter
 * frames from tstate->cframe->current_frame (3.11, 3.12); 2 from tstate->current_frame
 * (3.13, 3.14). Offsets from each release's headers (offsetof, x86-64; 3.14's from
 * Debian's 3.14 headers with its pyconfig.h). */
struct py_layout {
    int minor, chain;
    int ts_frame, cframe_current, back, code, instr;
    int lasti_scale; /* chain 0: f_lasti in bytes (1) or code units (2) */
    /* -1: none; else the frame's owner byte, and frames owned by the C stack or the
     * interpreter (3 and up: 3.12-3.13's CSTACK, 3.14's INTERPRETER and CSTACK) are
     * skipped, as CPython's own _PyFrame_IsIncomplete skips them. */
    int owner;
    int co_filename, co_name, co_code; /* co_name: co_qualname from 3.11 */
    /* -1: none; else `_co_firsttraceable` (in code units): a frame before it has not
     * started (3.14's __init__ shim, _Py_InitCleanup, never does) and is skipped, as
     * _PyFrame_IsIncomplete skips it. */
    int co_firsttraceable;
    /* Low bits of the frame's code reference that are tags, not address: 3.14's
     * f_executable is a _PyStackRef (deferred-reference and tagged-int bits). */
    uintptr_t code_tag_bits;
};
static const struct py_layout py_layouts[] = {
    {8, 0, 24, 0, 24, 32, 104, 1, -1, 104, 112, 0, -1, 0},
    {9, 0, 24, 0, 24, 32, 104, 1, -1, 104, 112, 0, -1, 0},
    {10, 0, 24, 0, 24, 32, 96, 2, -1, 104, 112, 0, -1, 0},
    {11, 1, 56, 8, 48, 32, 56, 0, 69, 112, 128, 184, -1, 0},
    {12, 1, 56, 0, 8, 0, 56, 0, 70, 112, 128, 192, -1, 0},
    {13, 2, 72, 0, 8, 0, 56, 0, 70, 112, 128, 200, -1, 0},
    {14, 2, 72, 0, 8, 0, 56, 0, 74, 112, 128, 208, 192, 3},
};

/* 0: no CPython seen yet; 1: CPython, not wrapped yet; 2: wrapped; 3: never (no
 * CPython, an unknown release, a debug or free-threaded build: `py_unsampled` says
 * why, when it is CPython). */
static int py_state;
static const struct py_layout *py_layout;
static int (*py_is_initialized)(void);
static int (*py_gil_check)(void);
static void (*py_get_allocator)(int domain, py_allocator *a);
static void (*py_set_allocator)(int domain, py_allocator *a);
static void *(*py_current_tstate)(void);
static int (*py_addr2line)(void *code, int addrq);
static const char *(*py_utf8)(void *str);
static void (*py_incref)(void *obj);
static void *py_code_type;
static py_allocator py_orig_mem, py_orig_obj;
static double py_mean_bytes;
static __thread int64_t tls_py_countdown;
static __thread uint64_t tls_py_rng;
static __thread int tls_py_inside; /* in our own part of a wrapped call */
static uint64_t py_frames_walked_bad; /* walks stopped by a frame that was not code */

/* Sampled objects still live, by address (open addressing, linear probing, 0 empty). */
static uintptr_t *py_live;
static size_t py_live_cap, py_live_len;
/* Frames are named by (code object, instruction offset). Every call on the log is made
 * with the GIL held. */
static struct sample_log py_log; /* zero-initialised, so in .bss: not in the file */
enum { PY_REC_ALLOC = 1, PY_REC_FREE = 2 };
/* Why a CPython process's objects are not sampled (empty: they are, or it is not
 * CPython), sent once per process so that the report can say it. */
static char py_unsampled[200];

static uint32_t py_frame_id(void *code, int addrq) {
    uint32_t slot;
    uint32_t id = log_frame_id(&py_log, (uintptr_t)code, (uint32_t)addrq, &slot);
    if (id) return id;
    const struct py_layout *L = py_layout;
    int line = py_addr2line(code, addrq);
    const char *file = py_utf8(*(void **)((char *)code + L->co_filename));
    const char *name = py_utf8(*(void **)((char *)code + L->co_name));
    if (!file) file = "?";
    if (!name) name = "?";
    id = log_define_frame(&py_log, slot, (uintptr_t)code, (uint32_t)addrq,
                          line < 0 ? 0 : (uint32_t)line, file, strnlen(file, 1024), name,
                          strnlen(name, 512));
    /* The code object stays alive, so its address names it for good. */
    if (id) py_incref(code);
    return id;
}

/* This thread's Python stack as frame ids, innermost first. */
static int py_walk(uint32_t *ids) {
    const struct py_layout *L = py_layout;
    char *ts = py_current_tstate();
    if (!ts) return 0;
    char *f = *(char **)(ts + L->ts_frame);
    if (L->chain == 1 && f) f = *(char **)(f + L->cframe_current);
    int n = 0;
    for (int steps = 0; f && n < PY_MAX_FRAMES && steps < 4 * PY_MAX_FRAMES; steps++) {
        char *next = *(char **)(f + L->back);
        if (L->owner >= 0 && *(uint8_t *)(f + L->owner) >= 3) {
            f = next;
            continue;
        }
        char *code = (char *)(*(uintptr_t *)(f + L->code) & ~L->code_tag_bits);
        if (!code || *(void **)(code + 8) != py_code_type) {
            py_frames_walked_bad++;
            break;
        }
        int addrq;
        if (L->chain == 0) {
            addrq = *(int *)(f + L->instr) * L->lasti_scale;
        } else {
            char *instr = *(char **)(f + L->instr);
            char *start = code + L->co_code;
            addrq = instr >= start ? (int)(instr - start) : -1;
            if (L->co_firsttraceable >= 0 && *(uint8_t *)(f + L->owner) != 1 /* generator */ &&
                addrq < 2 * *(int *)(code + L->co_firsttraceable)) {
                f = next;
                continue;
            }
        }
        uint32_t id = py_frame_id(code, addrq);
        if (!id) break;
        ids[n++] = id;
        f = next;
    }
    return n;
}

static size_t py_slot_of(uintptr_t p) {
    return (size_t)((p * 0x9E3779B97F4A7C15ULL) >> 20) & (py_live_cap - 1);
}

/* Whether `p` is a sampled object; if so it is forgotten. */
static int py_forget(uintptr_t p) {
    if (!py_live_len) return 0;
    size_t i = py_slot_of(p);
    while (py_live[i] && py_live[i] != p) i = (i + 1) & (py_live_cap - 1);
    if (!py_live[i]) return 0;
    /* Backward-shift deletion: the entries after it that probed past it move up. */
    size_t hole = i;
    for (size_t j = (i + 1) & (py_live_cap - 1); py_live[j]; j = (j + 1) & (py_live_cap - 1)) {
        size_t home = py_slot_of(py_live[j]);
        if (((j - home) & (py_live_cap - 1)) >= ((j - hole) & (py_live_cap - 1))) {
            py_live[hole] = py_live[j];
            hole = j;
        }
    }
    py_live[hole] = 0;
    py_live_len--;
    return 1;
}

static int py_remember(uintptr_t p) {
    if (2 * (py_live_len + 1) > py_live_cap) {
        size_t cap = py_live_cap ? 2 * py_live_cap : 4096;
        uintptr_t *table = real_calloc(cap, sizeof *table);
        if (!table) return 0;
        uintptr_t *old = py_live;
        size_t old_cap = py_live_cap;
        py_live = table;
        py_live_cap = cap;
        for (size_t i = 0; i < old_cap; i++) {
            if (!old[i]) continue;
            size_t j = py_slot_of(old[i]);
            while (py_live[j]) j = (j + 1) & (cap - 1);
            py_live[j] = old[i];
        }
        real_free(old);
        atomic_fetch_add(&own_bytes, (cap - old_cap) * sizeof *table);
    }
    size_t i = py_slot_of(p);
    while (py_live[i]) i = (i + 1) & (py_live_cap - 1);
    py_live[i] = p;
    py_live_len++;
    return 1;
}

static int64_t py_next_interval(void) {
    if (!tls_py_rng) tls_py_rng = (uint64_t)syscall(SYS_gettid) * 0x9E3779B97F4A7C15ULL | 1;
    return (int64_t)poisson_interval(&tls_py_rng, py_mean_bytes);
}

static void py_sample(void *p, size_t size) {
    tls_py_inside = 1;
    int saved_errno = errno;
    tls_py_countdown = py_next_interval();
    uint32_t ids[PY_MAX_FRAMES];
    int n = py_walk(ids);
    uint32_t stack = n ? log_stack_id(&py_log, ids, n) : 0;
    uint8_t *o = log_reserve(&py_log, 40);
    if (o && py_remember((uintptr_t)p)) {
        *o++ = PY_REC_ALLOC;
        o = put_varint(o, (uintptr_t)p);
        o = put_varint(o, size);
        o = put_varint(o, stack);
        log_commit(&py_log, o);
    }
    errno = saved_errno;
    tls_py_inside = 0;
}

static inline void py_note_alloc(void *p, size_t size) {
    if (!p || size > PY_SMALL_REQUEST || tls_py_inside) return;
    if (LIKELY((tls_py_countdown -= (int64_t)size) >= 0)) return;
    py_sample(p, size);
}

/* Before the real free: no other call can be handed the address first. */
static inline void py_note_free(void *p) {
    if (!p || !py_live_len || tls_py_inside || !py_forget((uintptr_t)p)) return;
    tls_py_inside = 1;
    uint8_t *o = log_reserve(&py_log, 24);
    if (o) {
        *o++ = PY_REC_FREE;
        o = put_varint(o, (uintptr_t)p);
        log_commit(&py_log, o);
    }
    tls_py_inside = 0;
}

static void *py_malloc(void *ctx, size_t size) {
    py_allocator *a = ctx;
    void *p = a->malloc(a->ctx, size);
    py_note_alloc(p, size);
    return p;
}
static void *py_calloc(void *ctx, size_t nelem, size_t elsize) {
    py_allocator *a = ctx;
    void *p = a->calloc(a->ctx, nelem, elsize);
    size_t total;
    if (!__builtin_mul_overflow(nelem, elsize, &total)) py_note_alloc(p, total);
    return p;
}
static void *py_realloc(void *ctx, void *ptr, size_t size) {
    py_allocator *a = ctx;
    py_note_free(ptr);
    void *p = a->realloc(a->ctx, ptr, size);
    /* A failed realloc keeps the old block, now unsampled: it is simply not followed. */
    py_note_alloc(p, size);
    return p;
}
static void py_free(void *ctx, void *ptr) {
    py_allocator *a = ctx;
    py_note_free(ptr);
    a->free(a->ctx, ptr);
}

static void py_tell_unsampled(void) {
    log_tell_unsampled(&py_log, MSG_PYTHON, py_unsampled, sizeof py_unsampled);
}

/* At start: is this CPython, of a release whose frames we can read? When it is CPython
 * and they cannot be read, `py_unsampled` says why. */
static void py_detect(void) {
    py_state = 3;
    py_set_allocator = dlsym(RTLD_DEFAULT, "PyMem_SetAllocator");
    if (!py_set_allocator || stacks_mode == 0) return;
    const char *(*version)(void) = dlsym(RTLD_DEFAULT, "Py_GetVersion");
    /* "3.14.0 (main, ...) [GCC ...]": the release is its first word. */
    char release[32] = "";
    if (version) sscanf(version(), "%31s", release);
#define PY_NEED(var, name)                                                                     \
    if (!(var = dlsym(RTLD_DEFAULT, name))) {                                                  \
        snprintf(py_unsampled, sizeof py_unsampled,                                            \
                 "this CPython %s does not export %s, which the sampler calls", release,       \
                 name);                                                                        \
        return;                                                                                \
    }
    if (!version) {
        snprintf(py_unsampled, sizeof py_unsampled,
                 "this CPython does not export Py_GetVersion, which names its release");
        return;
    }
    PY_NEED(py_get_allocator, "PyMem_GetAllocator")
    PY_NEED(py_is_initialized, "Py_IsInitialized")
    PY_NEED(py_gil_check, "PyGILState_Check")
    py_current_tstate = dlsym(RTLD_DEFAULT, "_PyThreadState_UncheckedGet");
    if (!py_current_tstate) PY_NEED(py_current_tstate, "PyThreadState_GetUnchecked")
    PY_NEED(py_addr2line, "PyCode_Addr2Line")
    PY_NEED(py_utf8, "PyUnicode_AsUTF8")
    PY_NEED(py_incref, "Py_IncRef")
    PY_NEED(py_code_type, "PyCode_Type")
#undef PY_NEED
    /* Debug and free-threaded builds lay objects out differently. */
    if (dlsym(RTLD_DEFAULT, "_Py_NegativeRefcount")) {
        snprintf(py_unsampled, sizeof py_unsampled,
                 "CPython %s is a debug build (Py_DEBUG), whose objects fragscope does not "
                 "read", release);
        return;
    }
    if (dlsym(RTLD_DEFAULT, "_Py_MergeZeroLocalRefcount")) {
        snprintf(py_unsampled, sizeof py_unsampled,
                 "CPython %s is a free-threaded build, whose objects fragscope does not read",
                 release);
        return;
    }
    int major = 0, minor = 0;
    if (sscanf(release, "%d.%d", &major, &minor) == 2 && major == 3)
        for (size_t i = 0; i < sizeof py_layouts / sizeof *py_layouts; i++)
            if (py_layouts[i].minor == minor) py_layout = &py_layouts[i];
    if (!py_layout) {
        snprintf(py_unsampled, sizeof py_unsampled,
                 "fragscope reads the frames of CPython 3.%d to 3.%d, not %s's",
                 py_layouts[0].minor, py_layouts[sizeof py_layouts / sizeof *py_layouts - 1].minor,
                 release[0] ? release : "this release");
        return;
    }
    py_mean_bytes = sample_mean_bytes / 8 < 1 ? 1 : sample_mean_bytes / 8;
    if (stacks_mode == 2) py_mean_bytes = 1;
    /* The header's seq carries the sampling mean in bytes (the reader scales by it). */
    py_log.mean_bytes = (uint32_t)py_mean_bytes;
    py_log.msg_type = MSG_PYTHON;
    py_state = 1;
}

/* Wraps the allocators once the interpreter runs and this thread holds the GIL; called
 * from tick_changed, so at most once a tick per thread until it succeeds. */
static __attribute__((noinline)) void py_try_wrap(void) {
    if (!py_is_initialized() || !py_gil_check()) return;
    static py_allocator mine_mem, mine_obj;
    py_get_allocator(PY_DOMAIN_MEM, &py_orig_mem);
    py_get_allocator(PY_DOMAIN_OBJ, &py_orig_obj);
    mine_mem = (py_allocator){&py_orig_mem, py_malloc, py_calloc, py_realloc, py_free};
    mine_obj = (py_allocator){&py_orig_obj, py_malloc, py_calloc, py_realloc, py_free};
    tls_py_countdown = py_next_interval();
    py_set_allocator(PY_DOMAIN_MEM, &mine_mem);
    py_set_allocator(PY_DOMAIN_OBJ, &mine_obj);
    py_state = 2;
}

/* A forked child starts with the parent's samples, which are the child's objects too;
 * the records not sent yet are the parent's to send. */
static void py_after_fork(void) {
    py_log.len = 0;
}
