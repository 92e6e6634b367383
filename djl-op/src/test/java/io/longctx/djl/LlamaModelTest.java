package io.longctx.djl;

import static org.junit.jupiter.api.Assertions.assertArrayEquals;
import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertNull;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTrue;

import ai.djl.ndarray.NDManager;
import io.longctx.kernels.Seeds;
import io.longctx.kernels.Tensor;
import java.nio.file.Path;
import java.util.List;
import java.util.SplittableRandom;
import org.junit.jupiter.api.AfterAll;
import org.junit.jupiter.api.BeforeAll;
import org.junit.jupiter.api.Test;
import org.junit.jupiter.api.io.TempDir;

/**
 * {@link LlamaModel} against the independent float64 forward ({@link LlamaReference}) on tiny
 * generated checkpoints, and chunk-length invariance.
 *
 * <p>Tolerance: per token, |lp - ref| <= 1e-4 * |ref| + 1e-5 (relative 1e-4, with an absolute floor
 * for log-probabilities near 0). Why: the model computes in float32 (unit roundoff 6e-8). A
 * log-probability is a difference of a logit and a log-sum-exp of magnitude ~1..10, each the end of
 * two layers of dot products of length 64..176 and softmaxes; the float32 error of such a chain is
 * a few 1e-6 relative (measured: worst per-token relative error about 1e-6 to 5e-6 on these models).
 * 1e-4 leaves a margin of >10x for other seeds while every definitional mistake tried (interleaved
 * instead of half-split rotary, ignored rope scaling, ignored window) moves log-probabilities by
 * 1e-2 or more; the mutation tests below show that the same comparison catches them.
 */
class LlamaModelTest {

  static final double REL = 1e-4;
  static final double ABS = 1e-5;

  static NDManager manager;

  @BeforeAll
  static void start() {
    manager = NDManager.newBaseManager("PyTorch");
  }

  @AfterAll
  static void stop() {
    manager.close();
  }

  /** Null when within tolerance, else where and how much it is off. */
  static String compare(float[] got, double[] ref) {
    if (got.length != ref.length) {
      return "length " + got.length + " vs reference " + ref.length;
    }
    double worst = 0;
    for (int i = 0; i < ref.length; i++) {
      double err = Math.abs(got[i] - ref[i]);
      worst = Math.max(worst, err / Math.max(Math.abs(ref[i]), 1e-12));
      if (!(err <= REL * Math.abs(ref[i]) + ABS)) {
        return "token " + (i + 1) + ": model " + got[i] + ", float64 reference " + ref[i] + " (error " + err + ")";
      }
    }
    System.out.printf("  worst per-token relative error %.3g over %d tokens%n", worst, ref.length);
    return null;
  }

  static double maxAbsDiff(float[] got, double[] ref) {
    double m = 0;
    for (int i = 0; i < ref.length; i++) {
      m = Math.max(m, Math.abs(got[i] - ref[i]));
    }
    return m;
  }

  /** Generates, loads, scores with a random chunk length and compares to the reference. */
  private static void againstReference(String name, ModelGenerator.Spec spec, Path dir, int n, long seed,
      LlamaReference.Mutation... mustCatch) throws Exception {
    SplittableRandom r = new SplittableRandom(seed ^ 0x5DEECE66DL);
    LlamaTesting.generate(spec, dir);
    int[] tokens = LlamaTesting.randomTokens(r, n, spec.vocab);
    int chunk = new int[] {1, 7, 33, 64, n}[r.nextInt(5)];
    LlamaReference ref = new LlamaReference(dir);
    double[] want = ref.logprobs(tokens, LlamaReference.Mutation.NONE);
    try (LlamaModel m = LlamaModel.load(dir, manager, 64)) {
      DocumentScore sc = m.score(tokens, chunk, true);
      String what = name + " (chunk " + chunk + ", seed " + seed + ")";
      assertEquals(n, sc.nTokens(), what);
      assertNull(compare(sc.logprobs(), want), what);
      double sum = 0;
      for (double x : want) {
        sum += x;
      }
      assertEquals(sum, sc.sumLogprob(), REL * Math.abs(sum), what + ": sum_logprob");
      for (LlamaReference.Mutation mu : mustCatch) {
        double diff = maxAbsDiff(sc.logprobs(), ref.logprobs(tokens, mu));
        assertTrue(diff > 100 * (REL * 10 + ABS), what + ": the reference with mutation " + mu
            + " should differ clearly from the model, max difference only " + diff);
      }
    }
  }

