package io.longctx.djl;

import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTimeoutPreemptively;
import static org.junit.jupiter.api.Assertions.assertTrue;

import java.nio.file.Files;
import java.nio.file.Path;
import java.time.Duration;
import org.junit.jupiter.api.Test;
import org.junit.jupiter.api.io.TempDir;

/**
 * Malformed checkpoints found by a review on 2026-11-27 (third session); each test failed on the
 * code before: a tensor named twice (a wrong score, exit 0), an absurd layer count (the heap filled
 * before anything was named), JSON that is not UTF-8 (exit 1, no file named).
 */
class CheckpointInputsTest {

  /**
   * A header naming one tensor twice: Gson keeps the last entry, so the reader silently uses the
   * second data region (the first is left as a gap). Hugging Face's safetensors refuses the file
   * ("invalid offset for tensor"); ppl scored it with exit 0 (sum_logprob -46.33 instead of -30.22
   * for a generated model whose model.norm.weight was duplicated).
   */
  @Test
  void aTensorNamedTwiceInAHeaderIsRefused(@TempDir Path tmp) throws Exception {
    byte[] data = SafetensorsTest.le(1f, 2f, 3f, 4f);
    Path f = SafetensorsTest.handMade(tmp.resolve("dup.safetensors"),
        "{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]},"
            + "\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[8,16]}}", data, -1);
    SafetensorsTest.assertError(() -> Safetensors.readHeader(f), "dup.safetensors", "tensor a appears twice");
  }

  /** Bytes no tensor owns, between tensors or after the last, are refused as Hugging Face's reader does. */
  @Test
  void dataNoTensorOwnsIsRefused(@TempDir Path tmp) throws Exception {
    byte[] data = SafetensorsTest.le(1f, 2f, 3f, 4f);
    Path gap = SafetensorsTest.handMade(tmp.resolve("gap.safetensors"),
        "{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]},"
            + "\"b\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[8,16]}}", data, -1);
    SafetensorsTest.assertError(() -> Safetensors.readHeader(gap), "gap.safetensors", "before tensor b");
    Path tail = SafetensorsTest.handMade(tmp.resolve("tail.safetensors"),
        "{\"a\":{\"dtype\":\"F32\",\"shape\":[3],\"data_offsets\":[0,12]}}", data, -1);
    SafetensorsTest.assertError(() -> Safetensors.readHeader(tail), "tail.safetensors", "after the last tensor");
  }

  /**
   * config.json with num_hidden_layers 2000000000 over a 2-layer checkpoint: the expected tensor
   * names (18e9 map entries) were built before the first missing one was named (ppl: 6.7 GB,
   * OutOfMemoryError after minutes). Now named at once.
   */
  @Test
  void anAbsurdLayerCountIsNamedNotAllocated(@TempDir Path tmp) throws Exception {
    Path dir = LlamaTesting.generate(LlamaTesting.tiny(1), tmp.resolve("m"));
    Path cfg = dir.resolve("config.json");
    String c = Files.readString(cfg);
    assertTrue(c.contains("\"num_hidden_layers\": 2,"), c);
    Files.writeString(cfg, c.replace("\"num_hidden_layers\": 2,", "\"num_hidden_layers\": 2000000000,"));
    IllegalArgumentException e = assertTimeoutPreemptively(Duration.ofSeconds(10), () -> assertThrows(
        IllegalArgumentException.class, () -> LlamaConfig.read(dir).requireTensors(Safetensors.checkpointEntries(dir),
            dir)));
    assertTrue(e.getMessage().contains("model.layers.2.") && e.getMessage().contains("2000000000 layers"), e.getMessage());
  }

  /**
   * config.json (or model.safetensors.index.json) that is not UTF-8, e.g. a Latin-1 "café" in a
   * description field: Files.readString throws MalformedInputException ("Input length = 3"), which
   * ppl reports as exit 1 with a stack trace naming no file. Bad input: exit 2 naming the file.
   */
  @Test
  void aConfigThatIsNotUtf8IsNamed(@TempDir Path tmp) throws Exception {
    Path dir = LlamaTesting.generate(LlamaTesting.tiny(1), tmp.resolve("m"));
    byte[] c = Files.readAllBytes(dir.resolve("config.json"));
    byte[] latin1 = new String(c, java.nio.charset.StandardCharsets.UTF_8)
        .replaceFirst("\\{", "{\"description\": \"caf\u00e9\",").getBytes(java.nio.charset.StandardCharsets.ISO_8859_1);
    Files.write(dir.resolve("config.json"), latin1);
    ModelGenerator.Spec s = LlamaTesting.tiny(1);
    s.shards = 2;
    Path two = LlamaTesting.generate(s, tmp.resolve("two"));
    Path idx = two.resolve("model.safetensors.index.json");
    Files.write(idx, Files.readString(idx).replaceFirst("\\{", "{\"note\": \"caf\u00e9\",")
        .getBytes(java.nio.charset.StandardCharsets.ISO_8859_1));
    IllegalArgumentException ie = assertThrows(IllegalArgumentException.class, () -> Safetensors.checkpointEntries(two));
    assertTrue(ie.getMessage().contains("model.safetensors.index.json"), ie.getMessage());
    SafetensorsTest.assertError(() -> LlamaConfig.read(dir), "config.json");
  }
}
