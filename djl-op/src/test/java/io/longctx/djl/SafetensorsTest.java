package io.longctx.djl;

import static org.junit.jupiter.api.Assertions.assertArrayEquals;
import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertFalse;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTrue;

import ai.djl.ndarray.NDManager;
import io.longctx.kernels.Seeds;
import java.io.ByteArrayOutputStream;
import java.nio.ByteBuffer;
import java.nio.ByteOrder;
import java.nio.charset.StandardCharsets;
import java.nio.file.Files;
import java.nio.file.Path;
import java.util.LinkedHashMap;
import java.util.Map;
import java.util.SplittableRandom;
import org.junit.jupiter.api.Test;
import org.junit.jupiter.api.io.TempDir;

/** The safetensors reader on files made by hand, byte by byte, and on broken checkpoints. */
class SafetensorsTest {

  /** A safetensors file from a header string and raw data, written without our writer. */
  static Path handMade(Path file, String header, byte[] data, long claimedLength) throws Exception {
    ByteArrayOutputStream b = new ByteArrayOutputStream();
    byte[] h = header.getBytes(StandardCharsets.UTF_8);
    b.write(ByteBuffer.allocate(8).order(ByteOrder.LITTLE_ENDIAN).putLong(claimedLength < 0 ? h.length : claimedLength)
        .array());
    b.write(h);
    b.write(data);
    Files.write(file, b.toByteArray());
    return file;
  }

  static byte[] le(Object... values) {
    ByteBuffer b = ByteBuffer.allocate(values.length * 4).order(ByteOrder.LITTLE_ENDIAN);
    for (Object v : values) {
      if (v instanceof Float f) {
        b.putFloat(f);
      } else {
        b.putShort((short) (int) (Integer) v);
      }
    }
    byte[] out = new byte[b.position()];
    b.flip().get(out);
    return out;
  }

  @Test
  void readsF32F16Bf16MadeByHand(@TempDir Path tmp) throws Exception {
    // a: F32 [2, 2]; b: F16 [3] = 1, -2, 65504; c: BF16 [2] = 1, -5 (bit patterns from the IEEE tables)
    byte[] data = le(1.5f, -0.25f, 3e-8f, 1e30f, 0x3C00, 0xC000, 0x7BFF, 0x3F80, 0xC0A0);
    String header = "{\"__metadata__\":{\"format\":\"pt\"},"
        + "\"a\":{\"dtype\":\"F32\",\"shape\":[2,2],\"data_offsets\":[0,16]},"
        + "\"b\":{\"dtype\":\"F16\",\"shape\":[3],\"data_offsets\":[16,22]},"
        + "\"c\":{\"dtype\":\"BF16\",\"shape\":[2],\"data_offsets\":[22,26]}}";
    Path f = handMade(tmp.resolve("x.safetensors"), header, data, -1);
    Map<String, Safetensors.Entry> e = Safetensors.readHeader(f);
    assertEquals(3, e.size(), "__metadata__ is not a tensor");
    assertArrayEquals(new long[] {2, 2}, e.get("a").shape());
    assertArrayEquals(new float[] {1.5f, -0.25f, 3e-8f, 1e30f}, Safetensors.readFloats(e.get("a")));
    assertArrayEquals(new float[] {1f, -2f, 65504f}, Safetensors.readFloats(e.get("b")));
    assertArrayEquals(new float[] {1f, -5f}, Safetensors.readFloats(e.get("c")));
  }