  @Test
  void llamaBf16UntiedHead(@TempDir Path tmp) throws Exception {
    long seed = Seeds.forTest();
    ModelGenerator.Spec s = LlamaTesting.tiny(seed);
    s.dtype = "BF16";
    s.tie = false;
    againstReference("llama bf16 untied", s, tmp.resolve("m"), 160, seed, LlamaReference.Mutation.INTERLEAVED_ROPE);
  }

  @Test
  void qwen2BiasTiedF16(@TempDir Path tmp) throws Exception {
    long seed = Seeds.forTest();
    ModelGenerator.Spec s = LlamaTesting.tiny(seed);
    s.modelType = "qwen2";
    s.dtype = "F16";
    s.tie = true;
    s.ropeTheta = 1000000;
    againstReference("qwen2 bias tied", s, tmp.resolve("m"), 150, seed);
  }

  @Test
  void mistralSlidingWindow(@TempDir Path tmp) throws Exception {
    long seed = Seeds.forTest();
    ModelGenerator.Spec s = LlamaTesting.tiny(seed);
    s.modelType = "mistral";
    s.dtype = "F32";
    s.slidingWindow = 24;
    s.heads = 4;
    s.kvHeads = 1; // MQA
    againstReference("mistral window 24", s, tmp.resolve("m"), 170, seed, LlamaReference.Mutation.NO_WINDOW);
  }

  @Test
  void ropeScalingLinear(@TempDir Path tmp) throws Exception {
    long seed = Seeds.forTest();
    ModelGenerator.Spec s = LlamaTesting.tiny(seed);
    s.ropeScaling = "linear:4";
    s.ropeTheta = 100; // low theta: every frequency turns within the document, so scaling matters
    againstReference("llama rope linear", s, tmp.resolve("m"), 140, seed, LlamaReference.Mutation.NO_ROPE_SCALING);
  }

  @Test
  void ropeScalingLlama3(@TempDir Path tmp) throws Exception {
    long seed = Seeds.forTest();
    ModelGenerator.Spec s = LlamaTesting.tiny(seed);
    s.ropeScaling = "llama3:8";
    s.ropeTheta = 500;
    s.heads = 2;
    s.kvHeads = 2;
    s.hidden = 64; // head dim 32: frequencies in all three llama3 bands (original 64 positions)
    againstReference("llama rope llama3", s, tmp.resolve("m"), 140, seed, LlamaReference.Mutation.NO_ROPE_SCALING);
  }

  @Test
  void chunkLengthInvariance(@TempDir Path tmp) throws Exception {
    long seed = Seeds.forTest();
    SplittableRandom r = new SplittableRandom(seed);
    ModelGenerator.Spec s = LlamaTesting.tiny(seed);
    s.modelType = "mistral";
    s.slidingWindow = 50;
    Path dir = LlamaTesting.generate(s, tmp.resolve("m"));
    int n = 120 + r.nextInt(40);
    int[] tokens = LlamaTesting.randomTokens(r, n, s.vocab);
    try (LlamaModel m = LlamaModel.load(dir, manager, 37)) {
      DocumentScore base = m.score(tokens, n, true);
      // Chunk length 1 on a 60-token prefix (longer than the window): one chunk per token is the
      // costliest case (many one-token chunks to join and merge), kept small for loaded CI machines.
      int[] prefix = java.util.Arrays.copyOf(tokens, 60);
      assertEquals(m.score(prefix, 60, false).sumLogprob(), m.score(prefix, 1, false).sumLogprob(),
          1e-5 * Math.abs(m.score(prefix, 60, false).sumLogprob()), "chunk 1 vs whole 60-token prefix, seed " + seed);
      for (int chunk : new int[] {7, 16, 64, 117, n - 1, n + 5}) {
        DocumentScore sc = m.score(tokens, chunk, chunk == 7);
        String what = "chunk " + chunk + " vs whole document, n " + n + ", seed " + seed;
        assertEquals(base.sumLogprob(), sc.sumLogprob(), 1e-5 * Math.abs(base.sumLogprob()), what);
        if (chunk == 7) {
          assertArrayEquals(base.logprobs(), sc.logprobs(), 1e-4f, what);
        } else {
          assertNull(sc.logprobs(), "per-token values only when asked");
        }
      }
      // Same chunking twice: the same bits.
      assertEquals(m.score(tokens, 7, false).sumLogprob(), m.score(tokens, 7, false).sumLogprob(), 0.0);
    }
  }

