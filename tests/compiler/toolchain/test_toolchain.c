/* Tests for compiler/toolchain: cc → .so, NVRTC → cubin, ptxas parsing, limits, cuda_dl, the
 * working directories and their sweep. */
#include <criterion/criterion.h>

#include <dlfcn.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "compiler/toolchain/cuda_dl.h"
#include "compiler/toolchain/toolchain.h"

/* ---- helpers --------------------------------------------------------------------------- */

static char g_dir[256];

static void make_dir(void)
{
    const char *t = getenv("TMPDIR");
    snprintf(g_dir, sizeof g_dir, "%s/tlm-test-tc-XXXXXX", (t && *t) ? t : "/tmp");
    cr_assert_not_null(mkdtemp(g_dir));
}

static void remove_dir(void)
{
    char cmd[400];
    /* Test-only cleanup of our own temp dir. */
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", g_dir);
    if (system(cmd) != 0) fprintf(stderr, "could not remove %s\n", g_dir);
}

static void path_in(char *buf, size_t n, const char *name)
{
    snprintf(buf, n, "%s/%s", g_dir, name);
}

static int file_exists(const char *p)
{
    struct stat st;
    return stat(p, &st) == 0;
}

static int count_entries(const char *dir)
{
    char cmd[400];
    snprintf(cmd, sizeof cmd, "ls -A '%s' | wc -l", dir);
    FILE *f = popen(cmd, "r");
    int n = -1;
    if (f) {
        if (fscanf(f, "%d", &n) != 1) n = -1;
        pclose(f);
    }
    return n;
}

/* ---- cc -------------------------------------------------------------------------------- */

TestSuite(cc, .init = make_dir, .fini = remove_dir);

static const char *k_good_c = "#include <math.h>\n"
                              "int add3(int a) { return a + 3; }\n"
                              "double hyp(double a, double b) { return sqrt(a * a + b * b); }\n"
                              "/* OpenMP reduction: the .so must link libgomp */\n"
                              "long sum_to(long n) {\n"
                              "    long s = 0;\n"
                              "#pragma omp parallel for reduction(+ : s)\n"
                              "    for (long i = 1; i <= n; i++) s += i;\n"
                              "    return s;\n"
                              "}\n";

Test(cc, compiles_and_runs)
{
    char so[300];
    path_in(so, sizeof so, "k.so");
    tlm_error err = {0};
    char *log = NULL;
    int rc = tc_cc_compile(k_good_c, "-O2", so, &log, &err);
    cr_assert_eq(rc, 0, "rc=%d %s", rc, err.msg);
    cr_assert_not_null(log);
    free(log);

    void *h = dlopen(so, RTLD_NOW | RTLD_LOCAL);
    cr_assert_not_null(h, "%s", dlerror());
    int (*add3)(int) = (int (*)(int))dlsym(h, "add3");
    double (*hyp)(double, double) = (double (*)(double, double))dlsym(h, "hyp");
    long (*sum_to)(long) = (long (*)(long))dlsym(h, "sum_to");
    cr_assert(add3 && hyp && sum_to);
    cr_assert_eq(add3(39), 42);
    cr_assert_float_eq(hyp(3.0, 4.0), 5.0, 1e-12);
    cr_assert_eq(sum_to(100000), 100000L * 100001L / 2);
    dlclose(h);

    /* Only the output is left: no temp files beside it. */
    cr_assert_eq(count_entries(g_dir), 1);
}

Test(cc, flags_are_split_without_a_shell)
{
    char so[300];
    path_in(so, sizeof so, "f.so");
    tlm_error err = {0};
    /* Extra blanks are separators; "$HOME" would be expanded by a shell, here it is a macro
     * body that must stay literal, so the string compares equal. */
    const char *src = "#define S(x) #x\n#define XS(x) S(x)\n"
                      "int value(void) { return VALUE; }\n"
                      "const char *lit(void) { return XS(LIT); }\n";
    int rc = tc_cc_compile(src, "  -O1 \t -DVALUE=42   -DLIT=$HOME ", so, NULL, &err);
    cr_assert_eq(rc, 0, "%s", err.msg);
    void *h = dlopen(so, RTLD_NOW | RTLD_LOCAL);
    cr_assert_not_null(h, "%s", dlerror());
    int (*value)(void) = (int (*)(void))dlsym(h, "value");
    const char *(*lit)(void) = (const char *(*)(void))dlsym(h, "lit");
    cr_assert_eq(value(), 42);
    cr_assert_str_eq(lit(), "$HOME");
    dlclose(h);
}

