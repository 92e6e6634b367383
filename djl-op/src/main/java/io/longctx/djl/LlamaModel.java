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
import io.longctx.kernels.Tensor;
import java.io.IOException;
import java.nio.ByteBuffer;
import java.nio.file.Path;
import java.util.ArrayList;
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
 * of it are dropped), one attention state per chunk, merged in chunk order with the one LSE merge
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

  private static final byte VERSION = 1;

  private volatile Loaded w;
  private final int vocabShard;
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
    if (w != null) {
      throw new IllegalStateException("model already loaded");
    }
    LlamaConfig cfg = LlamaConfig.read(dir);
    Map<String, Safetensors.Entry> entries = Safetensors.checkpointEntries(dir);
    Map<String, long[]> expected = cfg.expectedTensors();
    Safetensors.requireExactly(entries, expected, dir);
    backend = explicitBackend != null ? explicitBackend : AttentionBackends.select(AttentionBackends.choice());
    NDManager wm = manager.newSubManager();
    try {
      Map<String, NDArray> t = new java.util.HashMap<>();
      for (String name : expected.keySet()) {
        Safetensors.Entry e = entries.get(name);
        ByteBuffer b = Safetensors.readAsFloat32(e);
        t.put(name, wm.create(b, new Shape(e.shape()), DataType.FLOAT32));
      }
      w = new Loaded(cfg, t, vocabShard, wm);
    } catch (IOException | RuntimeException e) {
      wm.close();
      throw e;
    }
  }

  /** Whether a checkpoint is loaded. */
  public boolean isLoaded() {
    return w != null;
  }

  public LlamaConfig config() {
    return loaded().cfg;
  }

  private Loaded loaded() {
    Loaded l = w;
    if (l == null) {
      throw new IllegalStateException("no checkpoint loaded (LlamaModel.load or loadCheckpoint)");
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
      attn = AttentionOptions.DEFAULT.withCausal(true).withWindow(cfg.slidingWindow)
          .withScale(1.0 / Math.sqrt(cfg.headDim));
    }
  }

  /** One layer's weights; projections held transposed ([in, out]) so y = x.matMul(wT). */
  private record Layer(NDArray inNorm, NDArray qT, NDArray qB, NDArray kT, NDArray kB, NDArray vT, NDArray vB,
      NDArray oT, NDArray oB, NDArray postNorm, NDArray gateT, NDArray upT, NDArray downT) {}

  /** A layer's KV cache: chunks in the kernels' [1, Hkv, Tc, D] layout with their first positions. */
  private static final class KvCache {
    final List<Tensor> k = new ArrayList<>();
    final List<Tensor> v = new ArrayList<>();
    final List<long[]> pos = new ArrayList<>();
  }

  /**
   * Scores a document given as token ids, exactly as given (no special tokens added).
   *
   * @param chunkLen tokens per chunk (any value >= 1 gives the same result up to float32 rounding)
   * @param perToken whether to return the n-1 per-token log-probabilities
   * @throws IllegalArgumentException for a token id outside [0, vocab_size), naming its position
   */
  public DocumentScore score(int[] tokens, int chunkLen, boolean perToken) {
    Objects.requireNonNull(tokens, "tokens");
    if (chunkLen < 1) {
      throw new IllegalArgumentException("chunkLen must be >= 1, got " + chunkLen);
    }
    Loaded m = loaded();
    LlamaConfig c = m.cfg;
    for (int i = 0; i < tokens.length; i++) {
      if (tokens[i] < 0 || tokens[i] >= c.vocabSize) {
        throw new IllegalArgumentException("token id " + tokens[i] + " at position " + i + " is outside the vocabulary "
            + "[0, " + c.vocabSize + ")");
      }
    }
    int n = tokens.length;
    float[] lp = new float[Math.max(0, n - 1)];
    double sum = 0;
    // The last token's hidden state predicts nothing: positions 0..n-2 are all that run.
    int m1 = n - 1;
    KvCache[] cache = new KvCache[c.layers];
    for (int l = 0; l < c.layers; l++) {
      cache[l] = new KvCache();
    }
    for (int s = 0; s < m1; s += chunkLen) {
      int len = Math.min(chunkLen, m1 - s);
      try (NDManager cm = m.manager.newSubManager()) {
        double[] chunkLp = chunk(m, cm, tokens, s, len, cache);
        for (int i = 0; i < len; i++) {
          lp[s + i] = (float) chunkLp[i];
          sum += chunkLp[i];
        }
      }
    }
    return new DocumentScore(n, sum, perToken ? lp : null);
  }

  /** Runs positions [s, s + len) through the layers; returns log p(tokens[s+i+1]) for each. */
  private double[] chunk(Loaded m, NDManager cm, int[] tokens, int s, int len, KvCache[] cache) {
    LlamaConfig c = m.cfg;
    long[] idx = new long[len];
    long[] pos = new long[len];
    long[] tgt = new long[len];
    for (int i = 0; i < len; i++) {
      idx[i] = tokens[s + i];
      pos[i] = s + i;
      tgt[i] = tokens[s + i + 1];
    }
    NDArray x = m.embed.get(cm.create(idx)); // [len, E]
    x.attach(cm); // results belong to their first operand's manager: keep the chunk's arrays in cm
    NDArray[] rope = ropeTables(cm, m.invFreq, pos);
    for (int l = 0; l < c.layers; l++) {
      Layer w = m.layers[l];
      NDArray h = rmsNorm(x, w.inNorm(), c.rmsNormEps);
      NDArray q = linear(h, w.qT(), w.qB()).reshape(len, c.heads, c.headDim);
      NDArray k = linear(h, w.kT(), w.kB()).reshape(len, c.kvHeads, c.headDim);
      NDArray v = linear(h, w.vT(), w.vB()).reshape(len, c.kvHeads, c.headDim);
      q = rotate(q, rope[0], rope[1]);
      k = rotate(k, rope[0], rope[1]);
      NDArray o = attention(m, cm, q, k, v, pos, cache[l]); // [len, H*D]
      x = x.add(linear(o, w.oT(), w.oB()));
      NDArray g = rmsNorm(x, w.postNorm(), c.rmsNormEps);
      NDArray gate = g.matMul(w.gateT());
      NDArray act = gate.mul(Activation.sigmoid(gate)).mul(g.matMul(w.upT())); // silu(gate) * up
      x = x.add(act.matMul(w.downT()));
    }
    NDArray hn = rmsNorm(x, m.finalNorm, c.rmsNormEps);
    // log p(t) = z[t] - logsumexp(z): the logsumexp per vocabulary shard, merged with LSE arithmetic.
    double[] lse = new double[len];
    java.util.Arrays.fill(lse, Double.NEGATIVE_INFINITY);
    for (NDArray shardT : m.headShardsT) {
      NDArray z = hn.matMul(shardT); // [len, shard]
      NDArray max = z.max(new int[] {1}, true);
      float[] part = z.sub(max).exp().sum(new int[] {1}).log().add(max.squeeze(1)).toFloatArray();
      for (int i = 0; i < len; i++) {
        lse[i] = lseMerge(lse[i], part[i]);
      }
      z.close();
    }
    NDArray targetRows = m.head.get(cm.create(tgt));
    targetRows.attach(cm);
    float[] target = hn.mul(targetRows).sum(new int[] {1}).toFloatArray();
    double[] out = new double[len];
    for (int i = 0; i < len; i++) {
      out[i] = (double) target[i] - lse[i];
    }
    return out;
  }

  /** log(exp(a) + exp(b)) in float64, with -inf as the identity. */
  static double lseMerge(double a, double b) {
    double mx = Math.max(a, b);
    if (mx == Double.NEGATIVE_INFINITY) {
      return mx;
    }
    return mx + Math.log(Math.exp(a - mx) + Math.exp(b - mx));
  }

  /**
   * Attention of the chunk's queries over the cached chunks and its own keys (appended to the
   * cache first): one attention state per visible chunk from the backend, merged in chunk order.
   */
  private NDArray attention(Loaded m, NDManager cm, NDArray q, NDArray k, NDArray v, long[] pos, KvCache kv) {
    LlamaConfig c = m.cfg;
    int len = pos.length;
    // [len, H, D] is BTHD with batch 1; the kernels read [1, H, T, D].
    Tensor qt = AttentionOp.toTensor(q.expandDims(0), AttentionOp.Layout.BTHD);
    kv.k.add(AttentionOp.toTensor(k.expandDims(0), AttentionOp.Layout.BTHD));
    kv.v.add(AttentionOp.toTensor(v.expandDims(0), AttentionOp.Layout.BTHD));
    kv.pos.add(pos);
    long window = c.slidingWindow;
    if (window > 0) {
      // A chunk whose last key is at or before s - W is invisible to this query chunk and all later ones.
      long horizon = pos[0] - window;
      while (!kv.pos.isEmpty()) {
        long[] first = kv.pos.get(0);
        if (first[first.length - 1] > horizon) {
          break;
        }
        kv.k.remove(0);
        kv.v.remove(0);
        kv.pos.remove(0);
      }
    }
    List<AttentionState> states = new ArrayList<>(kv.k.size());
    for (int i = 0; i < kv.k.size(); i++) {
      // Few query rows: split-K also splits the keys, as AttentionOp's Java path does.
      states.add(len <= AttentionOp.SPLIT_K_MAX_QUERY_ROWS
          ? backend.decode(qt, kv.k.get(i), kv.v.get(i), pos, kv.pos.get(i), m.attn, CpuAttention.DEFAULT_SPLIT_LEN)
              .state()
          : backend.forward(qt, kv.k.get(i), kv.v.get(i), pos, kv.pos.get(i), m.attn));
    }
    AttentionState st = AttentionState.mergeAll(states);
    return cm.create(st.o(), new Shape(len, (long) c.heads * c.headDim));
  }

  private static NDArray linear(NDArray x, NDArray wT, NDArray b) {
    NDArray y = x.matMul(wT);
    return b == null ? y : y.add(b);
  }

  /** RMSNorm in float32: x / sqrt(mean(x^2) + eps) * w. */
  private static NDArray rmsNorm(NDArray x, NDArray w, double eps) {
    NDArray var = x.square().mean(new int[] {1}, true);
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
      throw new IllegalArgumentException("expected one 1-d array of token ids, got " + inputs.getShapes().length
          + " inputs");
    }
    NDArray t = inputs.head();
    if (t.getDataType() != DataType.INT32 && t.getDataType() != DataType.INT64) {
      throw new IllegalArgumentException("token ids must be int32 or int64, got " + t.getDataType());
    }
    int[] tokens = t.getDataType() == DataType.INT32 ? t.toIntArray()
        : java.util.Arrays.stream(t.toLongArray()).mapToInt(Math::toIntExact).toArray();
    int chunkLen = blockChunkLen;
    if (params != null && params.get(CHUNK_LEN) != null) {
      chunkLen = (Integer) params.get(CHUNK_LEN);
    }
    DocumentScore sc = score(tokens, chunkLen, true);
    NDManager out = t.getManager();
    // The sum travels as float64 so that callers get the same double as score() gives.
    return new NDList(out.create(sc.logprobs()), out.create(new double[] {sc.sumLogprob()}));
  }

  @Override
  public Shape[] getOutputShapes(Shape[] inputShapes) {
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
