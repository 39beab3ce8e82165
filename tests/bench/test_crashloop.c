/* test_crashloop.c — the short run of bench/crashloop.sh that `make test` makes: tlmd (TLMD_BIN,
 * default build/san/tlmd) killed with SIGKILL twice in compile and tune bursts on one store, then every
 * kernel key a client was given fetched again with its SHA-256, and PRAGMA integrity_check
 * after every kill. TLM_ROOT names the repository (default: the current directory). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>

#include <criterion/criterion.h>

Test(crashloop, kill9_in_bursts_loses_nothing)
{
    const char *root = getenv("TLM_ROOT");
    const char *bin = getenv("TLMD_BIN");
    char abs[4096];
    cr_assert(realpath(bin && bin[0] ? bin : "build/san/tlmd", abs), "no tlmd binary");
    char cmd[8192];
    snprintf(cmd, sizeof cmd,
             "cd '%s' && TLMD_BIN='%s' CRASHLOOP_CLIENTS=4 CRASHLOOP_WORKLOADS=1 "
             "CRASHLOOP_TUNE_PCT=50 CRASHLOOP_TRIALS=4 bench/crashloop.sh 2 - 2>&1",
             root && root[0] ? root : ".", abs);
    FILE *p = popen(cmd, "r");
    cr_assert(p);
    char out[16384] = "", line[1024];
    while (fgets(line, sizeof line, p))
        if (strlen(out) + strlen(line) < sizeof out) strcat(out, line);
    int st = pclose(p);
    cr_assert(WIFEXITED(st) && WEXITSTATUS(st) == 0, "crashloop.sh failed (%d):\n%s", st, out);
    /* the last row: | kills | answered | tuned | keys | fetched ok | lost | differs | integrity |
     * redis | s | */
    const char *row = strstr(out, "\n| 2 |");
    cr_assert(row, "no result row:\n%s", out);
    int kills, answered, tuned, keys, ok, lost, differs, bad;
    cr_assert_eq(sscanf(row + 1, "| %d | %d | %d | %d | %d | %d | %d | %d |", &kills, &answered,
                        &tuned, &keys, &ok, &lost, &differs, &bad),
                 8, "%s", row);
    cr_assert_leq(tuned, answered);
    cr_assert_geq(answered, 2, "one answer per round is certain:\n%s", out);
    cr_assert_eq(ok, keys);
    cr_assert_eq(lost, 0);
    cr_assert_eq(differs, 0);
    cr_assert_eq(bad, 0);
}
