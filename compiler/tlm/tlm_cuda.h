/* tlm_cuda.h — where the GPT-2 runtime runs: the CPU, or a CUDA GPU with resident weights.
 *
 * Contract:
 *  - A tlm_device is chosen at run time from a spec: "auto" (or NULL) takes the first CUDA GPU
 *    when the driver loads, a device exists and the GPU path initialises completely (cuBLAS
 *    loaded, kernels compiled by NVRTC for the device's sm and loaded), else the CPU (the
 *    reason is kept: tlm_device_fallback_reason); "cpu" is the CPU; "cuda" / "cuda:N" is that
 *    GPU or an error (TLM_EUNSUPPORTED: "no GPU: ...", "no cuBLAS", ...; TLM_EINVAL for an
 *    ordinal out of range). Nothing links against CUDA: libcuda (compiler/toolchain/cuda_dl.h),
 *    libnvrtc and libcublas are dlopen'ed, so every binary starts on machines without them.
 *  - The CPU device is exactly tlm_forward_batch (tlm.h): same code, same bits.
 *  - On a CUDA device a model's parameters are uploaded on first use (one allocation, one copy)
 *    and stay resident until tlm_device_forget_model or tlm_device_close. The device knows a
 *    model by its address and parameter pointer: forget it before freeing or changing it.
 *  - KV caches live where the forward runs: tlm_kv_new_dev makes one on the device (on the
 *    CPU device, or dev NULL, it is tlm_kv_new's). A device cache has k == v == NULL on the
 *    host; give it only to the *_dev functions of the device that made it, and free it before
 *    closing the device. len and capacity keep their tlm.h meaning.
 *  - tlm_forward_batch_dev has tlm_forward_batch's semantics (tlm_seq, validation before any
 *    change, logits copied back to the host). On the GPU: matrix products are cuBLAS SGEMMs
 *    (FP32, default math: no TF32) in fixed-shape tiles of TLM_CUDA_ROW_TILE rows, and every
 *    other kernel gives a row (or row and head) to one block that reduces in a fixed order,
 *    so a row's logits do not depend on the rest of the batch (batched decoding gives the
 *    tokens of one-at-a-time decoding, as on the CPU). GPU logits equal CPU logits to float
 *    rounding (not bitwise).
 *  - Threads: a device belongs to one thread at a time (the decoder thread); each call makes
 *    the device's primary context current on the calling thread.
 */
#ifndef TLM_TLM_CUDA_H
#define TLM_TLM_CUDA_H

#include "compiler/tlm/tlm.h"

/* Rows per cuBLAS call on the GPU; see the contract. A GPU does a 64-row product of these
 * sizes in about the time of a 1-row one, so the padding of small decode batches is free. */
#define TLM_CUDA_ROW_TILE 64

typedef enum { TLM_DEVICE_CPU = 0, TLM_DEVICE_CUDA = 1 } tlm_device_kind_t;

typedef struct tlm_device tlm_device;

/* spec: "auto" | "cpu" | "cuda" | "cuda:N"; NULL means "auto". */
int tlm_device_open(const char *spec, tlm_device **out, tlm_error *err);
void tlm_device_close(tlm_device *dev);
tlm_device_kind_t tlm_device_kind(const tlm_device *dev); /* NULL: CPU */
/* "cpu", or "cuda:0 (NVIDIA H200, sm_90, 139 GiB)". */
const char *tlm_device_name(const tlm_device *dev);
/* Why "auto" chose the CPU ("" when it did not fall back). */
const char *tlm_device_fallback_reason(const tlm_device *dev);

/* Uploads m now (otherwise the first forward does); no-op on the CPU. */
int tlm_device_upload_model(tlm_device *dev, const tlm_model *m, tlm_error *err);
/* Frees m's resident copy, if any. */
void tlm_device_forget_model(tlm_device *dev, const tlm_model *m);

/* A KV cache on dev (see the contract); dev NULL or CPU: tlm_kv_new's. */
int tlm_kv_new_dev(tlm_device *dev, const tlm_model *m, int capacity, tlm_kv **out, tlm_error *err);
/* tlm_kv_copy for caches of either kind; both must live in the same place (a cache knows its
 * device), else TLM_EINVAL. */
int tlm_kv_copy_dev(tlm_kv *dst, const tlm_kv *src, tlm_error *err);
/* Frees a cache of either kind. */
void tlm_kv_free_dev(tlm_kv *kv);

/* tlm_forward_batch on dev (NULL: the CPU). The device holds its own scratch buffers. */
int tlm_forward_batch_dev(tlm_device *dev, const tlm_model *m, const tlm_seq *seqs, int n_seqs,
                          tlm_error *err);

/* Runs the decoder's forward passes on dev (NULL or a CPU device: the CPU path, as
 * tlm_decoder_new gives). Refused (TLM_EINVAL) while a request is active, since its caches
 * live where they were made. The decoder does not own dev; dev must outlive its use. */
int tlm_decoder_set_device(tlm_decoder *dec, tlm_device *dev, tlm_error *err);

/* ---- the GPU kernels, exposed so tests can compile every one without a GPU ---- */

typedef struct tlm_cuda_kernel {
    const char *name;   /* extern "C" entry */
    const char *source; /* complete CUDA C source */
    int block_threads;  /* threads per block it is launched with */
} tlm_cuda_kernel;

int tlm_cuda_kernel_count(void);
const tlm_cuda_kernel *tlm_cuda_kernel_get(int i);

/* 0 when libcublas loads and has every entry point the GPU path needs (no GPU needed);
 * else TLM_EUNSUPPORTED with the reason. which (may be NULL) receives the library path. */
int tlm_cuda_cublas_available(char *which, size_t which_size, tlm_error *err);

#endif
