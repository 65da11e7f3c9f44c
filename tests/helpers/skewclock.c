/* A process's wall clock off by an offset that may change while it runs: LD_PRELOAD this library and name a file
 * holding the offset in milliseconds (an integer, negative for behind) in SKEWCLOCK_FILE. The file is read again
 * at most every 50 ms of the real monotonic clock, so writing a new offset steps the clock as NTP would.
 *
 * Only the wall clock moves (clock_gettime's CLOCK_REALTIME and its coarse variant, gettimeofday, time): the
 * monotonic clock and every sleep stay real, as on a host whose clock is wrong. Debian's libfaketime 0.9.10
 * breaks Python 3.11's sleeps when the monotonic clock is excluded (libfaketime issue 426), hence this.
 *
 * Built by tests/helpers/skewclock.py with the system's C compiler. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/time.h>
#include <time.h>

typedef int (*clock_gettime_fn)(clockid_t, struct timespec *);

static clock_gettime_fn real_clock_gettime;
static long long offset_ns;
static long long read_at_ns = -1;

static clock_gettime_fn real(void) {
    if (!real_clock_gettime) real_clock_gettime = (clock_gettime_fn)dlsym(RTLD_NEXT, "clock_gettime");
    return real_clock_gettime;
}

static long long current_offset_ns(void) {
    struct timespec now;
    real()(CLOCK_MONOTONIC, &now);
    long long now_ns = (long long)now.tv_sec * 1000000000LL + now.tv_nsec;
    if (read_at_ns >= 0 && now_ns - read_at_ns < 50000000LL) return offset_ns;
    read_at_ns = now_ns;
    const char *path = getenv("SKEWCLOCK_FILE");
    FILE *file = path ? fopen(path, "r") : NULL;
    if (file) {
        long long ms;
        if (fscanf(file, "%lld", &ms) == 1) offset_ns = ms * 1000000LL;
        fclose(file);
    }
    return offset_ns;
}

static void shift(struct timespec *ts) {
    long long ns = (long long)ts->tv_sec * 1000000000LL + ts->tv_nsec + current_offset_ns();
    ts->tv_sec = ns / 1000000000LL;
    ts->tv_nsec = ns % 1000000000LL;
}

int clock_gettime(clockid_t clock, struct timespec *ts) {
    int result = real()(clock, ts);
    if (result == 0 && (clock == CLOCK_REALTIME || clock == CLOCK_REALTIME_COARSE)) shift(ts);
    return result;
}

int gettimeofday(struct timeval *tv, void *tz) {
    struct timespec ts;
    int result = clock_gettime(CLOCK_REALTIME, &ts);
    if (result == 0 && tv) {
        tv->tv_sec = ts.tv_sec;
        tv->tv_usec = ts.tv_nsec / 1000;
    }
    (void)tz;
    return result;
}

time_t time(time_t *out) {
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    if (out) *out = ts.tv_sec;
    return ts.tv_sec;
}
