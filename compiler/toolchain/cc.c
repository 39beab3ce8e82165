/* cc.c — C source → shared object with the system compiler; see toolchain.h.
 *
 * Why posix_spawn and not system()/popen(): no shell (flags are never interpreted), stderr is
 * captured through our own pipe, the child gets its own process group so a timeout kills the
 * driver and everything it started (cc1, as, ld), and the call is safe from many threads.
 */
#include "compiler/toolchain/toolchain.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <spawn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "compiler/util/util.h"

extern char **environ;

#define LOG_CAP (256 * 1024) /* more compiler output than this is read and dropped */
#define MAX_WORDS 256
#define IDENTITY_TIMEOUT_MS 20000

static const char *const k_base_flags[] = {"-std=gnu11", "-shared", "-fPIC", "-fopenmp"};
#define N_BASE_FLAGS (sizeof k_base_flags / sizeof k_base_flags[0])

#if defined(__GLIBC__) && (__GLIBC__ > 2 || (__GLIBC__ == 2 && __GLIBC_MINOR__ >= 29))
#define HAVE_SPAWN_CHDIR 1 /* posix_spawn_file_actions_addchdir_np */
#endif

static const char *errstr(int e, char *buf, size_t n)
{
    return strerror_r(e, buf, n); /* GNU variant: returns the message */
}

size_t tc_log_head(const char *log, char *buf, size_t size, int max_lines)
{
    if (!buf || size == 0) return 0;
    buf[0] = '\0';
    if (!log) return 0;
    const char *start = log;
    const char *e = strstr(log, "error");
    if (e) {
        while (e > log && e[-1] != '\n')
            e--;
        /* "collect2: error: ld returned 1" comes after the lines that say what is undefined. */
        const char *eol = strchr(e, '\n');
        size_t len = eol ? (size_t)(eol - e) : strlen(e);
        int summary = memmem(e, len, "collect2", 8) || memmem(e, len, "ld returned", 11);
        if (!summary) start = e;
    }
    size_t n = 0;
    int lines = 0;
    for (const char *p = start; *p && n < size - 1 && lines < max_lines; p++) {
        if (*p == '\n' || *p == '\r' || *p == '\t') {
            if (*p == '\n') lines++;
            if (n && buf[n - 1] != ' ') buf[n++] = ' ';
            continue;
        }
        if (*p == ' ' && n && buf[n - 1] == ' ') continue; /* squeeze caret-line indentation */
        buf[n++] = *p;
    }
    while (n && buf[n - 1] == ' ')
        n--;
    buf[n] = '\0';
    return n;
}

/* ---- words ----------------------------------------------------------------------------- */

typedef struct {
    char *bufs[4]; /* owned copies that w[] points into */
    int n_bufs;
    const char *w[MAX_WORDS];
    int n;
} words;

static int words_push(words *ws, const char *w, const char *field, tlm_error *err)
{
    if (ws->n >= MAX_WORDS - 1)
        return tlm_err_set(err, TLM_EINVAL, field, "too many words; at most %d allowed",
                           MAX_WORDS - 1);
    ws->w[ws->n++] = w;
    ws->w[ws->n] = NULL;
    return 0;
}

/* Splits s on blank space and appends the words. No quoting: flags never pass a shell. */
static int words_add(words *ws, const char *s, const char *field, tlm_error *err)
{
    if (!s) return 0;
    if (ws->n_bufs == (int)(sizeof ws->bufs / sizeof ws->bufs[0]))
        return tlm_err_set(err, TLM_EINVAL, field, "too many word lists");
    char *copy = strdup(s);
    if (!copy) return tlm_err_set(err, TLM_ENOMEM, field, "no memory");
    ws->bufs[ws->n_bufs++] = copy;
    char *save = NULL;
    for (char *t = strtok_r(copy, " \t\r\n\v\f", &save); t;
         t = strtok_r(NULL, " \t\r\n\v\f", &save)) {
        int rc = words_push(ws, t, field, err);
        if (rc) return rc;
    }
    return 0;
}

static void words_free(words *ws)
{
    for (int i = 0; i < ws->n_bufs; i++)
        free(ws->bufs[i]);
    ws->n_bufs = 0;
    ws->n = 0;
}

/* ---- running a child ------------------------------------------------------------------- */

