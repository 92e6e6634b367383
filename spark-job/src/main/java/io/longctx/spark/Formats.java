package io.longctx.spark;

import java.io.IOException;
import java.util.ArrayList;
import java.util.HashMap;
import java.util.List;
import java.util.Locale;
import java.util.Map;

/** Input and output formats of the Spark commands: parquet or json (JSON Lines), one rule for all. */
final class Formats {
  private Formats() {}

  /** What a JSON reader sees as a "record" when it is handed a Parquet file: its magic bytes. */
  static final String PARQUET_MAGIC = "PAR1";

  static final String PARQUET_READ_AS_JSON = "this is a Parquet file read as JSON (it starts with PAR1): "
      + "name it with a .parquet extension and leave out --format json (it applies to every input), or give "
      + "--format parquet if every input is Parquet";

  /** The explicit format, else json for .json/.jsonl/.ndjson(.gz) paths, else parquet. */
  static String resolve(String explicit, String path) {
    if (explicit != null) {
      return explicit;
    }
    String p = path == null ? "" : path.toLowerCase(Locale.ROOT).replaceAll("/+$", "");
    String bare = p.endsWith(".gz") ? p.substring(0, p.length() - 3) : p; // Spark reads gzipped JSON Lines as they are
    return bare.endsWith(".json") || bare.endsWith(".jsonl") || bare.endsWith(".ndjson") ? "json" : "parquet";
  }

  /** Throws for anything but parquet or json (null: not given). */
  static void check(String option, String value) {
    if (value != null && !value.equals("parquet") && !value.equals("json")) {
      throw new IllegalArgumentException(option + " must be parquet or json, got " + value);
    }
  }

  /**
   * The writer of a job's output and of the corpus generator's files, with the options that keep
   * Parquet's per-value work down on rows of long float arrays (o, lse, logprobs; k, v, q): no
   * dictionary (float vectors hardly repeat a value, and the writer built a hash map per page before
   * falling back to plain), and arrays as Parquet's two-level lists ({@code repeated float array}),
   * which every Parquet reader accepts, instead of three-level ones with a group per element: 35% less
   * time writing 65,536 rows of 512 floats, and {@code gen} 1.7x faster (docs/BENCHMARKS.md, "Parquet
   * output", "Prefill in runs"). Spark reads both forms as the same array columns. Parquet files are
   * written by {@link BulkParquetFormat} (a page of a column at a time; Spark's writer for other
   * schemas). JSON ignores them, and writes a null as {@code null} where Spark would leave the field out:
   * every line has every column the help lists.
   */
  static <T> org.apache.spark.sql.DataFrameWriter<T> output(org.apache.spark.sql.DataFrameWriter<T> w, String format) {
    return w.format(format.equals("parquet") ? BulkParquetFormat.class.getName() : format)
        .option("parquet.enable.dictionary", "false")
        .option("spark.sql.parquet.writeLegacyFormat", "true")
        .option("ignoreNullFields", "false");
  }

  /**
   * {@code spark.read().format(fmt).load(path)}, with a file that is not Parquet (JSON Lines under a
   * name without a .jsonl extension, read with the default format) and a Parquet directory without
   * data files reported as bad input naming the path, instead of Spark's stack trace.
   */
  static org.apache.spark.sql.Dataset<org.apache.spark.sql.Row> load(org.apache.spark.sql.SparkSession spark,
      String fmt, String path, String what) {
    return load(spark, fmt, path, what, false);
  }

  /** The same; {@code mergeSchema}: Parquet files' schemas merged (every footer read) instead of one file's taken. */
  static org.apache.spark.sql.Dataset<org.apache.spark.sql.Row> load(org.apache.spark.sql.SparkSession spark,
      String fmt, String path, String what, boolean mergeSchema) {
    try {
      return spark.read().format(fmt).option("mergeSchema", mergeSchema).load(path);
    } catch (Exception e) { // SparkException is a checked exception that Scala code throws undeclared
      // parquet-mr's "FILE is not a Parquet file ..."
      String why = fmt.equals("parquet") ? InputError.causeLine(e, "is not a Parquet file") : null;
      if (why != null) {
        throw new InputError(what + " " + path + ": " + why + (resolve(null, path).equals("json")
            ? " (--format parquet applies to every input: leave it out, and each input's format comes from its name)"
            : " (for JSON Lines give --format json, or end the name of " + path + " in .jsonl: a folder's own name"
                + " decides, not its files')"));
      }
      if (InputError.causeLine(e, "UNABLE_TO_INFER_SCHEMA") != null) { // Parquet: no data file to take it from
        throw new InputError(what + " " + path + ": no data files to read (an empty directory, or only _SUCCESS and "
            + "other names starting with '_' or '.', which Spark skips as hidden)");
      }
      throw e;
    }
  }

