package io.longctx.djl;

import com.google.gson.JsonElement;
import com.google.gson.JsonObject;
import com.google.gson.JsonParser;
import com.google.gson.JsonSyntaxException;
import java.io.IOException;
import java.nio.file.Files;
import java.nio.file.Path;
import java.util.Arrays;
import java.util.Locale;
import java.util.Map;
import java.util.Objects;

/**
 * The {@code config.json} of a Llama-family checkpoint in the Hugging Face layout: model types
 * {@code llama}, {@code mistral} (its {@code sliding_window} becomes our attention window) and
 * {@code qwen2} (bias on q, k, v). Rope scaling {@code linear} and {@code llama3}. A field value we
 * do not compute (another {@code hidden_act}, another rope type, MLP bias, partial rotary, Qwen2's
 * per-layer sliding window) is refused with an {@link IllegalArgumentException} naming the file and
 * the field, never ignored: a silently different model would give plausible but wrong scores.
 */
public final class LlamaConfig {

  /** Rope scaling types we compute. */
  public enum RopeScaling {
    NONE, LINEAR, LLAMA3
  }

  public final String modelType;
  public final int hiddenSize;
  public final int intermediateSize;
  public final int layers;
  public final int heads;
  public final int kvHeads;
  public final int headDim;
  public final int vocabSize;
  public final double rmsNormEps;
  public final double ropeTheta;
  public final RopeScaling ropeScaling;
  /** linear and llama3: the factor; 1 otherwise. */
  public final double ropeFactor;
  public final double lowFreqFactor;
  public final double highFreqFactor;
  public final long originalMaxPositions;
  public final boolean tieWordEmbeddings;
  /** Bias on the q, k, v projections (Qwen2; Llama with {@code attention_bias}). */
  public final boolean qkvBias;
  /** Bias on the o projection (Llama with {@code attention_bias}). */
  public final boolean oBias;
  /** Mistral's sliding window W (a query at p sees keys in (p - W, p]); 0 for none. */
  public final long slidingWindow;

  private LlamaConfig(Builder b) {
    this.modelType = b.modelType;
    this.hiddenSize = b.hiddenSize;
    this.intermediateSize = b.intermediateSize;
    this.layers = b.layers;
    this.heads = b.heads;
    this.kvHeads = b.kvHeads;
    this.headDim = b.headDim;
    this.vocabSize = b.vocabSize;
    this.rmsNormEps = b.rmsNormEps;
    this.ropeTheta = b.ropeTheta;
    this.ropeScaling = b.ropeScaling;
    this.ropeFactor = b.ropeFactor;
    this.lowFreqFactor = b.lowFreqFactor;
    this.highFreqFactor = b.highFreqFactor;
    this.originalMaxPositions = b.originalMaxPositions;
    this.tieWordEmbeddings = b.tieWordEmbeddings;
    this.qkvBias = b.qkvBias;
    this.oBias = b.oBias;
    this.slidingWindow = b.slidingWindow;
  }

  /** Reads {@code dir/config.json}. */
  public static LlamaConfig read(Path dir) throws IOException {
    if (!Files.isDirectory(dir)) {
      throw new IllegalArgumentException(dir + ": " + (Files.exists(dir) ? "not a directory" : "no such directory")
          + " (a checkpoint is a directory holding config.json, the safetensors weights and tokenizer.json)");
    }
    Path file = dir.resolve("config.json");
    if (!Files.isRegularFile(file)) {
      throw new IllegalArgumentException(file + ": no config.json in the checkpoint directory");
    }
    return parse(Safetensors.readUtf8(file), file.toString());
  }

