package io.longctx.spark;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertFalse;
import static org.junit.jupiter.api.Assertions.assertTrue;

import java.io.ByteArrayOutputStream;
import java.io.File;
import java.io.IOException;
import java.io.PrintStream;
import java.nio.file.Files;
import java.nio.file.Path;
import java.util.ArrayList;
import java.util.List;
import java.util.Map;
import java.util.TreeMap;
import java.util.concurrent.TimeUnit;
import java.util.stream.Stream;
import org.apache.spark.sql.SparkSession;
import org.junit.jupiter.api.BeforeEach;
import org.junit.jupiter.api.Test;
import org.junit.jupiter.api.Timeout;
import org.junit.jupiter.api.io.TempDir;

/**
 * What {@code --output} / {@code --overwrite} may touch (docs/RELIABILITY.md, "Output"): refusals
 * leave every file as it was; a replace leaves OUT either the old or the new output, complete,
 * also when a step of the swap fails (the test-only commit fault property) or the driver dies
 * between the two renames (a child JVM halted there).
 */
class OutputCommitTest {
  @TempDir
  Path tmp;

  final SparkSession spark = TestSpark.get();
  Path keys, queries;

  @BeforeEach
  void corpus() {
    TestData d = new TestData(5, 2, 1, 8).doc("a", 40, 0, 1).query("q1", "a", 20L).query("q2", "a", 3L);
    keys = d.writeKeys(spark, tmp, "parquet", false);
    queries = d.writeQueries(spark, tmp, "parquet");
  }

  String[] args(Path out, boolean overwrite, String... more) {
    List<String> a = new ArrayList<>(List.of("score", "--keys", keys.toString(), "--queries", queries.toString(),
        "--output", out.toString(), "--dim", "8", "--causal", "--chunk-len", "16"));
    if (overwrite) {
      a.add("--overwrite");
    }
    a.addAll(List.of(more));
    return a.toArray(String[]::new);
  }

  record Outcome(int rc, String err) {}

  static Outcome run(String[] args) {
    ByteArrayOutputStream err = new ByteArrayOutputStream();
    int rc = LongctxMain.run(args, System.out, new PrintStream(err, true));
    return new Outcome(rc, err.toString());
  }

  /** Runs with the test-only commit fault set for this run alone. */
  static Outcome runWithCommitFault(String fault, String[] args) {
    System.setProperty(OutputCommit.FAULT_PROPERTY, fault);
    try {
      return run(args);
    } finally {
      System.clearProperty(OutputCommit.FAULT_PROPERTY);
    }
  }

  /** Every file under dir (relative path -> content), to show nothing changed. */
  static Map<String, String> snapshot(Path dir) throws IOException {
    Map<String, String> m = new TreeMap<>();
    if (Files.isRegularFile(dir)) {
      m.put("", Files.readString(dir, java.nio.charset.StandardCharsets.ISO_8859_1));
      return m;
    }
    try (Stream<Path> s = Files.walk(dir)) {
      for (Path p : s.filter(Files::isRegularFile).toList()) {
        m.put(dir.relativize(p).toString(), Files.readString(p, java.nio.charset.StandardCharsets.ISO_8859_1));
      }
    }
    return m;
  }

  List<String> hidden() throws IOException {
    try (Stream<Path> s = Files.list(tmp)) {
      return s.map(p -> p.getFileName().toString()).filter(n -> n.startsWith(".")).sorted().toList();
    }
  }

  void assertRefused(Outcome o, Path keep, Map<String, String> before, String... fragments) throws IOException {
    assertEquals(2, o.rc(), o.err());
    for (String f : fragments) {
      assertTrue(o.err().contains(f), "message should contain '" + f + "': " + o.err());
    }
    assertEquals(before, snapshot(keep), "refused, and nothing of " + keep + " changed");
    assertEquals(List.of(), hidden(), "no staging directory left behind");
  }