  /**
   * A layer's queries attend the cached chunks in groups of consecutive chunks, one kernel call per
   * group: one chunk per call, groups of three (the last shorter) and all in one call each match the
   * float64 reference, agree with one another to float32 rounding, and give the same bits twice.
   */
  @Test
  void chunksAttendedInGroupsOfAnySize(@TempDir Path tmp) throws Exception {
    long seed = Seeds.forTest();
    SplittableRandom r = new SplittableRandom(seed);
    ModelGenerator.Spec s = LlamaTesting.tiny(seed);
    Path dir = LlamaTesting.generate(s, tmp.resolve("m"));
    int n = 100 + r.nextInt(60), chunk = 9 + r.nextInt(8);
    int[] tokens = LlamaTesting.randomTokens(r, n, s.vocab);
    double[] want = new LlamaReference(dir).logprobs(tokens, LlamaReference.Mutation.NONE);
    try (LlamaModel m = LlamaModel.load(dir, manager, 64)) {
      long perChunk = (long) chunk * s.kvHeads * (s.hidden / s.heads) * 2;
      DocumentScore all = m.score(tokens, chunk, true);
      for (long groupFloats : new long[] {1, 3 * perChunk}) {
        m.kvGroupFloats = groupFloats;
        DocumentScore sc = m.score(tokens, chunk, true);
        String what = "groups of " + Math.max(1, groupFloats / perChunk) + " chunks of " + chunk + ", n " + n
            + ", seed " + seed;
        assertNull(compare(sc.logprobs(), want), what);
        assertEquals(all.sumLogprob(), sc.sumLogprob(), 1e-5 * Math.abs(all.sumLogprob()), what + " vs one call");
        assertEquals(sc.sumLogprob(), m.score(tokens, chunk, false).sumLogprob(), 0.0, what + ": twice");
      }
      assertNull(compare(all.logprobs(), want), "one call for all chunks, seed " + seed);
      // The layer takes exactly the n chunks it is told of: fewer or more is named.
      float[] x = m.embed(new int[] {1, 2, 3});
      LlamaModel.KeysValues kv = m.keysValues(0, x, 0, 3);
      for (long groupFloats : new long[] {1, LlamaModel.KV_GROUP_FLOATS}) {
        m.kvGroupFloats = groupFloats;
        IllegalArgumentException fewer = assertThrows(IllegalArgumentException.class,
            () -> m.layer(0, x, 0, 3, 2, List.of(kv).iterator()));
        assertTrue(fewer.getMessage().contains("fewer than n = 2"), fewer.getMessage());
        IllegalArgumentException more = assertThrows(IllegalArgumentException.class,
            () -> m.layer(0, x, 0, 3, 1, List.of(kv, kv).iterator()));
        assertTrue(more.getMessage().contains("more than n = 1"), more.getMessage());
      }
    }
    // The group size as a system property: read when a model is made, a bad value named.
    try {
      System.setProperty(LlamaModel.KV_GROUP_FLOATS_PROPERTY, "4096");
      assertEquals(4096, new LlamaModel().kvGroupFloats);
      for (String bad : new String[] {"0", "-5", "32MiB"}) {
        System.setProperty(LlamaModel.KV_GROUP_FLOATS_PROPERTY, bad);
        IllegalArgumentException e = assertThrows(IllegalArgumentException.class, LlamaModel::new);
        assertTrue(e.getMessage().contains(LlamaModel.KV_GROUP_FLOATS_PROPERTY) && e.getMessage().contains(bad),
            e.getMessage());
      }
    } finally {
      System.clearProperty(LlamaModel.KV_GROUP_FLOATS_PROPERTY);
    }
  }

