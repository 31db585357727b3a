"""The generated runtime's thread pool, and the parallel loops kernels hand to it.

What goes in: kernel C in which a template or a loop step marked one top-level loop as parallel
(``par_for``: ``/* dlcc:parallel */`` then ``for (int64_t V = 0; V < N; ++V) { ... }``); the thread count
the model is compiled for.
What comes out: ``outline`` turns each marked loop into a task function ``f(ctx, lo, hi)`` running
iterations [lo, hi) and a ``dlcc_parallel(f, &ctx, N)`` call in its place (the kernel's pointers travel in
``ctx``); ``POOL_C`` is the pool itself, in ``model.c`` only when the model is compiled for more than one
thread (a one-thread build needs no pthreads).

The pool (pthreads): ``DLCC_THREADS - 1`` workers started on first use; ``dlcc_parallel`` splits [0, N)
into one contiguous range per thread, runs range 0 itself and waits for the others. A waiting worker spins
briefly (kernels follow each other within microseconds), then sleeps on a condition variable: on a shared
2-core machine a pool that keeps spinning loses to one thread. One ``dlcc_run`` at a time owns the pool
(``dlcc_pool_enter``, a trylock); a call made while another thread's run holds it runs on its own thread, so
a model stays safe to call from several threads at once. ``dlcc_set_num_threads(n)`` lowers the count
(1..DLCC_THREADS) at run time.

Invariants: a marked loop's iterations write disjoint parts of the outputs and read nothing another
iteration writes (the template that marks it guarantees it); everything before the marked loop inside the
step's block is declarations without side effects (they are repeated in the task function); a loop of
fewer than two iterations is never dispatched.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from dlcc.codegen.cbase import indent

__all__ = ["KERNEL_DECLS", "MARK", "POOL_C", "POOL_DECLS", "SERIAL_C", "ParallelLoop", "outline", "par_for",
           "split_parallel"]

MARK = "/* dlcc:parallel */"
_HEAD = re.compile(r"for \(int64_t (\w+) = 0; \1 < (\d+); \+\+\1\) \{")


def par_for(var: str, extent: int, body: str) -> str:
    """A loop over [0, extent) whose iterations may run on different threads."""
    return f"{MARK}\nfor (int64_t {var} = 0; {var} < {extent}; ++{var}) {{\n{indent(body)}\n}}"


@dataclass
class ParallelLoop:
    prefix: str  # declarations before the loop (repeated in the task)
    var: str
    extent: int
    body: str  # the loop body, without its braces
    suffix: str  # statements after the loop (serial, after the parallel region)


def _match_brace(text: str, open_at: int) -> int:
    """Index of the ``}`` closing the ``{`` at ``open_at`` (C comments skipped)."""
    depth, i = 0, open_at
    while i < len(text):
        if text.startswith("/*", i):
            i = text.index("*/", i) + 2
            continue
        c = text[i]
        if c == "{":
            depth += 1
        elif c == "}":
            depth -= 1
            if depth == 0:
                return i
        i += 1
    raise ValueError("unbalanced braces in generated C")


def split_parallel(code: str) -> ParallelLoop | None:
    """The marked loop of a step's code, when there is exactly one, at the top level."""
    at = code.find(MARK)
    if at < 0 or code.find(MARK, at + 1) >= 0:
        return None
    head = _HEAD.match(code, code.index("for", at))
    if head is None:
        raise ValueError("a parallel mark not followed by a plain counted loop")
    close = _match_brace(code, head.end() - 1)
    return ParallelLoop(code[:at].rstrip(), head.group(1), int(head.group(2)), code[head.end():close],
                        code[close + 1:].strip())


def outline(kernel: str, body: str, params: list[str]) -> tuple[str, str]:
    """Task functions for every parallel step of ``body`` (a kernel's steps, each a ``{...}`` block) and the
    body with their dispatch calls in place of the loops. ``params`` are the kernel's C parameters
    (``type* restrict p_<id>``). Returns (task functions, new body)."""
    tasks, out = [], []
    pos = 0
    k = 0
    while True:
        at = body.find(MARK, pos)
        if at < 0:
            out.append(body[pos:])
            break
        # the marked loop's enclosing step block: the nearest unmatched "{" before the mark
        depth, start = 0, at
        while start > 0:
            start -= 1
            c = body[start]
            if c == "}":
                depth += 1
            elif c == "{":
                if depth == 0:
                    break
                depth -= 1
        end = _match_brace(body, start)
        loop = split_parallel(body[start + 1:end])
        name = f"{kernel}_p{k}"
        k += 1
        fields = [re.sub(r"\brestrict\b\s*", "", p) for p in params]
        names = [p.rsplit(" ", 1)[-1].lstrip("*") for p in params]
        struct = f"struct {name}_ctx {{ {' '.join(f + ';' for f in fields) or 'char unused_;'} }};"
        # the loop runs in a function whose pointer parameters are restrict-qualified, as the kernel's are: C
        # compilers honour restrict on parameters (on locals loaded from the context they may not, and then
        # reload and recompute what the kernel hoists, e.g. a per-channel sigmoid in an elementwise loop)
        args = ", ".join(f"c_->{n}" for n in names)
        task = (f"{struct}\nstatic __attribute__((noinline)) void {name}_run("
                + "".join(f"{p}, " for p in params) + "int64_t dlcc_lo, int64_t dlcc_hi) {\n"
                + indent(loop.prefix) + ("\n" if loop.prefix else "")
                + f"    for (int64_t {loop.var} = dlcc_lo; {loop.var} < dlcc_hi; ++{loop.var}) {{"
                + loop.body + "}\n}\n"
                + f"static void {name}(void *ctx_, int64_t dlcc_lo, int64_t dlcc_hi) {{\n"
                f"    const struct {name}_ctx *c_ = (const struct {name}_ctx *)ctx_;\n"
                + ("    (void)c_;\n" if not names else "")
                + f"    {name}_run({args}{', ' if args else ''}dlcc_lo, dlcc_hi);\n}}\n")
        tasks.append(task)
        init = ", ".join(f"({f.rsplit(' ', 1)[0]}){n}" for f, n in zip(fields, names, strict=True))
        serial = f"{indent(loop.prefix)}\n" if loop.suffix else ""  # (the suffix may read the prefix's names)
        dispatch = (f"{{\n{serial}    struct {name}_ctx c_ = {{ {init or '0'} }};\n"
                    f"    dlcc_parallel({name}, &c_, {loop.extent});\n{indent(loop.suffix)}\n}}")
        out.append(body[pos:start] + dispatch)
        pos = end + 1
    return "\n".join(tasks), "".join(out)


POOL_DECLS = [
    "/* threads: the pool's size is fixed at compile time; dlcc_set_num_threads lowers it (1..DLCC_THREADS) */",
    "int dlcc_set_num_threads(int n);",
    "int dlcc_num_threads(void);",
]

# in every kernels_<i>.c of a multi-thread build
KERNEL_DECLS = """typedef void (*dlcc_task_fn)(void *ctx, int64_t lo, int64_t hi);
void dlcc_parallel(dlcc_task_fn fn, void *ctx, int64_t n);
"""

# model.c of a one-thread build: the same API, no pthreads
SERIAL_C = r"""
static inline int dlcc_pool_enter(void) { return 0; }
static inline void dlcc_pool_leave(int owned) { (void)owned; }
int dlcc_set_num_threads(int n) { (void)n; return 1; }
int dlcc_num_threads(void) { return 1; }
"""

# model.c of a multi-thread build (after ``#define DLCC_THREADS n``)
POOL_C = r"""
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
typedef void (*dlcc_task_fn)(void *ctx, int64_t lo, int64_t hi);
#if defined(__x86_64__) || defined(__i386__)
#define DLCC_RELAX() __builtin_ia32_pause()
#elif defined(__aarch64__)
#define DLCC_RELAX() __asm__ __volatile__("yield")
#else
#define DLCC_RELAX() ((void)0)
#endif
#define DLCC_SPIN 20000
/* A dispatch is cut into chunks; the caller and the workers take chunks from one ticket counter (the
   dispatch's generation in the high 32 bits, its number of chunks in bits 16-31, the next chunk in bits 0-15),
   so a worker that is late (asleep, or descheduled on a busy machine) leaves its share to the others instead of
   being waited for. Whether a chunk is left is read from the ticket alone: a worker holding the last dispatch's
   ticket, all taken, must not compare it with the next dispatch's count (then it could claim a chunk that never
   existed, with the next task and the last context, and count it done before the next dispatch's chunks). */
static struct {
    pthread_mutex_t owner;           /* held by the dlcc_run using the pool */
    pthread_mutex_t m;
    pthread_cond_t cv;
    pthread_once_t once;
    atomic_ullong ticket;
    atomic_int done;                 /* chunks finished in this dispatch */
    atomic_ulong generation;         /* what sleeping workers wait on */
    unsigned long issued;            /* generations issued (the owner's) */
    int started;                     /* workers running */
    int active;                      /* threads per dispatch (dlcc_set_num_threads) */
    dlcc_task_fn fn;
    void *ctx;
    int64_t n;
} dlcc_pool_ = {PTHREAD_MUTEX_INITIALIZER, PTHREAD_MUTEX_INITIALIZER, PTHREAD_COND_INITIALIZER, PTHREAD_ONCE_INIT,
                0, 0, 0, 0, 0, DLCC_THREADS, 0, 0, 0};
static _Thread_local int dlcc_owner_;  /* this thread's dlcc_run owns the pool */

static void dlcc_work_(unsigned long gen) {
    for (;;) {
        unsigned long long v = atomic_load_explicit(&dlcc_pool_.ticket, memory_order_acquire);
        int c, chunks;
        do {
            c = (int)(v & 0xffffu);
            chunks = (int)((v >> 16) & 0xffffu);
            if ((unsigned long)(v >> 32) != (gen & 0xffffffffu) || c >= chunks) return;
        } while (!atomic_compare_exchange_weak_explicit(&dlcc_pool_.ticket, &v, v + 1, memory_order_acq_rel,
                                                        memory_order_acquire));
        const int64_t n = dlcc_pool_.n, k = chunks;
        const int64_t lo = n * c / k, hi = n * (c + 1) / k;
        if (lo < hi) dlcc_pool_.fn(dlcc_pool_.ctx, lo, hi);
        atomic_fetch_add_explicit(&dlcc_pool_.done, 1, memory_order_acq_rel);
    }
}

static void *dlcc_worker_(void *arg) {
    (void)arg;
    unsigned long seen = 0;
    for (;;) {
        unsigned long g = atomic_load_explicit(&dlcc_pool_.generation, memory_order_acquire);
        for (int s = 0; g == seen && s < DLCC_SPIN; ++s) {
            DLCC_RELAX();
            g = atomic_load_explicit(&dlcc_pool_.generation, memory_order_acquire);
        }
        if (g == seen) {
            pthread_mutex_lock(&dlcc_pool_.m);
            while ((g = atomic_load_explicit(&dlcc_pool_.generation, memory_order_acquire)) == seen)
                pthread_cond_wait(&dlcc_pool_.cv, &dlcc_pool_.m);
            pthread_mutex_unlock(&dlcc_pool_.m);
        }
        seen = g;
        dlcc_work_(g);
    }
    return 0;
}

static void dlcc_pool_start_(void) {
    for (int i = 1; i < DLCC_THREADS; ++i) {
        pthread_t t;
        pthread_attr_t a;
        pthread_attr_init(&a);
        pthread_attr_setdetachstate(&a, PTHREAD_CREATE_DETACHED);
        pthread_attr_setstacksize(&a, 8u << 20);
        const int ok = pthread_create(&t, &a, dlcc_worker_, 0) == 0;
        pthread_attr_destroy(&a);
        if (!ok) break;
        dlcc_pool_.started = i;
    }
}

static int dlcc_pool_enter(void) {
    if (dlcc_pool_.active <= 1 || pthread_mutex_trylock(&dlcc_pool_.owner) != 0) return 0;
    pthread_once(&dlcc_pool_.once, dlcc_pool_start_);
    dlcc_owner_ = 1;
    return 1;
}

static void dlcc_pool_leave(int owned) {
    if (!owned) return;
    dlcc_owner_ = 0;
    pthread_mutex_unlock(&dlcc_pool_.owner);
}

void dlcc_parallel(dlcc_task_fn fn, void *ctx, int64_t n) {
    int parts = dlcc_pool_.active < dlcc_pool_.started + 1 ? dlcc_pool_.active : dlcc_pool_.started + 1;
    if (!dlcc_owner_ || parts <= 1 || n <= 1) { fn(ctx, 0, n); return; }
    int64_t chunks = n < 4 * parts ? n : 4 * parts;
    if (chunks > 0xffff) chunks = 0xffff;
    dlcc_pool_.fn = fn;
    dlcc_pool_.ctx = ctx;
    dlcc_pool_.n = n;
    atomic_store_explicit(&dlcc_pool_.done, 0, memory_order_relaxed);
    const unsigned long gen = ++dlcc_pool_.issued;
    atomic_store_explicit(&dlcc_pool_.ticket, (unsigned long long)(gen & 0xffffffffu) << 32
                          | (unsigned long long)chunks << 16, memory_order_release);
    pthread_mutex_lock(&dlcc_pool_.m);
    atomic_store_explicit(&dlcc_pool_.generation, gen, memory_order_release);
    pthread_cond_broadcast(&dlcc_pool_.cv);
    pthread_mutex_unlock(&dlcc_pool_.m);
    dlcc_work_(gen);
    for (int s = 0; atomic_load_explicit(&dlcc_pool_.done, memory_order_acquire) < chunks; ++s)
        if (s < DLCC_SPIN) DLCC_RELAX(); else sched_yield();
}

int dlcc_set_num_threads(int n) {
    dlcc_pool_.active = n < 1 ? 1 : n > DLCC_THREADS ? DLCC_THREADS : n;
    return dlcc_pool_.active;
}
int dlcc_num_threads(void) { return dlcc_pool_.active; }
"""
