package io.longctx.kernels;

import java.io.IOException;
import java.io.InputStream;
import jcuda.driver.CUresult;
import jcuda.driver.JCudaDriver;

/**
 * Finds out once whether the CUDA path can run here: JCuda's driver binding loads (it needs
 * libcuda.so.1), {@code cuInit} succeeds, a device exists, and the fatbin was built into the jar.
 * The first touch of JCudaDriver on a machine without libcuda throws UnsatisfiedLinkError and
 * NoClassDefFoundError ever after, so the answer is remembered, never asked again.
 */
public final class CudaProbe {

  /** Where nvcc's fatbins live on the class path: one per src/main/cuda/*.cu. */
  static final String FATBIN_DIR = "/io/longctx/kernels/cuda/";
  /**
   * The plain forward kernel (every dim, float32 inputs), the tensor-core forward kernels (fp16/bf16,
   * D 64/128) and the split-K decode kernels.
   */
  static final java.util.List<String> FATBINS =
      java.util.List.of("flash_forward.fatbin", "flash_forward_tc.fatbin", "flash_decode.fatbin");

  private static volatile Status status;

  private CudaProbe() {}

  /** Whether CUDA is usable, why not, and which device. */
  public record Status(boolean available, String reason, String device, int devices) {
    Status(boolean available, String reason, String device) {
      this(available, reason, device, 0);
    }
  }

  public static Status status() {
    Status s = status;
    if (s == null) {
      synchronized (CudaProbe.class) {
        if (status == null) {
          status = probe();
        }
        s = status;
      }
    }
    return s;
  }

  private static Status probe() {
    for (String f : FATBINS) {
      if (CudaProbe.class.getResource(FATBIN_DIR + f) == null) {
        return new Status(false, "the CUDA fatbin " + FATBIN_DIR + f + " is not in the jar (built without nvcc)", null);
      }
    }
    try {
      JCudaDriver.setExceptionsEnabled(false);
      int rc = JCudaDriver.cuInit(0);
      if (rc != CUresult.CUDA_SUCCESS) {
        return new Status(false, "cuInit failed: " + CUresult.stringFor(rc), null);
      }
      int[] count = new int[1];
      rc = JCudaDriver.cuDeviceGetCount(count);
      if (rc != CUresult.CUDA_SUCCESS) {
        return new Status(false, "cuDeviceGetCount failed: " + CUresult.stringFor(rc), null);
      }
      if (count[0] == 0) {
        return new Status(false, "no CUDA device", null);
      }
      jcuda.driver.CUdevice dev = new jcuda.driver.CUdevice();
      byte[] name = new byte[256];
      if (JCudaDriver.cuDeviceGet(dev, 0) != CUresult.CUDA_SUCCESS
          || JCudaDriver.cuDeviceGetName(name, name.length, dev) != CUresult.CUDA_SUCCESS) {
        return new Status(false, "cannot query CUDA device 0", null);
      }
      int len = 0;
      while (len < name.length && name[len] != 0) {
        len++;
      }
      return new Status(true, "ok", new String(name, 0, len, java.nio.charset.StandardCharsets.US_ASCII), count[0]);
    } catch (LinkageError e) {
      return new Status(false, "the CUDA driver cannot be loaded: " + loaderCause(e), null);
    }
  }

  /** JCuda's message is many lines of nested traces; keep the line that says what was missing. */
  private static String loaderCause(LinkageError e) {
    String msg = String.valueOf(e.getMessage());
    java.util.regex.Matcher m = java.util.regex.Pattern.compile("libcuda[^,\\n]*").matcher(msg);
    return m.find() ? m.group().trim() : msg.lines().findFirst().orElse(e.getClass().getName());
  }

  static byte[] fatbin(String name) {
    try (InputStream in = CudaProbe.class.getResourceAsStream(FATBIN_DIR + name)) {
      if (in == null) {
        throw new IllegalStateException("the CUDA fatbin " + FATBIN_DIR + name + " is not on the class path");
      }
      return in.readAllBytes();
    } catch (IOException e) {
      throw new IllegalStateException("cannot read the CUDA fatbin " + FATBIN_DIR + name, e);
    }
  }
}
