/* A preloaded object that hides before its host connects: its name leaves the environment
 * block the process started with (`LD_PRELOAD=` becomes `XD_PRELOAD=`), and its code leaves
 * the process's executable mappings (the constructor ends in a tail call to munmap of its own
 * text, so munmap returns to the loader, not here). What remains is read-only data and the
 * loader's own list, both in the process's memory. Built with -O2 -fno-stack-protector so
 * that the call is a tail call.
 */
#define _GNU_SOURCE
#include <link.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>

static uintptr_t lo, len;

/* The executable segment of the object that holds `prepare`: from the loader's program
 * headers, which need no file (the sandbox may not read /proc/self/maps). */
static int text_of(struct dl_phdr_info *info, size_t size, void *data) {
    (void)size;
    uintptr_t me = (uintptr_t)data;
    for (int i = 0; i < info->dlpi_phnum; i++) {
        const ElfW(Phdr) *ph = &info->dlpi_phdr[i];
        if (ph->p_type != PT_LOAD || !(ph->p_flags & PF_X)) continue;
        uintptr_t a = info->dlpi_addr + ph->p_vaddr, b = a + ph->p_memsz;
        if (me >= a && me < b) {
            uintptr_t page = 4096;
            lo = a & ~(page - 1);
            len = ((b + page - 1) & ~(page - 1)) - lo;
            return 1;
        }
    }
    return 0;
}

__attribute__((noinline)) static void prepare(char **envp) {
    fputs("injected\n", stderr);
    for (char **e = envp; *e; e++)
        if (strncmp(*e, "LD_PRELOAD=", 11) == 0) (*e)[0] = 'X';
    dl_iterate_phdr(text_of, (void *)(uintptr_t)&prepare);
}

__attribute__((constructor)) static int hide(int argc, char **argv, char **envp) {
    (void)argc;
    (void)argv;
    prepare(envp);
    return munmap((void *)lo, len);
}
