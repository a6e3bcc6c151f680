/* For executables linked against glibc 2.28's stubs (scripts/manylinux/glibc_floor.sh,
 * GLIBC_FLOOR_EXE_LDFLAGS, which wraps __libc_start_main with this).
 *
 * glibc 2.34's Scrt1.o calls __libc_start_main with init = NULL: from 2.34 on, libc runs the
 * executable's constructors (DT_INIT, DT_INIT_ARRAY) itself when init is NULL. Bound to the only
 * version 2.28 has (GLIBC_2.2.5), an older glibc runs `init` if it is not NULL and nothing
 * otherwise, so the executable's static constructors never ran there (a global std::string
 * stayed null in Debian 11; the shared libraries' run, by the dynamic linker). This passes what
 * libc_nonshared.a's __libc_csu_init did before 2.34. A glibc >= 2.34 calls a non-NULL init
 * instead of its own walk ("a legacy program"), so the constructors run once on either.
 * The preinit array is the dynamic linker's on every version.
 */
#include <stddef.h>

#define HIDDEN __attribute__((visibility("hidden")))

typedef int (*main_fn)(int, char**, char**);
typedef void (*init_fn)(int, char**, char**);

extern init_fn __init_array_start[] HIDDEN;  /* the linker's, for executables */
extern init_fn __init_array_end[] HIDDEN;
extern void _init(void);                     /* crti.o */

static void csu_init(int argc, char** argv, char** envp) {
  _init();
  size_t n = (size_t)(__init_array_end - __init_array_start);
  for (size_t i = 0; i < n; i++) __init_array_start[i](argc, argv, envp);
}

extern int __real___libc_start_main(main_fn, int, char**, init_fn, void (*)(void), void (*)(void), void*);

HIDDEN int __wrap___libc_start_main(main_fn main, int argc, char** argv, init_fn init, void (*fini)(void),
                                    void (*rtld_fini)(void), void* stack_end) {
  return __real___libc_start_main(main, argc, argv, init ? init : csu_init, fini, rtld_fini, stack_end);
}
