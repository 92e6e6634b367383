package io.longctx.djl;

import com.google.gson.Gson;
import com.google.gson.JsonArray;
import com.google.gson.JsonElement;
import com.google.gson.JsonObject;
import com.google.gson.JsonParser;
import io.longctx.kernels.HalfFloats;
import java.io.IOException;
import java.nio.ByteBuffer;
import java.nio.ByteOrder;
import java.nio.channels.FileChannel;
import java.nio.charset.StandardCharsets;
import java.nio.file.Files;
import java.nio.file.Path;
import java.nio.file.StandardOpenOption;
import java.util.ArrayList;
import java.util.Arrays;
import java.util.Comparator;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Map;
import java.util.TreeMap;

/**
 * Reads and writes the safetensors format: an 8-byte little-endian header length N, N bytes of
 * JSON ({@code name -> {dtype, shape, data_offsets: [begin, end)}} relative to the data that
 * follows, plus an optional {@code __metadata__}), then the raw little-endian data.
 *
 * <p>We parse it ourselves instead of through {@code NDList.decodeSafetensors}: DJL would make a
 * bfloat16 NDArray from BF16 tensors, and bfloat16 NDArrays crash the JVM in DJL 0.35.1. Here F32,
 * F16 and BF16 are converted to float32 while reading; other dtypes are refused. Every error names
 * the file and, where there is one, the tensor.
 */
public final class Safetensors {

  /** Largest header we accept: real headers are kilobytes to a few megabytes. */
  static final long MAX_HEADER = 100L << 20;

  private Safetensors() {}

  /** One tensor's entry in a file's header. */
  public record Entry(Path file, String name, String dtype, long[] shape, long begin, long end) {

    public long numel() {
      long n = 1;
      for (long d : shape) {
        n = Math.multiplyExact(n, d);
      }
      return n;
    }
  }

  /** Bytes per element of a dtype we read, or -1. */
  static int elementSize(String dtype) {
    return switch (dtype) {
      case "F32" -> 4;
      case "F16", "BF16" -> 2;
      default -> -1;
    };
  }

  /**
   * Reads and validates a file's header: the length fits the file, the JSON is an object of
   * entries, each name once, with a supported dtype, non-negative shape and {@code data_offsets}
   * whose length is numel times the element size; the entries' data follow one another and cover
   * the file's data exactly, as Hugging Face's reader requires.
   */
  public static Map<String, Entry> readHeader(Path file) throws IOException {
    try (FileChannel ch = FileChannel.open(file, StandardOpenOption.READ)) {
      long size = ch.size();
      if (size < 8) {
        throw new IllegalArgumentException(file + ": not a safetensors file (" + size + " bytes, no header length)");
      }
      ByteBuffer lenBuf = ByteBuffer.allocate(8).order(ByteOrder.LITTLE_ENDIAN);
      readFully(ch, lenBuf, 0, file);
      long n = lenBuf.flip().getLong();
      if (n <= 0 || n > MAX_HEADER || n > size - 8) {
        throw new IllegalArgumentException(file + ": bad safetensors header length " + n + " (file has " + size
            + " bytes)");
      }
      ByteBuffer hb = ByteBuffer.allocate((int) n);
      readFully(ch, hb, 8, file);
      String json = new String(hb.array(), StandardCharsets.UTF_8);
      JsonObject header;
      try {
        JsonElement e = JsonParser.parseString(json);
        if (!e.isJsonObject()) {
          throw new IllegalArgumentException(file + ": safetensors header is not a JSON object");
        }
        header = e.getAsJsonObject();
      } catch (RuntimeException e) {
        if (e instanceof IllegalArgumentException && e.getMessage() != null && e.getMessage().startsWith(file.toString())) {
          throw e;
        }
        throw new IllegalArgumentException(file + ": safetensors header is not valid JSON: " + e.getMessage(), e);
      }
      requireUniqueNames(json, file);
      long dataStart = 8 + n, dataLen = size - dataStart;
      Map<String, Entry> out = new LinkedHashMap<>();
      for (Map.Entry<String, JsonElement> me : header.entrySet()) {
        String name = me.getKey();
        if (name.equals("__metadata__")) {
          continue;
        }
        out.put(name, entry(file, name, me.getValue(), dataStart, dataLen));
      }
      // As Hugging Face's reader requires: the tensors' data follow one another from the data's start
      // to the file's end, no overlap, no gap, nothing after.
      List<Entry> byBegin = new ArrayList<>(out.values());
      byBegin.sort(Comparator.comparingLong(Entry::begin));
      long at = dataStart;
      for (int i = 0; i < byBegin.size(); i++) {
        Entry e = byBegin.get(i);
        if (e.begin() < at) {
          throw new IllegalArgumentException(file + ": tensors " + byBegin.get(i - 1).name() + " and " + e.name()
              + " overlap in the data");
        }
        if (e.begin() > at) {
          throw new IllegalArgumentException(file + ": " + (e.begin() - at) + " bytes before tensor " + e.name()
              + " belong to no tensor (data_offsets must follow one another from 0)");
        }
        at = e.end();
      }
      if (at != size) {
        throw new IllegalArgumentException(file + ": " + (size - at) + " bytes after the last tensor belong to no "
            + "tensor (the header does not cover the file)");
      }
      return out;
    }
  }

