/* main.c — `tlm`, the offline toolkit: dispatches to one subcommand per file (cmd_*.c). */
#include <stdio.h>
#include <string.h>

#include "tools/tlm/cli.h"

#ifndef TLM_VERSION
#define TLM_VERSION "0.1.0"
#endif

/* The subcommands, in the order `tlm --help` lists them. Adding one = a cmd_<name>.c that
 * defines cli_cmd_<name>, plus one X(<name>) line here. */
#define TLM_COMMANDS(X)                                                                            \
    X(ir)                                                                                          \
    X(space)                                                                                       \
    X(compile)                                                                                     \
    X(generate)                                                                                    \
    X(tune)                                                                                        \
    X(records)                                                                                     \
    X(datagen)                                                                                     \
    X(train)                                                                                       \
    X(eval)                                                                                        \
    X(htam)                                                                                        \
    X(run)                                                                                         \
    X(model)

#define CLI_DECLARE(n) extern const cli_cmd cli_cmd_##n;
TLM_COMMANDS(CLI_DECLARE)
#define CLI_ENTRY(n) &cli_cmd_##n,
static const cli_cmd *const commands[] = {TLM_COMMANDS(CLI_ENTRY)};
#define N_COMMANDS ((int)(sizeof commands / sizeof commands[0]))

static void usage(FILE *to)
{
    fprintf(to, "usage: tlm COMMAND [ARGS]   (tlm COMMAND --help for its options)\n"
                "       tlm --help | --version\n\ncommands:\n");
    for (int i = 0; i < N_COMMANDS; i++)
        fprintf(to, "  %-10s %s\n", commands[i]->name, commands[i]->summary);
    fprintf(to,
            "\nW (--workload) is inline JSON, @FILE or @- (stdin), e.g.\n"
            "  '{\"op\": \"dense\", \"shape\": {\"M\": 64, \"N\": 64, \"K\": 64}}'\n"
            "T (--target) is cpu, cpu:avx2, cpu:avx512, cuda:sm_80, cuda:sm_90, cuda:h100, ...\n");
    fprintf(to, "\nexit status: 0 success, 1 the work failed, 2 bad usage or bad input\n");
}

int main(int argc, char **argv)
{
    if (argc < 2) {
        usage(stderr);
        return CLI_USAGE;
    }
    const char *name = argv[1];
    if (!strcmp(name, "--help") || !strcmp(name, "-h") || !strcmp(name, "help")) {
        usage(stdout);
        return CLI_OK;
    }
    if (!strcmp(name, "--version") || !strcmp(name, "-V")) {
        printf("tlm %s\n", TLM_VERSION);
        return CLI_OK;
    }
    for (int i = 0; i < N_COMMANDS; i++)
        if (!strcmp(name, commands[i]->name)) return commands[i]->run(argc - 1, argv + 1);
    /* The usage listing is the useful answer to a typo, so it goes out in full; the first
     * line is the error itself. */
    fprintf(stderr, "tlm: unknown command \"%s\"\n", name);
    usage(stderr);
    return CLI_USAGE;
}
