package io.longctx.djl;

import ai.djl.ndarray.NDArray;
import ai.djl.ndarray.NDList;
import ai.djl.ndarray.NDManager;
import ai.djl.ndarray.types.DataType;
import ai.djl.ndarray.types.Shape;
import ai.djl.nn.AbstractBlock;
import ai.djl.nn.Activation;
import ai.djl.training.ParameterStore;
import ai.djl.util.PairList;
import io.longctx.kernels.AttentionBackend;
import io.longctx.kernels.AttentionBackends;
import io.longctx.kernels.AttentionOptions;
import io.longctx.kernels.AttentionState;
import io.longctx.kernels.CpuAttention;
import io.longctx.kernels.NonFiniteScoreException;
import io.longctx.kernels.QkMayOverflowException;
import io.longctx.kernels.Tensor;
import java.io.IOException;
import java.nio.file.Path;
import java.util.ArrayList;
import java.util.Arrays;
import java.util.List;
import java.util.Map;
import java.util.Objects;

/**
 * A Llama-family decoder (Llama, Mistral, Qwen2 as Hugging Face defines them; docs/CONVENTIONS.md)
 * that scores documents: the log-probability of every token given the ones before it.
 *
 * <p>The document runs chunk by chunk through the layers. Each layer keeps its KV cache as a list
 * of chunks (float32, held once in the kernels' layout); a chunk's queries attend each cached chunk
 * and their own chunk with absolute positions, causal (plus Mistral's window: chunks that fell out
 * of it are dropped), one attention state per group of consecutive chunks (one kernel call each,
 * up to {@link #KV_GROUP_FLOATS}), merged in chunk order with the one LSE merge
 * ({@link AttentionState#mergeAll}). No T x T matrix exists. The log-sum-exp over the vocabulary
 * is computed per vocabulary shard and merged with the same LSE arithmetic, so no logits row wider
 * than a shard exists either. Memory: O(T x layers x kvHeads x headDim) for the cache, O(chunk x
 * max(shard, ffn)) for the rest. Projections, norms and the MLP are libtorch matmuls (float32)
 * through DJL; attention runs on the longctx backend ({@link AttentionBackends}: {@code -Dlongctx.backend},
 * default auto: CUDA where usable, else the CPU kernels).
 *
 * <p>As a DJL {@link ai.djl.nn.Block}: input {@code (tokens [T] int32/int64)}, output
 * {@code (logprobs [T-1] float32, sumLogprob [1] float64)}; the chunk length comes from the forward param
 * {@link #CHUNK_LEN} (default: the constructor's, {@link #DEFAULT_CHUNK_LEN} unless given). Inference only. Weights are plain
 * NDArrays loaded from the checkpoint ({@link #load}), not trainable DJL Parameters.
 *
 * <p>Thread-safe for concurrent {@link #score} calls once loaded.
 */
public final class LlamaModel extends AbstractBlock implements AutoCloseable {

  /** Forward param key: chunk length (Integer). */
  public static final String CHUNK_LEN = "longctx.chunkLen";
  public static final int DEFAULT_CHUNK_LEN = 512;
  public static final int DEFAULT_VOCAB_SHARD = 8192;
  /**
   * Floats of keys and values (both together) one attention call of {@link #layer} reads at most,
   * 32 MiB: whole chunks are grouped up to this (at least one). Measured, docs/BENCHMARKS.md.
   */
  static final long KV_GROUP_FLOATS = 1L << 23;
  /**
   * System property replacing {@link #KV_GROUP_FLOATS} for models made after it is set (a positive
   * count of floats). Group sizes move the sums by float32 rounding only; every JVM that scores one
   * document's chunks must use the same value for the one-task and split paths to agree bit for bit.
   */
  public static final String KV_GROUP_FLOATS_PROPERTY = "longctx.ppl.kvGroupFloats";

  private static final byte VERSION = 1;

  private volatile Loaded w;
  private final int vocabShard;
  /** {@link #KV_GROUP_FLOATS} or {@link #KV_GROUP_FLOATS_PROPERTY}; tests set it lower to make groups of a few chunks. */
  long kvGroupFloats = kvGroupFloatsSetting();
  private final AttentionBackend explicitBackend;
  private volatile AttentionBackend backend;
  private final int blockChunkLen;