  /** Chunks joined for one kernel call: each head's keys in position order; gaps and other shapes refused. */
  @Test
  void consecutiveChunksJoinHeadByHead() {
    SplittableRandom r = new SplittableRandom(Seeds.forTest());
    Tensor k1 = Tensor.random(r, 1, 2, 3, 4), v1 = Tensor.random(r, 1, 2, 3, 4);
    Tensor k2 = Tensor.random(r, 1, 2, 5, 4), v2 = Tensor.random(r, 1, 2, 5, 4);
    LlamaModel.KeysValues a = new LlamaModel.KeysValues(10, k1, v1), b = new LlamaModel.KeysValues(13, k2, v2);
    LlamaModel.KeysValues ab = LlamaModel.KeysValues.concat(List.of(a, b));
    assertEquals(10, ab.start());
    assertEquals(8, ab.length());
    for (int h = 0; h < 2; h++) {
      for (int t = 0; t < 8; t++) {
        Tensor src = t < 3 ? k1 : k2, srcV = t < 3 ? v1 : v2;
        int st = t < 3 ? t : t - 3, n = t < 3 ? 3 : 5;
        for (int d = 0; d < 4; d++) {
          assertEquals(src.data()[(h * n + st) * 4 + d], ab.k().data()[(h * 8 + t) * 4 + d]);
          assertEquals(srcV.data()[(h * n + st) * 4 + d], ab.v().data()[(h * 8 + t) * 4 + d]);
        }
      }
    }
    assertThrows(IllegalArgumentException.class, () -> LlamaModel.KeysValues.concat(List.of(a,
        new LlamaModel.KeysValues(14, k2, v2))), "a gap between the chunks");
    Tensor k3 = Tensor.random(r, 1, 3, 5, 4);
    assertThrows(IllegalArgumentException.class, () -> LlamaModel.KeysValues.concat(List.of(a,
        new LlamaModel.KeysValues(13, k3, k3))), "another number of kv heads");
    assertThrows(IllegalArgumentException.class, () -> LlamaModel.KeysValues.concat(List.of(a,
        new LlamaModel.KeysValues(13, k2, v1))), "values of another length than the keys");
  }

  /**
   * The CUDA backend refuses a call whose q and k could give a q.k past float32 (a bound over the
   * call, QkMayOverflowException, tested on the fake device in the kernels module): the model names
   * the layer and the chunk's positions, as NumericOverflowException (exit 2 in ppl). Here a backend
   * that refuses every call from position 40 on, computing the rest on the CPU kernels.
   */
  @Test
  void aRefusedQkBoundIsNamedByLayerAndPositions(@TempDir Path tmp) throws Exception {
    long seed = Seeds.forTest();
    Path dir = LlamaTesting.generate(LlamaTesting.tiny(seed), tmp.resolve("m"));
    io.longctx.kernels.CpuAttention cpu = io.longctx.kernels.CpuAttention.DEFAULT;
    io.longctx.kernels.AttentionBackend refusing = new io.longctx.kernels.AttentionBackend() {
      void check(long[] qPos) {
        if (qPos[qPos.length - 1] >= 40) {
          throw new io.longctx.kernels.QkMayOverflowException("q [1, 4, 16, 16] and k hold values large enough");
        }
      }

      @Override
      public io.longctx.kernels.AttentionState forward(io.longctx.kernels.Tensor q, io.longctx.kernels.Tensor k,
          io.longctx.kernels.Tensor v, long[] qPos, long[] kPos, io.longctx.kernels.AttentionOptions opt) {
        check(qPos);
        return cpu.forward(q, k, v, qPos, kPos, opt);
      }

      @Override
      public io.longctx.kernels.CpuAttention.DecodeResult decode(io.longctx.kernels.Tensor q,
          io.longctx.kernels.Tensor k, io.longctx.kernels.Tensor v, long[] qPos, long[] kPos,
          io.longctx.kernels.AttentionOptions opt, int splitLen) {
        check(qPos);
        return cpu.decode(q, k, v, qPos, kPos, opt, splitLen);
      }

      @Override
      public io.longctx.kernels.CpuAttention.DecodeResult decodeUnifiedMax(io.longctx.kernels.Tensor q,
          io.longctx.kernels.Tensor k, io.longctx.kernels.Tensor v, long[] qPos, long[] kPos,
          io.longctx.kernels.AttentionOptions opt, int splitLen, io.longctx.kernels.UnifiedMax um) {
        check(qPos);
        return cpu.decodeUnifiedMax(q, k, v, qPos, kPos, opt, splitLen, um);
      }

      @Override
      public String name() {
        return "refusing from position 40";
      }
    };
    try (LlamaModel m = new LlamaModel(64, refusing)) {
      m.loadCheckpoint(dir, manager);
      int[] tokens = new int[60];
      for (int i = 0; i < tokens.length; i++) {
        tokens[i] = 3 + i % 20;
      }
      LlamaModel.NumericOverflowException e = assertThrows(LlamaModel.NumericOverflowException.class,
          () -> m.score(tokens, 16, false));
      for (String part : new String[] {"layer 0: the queries at positions 32..47", "could give a q.k past float32",
          "hold values large enough", "past float32"}) {
        assertTrue(e.getMessage().contains(part), part + ": " + e.getMessage());
      }
      assertEquals(16, m.score(java.util.Arrays.copyOf(tokens, 16), 16, false).nTokens()); // below 40: computed
    }
  }

