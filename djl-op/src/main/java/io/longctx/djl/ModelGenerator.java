package io.longctx.djl;

import com.google.gson.GsonBuilder;
import com.google.gson.JsonArray;
import com.google.gson.JsonObject;
import java.io.IOException;
import java.nio.charset.StandardCharsets;
import java.nio.file.Files;
import java.nio.file.Path;
import java.util.ArrayList;
import java.util.HashMap;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Locale;
import java.util.Map;
import java.util.SplittableRandom;
import java.util.TreeMap;
import java.util.UUID;
import java.util.regex.Matcher;
import java.util.regex.Pattern;

/**
 * Writes a Llama-family checkpoint of our own in the Hugging Face layout, since none can be
 * downloaded here: {@code config.json}, seeded random weights ({@code model.safetensors}, or shards
 * with {@code model.safetensors.index.json}) and a byte-level BPE {@code tokenizer.json} whose
 * merges are learned from a built-in text (so any UTF-8 text tokenizes, without unknown tokens).
 * The same options and seed give the same bytes.
 *
 * <pre>
 *   java ... io.longctx.djl.ModelGenerator --output DIR [--layers 2] [--hidden 64] [--heads 4]
 *       [--kv-heads 2] [--ffn 4*hidden*2/3] [--vocab 300] [--seed 1] [--dtype bf16|f16|f32]
 *       [--model-type llama|mistral|qwen2] [--tie] [--sliding-window W] [--rope-theta 10000]
 *       [--rope-scaling none|linear:F|llama3:F] [--shards N] [--init-std S]
 * </pre>
 */
public final class ModelGenerator {

  /** What to generate; public fields, defaults as the options'. */
  public static final class Spec {
    public String modelType = "llama";
    public int layers = 2;
    public int hidden = 64;
    public int heads = 4;
    public int kvHeads = 2;
    /** 0: the Llama rule 2/3 * 4 * hidden rounded up to a multiple of 16. */
    public int ffn;
    public int vocab = 300;
    public long seed = 1;
    public String dtype = "BF16";
    public boolean tie;
    public long slidingWindow;
    public double ropeTheta = 10000;
    /** "none", "linear:F" or "llama3:F" (llama3 with low 1, high 4, original 64 positions: small enough to matter in short tests). */
    public String ropeScaling = "none";
    public int shards = 1;
    /** Weight std; 0: 1/sqrt(hidden), which keeps attention and logits away from uniform. */
    public double initStd;

    int ffnSize() {
      return ffn > 0 ? ffn : ((8 * hidden / 3) + 15) / 16 * 16;
    }

    double std() {
      return initStd > 0 ? initStd : 1.0 / Math.sqrt(hidden);
    }
  }

  private ModelGenerator() {}

  static final String HELP = """
      usage: longctx gen-model --output DIR [options]

      Writes a Llama-family checkpoint of seeded random weights for tests, demos and benchmarks:
      DIR/config.json, DIR/model.safetensors (or shards with an index) and DIR/tokenizer.json (a
      byte-level BPE vocabulary). DIR must not exist or be empty.

        --output DIR            where to write (required)
        --model-type T          llama (default), mistral or qwen2 (q/k/v bias)
        --layers N              decoder layers (default 2)
        --hidden E              hidden size (default 64)
        --heads H, --kv-heads K attention heads and kv heads (default 4, 2; H % K == 0)
        --ffn F                 MLP width (default, or 0: 8*hidden/3 rounded up to a multiple of 16)
        --vocab V               vocabulary size (default 300; at least 259: 3 special tokens + 256 bytes)
        --seed S                weight seed (default 1)
        --dtype D               bf16 (default), f16 or f32: how weights are stored
        --tie                   tie the LM head to the embedding
        --sliding-window W      attention window (mistral; default none)
        --rope-theta T          rotary base (default 10000)
        --rope-scaling S        none (default), linear:F or llama3:F
        --shards N              split the weights over N files with an index (default 1)
        --init-std S            weight std (default, or 0: 1/sqrt(hidden))
      """;