  private static Entry entry(Path file, String name, JsonElement v, long dataStart, long dataLen) {
    String where = file + ": tensor " + name + ": ";
    if (!v.isJsonObject()) {
      throw new IllegalArgumentException(where + "header entry is not an object");
    }
    JsonObject o = v.getAsJsonObject();
    JsonElement dt = o.get("dtype"), sh = o.get("shape"), off = o.get("data_offsets");
    if (dt == null || !dt.isJsonPrimitive() || sh == null || !sh.isJsonArray() || off == null || !off.isJsonArray()
        || off.getAsJsonArray().size() != 2) {
      throw new IllegalArgumentException(where + "header entry needs dtype, shape and data_offsets [begin, end], got "
          + o);
    }
    String dtype = dt.getAsString();
    int es = elementSize(dtype);
    if (es < 0) {
      throw new IllegalArgumentException(where + "dtype " + dtype + " is not supported (F32, F16, BF16)");
    }
    JsonArray sa = sh.getAsJsonArray();
    long[] shape = new long[sa.size()];
    for (int i = 0; i < shape.length; i++) {
      shape[i] = nonNegative(sa.get(i), where + "shape");
    }
    long begin = nonNegative(off.getAsJsonArray().get(0), where + "data_offsets");
    long end = nonNegative(off.getAsJsonArray().get(1), where + "data_offsets");
    Entry e = new Entry(file, name, dtype, shape, dataStart + begin, dataStart + end);
    long want;
    try {
      want = Math.multiplyExact(e.numel(), (long) es);
    } catch (ArithmeticException x) {
      throw new IllegalArgumentException(where + "shape " + Arrays.toString(shape) + " overflows");
    }
    if (end < begin || end - begin != want) {
      throw new IllegalArgumentException(where + "data_offsets [" + begin + ", " + end + ") hold " + (end - begin)
          + " bytes, " + dtype + " " + Arrays.toString(shape) + " needs " + want);
    }
    if (end > dataLen) {
      throw new IllegalArgumentException(where + "data_offsets end " + end + " is past the data (" + dataLen
          + " bytes; truncated file?)");
    }
    return e;
  }

  /**
   * Refuses a header naming a tensor twice: the JSON tree keeps only the last entry of a name, so the
   * first would be dropped without a word (a wrong score, exit 0, before this check).
   */
  private static void requireUniqueNames(String json, Path file) {
    java.util.Set<String> seen = new java.util.HashSet<>();
    try (com.google.gson.stream.JsonReader r = new com.google.gson.stream.JsonReader(new java.io.StringReader(json))) {
      r.beginObject();
      while (r.hasNext()) {
        String name = r.nextName();
        if (!seen.add(name)) {
          throw new IllegalArgumentException(file + ": tensor " + name + " appears twice in the header");
        }
        r.skipValue();
      }
    } catch (IOException | IllegalStateException e) { // the tree parse before accepted it: not expected
      throw new IllegalArgumentException(file + ": safetensors header is not valid JSON: " + e.getMessage(), e);
    }
  }

