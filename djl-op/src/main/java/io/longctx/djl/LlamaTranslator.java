package io.longctx.djl;

import ai.djl.huggingface.tokenizers.Encoding;
import ai.djl.huggingface.tokenizers.HuggingFaceTokenizer;
import ai.djl.ndarray.NDArray;
import ai.djl.ndarray.NDList;
import ai.djl.repository.zoo.Criteria;
import ai.djl.translate.NoBatchifyTranslator;
import ai.djl.translate.TranslatorContext;
import java.io.IOException;
import java.nio.file.Files;
import java.nio.file.Path;
import java.util.Objects;

/**
 * The DJL way to score documents with a Llama-family checkpoint: a {@link ai.djl.translate.Translator}
 * from text (tokenized by the checkpoint's {@code tokenizer.json} with its own special-token rules)
 * or from token ids (scored exactly as given) to a {@link DocumentScore} with per-token
 * log-probabilities, for a {@link LlamaModel} block loaded through {@link Criteria}:
 *
 * <pre>{@code
 * Criteria<String, DocumentScore> c = LlamaTranslator.textCriteria(Path.of("ckpt"));
 * try (ZooModel<String, DocumentScore> model = c.loadModel();
 *     Predictor<String, DocumentScore> p = model.newPredictor()) {
 *   DocumentScore s = p.predict("some long document ...");
 *   double ppl = s.perplexity();
 * }
 * }</pre>
 *
 * Offline: nothing is downloaded (run with {@code -Dai.djl.offline=true}); the tokenizer's native
 * library comes from the tokenizers jar. The weights are read from the model directory in
 * {@link #prepare}, since DJL's PyTorch engine reads only its own parameter files.
 */
public final class LlamaTranslator<I> implements NoBatchifyTranslator<I, DocumentScore> {

  private static final String N_TOKENS = "longctx.nTokens";

  private final Class<I> type;
  /** Opened by the first predictor's prepare and shared by the later ones (of the same checkpoint). */
  private volatile HuggingFaceTokenizer tokenizer;
  private Path tokenizerDir;

  private LlamaTranslator(Class<I> type) {
    this.type = type;
  }

  /** Text in, tokenized with the checkpoint's tokenizer.json. */
  public static LlamaTranslator<String> text() {
    return new LlamaTranslator<>(String.class);
  }

  /** Token ids in, scored exactly as given. */
  public static LlamaTranslator<int[]> tokens() {
    return new LlamaTranslator<>(int[].class);
  }

  /** Criteria for text input over a checkpoint directory, PyTorch engine, default chunk length. */
  public static Criteria<String, DocumentScore> textCriteria(Path dir) {
    return criteria(dir, text(), String.class, LlamaModel.DEFAULT_CHUNK_LEN);
  }

  /** Criteria for token-id input over a checkpoint directory. */
  public static Criteria<int[], DocumentScore> tokenCriteria(Path dir) {
    return criteria(dir, tokens(), int[].class, LlamaModel.DEFAULT_CHUNK_LEN);
  }

  /** Criteria with a chosen translator and chunk length. */
  public static <T> Criteria<T, DocumentScore> criteria(Path dir, LlamaTranslator<T> translator, Class<T> type,
      int chunkLen) {
    // A block factory, not optBlock(instance): each model loaded from the Criteria gets a block of its own,
    // its weights on that model's manager. One shared block took the first model's weights into every
    // later one, and lost them when the first was closed ("NDManager has been closed already").
    ai.djl.nn.BlockFactory blocks = (model, path, arguments) -> new LlamaModel(chunkLen);
    return Criteria.builder().setTypes(type, DocumentScore.class).optModelPath(dir).optEngine("PyTorch")
        .optArgument("blockFactory", blocks)
        // Our weights are safetensors, read in prepare(): the engine must not look for a .params file.
        .optOption("hasParameter", "false")
        .optTranslator(translator).build();
  }

  /** Where a checkpoint keeps its tokenizer (tokenizer.json in its directory). */
  public static Path tokenizerFile(Path dir) {
    return dir.resolve("tokenizer.json");
  }

  /** Opens a checkpoint's tokenizer.json: special tokens as its post-processor says, no truncation or padding. */
  public static HuggingFaceTokenizer openTokenizer(Path dir) throws IOException {
    Path file = tokenizerFile(dir);
    if (!Files.isRegularFile(file)) {
      throw new IllegalArgumentException(file + ": no tokenizer.json in the checkpoint directory");
    }
    try {
      return HuggingFaceTokenizer.builder().optTokenizerPath(file).optAddSpecialTokens(true).optTruncation(false)
          .optPadding(false).build();
    } catch (RuntimeException e) { // the tokenizers library's parse error names neither the file nor the cause's kind
      throw new IllegalArgumentException(file + ": not a valid tokenizer.json: " + e.getMessage(), e);
    }
  }

  /** Token ids of a text, as int[]. */
  public static int[] encode(HuggingFaceTokenizer tok, String text) {
    Encoding e = tok.encode(text);
    long[] ids = e.getIds();
    int[] out = new int[ids.length];
    for (int i = 0; i < ids.length; i++) {
      out[i] = Math.toIntExact(ids[i]);
    }
    return out;
  }

  @Override
  public void prepare(TranslatorContext ctx) throws Exception {
    if (!(ctx.getBlock() instanceof LlamaModel m)) {
      throw new IllegalStateException("LlamaTranslator needs a LlamaModel block, got " + ctx.getBlock());
    }
    Path dir = ctx.getModel().getModelPath();
    if (dir == null && !m.isLoaded()) {
      throw new IllegalStateException("LlamaTranslator needs a checkpoint: a model with a path (Criteria.optModelPath, "
          + "as LlamaTranslator.criteria sets it) or an already loaded LlamaModel block");
    }
    synchronized (m) {
      if (!m.isLoaded()) {
        m.loadCheckpoint(dir, ctx.getModel().getNDManager());
      }
    }
    if (type == String.class) {
      // One translator serves every predictor of its model: the tokenizer is opened once (a
      // predictor each would leak the native tokenizer it replaced).
      synchronized (this) {
        if (tokenizer == null) {
          tokenizer = openTokenizer(dir);
          tokenizerDir = dir;
        } else if (!tokenizerDir.equals(dir)) { // its tokenizer would be the other checkpoint's
          throw new IllegalStateException("this LlamaTranslator serves the checkpoint " + tokenizerDir
              + ", not " + dir + ": make one per checkpoint (LlamaTranslator.text())");
        }
      }
    }
  }

  @Override
  public NDList processInput(TranslatorContext ctx, I input) {
    Objects.requireNonNull(input, "input");
    int[] ids = type == String.class ? encode(tokenizer, (String) input) : (int[]) input;
    ctx.setAttachment(N_TOKENS, ids.length);
    return new NDList(ctx.getNDManager().create(ids));
  }

  @Override
  public DocumentScore processOutput(TranslatorContext ctx, NDList list) {
    NDArray lp = list.get(0);
    float[] logprobs = lp.toFloatArray();
    return new DocumentScore((Integer) ctx.getAttachment(N_TOKENS), list.get(1).toDoubleArray()[0], logprobs);
  }
}
