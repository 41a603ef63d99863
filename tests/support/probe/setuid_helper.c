/* Copied root-owned with mode 4755: prints the effective uid it runs with. */
#include <stdio.h>
#include <unistd.h>

int main(void)
{
    printf("euid=%d\n", (int)geteuid());
    return 0;
}
