/* A stand-in libcuda.so.1 for tests on machines without a GPU: just the driver calls the probe
 * makes. FAKE_CUDA_INIT picks cuInit's result (100 = CUDA_ERROR_NO_DEVICE); FAKE_CUDA_DEVICES the
 * device count when cuInit succeeds. */
#include <stdlib.h>

static int env_int(const char *name, int fallback) {
  const char *v = getenv(name);
  return v ? atoi(v) : fallback;
}

int cuInit(unsigned int flags) { (void)flags; return env_int("FAKE_CUDA_INIT", 100); }
int cuDriverGetVersion(int *version) { *version = 13000; return 0; }
int cuDeviceGetCount(int *count) { *count = env_int("FAKE_CUDA_DEVICES", 0); return 0; }
int cuGetErrorName(int error, const char **name) {
  *name = error == 100 ? "CUDA_ERROR_NO_DEVICE" : "CUDA_ERROR_UNKNOWN";
  return 0;
}
int cuGetErrorString(int error, const char **text) { (void)error; *text = "fake libcuda"; return 0; }
