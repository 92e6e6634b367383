package io.longctx.djl;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertFalse;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTrue;

import org.junit.jupiter.api.Test;

class LlamaConfigTest {

  static final String BASE = "\"hidden_size\": 64, \"intermediate_size\": 176, \"num_hidden_layers\": 2,"
      + " \"num_attention_heads\": 4, \"vocab_size\": 300";

  static LlamaConfig parse(String extra) {
    return LlamaConfig.parse("{" + BASE + (extra.isEmpty() ? "" : ", " + extra) + "}", "dir/config.json");
  }

  static void refused(String extra, String... parts) {
    IllegalArgumentException e = assertThrows(IllegalArgumentException.class, () -> parse(extra));
    assertTrue(e.getMessage().startsWith("dir/config.json: "), e.getMessage());
    for (String p : parts) {
      assertTrue(e.getMessage().contains(p), "should name " + p + ": " + e.getMessage());
    }
  }

  @Test
  void llamaDefaults() {
    LlamaConfig c = parse("\"model_type\": \"llama\"");
    assertEquals(4, c.kvHeads, "kv heads default to the heads");
    assertEquals(16, c.headDim);
    assertEquals(1e-6, c.rmsNormEps);
    assertEquals(10000, c.ropeTheta);
    assertFalse(c.tieWordEmbeddings);
    assertFalse(c.qkvBias);
    assertEquals(0, c.slidingWindow);
    assertEquals(LlamaConfig.RopeScaling.NONE, c.ropeScaling);
    assertTrue(c.expectedTensors().containsKey("lm_head.weight"));
  }

  @Test
  void typesAndFields() {
    LlamaConfig q = parse("\"model_type\": \"qwen2\", \"tie_word_embeddings\": true, \"num_key_value_heads\": 2,"
        + " \"sliding_window\": 4096, \"use_sliding_window\": false, \"rms_norm_eps\": 1e-5, \"head_dim\": 32");
    assertTrue(q.qkvBias);
    assertFalse(q.oBias);
    assertEquals(0, q.slidingWindow, "qwen2 ignores sliding_window unless use_sliding_window");
    assertEquals(32, q.headDim);
    assertEquals(1e-5, q.rmsNormEps);
    assertTrue(q.expectedTensors().containsKey("model.layers.1.self_attn.k_proj.bias"));
    assertFalse(q.expectedTensors().containsKey("lm_head.weight"));
    assertEquals(4 * 32, q.expectedTensors().get("model.layers.0.self_attn.q_proj.weight")[0]);
    assertEquals(4096, parse("\"model_type\": \"mistral\", \"sliding_window\": 4096").slidingWindow);
    assertEquals(0, parse("\"model_type\": \"mistral\", \"sliding_window\": null").slidingWindow);
    // Absent: Hugging Face's MistralConfig default, not "no window".
    assertEquals(4096, parse("\"model_type\": \"mistral\"").slidingWindow);
    LlamaConfig b = parse("\"model_type\": \"llama\", \"attention_bias\": true");
    assertTrue(b.qkvBias && b.oBias);
  }

  @Test
  void ropeScaling() {
    LlamaConfig lin = parse("\"model_type\": \"llama\", \"rope_scaling\": {\"type\": \"linear\", \"factor\": 4.0}");
    double[] plain = parse("\"model_type\": \"llama\"").inverseFrequencies();
    double[] scaled = lin.inverseFrequencies();
    for (int i = 0; i < plain.length; i++) {
      assertEquals(plain[i] / 4, scaled[i], 1e-18);
    }
    // Both names given: type wins, as Hugging Face's configs copy it over rope_type.
    LlamaConfig both = parse("\"model_type\": \"llama\", \"rope_scaling\": {\"rope_type\": \"default\", \"type\": \"linear\","
        + " \"factor\": 4}");
    assertEquals(LlamaConfig.RopeScaling.LINEAR, both.ropeScaling);
    refused("\"model_type\": \"llama\", \"rope_scaling\": {\"rope_type\": \"linear\", \"type\": \"yarn\", \"factor\": 4}",
        "rope_scaling.type", "yarn");
    LlamaConfig l3 = parse("\"model_type\": \"llama\", \"rope_scaling\": {\"rope_type\": \"llama3\", \"factor\": 8,"
        + " \"low_freq_factor\": 1, \"high_freq_factor\": 4, \"original_max_position_embeddings\": 64}");
    double[] f = l3.inverseFrequencies();
    assertEquals(plain[0], f[0], 0.0, "high frequency (short wavelength) unchanged");
    assertEquals(plain[7] / 8, f[7], 1e-18, "low frequency divided by the factor");
    assertEquals(LlamaConfig.RopeScaling.NONE,
        parse("\"model_type\": \"llama\", \"rope_scaling\": {\"rope_type\": \"default\"}").ropeScaling);
  }

