/* Loaded into a process that is already running (`fragscope record -p PID`).
 *
 * The recorder makes one of the process's threads call dlopen on this library
 * (src/attach.rs). Nothing was preloaded, so the program's calls are already bound to the
 * allocator: fragscope_rebind (called next, the process stopped around the recorder's
 * reading of its heap) rebinds them by rewriting the slots of every loaded object's
 * global offset table that name a hooked function (JUMP_SLOT and GLOB_DAT relocations),
 * as a preload would have bound them, and does so again for each object dlopen loads
 * later. The process's environment cannot be changed, so the settings a preloaded
 * interposer reads from it come from attach.conf beside this library. fragscope_detach,
 * called the same way, puts every slot back, sends what the threads buffered and says
 * goodbye; the library stays loaded, inert (unloading it could pull code from under a
 * thread still inside a hook). Included by fragscope_preload.c. */

static char attach_conf[4096];
static uintptr_t self_base; /* where this library is loaded, when injected */
static size_t attach_conf_len;

/* Reads attach.conf beside this library when the environment names no recorder: a
 * library that was preloaded has FRAGSCOPE_SOCK, one that was injected has the file. */
static void attach_detect(void) {
    if (getenv("FRAGSCOPE_SOCK")) return;
    Dl_info self;
    if (!dladdr((void *)&attach_detect, &self) || !self.dli_fname) return;
    self_base = (uintptr_t)self.dli_fbase;
    char path[4096];
    const char *slash = strrchr(self.dli_fname, '/');
    size_t dir = slash ? (size_t)(slash - self.dli_fname) : 0;
    if (dir + sizeof "/attach.conf" > sizeof path) return;
    memcpy(path, self.dli_fname, dir);
    memcpy(path + dir, "/attach.conf", sizeof "/attach.conf");
    ssize_t n = read_file(path, attach_conf, sizeof attach_conf - 1);
    if (n <= 0) return;
    /* NAME=value lines, each made a string of its own. */
    for (ssize_t i = 0; i < n; i++)
        if (attach_conf[i] == '\n') attach_conf[i] = 0;
    attach_conf[n] = 0;
    attach_conf_len = (size_t)n;
    attached = 1;
}

/* A setting: from the environment when preloaded, from attach.conf when injected. */
static const char *setting(const char *name) {
    if (!attached) return getenv(name);
    size_t n = strlen(name);
    for (size_t i = 0; i < attach_conf_len; i += strlen(attach_conf + i) + 1)
        if (!strncmp(attach_conf + i, name, n) && attach_conf[i + n] == '=')
            return attach_conf + i + n + 1;
    return NULL;
}

struct definition_query {
    const char *name;
    void *found;
};

/* The first loaded library (in load order, which is the global scope's) that defines
 * `name` itself. */
static int find_definition(struct dl_phdr_info *info, size_t size, void *data) {
    (void)size;
    struct definition_query *q = data;
    const char *obj = info->dlpi_name;
    if (!obj || !*obj || strstr(obj, "linux-vdso") || (uintptr_t)info->dlpi_addr == self_base)
        return 0;
    void *h = dlopen(obj, RTLD_LAZY | RTLD_NOLOAD);
    if (!h) return 0;
    void *f = dlsym(h, q->name);
    Dl_info d;
    if (f && dladdr(f, &d) && (uintptr_t)d.dli_fbase == (uintptr_t)info->dlpi_addr) q->found = f;
    dlclose(h);
    return q->found != NULL;
}

/* Where the real functions are: after this library when preloaded (RTLD_NEXT); when
 * injected, where the program's own calls went: the first definition in the global
 * scope (jemalloc's malloc for a program linked with it, not libc's). An executable
 * that takes a function's address (a non-PIE python3 takes malloc's) exports a
 * "canonical" PLT entry for it, which dlsym returns and which jumps through the slot we
 * rebind: the definition is then looked for in the libraries. */