  /** Whether a column type is an integer type (ids, positions and token ids may be any of them). */
  static boolean integral(org.apache.spark.sql.types.DataType t) {
    return t instanceof org.apache.spark.sql.types.LongType || t instanceof org.apache.spark.sql.types.IntegerType
        || t instanceof org.apache.spark.sql.types.ShortType || t instanceof org.apache.spark.sql.types.ByteType;
  }

  /** The message for a corrupt JSON record (first 300 characters), naming a Parquet file as such. */
  static String malformedJson(String record) {
    if (record.startsWith(PARQUET_MAGIC)) {
      return PARQUET_READ_AS_JSON;
    }
    return MALFORMED_JSON + record.substring(0, Math.min(300, record.length()));
  }

  static final String MALFORMED_JSON = "malformed JSON record (not JSON, or a value of the wrong type): ";

  /** How far into a file {@link #lineWhere} looks: past that the message names the file alone. */
  static final long LINE_SEARCH_BYTES = 1L << 30;

  /**
   * ", line N" of the first line of FILE that is the record a malformed-JSON PROBLEM quotes (starts
   * with it, where the quote was cut at 300 characters; Spark's reader gives the text, not its line),
   * or "" when it is not found (see {@link #lineWhere}).
   */
  static String lineOf(String file, String problem) {
    if (file == null || problem == null || !problem.startsWith(MALFORMED_JSON)) {
      return "";
    }
    String record = problem.substring(MALFORMED_JSON.length());
    boolean cut = record.length() >= 300; // malformedJson quotes 300 characters at most
    // a cut-off last line prefixes others
    return lineWhere(file, line -> cut ? line.startsWith(record) : line.equals(record));
  }

  /**
   * ", line N" (1-based) of the first line of the JSON Lines FILE that {@code match} accepts, or ""
   * when none does in the first GiB or the file cannot be read here. Spark's JSON reader gives a row
   * its text at most, never its line, so this reads the file again: only on the way to an error, in
   * the task that found it.
   */
  static String lineWhere(String file, java.util.function.Predicate<String> match) {
    try {
      long n = firstLine(file, LINE_SEARCH_BYTES, match);
      return n > 0 ? ", line " + n : "";
    } catch (IOException | RuntimeException e) {
      return ""; // best effort: the message still names the file
    }
  }

  /**
   * The 1-based number of the first line of the JSON Lines FILE within its first {@code limitBytes}
   * (about: characters counted) that {@code match} accepts; 0 where none does, the file is Parquet or
   * FILE is null. Lines split at \n, \r and \r\n, as Spark's line reader splits them.
   */
  static long firstLine(String file, long limitBytes, java.util.function.Predicate<String> match) throws IOException {
    if (file == null) {
      return 0;
    }
    try (java.io.InputStream in = open(file);
        java.io.BufferedReader r = new java.io.BufferedReader(
            new java.io.InputStreamReader(in, java.nio.charset.StandardCharsets.UTF_8), 1 << 16)) {
      long n = 0;
      long read = 0;
      r.mark(4);
      if (r.read() == 'P' && r.read() == 'A' && r.read() == 'R' && r.read() == '1') {
        return 0; // a Parquet file: no lines
      }
      r.reset();
      for (String line; read < limitBytes && (line = r.readLine()) != null; ) {
        n++;
        read += line.length() + 1;
        if (match.test(line)) {
          return n;
        }
      }
    }
    return 0;
  }

  /** FILE's bytes as Spark's reader has them: through its compression codec (a .gz), with the job's settings. */
  private static java.io.InputStream open(String file) throws IOException {
    org.apache.hadoop.fs.Path path = new org.apache.hadoop.fs.Path(java.net.URI.create(file));
    org.apache.hadoop.conf.Configuration conf = readerConf();
    org.apache.hadoop.io.compress.CompressionCodec codec =
        new org.apache.hadoop.io.compress.CompressionCodecFactory(conf).getCodec(path);
    java.io.InputStream raw = path.getFileSystem(conf).open(path);
    try {
      return codec == null ? raw : codec.createInputStream(raw);
    } catch (IOException | RuntimeException e) {
      raw.close();
      throw e;
    }
  }

