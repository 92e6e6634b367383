package io.longctx.djl;

import static org.junit.jupiter.api.Assertions.assertTrue;

import ai.djl.ndarray.NDArray;
import ai.djl.ndarray.NDList;
import ai.djl.ndarray.NDManager;
import ai.djl.ndarray.types.DataType;
import io.longctx.djl.AttentionOp.Layout;
import io.longctx.djl.AttentionOp.Path;
import io.longctx.kernels.AttentionOptions;
import io.longctx.kernels.CudaProbe;
import io.longctx.kernels.FakeLibcuda;
import io.longctx.kernels.Seeds;
import io.longctx.kernels.Tensor;
import java.nio.charset.StandardCharsets;
import java.nio.file.Files;
import java.nio.file.Paths;
import java.util.ArrayList;
import java.util.Arrays;
import java.util.List;
import java.util.SplittableRandom;
import java.util.concurrent.TimeUnit;
import java.util.function.Supplier;
import org.junit.jupiter.api.Test;
import org.junit.jupiter.api.Timeout;

/**
 * The operator's CUDA path end to end without a GPU: a child JVM with the kernels module's fake
 * libcuda ({@link FakeLibcuda}: host memory, launched kernels run in the host emulation of the .cu
 * sources) on LD_LIBRARY_PATH, where the backend selector's {@code auto} finds a usable "device".
 * NDArrays go in, AUTO takes the CUDA path, and forward and decode (one array, a chunk list) come
 * back within the float64 reference's tolerance. It shows that the operator, JCuda and the kernel
 * sources agree; it shows nothing about a GPU.
 */
class AttentionOpCudaEmulationTest {

  @Test
  @Timeout(420)
  void autoTakesTheCudaPathAndItsAnswersHold() throws Exception {
    java.nio.file.Path lib = FakeLibcuda.build(Paths.get("..", "kernels"), Paths.get("target", "fake-cuda-op"));
    java.nio.file.Path log = Files.createTempFile(Paths.get("target"), "cuda-op-child", ".log");
    // The child prints its seed; -Dlongctx.seed=S replays one (passed on to the child).
    ProcessBuilder pb = new ProcessBuilder(Paths.get(System.getProperty("java.home"), "bin", "java").toString(),
        "-Dai.djl.offline=true", "--add-modules=jdk.incubator.vector",
        "-Dlongctx.seed=" + System.getProperty("longctx.seed", ""), "-cp", System.getProperty("java.class.path"),
        Main.class.getName()).redirectErrorStream(true).redirectOutput(log.toFile());
    pb.environment().put("LD_LIBRARY_PATH", lib.toString());
    java.nio.file.Path launches = Files.createTempFile(Paths.get("target"), "cuda-op-launches", ".txt");
    pb.environment().put("LONGCTX_FAKE_LAUNCH_LOG", launches.toString());
    Process p = pb.start();
    boolean ended = p.waitFor(360, TimeUnit.SECONDS);
    if (!ended) {
      p.descendants().forEach(ProcessHandle::destroyForcibly);
      p.destroyForcibly().waitFor(10, TimeUnit.SECONDS);
    }
    String out = Files.readString(log, StandardCharsets.UTF_8);
    assertTrue(ended, "the child JVM did not end in 360 s; its output:\n" + out);
    assertTrue(p.exitValue() == 0, "child failed (exit " + p.exitValue() + "):\n" + out);
    List<String> lines = out.lines().toList();
    for (String check : Main.CHECKS) {
      assertTrue(lines.contains(check + "=pass"), check + ":\n" + out);
    }
    Files.delete(log);
    Files.delete(launches);
  }

  /**
   * The child: one line per check, {@code name=pass} or {@code name=FAIL: why}; a check passes only
   * where the kernels the fake libcuda logged launching are the ones its path should launch.
   */
  static final class Main {
    static final List<String> CHECKS = List.of("forward-bhtd-gqa-causal", "forward-bthd-positions-window",
        "forward-float16", "decode-one-array", "decode-chunks-same-bits", "decode-head-size-above-cuda");

