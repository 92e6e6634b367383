package io.longctx.djl;

import static org.junit.jupiter.api.Assertions.assertArrayEquals;
import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertFalse;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTrue;

import ai.djl.huggingface.tokenizers.HuggingFaceTokenizer;
import ai.djl.inference.Predictor;
import ai.djl.ndarray.NDManager;
import ai.djl.repository.zoo.ZooModel;
import io.longctx.kernels.Seeds;
import java.nio.charset.StandardCharsets;
import java.nio.file.Path;
import java.util.SplittableRandom;
import org.junit.jupiter.api.Test;
import org.junit.jupiter.api.io.TempDir;

/** The generated tokenizer through the HF tokenizers library, and loading the DJL way (Criteria, Predictor), offline. */
class LlamaTranslatorTest {

  static final String TEXT = "The merged result does not depend on how the work was chunked.\n"
      + "Grüße aus Zürich — 東京, tabs\tand  double spaces; numbers 12345 and émoji 🙂.";

  @Test
  void tokenizerRoundTripsTextWithItsSpecialTokens(@TempDir Path tmp) throws Exception {
    assertEquals("true", System.getProperty("ai.djl.offline"), "tests run offline");
    long seed = Seeds.forTest();
    ModelGenerator.Spec s = LlamaTesting.tiny(seed);
    Path dir = LlamaTesting.generate(s, tmp.resolve("m"));
    try (HuggingFaceTokenizer tok = LlamaTranslator.openTokenizer(dir)) {
      int[] ids = LlamaTranslator.encode(tok, TEXT);
      assertEquals(ModelGenerator.Tokenizer.BOS, ids[0], "the post-processor prepends <s>");
      for (int i = 1; i < ids.length; i++) {
        assertTrue(ids[i] > ModelGenerator.Tokenizer.EOS && ids[i] < s.vocab, "id " + ids[i] + " at " + i);
      }
      long[] l = new long[ids.length];
      for (int i = 0; i < l.length; i++) {
        l[i] = ids[i];
      }
      assertEquals(TEXT, tok.decode(l, true), "byte-level BPE is lossless");
      int bytes = TEXT.getBytes(StandardCharsets.UTF_8).length;
      assertTrue(ids.length - 1 < bytes * 0.9, "merges learned from the sample apply: " + ids.length + " tokens for "
          + bytes + " bytes");
      // A long document is not truncated (no max length from the tokenizer).
      String longText = TEXT.repeat(60);
      assertTrue(LlamaTranslator.encode(tok, longText).length > 2000);
    }
  }

  @Test
  void criteriaPredictorScoresTextAndTokensOffline(@TempDir Path tmp) throws Exception {
    long seed = Seeds.forTest();
    ModelGenerator.Spec s = LlamaTesting.tiny(seed);
    Path dir = LlamaTesting.generate(s, tmp.resolve("m"));
    int[] expectIds;
    DocumentScore direct;
    int[] randomIds = LlamaTesting.randomTokens(new SplittableRandom(seed), 57, s.vocab);
    DocumentScore directRandom;
    try (NDManager m = NDManager.newBaseManager("PyTorch");
        LlamaModel model = LlamaModel.load(dir, m, LlamaModel.DEFAULT_VOCAB_SHARD);
        HuggingFaceTokenizer tok = LlamaTranslator.openTokenizer(dir)) {
      expectIds = LlamaTranslator.encode(tok, TEXT);
      direct = model.score(expectIds, 16, true);
      directRandom = model.score(randomIds, 16, true);
    }
    try (ZooModel<String, DocumentScore> zm = LlamaTranslator.criteria(dir, LlamaTranslator.text(), String.class, 16)
            .loadModel();
        Predictor<String, DocumentScore> p = zm.newPredictor()) {
      DocumentScore got = p.predict(TEXT);
      assertEquals(expectIds.length, got.nTokens());
      assertEquals(direct.sumLogprob(), got.sumLogprob(), 0.0, "seed " + seed);
      assertArrayEquals(direct.logprobs(), got.logprobs());
      double bpb = got.bitsPerByte(TEXT.getBytes(StandardCharsets.UTF_8).length);
      assertTrue(bpb > 0 && Double.isFinite(bpb));
    }
    try (ZooModel<int[], DocumentScore> zm = LlamaTranslator.criteria(dir, LlamaTranslator.tokens(), int[].class, 16)
            .loadModel();
        Predictor<int[], DocumentScore> p = zm.newPredictor()) {
      DocumentScore got = p.predict(randomIds);
      assertEquals(57, got.nTokens(), "token ids are scored as given: no <s> added");
      assertEquals(directRandom.sumLogprob(), got.sumLogprob(), 0.0, "seed " + seed);
      assertEquals(Math.exp(-got.sumLogprob() / 56), got.perplexity(), 1e-12 * got.perplexity());
    }
    // The default criteria (chunk 512) give the same sum within the chunk-invariance tolerance.
    try (ZooModel<int[], DocumentScore> zm = LlamaTranslator.tokenCriteria(dir).loadModel();
        Predictor<int[], DocumentScore> p = zm.newPredictor()) {
      assertEquals(directRandom.sumLogprob(), p.predict(randomIds).sumLogprob(),
          1e-5 * Math.abs(directRandom.sumLogprob()));
    }
  }

