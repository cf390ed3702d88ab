/* at_main.c — LD_PRELOAD'ed by tests/stages/run_output_check.sh: says on stderr how stdout and stderr
 * are buffered when the program's main would start (after every static initialiser, before main
 * prints anything or calls MPI_Init, whose MPICH makes stdout unbuffered anyway), and exits there.
 * It replaces main by wrapping glibc's __libc_start_main. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdio.h>
#include <stdio_ext.h> /* __flbf, __fbufsize */
#include <unistd.h>    /* _exit */

static int at_main(int argc, char** argv, char** env) {
  (void)argc, (void)argv, (void)env;
  fprintf(stderr, "stdout at main: %s\n",
          __flbf(stdout) ? "line-buffered" : __fbufsize(stdout) == 1 ? "unbuffered" : "fully buffered");
  fprintf(stderr, "stderr at main: %s\n", !__flbf(stderr) && __fbufsize(stderr) <= 1 ? "unbuffered" : "buffered");
  _exit(0);
}

typedef int (*start_main_t)(int (*)(int, char**, char**), int, char**, void (*)(void), void (*)(void),
                            void (*)(void), void*);
int __libc_start_main(int (*main)(int, char**, char**), int argc, char** argv, void (*init)(void),
                      void (*fini)(void), void (*rtld_fini)(void), void* stack_end) {
  (void)main;
  start_main_t real = (start_main_t)dlsym(RTLD_NEXT, "__libc_start_main");
  return real(at_main, argc, argv, init, fini, rtld_fini, stack_end);
}
