/* run_tool.h — runs the real `tlm` binary (TLM_BIN, default build/san/tlm) for the tool
 * tests: argv without argv[0], stdin from a string, stdout and stderr captured through
 * temporary files so neither pipe can fill up; and the scratch directory a test writes its
 * files in (tool_dir). Header-only (static functions). */
#ifndef TLM_TESTS_RUN_TOOL_H
#define TLM_TESTS_RUN_TOOL_H

#include <criterion/criterion.h>
#include <fcntl.h>
#include <spawn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

extern char **environ;

typedef struct {
    int status; /* exit status, or -1 if it did not exit normally */
    char *out, *err;
} run_result;

static const char *tlm_bin(void)
{
    const char *b = getenv("TLM_BIN");
    return b && *b ? b : "build/san/tlm";
}

static char *slurp_len(const char *path, size_t *len)
{
    FILE *f = fopen(path, "rb");
    cr_assert_not_null(f, "cannot open %s", path);
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *buf = malloc((size_t)n + 1);
    cr_assert_not_null(buf);
    cr_assert_eq(fread(buf, 1, (size_t)n, f), (size_t)n);
    buf[n] = 0;
    fclose(f);
    if (len) *len = (size_t)n;
    return buf;
}

static char *slurp(const char *path)
{
    return slurp_len(path, NULL);
}

static void write_file(const char *path, const char *text)
{
    FILE *f = fopen(path, "wb");
    cr_assert_not_null(f, "cannot create %s", path);
    fputs(text, f);
    fclose(f);
}

/* ---- the test's scratch directory ---- */

/* Made by tool_dir_make, usually in a suite's .init: Criterion runs every test in a process of
 * its own, so each test gets a fresh directory; tool_dir_fini (the suite's .fini) removes it.
 * The functions are static inline: a test that uses some of them builds without warnings. */
static char tool_dir[64];

/* Creates tool_dir from template, "/tmp/<whose>-XXXXXX": the name says which test left it. */
static inline void tool_dir_make(const char *template)
{
    snprintf(tool_dir, sizeof tool_dir, "%s", template);
    cr_assert_not_null(mkdtemp(tool_dir));
}

/* Removes tool_dir and everything in it: 0 when done, else non-zero, said on stderr. */
static inline int tool_dir_remove(void)
{
    char cmd[128];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", tool_dir);
    int rc = system(cmd);
    if (rc != 0) fprintf(stderr, "could not remove %s\n", tool_dir);
    return rc;
}

/* A suite's .fini: a directory left behind is said, not a failure of the test. */
static inline void tool_dir_fini(void)
{
    tool_dir_remove();
}

/* buf = tool_dir/name */
static inline void tool_path(char *buf, size_t cap, const char *name)
{
    snprintf(buf, cap, "%s/%s", tool_dir, name);
}

/* Runs tlm with args (NULL-terminated, without argv[0]); stdin from stdin_text (or empty),
 * stdout and stderr captured through temporary files so neither pipe can fill up. */
static run_result run_tlm_in(const char *stdin_text, const char *const *args)
{
    const char *bin = tlm_bin();
    cr_assert_eq(access(bin, X_OK), 0,
                 "tlm binary %s not found: build it (make build/san/tlm) or set TLM_BIN", bin);
    char dir[] = "/tmp/tlm-test-XXXXXX";
    cr_assert_not_null(mkdtemp(dir));
    char in_path[64], out_path[64], err_path[64];
    snprintf(in_path, sizeof in_path, "%s/in", dir);
    snprintf(out_path, sizeof out_path, "%s/out", dir);
    snprintf(err_path, sizeof err_path, "%s/err", dir);
    write_file(in_path, stdin_text ? stdin_text : "");

    char *argv[32];
    int n = 0;
    argv[n++] = (char *)bin;
    for (int i = 0; args[i] && n < 31; i++)
        argv[n++] = (char *)args[i];
    argv[n] = NULL;

    posix_spawn_file_actions_t fa;
    posix_spawn_file_actions_init(&fa);
    posix_spawn_file_actions_addopen(&fa, 0, in_path, O_RDONLY, 0);
    posix_spawn_file_actions_addopen(&fa, 1, out_path, O_WRONLY | O_CREAT | O_TRUNC, 0600);
    posix_spawn_file_actions_addopen(&fa, 2, err_path, O_WRONLY | O_CREAT | O_TRUNC, 0600);
    pid_t pid;
    int rc = posix_spawn(&pid, bin, &fa, NULL, argv, environ);
    posix_spawn_file_actions_destroy(&fa);
    cr_assert_eq(rc, 0, "posix_spawn %s: %s", bin, strerror(rc));
    int st;
    cr_assert_eq(waitpid(pid, &st, 0), pid);

    run_result r;
    r.status = WIFEXITED(st) ? WEXITSTATUS(st) : -1;
    r.out = slurp(out_path);
    r.err = slurp(err_path);
    unlink(in_path);
    unlink(out_path);
    unlink(err_path);
    rmdir(dir);
    return r;
}

#define RUN(...) run_tlm_in(NULL, (const char *const[]){__VA_ARGS__, NULL})

static void free_result(run_result *r)
{
    free(r->out);
    free(r->err);
}

static int count_lines(const char *s)
{
    int n = 0;
    for (; *s; s++)
        n += *s == '\n';
    return n;
}

#endif
