/* Opening NCCL and the CUDA runtime with dlopen. */
#include "backends/nccl/nccl_lib.h"

#include <dlfcn.h>
#include <pthread.h>
#include <stdio.h>
#include <string.h>

#include "core/params.h"

static pthread_mutex_t g_lock = PTHREAD_MUTEX_INITIALIZER;
static braid__nccl_api g_api;
static int g_loaded;
static void *g_nccl, *g_cudart;

static void *open_lib(const char *const *names, int n, char *opened, size_t len, char *why, size_t whylen) {
  why[0] = 0;
  for (int i = 0; i < n; i++) {
    if (!names[i]) continue;
    void *h = dlopen(names[i], RTLD_NOW | RTLD_LOCAL);
    if (h) {
      snprintf(opened, len, "%s", names[i]);
      return h;
    }
    if (!why[0]) {
      const char *e = dlerror();
      snprintf(why, whylen, "%s", e ? e : "not found");
    }
  }
  return NULL;
}

static void close_all(void) {
  if (g_nccl) dlclose(g_nccl);
  if (g_cudart) dlclose(g_cudart);
  g_nccl = g_cudart = NULL;
  memset(&g_api, 0, sizeof g_api);
}

/* Resolves the table's entries from h; the first missing name, or NULL. */
#define BRAID__NCCL_RESOLVE(f)                                                                                       \
  if (!missing && !(g_api.f = (__typeof__(&f))dlsym(lib, #f))) missing = #f;
#define BRAID__NCCL_RESOLVE_OPT(f) g_api.f = (__typeof__(&f))dlsym(lib, #f);

static const char *resolve_nccl(void *lib) {
  const char *missing = NULL;
  BRAID__NCCL_FN(BRAID__NCCL_RESOLVE)
  BRAID__NCCL_FN_OPT(BRAID__NCCL_RESOLVE_OPT)
  return missing;
}

static const char *resolve_cuda(void *lib) {
  const char *missing = NULL;
  BRAID__CUDA_FN(BRAID__NCCL_RESOLVE)
  return missing;
}

static braid_status load_locked(char *err, size_t errlen) {
  char why[256];
  /* Unset: the default name, then the versioned ones (a runtime without its
     development symlink). Set: that file only. */
  const char *cudart = braid__param_env(BRAID_P_CUDART_LIB);
  const char *cnames[] = {cudart ? cudart : braid__param_default(BRAID_P_CUDART_LIB), cudart ? NULL : "libcudart.so.13",
                          cudart ? NULL : "libcudart.so.12", cudart ? NULL : "libcudart.so.11.0"};
  g_cudart = open_lib(cnames, 4, g_api.cudart_path, sizeof g_api.cudart_path, why, sizeof why);
  if (!g_cudart) {
    snprintf(err, errlen,
             "library missing: the CUDA runtime (%s) could not be opened: %s; install the CUDA runtime or set "
             "BRAID_CUDART_LIB to its path",
             cnames[0], why);
    return BRAID_ERR_UNSUPPORTED;
  }
  const char *miss = resolve_cuda(g_cudart);
  if (miss) {
    snprintf(err, errlen, "library unusable: %s has no %s (CUDA runtime 11 or later is needed)", g_api.cudart_path,
             miss);
    return BRAID_ERR_UNSUPPORTED;
  }
  const char *nnames[] = {braid__param_str(BRAID_P_NCCL_LIB)};
  g_nccl = open_lib(nnames, 1, g_api.nccl_path, sizeof g_api.nccl_path, why, sizeof why);
  if (!g_nccl) {
    snprintf(err, errlen, "library missing: NCCL (%s) could not be opened: %s; install NCCL 2.18 or later or set "
             "BRAID_NCCL_LIB to its path", nnames[0], why);
    return BRAID_ERR_UNSUPPORTED;
  }
  if ((miss = resolve_nccl(g_nccl))) {
    snprintf(err, errlen, "library unusable: %s has no %s (NCCL 2.18 or later is needed)", g_api.nccl_path, miss);
    return BRAID_ERR_UNSUPPORTED;
  }
  if (g_api.ncclGetVersion(&g_api.nccl_version) != ncclSuccess || g_api.nccl_version < 21800) {
    snprintf(err, errlen, "library too old: %s is NCCL version code %d; braid needs 2.18 or later", g_api.nccl_path,
             g_api.nccl_version);
    return BRAID_ERR_UNSUPPORTED;
  }
  int drv = 0;
  cudaError_t ce = g_api.cudaDriverGetVersion(&drv);
  if (ce != cudaSuccess || drv == 0) {
    snprintf(err, errlen, "driver missing: no NVIDIA driver is loaded (cudaDriverGetVersion: %s)",
             ce != cudaSuccess ? g_api.cudaGetErrorString(ce) : "version 0");
    return BRAID_ERR_UNSUPPORTED;
  }
  int n = 0;
  ce = g_api.cudaGetDeviceCount(&n);
  if (ce == cudaErrorInsufficientDriver) {
    snprintf(err, errlen, "driver too old: the NVIDIA driver (version %d) is older than %s needs: %s", drv,
             g_api.cudart_path, g_api.cudaGetErrorString(ce));
    return BRAID_ERR_UNSUPPORTED;
  }
  if (ce != cudaSuccess || n <= 0) {
    snprintf(err, errlen, "device missing: no CUDA device is visible (cudaGetDeviceCount: %s%s)",
             ce != cudaSuccess ? g_api.cudaGetErrorString(ce) : "0 devices",
             ce == cudaSuccess || ce == cudaErrorNoDevice ? "; check CUDA_VISIBLE_DEVICES" : "");
    return BRAID_ERR_UNSUPPORTED;
  }
  g_api.device_count = n;
  return BRAID_OK;
}

const braid__nccl_api *braid__nccl_load(braid_status *st, char *err, size_t errlen) {
  pthread_mutex_lock(&g_lock);
  *st = BRAID_OK;
  if (!g_loaded) {
    *st = load_locked(err, errlen);
    if (*st) close_all();
    else g_loaded = 1;
  }
  pthread_mutex_unlock(&g_lock);
  return *st ? NULL : &g_api;
}
