/* SBCL's allocation sites: which Lisp functions allocate, sampled at every refill of a
 * thread's allocation region. Included once, by fragscope_preload.c, after attach.h.
 *
 * Lisp allocates inline from a thread-local region; when it overflows, the ALLOC-TRAMP
 * assembly routine calls the runtime's `alloc`, which takes `free_pages_lock` once per
 * refill to open a new region (up to a 32 KiB page), as does `gc_alloc_large` for
 * an object of 128 KiB or more. The runtime calls pthread_mutex_lock through its PLT, so
 * rewriting that one slot of the SBCL executable's GOT (attach.h's rebinding) puts
 * lisp_mutex_lock in front of every such lock and of no other program's: the interposer
 * exports no pthread_mutex_lock. The lock is learnt as the first mutex locked from inside
 * `alloc`; afterwards only locks of it from the runtime's allocating functions are
 * samples, and none during a collection (`gc_active_p`).
 *
 * A refill stands for the bytes of the region it retires: the allocation that overflows
 * a region of R bytes is one of s bytes with probability about s / R, so each stack's
 * expected share is its own bytes (regions are often smaller than a page: what is left
 * of one after a collection). The region is the thread's mixed one for `alloc` and its
 * cons one for the list functions (`struct thread`'s mixed_tlab and cons_tlab); a large
 * object stands for itself; the rarer refills for closures and code, for a page. Summed
 * by stack, that is get-bytes-consed's count within sampling error.
 *
 * The stack is read in place: the runtime and Lisp code keep frame pointers ([fp] the
 * caller's frame, [fp + 8] the return address), and the trampoline's frame holds the
 * requested size at [fp + 16]. The walk stays inside the thread's control stack (`struct
 * thread`, from the exported initial-exec TLS variable `current_thread`). Names are
 * resolved at once, inside `alloc`, where the thread is pseudo-atomic (no collection can
 * move or free code): `component_ptr_from_pc` then `debug_function_from_pc` give the
 * names SBCL's backtrace prints, FLET and LABELS included.
 *
 * Releases: the runtime's release string (in its .rodata, read from its file as the
 * census reads it) must be one of `lisp_releases`, SBCL 2.2.9, 2.5.2 and 2.6.4 on x86-64
 * (Debian 12's, 13's and unstable's, as the census in fragscope-census/src/sbcl.rs);
 * another release is left alone, and the recorder is told why (`lisp_unsampled`). From
 * 2.5, `alloc` and `alloc_list` jump to `lisp_alloc`, which takes the lock for every
 * thread region: the region a refill retires is then the one the trampoline's request
 * overflows (`lisp_overflowed_region`).
 *
 * Records (docs/trace-format.md, chunk 22) go to one process-wide log under lisp_lock:
 * every thread's samples in the order they were taken. */

enum { LISP_REC_SAMPLE = 5 };
#define LISP_REGION_BYTES 32768
#define LISP_MAX_FRAMES 64
#define LISP_NAME_CAP 240

/* What the sampler reads of each release (x86-64; the census's RELEASES agree, a test
 * checks it). `struct thread`'s offsets; a region is `struct alloc_region`: free_pointer,
 * end_addr, start_addr. */
static const struct lisp_release {
    const char *version; /* the release string's numbers */
    int control_stack_start, control_stack_end, this;
    int cons_tlab, mixed_tlab, sys_mixed_tlab, sys_cons_tlab; /* sys_*: 0 when none */
    const char *collections; /* the runtime's count of collections */
    int name_from_pc;        /* 1: debug_function_name_from_pc; 0: debug_function_from_pc */
    int package_id_in_header; /* where a symbol keeps its package's id (name_put_symbol) */
} lisp_releases[] = {
    {"2.2.9", 176, 184, 192, 88, 112, 280, 304, "n_gcs", 0, 0},
    {"2.5.2", 176, 184, 192, 88, 112, 296, 320, "n_lisp_gcs", 1, 1},
    {"2.6.4", 176, 184, 192, 88, 112, 304, 328, "n_lisp_gcs", 1, 1},
};
#define LISP_RELEASES (sizeof lisp_releases / sizeof *lisp_releases)
static const struct lisp_release *lisp_release;

