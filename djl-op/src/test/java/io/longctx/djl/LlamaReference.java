package io.longctx.djl;

import com.google.gson.JsonElement;
import com.google.gson.JsonObject;
import com.google.gson.JsonParser;
import java.io.IOException;
import java.nio.charset.StandardCharsets;
import java.nio.file.Files;
import java.nio.file.Path;
import java.util.Map;

/**
 * An independent float64 forward of a whole document through a Llama-family checkpoint, dense and
 * plain (double arrays, every score materialized), written from the Hugging Face definitions
 * (modeling_llama / mistral / qwen2) and not from {@link LlamaModel}: it reads config.json itself
 * and shares only the safetensors reader (tested on its own in SafetensorsTest).
 */
final class LlamaReference {

  /** Deliberate mistakes, to show the comparison can fail. */
  enum Mutation {
    NONE,
    /** rotate interleaved pairs (GPT-J style) instead of the two halves. */
    INTERLEAVED_ROPE,
    /** ignore rope_scaling. */
    NO_ROPE_SCALING,
    /** ignore Mistral's sliding window. */
    NO_WINDOW
  }

  final int e, layers, h, hkv, d, ffn, vocab;
  final double eps, theta;
  final JsonObject ropeScaling;
  final long window;
  final boolean tied;
  final Map<String, Safetensors.Entry> entries;

  LlamaReference(Path dir) throws IOException {
    JsonObject c = JsonParser.parseString(Files.readString(dir.resolve("config.json"), StandardCharsets.UTF_8))
        .getAsJsonObject();
    e = c.get("hidden_size").getAsInt();
    layers = c.get("num_hidden_layers").getAsInt();
    h = c.get("num_attention_heads").getAsInt();
    hkv = c.has("num_key_value_heads") ? c.get("num_key_value_heads").getAsInt() : h;
    d = c.has("head_dim") ? c.get("head_dim").getAsInt() : e / h;
    ffn = c.get("intermediate_size").getAsInt();
    vocab = c.get("vocab_size").getAsInt();
    eps = c.get("rms_norm_eps").getAsDouble();
    theta = c.has("rope_theta") ? c.get("rope_theta").getAsDouble() : 10000;
    JsonElement rs = c.get("rope_scaling");
    ropeScaling = rs == null || rs.isJsonNull() ? null : rs.getAsJsonObject();
    JsonElement sw = c.get("sliding_window");
    // Hugging Face's MistralConfig: absent means its default 4096, null means none.
    window = !c.get("model_type").getAsString().equals("mistral") ? 0 : sw == null ? 4096 : sw.isJsonNull() ? 0 : sw.getAsLong();
    tied = c.has("tie_word_embeddings") && c.get("tie_word_embeddings").getAsBoolean();
    entries = Safetensors.checkpointEntries(dir);
  }

  private double[] w(String name) throws IOException {
    Safetensors.Entry en = entries.get(name);
    if (en == null) {
      return null;
    }
    float[] f = Safetensors.readFloats(en);
    double[] out = new double[f.length];
    for (int i = 0; i < f.length; i++) {
      out[i] = f[i];
    }
    return out;
  }

  /** HF's inv_freq for rope_scaling default / linear / llama3 (_compute_*_rope_parameters). */
  double[] invFreq(Mutation mut) {
    double[] inv = new double[d / 2];
    for (int i = 0; i < d / 2; i++) {
      inv[i] = 1.0 / Math.pow(theta, (double) (2 * i) / d);
    }
    if (ropeScaling == null || mut == Mutation.NO_ROPE_SCALING) {
      return inv;
    }
    String type = ropeScaling.has("type") ? ropeScaling.get("type").getAsString() // HF: type overrides rope_type
        : ropeScaling.get("rope_type").getAsString();
    double factor = ropeScaling.get("factor").getAsDouble();
    if (type.equals("linear")) {
      for (int i = 0; i < inv.length; i++) {
        inv[i] = inv[i] / factor;
      }
    } else if (type.equals("llama3")) {
      double low = ropeScaling.get("low_freq_factor").getAsDouble();
      double high = ropeScaling.get("high_freq_factor").getAsDouble();
      double old = ropeScaling.get("original_max_position_embeddings").getAsDouble();
      double lowWl = old / low, highWl = old / high;
      for (int i = 0; i < inv.length; i++) {
        double wl = 2 * Math.PI / inv[i];
        double scaled = wl > lowWl ? inv[i] / factor : inv[i];
        double smooth = (old / wl - low) / (high - low);
        double smoothed = (1 - smooth) * scaled / factor + smooth * scaled;
        boolean medium = !(wl < highWl) && !(wl > lowWl);
        inv[i] = medium ? smoothed : scaled;
      }
    } else {
      throw new IllegalArgumentException(type);
    }
    return inv;
  }

  /** y[o] = sum_i W[o][i] x[i] (+ b[o]), W stored [out, in]. */
  private static double[] lin(double[] wt, double[] b, double[] x, int out, int in) {
    double[] y = new double[out];
    for (int o = 0; o < out; o++) {
      double s = b == null ? 0 : b[o];
      for (int i = 0; i < in; i++) {
        s += wt[o * in + i] * x[i];
      }
      y[o] = s;
    }
    return y;
  }

  private double[] rms(double[] x, double[] wgt) {
    double ms = 0;
    for (double v : x) {
      ms += v * v;
    }
    ms /= x.length;
    double r = 1 / Math.sqrt(ms + eps);
    double[] y = new double[x.length];
    for (int i = 0; i < x.length; i++) {
      y[i] = wgt[i] * (x[i] * r);
    }
    return y;
  }