  /**
   * Parses config.json text; {@code source} names the file in error messages.
   *
   * @throws IllegalArgumentException for malformed JSON, missing or invalid fields, and values we
   *     do not compute, naming the file and the field
   */
  public static LlamaConfig parse(String json, String source) {
    JsonObject o;
    try {
      JsonElement e = JsonParser.parseString(json);
      if (!e.isJsonObject()) {
        throw new IllegalArgumentException(source + ": not a JSON object");
      }
      o = e.getAsJsonObject();
    } catch (JsonSyntaxException e) {
      throw new IllegalArgumentException(source + ": not valid JSON: " + e.getMessage(), e);
    }
    Fields f = new Fields(o, source);
    Builder b = new Builder();
    b.modelType = f.string("model_type", null);
    if (b.modelType == null) {
      throw f.error("model_type", "missing (need llama, mistral or qwen2)");
    }
    if (!b.modelType.equals("llama") && !b.modelType.equals("mistral") && !b.modelType.equals("qwen2")) {
      throw f.error("model_type", "\"" + b.modelType + "\" is not supported (llama, mistral, qwen2)");
    }
    String act = f.string("hidden_act", "silu");
    if (!act.equals("silu")) {
      throw f.error("hidden_act", "\"" + act + "\" is not supported (only silu: SwiGLU)");
    }
    b.hiddenSize = f.positiveInt("hidden_size");
    b.intermediateSize = f.positiveInt("intermediate_size");
    b.layers = f.positiveInt("num_hidden_layers");
    b.heads = f.positiveInt("num_attention_heads");
    b.kvHeads = f.has("num_key_value_heads") ? f.positiveInt("num_key_value_heads") : b.heads;
    if (b.heads % b.kvHeads != 0) {
      throw f.error("num_key_value_heads", b.kvHeads + " does not divide num_attention_heads " + b.heads);
    }
    if (f.has("head_dim")) {
      b.headDim = f.positiveInt("head_dim");
    } else {
      if (b.hiddenSize % b.heads != 0) {
        throw f.error("hidden_size", b.hiddenSize + " is not divisible by num_attention_heads " + b.heads
            + " and no head_dim is given");
      }
      b.headDim = b.hiddenSize / b.heads;
    }
    if (b.headDim % 2 != 0) {
      throw f.error("head_dim", "rotary embedding needs an even head dim, got " + b.headDim);
    }
    b.vocabSize = f.positiveInt("vocab_size");
    b.rmsNormEps = f.positiveDouble("rms_norm_eps", 1e-6);
    // Transformers 5 writes the rotary settings as one object, rope_parameters (rope_theta inside it,
    // with the scaling fields); older configs use rope_theta and rope_scaling. Read either, never a mix.
    String rope = "rope_scaling";
    if (f.has("rope_parameters") && !o.get("rope_parameters").isJsonNull()) {
      if (!o.get("rope_parameters").isJsonObject()) {
        throw f.error("rope_parameters", "must be an object or null");
      }
      for (String old : new String[] {"rope_theta", "rope_scaling"}) {
        if (f.has(old) && !o.get(old).isJsonNull()) {
          throw f.error(old, "given beside rope_parameters: one or the other, not both");
        }
      }
      rope = "rope_parameters";
      b.ropeTheta = new Fields(o.getAsJsonObject("rope_parameters"), f.source, "rope_parameters.")
          .positiveDouble("rope_theta", 10000.0);
    } else {
      b.ropeTheta = f.positiveDouble("rope_theta", 10000.0);
    }
    b.tieWordEmbeddings = f.bool("tie_word_embeddings", false);
    if (f.has("partial_rotary_factor") && f.positiveDouble("partial_rotary_factor", 1.0) != 1.0) {
      throw f.error("partial_rotary_factor", "only 1.0 (rotary over the whole head) is supported");
    }
    if (f.bool("mlp_bias", false)) {
      throw f.error("mlp_bias", "true is not supported (the MLP has no bias in our model)");
    }
    switch (b.modelType) {
      case "qwen2" -> {
        b.qkvBias = true;
        if (f.bool("use_sliding_window", false)) {
          throw f.error("use_sliding_window", "true is not supported (Qwen2's per-layer window, max_window_layers)");
        }
      }
      case "llama" -> {
        boolean bias = f.bool("attention_bias", false);
        b.qkvBias = bias;
        b.oBias = bias;
      }
      case "mistral" -> {
        // As Hugging Face's MistralConfig: an absent sliding_window is its default, 4096; only an
        // explicit null turns the window off.
        if (!o.has("sliding_window")) {
          b.slidingWindow = MISTRAL_DEFAULT_WINDOW;
        } else if (f.has("sliding_window")) {
          b.slidingWindow = f.positiveInt("sliding_window");
        }
      }
      default -> throw new AssertionError(b.modelType);
    }
    parseRopeScaling(o, f, b, rope);
    return new LlamaConfig(b);
  }