/* Tags (genesis/constants.h; the same in every release above). */
#define LISP_LOWTAG_MASK 15
#define LISP_LIST_LOWTAG 7
#define LISP_INSTANCE_LOWTAG 3
#define LISP_OTHER_LOWTAG 15
#define LISP_SYMBOL_WIDETAG 0x2d
#define LISP_CODE_WIDETAG 0x35
#define LISP_BASE_STRING_WIDETAG 0xe1
#define LISP_CHARACTER_STRING_WIDETAG 0xe5

/* The runtime's functions that take free_pages_lock to allocate, and the region each
 * refills: the thread's mixed or cons one, a large object, none of the thread's (closures
 * and code), or the one the request overflows (lisp_alloc, 2.5 on). The lock is learnt
 * from the refill functions' first lock (`learn`): `alloc` up to 2.2.9, `lisp_alloc`
 * after (alloc_code_object takes another lock first). */
enum { LISP_MIXED = 1, LISP_CONS, LISP_LARGE, LISP_NOT_THREADS, LISP_OVERFLOWED };
static struct { const char *name; int region, learn; uintptr_t lo, hi; } lisp_sites[] = {
    {"alloc", LISP_MIXED, 1, 0, 0},
    {"lisp_alloc", LISP_OVERFLOWED, 1, 0, 0},
    {"alloc_list", LISP_CONS, 0, 0, 0},
    {"gc_alloc_large", LISP_LARGE, 0, 0, 0},
    {"make_list", LISP_CONS, 0, 0, 0},
    {"listify_rest_arg", LISP_CONS, 0, 0, 0},
    {"alloc_funinstance", LISP_NOT_THREADS, 0, 0, 0},
    {"alloc_code_object", LISP_NOT_THREADS, 0, 0, 0},
};
#define LISP_SITES (sizeof lisp_sites / sizeof *lisp_sites)

static struct sample_log lisp_log; /* zero-initialised, so in .bss: not in the file */
static pthread_mutex_t lisp_lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_mutex_t *_Atomic lisp_free_pages_lock;
static int lisp_on;
static intptr_t lisp_current_thread_offset; /* of `current_thread` from the thread pointer */
/* gc_active_p is an int up to 2.2.9, a bool after: its first byte says it. */
static volatile unsigned char *lisp_gc_active_p;
static volatile int *lisp_n_gcs;
static uintptr_t *lisp_dynamic_space_start, *lisp_dynamic_space_size;
static uintptr_t *lisp_text_space_start, *lisp_text_space_highwatermark;
static uintptr_t *lisp_package_vector;
static uintptr_t *(*lisp_component_ptr_from_pc)(char *pc);
static uintptr_t *(*lisp_debug_function_from_pc)(uintptr_t *code, void *pc);
static uintptr_t (*lisp_debug_function_name_from_pc)(uintptr_t *code, void *pc);
/* Why an SBCL runtime is not sampled (empty when it is, or is not SBCL). */
static char lisp_unsampled[200];
/* Return address -> frame id, valid while no collection ran since (`n_gcs`): a
 * collection may move code. Under lisp_lock. */
#define LISP_PC_SLOTS 4096
#define LISP_PC_PROBES 8
static struct { uintptr_t pc; int gcs; uint32_t frame; } lisp_pcs[LISP_PC_SLOTS];
/* Code position (`lisp_code_key`) -> frame id, kept across collections. Under lisp_lock. */
#define LISP_CODE_SLOTS 4096
static struct { uint64_t key; uint32_t frame; } lisp_code_frames[LISP_CODE_SLOTS];

static char *lisp_thread(void) {
    return *(char **)((char *)__builtin_thread_pointer() + lisp_current_thread_offset);
}

static int lisp_code_pc(uintptr_t pc) {
    uintptr_t start = *lisp_dynamic_space_start;
    if (pc - start < *lisp_dynamic_space_size) return 1;
    return lisp_text_space_start && pc >= *lisp_text_space_start &&
           pc < *lisp_text_space_highwatermark;
}

/* ---- names ---- */

struct lisp_name {
    char *s;
    int n, cap;
};

static void name_put(struct lisp_name *o, const char *s, size_t n) {
    for (size_t i = 0; i < n && o->n < o->cap; i++) o->s[o->n++] = s[i];
}

