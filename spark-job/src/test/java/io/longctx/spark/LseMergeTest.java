package io.longctx.spark;

import static org.junit.jupiter.api.Assertions.assertArrayEquals;
import static org.junit.jupiter.api.Assertions.assertEquals;

import io.longctx.kernels.AttentionState;
import io.longctx.kernels.Seeds;
import java.util.ArrayList;
import java.util.Collections;
import java.util.List;
import java.util.Random;
import org.apache.spark.sql.Dataset;
import org.apache.spark.sql.Row;
import org.apache.spark.sql.RowFactory;
import org.apache.spark.sql.SparkSession;
import org.apache.spark.sql.types.DataTypes;
import org.apache.spark.sql.types.StructType;
import org.junit.jupiter.api.Test;

/**
 * lse_merge as a SQL function: equals AttentionState.mergeAll in chunk order over the chunks the query
 * sees, bit for bit, whatever the row order and partitioning; empty heads (lse -inf) are the identity
 * and wholly empty chunks are left out of the merge tree.
 */
class LseMergeTest {
  final SparkSession spark = TestSpark.get();

  @Test
  void sqlFunctionIsOrderIndependentAndEqualsMergeAll() {
    long seed = Seeds.forTest();
    Random r = new Random(seed);
    int heads = 3, dim = 5, groups = 6;
    StructType schema = new StructType().add("id", DataTypes.StringType).add("chunk", DataTypes.LongType)
        .add("key_count", DataTypes.LongType).add("lse", DataTypes.createArrayType(DataTypes.FloatType))
        .add("o", DataTypes.createArrayType(DataTypes.FloatType));
    List<Row> rows = new ArrayList<>();
    List<List<AttentionState>> expected = new ArrayList<>();
    int[] chunks = new int[groups];
    for (int g = 0; g < groups; g++) {
      int n = chunks[g] = 1 + r.nextInt(9);
      List<AttentionState> states = new ArrayList<>();
      for (int c = 0; c < n; c++) {
        float[] lse = new float[heads];
        float[] o = new float[heads * dim];
        // A wholly empty chunk (every head -inf) is one the query does not see: finish skips it, so the
        // merge tree is over the chunks seen. Group 0 always starts with one.
        boolean chunkEmpty = (g == 0 && c == 0) || r.nextInt(8) == 0;
        for (int h = 0; h < heads; h++) {
          boolean empty = chunkEmpty || r.nextInt(4) == 0;
          lse[h] = empty ? Float.NEGATIVE_INFINITY : (float) (r.nextGaussian() * 5);
          for (int d = 0; d < dim; d++) {
            o[h * dim + d] = empty ? 0f : (float) r.nextGaussian();
          }
        }
        // Heads drawn empty one by one can empty the whole chunk too (about 1 in 64): finish skips that alike.
        boolean seen = false;
        for (float l : lse) {
          seen |= l != Float.NEGATIVE_INFINITY;
        }
        if (seen) {
          states.add(AttentionState.of(o, lse, 1, heads, dim));
        }
        rows.add(RowFactory.create("g" + g, (long) c * 3, (long) c + 1, TestData.boxed(lse), TestData.boxed(o)));
      }
      expected.add(states);
    }
    LseMerge.register(spark);
    List<Row> first = null;
    for (int parts : new int[] {1, 4, 9}) {
      List<Row> shuffled = new ArrayList<>(rows);
      Collections.shuffle(shuffled, new Random(seed + parts));
      Dataset<Row> df = spark.createDataFrame(shuffled, schema).repartition(parts);
      df.createOrReplaceTempView("parts");
      List<Row> got = spark.sql("SELECT id, lse_merge(chunk, key_count, lse, o) AS m FROM parts GROUP BY id ORDER BY id")
          .collectAsList();
      assertEquals(groups, got.size());
      for (int g = 0; g < groups; g++) {
        Row m = got.get(g).getStruct(1);
        List<AttentionState> seen = expected.get(g);
        AttentionState want = seen.isEmpty() ? AttentionState.empty(1, heads, dim) : AttentionState.mergeAll(seen);
        int n = chunks[g];
        assertEquals((long) n * (n + 1) / 2, m.getLong(m.fieldIndex("keyCount")));
        assertArrayEquals(EndToEndTest.bits(want.lse()),
            EndToEndTest.bits(Demo.toFloats(m.getList(m.fieldIndex("lse")))), "lse (seed " + seed + ")");
        assertArrayEquals(EndToEndTest.bits(want.o()), EndToEndTest.bits(Demo.toFloats(m.getList(m.fieldIndex("o")))),
            "o (seed " + seed + ")");
      }
      first = got;
    }
    assertEquals(groups, first.size());
  }
}