  /** A failed run removes the folders it made for OUT (left behind empty before), and only empty ones it made. */
  @Test
  void aFailedRunLeavesNoFoldersItMade() throws Exception {
    org.apache.hadoop.conf.Configuration conf = spark.sparkContext().hadoopConfiguration();
    Path out = tmp.resolve("new1").resolve("new2").resolve("out");
    OutputCommit c = OutputCommit.prepare(conf, out.toString(), false, "score", Map.of("KEYS", keys.toString()));
    Files.createDirectories(Path.of(c.staging().toUri()).resolve("part")); // as the write makes it
    c.abort();
    assertFalse(Files.exists(tmp.resolve("new1")), "new1 and new2 were made for OUT: gone");
    assertTrue(Files.isDirectory(tmp));
    // A made folder that holds something else by then is left, with what it holds.
    c = OutputCommit.prepare(conf, out.toString(), false, "score", Map.of("KEYS", keys.toString()));
    Files.createDirectories(Path.of(c.staging().toUri()));
    Files.writeString(tmp.resolve("new1").resolve("notes.txt"), "mine");
    c.abort();
    assertEquals(List.of("notes.txt"), names(tmp.resolve("new1")));
  }

  static List<String> names(Path dir) throws IOException {
    try (Stream<Path> s = Files.list(dir)) {
      return s.map(p -> p.getFileName().toString()).sorted().toList();
    }
  }

  @Test
  void aDirectoryOfSomeoneElsesFilesIsNeverReplaced() throws Exception {
    Path mine = tmp.resolve("mine");
    Files.createDirectories(mine.resolve("sub"));
    Files.writeString(mine.resolve("notes.txt"), "precious");
    Files.writeString(mine.resolve("sub/part-00000.txt"), "also precious");
    Map<String, String> before = snapshot(mine);
    assertRefused(run(args(mine, true)), mine, before, "is not a longctx output", "_LONGCTX", mine.toString());
    assertRefused(run(args(mine, false)), mine, before, "exists", "--overwrite");
    Path file = tmp.resolve("a-file");
    Files.writeString(file, "not a directory");
    assertRefused(run(args(file, true)), file, Map.of("", "not a directory"), "is a file");
  }

  @Test
  void anInputOrWhatHoldsOneIsNeverTheOutput() throws Exception {
    Map<String, String> before = snapshot(tmp);
    assertRefused(run(args(keys, true)), keys, snapshot(keys), "is KEYS");
    assertRefused(run(args(queries, true)), queries, snapshot(queries), "is QUERIES");
    assertRefused(run(args(tmp, true)), tmp, before, "contains KEYS");
    assertRefused(run(args(keys.resolve("inner"), true)), keys, snapshot(keys), "is inside KEYS");
    // By real path: a link to the inputs' directory is that directory.
    Path link = Files.createSymbolicLink(tmp.resolve("link"), tmp);
    assertRefused(run(args(link.resolve(keys.getFileName()), true)), keys, snapshot(keys), "is KEYS");
    Files.delete(link);
  }

  @Test
  void aPreviousOutputIsReplacedButNotWithAForeignFileInIt() throws Exception {
    Path out = tmp.resolve("out");
    assertEquals(0, run(args(out, false)).rc());
    assertTrue(Files.isRegularFile(out.resolve(OutputCommit.MARKER)), "the marker is written");
    Map<String, Outputs.Result> first = Outputs.read(spark, out, "parquet", false);
    Outcome o = run(args(out, true, "--window", "4"));
    assertEquals(0, o.rc(), o.err());
    assertEquals(List.of(), hidden(), "nothing left beside OUT");
    Map<String, Outputs.Result> second = Outputs.read(spark, out, "parquet", false);
    assertEquals(first.keySet(), second.keySet());
    assertTrue(second.get("q1").nKeys() == 4 && first.get("q1").nKeys() == 21, "OUT holds the new result");

    Files.writeString(out.resolve("my-notes.txt"), "mine");
    assertRefused(run(args(out, true)), out, snapshot(out), "holds a file longctx did not write (my-notes.txt)");
  }