/* A simple string's characters (ASCII; others as '?'). */
static void name_put_string(struct lisp_name *o, uintptr_t str) {
    if ((str & LISP_LOWTAG_MASK) != LISP_OTHER_LOWTAG) return;
    const uintptr_t *w = (const uintptr_t *)(str - LISP_OTHER_LOWTAG);
    unsigned widetag = w[0] & 0xff;
    size_t len = w[1] >> 1;
    for (size_t i = 0; i < len && o->n < o->cap; i++) {
        uint32_t c = widetag == LISP_BASE_STRING_WIDETAG        ? ((const uint8_t *)(w + 2))[i]
                     : widetag == LISP_CHARACTER_STRING_WIDETAG ? ((const uint32_t *)(w + 2))[i]
                                                                : '?';
        o->s[o->n++] = c >= 32 && c < 127 ? (char)c : '?';
    }
}

/* A symbol as SBCL prints it from CL-USER, always with "::" outside COMMON-LISP,
 * COMMON-LISP-USER and KEYWORD (telling an external symbol would need the package's
 * tables). Its package is its id in lisp_package_vector: the name slot's top 16 bits up
 * to 2.2.9, the header's bits 8 to 23 after. */
static void name_put_symbol(struct lisp_name *o, const uintptr_t *symbol) {
    uintptr_t name_slot = symbol[5];
    unsigned id;
    if (lisp_release->package_id_in_header) {
        id = (unsigned)(symbol[0] >> 8) & 0xffff;
    } else {
        id = (unsigned)(name_slot >> 48);
        name_slot &= ((uintptr_t)1 << 48) - 1;
    }
    uintptr_t vector = lisp_package_vector ? *lisp_package_vector : 0;
    if (!id) {
        name_put(o, "#:", 2);
    } else if ((vector & LISP_LOWTAG_MASK) == LISP_OTHER_LOWTAG) {
        const uintptr_t *v = (const uintptr_t *)(vector - LISP_OTHER_LOWTAG);
        uintptr_t package = id < (v[1] >> 1) ? v[2 + id] : 0;
        if ((package & LISP_LOWTAG_MASK) == LISP_INSTANCE_LOWTAG) {
            char buf[64];
            struct lisp_name p = {buf, 0, sizeof buf};
            name_put_string(&p, ((const uintptr_t *)(package - LISP_INSTANCE_LOWTAG))[1]);
            if (p.n == 7 && !memcmp(buf, "KEYWORD", 7)) {
                name_put(o, ":", 1);
            } else if (!(p.n == 11 && !memcmp(buf, "COMMON-LISP", 11)) &&
                       !(p.n == 16 && !memcmp(buf, "COMMON-LISP-USER", 16)) && p.n > 0) {
                name_put(o, buf, (size_t)p.n);
                name_put(o, "::", 2);
            }
        }
    }
    name_put_string(o, name_slot);
}

/* NIL, as a list: the cons (NIL . NIL) in its own first two words. No other object
 * a name holds is a cons of itself, and NIL's address changes between releases. */
static int lisp_nil(uintptr_t obj) {
    if ((obj & LISP_LOWTAG_MASK) != LISP_LIST_LOWTAG) return 0;
    const uintptr_t *cell = (const uintptr_t *)(obj - LISP_LIST_LOWTAG);
    return cell[0] == obj && cell[1] == obj;
}

/* A function's name: a symbol, or a list such as (FLET HELPER :IN SEXP->XML). */
static void name_put_object(struct lisp_name *o, uintptr_t obj, int depth) {
    char num[24];
    if (!(obj & 1)) {
        int n = snprintf(num, sizeof num, "%ld", (long)obj >> 1);
        name_put(o, num, n > 0 ? (size_t)n : 0);
    } else if (lisp_nil(obj)) {
        name_put(o, "NIL", 3);
    } else if ((obj & LISP_LOWTAG_MASK) == LISP_LIST_LOWTAG) {
        if (depth > 3) return name_put(o, "(...)", 5);
        name_put(o, "(", 1);
        /* NIL is list-tagged too: it ends the list. */
        for (int k = 0; !lisp_nil(obj) && (obj & LISP_LOWTAG_MASK) == LISP_LIST_LOWTAG &&
                        o->n < o->cap;
             k++) {
            const uintptr_t *cell = (const uintptr_t *)(obj - LISP_LIST_LOWTAG);
            if (k) name_put(o, " ", 1);
            if (k == 8) {
                name_put(o, "...", 3);
                break;
            }
            name_put_object(o, cell[0], depth + 1);
            obj = cell[1];
        }
        name_put(o, ")", 1);
    } else if ((obj & LISP_LOWTAG_MASK) == LISP_OTHER_LOWTAG) {
        const uintptr_t *w = (const uintptr_t *)(obj - LISP_OTHER_LOWTAG);
        unsigned widetag = w[0] & 0xff;
        if (widetag == LISP_SYMBOL_WIDETAG) {
            name_put_symbol(o, w);
        } else if (widetag == LISP_BASE_STRING_WIDETAG ||
                   widetag == LISP_CHARACTER_STRING_WIDETAG) {
            name_put(o, "\"", 1);
            name_put_string(o, obj);
            name_put(o, "\"", 1);
        } else {
            name_put(o, "#<...>", 6);
        }
    } else {
        name_put(o, "#<...>", 6);
    }
}