typedef struct {
    char *out; /* combined stdout+stderr, NUL-terminated, at most LOG_CAP bytes kept */
    size_t len;
    int status;      /* waitpid status, when ran */
    int spawn_errno; /* nonzero: the program could not be started */
    int timed_out;
} run_result;

/* The environment for the compiler: ours with LC_ALL=C, so messages are plain ASCII English
 * whatever the daemon's locale. */
static char **child_env(void)
{
    size_t n = 0;
    while (environ && environ[n])
        n++;
    char **env = malloc((n + 2) * sizeof *env);
    if (!env) return NULL;
    size_t k = 0;
    for (size_t i = 0; i < n; i++)
        if (strncmp(environ[i], "LC_ALL=", 7) != 0) env[k++] = environ[i];
    env[k++] = "LC_ALL=C";
    env[k] = NULL;
    return env;
}

static int append(run_result *r, const char *buf, size_t n)
{
    size_t room = LOG_CAP - r->len;
    if (n > room) n = room;
    if (n == 0) return 0;
    char *p = realloc(r->out, r->len + n + 1);
    if (!p) return -1;
    r->out = p;
    memcpy(r->out + r->len, buf, n);
    r->len += n;
    r->out[r->len] = '\0';
    return 0;
}

/* Runs argv (PATH-searched) in cwd (NULL = ours) with stdin from /dev/null and stdout+stderr
 * captured, killing its process group after timeout_ms. Returns 0 when the child ran (see
 * r->status, r->timed_out) or -1 with r->spawn_errno set. */
static int run_child(const char *const *argv, const char *cwd, int timeout_ms, run_result *r)
{
    memset(r, 0, sizeof *r);
    int fds[2];
    /* O_CLOEXEC: children that other threads spawn meanwhile must not inherit our write end,
     * or we would wait for EOF until they exit. */
    if (pipe2(fds, O_CLOEXEC) != 0) {
        r->spawn_errno = errno;
        return -1;
    }
    posix_spawn_file_actions_t fa;
    posix_spawnattr_t attr;
    posix_spawn_file_actions_init(&fa);
    posix_spawnattr_init(&attr);
    posix_spawn_file_actions_addopen(&fa, 0, "/dev/null", O_RDONLY, 0);
    posix_spawn_file_actions_adddup2(&fa, fds[1], 1);
    posix_spawn_file_actions_adddup2(&fa, fds[1], 2);
#ifdef HAVE_SPAWN_CHDIR
    if (cwd) posix_spawn_file_actions_addchdir_np(&fa, cwd);
#else
    (void)cwd;
#endif
    /* Own process group (to kill the whole tree), no blocked signals and default handlers
     * (the daemon's threads block signals that a compiler must not inherit). */
    sigset_t none, defaults;
    sigemptyset(&none);
    sigemptyset(&defaults);
    int sigs[] = {SIGPIPE, SIGCHLD, SIGINT, SIGTERM, SIGHUP, SIGQUIT, SIGALRM, SIGUSR1, SIGUSR2};
    for (size_t i = 0; i < sizeof sigs / sizeof sigs[0]; i++)
        sigaddset(&defaults, sigs[i]);
    posix_spawnattr_setpgroup(&attr, 0);
    posix_spawnattr_setsigmask(&attr, &none);
    posix_spawnattr_setsigdefault(&attr, &defaults);
    posix_spawnattr_setflags(&attr, POSIX_SPAWN_SETPGROUP | POSIX_SPAWN_SETSIGMASK |
                                        POSIX_SPAWN_SETSIGDEF);

    char **env = child_env();
    pid_t pid = -1;
    int e = env ? posix_spawnp(&pid, argv[0], &fa, &attr, (char *const *)argv, env) : ENOMEM;
    free(env);
    posix_spawn_file_actions_destroy(&fa);
    posix_spawnattr_destroy(&attr);
    close(fds[1]);
    if (e != 0) {
        close(fds[0]);
        r->spawn_errno = e;
        return -1;
    }

    int64_t deadline = tlm_now_ns() + (int64_t)timeout_ms * 1000000;
    char buf[8192];
    for (;;) {
        int64_t left = (deadline - tlm_now_ns()) / 1000000;
        if (left <= 0) {
            r->timed_out = 1;
            break;
        }
        struct pollfd p = {.fd = fds[0], .events = POLLIN};
        int pr = poll(&p, 1, left > 1000 ? 1000 : (int)left);
        if (pr < 0 && errno != EINTR) break;
        if (pr <= 0) continue;
        ssize_t n = read(fds[0], buf, sizeof buf);
        if (n < 0 && (errno == EINTR || errno == EAGAIN)) continue;
        if (n <= 0) break;         /* EOF: the child and its descendants closed the pipe */
        append(r, buf, (size_t)n); /* out of memory: the log is cut short, the run goes on */
    }
    close(fds[0]);

    /* Usually the child has exited when the pipe closes; a child that closed its output early
     * still gets only what is left of the deadline. */
    while (!r->timed_out) {
        pid_t w = waitpid(pid, &r->status, WNOHANG);
        if (w == pid) return 0;
        if (w < 0 && errno != EINTR) {
            r->status = -1;
            r->spawn_errno = errno; /* ECHILD: someone else reaped it (SIGCHLD ignored) */
            return -1;
        }
        if (tlm_now_ns() >= deadline) {
            r->timed_out = 1;
            break;
        }
        struct timespec ts = {0, 5 * 1000 * 1000};
        nanosleep(&ts, NULL);
    }
    kill(-pid, SIGKILL);
    while (waitpid(pid, &r->status, 0) < 0 && errno == EINTR) {
    }
    return 0;
}