  /** q cos + rotate_half(q) sin, in place, on one head's vector at position p. */
  private void rope(double[] v, int off, long p, double[] inv, Mutation mut) {
    int half = d / 2;
    double[] out = new double[d];
    for (int i = 0; i < d; i++) {
      if (mut == Mutation.INTERLEAVED_ROPE) {
        double a = p * inv[i / 2];
        double rot = i % 2 == 0 ? -v[off + i + 1] : v[off + i - 1];
        out[i] = v[off + i] * Math.cos(a) + rot * Math.sin(a);
      } else {
        double a = p * inv[i % half]; // emb = cat(freqs, freqs)
        double rot = i < half ? -v[off + i + half] : v[off + i - half];
        out[i] = v[off + i] * Math.cos(a) + rot * Math.sin(a);
      }
    }
    System.arraycopy(out, 0, v, off, d);
  }

  /** log p(t_i | t_<i) for i = 1..n-1. */
  double[] logprobs(int[] tokens, Mutation mut) throws IOException {
    int n = tokens.length;
    double[] emb = w("model.embed_tokens.weight");
    double[][] x = new double[n][];
    for (int t = 0; t < n; t++) {
      x[t] = java.util.Arrays.copyOfRange(emb, tokens[t] * e, (tokens[t] + 1) * e);
    }
    double[] inv = invFreq(mut);
    long win = mut == Mutation.NO_WINDOW ? 0 : window;
    for (int l = 0; l < layers; l++) {
      String p = "model.layers." + l + ".";
      double[] inNorm = w(p + "input_layernorm.weight"), postNorm = w(p + "post_attention_layernorm.weight");
      double[] wq = w(p + "self_attn.q_proj.weight"), wk = w(p + "self_attn.k_proj.weight");
      double[] wv = w(p + "self_attn.v_proj.weight"), wo = w(p + "self_attn.o_proj.weight");
      double[] bq = w(p + "self_attn.q_proj.bias"), bk = w(p + "self_attn.k_proj.bias");
      double[] bv = w(p + "self_attn.v_proj.bias"), bo = w(p + "self_attn.o_proj.bias");
      double[] wg = w(p + "mlp.gate_proj.weight"), wu = w(p + "mlp.up_proj.weight");
      double[] wd = w(p + "mlp.down_proj.weight");
      double[][] q = new double[n][], k = new double[n][], v = new double[n][];
      for (int t = 0; t < n; t++) {
        double[] hn = rms(x[t], inNorm);
        q[t] = lin(wq, bq, hn, h * d, e);
        k[t] = lin(wk, bk, hn, hkv * d, e);
        v[t] = lin(wv, bv, hn, hkv * d, e);
        for (int hh = 0; hh < h; hh++) {
          rope(q[t], hh * d, t, inv, mut);
        }
        for (int hh = 0; hh < hkv; hh++) {
          rope(k[t], hh * d, t, inv, mut);
        }
      }
      double scale = 1 / Math.sqrt(d);
      double[][] nx = new double[n][];
      for (int t = 0; t < n; t++) {
        double[] attn = new double[h * d];
        for (int hh = 0; hh < h; hh++) {
          int kh = hh / (h / hkv);
          double[] s = new double[t + 1];
          double mx = Double.NEGATIVE_INFINITY;
          for (int j = 0; j <= t; j++) {
            boolean visible = win <= 0 || j > t - win;
            if (!visible) {
              s[j] = Double.NEGATIVE_INFINITY;
              continue;
            }
            double dot = 0;
            for (int i = 0; i < d; i++) {
              dot += q[t][hh * d + i] * k[j][kh * d + i];
            }
            s[j] = dot * scale;
            mx = Math.max(mx, s[j]);
          }
          double z = 0;
          for (int j = 0; j <= t; j++) {
            s[j] = Math.exp(s[j] - mx);
            z += s[j];
          }
          for (int j = 0; j <= t; j++) {
            for (int i = 0; i < d; i++) {
              attn[hh * d + i] += s[j] / z * v[j][kh * d + i];
            }
          }
        }
        double[] o = lin(wo, bo, attn, e, h * d);
        double[] r = new double[e];
        for (int i = 0; i < e; i++) {
          r[i] = x[t][i] + o[i];
        }
        double[] g = rms(r, postNorm);
        double[] gate = lin(wg, null, g, ffn, e), up = lin(wu, null, g, ffn, e);
        double[] act = new double[ffn];
        for (int i = 0; i < ffn; i++) {
          act[i] = gate[i] / (1 + Math.exp(-gate[i])) * up[i];
        }
        double[] dn = lin(wd, null, act, e, ffn);
        for (int i = 0; i < e; i++) {
          r[i] += dn[i];
        }
        nx[t] = r;
      }
      x = nx;
    }
    double[] fnorm = w("model.norm.weight");
    double[] head = tied ? emb : w("lm_head.weight");
    double[] out = new double[n - 1];
    for (int t = 0; t + 1 < n; t++) {
      double[] hn = rms(x[t], fnorm);
      double[] z = lin(head, null, hn, vocab, e);
      double mx = Double.NEGATIVE_INFINITY;
      for (double zz : z) {
        mx = Math.max(mx, zz);
      }
      double s = 0;
      for (double zz : z) {
        s += Math.exp(zz - mx);
      }
      out[t] = z[tokens[t + 1]] - (mx + Math.log(s));
    }
    return out;
  }
}