/* The name of the function at `pc` in `code` (a code object), as SBCL's backtrace prints
 * it; 0 for code without functions (assembly routines: the trampolines). */
static int lisp_function_name(const uintptr_t *code, uintptr_t pc, struct lisp_name *o) {
    /* The code's trailer (its last bytes) counts its functions. */
    const char *end = (const char *)code + (code[0] >> 32) * 8;
    uint16_t trailer = *(const uint16_t *)(end - 2);
    unsigned functions = trailer ? *(const uint16_t *)(end - 4) >> 5 : 0;
    if (!functions) return 0;
    uintptr_t name = 0;
    if (lisp_debug_function_name_from_pc) {
        name = lisp_debug_function_name_from_pc((uintptr_t *)code, (void *)pc);
    } else {
        uintptr_t *debug_fun = lisp_debug_function_from_pc((uintptr_t *)code, (void *)pc);
        if (debug_fun) name = debug_fun[1];
    }
    if (!name) {
        /* The simple-fun the pc is in: the last one that starts before it. */
        const uint32_t *offsets = (const uint32_t *)(end - 4) - 1;
        const char *text = (const char *)code + (uint32_t)code[1];
        unsigned index = 0;
        for (unsigned i = functions; i-- > 0;)
            if ((uintptr_t)(text + offsets[-(int)i]) < pc) {
                index = i;
                break;
            }
        name = code[4 + 4 * index];
    }
    name_put_object(o, name, 0);
    return o->n;
}

/* Where `pc` is in `code`, as a key that no collection changes: the code's serial number
 * (the high half of the first word of its text, unique to each code object) and the
 * offset from its start. 0 when the code has no serial number. */
static uint64_t lisp_code_key(const uintptr_t *code, uintptr_t pc) {
    uint32_t boxed_bytes = (uint32_t)code[1];
    if (!boxed_bytes) return 0;
    uint64_t serial = *(const uint64_t *)((const char *)code + boxed_bytes) >> 32;
    uint64_t offset = pc - (uintptr_t)code;
    return serial && offset >> 32 == 0 ? serial << 32 | offset : 0;
}

/* The slot of `key` in lisp_code_frames: where it is, or where it goes. */
static uint32_t lisp_code_slot(uint64_t key) {
    uint32_t first = (uint32_t)((key * 0x9E3779B97F4A7C15ULL) >> 52) & (LISP_CODE_SLOTS - 1);
    for (uint32_t probe = 0; probe < LISP_PC_PROBES; probe++) {
        uint32_t s = (first + probe) & (LISP_CODE_SLOTS - 1);
        if (lisp_code_frames[s].key == key || !lisp_code_frames[s].key) return s;
    }
    return first; /* full around it: the first is replaced */
}

/* The frame id of a function's code at `pc` (0: not a function's), its name asked of
 * the runtime. */
static uint32_t lisp_named_frame(const uintptr_t *code, uintptr_t pc) {
    char buf[LISP_NAME_CAP];
    struct lisp_name name = {buf, 0, sizeof buf};
    if (!lisp_function_name(code, pc, &name)) return 0;
    /* A frame is its name (code moves; names stay). */
    uint64_t h = 0xCBF29CE484222325ULL;
    for (int i = 0; i < name.n; i++) h = (h ^ (uint8_t)buf[i]) * 0x100000001B3ULL;
    uint32_t slot;
    uint32_t id = log_frame_id(&lisp_log, h, (uint64_t)name.n, &slot);
    if (!id)
        id = log_define_frame(&lisp_log, slot, h, (uint64_t)name.n, 0, "", 0, buf, (size_t)name.n);
    return id;
}