/* ---- identity -------------------------------------------------------------------------- */

static struct {
    pthread_once_t once;
    char compiler[512]; /* $CC or "cc", as given */
    char identity[2048];
} g_cc = {.once = PTHREAD_ONCE_INIT};

/* Where the PATH search would find `prog` (or prog itself when it has a slash). */
static void resolve_path(const char *prog, char *out, size_t n)
{
    snprintf(out, n, "%s", prog);
    if (strchr(prog, '/')) return;
    const char *path = getenv("PATH");
    if (!path || !*path) path = "/usr/local/bin:/usr/bin:/bin";
    char dir[4096];
    for (const char *p = path; *p;) {
        const char *c = strchr(p, ':');
        size_t len = c ? (size_t)(c - p) : strlen(p);
        if (len == 0 || len >= sizeof dir) {
            /* An empty entry means the current directory; a compiler found there would not be
             * worth an identity, so skip it. */
        } else {
            memcpy(dir, p, len);
            dir[len] = '\0';
            char cand[4608];
            snprintf(cand, sizeof cand, "%s/%s", dir, prog);
            if (access(cand, X_OK) == 0) {
                int k = snprintf(out, n, "%s", cand);
                if (k > 0 && (size_t)k < n) return;
                snprintf(out, n, "%s", prog); /* too long to name: keep the bare name */
            }
        }
        p = c ? c + 1 : p + len;
    }
}

static void cc_init_once(void)
{
    const char *cc = getenv("CC");
    snprintf(g_cc.compiler, sizeof g_cc.compiler, "%s", (cc && *cc) ? cc : "cc");

    char base[256];
    size_t bl = 0;
    for (size_t i = 0; i < N_BASE_FLAGS; i++)
        bl += (size_t)snprintf(base + bl, sizeof base - bl, "%s ", k_base_flags[i]);
    snprintf(base + bl, sizeof base - bl, "-lm");

    words ws = {0};
    char path[1024] = "";
    char version[256] = "unavailable";
    if (words_add(&ws, g_cc.compiler, "CC", NULL) == 0 && ws.n > 0 &&
        words_push(&ws, "--version", "CC", NULL) == 0) {
        resolve_path(ws.w[0], path, sizeof path);
        run_result r;
        if (run_child(ws.w, NULL, IDENTITY_TIMEOUT_MS, &r) == 0 && !r.timed_out &&
            WIFEXITED(r.status) && WEXITSTATUS(r.status) == 0 && r.out) {
            size_t line = strcspn(r.out, "\r\n");
            if (line > 0 && line < sizeof version) {
                memcpy(version, r.out, line);
                version[line] = '\0';
            }
        }
        free(r.out);
    }
    words_free(&ws);
    snprintf(g_cc.identity, sizeof g_cc.identity, "cc=%s; version=%s; base=%s",
             path[0] ? path : g_cc.compiler, version, base);
}

const char *tc_cc_identity(void)
{
    pthread_once(&g_cc.once, cc_init_once);
    return g_cc.identity;
}