  /**
   * Transformers 5's layout: rope_theta and the scaling inside rope_parameters. It was ignored before
   * (the default theta 10000 scored the model without a word).
   */
  @Test
  void ropeParametersAreRead() {
    LlamaConfig c = parse("\"model_type\": \"llama\", \"rope_parameters\": {\"rope_type\": \"default\", \"rope_theta\": 500000.0}");
    assertEquals(500000.0, c.ropeTheta);
    assertEquals(LlamaConfig.RopeScaling.NONE, c.ropeScaling);
    LlamaConfig l3 = parse("\"model_type\": \"llama\", \"rope_parameters\": {\"rope_type\": \"llama3\", \"rope_theta\": 500000,"
        + " \"factor\": 8, \"low_freq_factor\": 1, \"high_freq_factor\": 4, \"original_max_position_embeddings\": 64}");
    assertEquals(LlamaConfig.RopeScaling.LLAMA3, l3.ropeScaling);
    assertEquals(500000.0, l3.ropeTheta);
    refused("\"model_type\": \"llama\", \"rope_theta\": 10000, \"rope_parameters\": {\"rope_type\": \"default\","
        + " \"rope_theta\": 500000}", "rope_theta", "beside rope_parameters");
    refused("\"model_type\": \"llama\", \"rope_parameters\": {\"rope_type\": \"yarn\", \"factor\": 4}",
        "rope_parameters.rope_type", "yarn");
  }

  @Test
  void unsupportedValuesAreRefusedByName() {
    refused("\"model_type\": \"gpt2\"", "model_type", "gpt2");
    refused("\"hidden_size\": 64", "model_type", "missing");
    refused("\"model_type\": \"llama\", \"hidden_act\": \"gelu\"", "hidden_act", "gelu");
    refused("\"model_type\": \"llama\", \"rope_scaling\": {\"rope_type\": \"yarn\", \"factor\": 4}",
        "rope_scaling.rope_type", "yarn");
    refused("\"model_type\": \"llama\", \"rope_scaling\": {\"rope_type\": \"dynamic\", \"factor\": 4}", "dynamic");
    refused("\"model_type\": \"llama\", \"rope_scaling\": {\"rope_type\": \"linear\"}", "rope_scaling.factor",
        "missing");
    refused("\"model_type\": \"llama\", \"rope_scaling\": {\"rope_type\": \"llama3\", \"factor\": 8}",
        "rope_scaling.low_freq_factor");
    refused("\"model_type\": \"llama\", \"mlp_bias\": true", "mlp_bias");
    refused("\"model_type\": \"qwen2\", \"use_sliding_window\": true", "use_sliding_window");
    refused("\"model_type\": \"llama\", \"partial_rotary_factor\": 0.5", "partial_rotary_factor");
    refused("\"model_type\": \"llama\", \"num_key_value_heads\": 3", "num_key_value_heads");
    refused("\"model_type\": \"llama\", \"head_dim\": 15", "head_dim");
    refused("\"model_type\": \"llama\", \"rms_norm_eps\": -1", "rms_norm_eps");
    assertThrows(IllegalArgumentException.class, () -> LlamaConfig.parse("{", "x/config.json"));
  }

  /** A checkpoint path that is a file, or nothing, is named as such (not as a missing config.json). */
  @Test
  void aCheckpointThatIsNoDirectoryIsNamed(@org.junit.jupiter.api.io.TempDir java.nio.file.Path dir) throws Exception {
    java.nio.file.Path file = java.nio.file.Files.writeString(dir.resolve("a-file"), "x");
    IllegalArgumentException e = assertThrows(IllegalArgumentException.class, () -> LlamaConfig.read(file));
    assertTrue(e.getMessage().contains("a-file: not a directory"), e.getMessage());
    e = assertThrows(IllegalArgumentException.class, () -> LlamaConfig.read(dir.resolve("absent")));
    assertTrue(e.getMessage().contains("absent: no such directory"), e.getMessage());
  }
}