  /** A JSON file of a checkpoint as text; bytes that are not UTF-8 are bad input, named by the file. */
  static String readUtf8(Path file) throws IOException {
    try {
      return Files.readString(file, StandardCharsets.UTF_8);
    } catch (java.nio.charset.CharacterCodingException e) {
      throw new IllegalArgumentException(file + ": not UTF-8 text (" + e + ")", e);
    }
  }

  private static long nonNegative(JsonElement e, String what) {
    if (!e.isJsonPrimitive() || !e.getAsJsonPrimitive().isNumber()) {
      throw new IllegalArgumentException(what + " must hold integers, got " + e);
    }
    double d = e.getAsDouble();
    long l = e.getAsLong();
    if (d < 0 || d != (double) l) {
      throw new IllegalArgumentException(what + " must hold non-negative integers, got " + e);
    }
    return l;
  }

  /**
   * The entries of a checkpoint directory: {@code model.safetensors}, or else the shards that
   * {@code model.safetensors.index.json} lists (its {@code weight_map} must name exactly the
   * tensors its shards hold, each once). The single file first where both are present, as Hugging
   * Face's loader reads them.
   */
  public static Map<String, Entry> checkpointEntries(Path dir) throws IOException {
    Path index = dir.resolve("model.safetensors.index.json");
    Path single = dir.resolve("model.safetensors");
    if (Files.isRegularFile(single)) {
      return readHeader(single);
    }
    if (Files.isRegularFile(index)) {
      JsonObject wm;
      try {
        JsonElement root = JsonParser.parseString(readUtf8(index));
        JsonElement w = root.isJsonObject() ? root.getAsJsonObject().get("weight_map") : null;
        if (w == null || !w.isJsonObject()) {
          throw new IllegalArgumentException(index + ": field weight_map missing or not an object");
        }
        wm = w.getAsJsonObject();
      } catch (com.google.gson.JsonParseException e) {
        throw new IllegalArgumentException(index + ": not valid JSON: " + e.getMessage(), e);
      }
      Map<String, String> tensorToShard = new TreeMap<>();
      for (Map.Entry<String, JsonElement> me : wm.entrySet()) {
        if (!me.getValue().isJsonPrimitive() || !me.getValue().getAsJsonPrimitive().isString()) {
          throw new IllegalArgumentException(index + ": weight_map entry " + me.getKey() + " is not a file name: "
              + me.getValue());
        }
        tensorToShard.put(me.getKey(), me.getValue().getAsString());
      }
      Map<String, Map<String, Entry>> shards = new TreeMap<>();
      for (String shard : new java.util.TreeSet<>(tensorToShard.values())) {
        // Absolute first: "." normalizes to the empty path, which no shard path starts with.
        Path top = dir.toAbsolutePath().normalize(), p = top.resolve(shard).normalize();
        if (!p.startsWith(top) || !Files.isRegularFile(p)) {
          throw new IllegalArgumentException(index + ": shard " + shard + " is not a file in " + dir);
        }
        shards.put(shard, readHeader(p));
      }
      Map<String, Entry> out = new LinkedHashMap<>();
      for (Map.Entry<String, String> te : tensorToShard.entrySet()) {
        Entry e = shards.get(te.getValue()).get(te.getKey());
        if (e == null) {
          throw new IllegalArgumentException(index + ": tensor " + te.getKey() + " is mapped to " + te.getValue()
              + ", which does not hold it");
        }
        out.put(te.getKey(), e);
      }
      for (Map.Entry<String, Map<String, Entry>> se : shards.entrySet()) {
        for (String name : se.getValue().keySet()) {
          if (!se.getKey().equals(tensorToShard.get(name))) {
            throw new IllegalArgumentException(dir.resolve(se.getKey()) + ": tensor " + name
                + " is not mapped to this shard by " + index.getFileName());
          }
        }
      }
      return out;
    }
    throw new IllegalArgumentException(dir + ": no model.safetensors nor model.safetensors.index.json");
  }

