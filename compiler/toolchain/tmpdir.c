/* Private working directories for compiles, and the sweep of those a dead process left.
 *
 * A compile writes its source and shared object in $TMPDIR/tlm-KIND-PID-RAND (RAND: mkdtemp's
 * six random characters) and removes the directory when done. A process killed in between (a
 * daemon's crash loop, a test that kills tlmd mid-compile) leaves it behind; the PID in the name
 * lets the next daemon tell the orphans from a live neighbour's work. */
#include "compiler/toolchain/toolchain.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

static const char *tmp_base(void)
{
    const char *base = getenv("TMPDIR");
    return base && *base ? base : "/tmp";
}

int tc_tmpdir_make(const char *kind, char *dir, size_t cap, tlm_error *err)
{
    const char *base = tmp_base();
    /* the six X are mkdtemp's template, replaced by random characters */
    int n = snprintf(dir, cap, "%s/tlm-%s-%ld-XXXXXX", base, kind, (long)getpid());
    if (n < 0 || (size_t)n >= cap)
        return tlm_err_set(err, TLM_EINVAL, "TMPDIR", "TMPDIR is too long");
    if (!mkdtemp(dir)) {
        char eb[128];
        return tlm_err_set(err, TLM_EIO, "TMPDIR", "cannot create a temporary directory in %s: %s",
                           base, strerror_r(errno, eb, sizeof eb)); /* GNU: the message */
    }
    return 0;
}

void tc_remove_tree(const char *dir)
{
    DIR *d = opendir(dir);
    if (d) {
        struct dirent *de;
        while ((de = readdir(d)) != NULL) {
            if (!strcmp(de->d_name, ".") || !strcmp(de->d_name, "..")) continue;
            if (unlinkat(dirfd(d), de->d_name, 0) != 0 && errno == EISDIR) {
                char sub[4096];
                if ((size_t)snprintf(sub, sizeof sub, "%s/%s", dir, de->d_name) < sizeof sub)
                    tc_remove_tree(sub);
            }
        }
        closedir(d);
    }
    rmdir(dir);
}

/* The PID in "PID-RAND" (0: a name from before the PID was in it, RAND alone). */
static long name_pid(const char *rest)
{
    char *end;
    errno = 0;
    long pid = strtol(rest, &end, 10);
    return end != rest && *end == '-' && errno == 0 && pid > 0 ? pid : 0;
}

int tc_tmpdir_sweep(const char *base, int min_age_s)
{
    static const char *const kinds[] = {"tlm-cc-", "tlm-drv-"};
    if (!base || !*base) base = tmp_base();
    DIR *d = opendir(base);
    if (!d) return 0;
    const time_t now = time(NULL);
    int removed = 0;
    struct dirent *de;
    while ((de = readdir(d)) != NULL) {
        const char *rest = NULL;
        for (size_t i = 0; i < sizeof kinds / sizeof kinds[0] && !rest; i++)
            if (!strncmp(de->d_name, kinds[i], strlen(kinds[i])))
                rest = de->d_name + strlen(kinds[i]);
        struct stat st;
        if (!rest || fstatat(dirfd(d), de->d_name, &st, AT_SYMLINK_NOFOLLOW) != 0 ||
            !S_ISDIR(st.st_mode) || st.st_uid != geteuid())
            continue;
        const double age = difftime(now, st.st_mtime);
        const long pid = name_pid(rest);
        if (pid) {
            /* alive (or another user's, EPERM): its compile may still be running; a process
             * in another PID namespace sharing this directory looks dead, and the age (past
             * any compile's time limit) keeps its work */
            if (age < min_age_s || kill((pid_t)pid, 0) == 0 || errno == EPERM) continue;
        } else if (age < 24 * 3600) {
            continue; /* no owner to ask: a day old at least */
        }
        char path[4096];
        if ((size_t)snprintf(path, sizeof path, "%s/%s", base, de->d_name) >= sizeof path)
            continue;
        tc_remove_tree(path);
        struct stat after;
        if (lstat(path, &after) != 0 && errno == ENOENT) removed++;
    }
    closedir(d);
    return removed;
}
