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
    String[][] cases = {{"--bogus"}, {"--bogus", "1"}, {"--layers"}, {"--layers", "two", "--output", "x"}};
    String[] expect = {"unknown option --bogus", "unknown option --bogus", "--layers needs a value",
        "--layers needs a number, got 'two'"};
    for (int c = 0; c < cases.length; c++) {
      String[] args = cases[c];
      IllegalArgumentException e = assertThrows(IllegalArgumentException.class, () -> ModelGenerator.run(args));
      assertTrue(e.getMessage().contains(expect[c]), String.join(" ", args) + ": " + e.getMessage());
    }
    assertTrue(!Files.exists(Path.of("x")), "nothing written on bad usage");
  }
}