  /**
   * Checks that the entries are exactly the expected tensors with the expected shapes: a missing,
   * extra or mis-shaped tensor is an error naming the file and the tensor.
   */
  public static void requireExactly(Map<String, Entry> entries, Map<String, long[]> expected, Path dir) {
    for (Map.Entry<String, long[]> x : expected.entrySet()) {
      Entry e = entries.get(x.getKey());
      if (e == null) {
        throw new IllegalArgumentException(dir + ": tensor " + x.getKey() + " is missing (shape "
            + Arrays.toString(x.getValue()) + " expected)");
      }
      if (!Arrays.equals(e.shape(), x.getValue())) {
        throw new IllegalArgumentException(e.file() + ": tensor " + x.getKey() + " has shape "
            + Arrays.toString(e.shape()) + ", the config needs " + Arrays.toString(x.getValue()));
      }
    }
    for (Entry e : entries.values()) {
      if (!expected.containsKey(e.name())) {
        throw new IllegalArgumentException(e.file() + ": tensor " + e.name() + " is not part of this model "
            + "(unexpected tensor)");
      }
    }
  }

  /** Reads one tensor, converting F16 and BF16 to float32, into a new direct native-order buffer. */
  public static ByteBuffer readAsFloat32(Entry e) throws IOException {
    long n = e.numel();
    if (n * 4 > Integer.MAX_VALUE) {
      throw new IllegalArgumentException(e.file() + ": tensor " + e.name() + " has " + n
          + " elements, above the 2 GiB float32 buffer limit");
    }
    ByteBuffer out = ByteBuffer.allocateDirect((int) (n * 4)).order(ByteOrder.nativeOrder());
    readAsFloat32(e, 0, (int) n, out);
    return out;
  }

  /**
   * Reads elements [from, from + count) of a tensor, converting F16 and BF16 to float32, into
   * {@code out} (native order) from its index 0, refusing a NaN or infinite one by its place.
   */
  static void readAsFloat32(Entry e, long from, int count, ByteBuffer out) throws IOException {
    int es = elementSize(e.dtype());
    try (FileChannel ch = FileChannel.open(e.file(), StandardOpenOption.READ)) {
      ByteBuffer raw = ch.map(FileChannel.MapMode.READ_ONLY, e.begin() + from * es, (long) count * es)
          .order(ByteOrder.LITTLE_ENDIAN);
      switch (e.dtype()) {
        case "F32" -> out.asFloatBuffer().put(raw.asFloatBuffer());
        case "BF16" -> {
          for (int i = 0; i < count; i++) {
            out.putFloat(i * 4, HalfFloats.bf16ToFloat(raw.getShort()));
          }
        }
        case "F16" -> {
          for (int i = 0; i < count; i++) {
            out.putFloat(i * 4, HalfFloats.halfToFloat(raw.getShort()));
          }
        }
        default -> throw new AssertionError(e.dtype());
      }
    }
    requireFinite(e, from, out.asFloatBuffer().limit(count));
  }

  /** Bytes of the buffer through which {@link #load} copies tensors into libtorch, a block of rows at a time. */
  static final int STAGING_BYTES = 64 << 20;