  /** Only Spark's own part names count as ours: --overwrite deleted a user's "part-my-notes.txt" before. */
  @Test
  void onlySparksPartNamesAreOurs() {
    for (String own : List.of("part-00000-4565989e-12d8-4eb4-8d6f-19e846a7bdd8-c000.json",
        "part-00011-cbd7c8df-11ce-419e-92d6-24496147af24-c000.snappy.parquet",
        ".part-00000-cbd7c8df-11ce-419e-92d6-24496147af24-c000.snappy.parquet.crc", "_SUCCESS", "._SUCCESS.crc",
        OutputCommit.MARKER)) {
      assertTrue(OutputCommit.OWN_FILE.matcher(own).matches(), own);
    }
    for (String foreign : List.of("part-my-notes.txt", "part-0.jsonl", ".part-notes.crc", "part-00000.json",
        "my-notes.txt", "_SUCCESS.bak")) {
      assertTrue(!OutputCommit.OWN_FILE.matcher(foreign).matches(), foreign);
    }
  }

  @Test
  void aFailedMoveInPutsTheOldOutputBack() throws Exception {
    assertFailedCommitKeepsTheOldOutput("fail-after-aside", "the previous output is back in");
  }

  /** An --overwrite run whose commit fails (the fault given): exit 1 with the message, the old OUT as it was, nothing beside it. */
  void assertFailedCommitKeepsTheOldOutput(String fault, String... fragments) throws Exception {
    Path out = tmp.resolve("out");
    assertEquals(0, run(args(out, false)).rc());
    Map<String, String> old = snapshot(out);
    Outcome o = runWithCommitFault(fault, args(out, true, "--window", "4"));
    assertEquals(1, o.rc(), o.err());
    for (String f : fragments) {
      assertTrue(o.err().contains(f), "message should contain '" + f + "': " + o.err());
    }
    assertEquals(old, snapshot(out), "the old OUT, complete and unchanged");
    assertEquals(List.of(), hidden(), "no staging directory (with or without a marker) left behind");
  }

  @Test
  void whenTheOldOutputCannotComeBackBothAreKeptAndNamed() throws Exception {
    Path out = tmp.resolve("out");
    assertEquals(0, run(args(out, false)).rc());
    Map<String, String> old = snapshot(out);
    Outcome o = runWithCommitFault("fail-restore", args(out, true, "--window", "4"));
    assertEquals(1, o.rc(), o.err());
    assertFalse(Files.exists(out));
    assertBothComplete(old, o.err());
  }

  /** The driver dies between moving OUT aside and moving the new result in: a JVM halted there. */
  @Test
  @Timeout(value = 180, unit = TimeUnit.SECONDS)
  void aDriverDeathBetweenTheRenamesLeavesBothComplete() throws Exception {
    Path out = tmp.resolve("out");
    assertEquals(0, run(args(out, false)).rc());
    Map<String, String> old = snapshot(out);
    List<String> cmd = new ArrayList<>(List.of(Path.of(System.getProperty("java.home"), "bin", "java").toString()));
    cmd.addAll(LocalClusterTest.ManagementFlags.jvmFlags());
    cmd.addAll(List.of("-Xmx512m", "-XX:TieredStopAtLevel=1", "-D" + OutputCommit.FAULT_PROPERTY + "=halt-after-aside",
        "-cp", System.getProperty("java.class.path"), LongctxMain.class.getName()));
    cmd.addAll(List.of(args(out, true, "--window", "4", "--master", "local[1]", "--conf", "spark.ui.enabled=false")));
    Path log = tmp.getParent().resolve(tmp.getFileName() + "-halted-driver.log");
    ProcessBuilder pb = new ProcessBuilder(cmd).redirectErrorStream(true).redirectOutput(log.toFile());
    pb.environment().put("SPARK_LOCAL_IP", "127.0.0.1");
    Process p = pb.start();
    try {
      assertTrue(p.waitFor(150, TimeUnit.SECONDS), "the driver did not end");
    } finally {
      p.destroyForcibly();
    }
    String driverLog = Files.readString(log);
    Files.deleteIfExists(log);
    assertEquals(137, p.exitValue(), LocalClusterTest.tail(driverLog));
    assertFalse(Files.exists(out), "no OUT in the instant between the renames");
    assertBothComplete(old, null);
  }

