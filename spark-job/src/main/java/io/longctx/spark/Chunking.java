package io.longctx.spark;

import org.apache.spark.sql.Column;
import org.apache.spark.sql.functions;

/**
 * Key chunk c of a document holds the keys with positions in [c * chunkLen, (c + 1) * chunkLen):
 * c = floor(pos / chunkLen), for every long position. One rule, in Java for the tasks and as a
 * Spark column for the planner's aggregation; {@code ChunkingTest} checks they agree at the ends of
 * the long range with Spark's ANSI mode on and off.
 */
final class Chunking {
  private Chunking() {}

  /** floor(pos / chunkLen); chunkLen >= 1. */
  static long index(long pos, int chunkLen) {
    return Math.floorDiv(pos, chunkLen);
  }

  /**
   * The same over the long column {@code posColumn}: truncating {@code div}, minus one for a
   * negative remainder. Neither step can overflow for chunkLen >= 1 (pos - pmod(pos, n) does, near
   * Long.MIN_VALUE: an ANSI error, or without ANSI a wrong chunk).
   */
  static Column indexColumn(String posColumn, int chunkLen) {
    String p = "`" + posColumn + "`", n = chunkLen + "L";
    return functions.expr("(" + p + " div " + n + ") - (CASE WHEN " + p + " % " + n + " < 0L THEN 1L ELSE 0L END)");
  }
}
