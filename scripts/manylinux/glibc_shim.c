/* What glibc 2.36's headers and GCC 12's libstdc++ expect of the C library, for objects linked
 * against glibc 2.28 (scripts/manylinux/glibc_floor.sh). Each definition is hidden: it serves the
 * shared object it is linked into and nothing else in the process. Added one by one, as a link
 * with -z defs named what was missing.
 */
#define _GNU_SOURCE
#define _LARGEFILE64_SOURCE
#include <stddef.h>
#include <stdint.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <sys/types.h>

#define HIDDEN __attribute__((visibility("hidden")))

/* glibc 2.32: libstdc++ skips atomic reference counts while the process has one thread. 0 says
 * "maybe more than one": always atomic, correct everywhere, a little slower. */
HIDDEN char __libc_single_threaded = 0;

/* Before glibc 2.33 the stat family were libc_nonshared.a's wrappers of __xstat and friends
 * (version 1 of struct stat on x86-64, the only one); 2.33's headers call the functions. */
extern int __xstat(int, const char*, struct stat*);
extern int __lxstat(int, const char*, struct stat*);
extern int __fxstat(int, int, struct stat*);
extern int __fxstatat(int, int, const char*, struct stat*, int);
extern int __xstat64(int, const char*, struct stat64*);
extern int __lxstat64(int, const char*, struct stat64*);
extern int __fxstat64(int, int, struct stat64*);
HIDDEN int stat(const char* p, struct stat* s) { return __xstat(1, p, s); }
HIDDEN int lstat(const char* p, struct stat* s) { return __lxstat(1, p, s); }
HIDDEN int fstat(int fd, struct stat* s) { return __fxstat(1, fd, s); }
HIDDEN int fstatat(int dir, const char* p, struct stat* s, int flags) { return __fxstatat(1, dir, p, s, flags); }
HIDDEN int stat64(const char* p, struct stat64* s) { return __xstat64(1, p, s); }
HIDDEN int lstat64(const char* p, struct stat64* s) { return __lxstat64(1, p, s); }
HIDDEN int fstat64(int fd, struct stat64* s) { return __fxstat64(1, fd, s); }

/* libc_nonshared.a's atexit: registered against this object's __dso_handle. */
extern int __cxa_atexit(void (*)(void*), void*, void*);
extern void* __dso_handle;
HIDDEN int atexit(void (*f)(void)) { return __cxa_atexit((void (*)(void*))f, NULL, __dso_handle); }

/* glibc 2.36: libstdc++'s random_device("default") calls arc4random where the headers declare
 * it. getrandom (2.25) gives the same kernel entropy. */
HIDDEN uint32_t arc4random(void) {
  uint32_t v = 0;
  while (getrandom(&v, sizeof v, 0) != (ssize_t)sizeof v) {
  }
  return v;
}

/* glibc 2.30: libstdc++ waits on a steady_clock deadline with pthread_cond_clockwait. Before it,
 * a condition variable made with the default attributes waits on CLOCK_REALTIME, so the deadline
 * is moved onto that clock as the call begins (a wall-clock step during the wait lengthens or
 * shortens it, as it would any pthread_cond_timedwait). */
#include <errno.h>
#include <pthread.h>
#include <time.h>
HIDDEN int pthread_cond_clockwait(pthread_cond_t* cond, pthread_mutex_t* mutex, clockid_t clock,
                                  const struct timespec* deadline) {
  if (clock != CLOCK_MONOTONIC && clock != CLOCK_REALTIME) return EINVAL;
  struct timespec when = *deadline;
  if (clock == CLOCK_MONOTONIC) {
    struct timespec mono, real;
    clock_gettime(CLOCK_MONOTONIC, &mono);
    clock_gettime(CLOCK_REALTIME, &real);
    int64_t left = (int64_t)(deadline->tv_sec - mono.tv_sec) * 1000000000 + (deadline->tv_nsec - mono.tv_nsec);
    if (left < 0) left = 0;
    int64_t ns = (int64_t)real.tv_nsec + left % 1000000000;
    when.tv_sec = real.tv_sec + left / 1000000000 + ns / 1000000000;
    when.tv_nsec = ns % 1000000000;
  }
  return pthread_cond_timedwait(cond, mutex, &when);
}