Test(cc, syntax_error_reports_compiler_message)
{
    char so[300];
    path_in(so, sizeof so, "bad.so");
    tlm_error err = {0};
    char *log = NULL;
    const char *src = "int f(int a) {\n    return a +;\n}\n";
    int rc = tc_cc_compile(src, NULL, so, &log, &err);
    cr_assert_eq(rc, TLM_ETOOLCHAIN);
    cr_assert_eq(err.code, TLM_ETOOLCHAIN);
    cr_assert(strstr(err.msg, "error"), "msg: %s", err.msg);
    cr_assert(strstr(err.msg, "kernel.c:2"), "the message names the line: %s", err.msg);
    cr_assert_not_null(log);
    cr_assert(strstr(log, "expected expression"), "log: %s", log);
    cr_assert_null(strchr(err.msg, '\n'), "one line: %s", err.msg);
    free(log);
    cr_assert(!file_exists(so));
    cr_assert_eq(count_entries(g_dir), 0);
}

Test(cc, replaces_output_atomically)
{
    char so[300];
    path_in(so, sizeof so, "v.so");
    tlm_error err = {0};
    cr_assert_eq(tc_cc_compile("int v(void) { return 1; }\n", NULL, so, NULL, &err), 0, "%s",
                 err.msg);
    void *h1 = dlopen(so, RTLD_NOW | RTLD_LOCAL);
    cr_assert_not_null(h1);
    int (*v1)(void) = (int (*)(void))dlsym(h1, "v");

    cr_assert_eq(tc_cc_compile("int v(void) { return 2; }\n", NULL, so, NULL, &err), 0, "%s",
                 err.msg);
    /* The first mapping survives (rename leaves its inode alone). */
    cr_assert_eq(v1(), 1);
    dlclose(h1);
    void *h2 = dlopen(so, RTLD_NOW | RTLD_LOCAL);
    cr_assert_not_null(h2);
    int (*v2)(void) = (int (*)(void))dlsym(h2, "v");
    cr_assert_eq(v2(), 2);
    dlclose(h2);
}

Test(cc, bad_arguments)
{
    tlm_error err = {0};
    char so[300];
    path_in(so, sizeof so, "x.so");
    cr_assert_eq(tc_cc_compile(NULL, NULL, so, NULL, &err), TLM_EINVAL);
    cr_assert_str_eq(err.field, "source");
    cr_assert_eq(tc_cc_compile("int x;", NULL, "", NULL, &err), TLM_EINVAL);
    cr_assert_str_eq(err.field, "out_so_path");
    cr_assert_eq(tc_cc_compile("int x;", NULL, NULL, NULL, &err), TLM_EINVAL);
}

Test(cc, missing_output_directory_is_io_error)
{
    char so[300];
    path_in(so, sizeof so, "no/such/dir/x.so");
    tlm_error err = {0};
    int rc = tc_cc_compile("int x(void) { return 0; }\n", NULL, so, NULL, &err);
    cr_assert_eq(rc, TLM_EIO, "rc=%d %s", rc, err.msg);
    cr_assert_str_eq(err.field, "out_so_path");
}

Test(cc, missing_compiler)
{
    char so[300];
    path_in(so, sizeof so, "x.so");
    tlm_error err = {0};
    tc_cc_opts o = {.compiler = "/nonexistent/bin/cc"};
    char *log = (char *)1;
    int rc = tc_cc_compile_ex("int x;", NULL, so, &o, &log, &err);
    cr_assert_eq(rc, TLM_ETOOLCHAIN);
    cr_assert(strstr(err.msg, "cannot run"), "%s", err.msg);
    cr_assert(strstr(err.msg, "/nonexistent/bin/cc"), "%s", err.msg);
    cr_assert_null(log);
}

Test(cc, no_output_from_flags)
{
    char so[300];
    path_in(so, sizeof so, "x.so");
    tlm_error err = {0};
    int rc = tc_cc_compile("int x;", "-E", so, NULL, &err);
    cr_assert_eq(rc, TLM_ETOOLCHAIN, "rc=%d %s", rc, err.msg);
    cr_assert(!file_exists(so));
}

/* 1 while `pid` runs: absent from /proc or a zombie counts as gone. */
static int process_alive(long pid)
{
    char p[64], stat[512];
    snprintf(p, sizeof p, "/proc/%ld/stat", pid);
    FILE *f = fopen(p, "r");
    if (!f) return 0;
    size_t n = fread(stat, 1, sizeof stat - 1, f);
    fclose(f);
    stat[n] = '\0';
    const char *rp = strrchr(stat, ')'); /* state follows "(comm)" */
    return !(rp && rp[1] == ' ' && (rp[2] == 'Z' || rp[2] == 'X'));
}

/* A "compiler" that hangs, with a grandchild holding the pipe: the timeout must kill the
 * whole process group, grandchild included. */
