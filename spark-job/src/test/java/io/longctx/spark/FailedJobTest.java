package io.longctx.spark;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertFalse;
import static org.junit.jupiter.api.Assertions.assertTrue;

import java.io.ByteArrayOutputStream;
import java.io.PrintStream;
import java.nio.ByteBuffer;
import java.nio.ByteOrder;
import java.nio.channels.FileChannel;
import java.nio.file.Files;
import java.nio.file.Path;
import java.nio.file.StandardOpenOption;
import java.util.Arrays;
import java.util.List;
import java.util.stream.Stream;
import org.apache.spark.SparkConf;
import org.apache.spark.SparkEnv;
import org.apache.spark.sql.SparkSession;
import org.junit.jupiter.api.Test;
import org.junit.jupiter.api.io.TempDir;

/**
 * Jobs that cannot succeed (docs/RELIABILITY.md), in-process on local[2]: a KEYS part file whose
 * data pages are corrupt (the footer is intact, so the job starts and a task fails reading it), and
 * a task failure injected in the output-writing stage. Exit status 1, and nothing that looks like
 * output: no OUT, no temp directory, no _SUCCESS. (Driver and executor loss on a real cluster:
 * FaultToleranceTest.)
 */
class FailedJobTest {
  @TempDir
  Path tmp;

  final SparkSession spark = TestSpark.get();

  TestData data() {
    return new TestData(5, 2, 1, 8).doc("a", 120, 0, 1).doc("b", 80, 7, 3).randomQueries(3);
  }

  String score(Path keys, Path queries, int expectRc) throws Exception {
    Path out = tmp.resolve("out");
    ByteArrayOutputStream err = new ByteArrayOutputStream();
    int rc = LongctxMain.run(new String[] {"score", "--keys", keys.toString(), "--queries", queries.toString(),
        "--output", out.toString(), "--dim", "8", "--causal", "--chunk-len", "16"}, System.out, new PrintStream(err,
        true));
    String msg = err.toString();
    assertEquals(expectRc, rc, msg);
    assertFalse(Files.exists(out), "no OUT after a failed job");
    try (Stream<Path> s = Files.walk(tmp)) {
      for (Path p : s.toList()) {
        assertFalse(p.getFileName().toString().contains("-tmp-"), "temp output left behind: " + p);
        assertFalse(p.getFileName().toString().equals("_SUCCESS") && !p.startsWith(keys) && !p.startsWith(queries),
            "a _SUCCESS marker outside the inputs: " + p);
      }
    }
    return msg;
  }

  @Test
  void corruptKeysFileFailsTheJobWithoutOutput() throws Exception {
    TestData d = data();
    Path keys = d.writeKeys(spark, tmp, "parquet", false);
    Path queries = d.writeQueries(spark, tmp, "parquet");
    List<Path> parts;
    try (Stream<Path> s = Files.list(keys)) {
      parts = s.filter(p -> p.getFileName().toString().startsWith("part-")).sorted().toList();
    }
    assertTrue(parts.size() >= 2, "several part files: " + parts);
    // Overwrite the data pages of the last part; its footer (schema) stays readable. Its Hadoop checksum file
    // goes first: with it, the read stops at the checksum (exit 2 naming the file: BadInputTest), not in Parquet.
    Path victim = parts.get(parts.size() - 1);
    Files.delete(victim.resolveSibling("." + victim.getFileName() + ".crc"));
    try (FileChannel ch = FileChannel.open(victim, StandardOpenOption.READ, StandardOpenOption.WRITE)) {
      long len = ch.size();
      ByteBuffer tail = ByteBuffer.allocate(8).order(ByteOrder.LITTLE_ENDIAN);
      ch.read(tail, len - 8);
      int footer = tail.getInt(0);
      byte[] junk = new byte[(int) (len - 8 - footer - 4)];
      Arrays.fill(junk, (byte) 0x5A);
      ch.write(ByteBuffer.wrap(junk), 4);
    }
    String msg = score(keys, queries, 1);
    assertTrue(msg.contains("longctx score: failed"), msg);
  }

  @Test
  void taskFailureInTheWriteStageLeavesNoOutput() throws Exception {
    TestData d = data();
    Path keys = d.writeKeys(spark, tmp, "parquet", false);
    Path queries = d.writeQueries(spark, tmp, "parquet");
    // local[2] runs each task once: one injected failure in the reduce (output-writing) stage fails the job
    // after other tasks may have written their parts into the hidden temp directory.
    SparkConf conf = SparkEnv.get().conf();
    conf.set(FaultHooks.FAIL_FIRST_ATTEMPTS, "1");
    conf.set(FaultHooks.FAIL_STAGE, FaultHooks.REDUCE);
    try {
      // The Spark properties alone do nothing: the hooks need the JVM property too.
      assertEquals(0, LongctxMain.run(new String[] {"score", "--keys", keys.toString(), "--queries", queries.toString(),
          "--output", tmp.resolve("unarmed").toString(), "--dim", "8", "--causal", "--chunk-len", "16"}, System.out,
          System.err), "hooks off without " + FaultHooks.ENABLE_PROPERTY);
      try (Stream<Path> s = Files.walk(tmp.resolve("unarmed"))) {
        s.sorted(java.util.Comparator.reverseOrder()).forEach(p -> p.toFile().delete());
      }
      System.setProperty(FaultHooks.ENABLE_PROPERTY, "true");
      String msg = score(keys, queries, 1);
      assertTrue(msg.contains("injected test failure"), msg);
    } finally {
      System.clearProperty(FaultHooks.ENABLE_PROPERTY);
      conf.remove(FaultHooks.FAIL_FIRST_ATTEMPTS);
      conf.remove(FaultHooks.FAIL_STAGE);
    }
  }
}