  /** The rotary scaling of object {@code field} of the config (rope_scaling, or rope_parameters). */
  private static void parseRopeScaling(JsonObject o, Fields f, Builder b, String field) {
    JsonElement rs = o.get(field);
    b.ropeScaling = RopeScaling.NONE;
    b.ropeFactor = 1.0;
    if (rs == null || rs.isJsonNull()) {
      return;
    }
    if (!rs.isJsonObject()) {
      throw f.error(field, "must be an object or null");
    }
    Fields r = new Fields(rs.getAsJsonObject(), f.source, field + ".");
    // Newer configs say rope_type, older ones type; where both are given, Hugging Face's configs
    // copy type over rope_type, so type wins.
    String typeField = r.has("type") ? "type" : "rope_type";
    String type = r.string(typeField, null);
    if (type == null) {
      throw f.error(field + ".rope_type", "missing");
    }
    switch (type) {
      case "default" -> {
        return;
      }
      case "linear" -> {
        b.ropeScaling = RopeScaling.LINEAR;
        b.ropeFactor = r.positiveDouble("factor", Double.NaN);
      }
      case "llama3" -> {
        b.ropeScaling = RopeScaling.LLAMA3;
        b.ropeFactor = r.positiveDouble("factor", Double.NaN);
        b.lowFreqFactor = r.positiveDouble("low_freq_factor", Double.NaN);
        b.highFreqFactor = r.positiveDouble("high_freq_factor", Double.NaN);
        b.originalMaxPositions = r.positiveInt("original_max_position_embeddings");
        if (!(b.highFreqFactor > b.lowFreqFactor)) {
          throw f.error(field + ".high_freq_factor", "must exceed low_freq_factor, got " + b.highFreqFactor
              + " <= " + b.lowFreqFactor);
        }
      }
      default -> throw f.error(field + "." + typeField, "\"" + type
          + "\" is not supported (default, linear, llama3)");
    }
    if (r.has("attention_factor") && r.positiveDouble("attention_factor", 1.0) != 1.0) {
      throw f.error(field + ".attention_factor", "only 1.0 is supported");
    }
  }

  /** The attention every layer computes: causal, Mistral's window if any, scale 1/sqrt(head_dim). */
  public io.longctx.kernels.AttentionOptions attention() {
    return io.longctx.kernels.AttentionOptions.DEFAULT.withCausal(true).withWindow(slidingWindow)
        .withScale(1.0 / Math.sqrt(headDim));
  }

  /** Bytes the one-task path keeps per token: every layer's keys and values, float32. */
  public long kvCacheBytesPerToken() {
    return (long) layers * kvHeads * headDim * 2 * Float.BYTES;
  }

  /** FLOPs per token of one layer outside attention: the q, k, v, o projections and the MLP. */
  public double denseFlopsPerToken() {
    double qkvo = (double) hiddenSize * (2.0 * heads + 2.0 * kvHeads) * headDim;
    return 2.0 * (qkvo + 3.0 * hiddenSize * intermediateSize);
  }

  /**
   * The rotary inverse frequencies, float64, length headDim / 2, exactly as Hugging Face's rope
   * initialisation for this config: theta^(-2i/d); linear divides by the factor (the same as
   * pos / factor); llama3 rescales by wavelength band with a smooth blend in between.
   */
  public double[] inverseFrequencies() {
    int half = headDim / 2;
    double[] inv = new double[half];
    for (int i = 0; i < half; i++) {
      inv[i] = 1.0 / Math.pow(ropeTheta, (2.0 * i) / headDim);
    }
    switch (ropeScaling) {
      case NONE -> { }
      case LINEAR -> {
        for (int i = 0; i < half; i++) {
          inv[i] /= ropeFactor;
        }
      }
      case LLAMA3 -> {
        double lowWavelen = originalMaxPositions / lowFreqFactor;
        double highWavelen = originalMaxPositions / highFreqFactor;
        for (int i = 0; i < half; i++) {
          double wavelen = 2 * Math.PI / inv[i];
          if (wavelen > lowWavelen) {
            inv[i] = inv[i] / ropeFactor; // long wavelengths: fully scaled
          } else if (wavelen >= highWavelen) {
            double smooth = (originalMaxPositions / wavelen - lowFreqFactor) / (highFreqFactor - lowFreqFactor);
            inv[i] = (1 - smooth) * inv[i] / ropeFactor + smooth * inv[i];
          } // short wavelengths: unchanged
        }
      }
      default -> throw new AssertionError(ropeScaling);
    }
    return inv;
  }