  /**
   * Tensors {@code names} of {@code entries} as float32 arrays of {@code manager} in libtorch's own memory (by name),
   * copied in blocks of rows through one direct buffer. An array made from a direct buffer keeps that
   * buffer, so weights loaded that way counted against the JVM's direct-memory limit (by default the
   * heap's -Xmx): a Llama-3.2-1B-shaped checkpoint (5 GB as float32) failed to load under -Xmx3g, and
   * a tensor of 2 GiB or more as float32 (Llama-3-8B's embedding) could not be read at all. On failure
   * the arrays made so far are closed.
   */
  public static Map<String, ai.djl.ndarray.NDArray> load(Map<String, Entry> entries, java.util.Collection<String> names,
      ai.djl.ndarray.NDManager manager) throws IOException {
    Map<String, ai.djl.ndarray.NDArray> out = new LinkedHashMap<>();
    ByteBuffer staging = ByteBuffer.allocateDirect(0);
    try {
      for (String name : names) {
        Entry e = entries.get(name);
        long[] shape = e.shape();
        long rowBytes = shape.length == 0 ? 4 : e.numel() / Math.max(1, shape[0]) * 4;
        if (rowBytes > Integer.MAX_VALUE) {
          throw new IllegalArgumentException(e.file() + ": tensor " + e.name() + " has rows of " + rowBytes / 4
              + " elements, above the 2 GiB float32 buffer limit");
        }
        long want = Math.max(rowBytes, Math.min(STAGING_BYTES, e.numel() * 4)); // one row at least
        if (staging.capacity() < want) {
          staging = ByteBuffer.allocateDirect((int) want).order(ByteOrder.nativeOrder());
        }
        out.put(e.name(), load(e, manager, staging));
      }
    } catch (IOException | RuntimeException | Error ex) { // an OutOfMemoryError too: the arrays are libtorch's
      out.values().forEach(ai.djl.ndarray.NDArray::close);
      throw ex;
    }
    return out;
  }

  /** One tensor through {@code staging} (see {@link #load(Map, java.util.Collection, ai.djl.ndarray.NDManager)}). */
  private static ai.djl.ndarray.NDArray load(Entry e, ai.djl.ndarray.NDManager manager, ByteBuffer staging)
      throws IOException {
    long[] shape = e.shape();
    if (shape.length == 0) {
      readAsFloat32(e, 0, 1, staging);
      return manager.create(staging.getFloat(0));
    }
    long rowElems = e.numel() / Math.max(1, shape[0]);
    int rowsPerBlock = (int) Math.max(1, Math.min(shape[0], staging.capacity() / 4 / Math.max(1, rowElems)));
    ai.djl.ndarray.NDArray out = manager.create(new ai.djl.ndarray.types.Shape(shape),
        ai.djl.ndarray.types.DataType.FLOAT32); // uninitialized, libtorch's memory
    try {
      for (long r = 0; r < shape[0]; r += rowsPerBlock) {
        int rows = (int) Math.min(rowsPerBlock, shape[0] - r);
        readAsFloat32(e, r * rowElems, (int) (rows * rowElems), staging);
        long[] blockShape = shape.clone();
        blockShape[0] = rows;
        try (ai.djl.ndarray.NDManager tmp = manager.newSubManager()) {
          ai.djl.ndarray.NDArray block = tmp.create(staging.slice(0, (int) (rows * rowElems * 4))
              .order(ByteOrder.nativeOrder()), new ai.djl.ndarray.types.Shape(blockShape),
              ai.djl.ndarray.types.DataType.FLOAT32);
          out.set(new ai.djl.ndarray.index.NDIndex(r + ":" + (r + rows)), block); // copied into libtorch's memory
        }
      }
    } catch (IOException | RuntimeException | Error ex) { // an OutOfMemoryError too: the arrays are libtorch's
      out.close();
      throw ex;
    }
    return out;
  }

  /**
   * A NaN or infinite weight is refused, naming the file, tensor and element: it made every score of
   * a document NaN (exit 0, NaN in every column) or surfaced as an attention error naming no tensor.
   */
  private static void requireFinite(Entry e, long from, java.nio.FloatBuffer f) {
    for (int k = 0, n = f.limit(); k < n; k++) {
      float x = f.get(k);
      if (!Float.isFinite(x)) {
        long i = from + k;
        long cols = e.shape().length > 1 ? e.shape()[e.shape().length - 1] : 1;
        throw new IllegalArgumentException(e.file() + ": tensor " + e.name() + " holds " + x + " at element " + i
            + (e.shape().length > 1 ? " (row " + i / cols + ", column " + i % cols + ")" : "")
            + ": weights must be finite");
      }
    }
  }

  /** {@link #readAsFloat32} as a float[]. */
  public static float[] readFloats(Entry e) throws IOException {
    float[] f = new float[Math.toIntExact(e.numel())];
    readAsFloat32(e).asFloatBuffer().get(f);
    return f;
  }