static void *real_symbol(const char *name) {
    if (!attached) return dlsym(RTLD_NEXT, name);
    void *f = dlsym(RTLD_DEFAULT, name);
    if (!f) return NULL;
    Dl_info d;
    const ElfW(Sym) *sym = NULL;
    if (dladdr1(f, &d, (void **)&sym, RTLD_DL_SYMENT) && sym && d.dli_saddr == f &&
        sym->st_shndx != SHN_UNDEF)
        return f;
    struct definition_query q = {name, NULL};
    dl_iterate_phdr(find_definition, &q);
    return q.found;
}

/* ---- rebinding the program's calls ---- */

/* The functions rebound: the malloc family, C++'s operators, and what keeps a recording
 * whole (threads, the memory map, our descriptor, the exit). Not exec: the next image
 * would start without the interposer, and its recording ends with this one's. */
#define ATTACH_NAME(name, ...) #name,
#define ATTACH_CXX_NAME(sym, shape) #sym,
static const char *const attach_names[] = {
    FRAGSCOPE_ALLOC_HOOKS(ATTACH_NAME) FRAGSCOPE_CXX_HOOKS(ATTACH_CXX_NAME)
    "pthread_create", "pthread_join", "dlopen", "dlclose", "close", "close_range", "closefrom",
    "dup2", "dup3", "exit", "_exit", "_Exit", "quick_exit",
};
#define ATTACH_HOOKS (sizeof attach_names / sizeof *attach_names)
/* Our definitions of them: looked up in this library itself (a plain reference from
 * here would find the program's, the global scope coming first). */
static void *attach_ours[ATTACH_HOOKS];

struct got_patch {
    void **slot;
    void *was;
    uintptr_t relro_lo, relro_hi; /* the read-only-after-relocation range holding it */
};
#define MAX_GOT_PATCHES 8192
static struct got_patch got_patches[MAX_GOT_PATCHES];
static unsigned got_patch_count;
static unsigned got_patches_dropped;
static pthread_mutex_t patch_lock = PTHREAD_MUTEX_INITIALIZER;

/* Writes a slot, opening its page for the write if relocation made it read-only. */
static void write_slot(void **slot, void *value, uintptr_t relro_lo, uintptr_t relro_hi) {
    uintptr_t s = (uintptr_t)slot;
    int ro = s >= relro_lo && s < relro_hi;
    uintptr_t page = s & ~(uintptr_t)4095;
    if (ro && mprotect((void *)page, 4096, PROT_READ | PROT_WRITE) != 0) return;
    __atomic_store_n(slot, value, __ATOMIC_RELEASE);
    if (ro) mprotect((void *)page, 4096, PROT_READ);
}

static int hook_index(const char *name) {
    for (unsigned i = 0; i < ATTACH_HOOKS; i++)
        if (!strcmp(attach_names[i], name)) return (int)i;
    return -1;
}

/* Frees are rebound in a pass before the rest, and put back after them: while only
 * allocations were rebound, a block recorded as allocated could be freed unrecorded and
 * its address handed out again, recorded, as if it were still live. */
static int frees_block(const char *name) {
    return !strcmp(name, "free") || !strncmp(name, "_Zdl", 4) || !strncmp(name, "_Zda", 4);
}
static int rebinding_frees; /* the pass under way */

/* Ours for `name` in the pass under way, else NULL. */
static void *attach_replacement(const char *name) {
    if (frees_block(name) != rebinding_frees) return NULL;
    int h = hook_index(name);
    return h < 0 ? NULL : attach_ours[h];
}

/* A dynamic section's address: glibc relocates most entries in place, the vDSO's are not. */
static uintptr_t dyn_addr(uintptr_t base, uintptr_t v) { return v < base ? v + base : v; }

/* What a rebinding pass rewrites: the slots naming a function `replacement` has a
 * definition of ours for (NULL: left alone), in every object, or only in the one that
 * holds `only_holding` (not 0). */
struct rebinding {
    void *(*replacement)(const char *name);
    uintptr_t only_holding;
};