  public static void main(String[] args) throws IOException {
    try {
      if (java.util.Arrays.stream(args).noneMatch(a -> a.equals("--help") || a.equals("-h"))) {
        AttentionOp.checkSettings(); // as every command: a bad -Dlongctx... value is exit 2, though unused here
      }
      run(args);
    } catch (IllegalArgumentException | ArithmeticException e) { // bad usage (or sizes past int): one line, exit 2
      System.err.println("longctx gen-model: error: " + e.getMessage()
          + (e instanceof ArithmeticException ? " (the sizes given make a tensor past 2^31 elements)" : ""));
      System.exit(2);
    } catch (IOException e) { // a folder that cannot be written, a full disk: one line naming the path, exit 1
      System.err.println("longctx gen-model: failed: " + e);
      System.exit(1);
    }
  }

  static void run(String[] args) throws IOException {
    Spec s = new Spec();
    Path out = null;
    java.util.Set<String> given = new java.util.HashSet<>();
    for (int i = 0; i < args.length; i++) {
      String a = args[i];
      if (a.startsWith("--") && !given.add(a)) { // the last one won in silence
        throw new IllegalArgumentException(a + " is given twice");
      }
      if (a.equals("--tie")) {
        s.tie = true;
        continue;
      }
      if (a.equals("--help") || a.equals("-h")) {
        System.out.print(HELP);
        return;
      }
      java.util.function.BiConsumer<Spec, String> set = VALUE_OPTIONS.get(a);
      if (set == null) {
        throw new IllegalArgumentException("unknown option " + a + " (--help lists them)");
      }
      if (i + 1 >= args.length) {
        throw new IllegalArgumentException(a + " needs a value");
      }
      String v = args[++i];
      if (v.startsWith("--")) { // "--output --tie": the next option is not a value
        throw new IllegalArgumentException(a + " needs a value, got the option " + v);
      }
      try {
        set.accept(s, v);
      } catch (NumberFormatException e) {
        throw new IllegalArgumentException(a + (v.matches("[-+]?[0-9]+") ? " is out of range: " + v
            : " needs a number, got '" + v + "'"));
      }
      if (a.equals("--output")) {
        out = Path.of(v);
      }
    }
    if (out == null) {
      throw new IllegalArgumentException("--output DIR is required");
    }
    generate(s, out);
    System.out.println("wrote " + out + ": " + LlamaConfig.read(out));
  }

  /** Each option that takes a value, and how it sets it: the one list of them. */
  private static final java.util.Map<String, java.util.function.BiConsumer<Spec, String>> VALUE_OPTIONS =
      java.util.Map.ofEntries(
      java.util.Map.entry("--output", (s, v) -> { }), // run() keeps it
      java.util.Map.entry("--layers", (s, v) -> s.layers = Integer.parseInt(v)),
      java.util.Map.entry("--hidden", (s, v) -> s.hidden = Integer.parseInt(v)),
      java.util.Map.entry("--heads", (s, v) -> s.heads = Integer.parseInt(v)),
      java.util.Map.entry("--kv-heads", (s, v) -> s.kvHeads = Integer.parseInt(v)),
      java.util.Map.entry("--ffn", (s, v) -> s.ffn = Integer.parseInt(v)),
      java.util.Map.entry("--vocab", (s, v) -> s.vocab = Integer.parseInt(v)),
      java.util.Map.entry("--seed", (s, v) -> s.seed = Long.parseLong(v)),
      java.util.Map.entry("--dtype", (s, v) -> s.dtype = v.toUpperCase(Locale.ROOT)),
      java.util.Map.entry("--model-type", (s, v) -> s.modelType = v),
      java.util.Map.entry("--sliding-window", (s, v) -> {
        s.slidingWindow = Long.parseLong(v);
        if (s.slidingWindow < 1) { // 0 was taken as "none", which leaving the option out says
          throw new IllegalArgumentException("--sliding-window must be >= 1 (leave it out for none), got " + v);
        }
      }),
      java.util.Map.entry("--rope-theta", (s, v) -> s.ropeTheta = Double.parseDouble(v)),
      java.util.Map.entry("--rope-scaling", (s, v) -> s.ropeScaling = v),
      java.util.Map.entry("--shards", (s, v) -> s.shards = Integer.parseInt(v)),
      java.util.Map.entry("--init-std", (s, v) -> s.initStd = Double.parseDouble(v)));

