/* libgift device API: encode and decode on CUDA device memory, on a caller's stream.
 *
 * The codes and scales are byte for byte those giftEncode writes on the CPU for the same
 * input and parameters (FORMAT.md "Numerics"), and giftDecodeDevice returns what giftDecode
 * returns. Like NCCL's calls, these enqueue work on `stream` and return once it is enqueued:
 * argument errors and CUDA launch errors come back at once as a giftResult_t; what the data
 * holds (non-finite values) comes back in the device-side giftEncodeStats when the stream
 * reaches it. Nothing here synchronizes the stream or copies to the host. Launch errors
 * are read with cudaGetLastError, so an error left pending by the caller's earlier work on
 * this thread is reported (as GIFT_ERROR_DEVICE, naming it) and cleared there too.
 *
 * Only present in builds with CUDA (GIFT_HAVE_CUDA defined by the build). */
#ifndef GIFT_GIFT_CUDA_H
#define GIFT_GIFT_CUDA_H

#include <cuda_runtime_api.h>

#include "gift/gift.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Device memory giftEncodeDevice needs as workspace for this shape and these parameters: a
 * few bytes for block scales, one word per scale group for the other layouts. */
GIFT_API giftResult_t giftEncodeDeviceWorkspaceSize(const giftQuantParams* params, uint64_t rows,
                                                    uint64_t cols, uint64_t* bytes);

/* Encodes rows*cols elements at device pointer `src` into device `codes` and `scales`
 * (`src` aligned to its element size, fp32 scales to 4 bytes, `stats` to 8; codes at any
 * address).
 * `workspace` (device memory, 256-byte aligned, of giftEncodeDeviceWorkspaceSize bytes) may
 * be NULL: the library then allocates it on the stream (cudaMallocAsync) and frees it after
 * use. `stats` is a device pointer or NULL; when given, it holds the tensor's finite amax,
 * non-finite count and first non-finite index once the stream has run the encode. With
 * params->nonfinite ERROR, a non-zero count there is the caller's GIFT_ERROR_NONFINITE_INPUT
 * (the codes are those the CPU writes before it reports that error); with `stats` NULL
 * non-finite input goes unreported. */
GIFT_API giftResult_t giftEncodeDevice(const giftQuantParams* params, const void* src,
                                       giftDType_t src_dtype, uint64_t rows, uint64_t cols,
                                       uint8_t* codes, void* scales, uint64_t scales_bytes,
                                       giftEncodeStats* stats, void* workspace,
                                       uint64_t workspace_bytes, cudaStream_t stream);

/* Decodes device `codes` and `scales` into rows*cols elements of `dst_dtype` at device
 * pointer `dst`, as giftDecode does. */
GIFT_API giftResult_t giftDecodeDevice(const giftQuantParams* params, const uint8_t* codes,
                                       const void* scales, uint64_t scales_bytes, uint64_t rows,
                                       uint64_t cols, void* dst, giftDType_t dst_dtype,
                                       cudaStream_t stream);

/* Frames coded on the current CUDA device (enable 1) or on the CPU (0, the default): the
 * writer's encodes and the frame's decodes run the kernels above on host buffers (each
 * tensor uploaded, coded and downloaded), with the same bytes and values as on the CPU. The
 * choice of coordinates and the whitening stay on the CPU. */
GIFT_API giftResult_t giftFrameWriterUseCuda(giftFrameWriter* writer, int enable);
GIFT_API giftResult_t giftFrameUseCuda(giftFrame* frame, int enable);

/* Number of usable CUDA devices (0 when there is no device or no driver); never fails. */
GIFT_API int giftCudaDeviceCount(void);

#ifdef __cplusplus
}
#endif

#endif /* GIFT_GIFT_CUDA_H */
