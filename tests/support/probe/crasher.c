/*
 * A crash with something to find in its memory: 8 MiB of heap filled with a marker, then
 * SIGSEGV with the default action (a core dump). The marker is built at run time, so 1 KiB of
 * it exists only in this process's anonymous memory: not in its argv (which the dump's
 * process note quotes), not in the binary's pages. tests/escapes_coredump.rs looks for it in
 * what a core_pattern helper receives.
 */
#include <signal.h>
#include <stdlib.h>
#include <string.h>

int main(void)
{
    static const char unit[] = "OSB-CORE-MARKER-";
    size_t n = 8u << 20, u = sizeof unit - 1;
    char *heap = malloc(n);
    if (!heap)
        return 2;
    for (size_t i = 0; i + u <= n; i += u)
        memcpy(heap + i, unit, u);
    signal(SIGSEGV, SIG_DFL);
    raise(SIGSEGV);
    return heap[0] == 0 ? 3 : 4;
}