/* The frame id of a return address (0: not a function's). Under lisp_lock. */
static uint32_t lisp_frame_id(uintptr_t ret) {
    int gcs = lisp_n_gcs ? *lisp_n_gcs : 0;
    /* Open addressing over a few slots: two hot return addresses in one slot would
     * otherwise evict each other at every sample (seen: a name resolved twice a sample). A
     * slot of an earlier collection is free. */
    uint32_t first = (uint32_t)((ret * 0x9E3779B97F4A7C15ULL) >> 52) & (LISP_PC_SLOTS - 1);
    uint32_t cached = first;
    for (uint32_t probe = 0; probe < LISP_PC_PROBES; probe++) {
        uint32_t s = (first + probe) & (LISP_PC_SLOTS - 1);
        if (lisp_pcs[s].gcs == gcs && lisp_pcs[s].pc == ret) return lisp_pcs[s].frame;
        if (lisp_pcs[s].gcs != gcs || !lisp_pcs[s].pc) {
            cached = s;
            break;
        }
    }
    /* The return address may be just past the function's last instruction. */
    uintptr_t pc = ret - 1;
    uint32_t id = 0;
    uintptr_t *code = lisp_component_ptr_from_pc((char *)pc);
    if (code && (code[0] & 0xff) == LISP_CODE_WIDETAG) {
        /* After a collection every return address is looked up again, but its code's key
         * finds the name found before: asking the runtime again costs a decompression of
         * the code's whole debug map from 2.5 on (zstd, seen at 3% of a busy job). */
        uint64_t key = lisp_code_key(code, pc);
        uint32_t slot = key ? lisp_code_slot(key) : 0;
        if (key && lisp_code_frames[slot].key == key) {
            id = lisp_code_frames[slot].frame;
        } else {
            id = lisp_named_frame(code, pc);
            if (key && id) lisp_code_frames[slot].key = key, lisp_code_frames[slot].frame = id;
        }
    }
    lisp_pcs[cached].pc = ret;
    lisp_pcs[cached].gcs = gcs;
    lisp_pcs[cached].frame = id;
    return id;
}

/* ---- sampling ---- */

static int lisp_site_of(uintptr_t ret) {
    for (unsigned i = 0; i < LISP_SITES; i++)
        if (ret - lisp_sites[i].lo < lisp_sites[i].hi - lisp_sites[i].lo) return (int)i;
    return -1;
}

/* Bytes of the thread's region at `offset` that a refill retires: free_pointer -
 * start_addr (none open: 0). */
static uint64_t lisp_region_used(const char *thread, int offset) {
    uintptr_t free_pointer = *(const uintptr_t *)(thread + offset);
    uintptr_t start = *(const uintptr_t *)(thread + offset + 16);
    return start && free_pointer >= start ? free_pointer - start : 0;
}

/* The thread region a request of `requested` bytes overflows (its offset), when exactly
 * one open region does; 0 when none or several do. A region some other request filled
 * to within `requested` bytes of its end is rare: the request is a few words, a region
 * up to a page. */
static int lisp_overflowed_region(const char *thread, uint64_t requested) {
    const struct lisp_release *r = lisp_release;
    int candidates[] = {r->mixed_tlab, r->cons_tlab, r->sys_mixed_tlab, r->sys_cons_tlab};
    int found = 0;
    for (unsigned i = 0; i < sizeof candidates / sizeof *candidates; i++) {
        if (!candidates[i]) continue;
        const uintptr_t *region = (const uintptr_t *)(thread + candidates[i]);
        if (region[2] && region[0] + requested > region[1]) {
            if (found) return 0;
            found = candidates[i];
        }
    }
    return found;
}

/* One refill (or large object) by lisp_sites[site]: `fp` is the hook's frame, whose
 * caller is that function. */