  /**
   * ", line N: PROBLEM" for a malformed JSON record (see {@link #lineOf}; the problem alone where the line
   * is not found), saying so where the line holds bytes that are not UTF-8: Spark's reader shows them as
   * U+FFFD and calls the record malformed without a reason (a Latin-1 file, say). On the way to an error only.
   */
  static String malformedLine(String file, String problem) {
    String line = lineOf(file, problem);
    if (line.isEmpty()) { // (the quote may be cut before the bad byte: its line is read whenever it is found)
      return line + ": " + problem;
    }
    try {
      byte[] raw = rawLine(file, Long.parseLong(line.substring(", line ".length())));
      java.nio.ByteBuffer in = java.nio.ByteBuffer.wrap(raw == null ? new byte[0] : raw);
      java.nio.charset.CoderResult res = java.nio.charset.StandardCharsets.UTF_8.newDecoder()
          .decode(in, java.nio.CharBuffer.allocate(in.remaining()), true);
      if (raw != null && res.isError()) {
        return line + String.format(Locale.ROOT, ": not valid UTF-8 (JSON Lines files must be UTF-8): byte %02X at byte "
            + "offset %d of the line: %s", raw[in.position()] & 0xff, in.position(),
            problem.substring(MALFORMED_JSON.length()));
      }
    } catch (IOException | RuntimeException e) {
      // best effort: the problem as Spark gave it
    }
    return line + ": " + problem;
  }

  /** The bytes of line N (1-based; lines end at \n, \r or \r\n, as for {@link #firstLine}) of FILE, or null. */
  private static byte[] rawLine(String file, long n) throws IOException {
    try (java.io.InputStream in = new java.io.BufferedInputStream(open(file), 1 << 16)) {
      java.io.ByteArrayOutputStream cur = new java.io.ByteArrayOutputStream();
      long line = 1;
      int prev = -1;
      for (int b; (b = in.read()) != -1; prev = b) {
        if (b == '\n' && prev == '\r') {
          continue; // the \n of a \r\n
        }
        if (b == '\n' || b == '\r') {
          if (line == n) {
            return cur.toByteArray();
          }
          line++;
        } else if (line == n) {
          cur.write(b);
        }
      }
      return line == n ? cur.toByteArray() : null;
    }
  }

  /** The index of the first UTF-16 surrogate in S without its pair, or -1 where there is none. */
  static int loneSurrogate(String s) {
    for (int i = 0; i < s.length(); i++) {
      char ch = s.charAt(i);
      if (Character.isHighSurrogate(ch) && i + 1 < s.length() && Character.isLowSurrogate(s.charAt(i + 1))) {
        i++; // a pair
      } else if (Character.isSurrogate(ch)) {
        return i;
      }
    }
    return -1;
  }

  /**
   * The files (with the column, and the stage that read them: a later job may read a rewritten file) whose ids
   * {@link #refuseLoneSurrogateId} read and found whole, in this JVM.
   */
  private static final java.util.Set<String> WHOLE_IDS = java.util.concurrent.ConcurrentHashMap.newKeySet();