  /** An empty model, to be filled by {@link #loadCheckpoint} (the DJL {@code Criteria} route). */
  public LlamaModel() {
    this(DEFAULT_VOCAB_SHARD, null);
  }

  /**
   * An empty model whose Block forward uses this chunk length when the forward params name none
   * (a {@code Predictor} passes no params).
   */
  public LlamaModel(int chunkLen) {
    this(DEFAULT_VOCAB_SHARD, null, chunkLen);
  }

  /**
   * @param vocabShard rows of the LM head per logits block (the widest logits row that exists)
   * @param backend the attention backend, or null for the selector's ({@link AttentionBackends#choice()})
   */
  public LlamaModel(int vocabShard, AttentionBackend backend) {
    this(vocabShard, backend, DEFAULT_CHUNK_LEN);
  }

  private LlamaModel(int vocabShard, AttentionBackend backend, int chunkLen) {
    super(VERSION);
    if (chunkLen < 1) {
      throw new IllegalArgumentException("chunkLen must be >= 1, got " + chunkLen);
    }
    this.blockChunkLen = chunkLen;
    if (vocabShard < 1) {
      throw new IllegalArgumentException("vocabShard must be >= 1, got " + vocabShard);
    }
    this.vocabShard = vocabShard;
    this.explicitBackend = backend;
  }

  static long kvGroupFloatsSetting() {
    String v = System.getProperty(KV_GROUP_FLOATS_PROPERTY);
    if (v == null) {
      return KV_GROUP_FLOATS;
    }
    try {
      long n = Long.parseLong(v.trim());
      if (n >= 1) {
        return n;
      }
    } catch (NumberFormatException e) {
      // named below
    }
    throw new IllegalArgumentException("-D" + KV_GROUP_FLOATS_PROPERTY + " must be a positive number of floats, got '" + v + "'");
  }

  /** Loads a checkpoint directory (config.json, model.safetensors or shards) onto a sub-manager of {@code manager}. */
  public static LlamaModel load(Path dir, NDManager manager) throws IOException {
    LlamaModel m = new LlamaModel();
    m.loadCheckpoint(dir, manager);
    return m;
  }

  /** {@link #load} with a chosen vocabulary shard size. */
  public static LlamaModel load(Path dir, NDManager manager, int vocabShard) throws IOException {
    LlamaModel m = new LlamaModel(vocabShard, null);
    m.loadCheckpoint(dir, manager);
    return m;
  }

  /**
   * Reads config.json and the weights (F32/F16/BF16 stored, float32 held), checking that the
   * checkpoint holds exactly the tensors the config needs, with their shapes.
   */
  public synchronized void loadCheckpoint(Path dir, NDManager manager) throws IOException {
    if (isLoaded()) {
      throw new IllegalStateException("model already loaded");
    }
    LlamaConfig cfg = LlamaConfig.read(dir);
    Map<String, Safetensors.Entry> entries = Safetensors.checkpointEntries(dir);
    Map<String, long[]> expected = cfg.requireTensors(entries, dir);
    LibtorchWarmup.ensure();
    backend = explicitBackend != null ? explicitBackend : AttentionBackends.select(AttentionBackends.choice());
    NDManager wm = manager.newSubManager();
    try {
      w = new Loaded(cfg, Safetensors.load(entries, expected.keySet(), wm), vocabShard, wm);
    } catch (IOException | RuntimeException | Error e) { // an OutOfMemoryError too: the weights are libtorch's
      wm.close();
      throw e;
    }
  }

  /** Whether a checkpoint is loaded (and its weights' manager still open: closing it from outside unloads). */
  public boolean isLoaded() {
    Loaded l = w;
    return l != null && l.manager.isOpen();
  }

  public LlamaConfig config() {
    return loaded().cfg;
  }

  /** Layer {@code l} of the loaded model, or an error naming the index and the layer count. */
  private static Layer layer(Loaded m, int l) {
    if (l < 0 || l >= m.layers.length) {
      throw new IllegalArgumentException("layer " + l + " does not exist: the model has " + m.layers.length + " layers");
    }
    return m.layers[l];
  }

  private Loaded loaded() {
    Loaded l = w;
    if (l == null) {
      throw new IllegalStateException("no checkpoint loaded (LlamaModel.load or loadCheckpoint)");
    }
    if (!l.manager.isOpen()) {
      throw new IllegalStateException("the checkpoint's weights were freed: the NDManager they were loaded onto "
          + "(LlamaModel.load's, or the DJL model's) was closed; load the checkpoint again");
    }
    return l;
  }