  @Test
  void shortDocumentsAndBadTokens(@TempDir Path tmp) throws Exception {
    long seed = Seeds.forTest();
    ModelGenerator.Spec s = LlamaTesting.tiny(seed);
    Path dir = LlamaTesting.generate(s, tmp.resolve("m"));
    try (LlamaModel m = LlamaModel.load(dir, manager)) {
      DocumentScore one = m.score(new int[] {5}, 4, true);
      assertEquals(1, one.nTokens());
      assertEquals(0.0, one.sumLogprob());
      assertEquals(0, one.logprobs().length);
      assertTrue(Double.isNaN(one.perplexity()));
      DocumentScore two = m.score(new int[] {5, 9}, 4, true);
      assertEquals(two.logprobs()[0], two.sumLogprob(), 1e-6 * Math.abs(two.sumLogprob())); // float vs double
      assertTrue(two.sumLogprob() < 0);
      IllegalArgumentException e = assertThrows(IllegalArgumentException.class,
          () -> m.score(new int[] {1, 2, 300}, 4, false));
      assertTrue(e.getMessage().contains("300") && e.getMessage().contains("position 2"), e.getMessage());
      assertThrows(IllegalArgumentException.class, () -> m.score(new int[] {1, -1}, 4, false));
      // The pieces the split path calls check too: libtorch reads id -1 as the last row.
      e = assertThrows(IllegalArgumentException.class, () -> m.embed(new int[] {3, -1}));
      assertTrue(e.getMessage().contains("token id -1 at position 1"), e.getMessage());
      float[] x = m.embed(new int[] {3, 4});
      e = assertThrows(IllegalArgumentException.class, () -> m.logprobs(x, 0, new int[] {7, s.vocab}));
      assertTrue(e.getMessage().contains("token id " + s.vocab + " at position 1"), e.getMessage());
      e = assertThrows(IllegalArgumentException.class, () -> m.keysValues(s.layers, x, 0, 2));
      assertTrue(e.getMessage().contains("layer " + s.layers + " does not exist"), e.getMessage());
      // layer() with more chunks than n: the extra one would be dropped without a word.
      LlamaModel.KeysValues kv = m.keysValues(0, x, 0, 2);
      e = assertThrows(IllegalArgumentException.class,
          () -> m.layer(0, x, 0, 2, 1, java.util.List.of(kv, kv).iterator()));
      assertTrue(e.getMessage().contains("more than n = 1"), e.getMessage());
      // The Block form: shapes and ids named.
      try (NDManager nm = manager.newSubManager()) {
        ai.djl.training.ParameterStore ps = new ai.djl.training.ParameterStore(nm, false);
        e = assertThrows(IllegalArgumentException.class, () -> m.forward(ps,
            new ai.djl.ndarray.NDList(nm.create(new int[] {1, 2}, new ai.djl.ndarray.types.Shape(1, 2))), false));
        assertTrue(e.getMessage().contains("(1, 2)"), e.getMessage());
        e = assertThrows(IllegalArgumentException.class, () -> m.forward(ps,
            new ai.djl.ndarray.NDList(nm.create(new long[] {1, 1L << 32})), false));
        assertTrue(e.getMessage().contains("token id 4294967296 at position 1"), e.getMessage());
        ai.djl.util.PairList<String, Object> p = new ai.djl.util.PairList<>();
        p.add(LlamaModel.CHUNK_LEN, 8L);
        assertEquals(2, m.forward(ps, new ai.djl.ndarray.NDList(nm.create(new int[] {1, 2, 3})), false, p).size());
        p = new ai.djl.util.PairList<>();
        p.add(LlamaModel.CHUNK_LEN, 2.5);
        ai.djl.util.PairList<String, Object> bad = p;
        e = assertThrows(IllegalArgumentException.class,
            () -> m.forward(ps, new ai.djl.ndarray.NDList(nm.create(new int[] {1, 2, 3})), false, bad));
        assertTrue(e.getMessage().contains("must be an int"), e.getMessage());
        ai.djl.util.PairList<String, Object> decimal = new ai.djl.util.PairList<>();
        decimal.add(LlamaModel.CHUNK_LEN, new java.math.BigDecimal("2.5")); // was taken as 2
        e = assertThrows(IllegalArgumentException.class,
            () -> m.forward(ps, new ai.djl.ndarray.NDList(nm.create(new int[] {1, 2, 3})), false, decimal));
        assertTrue(e.getMessage().contains("must be an int"), e.getMessage());
        e = assertThrows(IllegalArgumentException.class, () -> m.getOutputShapes(new ai.djl.ndarray.types.Shape[0]));
        assertTrue(e.getMessage().contains("token ids of shape (T)"), e.getMessage());
      }
    }
  }