Test(cc, timeout_kills_the_process_group, .timeout = 60)
{
    char script[300], so[300], pidfile[300], text[600];
    path_in(script, sizeof script, "slowcc.sh");
    path_in(so, sizeof so, "x.so");
    path_in(pidfile, sizeof pidfile, "grandchild.pid");
    snprintf(text, sizeof text, "#!/bin/sh\nsleep 50 &\necho $! > '%s'\nsleep 50\n", pidfile);
    FILE *f = fopen(script, "w");
    cr_assert_not_null(f);
    fputs(text, f);
    fclose(f);
    chmod(script, 0755);
    tlm_error err = {0};
    tc_cc_opts o = {.timeout_ms = 500, .compiler = script};
    char *log = NULL;
    int rc = tc_cc_compile_ex("int x;", NULL, so, &o, &log, &err);
    cr_assert_eq(rc, TLM_ETOOLCHAIN);
    cr_assert(strstr(err.msg, "500 ms"), "%s", err.msg);
    cr_assert(strstr(err.msg, "killed"), "%s", err.msg);
    free(log);
    cr_assert(!file_exists(so));

    f = fopen(pidfile, "r");
    cr_assert_not_null(f, "the script did not start");
    long pid = 0;
    cr_assert_eq(fscanf(f, "%ld", &pid), 1);
    fclose(f);
    /* SIGKILL is asynchronous: give the kernel up to 10 s to finish the job. */
    for (int i = 0; i < 1000 && process_alive(pid); i++)
        usleep(10000);
    cr_assert(!process_alive(pid), "grandchild %ld survived the timeout", pid);
}

Test(cc, failing_compiler_exit_status)
{
    char script[300], so[300];
    path_in(script, sizeof script, "failcc.sh");
    path_in(so, sizeof so, "x.so");
    FILE *f = fopen(script, "w");
    cr_assert_not_null(f);
    fputs("#!/bin/sh\necho \"fake: error: nothing works\" >&2\nexit 3\n", f);
    fclose(f);
    chmod(script, 0755);
    tlm_error err = {0};
    tc_cc_opts o = {.compiler = script};
    int rc = tc_cc_compile_ex("int x;", NULL, so, &o, NULL, &err);
    cr_assert_eq(rc, TLM_ETOOLCHAIN);
    cr_assert(strstr(err.msg, "exit 3"), "%s", err.msg);
    cr_assert(strstr(err.msg, "fake: error: nothing works"), "%s", err.msg);
}

typedef struct {
    int i;
    int rc;
    int value;
    tlm_error err;
} job;

static void *compile_job(void *arg)
{
    job *j = arg;
    char src[256], so[300], name[32];
    snprintf(src, sizeof src,
             "int val(void) { int s = 0; for (int k = 0; k <= %d; k++) s += k; return s; }\n",
             j->i * 10);
    snprintf(name, sizeof name, "t%d.so", j->i);
    path_in(so, sizeof so, name);
    j->rc = tc_cc_compile(src, "-O1", so, NULL, &j->err);
    if (j->rc) return NULL;
    void *h = dlopen(so, RTLD_NOW | RTLD_LOCAL);
    if (!h) {
        j->rc = -100;
        return NULL;
    }
    int (*val)(void) = (int (*)(void))dlsym(h, "val");
    j->value = val ? val() : -1;
    dlclose(h);
    return NULL;
}

Test(cc, concurrent_compiles)
{
    enum { N = 4 };
    pthread_t th[N];
    job jobs[N];
    memset(jobs, 0, sizeof jobs);
    for (int i = 0; i < N; i++) {
        jobs[i].i = i + 1;
        cr_assert_eq(pthread_create(&th[i], NULL, compile_job, &jobs[i]), 0);
    }
    for (int i = 0; i < N; i++)
        pthread_join(th[i], NULL);
    for (int i = 0; i < N; i++) {
        int n = jobs[i].i * 10;
        cr_assert_eq(jobs[i].rc, 0, "job %d: %d %s", i, jobs[i].rc, jobs[i].err.msg);
        cr_assert_eq(jobs[i].value, n * (n + 1) / 2, "job %d", i);
    }
}

Test(cc, identity_is_stable)
{
    const char *a = tc_cc_identity();
    cr_assert_not_null(a);
    cr_assert(strstr(a, "cc="), "%s", a);
    cr_assert(strstr(a, "base=-std=gnu11 -shared -fPIC -fopenmp -lm"), "%s", a);
    cr_assert_null(strstr(a, "version=unavailable"), "cc is installed: %s", a);
    char copy[1024];
    snprintf(copy, sizeof copy, "%s", a);
    const char *b = tc_cc_identity();
    cr_assert_eq(a, b);
    cr_assert_str_eq(copy, b);
}

/* ---- working directories ------------------------------------------------------------ */

TestSuite(tmpdir, .init = make_dir, .fini = remove_dir);

/* A directory named NAME under the test directory, holding a file, last changed AGE_S ago. */
static void stale_dir(const char *name, int age_s)
{
    char d[400], f[500];
    path_in(d, sizeof d, name);
    cr_assert_eq(mkdir(d, 0700), 0, "%s", d);
    snprintf(f, sizeof f, "%s/kernel.c", d);
    FILE *fp = fopen(f, "w");
    cr_assert_not_null(fp);
    fputs("int x;\n", fp);
    fclose(fp);
    struct timespec t[2] = {{.tv_sec = time(NULL) - age_s}, {.tv_sec = time(NULL) - age_s}};
    cr_assert_eq(utimensat(AT_FDCWD, d, t, 0), 0);
}