  @Override
  public void close() {
    Loaded l = w;
    w = null;
    if (l != null) {
      l.manager.close();
    }
  }

  /** Weights as NDArrays, with views prepared once. */
  private static final class Loaded {
    final LlamaConfig cfg;
    final NDManager manager;
    final NDArray embed;
    final Layer[] layers;
    final NDArray finalNorm;
    final NDArray head;
    final List<NDArray> headShardsT = new ArrayList<>();
    final double[] invFreq;
    final AttentionOptions attn;

    Loaded(LlamaConfig cfg, Map<String, NDArray> t, int shard, NDManager manager) {
      this.cfg = cfg;
      this.manager = manager;
      embed = t.get("model.embed_tokens.weight");
      layers = new Layer[cfg.layers];
      for (int l = 0; l < cfg.layers; l++) {
        String p = "model.layers." + l + ".";
        layers[l] = new Layer(t.get(p + "input_layernorm.weight"), t.get(p + "self_attn.q_proj.weight").transpose(),
            t.get(p + "self_attn.q_proj.bias"), t.get(p + "self_attn.k_proj.weight").transpose(),
            t.get(p + "self_attn.k_proj.bias"), t.get(p + "self_attn.v_proj.weight").transpose(),
            t.get(p + "self_attn.v_proj.bias"), t.get(p + "self_attn.o_proj.weight").transpose(),
            t.get(p + "self_attn.o_proj.bias"), t.get(p + "post_attention_layernorm.weight"),
            t.get(p + "mlp.gate_proj.weight").transpose(), t.get(p + "mlp.up_proj.weight").transpose(),
            t.get(p + "mlp.down_proj.weight").transpose());
      }
      finalNorm = t.get("model.norm.weight");
      head = cfg.tieWordEmbeddings ? embed : t.get("lm_head.weight");
      for (int s = 0; s < cfg.vocabSize; s += shard) {
        int e = Math.min(cfg.vocabSize, s + shard);
        headShardsT.add(head.get(s + ":" + e).transpose());
      }
      invFreq = cfg.inverseFrequencies();
      attn = cfg.attention();
    }
  }

  /** One layer's weights; projections held transposed ([in, out]) so y = x.matMul(wT). */
  private record Layer(NDArray inNorm, NDArray qT, NDArray qB, NDArray kT, NDArray kB, NDArray vT, NDArray vB,
      NDArray oT, NDArray oB, NDArray postNorm, NDArray gateT, NDArray upT, NDArray downT) {}

  /**
   * The model's numbers left float32 on a document: a hidden state, a key, a value, an attention
   * score or a logit is NaN or infinite (the weights take this input past float32's range). Named by
   * layer and absolute position; bad input, like a token outside the vocabulary.
   */
  public static final class NumericOverflowException extends IllegalArgumentException {
    private static final long serialVersionUID = 1L;

    NumericOverflowException(String message) {
      super(message);
    }
  }

  private static final String PAST_FLOAT32 = " (the weights take this document's values past float32)";

  /**
   * Throws naming the first non-finite value of x: rows of {@code width} values, {@code len} per
   * head (position start + row % len; the head row / len, named where x holds several).
   */
  private static void requireFinite(float[] x, int width, int len, long start, String what) {
    for (int i = 0; i < x.length; i++) {
      if (!Float.isFinite(x[i])) {
        int row = i / width;
        throw new NumericOverflowException(what + (x.length > (long) width * len ? " of kv head " + row / len : "")
            + " at position " + (start + row % len) + " is " + x[i] + PAST_FLOAT32);
      }
    }
  }

  /**
   * One chunk's keys and values at one layer, after rotary, in the kernels' [1, kvHeads, len, D]
   * layout, with the absolute position of its first token (positions are consecutive).
   */
  public record KeysValues(long start, Tensor k, Tensor v) {
    public int length() {
      return k.tokens();
    }

    long[] positions() {
      return LlamaModel.positions(start, length());
    }

