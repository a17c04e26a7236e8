/* probe.c - checks that dlsym(RTLD_NEXT) keeps its meaning under the shim: built as
 * libprobe_a.so (-DPROBE_A), libprobe_b.so (-DPROBE_B) and the program (neither), linked
 * a then b. From a, RTLD_NEXT must find b's osub_probe (2); a dlsym that called libc's instead
 * of jumping to it would look after the shim, and find a's own (1). */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdio.h>

int osub_probe(void);
int probe_next(void);

#if defined(PROBE_A)
__attribute__((visibility("default"))) int osub_probe(void)
{
    return 1;
}
__attribute__((visibility("default"))) int probe_next(void)
{
    int (*f)(void);
    *(void **)&f = dlsym(RTLD_NEXT, "osub_probe");
    return f ? f() : -1;
}
#elif defined(PROBE_B)
__attribute__((visibility("default"))) int osub_probe(void)
{
    return 2;
}
#else
int main(void)
{
    printf("next=%d\n", probe_next());
    return 0;
}
#endif
