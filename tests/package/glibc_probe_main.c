/* Loads the probe beside it and runs it on argv[1]: prints "probe: ok" or what failed. */
#include <dlfcn.h>
#include <stdio.h>
#include <string.h>

int main(int argc, char** argv) {
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