    /** Consecutive chunks (each starting where the one before ends) as one. */
    static KeysValues concat(List<KeysValues> chunks) {
      if (chunks.size() == 1) {
        return chunks.get(0);
      }
      KeysValues first = chunks.get(0);
      int heads = first.k.heads(), dim = first.k.dim(), tokens = 0;
      for (KeysValues c : chunks) {
        if (c.start != first.start + tokens) {
          throw new IllegalArgumentException("chunks not consecutive: one at " + c.start + " after " + tokens
              + " tokens from " + first.start);
        }
        for (Tensor t : new Tensor[] {c.k, c.v}) { // each chunk alone went to the kernel, which checked this
          if (t.batch() != 1 || t.heads() != heads || t.dim() != dim || t.tokens() != c.length()) {
            throw new IllegalArgumentException("the chunk at " + c.start + " has keys or values of shape ["
                + t.batch() + ", " + t.heads() + ", " + t.tokens() + ", " + t.dim() + "], expected [1, " + heads + ", "
                + c.length() + ", " + dim + "]");
          }
        }
        tokens = Math.addExact(tokens, c.length());
      }
      float[] k = new float[Math.multiplyExact(heads, Math.multiplyExact(tokens, dim))];
      float[] v = new float[k.length];
      for (int h = 0, at = 0; h < heads; h++) {
        for (KeysValues c : chunks) {
          int n = c.length() * dim;
          System.arraycopy(c.k.data(), h * n, k, at, n);
          System.arraycopy(c.v.data(), h * n, v, at, n);
          at += n;
        }
      }
      return new KeysValues(first.start, new Tensor(k, 1, heads, tokens, dim), new Tensor(v, 1, heads, tokens, dim));
    }
  }

  /**
   * Scores a document given as token ids, exactly as given (no special tokens added).
   *
   * <p>The layer pieces below ({@link #embed}, {@link #keysValues}, {@link #layer},
   * {@link #logprobs}) are what this runs, chunk by chunk; the sequence-parallel Spark path runs the
   * same pieces on other machines, so a chunk's numbers do not depend on where it was computed.
   *
   * @param chunkLen tokens per chunk (any value >= 1 gives the same result up to float32 rounding)
   * @param perToken whether to return the n-1 per-token log-probabilities
   * @throws IllegalArgumentException for a token id outside [0, vocab_size), naming its position
   * @throws NumericOverflowException where the model's values leave float32 on this document
   * @throws java.util.concurrent.CancellationException where the calling thread is interrupted (also
   *     before the call); the model stays usable and gives the same bits afterwards
   */
  public DocumentScore score(int[] tokens, int chunkLen, boolean perToken) {
    return score(tokens, chunkLen, perToken, null);
  }

  /**
   * {@link #score(int[], int, boolean)}, calling {@code chunkDone} (where non-null) with the number of
   * positions scored after each chunk: progress for a caller that reports on a long document.
   */
  public DocumentScore score(int[] tokens, int chunkLen, boolean perToken, java.util.function.IntConsumer chunkDone) {
    Objects.requireNonNull(tokens, "tokens");
    if (chunkLen < 1) {
      throw new IllegalArgumentException("chunkLen must be >= 1, got " + chunkLen);
    }
    LlamaConfig c = loaded().cfg;
    checkTokens(tokens);
    int n = tokens.length;
    float[] lp = new float[Math.max(0, n - 1)];
    double sum = 0;
    // The last token's hidden state predicts nothing: positions 0..n-2 are all that run.
    int m1 = n - 1;
    List<List<KeysValues>> cache = new ArrayList<>(c.layers);
    for (int l = 0; l < c.layers; l++) {
      cache.add(new ArrayList<>());
    }
    for (int start = 0; start < m1; start += chunkLen) {
      final int s = start;
      int len = Math.min(chunkLen, m1 - s);
      float[] x = embed(Arrays.copyOfRange(tokens, s, s + len));
      for (int l = 0; l < c.layers; l++) {
        List<KeysValues> kv = cache.get(l);
        kv.add(keysValues(l, x, s, len));
        // Chunks no query of this chunk sees are invisible to every later chunk too (causal).
        kv.removeIf(e -> !sees(s, len, e.start(), e.length()));
        x = layer(l, x, s, len, kv.size(), kv.iterator());
      }
      double[] chunkLp = logprobs(x, s, Arrays.copyOfRange(tokens, s + 1, s + len + 1));
      for (int i = 0; i < len; i++) {
        lp[s + i] = (float) chunkLp[i];
        sum += chunkLp[i];
      }
      if (chunkDone != null) {
        chunkDone.accept(len);
      }
    }
    return new DocumentScore(n, sum, perToken ? lp : null);
  }