  /**
   * Writes the checkpoint as {@code dir}, which must not exist or be an empty directory (we never
   * write into a directory we did not make and that holds something). The files are written into a
   * hidden sibling {@code .NAME-tmp-UUID}, renamed to {@code dir} once complete (into an existing
   * empty {@code dir} the files are moved one by one): a failed or interrupted run leaves nothing (a
   * killed one, SIGKILL, that hidden directory), never a partial checkpoint under a new name asked for.
   */
  public static void generate(Spec s, Path dir) throws IOException {
    if (Files.exists(dir)) {
      if (!Files.isDirectory(dir)) {
        throw new IllegalArgumentException(dir + " exists and is not a directory");
      }
      try (var list = Files.list(dir)) {
        if (list.findAny().isPresent()) {
          throw new IllegalArgumentException(dir + " exists and is not empty: refusing to write into it");
        }
      }
    }
    if (!s.dtype.equals("BF16") && !s.dtype.equals("F16") && !s.dtype.equals("F32")) {
      throw new IllegalArgumentException("--dtype must be bf16, f16 or f32, got " + s.dtype.toLowerCase(Locale.ROOT));
    }
    if (s.shards < 1) {
      throw new IllegalArgumentException("--shards must be >= 1, got " + s.shards);
    }
    if (s.slidingWindow < 0) {
      throw new IllegalArgumentException("--sliding-window must be >= 1 (leave it out for none), got " + s.slidingWindow);
    }
    if (s.ffn < 0) {
      throw new IllegalArgumentException("--ffn must be >= 0 (0: the default), got " + s.ffn);
    }
    if (!(s.initStd >= 0) || Double.isInfinite(s.initStd)) { // NaN too
      throw new IllegalArgumentException("--init-std must be a finite number >= 0 (0: the default), got " + s.initStd);
    }
    Tokenizer tok = Tokenizer.train(s.vocab, SAMPLE_TEXT);
    String configJson = configJson(s);
    LlamaConfig cfg;
    try {
      cfg = LlamaConfig.parse(configJson, "generated config.json"); // the config must be one we read
    } catch (IllegalArgumentException e) { // it names config.json's fields: say which options set them
      List<String> options = new ArrayList<>();
      for (String[] fo : new String[][] {{"num_hidden_layers", "--layers"}, {"hidden_size", "--hidden"},
          {"num_attention_heads", "--heads"}, {"num_key_value_heads", "--kv-heads"}, {"intermediate_size", "--ffn"},
          {"vocab_size", "--vocab"}, {"rope_theta", "--rope-theta"}, {"rope_scaling", "--rope-scaling"},
          {"sliding_window", "--sliding-window"}, {"model_type", "--model-type"}}) {
        if (e.getMessage() != null && e.getMessage().contains(fo[0])) {
          options.add(fo[1] + " (" + fo[0] + ")");
        }
      }
      throw options.isEmpty() ? e : new IllegalArgumentException(String.join(", ", options) + ": " + e.getMessage(), e);
    }
    Path parent = dir.toAbsolutePath().normalize().getParent();
    if (parent == null) {
      throw new IllegalArgumentException(dir + " is a file system root: give a directory to create");
    }
    Files.createDirectories(parent);
    Path staging = parent.resolve("." + dir.getFileName() + "-tmp-" + UUID.randomUUID());
    // deleted on failure, and by a shutdown hook on Ctrl-C or SIGTERM (an interrupted run left a partial
    // checkpoint of 1.2 GB there); renamed away on success, so nothing is left to delete then
    try (MadeFolders.Temporary ignored = new MadeFolders.Temporary(staging, false)) {
      Files.createDirectory(staging);
      writeFiles(s, staging, configJson, tok, cfg);
      if (Files.isDirectory(dir)) { // the user's empty directory (a mount point, say): kept, the files moved in
        try (var files = Files.list(staging)) {
          for (Path f : files.toList()) {
            Files.move(f, dir.resolve(f.getFileName().toString())); // fails, rather than replaces, a file there
          }
        }
        Files.delete(staging);
      } else {
        Files.move(staging, dir); // fails, rather than replaces, should dir have appeared meanwhile
      }
    }
  }

