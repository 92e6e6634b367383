package io.longctx.spark;

import java.io.IOException;
import java.nio.ByteBuffer;
import java.nio.ByteOrder;
import java.util.ArrayList;
import java.util.List;
import org.apache.hadoop.conf.Configuration;
import org.apache.hadoop.mapreduce.Job;
import org.apache.hadoop.mapreduce.TaskAttemptContext;
import org.apache.parquet.bytes.BytesInput;
import org.apache.parquet.bytes.HeapByteBufferAllocator;
import org.apache.parquet.column.ColumnDescriptor;
import org.apache.parquet.column.Encoding;
import org.apache.parquet.column.page.PageWriter;
import org.apache.parquet.column.statistics.Statistics;
import org.apache.parquet.hadoop.CodecFactory;
import org.apache.parquet.hadoop.ColumnChunkPageWriteStore;
import org.apache.parquet.hadoop.ParquetFileWriter;
import org.apache.parquet.hadoop.ParquetOutputFormat;
import org.apache.parquet.hadoop.api.WriteSupport;
import org.apache.parquet.hadoop.metadata.CompressionCodecName;
import org.apache.parquet.hadoop.util.HadoopOutputFile;
import org.apache.parquet.io.api.Binary;
import org.apache.parquet.schema.GroupType;
import org.apache.parquet.schema.MessageType;
import org.apache.parquet.schema.PrimitiveType.PrimitiveTypeName;
import org.apache.parquet.schema.Type;
import org.apache.spark.sql.SparkSession;
import org.apache.spark.sql.catalyst.InternalRow;
import org.apache.spark.sql.catalyst.util.ArrayData;
import org.apache.spark.sql.execution.datasources.OutputWriter;
import org.apache.spark.sql.execution.datasources.OutputWriterFactory;
import org.apache.spark.sql.execution.datasources.parquet.ParquetFileFormat;
import org.apache.spark.sql.execution.datasources.parquet.ParquetWriteSupport;
import org.apache.spark.sql.types.ArrayType;
import org.apache.spark.sql.types.DataType;
import org.apache.spark.sql.types.DataTypes;
import org.apache.spark.sql.types.StructField;
import org.apache.spark.sql.types.StructType;

/**
 * Spark's Parquet data source with a writer that encodes a file a column page at a time, for the
 * rows longctx writes: strings, longs, ints, floats, doubles and arrays of floats, doubles, ints or
 * longs without null elements (o, lse, k, v, q, logprobs). Spark's own writer hands parquet-mr one
 * value at a time (an array element costs a boxed index, a call chain and four one-byte writes):
 * a third of the Spark work of a prefill job (docs/BENCHMARKS.md). Here an array's elements go into
 * the page in one loop and its levels as run-length runs.
 *
 * <p>Everything else is Spark's and parquet-mr's: the file schema and footer metadata come from
 * Spark's {@link ParquetWriteSupport} (the same file schema, Spark's row metadata, so Spark reads
 * the columns back with their types), pages are compressed, indexed and checksummed by parquet-mr's
 * {@link ColumnChunkPageWriteStore}, statistics are parquet-mr's (updated per value), the file is
 * laid out by its {@link ParquetFileWriter}, and the codec, page size, row-group size and statistics
 * switches are read from the same configuration keys. The pages are version-1 data pages, plain
 * values, levels run-length encoded, as parquet-mr writes them without a dictionary. A schema with
 * any other column type, or a setting beyond that (dictionaries, bloom filters, version-2 pages,
 * byte-stream split, encryption), goes to Spark's writer whole. Unlike Spark's writer, a file is not
 * registered with parquet-mr's memory manager (which shrinks row groups when many files are open at
 * once): each task here writes one file at a time. Reading is Spark's Parquet reader unchanged.
 */
public final class BulkParquetFormat extends ParquetFileFormat {
  private static final long serialVersionUID = 1L;

  /** Files this JVM's tasks wrote with the page writer (tests tell it from Spark's writer by it). */
  private static final java.util.concurrent.atomic.LongAdder FILES = new java.util.concurrent.atomic.LongAdder();

  static long filesWritten() {
    return FILES.sum();
  }

