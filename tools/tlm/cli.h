/* cli.h — plumbing shared by the subcommands of the offline tool `tlm` (DESIGN §10b).
 *
 * Contract:
 *  - A subcommand lives in tools/tlm/cmd_<name>.c, defines `const cli_cmd cli_cmd_<name>`
 *    and is registered by one line in TLM_COMMANDS (main.c). run() gets argv with argv[0]
 *    = the subcommand name and returns the process exit status.
 *  - Exit status: CLI_OK success, CLI_FAIL the work failed, CLI_USAGE bad usage or bad input.
 *    Errors are ONE line on stderr, "tlm: FIELD: MESSAGE" (or "tlm: MESSAGE" without a
 *    field); results go to stdout.
 *  - A workload argument W is inline JSON, "@FILE" (a JSON file) or "@-" (stdin).
 */
#ifndef TLM_TOOLS_CLI_H
#define TLM_TOOLS_CLI_H

#include <stddef.h>
#include <stdint.h>

#include <jansson.h>

#include "compiler/ir/ir.h"
#include "compiler/util/err.h"

enum { CLI_OK = 0, CLI_FAIL = 1, CLI_USAGE = 2 };

typedef struct {
    const char *name;
    const char *summary; /* one line for `tlm --help` */
    int (*run)(int argc, char **argv);
} cli_cmd;

/* Largest file a workload or other input may come from; keeps "@/dev/zero" finite. */
#define CLI_MAX_INPUT (16u << 20)

/* Reads W (inline, @FILE or @-) and decodes it into a checked workload. Errors name the JSON
 * field, or `flag` when the file cannot be read. */
int cli_load_workload(const char *flag, const char *arg, ir_workload *w, tlm_error *err);

/* Whole file (or stdin for "-") into a malloc'ed NUL-terminated buffer; NULL and err filled
 * (field = flag) on failure. */
char *cli_read_file(const char *flag, const char *path, size_t *len, tlm_error *err);

/* Writes data to path through a temporary name and renames, so a reader never sees half a
 * file; errors (TLM_EIO) name "-o", the output directory's flag. */
int cli_write_file(const char *path, const void *data, size_t len, tlm_error *err);

/* Loads a weight file for the tensor language's vocabulary (size and hash checked), with the
 * decoding prior its MANIFEST gives (tlm_weights_manifest); on failure err names `flag` with
 * TLM_EINVAL (bad input) and *out is NULL. */
struct tlm_model;
int cli_load_weights(const char *flag, const char *path, struct tlm_model **out, tlm_error *err);

/* Prints err as one line and returns the exit status for its code (CLI_USAGE for bad input). */
int cli_report(const tlm_error *err);

/* Prints "tlm: <formatted>" as one line and returns CLI_USAGE. */
int cli_usage_error(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

/* Writes j (indented) and a newline to stdout; CLI_OK, or CLI_FAIL if it cannot. */
int cli_print_json(const json_t *j);

/* Decimal unsigned integer <= max (no sign, no blanks, nothing after it); errors name flag. */
int cli_parse_u64(const char *flag, const char *text, uint64_t max, uint64_t *out, tlm_error *err);
/* --prior X: the decoding prior on the default schedule, 0 <= X <= 100 (tlm_model.default_prior). */
int cli_parse_prior(const char *flag, const char *text, double *out, tlm_error *err);

/* The space_sample RNG state for a user seed. `tlm space --seed S` and `tlm compile
 * --schedule random:S` both start from it, so the first sample of one is the schedule of the
 * other. */
uint64_t cli_seed_state(uint64_t seed);

/* `tlm compile --model NAME | --graph FILE ...` (cmd_network.c): a whole network into a
 * directory of kernels and a manifest with its execution plan. run_compile hands over when
 * argv holds --model or --graph. */
int cli_compile_network(int argc, char **argv);
/* An ONNX file (weights included: up to 2 GiB, beyond CLI_MAX_INPUT); NULL and err (field
 * --onnx / --inputs as flag says) on failure. */
char *cli_read_onnx(const char *path, size_t *len, tlm_error *err);

#endif