static bool present(const char *name)
{
    char d[400];
    path_in(d, sizeof d, name);
    struct stat st;
    return lstat(d, &st) == 0;
}

/* The name carries the PID; the directory is private. */
Test(tmpdir, made_with_the_pid_in_its_name)
{
    char old[300];
    const char *t = getenv("TMPDIR");
    snprintf(old, sizeof old, "%s", t ? t : "");
    setenv("TMPDIR", g_dir, 1);
    char dir[512], want[64];
    tlm_error err = {0};
    int rc = tc_tmpdir_make("cc", dir, sizeof dir, &err);
    if (old[0]) setenv("TMPDIR", old, 1);
    else unsetenv("TMPDIR");
    cr_assert_eq(rc, 0, "%s", err.msg);
    snprintf(want, sizeof want, "/tlm-cc-%ld-", (long)getpid());
    cr_expect(strstr(dir, want) != NULL, "%s", dir);
    struct stat st;
    cr_assert_eq(stat(dir, &st), 0);
    cr_expect_eq(st.st_mode & 0777, 0700);
    tc_remove_tree(dir);
    cr_expect(stat(dir, &st) != 0);
}

/* Only the orphans go: a dead PID's directory unchanged for the age given, or a name without
 * a PID a day old. A live process's stays (this one's, however old), as do a dead PID's
 * recent one, a young name without a PID, other names, and a link (neither it nor what it
 * points to is touched). */
Test(tmpdir, sweep_takes_only_what_dead_processes_left)
{
    pid_t child = fork();
    cr_assert_geq(child, 0);
    if (child == 0) _exit(0);
    cr_assert_eq(waitpid(child, NULL, 0), child);
    char dead_old[64], dead_young[64], dead_drv[64], live_old[64];
    snprintf(dead_old, sizeof dead_old, "tlm-cc-%ld-aB3dE9", (long)child);
    snprintf(dead_young, sizeof dead_young, "tlm-cc-%ld-Zx81Qq", (long)child);
    snprintf(dead_drv, sizeof dead_drv, "tlm-drv-%ld-0Kq2pL", (long)child);
    snprintf(live_old, sizeof live_old, "tlm-cc-%ld-Lv1Old", (long)getpid());
    stale_dir(dead_old, 3600);
    stale_dir(dead_young, 10);
    stale_dir(dead_drv, 3600);
    stale_dir(live_old, 3 * 24 * 3600);
    stale_dir("tlm-cc-06mfWO", 2 * 24 * 3600); /* before the PID was in the name */
    stale_dir("tlm-drv-Ab12Cd", 3600);
    stale_dir("tlm-test-keep-1-abc", 3 * 24 * 3600);
    stale_dir("target", 3 * 24 * 3600);
    char target[400], link[400];
    path_in(target, sizeof target, "target");
    char link_name[64];
    snprintf(link_name, sizeof link_name, "tlm-cc-%ld-LnkLnk", (long)child);
    path_in(link, sizeof link, link_name);
    cr_assert_eq(symlink(target, link), 0);

    cr_expect_eq(tc_tmpdir_sweep(g_dir, 600), 3);
    cr_expect(!present(dead_old));
    cr_expect(!present(dead_drv));
    cr_expect(!present("tlm-cc-06mfWO"));
    cr_expect(present(dead_young));
    cr_expect(present(live_old));
    cr_expect(present("tlm-drv-Ab12Cd"));
    cr_expect(present("tlm-test-keep-1-abc"));
    cr_expect(present(link_name));
    cr_expect(present("target/kernel.c"));
    cr_expect_eq(tc_tmpdir_sweep(g_dir, 600), 0, "a second sweep finds nothing");
    cr_expect_eq(tc_tmpdir_sweep("/nonexistent/tlm-sweep", 600), 0);
}

Test(log_head, starts_at_first_error_and_joins_lines)
{
    char buf[200];
    const char *log = "kernel.c: In function 'f':\n"
                      "kernel.c:2:16: error: expected expression before ';' token\n"
                      "    2 |     return a +;\n"
                      "      |               ^\n";
    size_t n = tc_log_head(log, buf, sizeof buf, 6);
    cr_assert_gt(n, 0);
    cr_assert(!strncmp(buf, "kernel.c:2:16: error", 20), "%s", buf);
    cr_assert_null(strchr(buf, '\n'));
    cr_assert(strstr(buf, "return a +;"), "%s", buf);

    /* The linker's summary line is not a useful start: the undefined symbol comes before. */
    const char *ld = "/usr/bin/ld: k.o: in function `f':\n"
                     "k.c:(.text+0x5): undefined reference to `g'\n"
                     "collect2: error: ld returned 1 exit status\n";
    tc_log_head(ld, buf, sizeof buf, 6);
    cr_assert(strstr(buf, "undefined reference to `g'"), "%s", buf);

    /* Truncation keeps the string terminated. */
    char small[8];
    cr_assert_eq(tc_log_head(log, small, sizeof small, 6), 7);
    cr_assert_eq(small[7], '\0');
    cr_assert_eq(tc_log_head(NULL, buf, sizeof buf, 6), 0);
}

