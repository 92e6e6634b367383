package io.longctx.spark;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertFalse;
import static org.junit.jupiter.api.Assertions.assertTrue;

import java.nio.file.Files;
import java.nio.file.Path;
import java.util.List;
import org.junit.jupiter.api.Test;
import org.junit.jupiter.api.io.TempDir;

/** The input format taken from a path when --format is not given; a malformed line's number, a row without a field. */
class FormatsTest {
  @TempDir
  Path tmp;

  @Test
  void jsonLinesByExtensionGzippedOrNotElseParquet() {
    for (String p : new String[] {"a.json", "a.jsonl", "a.ndjson", "a.json.gz", "a.JSONL.GZ", "a.ndjson.gz", "dir/x.jsonl/"}) {
      assertEquals("json", Formats.resolve(null, p), p);
    }
    for (String p : new String[] {"a.parquet", "a.gz", "dir", "a.json.bz2", ""}) {
      assertEquals("parquet", Formats.resolve(null, p), p);
    }
    assertEquals("parquet", Formats.resolve("parquet", "a.json"), "an explicit format wins");
  }

  @Test
  void aMalformedLineIsFoundByItsWholeTextOrItsQuotedStart() throws Exception {
    String good = "{\"query_id\":\"doc-0/q-1\",\"doc_id\":\"doc-0\"}";
    String cutOff = "{\"query_id\":\"doc-0/q-"; // a last line cut mid-write: a prefix of line 1
    String longBad = "{\"q\": [" + "0.5, ".repeat(100) + "oops]}"; // quoted cut to 300 characters
    Path f = tmp.resolve("q.jsonl");
    Files.write(f, List.of(good, longBad, good, cutOff));
    String uri = f.toUri().toString();
    assertEquals(", line 4", Formats.lineOf(uri, Formats.malformedJson(cutOff)));
    assertEquals(", line 2", Formats.lineOf(uri, Formats.malformedJson(longBad)));
    assertEquals("", Formats.lineOf(uri, Formats.malformedJson("{not there")));
    assertEquals("", Formats.lineOf(tmp.resolve("absent.jsonl").toUri().toString(), Formats.malformedJson(good)));
    assertEquals("", Formats.lineOf(uri, "some other problem"));
  }

  static boolean lacksDocId(String line) {
    return Formats.rowWhere(line, row -> row.get("doc_id") == null);
  }

  /** A line whose row Spark reads with a field null: absent or null at the top level (the last one counts). */
  @Test
  void aRowWithoutAFieldIsToldByItsTopLevelFields() throws Exception {
    for (String l : new String[] {"{\"tokens\": [1]}", "{\"doc_id\": null}", "{\"meta\": {\"doc_id\": \"x\"}}",
        "{\"Doc_Id\": \"x\"}", "{\"doc_id\": \"x\", \"doc_id\": null}", "[{\"doc_id\": \"x\"}, {\"y\": 1}]",
        "{'pos': 1}"}) { // single quotes: Spark's reader takes them
      assertTrue(lacksDocId(l), l);
    }
    for (String l : new String[] {"{\"doc_id\": \"x\", \"t\": NaN}", "{\"doc_id\": 7}", "{\"doc_id\": {}}",
        "{\"doc_id\": null, \"doc_id\": \"x\"}", "", "  ", "not json", "{\"doc_id\"", "[{\"doc_id\": \"x\"}]", "5", "{'doc_id': 'x'}"}) {
      assertFalse(lacksDocId(l), l);
    }
    Path f = tmp.resolve("d.jsonl");
    Files.writeString(f, "{\"doc_id\": \"a\"}\r\n\r\n{\"doc_id\": \"b\"}\r{\"text\": \"doc_id\"}\n");
    assertEquals(", line 4", Formats.lineWhere(f.toUri().toString(), l -> lacksDocId(l)));
  }

  @Test
  void aParquetRowIsToldByItsIndexWithColumnNamesMatchedAsSparkMatchesThem() throws Exception {
    org.apache.spark.sql.SparkSession spark = TestSpark.get();
    List<org.apache.spark.sql.Row> rows = new java.util.ArrayList<>();
    for (int i = 0; i < 5; i++) {
      rows.add(org.apache.spark.sql.RowFactory.create(i == 3 ? null : "d" + i, (long) i));
    }
    org.apache.spark.sql.types.StructType schema = new org.apache.spark.sql.types.StructType()
        .add("Doc_Id", "string").add("pos", "long");
    Path dir = tmp.resolve("cased");
    spark.createDataFrame(rows, schema).coalesce(1).write().parquet(dir.toString());
    String file;
    try (var parts = Files.list(dir)) {
      file = parts.filter(p -> p.toString().endsWith(".parquet")).findFirst().orElseThrow().toUri().toString();
    }
    assertEquals(", row_index 3", Formats.lineOfRow(file, List.of("doc_id"), r -> r.get("doc_id") == null));
    assertEquals(", row_index 2", Formats.rowIndexWhere(file, List.of("pos", "doc_id"), r -> "2".equals(r.get("pos"))
        && "d2".equals(r.get("doc_id"))));
    assertEquals(", row_index 0", Formats.rowIndexWhere(file, List.of("query_id"), r -> r.get("query_id") == null),
        "a column the file lacks is null in every row");
    assertEquals("", Formats.rowIndexWhere(file, List.of("pos"), r -> "9".equals(r.get("pos"))));
    Path json = tmp.resolve("d.jsonl");
    Files.writeString(json, "{\"doc_id\": null}\n");
    assertEquals("", Formats.rowIndexWhere(json.toUri().toString(), List.of("doc_id"), r -> true), "not Parquet");
  }
}
