package io.longctx.spark;

import static org.junit.jupiter.api.Assertions.assertArrayEquals;
import static org.junit.jupiter.api.Assertions.assertEquals;

import io.longctx.kernels.AttentionState;
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
 * lse_merge as a SQL function: equals AttentionState.mergeAll in chunk order, bit for bit, whatever
 * the row order and partitioning; empty states (lse -inf) are the identity.
 */
class LseMergeTest {
  final SparkSession spark = TestSpark.get();

  @Test
  void sqlFunctionIsOrderIndependentAndEqualsMergeAll() {
    long seed = System.nanoTime();
    Random r = new Random(seed);
    int heads = 3, dim = 5, groups = 6;
    StructType schema = new StructType().add("id", DataTypes.StringType).add("chunk", DataTypes.LongType)
        .add("key_count", DataTypes.LongType).add("lse", DataTypes.createArrayType(DataTypes.FloatType))
        .add("o", DataTypes.createArrayType(DataTypes.FloatType));
    List<Row> rows = new ArrayList<>();
    List<List<AttentionState>> expected = new ArrayList<>();
    for (int g = 0; g < groups; g++) {
      int n = 1 + r.nextInt(9);
      List<AttentionState> states = new ArrayList<>();
      for (int c = 0; c < n; c++) {
        float[] lse = new float[heads];
        float[] o = new float[heads * dim];
        for (int h = 0; h < heads; h++) {
          boolean empty = r.nextInt(4) == 0;
          lse[h] = empty ? Float.NEGATIVE_INFINITY : (float) (r.nextGaussian() * 5);
          for (int d = 0; d < dim; d++) {
            o[h * dim + d] = empty ? 0f : (float) r.nextGaussian();
          }
        }
        states.add(AttentionState.of(o, lse, 1, heads, dim));
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
        AttentionState want = AttentionState.mergeAll(expected.get(g));
        int n = expected.get(g).size();
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