/* ---- NVRTC ----------------------------------------------------------------------------- */

/* Without the toolkit NVRTC must say so in the documented way; the rest is then skipped. */
static void need_nvrtc(void)
{
    tlm_error err = {0};
    int rc = tc_nvrtc_available(&err);
    if (rc) {
        cr_assert_eq(rc, TLM_EUNSUPPORTED);
        cr_assert_str_eq(err.msg,
                         "CUDA compilation unavailable: libnvrtc not found (set CUDA_HOME)");
        cr_assert_str_eq(tc_nvrtc_identity(), "nvrtc:unavailable");
        cr_skip_test("NVRTC not available: %s", err.msg);
    }
}

static const char *k_saxpy =
    "extern \"C\" __global__ void saxpy(float a, const float *x, float *y, int n)\n"
    "{\n"
    "    int i = blockIdx.x * blockDim.x + threadIdx.x;\n"
    "    if (i < n) y[i] = a * x[i] + y[i];\n"
    "}\n";

static const char *k_shared = "extern \"C\" __global__ void reverse256(const float *x, float *y)\n"
                              "{\n"
                              "    __shared__ float buf[256];\n"
                              "    buf[threadIdx.x] = x[blockIdx.x * 256 + threadIdx.x];\n"
                              "    __syncthreads();\n"
                              "    y[blockIdx.x * 256 + threadIdx.x] = buf[255 - threadIdx.x];\n"
                              "}\n"
                              "template <int T> __global__ void tile(double *y)\n"
                              "{\n"
                              "    __shared__ double b[T];\n"
                              "    b[threadIdx.x] = y[threadIdx.x];\n"
                              "    __syncthreads();\n"
                              "    y[threadIdx.x] = b[T - 1 - threadIdx.x];\n"
                              "}\n"
                              "template __global__ void tile<100>(double *);\n";

static void check_elf(const tc_cubin *c)
{
    cr_assert_not_null(c->data);
    cr_assert_gt(c->size, 64);
    cr_assert(c->data[0] == 0x7f && c->data[1] == 'E' && c->data[2] == 'L' && c->data[3] == 'F');
}

Test(nvrtc, saxpy_for_sm80_and_sm90)
{
    need_nvrtc();
    int sms[] = {80, 90};
    for (int k = 0; k < 2; k++) {
        tc_cubin c;
        tlm_error err = {0};
        int rc = tc_nvrtc_compile(k_saxpy, "saxpy", sms[k], &c, &err);
        cr_assert_eq(rc, 0, "sm_%d: %s", sms[k], err.msg);
        check_elf(&c);
        cr_assert_eq(c.sm, sms[k]);
        cr_assert_str_eq(c.entry, "saxpy");
        cr_assert_gt(c.regs, 0);
        cr_assert_lt(c.regs, 64);
        cr_assert_eq(c.smem_bytes, 0);
        cr_assert_eq(c.spill_stores, 0);
        cr_assert_eq(c.spill_loads, 0);
        cr_assert_eq(c.stack_bytes, 0);
        cr_assert_not_null(c.log);
        char want[64];
        snprintf(want, sizeof want, "for 'sm_%d'", sms[k]);
        cr_assert(strstr(c.log, want), "log: %s", c.log);
        tc_cubin_free(&c);
        cr_assert_null(c.data);
    }
}

Test(nvrtc, static_shared_memory_is_reported)
{
    need_nvrtc();
    tc_cubin c;
    tlm_error err = {0};
    cr_assert_eq(tc_nvrtc_compile(k_shared, "reverse256", 80, &c, &err), 0, "%s", err.msg);
    check_elf(&c);
    cr_assert_eq(c.smem_bytes, 256 * 4);
    cr_assert_gt(c.regs, 0);
    tc_cubin_free(&c);

    /* A template instance: the entry is the mangled name, its own smem. */
    cr_assert_eq(tc_nvrtc_compile(k_shared, "tile<100>", 90, &c, &err), 0, "%s", err.msg);
    cr_assert(!strncmp(c.entry, "_Z", 2), "entry %s", c.entry);
    cr_assert_eq(c.smem_bytes, 100 * 8);
    tc_cubin_free(&c);
}

Test(nvrtc, local_array_reports_stack)
{
    need_nvrtc();
    const char *src = "extern \"C\" __global__ void local(float *y, int k)\n"
                      "{\n"
                      "    float a[512];\n"
                      "    for (int i = 0; i < 512; i++) a[i] = y[i * threadIdx.x];\n"
                      "    y[threadIdx.x] = a[(k * 7 + threadIdx.x) % 512];\n"
                      "}\n";
    tc_cubin c;
    tlm_error err = {0};
    cr_assert_eq(tc_nvrtc_compile(src, "local", 90, &c, &err), 0, "%s", err.msg);
    cr_assert_geq(c.stack_bytes, 512 * 4);
    cr_assert_eq(c.smem_bytes, 0);
    tc_cubin_free(&c);
}