  /**
   * The tensors of this config ({@link #expectedTensors}), checked against a checkpoint's entries:
   * exactly these names, with these shapes ({@link Safetensors#requireExactly}). The names are made
   * one at a time and the first missing one is named at once, so a layer count the checkpoint cannot
   * hold fails before the rest are built: 2e9 layers would fill the heap. Two kinds of extra tensor
   * Hugging Face loads such checkpoints past are passed over, as it does: each layer's
   * {@code self_attn.rotary_emb.inv_freq} (a buffer older conversions stored; the frequencies come
   * from config.json) and, with {@code tie_word_embeddings}, a stored {@code lm_head.weight} equal to
   * the embedding, bit for bit (one that differs is refused: which of the two scores would be a guess).
   */
  public Map<String, long[]> requireTensors(Map<String, Safetensors.Entry> checkpoint, Path dir) {
    Map<String, Safetensors.Entry> entries = new java.util.LinkedHashMap<>(checkpoint);
    entries.keySet().removeIf(n -> INV_FREQ.matcher(n).matches());
    Safetensors.Entry head = tieWordEmbeddings ? entries.remove("lm_head.weight") : null;
    if (head != null) {
      requireSameAsEmbedding(head, entries.get("model.embed_tokens.weight"));
    }
    Map<String, long[]> expected = new java.util.LinkedHashMap<>();
    forEachExpected((name, shape) -> {
      if (!entries.containsKey(name)) {
        throw new IllegalArgumentException(dir + ": tensor " + name + " is missing (shape " + Arrays.toString(shape)
            + " expected; config.json: " + layers + " layers, the checkpoint holds " + entries.size() + " tensors)");
      }
      expected.put(name, shape);
    });
    Safetensors.requireExactly(entries, expected, dir);
    return expected;
  }

  private static final java.util.regex.Pattern INV_FREQ =
      java.util.regex.Pattern.compile("model\\.layers\\.\\d+\\.self_attn\\.rotary_emb\\.inv_freq");

  /** A tied checkpoint's stored lm_head.weight must be the embedding itself (same shape, same values). */
  private static void requireSameAsEmbedding(Safetensors.Entry head, Safetensors.Entry embed) {
    String refused = head.file() + ": tensor lm_head.weight is stored although config.json ties it to "
        + "model.embed_tokens.weight (tie_word_embeddings), and ";
    if (embed == null) {
      return; // the missing embedding is named by the check that follows
    }
    if (!java.util.Arrays.equals(head.shape(), embed.shape())) {
      throw new IllegalArgumentException(refused + "its shape " + java.util.Arrays.toString(head.shape())
          + " is not the embedding's " + java.util.Arrays.toString(embed.shape()));
    }
    try {
      if (!Safetensors.readAsFloat32(head).equals(Safetensors.readAsFloat32(embed))) {
        throw new IllegalArgumentException(refused + "its values differ from the embedding's: which of the two "
            + "scores is not clear (set tie_word_embeddings to false to use it, or drop it)");
      }
    } catch (java.io.IOException e) {
      throw new java.io.UncheckedIOException(e);
    }
  }

  /** The tensor names and shapes a checkpoint of this config must hold, in a stable order. */
  public Map<String, long[]> expectedTensors() {
    Map<String, long[]> m = new java.util.LinkedHashMap<>();
    forEachExpected(m::put);
    return m;
  }

  private void forEachExpected(java.util.function.BiConsumer<String, long[]> f) {
    long e = hiddenSize, qOut = (long) heads * headDim, kvOut = (long) kvHeads * headDim;
    f.accept("model.embed_tokens.weight", new long[] {vocabSize, e});
    for (int l = 0; l < layers; l++) {
      String p = "model.layers." + l + ".";
      f.accept(p + "input_layernorm.weight", new long[] {e});
      f.accept(p + "self_attn.q_proj.weight", new long[] {qOut, e});
      f.accept(p + "self_attn.k_proj.weight", new long[] {kvOut, e});
      f.accept(p + "self_attn.v_proj.weight", new long[] {kvOut, e});
      if (qkvBias) {
        f.accept(p + "self_attn.q_proj.bias", new long[] {qOut});
        f.accept(p + "self_attn.k_proj.bias", new long[] {kvOut});
        f.accept(p + "self_attn.v_proj.bias", new long[] {kvOut});
      }
      f.accept(p + "self_attn.o_proj.weight", new long[] {e, qOut});
      if (oBias) {
        f.accept(p + "self_attn.o_proj.bias", new long[] {e});
      }
      f.accept(p + "post_attention_layernorm.weight", new long[] {e});
      f.accept(p + "mlp.gate_proj.weight", new long[] {intermediateSize, e});
      f.accept(p + "mlp.up_proj.weight", new long[] {intermediateSize, e});
      f.accept(p + "mlp.down_proj.weight", new long[] {e, intermediateSize});
    }
    f.accept("model.norm.weight", new long[] {e});
    if (!tieWordEmbeddings) {
      f.accept("lm_head.weight", new long[] {vocabSize, e});
    }
  }