  /** Throws naming the first token id outside the vocabulary and its position. */
  public void checkTokens(int[] tokens) {
    int vocab = loaded().cfg.vocabSize;
    for (int i = 0; i < tokens.length; i++) {
      if (tokens[i] < 0 || tokens[i] >= vocab) {
        throw new IllegalArgumentException("token id " + tokens[i] + " at position " + i
            + " is outside the vocabulary [0, " + vocab + ")");
      }
    }
  }

  /** Whether some query of the block [qStart, qStart + qLen) sees some key of [kStart, kStart + kLen). */
  public boolean sees(long qStart, int qLen, long kStart, int kLen) {
    return loaded().attn.anyVisible(qStart, qStart + qLen - 1, kStart, kStart + kLen - 1);
  }

  /** The input embeddings of {@code tokens}: hidden rows [len, hidden], row-major. */
  public float[] embed(int[] tokens) {
    checkTokens(tokens); // libtorch would read id -1 as the last row
    Loaded m = loaded();
    try (NDManager cm = m.manager.newSubManager()) {
      long[] idx = new long[tokens.length];
      for (int i = 0; i < idx.length; i++) {
        idx[i] = tokens[i];
      }
      NDArray e = m.embed.get(cm.create(idx));
      e.attach(cm); // results belong to their first operand's manager: the weights'
      return e.toFloatArray();
    }
  }

  /** Layer {@code l}'s keys and values of the chunk at positions [start, start + len) with hidden rows x. */
  public KeysValues keysValues(int l, float[] x, long start, int len) {
    Loaded m = loaded();
    LlamaConfig c = m.cfg;
    Layer w = layer(m, l);
    try (NDManager cm = m.manager.newSubManager()) {
      NDArray h = rmsNorm(hidden(cm, c, x, len), w.inNorm(), c.rmsNormEps, start, "layer " + l + ": the input norm");
      NDArray[] rope = ropeTables(cm, m.invFreq, positions(start, len));
      NDArray k = rotate(linear(h, w.kT(), w.kB()).reshape(len, c.kvHeads, c.headDim), rope[0], rope[1]);
      NDArray v = linear(h, w.vT(), w.vB()).reshape(len, c.kvHeads, c.headDim);
      // [len, H, D] is BTHD with batch 1; the kernels read [1, H, T, D].
      Tensor kt = AttentionOp.toTensor(k.expandDims(0), AttentionOp.Layout.BTHD);
      Tensor vt = AttentionOp.toTensor(v.expandDims(0), AttentionOp.Layout.BTHD);
      requireFinite(kt.data(), c.headDim, len, start, "layer " + l + ": the key");
      requireFinite(vt.data(), c.headDim, len, start, "layer " + l + ": the value");
      return new KeysValues(start, kt, vt);
    }
  }