Test(nvrtc, extra_options_reach_ptxas)
{
    need_nvrtc();
    /* Many live accumulators: about 110 registers unless capped. (ptxas raises caps below 24
     * to 24 on sm_80.) */
    const char *src =
        "extern \"C\" __global__ void heavy(float *y)\n"
        "{\n"
        "    float acc[32];\n"
        "#pragma unroll\n"
        "    for (int i = 0; i < 32; i++) acc[i] = y[i * blockDim.x + threadIdx.x];\n"
        "    for (int r = 0; r < 8; r++) {\n"
        "#pragma unroll\n"
        "        for (int i = 0; i < 32; i++) acc[i] = acc[i] * acc[(i + 1) % 32] + 1.0f;\n"
        "    }\n"
        "#pragma unroll\n"
        "    for (int i = 0; i < 32; i++) y[i * blockDim.x + threadIdx.x] = acc[i];\n"
        "}\n";
    tc_cubin c;
    tlm_error err = {0};
    cr_assert_eq(tc_nvrtc_compile(src, "heavy", 80, &c, &err), 0, "%s", err.msg);
    int free_regs = c.regs;
    tc_cubin_free(&c);
    cr_assert_gt(free_regs, 32);
    const char *opts[] = {"-maxrregcount=32", NULL};
    cr_assert_eq(tc_nvrtc_compile_ex(src, "heavy", 80, opts, &c, &err), 0, "%s", err.msg);
    cr_assert_leq(c.regs, 32);
    cr_assert_gt(c.spill_stores + c.stack_bytes, 0, "capped registers must spill");
    tc_cubin_free(&c);
}

Test(nvrtc, syntax_error_reports_log)
{
    need_nvrtc();
    const char *src = "extern \"C\" __global__ void f(float *y)\n{\n    y[0] = ;\n}\n";
    tc_cubin c;
    tlm_error err = {0};
    int rc = tc_nvrtc_compile(src, "f", 90, &c, &err);
    cr_assert_eq(rc, TLM_ETOOLCHAIN);
    cr_assert(strstr(err.msg, "kernel.cu(3)"), "msg: %s", err.msg);
    cr_assert(strstr(err.msg, "error"), "msg: %s", err.msg);
    cr_assert_not_null(c.log);
    cr_assert(strstr(c.log, "expected an expression"), "log: %s", c.log);
    cr_assert_null(c.data);
    cr_assert_null(c.entry);
    tc_cubin_free(&c);
    cr_assert_null(c.log);
}

Test(nvrtc, undefined_kernel)
{
    need_nvrtc();
    tc_cubin c;
    tlm_error err = {0};
    int rc = tc_nvrtc_compile(k_saxpy, "daxpy", 90, &c, &err);
    cr_assert_eq(rc, TLM_ETOOLCHAIN);
    cr_assert_str_eq(err.field, "kernel_name");
    cr_assert(strstr(err.msg, "daxpy"), "%s", err.msg);
    tc_cubin_free(&c);
}

Test(nvrtc, bad_arguments_and_arch)
{
    need_nvrtc();
    tc_cubin c;
    tlm_error err = {0};
    cr_assert_eq(tc_nvrtc_compile(k_saxpy, "saxpy", 5, &c, &err), TLM_EINVAL);
    cr_assert_str_eq(err.field, "sm");
    /* sm_35 left NVRTC years ago. */
    cr_assert_eq(tc_nvrtc_compile(k_saxpy, "saxpy", 35, &c, &err), TLM_EUNSUPPORTED);
    cr_assert_str_eq(err.field, "sm");
    cr_assert(strstr(err.msg, "sm_35"), "%s", err.msg);
    cr_assert(strstr(err.msg, "90"), "lists what is supported: %s", err.msg);
    cr_assert_eq(tc_nvrtc_compile("", "saxpy", 90, &c, &err), TLM_EINVAL);
    cr_assert_eq(tc_nvrtc_compile(k_saxpy, "", 90, &c, &err), TLM_EINVAL);
    cr_assert_eq(tc_nvrtc_compile(k_saxpy, "saxpy", 90, NULL, &err), TLM_EINVAL);
    const char *bad[] = {"--no-such-option", NULL};
    cr_assert_eq(tc_nvrtc_compile_ex(k_saxpy, "saxpy", 90, bad, &c, &err), TLM_EINVAL, "%s",
                 err.msg);
    tc_cubin_free(&c);
}