  @Override
  public OutputWriterFactory prepareWrite(SparkSession session, Job job,
      scala.collection.immutable.Map<String, String> options, StructType dataSchema) {
    // Spark's preparation puts the schema, codec and options into the job's configuration, which
    // every task's writer receives; its factory writes the files this one cannot. The settings are
    // the job's, so they are judged once here, not per file.
    OutputWriterFactory spark = super.prepareWrite(session, job, options, dataSchema);
    return new Factory(spark, plainPagesAsked(job.getConfiguration()));
  }

  private static final class Factory extends OutputWriterFactory {
    private static final long serialVersionUID = 1L;
    private final OutputWriterFactory spark;
    private final boolean plainPages;

    Factory(OutputWriterFactory spark, boolean plainPages) {
      this.spark = spark;
      this.plainPages = plainPages;
    }

    @Override
    public String getFileExtension(TaskAttemptContext context) {
      return spark.getFileExtension(context);
    }

    @Override
    public OutputWriter newInstance(String path, StructType dataSchema, TaskAttemptContext context) {
      Configuration conf = context.getConfiguration();
      WriteSupport.WriteContext write = new ParquetWriteSupport().init(conf);
      List<Leaf> leaves = plainPages ? plan(dataSchema, write.getSchema(), conf) : null;
      if (leaves == null) {
        return spark.newInstance(path, dataSchema, context);
      }
      try {
        return new Writer(path, conf, write, leaves);
      } catch (IOException e) {
        throw new java.io.UncheckedIOException("cannot create Parquet file " + path, e);
      }
    }
  }

  /**
   * Whether the configuration asks for nothing beyond what this writer does: version-1 pages, no
   * dictionary, no bloom filter, no encryption. Anything else is Spark's writer's, so a setting is
   * never dropped in silence.
   */
  static boolean plainPagesAsked(Configuration conf) {
    if (ParquetOutputFormat.getEnableDictionary(conf)
        || ParquetOutputFormat.getWriterVersion(conf) != org.apache.parquet.column.ParquetProperties.WriterVersion.PARQUET_1_0
        || ParquetOutputFormat.getByteStreamSplitEnabled(conf)) {
      return false;
    }
    for (java.util.Map.Entry<String, String> e : conf) {
      String k = e.getKey();
      // Per-column switches are the key, '#', the column; statistics switches are honored here.
      boolean on = Boolean.parseBoolean(e.getValue());
      if (on && (k.startsWith(ParquetOutputFormat.BLOOM_FILTER_ENABLED)
          || k.startsWith(ParquetOutputFormat.ENABLE_DICTIONARY + "#")
          || k.startsWith(ParquetOutputFormat.ENABLE_BYTE_STREAM_SPLIT + "#"))
          || k.equals(org.apache.parquet.crypto.EncryptionPropertiesFactory.CRYPTO_FACTORY_CLASS_PROPERTY_NAME)) {
        return false;
      }
    }
    return true;
  }

  /** The kinds of value this writer encodes, with the Parquet type Spark gives each. */
  private enum Kind {
    STRING(PrimitiveTypeName.BINARY), LONG(PrimitiveTypeName.INT64), INT(PrimitiveTypeName.INT32),
    DOUBLE(PrimitiveTypeName.DOUBLE), FLOAT(PrimitiveTypeName.FLOAT);

    final PrimitiveTypeName parquet;

    Kind(PrimitiveTypeName parquet) {
      this.parquet = parquet;
    }

    static Kind of(DataType t) {
      if (t.equals(DataTypes.StringType)) {
        return STRING;
      } else if (t.equals(DataTypes.LongType)) {
        return LONG;
      } else if (t.equals(DataTypes.IntegerType)) {
        return INT;
      } else if (t.equals(DataTypes.DoubleType)) {
        return DOUBLE;
      } else if (t.equals(DataTypes.FloatType)) {
        return FLOAT;
      }
      return null;
    }
  }