  private static void writeFiles(Spec s, Path dir, String configJson, Tokenizer tok, LlamaConfig cfg)
      throws IOException {
    Files.writeString(dir.resolve("config.json"), configJson, StandardCharsets.UTF_8);
    Files.writeString(dir.resolve("tokenizer.json"), tok.toJson(), StandardCharsets.UTF_8);
    Map<String, Safetensors.Tensor> tensors = weights(s, cfg);
    if (s.shards > tensors.size()) { // a shard without a tensor is a file no loader needs
      throw new IllegalArgumentException("--shards " + s.shards + " is more than the model's " + tensors.size()
          + " tensors");
    }
    if (s.shards == 1) {
      Safetensors.write(dir.resolve("model.safetensors"), tensors);
      return;
    }
    List<Map<String, Safetensors.Tensor>> parts = new ArrayList<>();
    for (int i = 0; i < s.shards; i++) {
      parts.add(new LinkedHashMap<>());
    }
    JsonObject weightMap = new JsonObject();
    long total = 0;
    int i = 0;
    for (Map.Entry<String, Safetensors.Tensor> e : tensors.entrySet()) {
      int shard = i++ % s.shards;
      parts.get(shard).put(e.getKey(), e.getValue());
      weightMap.addProperty(e.getKey(), shardName(shard, s.shards));
      total += (long) e.getValue().values().length * Safetensors.elementSize(e.getValue().dtype());
    }
    for (int k = 0; k < s.shards; k++) {
      Safetensors.write(dir.resolve(shardName(k, s.shards)), parts.get(k));
    }
    JsonObject index = new JsonObject();
    JsonObject meta = new JsonObject();
    meta.addProperty("total_size", total);
    index.add("metadata", meta);
    index.add("weight_map", weightMap);
    Files.writeString(dir.resolve("model.safetensors.index.json"),
        new GsonBuilder().setPrettyPrinting().create().toJson(index), StandardCharsets.UTF_8);
  }

  private static String shardName(int k, int n) {
    return String.format(Locale.ROOT, "model-%05d-of-%05d.safetensors", k + 1, n);
  }

  static String configJson(Spec s) {
    JsonObject c = new JsonObject();
    String arch = switch (s.modelType) {
      case "llama" -> "LlamaForCausalLM";
      case "mistral" -> "MistralForCausalLM";
      case "qwen2" -> "Qwen2ForCausalLM";
      default -> throw new IllegalArgumentException("--model-type must be llama, mistral or qwen2, got " + s.modelType);
    };
    JsonArray archs = new JsonArray();
    archs.add(arch);
    c.add("architectures", archs);
    c.addProperty("model_type", s.modelType);
    c.addProperty("hidden_size", s.hidden);
    c.addProperty("intermediate_size", s.ffnSize());
    c.addProperty("num_hidden_layers", s.layers);
    c.addProperty("num_attention_heads", s.heads);
    c.addProperty("num_key_value_heads", s.kvHeads);
    c.addProperty("vocab_size", s.vocab);
    c.addProperty("hidden_act", "silu");
    c.addProperty("rms_norm_eps", 1e-5);
    c.addProperty("rope_theta", s.ropeTheta);
    c.addProperty("max_position_embeddings", 131072);
    c.addProperty("tie_word_embeddings", s.tie);
    c.addProperty("bos_token_id", Tokenizer.BOS);
    c.addProperty("eos_token_id", Tokenizer.EOS);
    c.addProperty("torch_dtype", switch (s.dtype) {
      case "BF16" -> "bfloat16";
      case "F16" -> "float16";
      default -> "float32";
    });
    if (s.modelType.equals("mistral")) {
      if (s.slidingWindow > 0) {
        c.addProperty("sliding_window", s.slidingWindow);
      } else {
        c.add("sliding_window", com.google.gson.JsonNull.INSTANCE);
      }
    } else if (s.slidingWindow > 0) {
      throw new IllegalArgumentException("--sliding-window is for --model-type mistral");
    }
    String rs = s.ropeScaling;
    if (!rs.equals("none")) {
      String[] p = rs.split(":");
      if (p.length != 2) {
        throw new IllegalArgumentException("--rope-scaling must be none, linear:F or llama3:F, got " + rs);
      }
      JsonObject r = new JsonObject();
      r.addProperty("rope_type", p[0]);
      try {
        r.addProperty("factor", Double.parseDouble(p[1]));
      } catch (NumberFormatException e) {
        throw new IllegalArgumentException("--rope-scaling " + rs + ": the factor after ':' must be a number, got '"
            + p[1] + "'");
      }
      if (p[0].equals("llama3")) {
        r.addProperty("low_freq_factor", 1.0);
        r.addProperty("high_freq_factor", 4.0);
        r.addProperty("original_max_position_embeddings", 64);
      } else if (!p[0].equals("linear")) {
        throw new IllegalArgumentException("--rope-scaling type must be linear or llama3, got " + p[0]);
      }
      c.add("rope_scaling", r);
    }
    // serializeNulls: Mistral's "sliding_window": null (no window) must be written, not dropped; an
    // absent field is Hugging Face's default window of 4096.
    return new GsonBuilder().serializeNulls().setPrettyPrinting().create().toJson(c);
  }