Test(nvrtc, identity_is_stable)
{
    need_nvrtc();
    const char *a = tc_nvrtc_identity();
    cr_assert(!strncmp(a, "nvrtc=", 6), "%s", a);
    cr_assert(strstr(a, "--ptxas-options=-v"), "%s", a);
    cr_assert_null(strstr(a, "nvrtc=0.0"), "%s", a);
    cr_assert_eq(a, tc_nvrtc_identity());
}

Test(nvrtc, missing_library_is_unsupported)
{
    /* Each Criterion test is its own process, so this is the first load. */
    setenv("TLM_NVRTC_LIB", "/nonexistent/libnvrtc.so", 1);
    tc_cubin c;
    tlm_error err = {0};
    cr_assert_eq(tc_nvrtc_compile(k_saxpy, "saxpy", 90, &c, &err), TLM_EUNSUPPORTED);
    cr_assert_str_eq(err.msg, "CUDA compilation unavailable: libnvrtc not found (set CUDA_HOME)");
    cr_assert_null(c.data);
    cr_assert_str_eq(tc_nvrtc_identity(), "nvrtc:unavailable");
    cr_assert_eq(tc_nvrtc_available(NULL), TLM_EUNSUPPORTED);
    tc_cubin_free(&c);
}

typedef struct {
    int sm;
    int rc;
    int smem;
    tlm_error err;
} nv_job;

static void *nvrtc_job(void *arg)
{
    nv_job *j = arg;
    tc_cubin c;
    j->rc = tc_nvrtc_compile(k_shared, "reverse256", j->sm, &c, &j->err);
    j->smem = c.smem_bytes;
    tc_cubin_free(&c);
    return NULL;
}

Test(nvrtc, concurrent_compiles)
{
    need_nvrtc();
    nv_job jobs[2] = {{.sm = 80}, {.sm = 90}};
    pthread_t th[2];
    for (int i = 0; i < 2; i++)
        cr_assert_eq(pthread_create(&th[i], NULL, nvrtc_job, &jobs[i]), 0);
    for (int i = 0; i < 2; i++)
        pthread_join(th[i], NULL);
    for (int i = 0; i < 2; i++) {
        cr_assert_eq(jobs[i].rc, 0, "%s", jobs[i].err.msg);
        cr_assert_eq(jobs[i].smem, 1024);
    }
}

/* ---- ptxas log parsing and limits (no NVRTC needed) ------------------------------------ */

Test(ptxas, parses_the_requested_entry)
{
    /* Older ptxas format (no barriers), a non-inlined device function with its own
     * properties, and two entries. */
    const char *log =
        "ptxas info    : 0 bytes gmem\n"
        "ptxas info    : Function properties for _Z6helperf\n"
        "ptxas         .     24 bytes stack frame, 8 bytes spill stores, 8 bytes spill loads\n"
        "ptxas info    : Compiling entry function 'first' for 'sm_80'\n"
        "ptxas info    : Function properties for first\n"
        "ptxas         .     16 bytes stack frame, 4 bytes spill stores, 12 bytes spill loads\n"
        "ptxas info    : Used 40 registers, 4096 bytes smem, 380 bytes cmem[0]\n"
        "ptxas info    : Compiling entry function 'second' for 'sm_80'\n"
        "ptxas info    : Function properties for second\n"
        "ptxas         .     0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads\n"
        "ptxas info    : Used 10 registers, used 0 barriers, 360 bytes cmem[0]\n";
    tc_cubin c = {0};
    cr_assert_eq(tc_ptxas_parse(log, "first", &c), 0);
    cr_assert_eq(c.regs, 40);
    cr_assert_eq(c.smem_bytes, 4096);
    cr_assert_eq(c.cmem_bytes, 380);
    cr_assert_eq(c.stack_bytes, 16);
    cr_assert_eq(c.spill_stores, 4);
    cr_assert_eq(c.spill_loads, 12);

    cr_assert_eq(tc_ptxas_parse(log, "second", &c), 0);
    cr_assert_eq(c.regs, 10);
    cr_assert_eq(c.smem_bytes, 0);
    cr_assert_eq(c.stack_bytes, 0);
    cr_assert_eq(c.spill_stores, 0);

    /* A prefix of an entry's name is not that entry. */
    cr_assert_eq(tc_ptxas_parse(log, "sec", &c), TLM_ENOTFOUND);
    cr_assert_eq(c.regs, -1);
    cr_assert_eq(tc_ptxas_parse(NULL, "first", &c), TLM_ENOTFOUND);
    cr_assert_eq(tc_ptxas_parse("", "first", &c), TLM_ENOTFOUND);
}

