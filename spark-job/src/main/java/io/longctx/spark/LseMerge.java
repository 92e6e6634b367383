package io.longctx.spark;

import io.longctx.kernels.AttentionState;
import java.util.ArrayList;
import java.util.Arrays;
import java.util.List;
import org.apache.spark.sql.Encoder;
import org.apache.spark.sql.Encoders;
import org.apache.spark.sql.SparkSession;
import org.apache.spark.sql.expressions.Aggregator;
import org.apache.spark.sql.expressions.UserDefinedFunction;
import org.apache.spark.sql.functions;

/**
 * The LSE-merge reduction as a Spark {@link Aggregator}: zero, reduce, merge, finish.
 *
 * <p>Spark calls reduce and merge in an order that depends on partitioning, task order and
 * retries, so they do no arithmetic: they only collect (chunk index, lse, o) entries. {@code finish}
 * sorts the entries by chunk index and merges them with {@link AttentionState#mergeAll} (a balanced
 * tree in that order, the one merge implementation of longctx). The merged bits therefore depend
 * only on the set of partial states, never on how Spark grouped them. A chunk index seen twice in
 * one group is an error (it would count keys twice). Memory: a group holds all its partials until
 * finish, i.e. (chunks visible to the query) x heads x (dim + 1) floats.
 *
 * <p>Registered as the SQL function {@code lse_merge(chunk, key_count, lse, o)} returning
 * {@code struct<keyCount: bigint, lse: array<float>, o: array<float>>}.
 */
public final class LseMerge extends Aggregator<StatePart, LseBuffer, MergedState> {
  private static final long serialVersionUID = 1L;

  public static final String SQL_NAME = "lse_merge";

  /** The aggregator as a column function over (chunk, key_count, lse, o). */
  public static UserDefinedFunction udaf() {
    return functions.udaf(new LseMerge(), Encoders.bean(StatePart.class));
  }

  /** Registers {@code lse_merge} with the session's SQL functions; returns it. */
  public static UserDefinedFunction register(SparkSession spark) {
    if (spark.catalog().functionExists(SQL_NAME)) {
      return udaf();
    }
    return spark.udf().register(SQL_NAME, udaf());
  }

  @Override
  public LseBuffer zero() {
    return new LseBuffer();
  }

  @Override
  public LseBuffer reduce(LseBuffer b, StatePart p) {
    float[] l = p.getLse();
    float[] x = p.getO();
    if (l == null || x == null || l.length == 0 || x.length % l.length != 0) {
      throw new IllegalArgumentException("lse_merge: bad partial state for chunk " + p.getChunk() + ": lse of "
          + (l == null ? "null" : l.length) + " floats, o of " + (x == null ? "null" : x.length) + " floats");
    }
    b.add(p.getChunk(), p.getKeyCount(), l, 0, x, 0, l.length, x.length);
    return b;
  }

  @Override
  public LseBuffer merge(LseBuffer a, LseBuffer b) {
    if (b.getSize() == 0) {
      return a;
    }
    long[] c = b.getChunks();
    float[] l = b.getLse();
    float[] x = b.getO();
    int h = b.getHeads(), w = b.getWidth();
    for (int i = 0; i < c.length; i++) {
      a.add(c[i], 0, l, i * h, x, i * w, h, w);
    }
    a.setKeyCount(a.getKeyCount() + b.getKeyCount());
    return a;
  }

  @Override
  public MergedState finish(LseBuffer b) {
    FaultHooks.at(FaultHooks.REDUCE); // test-only fault injection (runs after the shuffle), off by default
    int n = b.getSize();
    if (n == 0) {
      return null;
    }
    long[] c = b.getChunks();
    float[] l = b.getLse();
    float[] x = b.getO();
    int heads = b.getHeads(), width = b.getWidth(), dim = width / heads;
    Integer[] order = new Integer[n];
    for (int i = 0; i < n; i++) {
      order[i] = i;
    }
    Arrays.sort(order, (i, j) -> Long.compare(c[i], c[j]));
    List<AttentionState> states = new ArrayList<>(n);
    for (int r = 0; r < n; r++) {
      int i = order[r];
      if (r > 0 && c[i] == c[order[r - 1]]) {
        throw new IllegalStateException("lse_merge: chunk " + c[i] + " appears twice in one group");
      }
      if (seesNoKey(l, i * heads, heads)) {
        // A chunk paired with the query's block that this query does not see. Merging it is exact, but
        // it would reshape the merge tree, so the bits would depend on the other queries of the block
        // (--query-block); skipped, the tree is over exactly the chunks the query sees.
        continue;
      }
      states.add(AttentionState.of(Arrays.copyOfRange(x, i * width, (i + 1) * width),
          Arrays.copyOfRange(l, i * heads, (i + 1) * heads), 1, heads, dim));
    }
    AttentionState m = states.isEmpty() ? AttentionState.empty(1, heads, dim) : AttentionState.mergeAll(states);
    return new MergedState(b.getKeyCount(), m.lse(), m.o());
  }

  /** Whether every head's lse is -inf: the empty state, the merge's identity. */
  private static boolean seesNoKey(float[] lse, int from, int heads) {
    for (int h = 0; h < heads; h++) {
      if (lse[from + h] != Float.NEGATIVE_INFINITY) {
        return false;
      }
    }
    return true;
  }

  @Override
  public Encoder<LseBuffer> bufferEncoder() {
    return Encoders.bean(LseBuffer.class);
  }

  @Override
  public Encoder<MergedState> outputEncoder() {
    return Encoders.bean(MergedState.class);
  }
}
