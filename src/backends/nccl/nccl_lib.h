/* NCCL and the CUDA runtime, opened at run time: one braid build runs on
   machines with and without GPUs, and neither library is a build or link
   dependency. */
#ifndef BRAID_NCCL_LIB_H
#define BRAID_NCCL_LIB_H

#include <stddef.h>

#include "backends/nccl/nccl_decl.h"
#include "braid.h"

#define BRAID__NCCL_FN(X)                                                                                          \
  X(ncclGetVersion) X(ncclGetErrorString) X(ncclGetUniqueId) X(ncclCommInitRankConfig) X(ncclCommFinalize)         \
  X(ncclCommDestroy) X(ncclCommAbort) X(ncclCommSplit) X(ncclCommGetAsyncError) X(ncclCommRegister)                \
  X(ncclCommDeregister) X(ncclMemAlloc) X(ncclMemFree) X(ncclRedOpCreatePreMulSum) X(ncclRedOpDestroy)             \
  X(ncclReduce) X(ncclBroadcast) X(ncclAllReduce) X(ncclReduceScatter) X(ncclAllGather) X(ncclSend) X(ncclRecv)    \
  X(ncclGroupStart) X(ncclGroupEnd)
/* Present in NCCL 2.13 and later only: looked up, not required. */
#define BRAID__NCCL_FN_OPT(X) X(ncclGetLastError)

#define BRAID__CUDA_FN(X)                                                                                          \
  X(cudaGetDeviceCount) X(cudaSetDevice) X(cudaGetDevice) X(cudaDriverGetVersion) X(cudaRuntimeGetVersion)         \
  X(cudaGetErrorString) X(cudaGetLastError) X(cudaStreamCreateWithFlags) X(cudaStreamDestroy) X(cudaStreamQuery)   \
  X(cudaStreamWaitEvent) X(cudaEventCreateWithFlags) X(cudaEventDestroy)                  \
  X(cudaEventRecord) X(cudaEventQuery) X(cudaMalloc) X(cudaFree) X(cudaMallocHost) X(cudaFreeHost)                 \
  X(cudaMemcpyAsync)

typedef struct braid__nccl_api {
#define BRAID__NCCL_MEMBER(f) __typeof__(&f) f;
  BRAID__NCCL_FN(BRAID__NCCL_MEMBER)
  BRAID__NCCL_FN_OPT(BRAID__NCCL_MEMBER)
  BRAID__CUDA_FN(BRAID__NCCL_MEMBER)
#undef BRAID__NCCL_MEMBER
  int nccl_version;   /* ncclGetVersion's code */
  int device_count;   /* CUDA devices visible */
  char nccl_path[256], cudart_path[256]; /* what was opened */
} braid__nccl_api;

/* The libraries, opened once per process. NULL when they or a device are
   missing: *st is BRAID_ERR_UNSUPPORTED and err says which of library,
   driver or device is missing and how to fix it. A later call tries again
   (a user may fix the environment between two inits). */
const braid__nccl_api *braid__nccl_load(braid_status *st, char *err, size_t errlen);

#endif