Test(limits, registers_and_shared_memory)
{
    tlm_error err = {0};
    tc_cubin c = {.regs = 64, .smem_bytes = 48 * 1024, .spill_stores = 100, .stack_bytes = 64};
    /* 64 regs x 1024 threads = exactly the 64 Ki register file; spills are not rejected. */
    cr_assert_eq(tc_cubin_check_limits(&c, 255, 1024, 65536, 48 * 1024, &err), 0, "%s", err.msg);
    /* 65 regs round up to 72 per thread (2304 per warp): 73728 > 65536. */
    c.regs = 65;
    cr_assert_eq(tc_cubin_check_limits(&c, 255, 1024, 65536, 48 * 1024, &err), TLM_ELIMIT);
    cr_assert_str_eq(err.field, "regs");
    cr_assert_eq(tc_cubin_check_limits(&c, 255, 512, 65536, 48 * 1024, &err), 0, "%s", err.msg);
    c.regs = 256;
    cr_assert_eq(tc_cubin_check_limits(&c, 255, 32, 65536, 48 * 1024, &err), TLM_ELIMIT);
    c.regs = 32;
    c.smem_bytes = 48 * 1024 + 1;
    cr_assert_eq(tc_cubin_check_limits(&c, 255, 128, 65536, 48 * 1024, &err), TLM_ELIMIT);
    cr_assert_str_eq(err.field, "smem_bytes");
    /* Unknown figures are not checked. */
    tc_cubin u = {.regs = -1, .smem_bytes = -1};
    cr_assert_eq(tc_cubin_check_limits(&u, 255, 1024, 65536, 0, &err), 0);
    /* Bad arguments. */
    cr_assert_eq(tc_cubin_check_limits(&c, 255, 0, 65536, 48 * 1024, &err), TLM_EINVAL);
    cr_assert_eq(tc_cubin_check_limits(&c, 255, 1025, 65536, 48 * 1024, &err), TLM_EINVAL);
    cr_assert_eq(tc_cubin_check_limits(NULL, 255, 32, 65536, 48 * 1024, &err), TLM_EINVAL);
}

/* ---- CUDA driver loading --------------------------------------------------------------- */

Test(cuda_dl, driver_or_clean_error)
{
    const tc_cuda *cu = (const tc_cuda *)1;
    tlm_error err = {0};
    int rc = tc_cuda_get(&cu, &err);
    if (rc == 0) {
        /* A GPU machine: the table is complete. */
        cr_assert_not_null(cu);
        cr_assert_gt(cu->device_count, 0);
        cr_assert(cu->launch_kernel && cu->mem_alloc && cu->event_elapsed_time);
        return;
    }
    cr_assert_eq(rc, TLM_EUNSUPPORTED);
    cr_assert_null(cu);
    cr_assert(strstr(err.msg, "no CUDA driver (libcuda.so.1 not found)") ||
                  strstr(err.msg, "no GPU"),
              "%s", err.msg);
    /* Cached: the second answer is the same. */
    tlm_error err2 = {0};
    cr_assert_eq(tc_cuda_get(&cu, &err2), rc);
    cr_assert_str_eq(err.msg, err2.msg);
}

Test(cuda_dl, stub_library_reads_as_no_gpu)
{
    char stub[512];
    snprintf(stub, sizeof stub, "%s/lib64/stubs/libcuda.so", tc_dl_cuda_home());
    if (!file_exists(stub)) cr_skip_test("no stub libcuda at %s", stub);
    tc_cuda c;
    tlm_error err = {0};
    /* Every symbol resolves in the stub, so this reaches cuInit, which fails. */
    int rc = tc_cuda_open(stub, &c, &err);
    cr_assert_eq(rc, TLM_EUNSUPPORTED);
    cr_assert(strstr(err.msg, "no GPU: cuInit failed"), "%s", err.msg);
    cr_assert(strstr(err.msg, "CUDA_ERROR_STUB_LIBRARY"), "%s", err.msg);
    cr_assert_null(c.lib);
    tc_cuda_close(&c);
}

Test(cuda_dl, missing_library)
{
    tc_cuda c;
    tlm_error err = {0};
    cr_assert_eq(tc_cuda_open("/nonexistent/libcuda.so.1", &c, &err), TLM_EUNSUPPORTED);
    cr_assert(strstr(err.msg, "no CUDA driver"), "%s", err.msg);
    cr_assert_eq(tc_cuda_open("", &c, &err), TLM_EINVAL);
    cr_assert_eq(tc_cuda_check(NULL, 0, "x", &err), 0);
    cr_assert_eq(tc_cuda_check(NULL, 2, "cuMemAlloc", &err), TLM_ERUNTIME);
    cr_assert(strstr(err.msg, "cuMemAlloc"), "%s", err.msg);
}

Test(cuda_dl, open_first_reports_why)
{
    char which[64] = "x", why[256] = "";
    const char *names[] = {"/nonexistent/a.so", "libm.so.6", NULL};
    void *h = tc_dl_open_first(names, which, sizeof which, why, sizeof why);
    cr_assert_not_null(h);
    cr_assert_str_eq(which, "libm.so.6");
    dlclose(h);
    const char *none[] = {"/nonexistent/a.so", NULL};
    cr_assert_null(tc_dl_open_first(none, which, sizeof which, why, sizeof why));
    cr_assert(strstr(why, "/nonexistent/a.so"), "%s", why);
}