  /** Seeded weights in the config's tensor order; norms near 1 so that they matter, not exactly 1. */
  static Map<String, Safetensors.Tensor> weights(Spec s, LlamaConfig cfg) {
    SplittableRandom rnd = new SplittableRandom(s.seed);
    double std = s.std();
    Map<String, Safetensors.Tensor> out = new LinkedHashMap<>();
    for (Map.Entry<String, long[]> e : cfg.expectedTensors().entrySet()) {
      long n = 1;
      for (long d : e.getValue()) {
        n *= d;
      }
      float[] v = new float[Math.toIntExact(n)];
      boolean norm = e.getKey().endsWith("norm.weight");
      for (int i = 0; i < v.length; i++) {
        v[i] = (float) (norm ? 1 + 0.2 * gaussian(rnd) : std * gaussian(rnd));
      }
      out.put(e.getKey(), new Safetensors.Tensor(s.dtype, e.getValue(), v));
    }
    return out;
  }

  /** Box-Muller on SplittableRandom: the same seed gives the same numbers on every JVM. */
  private static double gaussian(SplittableRandom r) {
    double u = r.nextDouble(), v = r.nextDouble();
    return StrictMath.sqrt(-2 * StrictMath.log1p(-u)) * StrictMath.cos(2 * Math.PI * v);
  }

  /**
   * A byte-level BPE tokenizer in the Hugging Face {@code tokenizer.json} format: ids 0..2 are
   * {@code <unk> <s> </s>}, 3..258 the 256 bytes (GPT-2's byte-to-character map), then merges learned
   * greedily (most frequent pair, ties by the pair's text) from a text until the vocabulary size.
   * The post-processor prepends {@code <s>}, as Llama's tokenizers do.
   */
  public static final class Tokenizer {
    public static final int UNK = 0;
    public static final int BOS = 1;
    public static final int EOS = 2;
    static final String[] SPECIALS = {"<unk>", "<s>", "</s>"};
    // GPT-2's pre-tokenizer regex, which the ByteLevel pre-tokenizer applies.
    private static final Pattern SPLIT = Pattern.compile(
        "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)|\\s+");

    final List<String> vocab = new ArrayList<>();
    final List<String[]> merges = new ArrayList<>();

