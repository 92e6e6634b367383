package io.longctx.djl;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTrue;

import java.nio.file.Files;
import java.nio.file.Path;
import java.util.List;
import java.util.stream.Stream;
import org.junit.jupiter.api.Test;
import org.junit.jupiter.api.io.TempDir;

/** gen-model's output: complete under the name asked for, or nothing there (written aside, then renamed). */
class ModelGeneratorTest {
  @TempDir
  Path tmp;

  static List<String> names(Path dir) throws Exception {
    try (Stream<Path> s = Files.list(dir)) {
      return s.map(p -> p.getFileName().toString()).sorted().toList();
    }
  }

  @Test
  void aCheckpointAppearsWholeAndNeverOverAnotherDirectory() throws Exception {
    ModelGenerator.Spec s = new ModelGenerator.Spec();
    s.vocab = 300;
    s.shards = 2;
    Path fresh = tmp.resolve("fresh");
    ModelGenerator.generate(s, fresh);
    assertEquals(List.of("config.json", "model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors",
        "model.safetensors.index.json", "tokenizer.json"), names(fresh));
    assertEquals(s.layers, LlamaConfig.read(fresh).layers);

    Path empty = Files.createDirectory(tmp.resolve("empty"));
    ModelGenerator.generate(s, empty);
    assertTrue(Files.exists(empty.resolve("config.json")), "an empty directory receives the checkpoint");

    Path mine = Files.createDirectory(tmp.resolve("mine"));
    Files.writeString(mine.resolve("notes.txt"), "precious");
    IllegalArgumentException e = assertThrows(IllegalArgumentException.class, () -> ModelGenerator.generate(s, mine));
    assertTrue(e.getMessage().contains("not empty"), e.getMessage());
    assertEquals(List.of("notes.txt"), names(mine));
    assertEquals(List.of("empty", "fresh", "mine"), names(tmp), "no staging directory left beside them");
  }

  /** Bad usage names the option: an unknown one as unknown (also as the last word), a bad number as such. */
  @Test
  void badOptionsSayWhatIsWrong() {
    String[][] cases = {{"--bogus"}, {"--bogus", "1"}, {"--layers"}, {"--layers", "two", "--output", "x"},
        {"--output", "--tie"}, {"--vocab", "99999999999", "--output", "x"}, {"--layers", "2", "--layers", "3"},
        {"--heads", "3", "--kv-heads", "2", "--output", "x"}, {"--shards", "100", "--output", "x"}};
    // a number past int was "needs a number"; a repeated option kept its last value; config.json's fields were named,
    // not the options; 100 shards of a 21-tensor model wrote 79 files without a tensor
    String[] expect = {"unknown option --bogus", "unknown option --bogus", "--layers needs a value",
        "--layers needs a number, got 'two'", "--output needs a value, got the option --tie",
        "--vocab is out of range: 99999999999", "--layers is given twice",
        "--heads (num_attention_heads), --kv-heads (num_key_value_heads): ", "--shards 100 is more than the model's 21"};
    for (int c = 0; c < cases.length; c++) {
      String[] args = cases[c];
      IllegalArgumentException e = assertThrows(IllegalArgumentException.class, () -> ModelGenerator.run(args));
      assertTrue(e.getMessage().contains(expect[c]), String.join(" ", args) + ": " + e.getMessage());
    }
    assertTrue(!Files.exists(Path.of("x")), "nothing written on bad usage");
  }

  /** Mistral without --sliding-window has no window: "sliding_window": null is written (absent would be 4096). */
  @Test
  void mistralWithoutAWindowHasNone() throws Exception {
    ModelGenerator.Spec s = new ModelGenerator.Spec();
    s.modelType = "mistral";
    s.layers = 1;
    Path dir = tmp.resolve("m");
    ModelGenerator.generate(s, dir);
    assertTrue(Files.readString(dir.resolve("config.json")).contains("\"sliding_window\": null"));
    assertEquals(0, LlamaConfig.read(dir).slidingWindow);
    s.slidingWindow = 5;
    ModelGenerator.generate(s, tmp.resolve("w"));
    assertEquals(5, LlamaConfig.read(tmp.resolve("w")).slidingWindow);
  }

  /** Values that would have fallen back to a default, or worse, without a word are refused naming the option. */
  @Test
  void outOfRangeValuesAreRefused() {
    String[][] cases = {{"--sliding-window", "-4", "--model-type", "mistral"}, {"--ffn", "-1"}, {"--init-std", "-0.1"},
        {"--init-std", "NaN"}};
    for (String[] c : cases) {
      String[] args = java.util.stream.Stream.concat(Stream.of(c), Stream.of("--output", tmp.resolve("x").toString()))
          .toArray(String[]::new);
      IllegalArgumentException e = assertThrows(IllegalArgumentException.class, () -> ModelGenerator.run(args));
      assertTrue(e.getMessage().startsWith(c[0] + " must be"), String.join(" ", c) + ": " + e.getMessage());
    }
    assertTrue(!Files.exists(tmp.resolve("x")), "nothing written on bad usage");
  }

  /** Any vocabulary size is filled exactly, Llama-3's 128,256 included (byte pairs alone ran out near 66,000). */
  @Test
  void largeVocabulariesAreFilledExactly() {
    ModelGenerator.Tokenizer t = ModelGenerator.Tokenizer.train(128256, "a small text");
    assertEquals(128256, t.vocab.size());
    assertEquals(128256 - 259, t.merges.size());
    assertEquals(t.vocab.size(), new java.util.HashSet<>(t.vocab).size(), "no token twice");
  }
}