  @Override
  public String toString() {
    return String.format(Locale.ROOT, "%s(layers=%d, hidden=%d, heads=%d/%d, headDim=%d, ffn=%d, vocab=%d, rope=%s "
        + "theta=%g factor=%g, window=%d, tied=%b, qkvBias=%b)", modelType, layers, hiddenSize, heads, kvHeads,
        headDim, intermediateSize, vocabSize, ropeScaling, ropeTheta, ropeFactor, slidingWindow, tieWordEmbeddings,
        qkvBias);
  }

  /** Hugging Face MistralConfig's sliding_window where config.json has none. */
  static final int MISTRAL_DEFAULT_WINDOW = 4096;

  private static final class Builder {
    String modelType;
    int hiddenSize, intermediateSize, layers, heads, kvHeads, headDim, vocabSize;
    double rmsNormEps, ropeTheta, ropeFactor = 1, lowFreqFactor, highFreqFactor;
    long originalMaxPositions, slidingWindow;
    RopeScaling ropeScaling = RopeScaling.NONE;
    boolean tieWordEmbeddings, qkvBias, oBias;
  }

  /** Typed access to JSON fields with errors that name the file and the field. */
  private static final class Fields {
    final JsonObject o;
    final String source;
    final String prefix;

    Fields(JsonObject o, String source) {
      this(o, source, "");
    }

    Fields(JsonObject o, String source, String prefix) {
      this.o = Objects.requireNonNull(o);
      this.source = source;
      this.prefix = prefix;
    }

    boolean has(String k) {
      return o.has(k) && !o.get(k).isJsonNull();
    }

    IllegalArgumentException error(String field, String what) {
      String name = field.contains(".") ? field : prefix + field;
      return new IllegalArgumentException(source + ": field " + name + ": " + what);
    }

    String string(String k, String dflt) {
      if (!has(k)) {
        return dflt;
      }
      JsonElement e = o.get(k);
      if (!e.isJsonPrimitive() || !e.getAsJsonPrimitive().isString()) {
        throw error(k, "must be a string, got " + e);
      }
      return e.getAsString();
    }

    boolean bool(String k, boolean dflt) {
      if (!has(k)) {
        return dflt;
      }
      JsonElement e = o.get(k);
      if (!e.isJsonPrimitive() || !e.getAsJsonPrimitive().isBoolean()) {
        throw error(k, "must be true or false, got " + e);
      }
      return e.getAsBoolean();
    }

    int positiveInt(String k) {
      if (!has(k)) {
        throw error(k, "missing");
      }
      JsonElement e = o.get(k);
      if (!e.isJsonPrimitive() || !e.getAsJsonPrimitive().isNumber()) {
        throw error(k, "must be a number, got " + e);
      }
      double d = e.getAsDouble();
      if (d != Math.rint(d) || d < 1 || d > Integer.MAX_VALUE) {
        throw error(k, "must be a positive integer, got " + e);
      }
      return (int) d;
    }

    double positiveDouble(String k, double dflt) {
      if (!has(k)) {
        if (Double.isNaN(dflt)) {
          throw error(k, "missing");
        }
        return dflt;
      }
      JsonElement e = o.get(k);
      if (!e.isJsonPrimitive() || !e.getAsJsonPrimitive().isNumber()) {
        throw error(k, "must be a number, got " + e);
      }
      double d = e.getAsDouble();
      if (!(d > 0) || Double.isInfinite(d)) {
        throw error(k, "must be positive and finite, got " + e);
      }
      return d;
    }
  }
}