  /**
   * The rest of layer {@code l} for the chunk at [start, start + len) with hidden rows x: its queries
   * attend the {@code n} chunks of keys and values {@code visible} yields (in chunk order, its own
   * included, each taken only when needed), one attention state per group of consecutive chunks
   * ({@link #KV_GROUP_FLOATS}) merged with
   * {@link AttentionState#mergeAll(int, java.util.Iterator)}; then the output projection, the
   * residual, the MLP and its residual. Returns the chunk's hidden rows after the layer.
   */
  public float[] layer(int l, float[] x, long start, int len, int n, java.util.Iterator<KeysValues> visible) {
    Loaded m = loaded();
    LlamaConfig c = m.cfg;
    Layer w = layer(m, l);
    try (NDManager cm = m.manager.newSubManager()) {
      NDArray xa = hidden(cm, c, x, len);
      NDArray h = rmsNorm(xa, w.inNorm(), c.rmsNormEps, start, "layer " + l + ": the input norm");
      long[] pos = positions(start, len);
      NDArray[] rope = ropeTables(cm, m.invFreq, pos);
      NDArray q = rotate(linear(h, w.qT(), w.qB()).reshape(len, c.heads, c.headDim), rope[0], rope[1]);
      Tensor qt = AttentionOp.toTensor(q.expandDims(0), AttentionOp.Layout.BTHD);
      if (n < 1) {
        throw new IllegalArgumentException("layer " + l + ", chunk at " + start + ": n must be >= 1, got " + n);
      }
      // Consecutive chunks go to the kernel together, up to KV_GROUP_FLOATS of keys and values per
      // call: one call per chunk paid the call's fixed work and a merge per chunk, 1.4x the
      // attention's time at Llama-3-8B's heads and 1.7x and more at small ones (docs/BENCHMARKS.md,
      // "ppl: the LM head's arrays, attention by groups of chunks"). The groups follow from n, len and
      // the first chunk's length alone (the longer of the two sizes them: every visible chunk but this
      // one has the first one's length), so the one-task and the split path, which give this method
      // the same chunks, group them (and round) alike.
      KeysValues first = nextChunk(visible, l, start, n);
      int perCall = (int) Math.max(1, Math.min(n,
          kvGroupFloats / ((long) Math.max(1, Math.max(first.length(), len)) * c.kvHeads * c.headDim * 2)));
      java.util.Iterator<AttentionState> states = new java.util.Iterator<>() {
        int taken;

        @Override
        public boolean hasNext() {
          return taken < n;
        }

        @Override
        public AttentionState next() {
          List<KeysValues> group = new ArrayList<>();
          for (int i = 0, count = Math.min(perCall, n - taken); i < count; i++) {
            group.add(taken == 0 && i == 0 ? first : nextChunk(visible, l, start, n));
          }
          taken += group.size();
          KeysValues kv = KeysValues.concat(group);
          // Few query rows: split-K also splits the keys, as AttentionOp's Java path does.
          return len <= AttentionOp.SPLIT_K_MAX_QUERY_ROWS
              ? backend.decode(qt, kv.k(), kv.v(), pos, kv.positions(), m.attn, CpuAttention.DEFAULT_SPLIT_LEN).state()
              : backend.forward(qt, kv.k(), kv.v(), pos, kv.positions(), m.attn);
        }
      };
      AttentionState st;
      try {
        st = AttentionState.mergeAll((n - 1) / perCall + 1, states);
      } catch (NonFiniteScoreException e) { // a q.k past float32 (k was checked when computed)
        throw new NumericOverflowException("layer " + l + ": the attention score of head " + e.head + " at position "
            + e.queryPos + " against the key at position " + e.keyPos + " is " + e.score + PAST_FLOAT32);
      } catch (QkMayOverflowException e) { // the CUDA backend's bound over a whole call: no single score to name
        throw new NumericOverflowException("layer " + l + ": the queries at positions " + start + ".." + (start + len - 1)
            + " and the keys they see could give a q.k past float32 (" + e.getMessage() + ")" + PAST_FLOAT32);
      }
      if (visible.hasNext()) { // a chunk left out would change the answer without a word
        throw new IllegalArgumentException("layer " + l + ", chunk at " + start + ": more than n = " + n
            + " chunks of keys and values given");
      }
      NDArray o = cm.create(st.o(), new Shape(len, (long) c.heads * c.headDim));
      xa = xa.add(linear(o, w.oT(), w.oB()));
      NDArray g = rmsNorm(xa, w.postNorm(), c.rmsNormEps, start, "layer " + l + ": the post-attention norm");
      NDArray gate = g.matMul(w.gateT());
      NDArray act = gate.mul(Activation.sigmoid(gate)).mul(g.matMul(w.upT())); // silu(gate) * up
      float[] out = xa.add(act.matMul(w.downT())).toFloatArray();
      requireFinite(out, c.hiddenSize, len, start, "layer " + l + ": the hidden state");
      return out;
    }
  }

