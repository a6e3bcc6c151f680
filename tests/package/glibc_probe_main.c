/* Loads the probe beside it and runs it on argv[1]: prints "probe: ok" or what failed. Also
 * checks the executable's own start: its constructors ran (glibc_start.c) and malloc is libc's
 * (glibc < 2.32's ld.so exports a minimal one that aborts on realloc of an older block). */
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int constructed;
__attribute__((constructor)) static void mark(void) { constructed = 1; }

int main(int argc, char** argv) {
  if (!constructed) {
    printf("probe: the executable's constructors did not run\n");
    return 1;
  }
  char* a = malloc(16);
  char* b = malloc(16);
  a = realloc(a, 1 << 20);  /* not the last block: dl-minimal's realloc asserts */
  free(b);
  free(a);
  char path[4096];
  const char* slash = strrchr(argv[0], '/');
  snprintf(path, sizeof path, "%.*s/libglibc_probe.so", slash ? (int)(slash - argv[0]) : 1, slash ? argv[0] : ".");
  void* lib = dlopen(path, RTLD_NOW);
  if (!lib) {
    printf("probe: cannot load %s: %s\n", path, dlerror());
    return 1;
  }
  int (*probe)(const char*) = (int (*)(const char*))dlsym(lib, "probe");
  int rc = probe ? probe(argc > 1 ? argv[1] : "/etc/hostname") : -1;
  printf(rc == 0 ? "probe: ok\n" : "probe: part %d failed\n", rc);
  return rc == 0 ? 0 : 1;
}