static __attribute__((noinline)) void lisp_sample(uintptr_t *fp, int site) {
    const struct lisp_release *r = lisp_release;
    char *thread = lisp_thread();
    if (!thread || *lisp_gc_active_p) return;
    if (*(char **)(thread + r->this) != thread) return;
    uintptr_t lo = *(uintptr_t *)(thread + r->control_stack_start);
    uintptr_t hi = *(uintptr_t *)(thread + r->control_stack_end);
    uintptr_t pcs[LISP_MAX_FRAMES];
    int n = 0;
    uint64_t requested = 0;
    int region = lisp_sites[site].region;
    uintptr_t *f = fp;
    for (int step = 0; step < 4 * LISP_MAX_FRAMES && n < LISP_MAX_FRAMES; step++) {
        if (((uintptr_t)f & 7) || (uintptr_t)f < lo || (uintptr_t)f + 24 > hi) break;
        uintptr_t ret = f[1];
        uintptr_t *next = (uintptr_t *)f[0];
        int lisp = lisp_code_pc(ret);
        if (!n && step > 0 && !lisp && region == LISP_OVERFLOWED) {
            /* lisp_alloc called by a C function that names its region (make_list). */
            int caller = lisp_site_of(ret);
            if (caller >= 0 && lisp_sites[caller].region != LISP_OVERFLOWED)
                region = lisp_sites[caller].region;
        }
        /* The first Lisp return address is a trampoline's, which was asked for the size
         * in its frame. */
        if (!n && lisp && (uintptr_t)next > (uintptr_t)f && (uintptr_t)next + 24 <= hi) {
            uintptr_t size = next[2];
            if (size && size < ((uintptr_t)1 << 40) && !(size & 15)) requested = size;
        }
        if (lisp) pcs[n++] = ret;
        if (next <= f) break;
        f = next;
    }
    uint64_t bytes = requested > LISP_REGION_BYTES ? requested : LISP_REGION_BYTES;
    int offset = region == LISP_MIXED  ? r->mixed_tlab
                 : region == LISP_CONS ? r->cons_tlab
                 : region == LISP_OVERFLOWED && requested ? lisp_overflowed_region(thread, requested)
                                                          : 0;
    if (offset) {
        bytes = lisp_region_used(thread, offset);
    } else if (region == LISP_LARGE && requested) {
        bytes = requested;
    }
    uint32_t ids[LISP_MAX_FRAMES];
    int saved_errno = errno;
    pthread_mutex_lock(&lisp_lock);
    int k = 0;
    for (int i = 0; i < n; i++) {
        uint32_t id = lisp_frame_id(pcs[i]);
        if (id) ids[k++] = id;
    }
    uint32_t stack = k ? log_stack_id(&lisp_log, ids, k) : 0;
    uint8_t *o = log_reserve(&lisp_log, 40);
    if (o) {
        *o++ = LISP_REC_SAMPLE;
        o = put_varint(o, requested);
        o = put_varint(o, bytes);
        o = put_varint(o, stack);
        log_commit(&lisp_log, o);
    }
    pthread_mutex_unlock(&lisp_lock);
    errno = saved_errno;
}

/* The SBCL executable's pthread_mutex_lock. Our own calls of pthread_mutex_lock go
 * through our PLT, to libc's. */
static __attribute__((noinline)) int lisp_mutex_lock(pthread_mutex_t *m) {
    pthread_mutex_t *free_pages = atomic_load_explicit(&lisp_free_pages_lock, memory_order_relaxed);
    if ((free_pages && m != free_pages) || (tls_flags & TF_FORWARD)) return pthread_mutex_lock(m);
    int site = lisp_site_of((uintptr_t)__builtin_return_address(0));
    if (site < 0) return pthread_mutex_lock(m);
    if (!free_pages) {
        if (!lisp_sites[site].learn) return pthread_mutex_lock(m);
        pthread_mutex_t *none = NULL;
        atomic_compare_exchange_strong(&lisp_free_pages_lock, &none, m);
        if (atomic_load(&lisp_free_pages_lock) != m) return pthread_mutex_lock(m);
    }
    tls_flags |= TF_FORWARD;
    lisp_sample(__builtin_frame_address(0), site);
    tls_flags &= ~TF_FORWARD;
    return pthread_mutex_lock(m);
}

static void *lisp_replacement(const char *name) {
    return strcmp(name, "pthread_mutex_lock") ? NULL : (void *)lisp_mutex_lock;
}

static void lisp_tell_unsampled(void) {
    if (tracing) log_tell_unsampled(&lisp_log, MSG_LISP, lisp_unsampled, sizeof lisp_unsampled);
}

/* Whether `s` (n bytes) reads as a release, "2.5.2.debian": three numbers of up to four
 * digits, then nothing or a dot and up to 32 of [A-Za-z0-9._+-~]. The census's
 * release_string (fragscope-census/src/sbcl.rs) takes the same strings. */