    /** Learns merges from {@code text} until the vocabulary has {@code size} entries. */
    public static Tokenizer train(int size, String text) {
      int base = SPECIALS.length + 256;
      if (size < base) {
        throw new IllegalArgumentException("--vocab must be >= " + base + " (3 special tokens + 256 bytes), got " + size);
      }
      Tokenizer t = new Tokenizer();
      t.vocab.addAll(List.of(SPECIALS));
      char[] byteChar = byteToChar();
      for (int b = 0; b < 256; b++) {
        t.vocab.add(String.valueOf(byteChar[b]));
      }
      Map<List<String>, Integer> words = new HashMap<>();
      Matcher m = SPLIT.matcher(text);
      while (m.find()) {
        byte[] bytes = m.group().getBytes(StandardCharsets.UTF_8);
        List<String> w = new ArrayList<>();
        for (byte b : bytes) {
          w.add(String.valueOf(byteChar[b & 0xFF]));
        }
        words.merge(w, 1, Integer::sum);
      }
      java.util.Set<String> known = new java.util.HashSet<>(t.vocab);
      while (t.vocab.size() < size) {
        TreeMap<String, int[]> counts = new TreeMap<>(); // sorted: ties broken by the pair's text
        for (Map.Entry<List<String>, Integer> e : words.entrySet()) {
          List<String> w = e.getKey();
          for (int i = 0; i + 1 < w.size(); i++) {
            counts.computeIfAbsent(w.get(i) + " " + w.get(i + 1), k -> new int[1])[0] += e.getValue();
          }
        }
        String best = null;
        int bestCount = 0;
        for (Map.Entry<String, int[]> e : counts.entrySet()) {
          String merged = e.getKey().replace(" ", "");
          if (e.getValue()[0] > bestCount && !known.contains(merged)) {
            best = e.getKey();
            bestCount = e.getValue()[0];
          }
        }
        if (best == null) {
          // The text has no new pair left: fill with unused byte pairs so the size is still exact. Such a
          // pair never occurs in the words (its merge would be known), so the words no longer change and
          // the rest is filled in one pass (the same merges as one at a time, without a rescan each).
          fill(t, known, byteChar, size);
          break;
        }
        String[] pair = best.split(" ");
        String merged = pair[0] + pair[1];
        t.merges.add(pair);
        t.vocab.add(merged);
        known.add(merged);
        Map<List<String>, Integer> next = new HashMap<>();
        for (Map.Entry<List<String>, Integer> e : words.entrySet()) {
          List<String> w = e.getKey(), r = new ArrayList<>();
          for (int i = 0; i < w.size(); i++) {
            if (i + 1 < w.size() && w.get(i).equals(pair[0]) && w.get(i + 1).equals(pair[1])) {
              r.add(merged);
              i++;
            } else {
              r.add(w.get(i));
            }
          }
          next.merge(r, e.getValue(), Integer::sum);
        }
        words = next;
      }
      return t;
    }

    /**
     * Adds unused merges until the vocabulary has {@code size} entries: each token in vocabulary order
     * (the bytes first, so byte pairs come first) followed by each byte. Every merge joins two tokens
     * already in the vocabulary, and each round makes new tokens to extend, so any size is reached
     * (Llama-3's 128,256 takes byte triples).
     */
    private static void fill(Tokenizer t, java.util.Set<String> known, char[] byteChar, int size) {
      for (int i = SPECIALS.length; t.vocab.size() < size; i++) {
        String x = t.vocab.get(i);
        for (int b = 0; b < 256 && t.vocab.size() < size; b++) {
          String y = String.valueOf(byteChar[b]);
          if (!known.contains(x + y)) {
            t.merges.add(new String[] {x, y});
            t.vocab.add(x + y);
            known.add(x + y);
          }
        }
      }
    }

    /** GPT-2's reversible byte-to-character map (printable bytes map to themselves). */
    static char[] byteToChar() {
      char[] c = new char[256];
      boolean[] direct = new boolean[256];
      for (int b = 0; b < 256; b++) {
        direct[b] = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
      }
      int next = 256;
      for (int b = 0; b < 256; b++) {
        c[b] = direct[b] ? (char) b : (char) next++;
      }
      return c;
    }