static void patch_relocations(uintptr_t base, const ElfW(Rela) *rel, size_t bytes,
                              const ElfW(Sym) *symtab, const char *strtab, uintptr_t relro_lo,
                              uintptr_t relro_hi, const struct rebinding *how) {
    for (size_t i = 0; i < bytes / sizeof *rel; i++) {
        unsigned type = ELF64_R_TYPE(rel[i].r_info);
        if (type != R_X86_64_JUMP_SLOT && type != R_X86_64_GLOB_DAT) continue;
        size_t sym = ELF64_R_SYM(rel[i].r_info);
        if (!sym) continue;
        void *ours = how->replacement(strtab + symtab[sym].st_name);
        if (!ours) continue;
        void **slot = (void **)(base + rel[i].r_offset);
        void *now = __atomic_load_n(slot, __ATOMIC_ACQUIRE);
        if (now == ours) continue;
        if (got_patch_count == MAX_GOT_PATCHES) {
            got_patches_dropped++;
            continue;
        }
        got_patches[got_patch_count++] = (struct got_patch){slot, now, relro_lo, relro_hi};
        write_slot(slot, ours, relro_lo, relro_hi);
    }
}

/* dl_iterate_phdr's callback: rewrites one object's slots as `data` (a struct rebinding)
 * says. The caller holds patch_lock. */
static int patch_object(struct dl_phdr_info *info, size_t size, void *data) {
    (void)size;
    const struct rebinding *how = data;
    uintptr_t base = info->dlpi_addr;
    const char *name = info->dlpi_name ? info->dlpi_name : "";
    /* Not ours, not the vDSO, not the dynamic loader (its own minimal malloc). */
    if (base == self_base || strstr(name, "linux-vdso") || strstr(name, "/ld-linux")) return 0;
    const ElfW(Dyn) *dyn = NULL;
    uintptr_t relro_lo = 0, relro_hi = 0;
    int holds = !how->only_holding;
    for (int i = 0; i < info->dlpi_phnum; i++) {
        const ElfW(Phdr) *ph = &info->dlpi_phdr[i];
        if (ph->p_type == PT_DYNAMIC) dyn = (const ElfW(Dyn) *)(base + ph->p_vaddr);
        if (ph->p_type == PT_GNU_RELRO) {
            relro_lo = (base + ph->p_vaddr) & ~(uintptr_t)4095;
            relro_hi = (base + ph->p_vaddr + ph->p_memsz + 4095) & ~(uintptr_t)4095;
        }
        if (ph->p_type == PT_LOAD && how->only_holding - (base + ph->p_vaddr) < ph->p_memsz)
            holds = 1;
    }
    if (!dyn || !holds) return 0;
    const ElfW(Sym) *symtab = NULL;
    const char *strtab = NULL;
    const ElfW(Rela) *jmprel = NULL, *rela = NULL;
    size_t jmprel_bytes = 0, rela_bytes = 0;
    for (const ElfW(Dyn) *d = dyn; d->d_tag != DT_NULL; d++) {
        switch (d->d_tag) {
        case DT_SYMTAB: symtab = (const ElfW(Sym) *)dyn_addr(base, d->d_un.d_ptr); break;
        case DT_STRTAB: strtab = (const char *)dyn_addr(base, d->d_un.d_ptr); break;
        case DT_JMPREL: jmprel = (const ElfW(Rela) *)dyn_addr(base, d->d_un.d_ptr); break;
        case DT_PLTRELSZ: jmprel_bytes = d->d_un.d_val; break;
        case DT_RELA: rela = (const ElfW(Rela) *)dyn_addr(base, d->d_un.d_ptr); break;
        case DT_RELASZ: rela_bytes = d->d_un.d_val; break;
        }
    }
    if (!symtab || !strtab) return 0;
    if (jmprel)
        patch_relocations(base, jmprel, jmprel_bytes, symtab, strtab, relro_lo, relro_hi, how);
    if (rela) patch_relocations(base, rela, rela_bytes, symtab, strtab, relro_lo, relro_hi, how);
    return 0;
}

/* Rebinds every loaded object's calls to the hooks (again after a dlopen: slots already
 * ours are left alone). */