  @Test
  void writerRoundTrip(@TempDir Path tmp) throws Exception {
    long seed = Seeds.forTest();
    SplittableRandom r = new SplittableRandom(seed);
    float[] v = new float[37];
    for (int i = 0; i < v.length; i++) {
      v[i] = (float) (r.nextGaussian() * 10);
    }
    Map<String, Safetensors.Tensor> t = new LinkedHashMap<>();
    t.put("f32", new Safetensors.Tensor("F32", new long[] {37}, v));
    t.put("bf16", new Safetensors.Tensor("BF16", new long[] {1, 37}, v));
    t.put("f16", new Safetensors.Tensor("F16", new long[] {37, 1}, v));
    Path f = tmp.resolve("w.safetensors");
    Safetensors.write(f, t);
    Map<String, Safetensors.Entry> e = Safetensors.readHeader(f);
    assertArrayEquals(v, Safetensors.readFloats(e.get("f32")), "seed " + seed);
    float[] b = Safetensors.readFloats(e.get("bf16")), h = Safetensors.readFloats(e.get("f16"));
    for (int i = 0; i < v.length; i++) {
      assertEquals(v[i], b[i], Math.abs(v[i]) * 0x1p-8, "bf16 keeps 8 bits, seed " + seed);
      assertEquals(v[i], h[i], Math.abs(v[i]) * 0x1p-11 + 0x1p-24, "f16 keeps 11 bits, seed " + seed);
    }
    // What the reader would refuse (or could not read) is refused before any file is made.
    Path g = tmp.resolve("bad.safetensors");
    assertError(() -> Safetensors.write(g, Map.of("x", new Safetensors.Tensor("F16", new long[] {2}, new float[] {1f, 70000f}))),
        "tensor x", "value 70000.0 at index 1 overflows F16");
    assertError(() -> Safetensors.write(g, Map.of("y", new Safetensors.Tensor("F32", new long[] {-2, -3}, new float[6]))),
        "tensor y", "negative dimension");
    assertError(() -> Safetensors.write(g, Map.of("z", new Safetensors.Tensor("F32", new long[] {1}, null))),
        "tensor z", "no values");
    assertFalse(Files.exists(g));
  }

  @Test
  void brokenFilesNameTheFileAndTensor(@TempDir Path tmp) throws Exception {
    byte[] data = le(1f, 2f);
    String ok = "{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]}}";
    Path f1 = handMade(tmp.resolve("len.safetensors"), ok, data, 1L << 40);
    assertError(() -> Safetensors.readHeader(f1), "len.safetensors", "header length");
    Path f2 = handMade(tmp.resolve("json.safetensors"), "{\"a\":{\"dtype\":", data, -1);
    assertError(() -> Safetensors.readHeader(f2), "json.safetensors", "JSON");
    Path f3 = handMade(tmp.resolve("shape.safetensors"),
        "{\"a\":{\"dtype\":\"F32\",\"shape\":[3],\"data_offsets\":[0,8]}}", data, -1);
    assertError(() -> Safetensors.readHeader(f3), "shape.safetensors", "tensor a", "needs 12");
    Path f4 = handMade(tmp.resolve("trunc.safetensors"),
        "{\"a\":{\"dtype\":\"F32\",\"shape\":[4],\"data_offsets\":[0,16]}}", data, -1);
    assertError(() -> Safetensors.readHeader(f4), "trunc.safetensors", "tensor a", "past the data");
    Path f5 = handMade(tmp.resolve("dtype.safetensors"),
        "{\"a\":{\"dtype\":\"I32\",\"shape\":[2],\"data_offsets\":[0,8]}}", data, -1);
    assertError(() -> Safetensors.readHeader(f5), "dtype.safetensors", "tensor a", "I32");
    Path f6 = handMade(tmp.resolve("overlap.safetensors"),
        "{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]},"
            + "\"b\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[4,8]}}", data, -1);
    assertError(() -> Safetensors.readHeader(f6), "overlap.safetensors", "overlap");
    // A NaN or infinite weight (every score of a document came out NaN, exit 0, before).
    Map<String, Safetensors.Tensor> bad = new LinkedHashMap<>();
    bad.put("w", new Safetensors.Tensor("F32", new long[] {2, 3}, new float[] {0, 1, 2, 3, Float.NaN, 5}));
    bad.put("h", new Safetensors.Tensor("BF16", new long[] {2}, new float[] {1, Float.NEGATIVE_INFINITY}));
    Path f8 = tmp.resolve("nan.safetensors");
    Safetensors.write(f8, bad);
    Map<String, Safetensors.Entry> e8 = Safetensors.readHeader(f8);
    assertError(() -> Safetensors.readFloats(e8.get("w")), "nan.safetensors", "tensor w", "NaN", "row 1, column 1");
    assertError(() -> Safetensors.readFloats(e8.get("h")), "tensor h", "-Infinity", "element 1");
    Path f7 = tmp.resolve("tiny.safetensors");
    Files.write(f7, new byte[] {1, 2, 3});
    assertError(() -> Safetensors.readHeader(f7), "tiny.safetensors", "not a safetensors file");
  }

