/*
 * shift.so: an LD_PRELOAD shim that moves a process's wall clock (CLOCK_REALTIME) by an offset
 * read from a file, so a test can step a real Redis's or a real bridge's clock mid-run.
 *
 *   CLOCK_SHIFT_FILE=/path/to/offset LD_PRELOAD=/path/to/shift.so redis-server ...
 *
 * The file holds the offset in milliseconds (a signed decimal integer; missing or empty: 0). It
 * is read again at most every 20 ms (of the monotonic clock, which is never moved), so writing a
 * new offset steps the clock within that. clock_gettime(CLOCK_REALTIME*), gettimeofday and time
 * are moved (Redis's TIME, inside Lua too; Python's time.time()); the monotonic clocks are not.
 * libfaketime recurses under Redis's jemalloc; this shim allocates nothing.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <fcntl.h>
#include <stdlib.h>
#include <sys/time.h>
#include <time.h>
#include <unistd.h>

typedef int (*clock_gettime_fn)(clockid_t, struct timespec *);

static clock_gettime_fn real_clock_gettime;
static volatile long long offset_ns;
static volatile long long next_read_ns;

static long long ns_of(const struct timespec *ts) {
    return (long long)ts->tv_sec * 1000000000LL + ts->tv_nsec;
}

static void reload(void) {
    if (!real_clock_gettime) {
        real_clock_gettime = (clock_gettime_fn)dlsym(RTLD_NEXT, "clock_gettime");
    }
    struct timespec mono;
    real_clock_gettime(CLOCK_MONOTONIC, &mono);
    long long now = ns_of(&mono);
    if (now < next_read_ns) {
        return;
    }
    next_read_ns = now + 20000000LL;
    const char *path = getenv("CLOCK_SHIFT_FILE");
    if (!path || !*path) {
        return;
    }
    int fd = open(path, O_RDONLY);
    if (fd < 0) {
        return;
    }
    char buf[32];
    ssize_t n = read(fd, buf, sizeof buf - 1);
    close(fd);
    if (n <= 0) {
        return;
    }
    buf[n] = 0;
    offset_ns = strtoll(buf, NULL, 10) * 1000000LL;
}

int clock_gettime(clockid_t id, struct timespec *ts) {
    reload();
    int rc = real_clock_gettime(id, ts);
    if (rc == 0 && (id == CLOCK_REALTIME || id == CLOCK_REALTIME_COARSE)) {
        long long shifted = ns_of(ts) + offset_ns;
        ts->tv_sec = shifted / 1000000000LL;
        ts->tv_nsec = shifted % 1000000000LL;
    }
    return rc;
}

int gettimeofday(struct timeval *tv, void *tz) {
    (void)tz;
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    tv->tv_sec = ts.tv_sec;
    tv->tv_usec = ts.tv_nsec / 1000;
    return 0;
}

time_t time(time_t *out) {
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    if (out) {
        *out = ts.tv_sec;
    }
    return ts.tv_sec;
}
