/* Every function fragscope's interposer replaces, named once.
 *
 * ALLOC_HOOK(name, kind, ret, params, args): a malloc-family function. `kind` is its
 * event kind in the trace (docs/trace-format.md, "Event records"); the kinds here and
 * `EventKind` in crates/fragscope-trace/src/event.rs must agree.
 *
 * Adding a hook: one line here, its body in fragscope_preload.c. */
#ifndef FRAGSCOPE_HOOKS_H
#define FRAGSCOPE_HOOKS_H

#define FRAGSCOPE_ALLOC_HOOKS(X)                                                              \
    X(malloc, 0, void *, (size_t size), (size))                                               \
    X(calloc, 1, void *, (size_t nmemb, size_t size), (nmemb, size))                          \
    X(realloc, 2, void *, (void *ptr, size_t size), (ptr, size))                              \
    X(reallocarray, 3, void *, (void *ptr, size_t nmemb, size_t size), (ptr, nmemb, size))    \
    X(posix_memalign, 4, int, (void **out, size_t align, size_t size), (out, align, size))    \
    X(aligned_alloc, 5, void *, (size_t align, size_t size), (align, size))                   \
    X(memalign, 6, void *, (size_t align, size_t size), (align, size))                        \
    X(valloc, 7, void *, (size_t size), (size))                                               \
    X(pvalloc, 8, void *, (size_t size), (size))                                              \
    X(free, 9, void, (void *ptr), (ptr))

/* Functions hooked to keep tracing alive, not recorded as events: process lifetime
 * (exec, exit), the trace connection's file descriptor (close, dup2, ...), pthread_join,
 * whose order the merge needs (a JOINED record), and pthread_create and pthread_join
 * again, where glibc frees the unwinder's thread-local storage. The
 * variadic execl, execlp and execle are hooked too (glibc's call execve internally, out
 * of reach), and so is __libc_start_main, to learn the status main returns; neither
 * shape fits this list. */
#define FRAGSCOPE_SYSTEM_HOOKS(X)                                                             \
    X(execve, int, (const char *path, char *const argv[], char *const envp[]))                \
    X(execv, int, (const char *path, char *const argv[]))                                     \
    X(execvp, int, (const char *file, char *const argv[]))                                    \
    X(execvpe, int, (const char *file, char *const argv[], char *const envp[]))               \
    X(posix_spawn, int, (pid_t *pid, const char *path, const posix_spawn_file_actions_t *fa,  \
                         const posix_spawnattr_t *attr, char *const argv[], char *const envp[])) \
    X(posix_spawnp, int, (pid_t *pid, const char *file, const posix_spawn_file_actions_t *fa, \
                          const posix_spawnattr_t *attr, char *const argv[], char *const envp[])) \
    X(_exit, void, (int status))                                                              \
    X(_Exit, void, (int status))                                                              \
    X(exit, void, (int status))                                                               \
    X(quick_exit, void, (int status))                                                         \
    X(close, int, (int fd))                                                                   \
    X(close_range, int, (unsigned first, unsigned last, int flags))                           \
    X(closefrom, void, (int lowfd))                                                           \
    X(dup2, int, (int oldfd, int newfd))                                                      \
    X(dup3, int, (int oldfd, int newfd, int flags))                                           \
    X(dlopen, void *, (const char *file, int mode))                                           \
    X(dlclose, int, (void *handle))                                                           \
    X(pthread_join, int, (pthread_t thread, void **retval))                                   \
    X(pthread_create, int, (pthread_t *thread, const pthread_attr_t *attr,                    \
                            void *(*start)(void *), void *arg))

/* C++ operators new and delete (Itanium ABI names). libstdc++'s call malloc and free,
 * but an allocator that defines them itself (jemalloc, tcmalloc) serves them without
 * either: they are recorded as malloc (aligned_alloc for the aligned forms) and free.
 * X(symbol, shape): the shapes are the parameter lists, CXX_SHAPE_* in the .c file. */
#define FRAGSCOPE_CXX_HOOKS(X)                                                                \
    X(_Znwm, NEW)                                                                             \
    X(_Znam, NEW)                                                                             \
    X(_ZnwmRKSt9nothrow_t, NEW_NOTHROW)                                                       \
    X(_ZnamRKSt9nothrow_t, NEW_NOTHROW)                                                       \
    X(_ZnwmSt11align_val_t, NEW_ALIGNED)                                                      \
    X(_ZnamSt11align_val_t, NEW_ALIGNED)                                                      \
    X(_ZnwmSt11align_val_tRKSt9nothrow_t, NEW_ALIGNED_NOTHROW)                                \
    X(_ZnamSt11align_val_tRKSt9nothrow_t, NEW_ALIGNED_NOTHROW)                                \
    X(_ZdlPv, DELETE)                                                                         \
    X(_ZdaPv, DELETE)                                                                         \
    X(_ZdlPvm, DELETE_SIZED)                                                                  \
    X(_ZdaPvm, DELETE_SIZED)                                                                  \
    X(_ZdlPvRKSt9nothrow_t, DELETE_NOTHROW)                                                   \
    X(_ZdaPvRKSt9nothrow_t, DELETE_NOTHROW)                                                   \
    X(_ZdlPvSt11align_val_t, DELETE_ALIGNED)                                                  \
    X(_ZdaPvSt11align_val_t, DELETE_ALIGNED)                                                  \
    X(_ZdlPvmSt11align_val_t, DELETE_SIZED_ALIGNED)                                           \
    X(_ZdaPvmSt11align_val_t, DELETE_SIZED_ALIGNED)                                           \
    X(_ZdlPvSt11align_val_tRKSt9nothrow_t, DELETE_ALIGNED_NOTHROW)                            \
    X(_ZdaPvSt11align_val_tRKSt9nothrow_t, DELETE_ALIGNED_NOTHROW)

#endif