  /** The old output moved aside and the new one staged, each complete with its marker. */
  void assertBothComplete(Map<String, String> old, String message) throws IOException {
    List<String> h = hidden();
    assertEquals(2, h.size(), "the old and the new output beside OUT: " + h);
    Path aside = tmp.resolve(h.stream().filter(n -> n.startsWith(".out-old-")).findFirst().orElseThrow());
    Path staged = tmp.resolve(h.stream().filter(n -> n.startsWith(".out-tmp-")).findFirst().orElseThrow());
    assertEquals(old, snapshot(aside), "the previous output, complete");
    assertTrue(Files.exists(staged.resolve("_SUCCESS")) && Files.exists(staged.resolve(OutputCommit.MARKER)),
        "the new result, complete");
    assertEquals(4, Outputs.read(spark, staged, "parquet", false).get("q1").nKeys(), "the new result's content");
    if (message != null) {
      assertTrue(message.contains(aside.getFileName().toString()) && message.contains(staged.getFileName().toString()),
          "the error names both: " + message);
    }
  }

  @Test
  void genRefusesToReplaceWhatItDidNotWrite() throws Exception {
    Path dir = tmp.resolve("corpus");
    Files.createDirectories(dir.resolve("keys.parquet"));
    Files.writeString(dir.resolve("keys.parquet").resolve("data.csv"), "1,2,3");
    Map<String, String> before = snapshot(dir);
    Outcome o = run(new String[] {"gen", "--docs", "1", "--tokens", "20", "--output", dir.toString(), "--overwrite"});
    assertEquals(2, o.rc(), o.err());
    assertTrue(o.err().contains("is not a longctx output"), o.err());
    assertEquals(before, snapshot(dir));
    Path fresh = tmp.resolve("fresh");
    assertEquals(0, run(new String[] {"gen", "--docs", "1", "--tokens", "20", "--output", fresh.toString()}).rc());
    assertEquals(0, run(new String[] {"gen", "--docs", "1", "--tokens", "30", "--output", fresh.toString(),
        "--overwrite"}).rc(), "gen replaces its own earlier output");
    assertEquals(30, spark.read().parquet(fresh.resolve("keys.parquet").toString()).count());
    assertTrue(new File(fresh.resolve("queries.parquet").toString(), OutputCommit.MARKER).exists());
  }