  private static void readFully(FileChannel ch, ByteBuffer b, long pos, Path file) throws IOException {
    while (b.hasRemaining()) {
      int r = ch.read(b, pos + b.position());
      if (r < 0) {
        throw new IllegalArgumentException(file + ": truncated safetensors file");
      }
    }
  }

  /** A tensor to write: float32 values stored as {@code dtype} (F32, F16 or BF16, rounded to nearest even). */
  public record Tensor(String dtype, long[] shape, float[] values) {}

  /** Writes a safetensors file with the tensors in map order. */
  public static void write(Path file, Map<String, Tensor> tensors) throws IOException {
    JsonObject header = new JsonObject();
    long off = 0;
    for (Map.Entry<String, Tensor> me : tensors.entrySet()) {
      Tensor t = me.getValue();
      if (t == null || t.values() == null || t.shape() == null) {
        throw new IllegalArgumentException("tensor " + me.getKey() + ": no values or no shape");
      }
      int es = elementSize(t.dtype());
      if (es < 0) {
        throw new IllegalArgumentException("tensor " + me.getKey() + ": dtype " + t.dtype() + " not writable");
      }
      long n = 1;
      JsonArray shape = new JsonArray();
      for (long d : t.shape()) {
        if (d < 0) {
          throw new IllegalArgumentException("tensor " + me.getKey() + ": negative dimension in shape "
              + Arrays.toString(t.shape()));
        }
        n *= d;
        shape.add(d);
      }
      if (n != t.values().length) {
        throw new IllegalArgumentException("tensor " + me.getKey() + ": shape " + Arrays.toString(t.shape())
            + " needs " + n + " values, got " + t.values().length);
      }
      float[] vals = t.values();
      for (int i = 0; i < vals.length; i++) { // a finite value that would be stored as infinity (F16 past 65504)
        float stored = switch (t.dtype()) {
          case "F16" -> HalfFloats.halfToFloat(HalfFloats.floatToHalf(vals[i]));
          case "BF16" -> HalfFloats.bf16ToFloat(HalfFloats.floatToBf16(vals[i]));
          default -> vals[i];
        };
        if (Float.isFinite(vals[i]) && !Float.isFinite(stored)) {
          throw new IllegalArgumentException("tensor " + me.getKey() + ": value " + vals[i] + " at index " + i
              + " overflows " + t.dtype());
        }
      }
      JsonObject e = new JsonObject();
      e.addProperty("dtype", t.dtype());
      e.add("shape", shape);
      JsonArray offs = new JsonArray();
      offs.add(off);
      off += n * es;
      offs.add(off);
      e.add("data_offsets", offs);
      header.add(me.getKey(), e);
    }
    byte[] h = new Gson().toJson(header).getBytes(StandardCharsets.UTF_8);
    int pad = (8 - h.length % 8) % 8; // the format pads the header with spaces to 8-byte alignment
    byte[] hp = Arrays.copyOf(h, h.length + pad);
    Arrays.fill(hp, h.length, hp.length, (byte) ' ');
    try (FileChannel ch = FileChannel.open(file, StandardOpenOption.CREATE_NEW, StandardOpenOption.WRITE)) {
      ByteBuffer len = ByteBuffer.allocate(8).order(ByteOrder.LITTLE_ENDIAN).putLong(hp.length);
      len.flip();
      writeFully(ch, len);
      writeFully(ch, ByteBuffer.wrap(hp));
      for (Tensor t : tensors.values()) {
        int es = elementSize(t.dtype());
        ByteBuffer b = ByteBuffer.allocate(t.values().length * es).order(ByteOrder.LITTLE_ENDIAN);
        for (float v : t.values()) {
          switch (t.dtype()) {
            case "F32" -> b.putFloat(v);
            case "BF16" -> b.putShort(HalfFloats.floatToBf16(v));
            case "F16" -> b.putShort(HalfFloats.floatToHalf(v));
            default -> throw new AssertionError(t.dtype());
          }
        }
        b.flip();
        writeFully(ch, b);
      }
    }
  }

  private static void writeFully(FileChannel ch, ByteBuffer b) throws IOException {
    while (b.hasRemaining()) {
      ch.write(b);
    }
  }
}