  /** Loads MODEL and prints the sum of log-probabilities of tokens 1..40 (in a child JVM with a small direct-memory limit). */
  public static final class LoadAndScore {
    public static void main(String[] args) throws Exception {
      try (NDManager nm = NDManager.newBaseManager("PyTorch")) {
        LlamaModel m = LlamaModel.load(Path.of(args[0]), nm);
        int[] t = new int[40];
        for (int i = 0; i < t.length; i++) {
          t[i] = 3 + i * 7;
        }
        System.out.println("sum " + Double.doubleToRawLongBits(m.score(t, 16, false).sumLogprob()));
      }
    }
  }

  /**
   * The weights live in libtorch's memory: a model larger as float32 than the JVM's direct-memory limit
   * loads (an array made from a direct buffer keeps the buffer, and a 1B-parameter checkpoint failed to
   * load under -Xmx3g), and scores with the same bits as in this JVM.
   */
  @Test
  void weightsAreNotHeldInTheJvmsDirectMemory(@TempDir Path tmp) throws Exception {
    ModelGenerator.Spec s = LlamaTesting.tiny(Seeds.forTest());
    s.hidden = 256;
    s.vocab = 12_000;
    s.layers = 3; // about 37 MB as float32, 12 MB of it in each of the embedding and the LM head
    Path dir = LlamaTesting.generate(s, tmp.resolve("m"));
    String want;
    try (NDManager nm = NDManager.newBaseManager("PyTorch")) {
      int[] t = new int[40];
      for (int i = 0; i < t.length; i++) {
        t[i] = 3 + i * 7;
      }
      want = "sum " + Double.doubleToRawLongBits(LlamaModel.load(dir, nm).score(t, 16, false).sumLogprob());
    }
    Process p = new ProcessBuilder(Path.of(System.getProperty("java.home"), "bin", "java").toString(),
        "-XX:MaxDirectMemorySize=24m", "-Dai.djl.offline=true", "--add-modules=jdk.incubator.vector", "-cp",
        System.getProperty("java.class.path"), LoadAndScore.class.getName(), dir.toString()).redirectErrorStream(true)
        .start();
    String out = new String(p.getInputStream().readAllBytes(), java.nio.charset.StandardCharsets.UTF_8);
    assertTrue(p.waitFor(180, java.util.concurrent.TimeUnit.SECONDS), out);
    assertEquals(0, p.exitValue(), out);
    assertTrue(out.contains(want), "the same bits as in this JVM (" + want + "):\n" + out);
  }

}
