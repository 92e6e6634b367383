package io.longctx.djl;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertTrue;

import ai.djl.ndarray.NDArray;
import ai.djl.ndarray.NDManager;
import io.longctx.kernels.AttentionOptions;
import io.longctx.kernels.Tensor;
import java.nio.charset.StandardCharsets;
import java.nio.file.Files;
import java.nio.file.Path;
import java.nio.file.Paths;
import java.util.SplittableRandom;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.atomic.AtomicInteger;
import java.util.logging.Handler;
import java.util.logging.Level;
import java.util.logging.LogRecord;
import java.util.logging.Logger;
import org.junit.jupiter.api.io.TempDir;
import org.junit.jupiter.params.ParameterizedTest;
import org.junit.jupiter.params.provider.ValueSource;

/**
 * Each entry point that computes with libtorch runs {@link LibtorchWarmup} before its own math: in a
 * fresh JVM (so that nothing else ran it first), the entry point alone must leave its log line. The
 * race it guards against shows in about 1 of 10 fresh JVMs, too rarely for a test of the results.
 */
class LibtorchWarmupTest {

  @ParameterizedTest
  @ValueSource(strings = {"plain", "sdpa", "llama"})
  void entryPointRunsTheWarmUp(String entry, @TempDir Path dir) throws Exception {
    Path log = dir.resolve("child.log");
    Process p = new ProcessBuilder(Paths.get(System.getProperty("java.home"), "bin", "java").toString(),
        "-Dai.djl.offline=true", "--add-modules=jdk.incubator.vector", "-cp", System.getProperty("java.class.path"),
        Probe.class.getName(), entry, dir.toString()).redirectErrorStream(true).redirectOutput(log.toFile()).start();
    boolean ended = p.waitFor(180, TimeUnit.SECONDS);
    if (!ended) {
      p.destroyForcibly().waitFor(10, TimeUnit.SECONDS);
    }
    String out = Files.readString(log, StandardCharsets.UTF_8);
    assertTrue(ended, entry + ": the child JVM did not end in 180 s; its output:\n" + out);
    assertEquals(0, p.exitValue(), entry + ": child failed:\n" + out);
    assertTrue(out.contains("warm-ups: 1"), entry + ": the warm-up did not run exactly once:\n" + out);
  }

  /** The child: counts the warm-up's log lines around one entry point. */
  static final class Probe {
    public static void main(String[] args) throws Exception {
      Logger logger = Logger.getLogger(LibtorchWarmup.class.getName()); // a class literal does not initialize it
      AtomicInteger warmups = new AtomicInteger();
      logger.setLevel(Level.FINE);
      logger.addHandler(new Handler() {
        @Override
        public void publish(LogRecord r) {
          if (r.getMessage().startsWith("libtorch's MKL math warmed up")) {
            warmups.incrementAndGet();
          }
        }

        @Override
        public void flush() {}

        @Override
        public void close() {}
      });
      switch (args[0]) {
        case "plain" -> {
          SplittableRandom rng = new SplittableRandom(1);
          Tensor t = Tensor.random(rng, 1, 2, 5, 8);
          try (NDManager m = NDManager.newBaseManager("PyTorch")) {
            NDArray x = OpChecks.nd(m, t, AttentionOp.Layout.BHTD); // as q, k and v
            PlainAttention.forward(x, x, x, null, null, AttentionOptions.DEFAULT.withSoftcap(5f), null);
          }
        }
        case "sdpa" -> LibtorchSdpa.open().close();
        case "llama" -> {
          Path model = LlamaTesting.generate(LlamaTesting.tiny(1), Path.of(args[1]).resolve("model"));
          try (NDManager m = NDManager.newBaseManager("PyTorch"); LlamaModel lm = LlamaModel.load(model, m)) {
            lm.score(new int[] {1, 2, 3}, 2, false);
          }
        }
        default -> throw new IllegalArgumentException(args[0]);
      }
      System.out.println("warm-ups: " + warmups.get());
    }
  }
}