  /**
   * Refuses an id that held a lone UTF-16 surrogate in JSON Lines. Spark's JSON reader takes the escape
   * of one (U+D800 to U+DFFF without its pair: not Unicode) and stores it as '?', so ids that differ only
   * there would silently become one document, named by neither. Every such id holds a '?' as read: for
   * one that does ({@code value}, from FILE's COLUMN), the whole file is read (once per stage and JVM) and the first
   * row whose COLUMN (its name matched ignoring case, as Spark matches it) holds a lone surrogate is bad
   * input, named by its line. Costs nothing for ids without '?', and Parquet strings cannot hold one.
   */
  static void refuseLoneSurrogateId(String what, String file, String column, String value) {
    if (value == null || value.indexOf('?') < 0 || file == null) {
      return;
    }
    org.apache.spark.TaskContext task = org.apache.spark.TaskContext.get(); // null on the driver: one call, no cache
    org.apache.spark.SparkEnv env = org.apache.spark.SparkEnv.get();
    String key = task == null ? null : (env == null ? "" : env.conf().getAppId()) + '\0' + task.stageId() + '\0'
        + column + '\0' + file;
    if (key != null && WHOLE_IDS.contains(key)) {
      return;
    }
    String[] bad = new String[1];
    long line;
    try {
      line = firstLine(file, Long.MAX_VALUE, l -> rowWhere(l, m -> {
        for (Map.Entry<String, String> f : m.entrySet()) {
          if (f.getKey().equalsIgnoreCase(column) && loneSurrogate(f.getValue()) >= 0) {
            bad[0] = f.getValue();
            return true;
          }
        }
        return false;
      }));
    } catch (IOException | RuntimeException e) {
      return; // not readable here (Spark read it): left unchecked rather than failing the job on the check
    }
    if (line == 0) {
      if (key != null) {
        WHOLE_IDS.add(key);
      }
      return;
    }
    String id = bad[0];
    int at = loneSurrogate(id);
    StringBuilder shown = new StringBuilder();
    for (int i = 0; i < id.length(); i++) {
      char ch = id.charAt(i);
      boolean paired = Character.isHighSurrogate(ch) ? i + 1 < id.length() && Character.isLowSurrogate(id.charAt(i + 1))
          : Character.isLowSurrogate(ch) && i > 0 && Character.isHighSurrogate(id.charAt(i - 1));
      shown.append(Character.isSurrogate(ch) && !paired ? String.format(Locale.ROOT, "\\u%04x", (int) ch) : ch);
    }
    throw new InputError(what + " file " + file + ", line " + line + ": " + column + " '" + shown + "' holds a lone "
        + "UTF-16 surrogate (\\u" + Integer.toHexString(id.charAt(at)) + ") at character " + id.codePointCount(0, at)
        + " (code points from 0): not valid Unicode; Spark would read it as '?', and ids that differ only there as one");
  }

  /** The job's spark.hadoop.* settings (an object store's credentials, say), as Spark's reader had them. */
  private static org.apache.hadoop.conf.Configuration readerConf() {
    org.apache.hadoop.conf.Configuration conf = new org.apache.hadoop.conf.Configuration();
    org.apache.spark.SparkEnv env = org.apache.spark.SparkEnv.get();
    if (env != null) {
      for (scala.Tuple2<String, String> kv : env.conf().getAll()) {
        if (kv._1().startsWith("spark.hadoop.")) {
          conf.set(kv._1().substring("spark.hadoop.".length()), kv._2());
        }
      }
    }
    return conf;
  }

  /** How many rows of a Parquet file {@link #rowIndexWhere} reads: past that the message names the file alone. */
  static final long ROW_SEARCH_ROWS = 100_000_000L;

  /**
   * ", row_index N" of the first row of the Parquet FILE whose top-level {@code columns} (their values as
   * text; null or absent ones left out; names matched ignoring case, as Spark reads them) {@code match}
   * accepts, N counted from 0 as Spark's {@code _metadata.row_index} counts; "" when none does, or FILE
   * is not Parquet or cannot be read here. Reads only those columns; only on the way to an error.
   */
  static String rowIndexWhere(String file, List<String> columns,
      java.util.function.Predicate<Map<String, String>> match) {
    if (file == null) {
      return "";
    }
    org.apache.hadoop.fs.Path path = new org.apache.hadoop.fs.Path(java.net.URI.create(file));
    org.apache.hadoop.conf.Configuration conf = readerConf();
    try {
      org.apache.parquet.hadoop.util.HadoopInputFile in = org.apache.parquet.hadoop.util.HadoopInputFile.fromPath(path,
          conf);
      org.apache.parquet.schema.MessageType schema;
      long rows;
      try (org.apache.parquet.hadoop.ParquetFileReader footer = org.apache.parquet.hadoop.ParquetFileReader.open(in)) {
        schema = footer.getFooter().getFileMetaData().getSchema();
        rows = footer.getRecordCount();
      }
      List<org.apache.parquet.schema.Type> read = new ArrayList<>(); // the file's own names
      List<String> asNamed = new ArrayList<>();
      for (String c : columns) {
        for (org.apache.parquet.schema.Type t : schema.getFields()) {
          if (t.getName().equalsIgnoreCase(c) && t.isPrimitive()) { // Spark matches names ignoring case
            read.add(t);
            asNamed.add(c);
            break;
          }
        }
      }
      if (read.isEmpty()) { // none of the columns: every row has them null
        return rows > 0 && match.test(Map.of()) ? ", row_index 0" : "";
      }
      conf.set(org.apache.parquet.hadoop.api.ReadSupport.PARQUET_READ_SCHEMA,
          new org.apache.parquet.schema.MessageType(schema.getName(), read).toString());
      try (org.apache.parquet.hadoop.ParquetReader<org.apache.parquet.example.data.Group> r =
          org.apache.parquet.hadoop.ParquetReader.builder(new org.apache.parquet.hadoop.example.GroupReadSupport(), path)
              .withConf(conf).build()) {
        long n = 0;
        for (org.apache.parquet.example.data.Group g; n < ROW_SEARCH_ROWS && (g = r.read()) != null; n++) {
          Map<String, String> row = new HashMap<>();
          for (int i = 0; i < read.size(); i++) {
            int at = g.getType().getFieldIndex(read.get(i).getName());
            if (g.getFieldRepetitionCount(at) > 0) {
              row.put(asNamed.get(i), g.getValueToString(at, 0));
            }
          }
          if (match.test(row)) {
            return ", row_index " + n;
          }
        }
      }
    } catch (IOException | RuntimeException e) {
      // best effort (not Parquet, say): the message still names the file
    }
    return "";
  }