    public String toJson() {
      JsonObject root = new JsonObject();
      root.addProperty("version", "1.0");
      root.add("truncation", com.google.gson.JsonNull.INSTANCE);
      root.add("padding", com.google.gson.JsonNull.INSTANCE);
      JsonArray added = new JsonArray();
      for (int i = 0; i < SPECIALS.length; i++) {
        JsonObject a = new JsonObject();
        a.addProperty("id", i);
        a.addProperty("content", SPECIALS[i]);
        a.addProperty("single_word", false);
        a.addProperty("lstrip", false);
        a.addProperty("rstrip", false);
        a.addProperty("normalized", false);
        a.addProperty("special", true);
        added.add(a);
      }
      root.add("added_tokens", added);
      root.add("normalizer", com.google.gson.JsonNull.INSTANCE);
      root.add("pre_tokenizer", byteLevel());
      JsonObject post = new JsonObject();
      post.addProperty("type", "TemplateProcessing");
      post.add("single", template("A"));
      JsonArray pair = template("A");
      pair.addAll(template("B"));
      post.add("pair", pair);
      JsonObject specials = new JsonObject();
      JsonObject bos = new JsonObject();
      bos.addProperty("id", SPECIALS[BOS]);
      JsonArray ids = new JsonArray();
      ids.add(BOS);
      bos.add("ids", ids);
      JsonArray toks = new JsonArray();
      toks.add(SPECIALS[BOS]);
      bos.add("tokens", toks);
      specials.add(SPECIALS[BOS], bos);
      post.add("special_tokens", specials);
      root.add("post_processor", post);
      root.add("decoder", byteLevel());
      JsonObject model = new JsonObject();
      model.addProperty("type", "BPE");
      model.add("dropout", com.google.gson.JsonNull.INSTANCE);
      model.add("unk_token", com.google.gson.JsonNull.INSTANCE);
      model.add("continuing_subword_prefix", com.google.gson.JsonNull.INSTANCE);
      model.add("end_of_word_suffix", com.google.gson.JsonNull.INSTANCE);
      model.addProperty("fuse_unk", false);
      model.addProperty("byte_fallback", false);
      JsonObject v = new JsonObject();
      for (int i = 0; i < vocab.size(); i++) {
        v.addProperty(vocab.get(i), i);
      }
      model.add("vocab", v);
      JsonArray mg = new JsonArray();
      for (String[] p : merges) {
        mg.add(p[0] + " " + p[1]);
      }
      model.add("merges", mg);
      root.add("model", model);
      return new GsonBuilder().disableHtmlEscaping().setPrettyPrinting().create().toJson(root);
    }

    private static JsonObject byteLevel() {
      JsonObject o = new JsonObject();
      o.addProperty("type", "ByteLevel");
      o.addProperty("add_prefix_space", false);
      o.addProperty("trim_offsets", true);
      o.addProperty("use_regex", true);
      return o;
    }

    private static JsonArray template(String seq) {
      JsonArray a = new JsonArray();
      JsonObject st = new JsonObject();
      JsonObject sti = new JsonObject();
      sti.addProperty("id", SPECIALS[BOS]);
      sti.addProperty("type_id", 0);
      st.add("SpecialToken", sti);
      a.add(st);
      JsonObject sq = new JsonObject();
      JsonObject sqi = new JsonObject();
      sqi.addProperty("id", seq);
      sqi.addProperty("type_id", 0);
      sq.add("Sequence", sqi);
      a.add(sq);
      return a;
    }
  }

  /** The text the tokenizer's merges are learned from (our own words, about this project). */
  static final String SAMPLE_TEXT = String.join(" ",
      "Exact attention over documents longer than any one machine holds is the work of this project.",
      "A document is cut into chunks; each chunk of queries attends to the keys of the chunks before it,",
      "and the partial results are merged with the log-sum-exp rule, which is associative and commutative.",
      "The merged result does not depend on how the work was chunked, beyond rounding, and with a fixed",
      "order of merging it is the same bit for bit on every run. The state of attention for one query row",
      "is the normalized output and the log of the sum of the exponentials of the scores. An empty set of",
      "keys has output zero and log-sum-exp minus infinity, which is the identity of the merge.",
      "The model reads the text token by token; the probability of each token given the ones before it is",
      "the exponential of its logit minus the log-sum-exp over the whole vocabulary. The perplexity of a",
      "document is the exponential of minus the mean log-probability, and bits per byte divide the total",
      "by the natural log of two and the number of bytes of the text. Long documents, books, reports and",
      "source code files are what the users of this library score, on one machine or on many at once.",
      "Positions are absolute token indices within the document, counted from zero; the rotary embedding",
      "turns each pair of the head's halves by an angle that grows with the position and shrinks with the",
      "frequency index. The window of a sliding attention lets a query see only the most recent keys.");
}