static int lisp_release_like(const char *s, size_t n) {
    size_t i = 0;
    for (int part = 0; part < 3; part++) {
        size_t digits = 0;
        while (i < n && s[i] >= '0' && s[i] <= '9') i++, digits++;
        if (!digits || digits > 4) return 0;
        if (part < 2 && (i >= n || s[i++] != '.')) return 0;
    }
    if (i == n) return 1;
    if (s[i++] != '.' || n - i == 0 || n - i > 32) return 0;
    for (; i < n; i++) {
        char c = s[i];
        int ok = (c >= '0' && c <= '9') || (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') ||
                 strchr("._+-~", c);
        if (!ok) return 0;
    }
    return 1;
}

/* The release string in the .rodata of the ELF file `path` (the one string that reads as
 * a release; two different ones are none), into `out`. 0 when there is none. */
static int lisp_read_release(const char *path, char *out, size_t cap) {
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return 0;
    off_t size = lseek(fd, 0, SEEK_END);
    const char *file = size > (off_t)sizeof(ElfW(Ehdr))
                           ? mmap(NULL, (size_t)size, PROT_READ, MAP_PRIVATE, fd, 0)
                           : MAP_FAILED;
    close(fd);
    if (file == MAP_FAILED) return 0;
    int found = 0;
    const ElfW(Ehdr) *eh = (const void *)file;
    size_t shdrs_end = eh->e_shoff + (size_t)eh->e_shnum * sizeof(ElfW(Shdr));
    if (!memcmp(eh->e_ident, ELFMAG, SELFMAG) && eh->e_shentsize == sizeof(ElfW(Shdr)) &&
        eh->e_shstrndx < eh->e_shnum && shdrs_end <= (size_t)size) {
        const ElfW(Shdr) *sh = (const void *)(file + eh->e_shoff);
        const ElfW(Shdr) *names = &sh[eh->e_shstrndx];
        for (unsigned k = 0; k < eh->e_shnum && found >= 0; k++) {
            if (names->sh_offset + names->sh_size > (size_t)size || sh[k].sh_name >= names->sh_size ||
                strncmp(file + names->sh_offset + sh[k].sh_name, ".rodata",
                        names->sh_size - sh[k].sh_name) ||
                sh[k].sh_offset + sh[k].sh_size > (size_t)size)
                continue;
            const char *p = file + sh[k].sh_offset, *end = p + sh[k].sh_size;
            while (p < end && found >= 0) {
                const char *z = memchr(p, 0, (size_t)(end - p));
                size_t n = (size_t)((z ? z : end) - p);
                if (lisp_release_like(p, n)) {
                    if (found && (strlen(out) != n || memcmp(out, p, n))) found = -1;
                    else if (n < cap) memcpy(out, p, n), out[n] = 0, found = 1;
                }
                p += n + 1;
            }
        }
    }
    munmap((void *)file, (size_t)size);
    return found > 0;
}

/* The release of the runtime holding `symbol`, from `lisp_releases`; else NULL, and
 * lisp_unsampled says why. */
static const struct lisp_release *lisp_recognise(void *symbol) {
    /* The executable is named as it was run ("sbcl"); a library by its path. */
    Dl_info d;
    const char *path = dladdr(symbol, &d) && d.dli_fname && strchr(d.dli_fname, '/')
                           ? d.dli_fname
                           : "/proc/self/exe";
    char release[48] = "";
    if (!lisp_read_release(path, release, sizeof release)) {
        snprintf(lisp_unsampled, sizeof lisp_unsampled,
                 "the SBCL runtime %s names no release the sampler can read", path);
        return NULL;
    }
    for (unsigned i = 0; i < LISP_RELEASES; i++) {
        size_t n = strlen(lisp_releases[i].version);
        if (!strncmp(release, lisp_releases[i].version, n) &&
            (release[n] == 0 || release[n] == '.'))
            return &lisp_releases[i];
    }
    snprintf(lisp_unsampled, sizeof lisp_unsampled,
             "the sampler reads the frames of SBCL %s, %s and %s, not %s's",
             lisp_releases[0].version, lisp_releases[1].version, lisp_releases[2].version,
             release);
    return NULL;
}

/* At start: is this an SBCL runtime of a release the sampler reads? If so, its locks are
 * rebound; if it is of another, the recorder is told why not. */
static void lisp_detect(void) {
    void *profiler = dlsym(RTLD_DEFAULT, "gencgc_alloc_profiler");
    if (!stacks_mode || !profiler) return;
    lisp_release = lisp_recognise(profiler);
    if (!lisp_release) {
        lisp_tell_unsampled();
        return;
    }
    /* The mark-region collector (a build option from 2.3.x) keeps its own regions: the
     * census refuses it too (fragscope-census/src/sbcl.rs). */
    if (dlsym(RTLD_DEFAULT, "line_bytemap") || dlsym(RTLD_DEFAULT, "allocation_bitmap")) {
        snprintf(lisp_unsampled, sizeof lisp_unsampled,
                 "this SBCL %s is built with the mark-region collector, not gencgc, whose "
                 "allocation regions the sampler reads", lisp_release->version);
        lisp_release = NULL;
        lisp_tell_unsampled();
        return;
    }
    for (unsigned i = 0; i < LISP_SITES; i++) {
        void *f = dlsym(RTLD_DEFAULT, lisp_sites[i].name);
        Dl_info d;
        const ElfW(Sym) *sym = NULL;
        if (f && dladdr1(f, &d, (void **)&sym, RTLD_DL_SYMENT) && sym && sym->st_size) {
            lisp_sites[i].lo = (uintptr_t)f;
            lisp_sites[i].hi = (uintptr_t)f + sym->st_size;
        }
    }
    void *current_thread = dlsym(RTLD_DEFAULT, "current_thread");
    lisp_gc_active_p = dlsym(RTLD_DEFAULT, "gc_active_p");
    lisp_n_gcs = dlsym(RTLD_DEFAULT, lisp_release->collections);
    lisp_dynamic_space_start = dlsym(RTLD_DEFAULT, "DYNAMIC_SPACE_START");
    lisp_dynamic_space_size = dlsym(RTLD_DEFAULT, "dynamic_space_size");
    lisp_text_space_start = dlsym(RTLD_DEFAULT, "TEXT_SPACE_START");
    lisp_text_space_highwatermark = dlsym(RTLD_DEFAULT, "text_space_highwatermark");
    lisp_package_vector = dlsym(RTLD_DEFAULT, "lisp_package_vector");
    lisp_component_ptr_from_pc = dlsym(RTLD_DEFAULT, "component_ptr_from_pc");
    if (lisp_release->name_from_pc)
        lisp_debug_function_name_from_pc = dlsym(RTLD_DEFAULT, "debug_function_name_from_pc");
    else
        lisp_debug_function_from_pc = dlsym(RTLD_DEFAULT, "debug_function_from_pc");
    int learnt = 0;
    for (unsigned i = 0; i < LISP_SITES; i++) learnt |= lisp_sites[i].learn && lisp_sites[i].lo;
    const char *missing =
        !learnt                         ? "alloc or lisp_alloc"
        : !current_thread               ? "current_thread"
        : !lisp_gc_active_p             ? "gc_active_p"
        : !lisp_n_gcs                   ? lisp_release->collections
        : !lisp_dynamic_space_start     ? "DYNAMIC_SPACE_START"
        : !lisp_dynamic_space_size      ? "dynamic_space_size"
        : !lisp_component_ptr_from_pc   ? "component_ptr_from_pc"
        : !lisp_debug_function_from_pc && !lisp_debug_function_name_from_pc
            ? "debug_function_name_from_pc"
        : !lisp_text_space_start != !lisp_text_space_highwatermark ? "text_space_highwatermark"
                                                                   : NULL;
    if (missing) {
        snprintf(lisp_unsampled, sizeof lisp_unsampled,
                 "this SBCL %s runtime does not export %s, which the sampler reads",
                 lisp_release->version, missing);
        lisp_tell_unsampled();
        return;
    }
    /* An initial-exec TLS variable of the executable: dlsym gives this thread's
     * instance, at the same offset from every thread's pointer. Not referenced as an
     * extern __thread, which would keep the library out of every other program. */
    lisp_current_thread_offset = (char *)current_thread - (char *)__builtin_thread_pointer();
    lisp_log.msg_type = MSG_LISP;
    lisp_log.mean_bytes = LISP_REGION_BYTES;
    lisp_on = 1;
    struct rebinding how = {lisp_replacement, (uintptr_t)profiler};
    pthread_mutex_lock(&patch_lock);
    dl_iterate_phdr(patch_object, &how);
    pthread_mutex_unlock(&patch_lock);
}

static void lisp_flush(void) {
    if (!lisp_on) return;
    pthread_mutex_lock(&lisp_lock);
    log_flush(&lisp_log);
    pthread_mutex_unlock(&lisp_lock);
}

/* A forked child's records not sent yet are the parent's to send. */
static void lisp_after_fork(void) {
    pthread_mutex_init(&lisp_lock, NULL);
    lisp_log.len = 0;
}
