package io.longctx.examples;

import ai.djl.ndarray.NDArray;
import ai.djl.ndarray.NDManager;
import ai.djl.ndarray.types.Shape;
import ai.djl.nn.Activation;
import io.longctx.djl.LlamaConfig;
import io.longctx.djl.Safetensors;
import java.io.IOException;
import java.nio.file.Path;
import java.util.HashMap;
import java.util.Map;

/**
 * The anchor of {@link PplBench}: a Llama-family checkpoint run densely in one libtorch forward
 * through DJL, the standard way (as Hugging Face's "eager" attention): per layer the full causal
 * [H, T, T] score matrix (matMul, scale, additive mask, softmax, matMul), then the full [T, V]
 * logits, log_softmax and a gather of the targets. No chunking, no KV cache. Same weights as
 * {@link io.longctx.djl.LlamaModel} (float32, read from the same safetensors), written separately.
 *
 * <p>The big intermediates are closed as soon as they are used, so the peak is what the standard
 * path needs: the [T, T] mask, the scores and the probabilities of one layer (or the logits and
 * their log_softmax), not every layer's at once.
 */
final class DenseLlama implements AutoCloseable {

  final LlamaConfig cfg;
  private final NDManager manager;
  private final Map<String, NDArray> w = new HashMap<>();
  private final double[] invFreq;

  private DenseLlama(LlamaConfig cfg, NDManager manager) {
    this.cfg = cfg;
    this.manager = manager;
    this.invFreq = cfg.inverseFrequencies();
  }

  static DenseLlama load(Path dir, NDManager parent) throws IOException {
    LlamaConfig cfg = LlamaConfig.read(dir);
    Map<String, Safetensors.Entry> entries = Safetensors.checkpointEntries(dir);
    Map<String, long[]> expected = cfg.requireTensors(entries, dir);
    DenseLlama m = new DenseLlama(cfg, parent.newSubManager());
    Map<String, NDArray> loaded = Safetensors.load(entries, expected.keySet(), m.manager);
    for (String name : expected.keySet()) {
      Safetensors.Entry e = entries.get(name);
      NDArray a = loaded.get(name);
      // Matrices held transposed ([in, out]), once, so that a forward creates nothing on the weights' manager.
      if (name.equals("model.embed_tokens.weight")) {
        m.w.put(name, a);
        if (cfg.tieWordEmbeddings) {
          m.w.put("lm_head.weight", a.transpose());
        }
      } else {
        m.w.put(name, e.shape().length == 2 ? a.transpose() : a);
      }
    }
    return m;
  }

  /**
   * Bytes the dense forward of a T-token document needs beyond the weights, estimated from its
   * largest live tensors (float32): the mask, and one layer's scores and probabilities, or the logits
   * and their log_softmax, whichever is larger; plus the activations of the layer.
   */
  static long estimateBytes(LlamaConfig c, long t) {
    long mask = t * t * 4;
    long attn = 2L * c.heads * t * t * 4;
    long logits = 2L * t * c.vocabSize * 4;
    long act = t * (3L * c.intermediateSize + 8L * c.hiddenSize) * 4;
    return mask + Math.max(attn, logits) + act;
  }

  private NDArray t(String name) {
    return w.get(name);
  }