  /**
   * One leaf column per field, or null when any field is of a type or file shape this writer does
   * not encode (then Spark writes the file). Arrays must be Spark's two-level form (a repeated
   * primitive inside the list group, {@code spark.sql.parquet.writeLegacyFormat}) without null elements.
   */
  static List<Leaf> plan(StructType spark, MessageType file, Configuration conf) {
    List<ColumnDescriptor> columns = file.getColumns();
    if (file.getFieldCount() != spark.size() || columns.size() != spark.size()) {
      return null;
    }
    List<Leaf> leaves = new ArrayList<>();
    for (int i = 0; i < spark.size(); i++) {
      StructField f = spark.fields()[i];
      Type t = file.getType(i);
      ColumnDescriptor c = columns.get(i);
      boolean array = f.dataType() instanceof ArrayType;
      Kind kind = Kind.of(array ? ((ArrayType) f.dataType()).elementType() : f.dataType());
      if (kind == null || kind == Kind.STRING && array
          || c.getPrimitiveType().getPrimitiveTypeName() != kind.parquet) {
        return null;
      }
      if (array) {
        boolean twoLevel = !t.isPrimitive() && t.asGroupType().getFieldCount() == 1
            && t.asGroupType().getType(0).isPrimitive()
            && t.asGroupType().getType(0).isRepetition(Type.Repetition.REPEATED);
        if (((ArrayType) f.dataType()).containsNull() || !twoLevel || c.getMaxRepetitionLevel() != 1) {
          return null;
        }
      } else if (!t.isPrimitive() || c.getMaxRepetitionLevel() != 0) {
        return null;
      }
      boolean stats = ParquetOutputFormat.getStatisticsEnabled(conf, String.join(".", c.getPath()));
      leaves.add(new Leaf(i, c, kind, array, stats));
    }
    return leaves;
  }

  /** A task's file: rows buffered as pages per column, a row group written when it is full. */
  private static final class Writer extends OutputWriter {
    private final String path;
    private final List<Leaf> leaves;
    private final java.util.Map<String, String> metadata;
    private final ParquetFileWriter file;
    private final CodecFactory codecs;
    private final CodecFactory.BytesCompressor compressor;
    private final MessageType schema;
    private final int pageSize;
    private final long rowGroupSize;
    private final int columnIndexTruncate;
    private final boolean pageChecksums;
    private ColumnChunkPageWriteStore pages;
    private long groupRows;
    private long groupBytes; // uncompressed bytes of the pages handed to the store this row group
    private boolean closed;

    Writer(String path, Configuration conf, WriteSupport.WriteContext write, List<Leaf> leaves) throws IOException {
      this.path = path;
      this.leaves = leaves;
      this.metadata = write.getExtraMetaData();
      this.schema = write.getSchema();
      this.pageSize = ParquetOutputFormat.getPageSize(conf);
      this.rowGroupSize = ParquetOutputFormat.getLongBlockSize(conf);
      this.columnIndexTruncate = conf.getInt(ParquetOutputFormat.COLUMN_INDEX_TRUNCATE_LENGTH,
          org.apache.parquet.column.ParquetProperties.DEFAULT_COLUMN_INDEX_TRUNCATE_LENGTH);
      this.pageChecksums = ParquetOutputFormat.getPageWriteChecksumEnabled(conf);
      CompressionCodecName codec = org.apache.parquet.hadoop.codec.CodecConfig.getParquetCompressionCodec(conf);
      this.codecs = new CodecFactory(conf, pageSize);
      this.compressor = codecs.getCompressor(codec);
      this.file = new ParquetFileWriter(HadoopOutputFile.fromPath(new org.apache.hadoop.fs.Path(path), conf), schema,
          ParquetFileWriter.Mode.CREATE, rowGroupSize, conf.getInt(ParquetOutputFormat.MAX_PADDING_BYTES, 8 << 20), columnIndexTruncate,
          conf.getInt(ParquetOutputFormat.STATISTICS_TRUNCATE_LENGTH,
              org.apache.parquet.column.ParquetProperties.DEFAULT_STATISTICS_TRUNCATE_LENGTH), pageChecksums);
      file.start();
      newGroup();
      FILES.increment();
    }

    private void newGroup() {
      pages = new ColumnChunkPageWriteStore(compressor, schema, HeapByteBufferAllocator.getInstance(),
          columnIndexTruncate, pageChecksums);
      for (Leaf l : leaves) {
        l.pages = pages.getPageWriter(l.column);
      }
      groupRows = 0;
      groupBytes = 0;
    }

    @Override
    public void write(InternalRow row) {
      try {
        long pending = 0;
        for (Leaf l : leaves) {
          l.add(row);
          if (l.bufferedBytes() >= pageSize) {
            groupBytes += l.flushPage();
          }
          pending += l.bufferedBytes();
        }
        groupRows++;
        if (groupBytes + pending >= rowGroupSize) {
          writeGroup();
        }
      } catch (IOException e) {
        throw new java.io.UncheckedIOException("writing Parquet file " + path, e);
      }
    }

