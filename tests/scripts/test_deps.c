/* test_deps.c — scripts/deps.sh --check and the Makefile's use of it: with a package missing
 * (a fake pkg-config on PATH that knows no jansson), `make` stops before compiling anything,
 * with the Debian package names and `make deps`, never a compiler error. TLM_ROOT names the
 * repository (default: the current directory). */
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

static char g_dir[64];

static const char *root(void)
{
    const char *r = getenv("TLM_ROOT");
    return r && r[0] ? r : ".";
}

static void setup(void)
{
    snprintf(g_dir, sizeof g_dir, "/tmp/tlm-deps-XXXXXX");
    cr_assert_not_null(mkdtemp(g_dir));
}

static void teardown(void)
{
    char cmd[128];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", g_dir);
    if (system(cmd) != 0) fprintf(stderr, "could not remove %s\n", g_dir);
}

TestSuite(deps, .init = setup, .fini = teardown);

static char *slurp(const char *path)
{
    FILE *f = fopen(path, "rb");
    cr_assert_not_null(f, "cannot open %s", path);
    char *p = calloc(1, 1 << 20);
    size_t n = fread(p, 1, (1 << 20) - 1, f);
    p[n] = 0;
    fclose(f);
    return p;
}

/* A pkg-config that fails for the modules in `absent` (space-separated) and is the real one
 * otherwise ("*": fails for everything). */
static void fake_pkg_config(const char *absent)
{
    char path[128];
    snprintf(path, sizeof path, "%s/bin", g_dir);
    mkdir(path, 0755);
    snprintf(path, sizeof path, "%s/bin/pkg-config", g_dir);
    FILE *f = fopen(path, "w");
    cr_assert_not_null(f);
    const char *real = access("/usr/bin/pkg-config", X_OK) == 0 ? "/usr/bin/pkg-config"
                                                                : "/usr/local/bin/pkg-config";
    if (!strcmp(absent, "*"))
        fprintf(f, "#!/bin/sh\nexit 1\n");
    else
        fprintf(f,
                "#!/bin/sh\nfor a in \"$@\"; do for m in %s; do [ \"$a\" = \"$m\" ] && exit 1; "
                "done; done\nexec %s \"$@\"\n",
                absent, real);
    fclose(f);
    chmod(path, 0755);
}

typedef struct {
    int status;
    char *out, *err;
} ran;

/* Runs cmd under sh in the repository with the fake pkg-config (if any) first on PATH; no
 * make state leaks in from a `make test` above us. */
static ran run_sh(const char *cmd)
{
    char line[2048];
    snprintf(line, sizeof line,
             "unset MAKEFLAGS MFLAGS MAKELEVEL; cd '%s' && PATH='%s/bin':\"$PATH\" %s >'%s/out' "
             "2>'%s/err' </dev/null",
             root(), g_dir, cmd, g_dir, g_dir);
    int st = system(line);
    cr_assert(st != -1 && WIFEXITED(st), "%s did not exit", cmd);
    char path[128];
    ran r = {WEXITSTATUS(st), NULL, NULL};
    snprintf(path, sizeof path, "%s/out", g_dir);
    r.out = slurp(path);
    snprintf(path, sizeof path, "%s/err", g_dir);
    r.err = slurp(path);
    return r;
}

static void ran_free(ran *r)
{
    free(r->out);
    free(r->err);
}

Test(deps, check_is_silent_when_everything_is_there)
{
    /* this binary was built, so the build and test packages are installed */
    ran r = run_sh("./scripts/deps.sh --check build && ./scripts/deps.sh --check test");
    cr_assert_eq(r.status, 0, "%s", r.err);
    cr_assert_str_empty(r.out);
    cr_assert_str_empty(r.err);
    ran_free(&r);
}

Test(deps, check_names_the_missing_packages_and_make_deps)
{
    fake_pkg_config("jansson libuv");
    ran r = run_sh("./scripts/deps.sh --check");
    cr_assert_eq(r.status, 1);
    cr_assert_str_empty(r.out);
    cr_assert(strstr(r.err, "missing Debian packages: libjansson-dev libuv1-dev\n"), "%s", r.err);
    cr_assert(strstr(r.err, "make deps"), "%s", r.err);
    cr_assert(strstr(r.err, "apt-get install -y libjansson-dev libuv1-dev"), "%s", r.err);
    ran_free(&r);
    /* the test scope adds Criterion */
    fake_pkg_config("criterion");
    r = run_sh("./scripts/deps.sh --check test");
    cr_assert_eq(r.status, 1);
    cr_assert(strstr(r.err, "missing Debian packages: libcriterion-dev\n"), "%s", r.err);
    ran_free(&r);
    r = run_sh("./scripts/deps.sh --check build");
    cr_assert_eq(r.status, 0, "%s", r.err);
    ran_free(&r);
    r = run_sh("./scripts/deps.sh --check everything");
    cr_assert_eq(r.status, 2);
    cr_assert(strstr(r.err, "unknown scope"), "%s", r.err);
    ran_free(&r);
}

Test(deps, make_stops_before_compiling_with_the_message)
{
    fake_pkg_config("jansson");
    char cmd[256];
    snprintf(cmd, sizeof cmd, "make --no-print-directory -j2 BUILD='%s/build' all", g_dir);
    ran r = run_sh(cmd);
    cr_assert_neq(r.status, 0);
    cr_assert(strstr(r.err, "missing Debian packages: libjansson-dev"), "%s", r.err);
    cr_assert(strstr(r.err, "make deps"), "%s", r.err);
    cr_assert(!strstr(r.err, "jansson.h") && !strstr(r.err, "error:"), "a compiler ran: %s", r.err);
    char obj[128];
    snprintf(obj, sizeof obj, "%s/build/obj", g_dir);
    cr_assert_neq(access(obj, F_OK), 0, "objects were built in %s", obj);
    ran_free(&r);
    /* without any package: every one is named */
    fake_pkg_config("*");
    r = run_sh(cmd);
    cr_assert_neq(r.status, 0);
    cr_assert(strstr(r.err, "libjansson-dev libssl-dev libopenblas-dev libsqlite3-dev"), "%s",
              r.err);
    cr_assert(!strstr(r.err, "error:"), "%s", r.err);
    ran_free(&r);
}
