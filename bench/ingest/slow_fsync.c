/* A disk whose every sync takes longer: fsync and fdatasync sleep SLOW_FSYNC_US microseconds
 * (default 2000), then do the real call. bench/ingest/slow_fsync.py compiles this into a
 * temporary directory and loads it with LD_PRELOAD into the servers it measures, so that a
 * commit costs what it does on a disk with a realistic flush latency (network block storage,
 * a disk without a write cache), not what it costs on the page cache of a virtual machine. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <stdlib.h>
#include <time.h>

static long delay_us = -1;

static void wait_like_a_disk(void) {
    if (delay_us < 0) {
        const char *text = getenv("SLOW_FSYNC_US");
        delay_us = text ? strtol(text, NULL, 10) : 2000;
    }
    struct timespec left = {delay_us / 1000000, (delay_us % 1000000) * 1000};
    int saved = errno;
    while (nanosleep(&left, &left) != 0 && errno == EINTR) {
    }
    errno = saved;
}

int fsync(int fd) {
    static int (*real)(int);
    if (!real) real = (int (*)(int))dlsym(RTLD_NEXT, "fsync");
    wait_like_a_disk();
    return real(fd);
}

int fdatasync(int fd) {
    static int (*real)(int);
    if (!real) real = (int (*)(int))dlsym(RTLD_NEXT, "fdatasync");
    wait_like_a_disk();
    return real(fd);
}