/* ---- compile --------------------------------------------------------------------------- */

static int write_file(const char *path, const char *data, size_t n)
{
    int fd = open(path, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
    if (fd < 0) return -1;
    size_t off = 0;
    while (off < n) {
        ssize_t w = write(fd, data + off, n - off);
        if (w < 0 && errno == EINTR) continue;
        if (w <= 0) {
            int e = errno;
            close(fd);
            errno = e;
            return -1;
        }
        off += (size_t)w;
    }
    return close(fd);
}

/* 1 when `path` is an ELF shared object (ET_DYN): flags like -E or -c make the compiler
 * "succeed" with something else under the output name. */
static int is_shared_object(const char *path)
{
    unsigned char h[18];
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return 0;
    ssize_t n = read(fd, h, sizeof h);
    close(fd);
    if (n != (ssize_t)sizeof h || memcmp(h, "\177ELF", 4) != 0) return 0;
    unsigned type = h[5] == 2 ? (unsigned)(h[16] << 8 | h[17]) : (unsigned)(h[17] << 8 | h[16]);
    return type == 3; /* ET_DYN; h[5] is EI_DATA: 1 little-endian, 2 big-endian */
}

/* Moves `from` onto `to` atomically. Across file systems (EXDEV) the bytes are copied into a
 * temporary file beside `to` first, which is then renamed: readers still never see a torn .so,
 * and a process that already dlopen'ed the old file keeps its (unlinked) inode. */
static int install_file(const char *from, const char *to, tlm_error *err)
{
    char eb[128];
    if (rename(from, to) == 0) return 0;
    if (errno != EXDEV)
        return tlm_err_set(err, TLM_EIO, "out_so_path", "cannot write %s: %s", to,
                           errstr(errno, eb, sizeof eb));
    size_t tl = strlen(to);
    char *tmp = malloc(tl + 16);
    if (!tmp) return tlm_err_set(err, TLM_ENOMEM, "out_so_path", "no memory");
    snprintf(tmp, tl + 16, "%s.tmp.XXXXXX", to);
    int out = mkostemp(tmp, O_CLOEXEC);
    int in = out >= 0 ? open(from, O_RDONLY | O_CLOEXEC) : -1;
    int rc = 0;
    if (out < 0 || in < 0) {
        rc = tlm_err_set(err, TLM_EIO, "out_so_path", "cannot write %s: %s", to,
                         errstr(errno, eb, sizeof eb));
    } else {
        char buf[65536];
        for (;;) {
            ssize_t n = read(in, buf, sizeof buf);
            if (n < 0 && errno == EINTR) continue;
            if (n < 0) {
                rc = tlm_err_set(err, TLM_EIO, "out_so_path", "reading the compiled object: %s",
                                 errstr(errno, eb, sizeof eb));
                break;
            }
            if (n == 0) break;
            for (ssize_t off = 0; off < n && rc == 0;) {
                ssize_t w = write(out, buf + off, (size_t)(n - off));
                if (w < 0 && errno == EINTR) continue;
                if (w <= 0)
                    rc = tlm_err_set(err, TLM_EIO, "out_so_path", "writing %s: %s", tmp,
                                     errstr(errno, eb, sizeof eb));
                else
                    off += w;
            }
            if (rc) break;
        }
        if (rc == 0 && fchmod(out, 0755) != 0)
            rc = tlm_err_set(err, TLM_EIO, "out_so_path", "chmod %s: %s", tmp,
                             errstr(errno, eb, sizeof eb));
    }
    if (in >= 0) close(in);
    if (out >= 0 && close(out) != 0 && rc == 0)
        rc = tlm_err_set(err, TLM_EIO, "out_so_path", "writing %s: %s", tmp,
                         errstr(errno, eb, sizeof eb));
    if (rc == 0 && rename(tmp, to) != 0)
        rc = tlm_err_set(err, TLM_EIO, "out_so_path", "cannot write %s: %s", to,
                         errstr(errno, eb, sizeof eb));
    if (rc && out >= 0) unlink(tmp);
    free(tmp);
    return rc;
}

int tc_cc_compile(const char *source, const char *flags, const char *out_so_path, char **log_out,
                  tlm_error *err)
{
    return tc_cc_compile_ex(source, flags, out_so_path, NULL, log_out, err);
}

int tc_cc_compile_ex(const char *source, const char *flags, const char *out_so_path,
                     const tc_cc_opts *opts, char **log_out, tlm_error *err)
{
    if (log_out) *log_out = NULL;
    if (!source) return tlm_err_set(err, TLM_EINVAL, "source", "no C source given");
    if (!out_so_path || !*out_so_path)
        return tlm_err_set(err, TLM_EINVAL, "out_so_path", "no output path given");
    pthread_once(&g_cc.once, cc_init_once);
    int timeout_ms = (opts && opts->timeout_ms > 0) ? opts->timeout_ms : TC_CC_DEFAULT_TIMEOUT_MS;
    const char *compiler =
        (opts && opts->compiler && *opts->compiler) ? opts->compiler : g_cc.compiler;

    char eb[128];
    char dir[1024], src_path[1100], so_path[1100];
    int mk = tc_tmpdir_make("cc", dir, sizeof dir, err);
    if (mk) return mk;
    snprintf(src_path, sizeof src_path, "%s/kernel.c", dir);
    snprintf(so_path, sizeof so_path, "%s/kernel.so", dir);

    int rc = 0, ran = 0;
    words ws = {0};
    run_result r = {0};
    if (write_file(src_path, source, strlen(source)) != 0) {
        rc = tlm_err_set(err, TLM_EIO, "TMPDIR", "cannot write %s: %s", src_path,
                         errstr(errno, eb, sizeof eb));
        goto done;
    }

    /* cc BASE FLAGS -o kernel.so kernel.c -lm: the caller's flags come after ours so they can
     * override (-std, -O), and -lm after the source so the linker sees the references first.
     * Relative names (run inside the directory) keep temp paths out of the messages. */
#ifdef HAVE_SPAWN_CHDIR
    const char *src_arg = "kernel.c", *so_arg = "kernel.so";
#else
    const char *src_arg = src_path, *so_arg = so_path;
#endif
    if ((rc = words_add(&ws, compiler, "CC", err)) != 0) goto done;
    if (ws.n == 0) {
        rc = tlm_err_set(err, TLM_EINVAL, "CC", "the C compiler command is empty");
        goto done;
    }
    for (size_t i = 0; i < N_BASE_FLAGS; i++)
        if ((rc = words_push(&ws, k_base_flags[i], "flags", err)) != 0) goto done;
    if ((rc = words_add(&ws, flags, "flags", err)) != 0) goto done;
    const char *tail[] = {"-o", so_arg, src_arg, "-lm"};
    for (size_t i = 0; i < sizeof tail / sizeof tail[0]; i++)
        if ((rc = words_push(&ws, tail[i], "flags", err)) != 0) goto done;

    if (run_child(ws.w, dir, timeout_ms, &r) != 0) {
        rc = tlm_err_set(err, TLM_ETOOLCHAIN, "CC", "cannot run the C compiler '%s': %s", ws.w[0],
                         errstr(r.spawn_errno, eb, sizeof eb));
        goto done;
    }
    ran = 1;
    char head[360];
    if (r.timed_out) {
        rc = tlm_err_set(err, TLM_ETOOLCHAIN, "source",
                         "the C compiler ran over its %d ms limit and was killed", timeout_ms);
    } else if (WIFSIGNALED(r.status)) {
        rc = tlm_err_set(err, TLM_ETOOLCHAIN, "source", "the C compiler was killed by signal %d",
                         WTERMSIG(r.status));
    } else if (!WIFEXITED(r.status) || WEXITSTATUS(r.status) != 0) {
        tc_log_head(r.out, head, sizeof head, 6);
        rc = tlm_err_set(err, TLM_ETOOLCHAIN, "source", "C compilation failed (exit %d): %s",
                         WIFEXITED(r.status) ? WEXITSTATUS(r.status) : -1,
                         head[0] ? head : "(no message)");
    } else if (!is_shared_object(so_path)) {
        rc = tlm_err_set(err, TLM_ETOOLCHAIN, "flags",
                         "the C compiler succeeded but wrote no shared object (do the flags "
                         "stop it early, like -E or -c?)");
    } else {
        rc = install_file(so_path, out_so_path, err);
    }

done:
    if (log_out && ran) {
        *log_out = r.out ? r.out : strdup("");
        r.out = NULL;
    }
    free(r.out);
    words_free(&ws);
    tc_remove_tree(dir);
    return rc;
}
