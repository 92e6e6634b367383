package io.longctx.spark;

import io.longctx.kernels.AttentionOptions;
import java.io.Serializable;

/** Options of {@code longctx score}; see {@link LongctxMain#SCORE_HELP}. */
public final class ScoreOptions implements Serializable {
  private static final long serialVersionUID = 1L;

  public enum Mode { DECODE, PREFILL }

  public String keys;
  public String queries;
  public String output;
  /** parquet or json, both inputs; null: from each input path's own extension, else parquet. */
  public String format;
  /** parquet or json; null: the format of KEYS. */
  public String outputFormat;
  public int heads;
  public int kvHeads;
  public int dim;
  public double scale = Double.NaN;
  public float softcap;
  public boolean causal;
  public long window;
  public int chunkLen = 4096;
  public int queryBlock = 64;
  /** Shuffle partitions; 0: Spark's setting. */
  public int partitions;
  public Mode mode = Mode.DECODE;
  public boolean overwrite;
  /** auto, cpu, cuda or another registered provider's name; null: -Dlongctx.backend, else auto. */
  public String backend;

  public AttentionOptions attention() {
    return new AttentionOptions(scale, softcap, causal, window);
  }

  /** The format KEYS is read in. */
  public String resolvedFormat() {
    return Formats.resolve(format, keys);
  }

  /** The format QUERIES is read in: its own name's, not KEYS' (a Parquet corpus, JSON queries). */
  public String queriesFormat() {
    return Formats.resolve(format, queries);
  }

  /** The format OUT is written in: --output-format, else KEYS' format. */
  public String resolvedOutputFormat() {
    return outputFormat != null ? outputFormat : resolvedFormat();
  }

  public void check() {
    if (keys == null) {
      throw new IllegalArgumentException("--keys is required");
    }
    if (output == null) {
      throw new IllegalArgumentException("--output is required");
    }
    if (mode == Mode.DECODE && queries == null) {
      throw new IllegalArgumentException("--queries is required in decode mode");
    }
    if (mode == Mode.PREFILL && queries != null) {
      throw new IllegalArgumentException("--queries is not used in prefill mode (KEYS rows carry q)");
    }
    Formats.check("--format", format);
    Formats.check("--output-format", outputFormat);
    if (chunkLen < 1) {
      throw new IllegalArgumentException("--chunk-len must be >= 1, got " + chunkLen);
    }
    if (queryBlock < 1) {
      throw new IllegalArgumentException("--query-block must be >= 1, got " + queryBlock);
    }
    if (heads < 0 || kvHeads < 0 || dim < 0 || partitions < 0) {
      throw new IllegalArgumentException("--heads, --kv-heads, --dim and --partitions must be >= 1 (0 here: not given, inferred)");
    }
    if (window < 0) { // said as the option (the kernels' own check names their parameter)
      throw new IllegalArgumentException("--window must be >= 0 (0: no window), got " + window);
    }
    attention(); // validates scale, softcap
  }
}