    public static void main(String[] args) {
      System.out.println("available=" + CudaProbe.status().available() + " " + CudaProbe.status().device());
      long seed = Seeds.forTest();
      System.out.println("seed=" + seed);
      SplittableRandom rng = new SplittableRandom(seed);
      AttentionOp op = AttentionOp.cpu();
      AttentionOptions causal = AttentionOptions.DEFAULT.withCausal(true);
      try (NDManager m = NDManager.newBaseManager()) {
        run("forward-bhtd-gqa-causal", FORWARD, () -> forward(op, m, Tensor.random(rng, 2, 4, 37, 64, 1.5),
            Tensor.random(rng, 2, 2, 53, 64, 1.5), Tensor.random(rng, 2, 2, 53, 64), null, null, causal, Layout.BHTD,
            false));
        long[] qPos = {40, 41, 45, 50, 90, 91, 92};
        long[] kPos = new long[70];
        for (int i = 0; i < kPos.length; i++) {
          kPos[i] = 2L * i;
        }
        run("forward-bthd-positions-window", FORWARD, () -> forward(op, m, Tensor.random(rng, 1, 3, 7, 96),
            Tensor.random(rng, 1, 3, 70, 96), Tensor.random(rng, 1, 3, 70, 96), qPos, kPos,
            causal.withWindow(20).withSoftcap(15f), Layout.BTHD, false));
        run("forward-float16", FORWARD, () -> forward(op, m, Tensor.random(rng, 1, 2, 20, 64),
            Tensor.random(rng, 1, 2, 30, 64), Tensor.random(rng, 1, 2, 30, 64), null, null,
            AttentionOptions.DEFAULT, Layout.BHTD, true));

        Tensor q = Tensor.random(rng, 2, 8, 2, 64, 1.5), k = Tensor.random(rng, 2, 2, 300, 64, 1.5);
        Tensor v = Tensor.random(rng, 2, 2, 300, 64);
        long[] dPos = {298, 299};
        NDArray qa = OpChecks.nd(m, q, Layout.BTHD), ka = OpChecks.nd(m, k, Layout.BTHD), va = OpChecks.nd(m, v,
            Layout.BTHD);
        float[][] whole = new float[2][];
        run("decode-one-array", DECODE, () -> {
          NDList r = op.decode(qa, ka, va, dPos, null, causal, Layout.BTHD);
          whole[0] = r.get(0).toFloatArray();
          whole[1] = r.get(1).toFloatArray();
          return OpChecks.check(whole[0], whole[1], q, k, v, dPos, null, causal);
        });
        run("decode-chunks-same-bits", DECODE, () -> {
          List<NDArray> ks = new ArrayList<>(), vs = new ArrayList<>();
          for (int[] range : new int[][] {{0, 100}, {100, 101}, {101, 300}}) {
            ks.add(ka.get(":, " + range[0] + ":" + range[1]));
            vs.add(va.get(":, " + range[0] + ":" + range[1]));
          }
          NDList r = op.decode(qa, ks, vs, dPos, null, causal, Layout.BTHD);
          float[] o = r.get(0).toFloatArray(), lse = r.get(1).toFloatArray();
          if (whole[0] == null || !Arrays.equals(o, whole[0]) || !Arrays.equals(lse, whole[1])) {
            return "differs from the one array's CUDA decode";
          }
          return null;
        });
        // Above the CUDA kernels' largest head size the call stays on the Java kernel.
        Tensor q3 = Tensor.random(rng, 1, 2, 1, 300), k3 = Tensor.random(rng, 1, 2, 40, 300);
        Tensor v3 = Tensor.random(rng, 1, 2, 40, 300);
        run("decode-head-size-above-cuda", null, () -> {
          NDList r = op.decode(OpChecks.nd(m, q3, Layout.BHTD), OpChecks.nd(m, k3, Layout.BHTD),
              OpChecks.nd(m, v3, Layout.BHTD), null, null, AttentionOptions.DEFAULT, Layout.BHTD);
          float[][] st = OpChecks.stateOrder(r.get(0), r.get(1), Layout.BHTD);
          return OpChecks.check(st[0], st[1], q3, k3, v3, null, null, AttentionOptions.DEFAULT);
        });
      }
    }

    /** AUTO's choice must be CUDA, and its answer within the tolerance (float16: of the rounded inputs). */
    private static String forward(AttentionOp op, NDManager m, Tensor q, Tensor k, Tensor v, long[] qPos, long[] kPos,
        AttentionOptions opt, Layout layout, boolean float16) {
      NDArray qa = OpChecks.nd(m, q, layout), ka = OpChecks.nd(m, k, layout), va = OpChecks.nd(m, v, layout);
      if (float16) {
        qa = qa.toType(DataType.FLOAT16, false);
        ka = ka.toType(DataType.FLOAT16, false);
        va = va.toType(DataType.FLOAT16, false);
        q = rounded(qa, q, layout);
        k = rounded(ka, k, layout);
        v = rounded(va, v, layout);
      }
      Path chosen = op.choose(qa, ka, va, qPos, kPos, opt, layout);
      if (chosen != Path.CUDA) {
        return "AUTO chose " + chosen;
      }
      NDList r = op.forward(qa, ka, va, qPos, kPos, opt, layout, Path.AUTO);
      float[][] st = OpChecks.stateOrder(r.get(0), r.get(1), layout);
      return OpChecks.check(st[0], st[1], q, k, v, qPos, kPos, opt);
    }

    /** x's float16 values as a tensor of t's shape (the reference then sees what the kernel saw). */
    private static Tensor rounded(NDArray x, Tensor t, Layout layout) {
      NDArray f = x.toType(DataType.FLOAT32, false);
      float[] data = (layout == Layout.BHTD ? f : f.transpose(0, 2, 1, 3)).toFloatArray();
      return new Tensor(data, t.batch(), t.heads(), t.tokens(), t.dim());
    }

    /** The float32 forward kernel alone; split-K decode's partial kernels and their combine. */
    private static final String FORWARD = "longctx_forward_f32", DECODE = "longctx_decode_";

    /** Runs a check; {@code kernels} the prefix of every kernel it must launch, at least one (null: none). */
    private static void run(String name, String kernels, Supplier<String> check) {
      java.nio.file.Path log = Paths.get(System.getenv("LONGCTX_FAKE_LAUNCH_LOG"));
      String why;
      try {
        Files.write(log, new byte[0]);
        why = check.get();
        List<String> launched = Files.readAllLines(log);
        if (why == null && (kernels == null ? !launched.isEmpty()
            : launched.isEmpty() || !launched.stream().allMatch(k -> k.startsWith(kernels)))) {
          why = "launched " + launched + ", expected " + (kernels == null ? "none" : kernels + "*");
        }
      } catch (RuntimeException | Error | java.io.IOException e) {
        why = e.toString();
        e.printStackTrace(System.out);
      }
      System.out.println(name + (why == null ? "=pass" : "=FAIL: " + why));
    }
  }
}