    private void writeGroup() throws IOException {
      for (Leaf l : leaves) {
        l.flushPage();
      }
      file.startBlock(groupRows);
      pages.flushToFileWriter(file);
      file.endBlock();
      pages.close();
      newGroup();
    }

    @Override
    public void close() {
      if (closed) {
        return;
      }
      closed = true;
      try {
        if (groupRows > 0) {
          writeGroup();
        }
        pages.close();
        file.end(metadata);
      } catch (IOException | RuntimeException e) {
        file.abort(); // closes the stream without a footer: the task fails, and its attempt's files go
        throw e instanceof IOException io ? new java.io.UncheckedIOException("closing Parquet file " + path, io)
            : (RuntimeException) e;
      } finally {
        codecs.release();
      }
    }

    @Override
    public String path() {
      return path;
    }
  }

  /**
   * One column's current page: its repetition and definition levels as run-length runs and its
   * values plain (little-endian), with parquet-mr's statistics of the page.
   */
  static final class Leaf {
    final int field;
    final ColumnDescriptor column;
    final Kind kind;
    final boolean array;
    final boolean statsEnabled;
    final LevelRuns rep;
    final LevelRuns def;
    PageWriter pages;
    private ByteBuffer values = ByteBuffer.allocate(1 << 16).order(ByteOrder.LITTLE_ENDIAN);
    private Statistics<?> stats;
    private int levels; // level entries in the page: values plus nulls and empty lists
    private int rows;

    Leaf(int field, ColumnDescriptor column, Kind kind, boolean array, boolean statsEnabled) {
      this.field = field;
      this.column = column;
      this.kind = kind;
      this.array = array;
      this.statsEnabled = statsEnabled;
      this.rep = new LevelRuns(column.getMaxRepetitionLevel());
      this.def = new LevelRuns(column.getMaxDefinitionLevel());
      newStats();
    }

    private void newStats() {
      stats = statsEnabled ? Statistics.createStats(column.getPrimitiveType())
          : Statistics.noopStats(column.getPrimitiveType());
    }

    int bufferedBytes() {
      return values.position() + rep.size() + def.size();
    }

    /** Appends the row's value: the levels, then the values (none for a null or an empty list). */
    void add(InternalRow row) {
      int maxDef = column.getMaxDefinitionLevel();
      rows++;
      if (row.isNullAt(field)) {
        // A null list has no list (def below the empty list's), a null scalar no value; parquet-mr
        // counts both as nulls in the statistics.
        rep.add(0, 1);
        def.add(array ? maxDef - 2 : maxDef - 1, 1);
        levels++;
        stats.incrementNumNulls();
        return;
      }
      if (!array) {
        rep.add(0, 1);
        def.add(maxDef, 1);
        levels++;
        putScalar(row);
        return;
      }
      ArrayData a = row.getArray(field);
      int n = a.numElements();
      if (n == 0) {
        rep.add(0, 1);
        def.add(maxDef - 1, 1);
        levels++;
        stats.incrementNumNulls();
        return;
      }
      rep.add(0, 1);
      rep.add(1, n - 1);
      def.add(maxDef, n);
      levels += n;
      putArray(a, n);
    }

    private void putScalar(InternalRow row) {
      switch (kind) {
        case STRING -> {
          byte[] b = row.getUTF8String(field).getBytes();
          room(4 + b.length);
          values.putInt(b.length).put(b);
          stats.updateStats(Binary.fromConstantByteArray(b));
        }
        case LONG -> {
          long x = row.getLong(field);
          room(8);
          values.putLong(x);
          stats.updateStats(x);
        }
        case INT -> {
          int x = row.getInt(field);
          room(4);
          values.putInt(x);
          stats.updateStats(x);
        }
        case DOUBLE -> {
          double x = row.getDouble(field);
          room(8);
          values.putDouble(x);
          stats.updateStats(x);
        }
        case FLOAT -> {
          float x = row.getFloat(field);
          room(4);
          values.putFloat(x);
          stats.updateStats(x);
        }
        default -> throw new IllegalStateException(kind.toString());
      }
    }