static void attach_rebind(void) {
    if (!attached || !tracing) return;
    struct rebinding how = {attach_replacement, 0};
    pthread_mutex_lock(&patch_lock);
    for (rebinding_frees = 1; rebinding_frees >= 0; rebinding_frees--)
        dl_iterate_phdr(patch_object, &how);
    pthread_mutex_unlock(&patch_lock);
}

/* The constructor's part when injected: our definitions, and ordering on. The calls are
 * rebound by fragscope_rebind, which the recorder calls once it has read the heap, with
 * the process stopped in between. */
static void attach_start(void) {
    if (!attached || !tracing) return;
    Dl_info self;
    if (!dladdr((void *)&attach_start, &self)) return;
    self_base = (uintptr_t)self.dli_fbase;
    void *handle = real_dlopen ? real_dlopen(self.dli_fname, RTLD_LAZY | RTLD_NOLOAD) : NULL;
    if (!handle) return;
    for (unsigned i = 0; i < ATTACH_HOOKS; i++) attach_ours[i] = dlsym(handle, attach_names[i]);
    /* Its threads run already: every free takes an order value from the first call on. */
    order_calls();
}

/* The borrowed thread may have been stopped inside a hook of ours holding `m` (a send
 * under sock_lock, a rebind under patch_lock): taking it again would never return.
 * Waits a second for it; 0 when it is free (and left unlocked). */
static int lock_is_free(pthread_mutex_t *m) {
    struct timespec until;
    clock_gettime(CLOCK_REALTIME, &until);
    until.tv_sec += 1;
    if (pthread_mutex_timedlock(m, &until) != 0) return -1;
    pthread_mutex_unlock(m);
    return 0;
}
#define BORROWED_THREAD_BUSY (-2) /* the recorder tries another thread */

/* Called by the recorder (as dlopen was) while the rest of the process is stopped, right
 * after it read the heap: from here on every call is recorded. Returns the slots rebound,
 * or -1 when this library is not recording. */
EXPORT int fragscope_rebind(void) {
    if (!attached || !tracing) return -1;
    if (lock_is_free(&patch_lock) != 0) return BORROWED_THREAD_BUSY;
    tls_flags |= TF_FORWARD;
    attach_rebind();
    tls_flags &= ~TF_FORWARD;
    return (int)got_patch_count;
}

/* Called by the recorder (through the same injected call as dlopen) to end the recording
 * and leave the process as it was: every slot back to what it held, the threads' buffers
 * and a last snapshot (the exit message, marked as a detach), then our connection closed.
 * Returns the slots restored, or -1 when this library is not recording. */
EXPORT int fragscope_detach(void) {
    if (!attached || !tracing) return -1;
    if (lock_is_free(&patch_lock) != 0 || lock_is_free(&sock_lock) != 0 ||
        lock_is_free(&registry_lock) != 0 || (tls_flags & (TF_BUSY | TF_FORWARD)))
        return BORROWED_THREAD_BUSY;
    tls_flags |= TF_FORWARD;
    pthread_mutex_lock(&patch_lock);
    for (unsigned i = got_patch_count; i-- > 0;) {
        struct got_patch *p = &got_patches[i];
        write_slot(p->slot, p->was, p->relro_lo, p->relro_hi);
    }
    int restored = (int)got_patch_count;
    got_patch_count = 0;
    pthread_mutex_unlock(&patch_lock);
    /* Calls made from now on through a pointer taken while rebound reach a hook that
     * forwards them; a call inside a hook finishes its record, which the copies sent with
     * the exit message hold if it was in time. */
    send_exit(0, EXIT_VIA_DETACH);
    tracing = 0;
    pthread_mutex_lock(&sock_lock);
    syscall(SYS_close, sock_fd);
    sock_fd = -1;
    pthread_mutex_unlock(&sock_lock);
    /* The buffers' pages go back to the system; the states stay mapped for a thread that
     * may still be inside a hook. */
    pthread_mutex_lock(&registry_lock);
    for (struct thread_state *r = registry; r; r = r->next_in_registry)
        madvise(r->buf, sizeof r->buf, MADV_DONTNEED);
    pthread_mutex_unlock(&registry_lock);
    tls_flags &= ~TF_FORWARD;
    return restored;
}