  /** Parses lines as Spark's JSON reader does by default (NaN, Infinity, single quotes allowed), with no length limits. */
  static final com.fasterxml.jackson.core.JsonFactory JSON = com.fasterxml.jackson.core.JsonFactory.builder()
      .enable(com.fasterxml.jackson.core.json.JsonReadFeature.ALLOW_NON_NUMERIC_NUMBERS)
      .enable(com.fasterxml.jackson.core.json.JsonReadFeature.ALLOW_SINGLE_QUOTES)
      .streamReadConstraints(com.fasterxml.jackson.core.StreamReadConstraints.builder()
          .maxStringLength(Integer.MAX_VALUE).maxNumberLength(Integer.MAX_VALUE).build())
      .build();

  /**
   * ", line N" of the first line of a JSON Lines input file holding a row that {@code row} accepts (see
   * {@link #rowWhere}; Spark's reader gives a row no line number); for a Parquet file its
   * {@link #rowIndexWhere} over {@code columns}; "" where none is found. On the way to an error only.
   */
  static String lineOfRow(String file, List<String> columns, java.util.function.Predicate<Map<String, String>> row) {
    String line = lineWhere(file, l -> rowWhere(l, row));
    return line.isEmpty() ? rowIndexWhere(file, columns, row) : line;
  }

  /**
   * Whether a JSON Lines line holds a row (an object, or an object in a top-level array, as Spark reads
   * them) whose top-level fields {@code match} accepts: field name to its text (a scalar's, as written;
   * "" for an object or array), null fields left out, a repeated field's last value. A blank or
   * unparsable line holds none.
   */
  static boolean rowWhere(String line, java.util.function.Predicate<Map<String, String>> match) {
    try (com.fasterxml.jackson.core.JsonParser p = JSON.createParser(line)) {
      com.fasterxml.jackson.core.JsonToken t = p.nextToken();
      if (t == com.fasterxml.jackson.core.JsonToken.START_OBJECT) {
        return match.test(fields(p));
      }
      if (t == com.fasterxml.jackson.core.JsonToken.START_ARRAY) {
        boolean any = false;
        for (t = p.nextToken(); t != com.fasterxml.jackson.core.JsonToken.END_ARRAY; t = p.nextToken()) {
          if (t == com.fasterxml.jackson.core.JsonToken.START_OBJECT) {
            any |= match.test(fields(p));
          } else {
            p.skipChildren();
          }
        }
        return any;
      }
    } catch (IOException | RuntimeException e) {
      // not JSON: Spark reports such a line as malformed, not as a row
    }
    return false;
  }

  /** After an object's START_OBJECT: reads it to its end; its non-null top-level fields (see {@link #rowWhere}). */
  private static Map<String, String> fields(com.fasterxml.jackson.core.JsonParser p) throws IOException {
    Map<String, String> m = new java.util.HashMap<>();
    while (p.nextToken() == com.fasterxml.jackson.core.JsonToken.FIELD_NAME) {
      String name = p.currentName(); // Spark matches names exactly
      com.fasterxml.jackson.core.JsonToken v = p.nextToken();
      if (v == com.fasterxml.jackson.core.JsonToken.VALUE_NULL) {
        m.remove(name);
      } else {
        m.put(name, v.isScalarValue() ? p.getText() : "");
      }
      p.skipChildren();
    }
    return m;
  }
}