    private void putArray(ArrayData a, int n) {
      switch (kind) {
        case FLOAT -> {
          float[] x = a.toFloatArray();
          room(4 * n);
          for (float v : x) {
            values.putFloat(v);
            stats.updateStats(v);
          }
        }
        case DOUBLE -> {
          double[] x = a.toDoubleArray();
          room(8 * n);
          for (double v : x) {
            values.putDouble(v);
            stats.updateStats(v);
          }
        }
        case INT -> {
          int[] x = a.toIntArray();
          room(4 * n);
          for (int v : x) {
            values.putInt(v);
            stats.updateStats(v);
          }
        }
        case LONG -> {
          long[] x = a.toLongArray();
          room(8 * n);
          for (long v : x) {
            values.putLong(v);
            stats.updateStats(v);
          }
        }
        default -> throw new IllegalStateException(kind.toString());
      }
    }

    private void room(int bytes) {
      if (values.remaining() < bytes) {
        ByteBuffer bigger = ByteBuffer.allocate(Math.max(2 * values.capacity(), values.position() + bytes))
            .order(ByteOrder.LITTLE_ENDIAN);
        values.flip();
        bigger.put(values);
        values = bigger;
      }
    }

    /** Hands the page (if it holds a row) to the store; returns its uncompressed size. */
    long flushPage() throws IOException {
      if (rows == 0) {
        return 0;
      }
      // A version-1 data page: repetition levels, definition levels (each with its byte length first;
      // absent where the column's maximum is 0, as parquet-mr writes them), then the plain values.
      BytesInput page = BytesInput.concat(rep.pageSection(), def.pageSection(),
          BytesInput.from(java.util.Arrays.copyOf(values.array(), values.position())));
      long size = page.size();
      pages.writePage(page, levels, rows, stats, rep.encoding(), def.encoding(), Encoding.PLAIN);
      values.clear();
      rep.clear();
      def.clear();
      levels = 0;
      rows = 0;
      newStats();
      return size;
    }
  }

  /**
   * Levels in Parquet's run-length / bit-packed hybrid, as run-length runs only: a run is its count
   * shifted left by one (an unsigned LEB128 varint) and the value in whole bytes. A row's levels come
   * in long runs (an array of n: repetition 0 then n - 1 ones, definition n times the maximum).
   */
  static final class LevelRuns {
    private final int maxLevel;
    private final int valueBytes;
    private byte[] out = new byte[64];
    private int size;
    private int runValue = -1;
    private long runLength;

    LevelRuns(int maxLevel) {
      this.maxLevel = maxLevel;
      this.valueBytes = (32 - Integer.numberOfLeadingZeros(maxLevel) + 7) / 8;
    }

    void add(int level, int count) {
      if (maxLevel == 0 || count == 0) {
        return;
      }
      if (level != runValue) {
        endRun();
        runValue = level;
      }
      runLength += count;
    }

    private void endRun() {
      if (runLength == 0) {
        return;
      }
      if (size + 10 + valueBytes > out.length) {
        out = java.util.Arrays.copyOf(out, 2 * out.length + 10 + valueBytes);
      }
      long header = runLength << 1; // low bit 0: a run-length run
      while ((header & ~0x7FL) != 0) {
        out[size++] = (byte) ((header & 0x7F) | 0x80);
        header >>>= 7;
      }
      out[size++] = (byte) header;
      for (int b = 0; b < valueBytes; b++) {
        out[size++] = (byte) (runValue >>> (8 * b));
      }
      runLength = 0;
    }

    /** Bytes held so far, an estimate within a run's header. */
    int size() {
      return size + (runLength > 0 ? 5 + valueBytes : 0);
    }

    BytesInput pageSection() {
      if (maxLevel == 0) {
        return BytesInput.empty();
      }
      endRun();
      return BytesInput.concat(BytesInput.fromInt(size), BytesInput.from(java.util.Arrays.copyOf(out, size)));
    }

    /** parquet-mr's: RLE, or BIT_PACKED (no bytes) for a column whose maximum level is 0. */
    Encoding encoding() {
      return maxLevel == 0 ? Encoding.BIT_PACKED : Encoding.RLE;
    }

    void clear() {
      size = 0;
      runValue = -1;
      runLength = 0;
    }
  }
}