  /**
   * A Criteria loads models that are each their own: it gave every model one shared block, so the second
   * load took the first's weights and lost them when the first was closed ("NDManager has been closed
   * already"). A weights manager closed from outside unloads the model with a message saying so.
   */
  @Test
  void eachModelLoadedFromACriteriaIsItsOwn(@TempDir Path tmp) throws Exception {
    long seed = Seeds.forTest();
    Path dir = LlamaTesting.generate(LlamaTesting.tiny(seed), tmp.resolve("m"));
    int[] ids = LlamaTesting.randomTokens(new SplittableRandom(seed), 20, LlamaTesting.tiny(seed).vocab);
    var c = LlamaTranslator.tokenCriteria(dir);
    double first;
    try (ZooModel<int[], DocumentScore> zm = c.loadModel(); Predictor<int[], DocumentScore> p = zm.newPredictor()) {
      first = p.predict(ids).sumLogprob();
    }
    ZooModel<int[], DocumentScore> a = c.loadModel(), b = c.loadModel();
    try (b; Predictor<int[], DocumentScore> pa = a.newPredictor(); Predictor<int[], DocumentScore> pb = b.newPredictor()) {
      assertEquals(first, pa.predict(ids).sumLogprob(), 0.0, "seed " + seed);
      a.close();
      assertEquals(first, pb.predict(ids).sumLogprob(), 0.0, "b keeps its weights when a closes; seed " + seed);
    }
    try (NDManager m = NDManager.newBaseManager("PyTorch")) {
      LlamaModel model = LlamaModel.load(dir, m.newSubManager());
      m.close();
      assertFalse(model.isLoaded());
      IllegalStateException e = assertThrows(IllegalStateException.class, () -> model.score(ids, 16, false));
      assertTrue(e.getMessage().contains("weights were freed"), e.getMessage());
    }
    assertTrue(Double.isNaN(new DocumentScore(1, 0.0, new float[0]).bitsPerByte(1)), "one token: nothing scored");
  }

  /** One translator's predictors share its tokenizer; given a second checkpoint it refuses, never tokenizes with the first's. */
  @Test
  void aTextTranslatorServesOneCheckpoint(@TempDir Path tmp) throws Exception {
    ModelGenerator.Spec s = LlamaTesting.tiny(Seeds.forTest());
    Path dir = LlamaTesting.generate(s, tmp.resolve("m"));
    LlamaTranslator<String> shared = LlamaTranslator.text();
    try (ZooModel<String, DocumentScore> zm = LlamaTranslator.criteria(dir, shared, String.class, 16).loadModel();
        Predictor<String, DocumentScore> p1 = zm.newPredictor();
        Predictor<String, DocumentScore> p2 = zm.newPredictor()) {
      assertEquals(p1.predict(TEXT).sumLogprob(), p2.predict(TEXT).sumLogprob(), 0.0);
    }
    s.vocab = 400; // another tokenizer
    Path other = LlamaTesting.generate(s, tmp.resolve("m2"));
    try (ZooModel<String, DocumentScore> zm = LlamaTranslator.criteria(other, shared, String.class, 16).loadModel();
        Predictor<String, DocumentScore> p = zm.newPredictor()) {
      Exception e = org.junit.jupiter.api.Assertions.assertThrows(Exception.class, () -> p.predict(TEXT));
      Throwable c = e;
      while (c != null && !String.valueOf(c.getMessage()).contains("make one per checkpoint")) {
        c = c.getCause();
      }
      assertTrue(c != null, "the error says why: " + e);
    }
  }
}