  /**
   * log p(targets[i]) of each hidden row after the last layer: the final norm, then the LM head by
   * vocabulary shards, the log-sum-exp over the shards merged with LSE arithmetic in float64. Row i
   * is the hidden state at position start + i (for messages).
   */
  public double[] logprobs(float[] x, long start, int[] targets) {
    checkTokens(targets);
    Loaded m = loaded();
    LlamaConfig c = m.cfg;
    int len = targets.length;
    try (NDManager cm = m.manager.newSubManager()) {
      NDArray hn = rmsNorm(hidden(cm, c, x, len), m.finalNorm, c.rmsNormEps, start, "the final norm");
      double[] lse = new double[len];
      Arrays.fill(lse, Double.NEGATIVE_INFINITY);
      for (NDArray shardT : m.headShardsT) {
        // The shard's log-sum-exp as max(z) - max(log_softmax(z)): log_softmax is one fused pass that
        // writes z - max - log(sum exp(z - max)), whose largest entry (at z's argmax) is exactly
        // -log(sum), so this is max + log(sum) rounded once, as z.sub(max).exp().sum().log() gave.
        // One [len, shard] array instead of three, each freed before the next shard: fresh pages for
        // the arrays cost up to half the head's time (docs/BENCHMARKS.md, "ppl: the LM head's arrays").
        try (NDArray z = hn.matMul(shardT); // [len, shard]
            NDArray max = z.max(new int[] {1});
            NDArray ls = z.logSoftmax(1);
            NDArray lsMax = ls.max(new int[] {1});
            NDArray partLse = max.sub(lsMax)) {
          float[] part = partLse.toFloatArray();
          for (int i = 0; i < len; i++) {
            lse[i] = lseMerge(lse[i], part[i]);
          }
        }
      }
      long[] tgt = new long[len];
      for (int i = 0; i < len; i++) {
        tgt[i] = targets[i];
      }
      NDArray targetRows = m.head.get(cm.create(tgt));
      targetRows.attach(cm);
      float[] target = hn.mul(targetRows).sum(new int[] {1}).toFloatArray();
      double[] out = new double[len];
      for (int i = 0; i < len; i++) {
        out[i] = (double) target[i] - lse[i];
        if (!Double.isFinite(out[i])) { // a logit past float32: NaN or infinite, never a score
          throw new NumericOverflowException("the log-probability of the token at position " + (start + i + 1)
              + " (id " + targets[i] + ") is " + out[i] + ": the logits leave float32 (its logit " + target[i]
              + ", log-sum-exp " + lse[i] + ")");
        }
      }
      return out;
    }
  }

  /** The next of the n chunks {@link #layer} was promised; fewer is the caller's mistake, named. */
  private static KeysValues nextChunk(java.util.Iterator<KeysValues> visible, int l, long start, int n) {
    if (!visible.hasNext()) {
      throw new IllegalArgumentException("layer " + l + ", chunk at " + start + ": fewer than n = " + n
          + " chunks of keys and values given");
    }
    return visible.next();
  }

  /** Hidden rows as a [len, hidden] array of the chunk's manager. */
  private static NDArray hidden(NDManager cm, LlamaConfig c, float[] x, int len) {
    if (x.length != (long) len * c.hiddenSize) {
      throw new IllegalArgumentException("hidden rows: " + x.length + " values, expected " + len + " x " + c.hiddenSize);
    }
    return cm.create(x, new Shape(len, c.hiddenSize));
  }

  static long[] positions(long start, int len) {
    long[] p = new long[len];
    for (int i = 0; i < len; i++) {
      p[i] = start + i;
    }
    return p;
  }

  /** log(exp(a) + exp(b)) in float64, with -inf as the identity. */
  static double lseMerge(double a, double b) {
    double mx = Math.max(a, b);
    if (mx == Double.NEGATIVE_INFINITY) {
      return mx;
    }
    return mx + Math.log(Math.exp(a - mx) + Math.exp(b - mx));
  }

  private static NDArray linear(NDArray x, NDArray wT, NDArray b) {
    NDArray y = x.matMul(wT);
    return b == null ? y : y.add(b);
  }

  /**
   * RMSNorm in float32: x / sqrt(mean(x^2) + eps) * w, rows at positions start, start + 1, ... A row
   * whose sum of squares passes float32 (3.4e38: values from about 1e19 up, fewer the wider the row) is
   * an error naming {@code what} and the position: the division would make the row 0, and the
   * document's score that of a model that knows nothing, silently.
   */
  private static NDArray rmsNorm(NDArray x, NDArray w, double eps, long start, String what) {
    NDArray var = x.square().mean(new int[] {1}, true);
    float[] ms = var.toFloatArray();
    for (int i = 0; i < ms.length; i++) {
      if (!Float.isFinite(ms[i])) {
        throw new NumericOverflowException(what + " at position " + (start + i) + ": the mean square of the hidden "
            + "state is " + ms[i] + PAST_FLOAT32);
      }
    }
    return x.div(var.add((float) eps).sqrt()).mul(w);
  }