  /** log p(tokens[i+1] | tokens[0..i]) for i = 0..n-2 (float32, as computed). */
  float[] logprobs(int[] tokens) {
    int n = tokens.length - 1;
    if (n < 1) {
      return new float[0];
    }
    LlamaConfig c = cfg;
    int h = c.heads, hk = c.kvHeads, d = c.headDim, g = h / hk;
    try (NDManager fm = manager.newSubManager()) {
      long[] idx = new long[n];
      long[] tgt = new long[n];
      for (int i = 0; i < n; i++) {
        idx[i] = tokens[i];
        tgt[i] = tokens[i + 1];
      }
      NDArray x = t("model.embed_tokens.weight").get(fm.create(idx)); // [T, E]
      x.attach(fm);
      NDArray[] rope = ropeTables(fm, n);
      NDArray mask = mask(fm, n, c.slidingWindow);
      for (int l = 0; l < c.layers; l++) {
        String p = "model.layers." + l + ".";
        try (NDManager lm = fm.newSubManager()) {
          NDArray xl = x.duplicate();
          xl.attach(lm);
          NDArray hn = rmsNorm(xl, t(p + "input_layernorm.weight"));
          NDArray q = linear(hn, p + "self_attn.q_proj").reshape(n, h, d);
          NDArray k = linear(hn, p + "self_attn.k_proj").reshape(n, hk, d);
          NDArray v = linear(hn, p + "self_attn.v_proj").reshape(n, hk, d);
          q = rotate(q, rope[0], rope[1]);
          k = rotate(k, rope[0], rope[1]);
          // Query head j uses kv head j / g (repeat_kv): group the g query heads of a kv head as rows.
          NDArray qh = q.transpose(1, 0, 2).reshape(hk, (long) g * n, d);
          NDArray kh = k.transpose(1, 2, 0); // [Hkv, D, T]
          NDArray vh = v.transpose(1, 0, 2); // [Hkv, T, D]
          NDArray s = qh.matMul(kh); // [Hkv, g*T, T]
          s.muli(1.0 / Math.sqrt(d));
          NDArray s4 = s.reshape(hk, g, n, n);
          s4.addi(mask);
          NDArray pr = s4.softmax(3);
          s4.close();
          s.close();
          NDArray o = pr.reshape(hk, (long) g * n, n).matMul(vh); // [Hkv, g*T, D]
          pr.close();
          o = o.reshape(h, n, d).transpose(1, 0, 2).reshape(n, (long) h * d);
          NDArray x2 = xl.add(linear(o, p + "self_attn.o_proj"));
          NDArray gn = rmsNorm(x2, t(p + "post_attention_layernorm.weight"));
          NDArray gate = gn.matMul(t(p + "mlp.gate_proj.weight"));
          NDArray act = gate.mul(Activation.sigmoid(gate)).mul(gn.matMul(t(p + "mlp.up_proj.weight")));
          NDArray out = x2.add(act.matMul(t(p + "mlp.down_proj.weight")));
          out.attach(fm);
          x.close();
          x = out;
        }
      }
      mask.close();
      NDArray hn = rmsNorm(x, t("model.norm.weight"));
      NDArray z = hn.matMul(t("lm_head.weight")); // [T, V] (head held as [E, V])
      NDArray lp = z.logSoftmax(1);
      z.close();
      return lp.gather(fm.create(tgt, new Shape(n, 1)), 1).toFloatArray();
    }
  }

  /** The sum of {@link #logprobs} in float64. */
  double sumLogprob(int[] tokens) {
    double s = 0;
    for (float v : logprobs(tokens)) {
      s += v;
    }
    return s;
  }

  private NDArray linear(NDArray x, String prefix) {
    NDArray y = x.matMul(t(prefix + ".weight"));
    NDArray b = t(prefix + ".bias");
    return b == null ? y : y.add(b);
  }

  private NDArray rmsNorm(NDArray x, NDArray weight) {
    NDArray var = x.square().mean(new int[] {1}, true);
    return x.div(var.add((float) cfg.rmsNormEps).sqrt()).mul(weight);
  }

  /** [T, T] additive mask: 0 where key j is visible to query i (j <= i, and j > i - W with a window), else -inf. */
  private static NDArray mask(NDManager m, int n, long window) {
    float[] a = new float[Math.multiplyExact(n, n)];
    for (int i = 0; i < n; i++) {
      for (int j = 0; j < n; j++) {
        boolean visible = j <= i && (window <= 0 || j > i - window);
        a[i * n + j] = visible ? 0f : Float.NEGATIVE_INFINITY;
      }
    }
    return m.create(a, new Shape(n, n));
  }

  private NDArray[] ropeTables(NDManager m, int n) {
    int half = invFreq.length;
    float[] cos = new float[n * half];
    float[] sin = new float[n * half];
    for (int i = 0; i < n; i++) {
      for (int j = 0; j < half; j++) {
        double a = i * invFreq[j];
        cos[i * half + j] = (float) Math.cos(a);
        sin[i * half + j] = (float) Math.sin(a);
      }
    }
    Shape s = new Shape(n, 1, half);
    return new NDArray[] {m.create(cos, s), m.create(sin, s)};
  }

  /** x cos + rotate_half(x) sin, rotate_half(x) = [-x2, x1] on the two halves of the head. */
  private static NDArray rotate(NDArray x, NDArray cos, NDArray sin) {
    long half = x.getShape().get(2) / 2;
    NDArray x1 = x.get(":, :, 0:" + half);
    NDArray x2 = x.get(":, :, " + half + ":");
    return x1.mul(cos).sub(x2.mul(sin)).concat(x2.mul(cos).add(x1.mul(sin)), 2);
  }

  @Override
  public void close() {
    manager.close();
  }
}