  interface Call {
    void run() throws Exception;
  }

  static void assertError(Call c, String... parts) {
    IllegalArgumentException e = assertThrows(IllegalArgumentException.class, c::run);
    for (String p : parts) {
      assertTrue(e.getMessage().contains(p), "message should name " + p + ": " + e.getMessage());
    }
  }

  /** Rewrites a generated checkpoint's model.safetensors (F32) after an edit of its tensors. */
  static void rewrite(Path dir, java.util.function.Consumer<Map<String, Safetensors.Tensor>> edit) throws Exception {
    Path f = dir.resolve("model.safetensors");
    Map<String, Safetensors.Tensor> t = new LinkedHashMap<>();
    for (Safetensors.Entry e : Safetensors.readHeader(f).values()) {
      t.put(e.name(), new Safetensors.Tensor("F32", e.shape(), Safetensors.readFloats(e)));
    }
    edit.accept(t);
    Files.delete(f);
    Safetensors.write(f, t);
  }

  @Test
  void checkpointTensorsMustMatchTheConfig(@TempDir Path tmp) throws Exception {
    long seed = Seeds.forTest();
    try (NDManager m = NDManager.newBaseManager("PyTorch")) {
      Path missing = LlamaTesting.generate(LlamaTesting.tiny(seed), tmp.resolve("missing"));
      rewrite(missing, t -> t.remove("model.layers.1.mlp.up_proj.weight"));
      assertError(() -> LlamaModel.load(missing, m), "model.layers.1.mlp.up_proj.weight", "missing");

      Path extra = LlamaTesting.generate(LlamaTesting.tiny(seed), tmp.resolve("extra"));
      rewrite(extra, t -> t.put("model.layers.0.self_attn.q_proj.scales",
          new Safetensors.Tensor("F32", new long[] {8}, new float[8])));
      assertError(() -> LlamaModel.load(extra, m), "model.safetensors", "q_proj.scales", "not part of this model");
      // Older conversions store each layer's rotary inv_freq buffer: passed over, as Hugging Face does.
      Path invFreq = LlamaTesting.generate(LlamaTesting.tiny(seed), tmp.resolve("inv-freq"));
      rewrite(invFreq, t -> t.put("model.layers.1.self_attn.rotary_emb.inv_freq",
          new Safetensors.Tensor("F32", new long[] {8}, new float[8])));
      LlamaModel.load(invFreq, m).close();

      Path shape = LlamaTesting.generate(LlamaTesting.tiny(seed), tmp.resolve("shape"));
      rewrite(shape, t -> t.put("model.norm.weight", new Safetensors.Tensor("F32", new long[] {63}, new float[63])));
      assertError(() -> LlamaModel.load(shape, m), "model.safetensors", "model.norm.weight", "[63]", "[64]");

      ModelGenerator.Spec tied = LlamaTesting.tiny(seed);
      tied.tie = true;
      Path head = LlamaTesting.generate(tied, tmp.resolve("tied-with-head"));
      rewrite(head, t -> t.put("lm_head.weight", new Safetensors.Tensor("F32", new long[] {300, 64},
          new float[300 * 64])));
      assertError(() -> LlamaModel.load(head, m), "lm_head.weight", "ties it to model.embed_tokens.weight",
          "its values differ");
      // A stored head equal to the embedding (what a tied model saved whole holds) is passed over.
      Path same = LlamaTesting.generate(tied, tmp.resolve("tied-with-its-head"));
      rewrite(same, t -> t.put("lm_head.weight", t.get("model.embed_tokens.weight")));
      LlamaModel.load(same, m).close();
    }
  }

