/* runtime.h — runs a compiled network: an execution plan (proto/graph.md) plus its kernels.
 *
 * Contract:
 *  - rt_model_load reads DIR/manifest.json as `tlmc compile -o DIR` and `tlm compile --model
 *    ... -o DIR` write it: "plan" (tensors with arena offsets, launches with argument names)
 *    and "kernels" (per subgraph: binary file, entry, format, launch config, workload). Every
 *    field is checked (types, names, offsets and sizes inside the arena, argument counts);
 *    a bad manifest is TLM_EINVAL naming the field ("plan.launches[3].args[1]").
 *  - CPU kernels ("elf-so") are dlopen'ed from DIR and called through <entry>_packed (the
 *    kernel ABI of compiler/codegen). CUDA kernels ("cubin") are loaded with the driver API
 *    (cuModuleLoadData, cuLaunchKernel with the kernel's grid/block/smem) on device 0's
 *    primary context; the arena is then resident on the device (one cuMemAlloc), inputs and
 *    params are uploaded when they change, outputs read back after each run.
 *  - The host arena (FE_PLAN_ALIGN-aligned, plan.arena_bytes) always exists: binding writes
 *    it, rt_model_data reads it. A view reads its target's bytes.
 *  - Bindings: rt_bind copies a caller's float32 buffer into an input or param;
 *    rt_bind_random fills every input and param deterministically from a seed: inputs
 *    uniform in [-1, 1]; weights (rank >= 2) uniform with variance 1/fan-in (fan-in = K of a
 *    rank-2 [K, N] weight, the elements per output channel of OIHW or [C,KH,KW]), so
 *    deep random networks stay finite; rank-1 params (biases, norm scales) in [0.9, 1.1].
 *  - Prepacks (CPU): a kernel that packs an operand bound to a param (a conv's or a GEMM's
 *    weights) exports prepack entries (codegen.h); before the first rt_run after params are
 *    bound (rt_bind of a param, rt_bind_random), each such operand is packed once into a
 *    buffer of its own, outside the arena, and the launch reads it instead of packing the
 *    weights in every call, as ONNX Runtime and oneDNN pack theirs at load. Params change
 *    only through rt_bind and rt_bind_random (writing a param through rt_model_data does not
 *    refresh its packs). rt_set_prepack(m, false) runs the kernels as compiled (each call
 *    packs); rt_model_prepack_bytes is the packed buffers' size after a run.
 *  - Memory (CPU): the arena and the prepacked buffers (one pool) are each one allocation,
 *    2 MiB-aligned and advised as transparent huge pages (madvise MADV_HUGEPAGE) where they
 *    span one, unless the environment sets TLM_HUGE_PAGES=off (or 0) at rt_model_load or
 *    the first prepack; rt_model_huge_pages tells whether the arena's advice was taken (the
 *    kernel may still give 4 KiB pages: THP disabled, or no free huge page).
 *  - rt_run executes the launches in plan order; launch_s (may be NULL) receives each
 *    launch's seconds (all repeats of it), so the caller can time kernels and the whole run.
 *  - rt_reference re-runs the plan with the reference interpreter (ir_interp_fast_f64, double
 *    precision, per launch on a separate arena) from the same bound inputs and params and
 *    compares every output with the last rt_run: max |ours - ref| / max |ref| per output.
 *    The workload of each kernel comes from the manifest through the caller's decoder (the
 *    JSON codecs live in proto/, which the runtime does not link).
 *  - A model belongs to one thread at a time. Kernels may use OpenMP inside.
 */
#ifndef TLM_RUNTIME_H
#define TLM_RUNTIME_H

#include <stdbool.h>
#include <stdint.h>

#include <jansson.h>

#include "compiler/frontend/frontend.h"
#include "compiler/ir/ir.h"
#include "compiler/util/err.h"

#define RT_MAX_ARGS (IR_MAX_TENSORS + 1)

typedef struct {
    char name[FE_MAX_NAME + 1];
    fe_tensor_kind kind;
    int ndim;
    int64_t shape[IR_MAX_DIMS];
    int64_t bytes, offset;
    int alias; /* tensor index of the view's target, or -1 */
} rt_tensor;

typedef struct {
    int kernel; /* index into the manifest's kernels (= the plan's "subgraph") */
    char node[FE_MAX_NAME + 1];
    int n_args;
    int args[RT_MAX_ARGS]; /* tensor indices */
    int64_t repeat;
    int64_t step[RT_MAX_ARGS]; /* elements */
} rt_launch;

typedef struct rt_model rt_model;

int rt_model_load(const char *dir, rt_model **out, tlm_error *err);
void rt_model_free(rt_model *m);

bool rt_model_cuda(const rt_model *m);
int rt_model_n_tensors(const rt_model *m);
const rt_tensor *rt_model_tensor(const rt_model *m, int i);
int rt_model_n_launches(const rt_model *m);
const rt_launch *rt_model_launch(const rt_model *m, int i);
int64_t rt_model_arena_bytes(const rt_model *m);
/* Tensor index of name, or -1. */
int rt_model_find(const rt_model *m, const char *name);
/* The tensor's float32 values in the host arena (after rt_run: the results). */
float *rt_model_data(rt_model *m, int tensor);

/* Copies n floats into an input or param (n must be its element count). */
int rt_bind(rt_model *m, const char *name, const float *data, int64_t n, tlm_error *err);
/* Every input and param from splitmix64(seed); see the contract. */
void rt_bind_random(rt_model *m, uint64_t seed);

int rt_run(rt_model *m, double *launch_s, tlm_error *err);
/* Prepacks on (the default on CPU) or off; see the contract. */
void rt_set_prepack(rt_model *m, bool on);
int64_t rt_model_prepack_bytes(const rt_model *m);
bool rt_model_huge_pages(const rt_model *m);

typedef int (*rt_workload_decoder)(const json_t *j, ir_workload *w, tlm_error *err);

typedef struct {
    double max_rel_err; /* worst output */
    char worst[FE_MAX_NAME + 1];
    bool finite; /* every output value is finite (ours and the reference's) */
    double seconds;
} rt_check;

int rt_reference(rt_model *m, rt_workload_decoder decode, rt_check *out, tlm_error *err);

#endif
