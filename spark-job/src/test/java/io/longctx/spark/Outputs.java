package io.longctx.spark;

import java.nio.file.Path;
import java.util.HashMap;
import java.util.List;
import java.util.Map;
import org.apache.spark.sql.Row;
import org.apache.spark.sql.SparkSession;
import org.apache.spark.sql.types.DataTypes;
import org.apache.spark.sql.types.StructType;

/** Reads an OUT directory into key -> result (key: query_id, or doc_id@pos in prefill). */
final class Outputs {
  record Result(float[] o, float[] lse, long nKeys) {}

  static Map<String, Result> read(SparkSession spark, Path out, String fmt, boolean prefill) {
    Map<String, Result> m = new HashMap<>();
    // JSON has no infinity: Spark writes -Infinity as a string, and reads it back as a float with a schema.
    StructType schema = prefill
        ? new StructType().add("doc_id", DataTypes.StringType).add("pos", DataTypes.LongType)
        : new StructType().add("query_id", DataTypes.StringType).add("doc_id", DataTypes.StringType);
    schema = schema.add("o", DataTypes.createArrayType(DataTypes.FloatType))
        .add("lse", DataTypes.createArrayType(DataTypes.FloatType)).add("n_keys", DataTypes.LongType);
    List<Row> rows = (fmt.equals("json") ? spark.read().schema(schema).json(out.toString())
        : spark.read().format(fmt).load(out.toString())).collectAsList();
    for (Row r : rows) {
      String key = prefill ? r.getAs("doc_id") + "@" + r.<Long>getAs("pos") : r.getAs("query_id");
      Result prev = m.put(key, new Result(Demo.toFloats(r.getList(r.fieldIndex("o"))),
          Demo.toFloats(r.getList(r.fieldIndex("lse"))), r.<Long>getAs("n_keys")));
      if (prev != null) {
        throw new AssertionError("duplicate output row " + key);
      }
    }
    return m;
  }

  private Outputs() {}
}