  @Test
  void shardedCheckpointScoresLikeOneFile(@TempDir Path tmp) throws Exception {
    long seed = Seeds.forTest();
    ModelGenerator.Spec s = LlamaTesting.tiny(seed);
    Path one = LlamaTesting.generate(s, tmp.resolve("one"));
    s.shards = 3;
    Path three = LlamaTesting.generate(s, tmp.resolve("three"));
    assertTrue(Files.exists(three.resolve("model-00003-of-00003.safetensors")));
    assertTrue(Files.exists(three.resolve("model.safetensors.index.json")));
    assertEquals(Safetensors.checkpointEntries(one).keySet(), Safetensors.checkpointEntries(three).keySet());
    int[] tokens = LlamaTesting.randomTokens(new SplittableRandom(seed), 40, s.vocab);
    try (NDManager m = NDManager.newBaseManager("PyTorch");
        LlamaModel a = LlamaModel.load(one, m);
        LlamaModel b = LlamaModel.load(three, m)) {
      assertEquals(a.score(tokens, 16, false).sumLogprob(), b.score(tokens, 16, false).sumLogprob(), 0.0,
          "same weights, same bits; seed " + seed);
    }
    // An index that maps a tensor to a shard that does not hold it.
    Path idx = three.resolve("model.safetensors.index.json");
    com.google.gson.JsonObject index = com.google.gson.JsonParser.parseString(Files.readString(idx)).getAsJsonObject();
    com.google.gson.JsonObject wm = index.getAsJsonObject("weight_map");
    String holder = wm.get("model.norm.weight").getAsString();
    wm.addProperty("model.norm.weight", holder.equals("model-00001-of-00003.safetensors")
        ? "model-00002-of-00003.safetensors" : "model-00001-of-00003.safetensors");
    String bad = index.toString();
    Files.writeString(idx, bad);
    assertError(() -> Safetensors.checkpointEntries(three), "model.safetensors.index.json", "model.norm.weight");

    // model.safetensors beside the (now broken) index: the single file is read, as Hugging Face's
    // loader does, and the index is not looked at.
    Files.copy(one.resolve("model.safetensors"), three.resolve("model.safetensors"));
    for (Safetensors.Entry e : Safetensors.checkpointEntries(three).values()) {
      assertEquals(three.resolve("model.safetensors"), e.file(), e.name());
    }
  }

  /** Reads a sharded checkpoint as "." from inside its directory (run in a child JVM started there). */
  public static final class ReadDot {
    public static void main(String[] args) throws Exception {
      System.out.println("tensors " + Safetensors.checkpointEntries(java.nio.file.Paths.get(".")).size());
    }
  }

  /** A sharded checkpoint named as "." (normalized: the empty path) was refused, each shard "not a file". */
  @Test
  void shardedCheckpointInTheWorkingDirectory(@TempDir Path tmp) throws Exception {
    ModelGenerator.Spec s = LlamaTesting.tiny(Seeds.forTest());
    s.shards = 2;
    Path dir = LlamaTesting.generate(s, tmp.resolve("two"));
    Process p = new ProcessBuilder(Path.of(System.getProperty("java.home"), "bin", "java").toString(), "-cp",
        System.getProperty("java.class.path"), ReadDot.class.getName()).directory(dir.toFile()).redirectErrorStream(true)
        .start();
    String out = new String(p.getInputStream().readAllBytes(), java.nio.charset.StandardCharsets.UTF_8);
    assertTrue(p.waitFor(120, java.util.concurrent.TimeUnit.SECONDS), out);
    assertEquals(0, p.exitValue(), out);
    assertTrue(out.contains("tensors " + Safetensors.checkpointEntries(dir).size()), out);
    // A weight_map entry that is not a file name is named, not a JsonNull exception.
    Path idx = dir.resolve("model.safetensors.index.json");
    com.google.gson.JsonObject index = com.google.gson.JsonParser.parseString(Files.readString(idx)).getAsJsonObject();
    index.getAsJsonObject("weight_map").add("model.norm.weight", com.google.gson.JsonNull.INSTANCE);
    Files.writeString(idx, index.toString());
    assertError(() -> Safetensors.checkpointEntries(dir), "model.safetensors.index.json", "weight_map entry model.norm.weight");
  }
}
