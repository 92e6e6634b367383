package io.longctx.spark;

import static org.junit.jupiter.api.Assertions.assertEquals;

import org.junit.jupiter.api.Test;

/** The input format taken from a path when --format is not given. */
class FormatsTest {
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
}