  /** A file of the input replaced, grown or removed while the job ran: refused at commit (a run mixed two versions before). */
  @Test
  void anInputThatChangesDuringTheJobIsRefusedAtCommit() throws Exception {
    org.apache.hadoop.conf.Configuration conf = spark.sparkContext().hadoopConfiguration();
    Path in = Files.createDirectories(tmp.resolve("in"));
    Path part = Files.writeString(in.resolve("part-0.jsonl"), "{}\n");
    Files.writeString(in.resolve("part-1.jsonl"), "{}\n");
    Path out = tmp.resolve("out");
    for (String change : List.of("grown", "touched", "disappeared", "files added")) {
      OutputCommit c = OutputCommit.prepare(conf, out.toString(), false, "score", Map.of("KEYS", in.toString()));
      Path staged = Files.createDirectories(Path.of(c.staging().toUri()));
      Files.writeString(staged.resolve("_SUCCESS"), "");
      switch (change) {
        case "grown" -> Files.writeString(part, "{}\n{}\n");
        case "touched" -> Files.setLastModifiedTime(part, java.nio.file.attribute.FileTime.fromMillis(
            Files.getLastModifiedTime(part).toMillis() + 10_000));
        case "disappeared" -> Files.delete(in.resolve("part-1.jsonl"));
        default -> { // Spark lists an input before reading it (a new file is not read) and skips these names
          Files.writeString(in.resolve("part-2.jsonl"), "{}\n");
          Files.writeString(in.resolve("_SUCCESS"), "");
          Files.writeString(part.resolveSibling("part-0.jsonl._COPYING_"), "{}\n");
        }
      }
      if (change.equals("files added")) {
        c.commit();
        assertTrue(Files.exists(out.resolve(OutputCommit.MARKER)), "committed");
        continue;
      }
      InputError e = org.junit.jupiter.api.Assertions.assertThrows(InputError.class, c::commit, change);
      assertTrue(e.getMessage().contains("KEYS file") && e.getMessage().contains(change.equals("touched") ? "changed"
          : change.equals("grown") ? "changed (3 bytes" : change) && e.getMessage().contains("nothing was written"),
          e.getMessage());
      assertFalse(Files.exists(out), change);
      assertEquals(List.of(), hidden(), "the staged result is deleted: " + change);
    }
  }

  @Test
  void aLinkOrAPathUnderAFileIsRefusedBeforeAnyWork() throws Exception {
    Path dangling = Files.createSymbolicLink(tmp.resolve("dangling"), tmp.resolve("nowhere/out"));
    assertRefused(run(args(dangling, false)), keys, snapshot(keys), "is a symbolic link", "nowhere");
    assertFalse(Files.exists(tmp.resolve("nowhere")), "nothing made through the link");
    Path out = tmp.resolve("out");
    assertEquals(0, run(args(out, false)).rc());
    Map<String, String> before = snapshot(out);
    Path link = Files.createSymbolicLink(tmp.resolve("link"), out);
    assertRefused(run(args(link, true)), out, before, "is a symbolic link", "give the path it points to");
    assertTrue(Files.isSymbolicLink(link), "the link is left as it was");
    Path file = Files.writeString(tmp.resolve("a-file"), "x");
    assertRefused(run(args(file.resolve("sub/out"), false)), file, Map.of("", "x"), "which is a file");
  }

  @Test
  void aMarkerThatCannotBeWrittenLeavesTheOldOutputAndNothingElse() throws Exception {
    assertFailedCommitKeepsTheOldOutput("fail-marker", "could not write the marker", "is unchanged");
  }

  /** gen's keys and queries are committed as one: a failed swap puts both old ones back. */
  @Test
  void genReplacesKeysAndQueriesTogetherOrNeither() throws Exception {
    Path dir = tmp.resolve("corpus");
    String[] gen = {"gen", "--docs", "1", "--tokens", "20", "--output", dir.toString()};
    assertEquals(0, run(gen).rc());
    Map<String, String> old = snapshot(dir);
    String[] again = {"gen", "--docs", "1", "--tokens", "30", "--seed", "7", "--output", dir.toString(), "--overwrite"};
    Outcome o = runWithCommitFault("fail-after-aside", again);
    assertEquals(1, o.rc(), o.err());
    assertTrue(o.err().contains("keys.parquet") && o.err().contains("queries.parquet"), "both named: " + o.err());
    assertEquals(old, snapshot(dir), "both old outputs back, unchanged");
    try (Stream<Path> s = Files.list(dir)) {
      assertEquals(List.of("keys.parquet", "queries.parquet"), s.map(p -> p.getFileName().toString()).sorted().toList());
    }
    assertEquals(0, run(again).rc());
    assertEquals(30, spark.read().parquet(dir.resolve("keys.parquet").toString()).count());
  }
}