  /** cos and sin of pos * invFreq, computed in float64 and rounded once, as [len, 1, D/2]. */
  private static NDArray[] ropeTables(NDManager cm, double[] invFreq, long[] pos) {
    int half = invFreq.length;
    float[] cos = new float[pos.length * half];
    float[] sin = new float[pos.length * half];
    for (int i = 0; i < pos.length; i++) {
      for (int j = 0; j < half; j++) {
        double a = pos[i] * invFreq[j];
        cos[i * half + j] = (float) Math.cos(a);
        sin[i * half + j] = (float) Math.sin(a);
      }
    }
    Shape s = new Shape(pos.length, 1, half);
    return new NDArray[] {cm.create(cos, s), cm.create(sin, s)};
  }

  /** x cos + rotate_half(x) sin on x [len, heads, D], with rotate_half(x) = [-x2, x1] on the halves. */
  private static NDArray rotate(NDArray x, NDArray cos, NDArray sin) {
    long half = x.getShape().get(2) / 2;
    NDArray x1 = x.get(":, :, 0:" + half);
    NDArray x2 = x.get(":, :, " + half + ":");
    return x1.mul(cos).sub(x2.mul(sin)).concat(x2.mul(cos).add(x1.mul(sin)), 2);
  }

  // ---------------------------------------------------------------------------------------------
  // DJL Block

  @Override
  protected NDList forwardInternal(ParameterStore ps, NDList inputs, boolean training,
      PairList<String, Object> params) {
    if (training) {
      throw new UnsupportedOperationException("LlamaModel is inference-only");
    }
    if (inputs.size() != 1 || inputs.head().getShape().dimension() != 1) {
      throw new IllegalArgumentException("expected one 1-d array of token ids, got " + inputs.size() + " input(s)"
          + (inputs.isEmpty() ? "" : " of shape " + java.util.Arrays.toString(inputs.getShapes())));
    }
    NDArray t = inputs.head();
    if (t.getDataType() != DataType.INT32 && t.getDataType() != DataType.INT64) {
      throw new IllegalArgumentException("token ids must be int32 or int64, got " + t.getDataType());
    }
    int[] tokens;
    if (t.getDataType() == DataType.INT32) {
      tokens = t.toIntArray();
    } else {
      long[] ids = t.toLongArray();
      tokens = new int[ids.length];
      for (int i = 0; i < ids.length; i++) {
        if (ids[i] != (int) ids[i]) {
          throw new IllegalArgumentException("token id " + ids[i] + " at position " + i + " is outside the vocabulary");
        }
        tokens[i] = (int) ids[i];
      }
    }
    int chunkLen = blockChunkLen;
    Object cl = params == null ? null : params.get(CHUNK_LEN);
    if (cl != null) {
      // An integer type (BigDecimal 2.5 passed the old test as 2: its longValue truncates too).
      if (!(cl instanceof Integer || cl instanceof Long || cl instanceof Short || cl instanceof Byte)
          || ((Number) cl).longValue() != ((Number) cl).intValue()) {
        throw new IllegalArgumentException(CHUNK_LEN + " must be an int, got " + cl + " (" + cl.getClass().getName() + ")");
      }
      chunkLen = ((Number) cl).intValue();
    }
    DocumentScore sc = score(tokens, chunkLen, true);
    NDManager out = t.getManager();
    // The sum travels as float64 so that callers get the same double as score() gives.
    return new NDList(out.create(sc.logprobs()), out.create(new double[] {sc.sumLogprob()}));
  }

  @Override
  public Shape[] getOutputShapes(Shape[] inputShapes) {
    if (inputShapes.length != 1 || inputShapes[0].dimension() != 1) {
      throw new IllegalArgumentException("LlamaModel takes one input, token ids of shape (T), got "
          + java.util.Arrays.toString(inputShapes));
    }
    long n = inputShapes[0].get(0);
    return new Shape[] {new Shape(Math.max(0, n - 1)), new Shape(1)};
  }

  @Override
  public void initializeChildBlocks(NDManager manager, DataType dataType, Shape... inputShapes) {
    // No child blocks: the weights come from the checkpoint.
  }

  @Override
  public String toString() {
    Loaded l = w;
    return "LlamaModel(" + (l == null ? "not loaded" : l.cfg.toString()) + ")";
  }
}
