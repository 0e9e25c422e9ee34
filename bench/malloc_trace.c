/* LD_PRELOAD tracer for bench/budget_accuracy.py --malloc-trace: every malloc, free, calloc, realloc and aligned allocation the
   process makes between mt_on() and mt_close(), in order, written to a file through a small buffer of its own, so it adds nothing
   to the heap it traces and a constant 128 KiB to the process's resident set (touched by mt_open, before the measurement starts).
   Calls are recorded as they return, so with several threads a block freed in one and reused in another can be out of order: trace one thread.
   Each record is four 64-bit words: op (1 malloc, 2 free, 3 calloc, 4 realloc, 5 aligned | alignment << 8), bytes, pointer, old pointer. */
#define _GNU_SOURCE
#include <stddef.h>
#include <stdint.h>
#include <string.h>
#include <errno.h>
#include <fcntl.h>
#include <unistd.h>
extern void *__libc_malloc(size_t); extern void __libc_free(void*); extern void *__libc_calloc(size_t, size_t);
extern void *__libc_realloc(void*, size_t); extern void *__libc_memalign(size_t, size_t);
typedef struct { uint64_t op, size, ptr, old; } rec_t;
#define CAP 4096
static rec_t buf[CAP]; static uint64_t used, n; static int fd = -1, on; static char lock;
static int failed;
static void flush(void) {  /* the whole buffer, retried where write() takes part of it; a failure stops the trace and mt_close reports it */
  char *p = (char *)buf; size_t left = used * sizeof(rec_t);
  while (left) { ssize_t w = write(fd, p, left); if (w <= 0) { if (w < 0 && errno == EINTR) continue; on = 0; failed = 1; break; } p += w; left -= w; }
  used = 0;
}
static void add(uint64_t op, uint64_t size, void *p, void *old) {
  if (!on) return;
  while (__atomic_test_and_set(&lock, __ATOMIC_ACQUIRE));
  if (on) { buf[used] = (rec_t){op, size, (uint64_t)p, (uint64_t)old}; n++; if (++used == CAP) flush(); }
  __atomic_clear(&lock, __ATOMIC_RELEASE);
}
int mt_open(const char *path) { memset(buf, 0, sizeof buf); n = used = 0; failed = 0; fd = open(path, O_WRONLY | O_CREAT | O_TRUNC, 0644); return fd; }
void mt_on(void) { on = fd >= 0; }
uint64_t mt_n(void) { return n; }
int mt_close(void) {  /* 0: every call counted by mt_n is in the file */
  while (__atomic_test_and_set(&lock, __ATOMIC_ACQUIRE));
  on = 0; flush(); close(fd); fd = -1;
  __atomic_clear(&lock, __ATOMIC_RELEASE);
  return failed;
}
void *malloc(size_t s) { void *p = __libc_malloc(s); add(1, s, p, 0); return p; }
void free(void *p) { if (p) add(2, 0, p, 0); __libc_free(p); }
void *calloc(size_t a, size_t b) { void *p = __libc_calloc(a, b); add(3, a * b, p, 0); return p; }
void *realloc(void *o, size_t s) { void *p = __libc_realloc(o, s); add(4, s, p, o); return p; }
void *memalign(size_t al, size_t s) { void *p = __libc_memalign(al, s); add(5 | (al << 8), s, p, 0); return p; }
void *aligned_alloc(size_t al, size_t s) { return memalign(al, s); }
int posix_memalign(void **r, size_t al, size_t s) {
  void *p = __libc_memalign(al, s);
  if (!p) return ENOMEM;
  *r = p; add(5 | (al << 8), s, p, 0); return 0;
}
