package io.longctx.spark;

import io.longctx.djl.LlamaConfig;
import io.longctx.djl.LlamaModel;
import io.longctx.kernels.AttentionOptions;
import io.longctx.kernels.Tensor;
import java.io.IOException;
import java.io.PrintStream;
import java.io.Serializable;
import java.nio.ByteBuffer;
import java.nio.ByteOrder;
import java.util.ArrayList;
import java.util.Arrays;
import java.util.Comparator;
import java.util.HashMap;
import java.util.Iterator;
import java.util.List;
import java.util.Locale;
import java.util.Map;
import java.util.NoSuchElementException;
import java.util.PriorityQueue;
import org.apache.hadoop.fs.FileSystem;
import org.apache.hadoop.fs.Path;
import org.apache.spark.Partitioner;
import org.apache.spark.api.java.JavaPairRDD;
import org.apache.spark.api.java.JavaRDD;
import org.apache.spark.scheduler.SparkListener;
import org.apache.spark.scheduler.SparkListenerTaskEnd;
import org.apache.spark.sql.SparkSession;
import org.apache.spark.storage.StorageLevel;
import org.apache.spark.util.CollectionAccumulator;
import scala.Tuple2;

/**
 * Sequence-parallel {@code ppl} (docs/SEQUENCE-PARALLEL.md): one long document's layers spread over
 * many tasks. Its positions 0..n-2 are cut into chunks of {@code chunkLen} tokens; chunk b is also
 * query block b. Per layer, two steps joined by one shuffle:
 *
 * <ol>
 *   <li>each chunk computes its keys and values ({@link LlamaModel#keysValues}) and sends them to
 *       every block that sees the chunk (causal, and a Mistral window prunes far blocks);
 *   <li>each block, co-located with its own hidden rows (no shuffle for them), receives its visible
 *       chunks' keys and values in chunk order and runs the rest of the layer ({@link LlamaModel#layer}:
 *       queries, one attention state per chunk merged with the one LSE tree, output projection, MLP).
 * </ol>
 *
 * The hidden rows are checkpointed to the job's checkpoint directory after every layer: a lost
 * executor costs at most one layer's work, and lineage stays one layer long however deep the model.
 * After the last layer each chunk computes its log-probabilities ({@link LlamaModel#logprobs}); a
 * document's sum adds them in position order. Every chunk runs the same code on the same inputs as
 * the one-task path ({@link LlamaModel#score}) at the same chunk length, so the two agree bit for bit,
 * and no result depends on partitioning, task order or retries.
 */
final class SplitPpl {
  private SplitPpl() {}

  /** A long document: its index in the job, id, tokens and (text rows) UTF-8 bytes. */
  record Doc(long index, String docId, int[] tokens, long bytes) implements Serializable {}

  /** A query block or key chunk of a long document. */
  record BlockKey(long doc, long block) implements Serializable {}

  /** Keys and values of chunk {@code chunk} on their way to block {@code block}. */
  record RouteKey(long doc, long block, long chunk) implements Serializable {}

  /** Chunk {@code index}'s tokens, hidden rows (float32 little-endian bytes) and next-token targets. */
  record Hidden(long doc, long index, long start, int len, byte[] x, int[] targets) implements Serializable {}

  /** Keys and values of one chunk at one layer (float32 little-endian, [kvHeads, len, headDim]). */
  record Kv(long start, int len, byte[] k, byte[] v) implements Serializable {}

  /**
   * What the split path did, for the summary and the benchmarks. layerTaskSeconds: per layer, the
   * seconds each task spent in its blocks (the layer's arithmetic, not Spark's start-up of it).
   */
  record Stats(long documents, long tokens, long chunks, int layers, int partitions, long shuffleBytes,
      double[][] layerTaskSeconds, double plannedSpread) implements Serializable {
    double shuffleBytesPerTokenLayer() {
      return tokens == 0 || layers == 0 ? 0 : shuffleBytes / (double) tokens / layers;
    }

    /** Slowest task over the mean task of each layer, then the median over the layers: 1 is even. */
    double taskSpread() {
      double[] r = new double[layerTaskSeconds.length];
      for (int l = 0; l < r.length; l++) {
        double[] s = layerTaskSeconds[l];
        double mean = Arrays.stream(s).average().orElse(0);
        r[l] = mean == 0 ? 1 : Arrays.stream(s).max().orElse(0) / mean;
      }
      return median(r);
    }

    /** The median over layers of the slowest task's seconds: what a layer waits for. */
    double slowestTaskSeconds() {
      double[] r = new double[layerTaskSeconds.length];
      for (int l = 0; l < r.length; l++) {
        r[l] = Arrays.stream(layerTaskSeconds[l]).max().orElse(0);
      }
      return median(r);
    }

    private static double median(double[] v) {
      if (v.length == 0) {
        return 0;
      }
      double[] s = v.clone();
      Arrays.sort(s);
      return s[s.length / 2];
    }

    String describe() {
      return String.format(Locale.ROOT, "%d documents split into %d chunks over %d tasks per layer, %d layers; "
          + "shuffle %.0f bytes/token/layer; planned work of the busiest task %.2fx the mean; per layer the "
          + "slowest task takes %.3f s, %.2fx the mean task (medians over layers)", documents, chunks, partitions,
          layers, shuffleBytesPerTokenLayer(), plannedSpread, slowestTaskSeconds(), taskSpread());
    }
  }

  /** How chunks are placed in tasks: by estimated cost (default) or in contiguous runs (for comparison). */
  enum Balance {
    COST, CONTIGUOUS
  }

  /** Result rows per long document: (index, sum, per-token log-probabilities in position order). */
  record Scored(long index, double sum, float[] logprobs) implements Serializable {}

  /**
   * Scores the long documents of {@code docs} (every element is one). Runs one Spark job per layer;
   * checkpoints go to a directory made for this run under {@code checkpointRoot}, deleted at the end.
   */
  static Tuple2<JavaRDD<Scored>, Stats> score(SparkSession spark, JavaRDD<Doc> docs, List<long[]> lengths,
      String model, LlamaConfig cfg, int chunkLen, int partitions, Balance balance, Path checkpointDir,
      PrintStream progress) throws IOException {
    AttentionOptions attn = cfg.attention();
    Plan plan = Plan.make(lengths, chunkLen, attn, cfg, partitions, balance);
    FileSystem fs = checkpointDir.getFileSystem(spark.sparkContext().hadoopConfiguration());
    if (!fs.mkdirs(checkpointDir)) {
      throw new IOException("cannot create the checkpoint directory " + checkpointDir);
    }
    spark.sparkContext().setCheckpointDir(checkpointDir.toString());
    CollectionAccumulator<double[]> taskSeconds = spark.sparkContext().collectionAccumulator("longctx ppl layer tasks");
    ShuffleBytes shuffle = new ShuffleBytes();
    long t0 = System.nanoTime();
    final int len = chunkLen;
    // Chunks of tokens to their blocks' tasks, sorted by (document, block): the order of every layer.
    JavaPairRDD<BlockKey, Hidden> hidden = docs.flatMapToPair(d -> chunks(d, len).iterator())
        .repartitionAndSortWithinPartitions(plan, BLOCK_ORDER)
        .mapPartitionsToPair(it -> embedded(model, it), true);
    hidden.persist(StorageLevel.MEMORY_AND_DISK_SER());
    hidden.count();
    JavaPairRDD<BlockKey, Hidden> first = hidden;
    spark.sparkContext().addSparkListener(shuffle);
    try {
      for (int l = 0; l < cfg.layers; l++) {
        final int layer = l;
        JavaPairRDD<RouteKey, Kv> routed = hidden.flatMapToPair(h -> route(model, layer, h._2(), plan).iterator())
            .repartitionAndSortWithinPartitions(plan, ROUTE_ORDER);
        JavaPairRDD<BlockKey, Hidden> next = JavaPairRDD.fromJavaRDD(hidden.zipPartitions(routed,
            (hs, kvs) -> new LayerIterator(model, layer, hs, kvs, plan, taskSeconds)));
        // Persisted so that writing the checkpoint reads the layer instead of computing it again.
        next.persist(StorageLevel.MEMORY_AND_DISK_SER());
        next.checkpoint();
        next.count();
        hidden.unpersist(false);
        if (hidden != first) {
          deleteCheckpoint(fs, hidden);
        }
        hidden = next;
        if (progress != null) {
          double sec = (System.nanoTime() - t0) / 1e9;
          progress.printf(Locale.ROOT, "longctx ppl: layer %d/%d done for %d long documents (%d tokens), %.0f s%n",
              l + 1, cfg.layers, plan.documents, plan.tokens, sec);
          progress.flush();
        }
      }
      try {
        spark.sparkContext().listenerBus().waitUntilEmpty(); // the shuffle metrics arrive late
      } catch (java.util.concurrent.TimeoutException e) {
        // a busy listener bus: the shuffle figure may miss the last tasks; the scores are unaffected
      }
    } finally {
      spark.sparkContext().removeSparkListener(shuffle);
    }
    JavaRDD<Scored> scored = hidden.mapToPair(h -> {
      Hidden c = h._2();
      double[] lp = PplJob.Loaded.get(model).model.logprobs(floats(c.x()), c.targets());
      return new Tuple2<>(c.doc(), new Tuple2<>(c.index(), lp));
    }).groupByKey().map(g -> sumInOrder(g._1(), g._2()));
    double[][] secs = new double[cfg.layers][];
    for (int l = 0; l < cfg.layers; l++) {
      final int layer = l;
      secs[l] = taskSeconds.value().stream().filter(t -> t[0] == layer).mapToDouble(t -> t[1]).toArray();
    }
    return new Tuple2<>(scored, new Stats(plan.documents, plan.tokens, plan.chunks, cfg.layers, plan.numPartitions(),
        shuffle.bytes(), secs, plan.spread()));
  }

  /** Adds a document's chunk log-probabilities in position order (the one-task path's order). */
  static Scored sumInOrder(long doc, Iterable<Tuple2<Long, double[]>> chunks) {
    List<Tuple2<Long, double[]>> l = new ArrayList<>();
    chunks.forEach(l::add);
    l.sort(Comparator.comparingLong(Tuple2::_1));
    int n = 0;
    for (Tuple2<Long, double[]> c : l) {
      n += c._2().length;
    }
    float[] lp = new float[n];
    double sum = 0;
    int i = 0;
    for (int c = 0; c < l.size(); c++) {
      if (l.get(c)._1() != c) {
        throw new IllegalStateException("document " + doc + ": chunk " + c + " is missing");
      }
      for (double v : l.get(c)._2()) {
        lp[i++] = (float) v;
        sum += v;
      }
    }
    return new Scored(doc, sum, lp);
  }

  private static void deleteCheckpoint(FileSystem fs, JavaPairRDD<?, ?> rdd) throws IOException {
    if (rdd.getCheckpointFile().isPresent()) {
      fs.delete(new Path(rdd.getCheckpointFile().get()), true);
    }
  }

  // ------------------------------------------------------------------ tasks

  static List<Tuple2<BlockKey, Hidden>> chunks(Doc d, int chunkLen) {
    int[] t = d.tokens();
    int m1 = t.length - 1; // the last token predicts nothing
    List<Tuple2<BlockKey, Hidden>> out = new ArrayList<>();
    for (int s = 0, c = 0; s < m1; s += chunkLen, c++) {
      int len = Math.min(chunkLen, m1 - s);
      // x holds the chunk's tokens until it is embedded on the block's task.
      out.add(new Tuple2<>(new BlockKey(d.index(), c), new Hidden(d.index(), c, s, len,
          bytes(Arrays.copyOfRange(t, s, s + len)), Arrays.copyOfRange(t, s + 1, s + len + 1))));
    }
    return out;
  }

  private static Iterator<Tuple2<BlockKey, Hidden>> embedded(String model, Iterator<Tuple2<BlockKey, Hidden>> it) {
    LlamaModel m = PplJob.Loaded.get(model).model;
    return new Iterator<>() {
      @Override
      public boolean hasNext() {
        return it.hasNext();
      }

      @Override
      public Tuple2<BlockKey, Hidden> next() {
        Tuple2<BlockKey, Hidden> e = it.next();
        Hidden h = e._2();
        float[] x = m.embed(ints(h.x()));
        return new Tuple2<>(e._1(), new Hidden(h.doc(), h.index(), h.start(), h.len(), bytes(x), h.targets()));
      }
    };
  }

  /** Step 1: the chunk's keys and values, to every block that sees them. */
  static List<Tuple2<RouteKey, Kv>> route(String model, int layer, Hidden h, Plan plan) {
    FaultHooks.at(FaultHooks.layerStage(layer, FaultHooks.MAP));
    LlamaModel.KeysValues kv = PplJob.Loaded.get(model).model.keysValues(layer, floats(h.x()), h.start(), h.len());
    Kv msg = new Kv(h.start(), h.len(), bytes(kv.k().data()), bytes(kv.v().data()));
    long last = plan.lastBlockSeeing(h.doc(), h.index());
    List<Tuple2<RouteKey, Kv>> out = new ArrayList<>();
    for (long b = h.index(); b <= last; b++) {
      out.add(new Tuple2<>(new RouteKey(h.doc(), b, h.index()), msg));
    }
    return out;
  }

  /** Step 2, per task: for each block in order, its visible chunks from the sorted stream, then the layer. */
  static final class LayerIterator implements Iterator<Tuple2<BlockKey, Hidden>> {
    private final LlamaModel model;
    private final LlamaConfig cfg;
    private final int layer;
    private final Iterator<Tuple2<BlockKey, Hidden>> blocks;
    private final Iterator<Tuple2<RouteKey, Kv>> kvs;
    private final Plan plan;
    private final CollectionAccumulator<double[]> taskSeconds;
    private long nanos;
    private boolean reported;

    LayerIterator(String model, int layer, Iterator<Tuple2<BlockKey, Hidden>> blocks,
        Iterator<Tuple2<RouteKey, Kv>> kvs, Plan plan, CollectionAccumulator<double[]> taskSeconds) {
      this.taskSeconds = taskSeconds;
      this.model = PplJob.Loaded.get(model).model;
      this.cfg = this.model.config();
      this.layer = layer;
      this.blocks = blocks;
      this.kvs = kvs;
      this.plan = plan;
    }

    @Override
    public boolean hasNext() {
      if (!blocks.hasNext() && kvs.hasNext()) {
        RouteKey k = kvs.next()._1();
        throw new IllegalStateException("layer " + layer + ": keys of document " + k.doc() + " chunk " + k.chunk()
            + " arrived for block " + k.block() + ", which is not in this task");
      }
      if (!blocks.hasNext() && !reported) {
        reported = true;
        taskSeconds.add(new double[] {layer, nanos / 1e9});
      }
      return blocks.hasNext();
    }

    @Override
    public Tuple2<BlockKey, Hidden> next() {
      FaultHooks.at(FaultHooks.layerStage(layer, FaultHooks.REDUCE));
      long t0 = System.nanoTime();
      Tuple2<BlockKey, Hidden> e = blocks.next();
      Hidden h = e._2();
      long first = plan.firstChunkSeen(h.doc(), h.index());
      int n = Math.toIntExact(h.index() - first + 1);
      Iterator<LlamaModel.KeysValues> visible = new Iterator<>() {
        long expect = first;

        @Override
        public boolean hasNext() {
          return expect <= h.index();
        }

        @Override
        public LlamaModel.KeysValues next() {
          if (!hasNext()) {
            throw new NoSuchElementException();
          }
          Tuple2<RouteKey, Kv> kv = kvs.hasNext() ? kvs.next() : null;
          RouteKey want = new RouteKey(h.doc(), h.index(), expect);
          if (kv == null || !kv._1().equals(want)) {
            throw new IllegalStateException("layer " + layer + ": block " + h.index() + " of document " + h.doc()
                + " expected the keys of chunk " + expect + ", got " + (kv == null ? "none" : kv._1()));
          }
          expect++;
          Kv m = kv._2();
          int hd = cfg.headDim;
          return new LlamaModel.KeysValues(m.start(), new Tensor(floats(m.k()), 1, cfg.kvHeads, m.len(), hd),
              new Tensor(floats(m.v()), 1, cfg.kvHeads, m.len(), hd));
        }
      };
      float[] x = model.layer(layer, floats(h.x()), h.start(), h.len(), n, visible);
      if (visible.hasNext()) {
        throw new IllegalStateException("layer " + layer + ": block " + h.index() + " did not take all its chunks");
      }
      nanos += System.nanoTime() - t0;
      return new Tuple2<>(e._1(), new Hidden(h.doc(), h.index(), h.start(), h.len(), bytes(x), h.targets()));
    }
  }

  // ------------------------------------------------------------------ the plan

  static final Comparator<BlockKey> BLOCK_ORDER = (Comparator<BlockKey> & Serializable) (a, b) -> {
    int c = Long.compare(a.doc(), b.doc());
    return c != 0 ? c : Long.compare(a.block(), b.block());
  };

  static final Comparator<RouteKey> ROUTE_ORDER = (Comparator<RouteKey> & Serializable) (a, b) -> {
    int c = Long.compare(a.doc(), b.doc());
    if (c == 0) {
      c = Long.compare(a.block(), b.block());
    }
    return c != 0 ? c : Long.compare(a.chunk(), b.chunk());
  };

  /**
   * Which chunks each block sees and which task holds each block. Made on the driver from the long
   * documents' lengths; the partitioner of every shuffle of the split path.
   */
  static final class Plan extends Partitioner {
    private static final long serialVersionUID = 1L;
    final long documents, tokens, chunks;
    private final int partitions;
    private final int chunkLen;
    private final AttentionOptions attn;
    /** doc -> its token count (the chunks follow from it). */
    private final Map<Long, Long> lengths;
    /** (doc, block) -> task. */
    private final Map<BlockKey, Integer> task;
    /** Estimated cost per task (FLOPs of a layer), for the record. */
    final double[] load;

    private Plan(Map<Long, Long> lengths, int chunkLen, AttentionOptions attn, int partitions,
        Map<BlockKey, Integer> task, double[] load, long tokens, long chunks) {
      this.lengths = lengths;
      this.chunkLen = chunkLen;
      this.attn = attn;
      this.partitions = partitions;
      this.task = task;
      this.load = load;
      this.documents = lengths.size();
      this.tokens = tokens;
      this.chunks = chunks;
    }

    /**
     * lengths: (doc index, token count) of each long document. Cost of a block per layer: its rows
     * times (the dense work per token + the attention work per visible key); {@link Balance#COST}
     * gives blocks, heaviest first, to the least loaded task (ties: the lower task), so early causal
     * blocks fill around late ones instead of one task holding the whole tail.
     */
    static Plan make(List<long[]> lengths, int chunkLen, AttentionOptions attn, LlamaConfig cfg, int partitions,
        Balance balance) {
      Map<Long, Long> len = new HashMap<>();
      long tokens = 0;
      for (long[] l : lengths) {
        len.put(l[0], l[1]);
        tokens += l[1];
      }
      Plan shape = new Plan(len, chunkLen, attn, Math.max(1, partitions), Map.of(), new double[0], tokens, 0);
      double dense = cfg.denseFlopsPerToken();
      double perPair = 4.0 * cfg.heads * cfg.headDim;
      List<Object[]> blocks = new ArrayList<>(); // {BlockKey, cost}
      List<long[]> sorted = new ArrayList<>(lengths);
      sorted.sort(Comparator.comparingLong(l -> l[0]));
      for (long[] l : sorted) {
        long n = shape.chunkCount(l[0]);
        for (long b = 0; b < n; b++) {
          long rows = shape.rows(l[0], b);
          long keys = 0;
          for (long c = shape.firstChunkSeen(l[0], b); c <= b; c++) {
            keys += shape.rows(l[0], c);
          }
          blocks.add(new Object[] {new BlockKey(l[0], b), rows * (dense + perPair * keys)});
        }
      }
      int p = shape.partitions;
      Map<BlockKey, Integer> task = new HashMap<>();
      double[] load = new double[p];
      if (balance == Balance.CONTIGUOUS) {
        for (int i = 0; i < blocks.size(); i++) {
          int t = (int) ((long) i * p / blocks.size());
          task.put((BlockKey) blocks.get(i)[0], t);
          load[t] += (double) blocks.get(i)[1];
        }
      } else {
        List<Object[]> byCost = new ArrayList<>(blocks);
        byCost.sort((a, b) -> Double.compare((double) b[1], (double) a[1])); // stable: ties keep (doc, block) order
        PriorityQueue<int[]> free = new PriorityQueue<>((a, b) -> Double.compare(load[a[0]], load[b[0]]) != 0
            ? Double.compare(load[a[0]], load[b[0]]) : Integer.compare(a[0], b[0]));
        for (int t = 0; t < p; t++) {
          free.add(new int[] {t});
        }
        for (Object[] b : byCost) {
          int[] t = free.poll();
          task.put((BlockKey) b[0], t[0]);
          load[t[0]] += (double) b[1];
          free.add(t);
        }
      }
      return new Plan(len, chunkLen, attn, p, task, load, tokens, blocks.size());
    }

    /** The busiest task's estimated work over the mean task's. */
    double spread() {
      double max = 0, sum = 0;
      for (double l : load) {
        max = Math.max(max, l);
        sum += l;
      }
      return sum > 0 ? max / (sum / load.length) : 1;
    }

    long chunkCount(long doc) {
      long m1 = lengths.get(doc) - 1;
      return (m1 + chunkLen - 1) / chunkLen;
    }

    long rows(long doc, long c) {
      long m1 = lengths.get(doc) - 1;
      return Math.min(chunkLen, m1 - c * chunkLen);
    }

    private boolean sees(long doc, long block, long chunk) {
      long bs = block * chunkLen, cs = chunk * chunkLen;
      return attn.anyVisible(bs, bs + rows(doc, block) - 1, cs, cs + rows(doc, chunk) - 1);
    }

    /** The first chunk block b sees; it sees every chunk from there to itself (causal, window). */
    long firstChunkSeen(long doc, long block) {
      long c = block;
      while (c > 0 && sees(doc, block, c - 1)) {
        c--;
      }
      return c;
    }

    /** The last block that sees chunk c; every block from c to there sees it. */
    long lastBlockSeeing(long doc, long chunk) {
      long b = chunk, n = chunkCount(doc);
      while (b + 1 < n && sees(doc, b + 1, chunk)) {
        b++;
      }
      return b;
    }

    @Override
    public int numPartitions() {
      return partitions;
    }

    @Override
    public int getPartition(Object key) {
      BlockKey k = key instanceof RouteKey r ? new BlockKey(r.doc(), r.block()) : (BlockKey) key;
      Integer t = task.get(k);
      if (t == null) {
        throw new IllegalStateException("no task planned for block " + k);
      }
      return t;
    }
  }

  // ------------------------------------------------------------------ metrics

  /** Shuffle bytes written, from Spark's task metrics (the listener bus delivers them late: wait for it). */
  static final class ShuffleBytes extends SparkListener {
    private long bytes;

    @Override
    public synchronized void onTaskEnd(SparkListenerTaskEnd e) {
      if (e.taskMetrics() != null) {
        bytes += e.taskMetrics().shuffleWriteMetrics().bytesWritten();
      }
    }

    synchronized long bytes() {
      return bytes;
    }
  }

  // ------------------------------------------------------------------ wire format

  static byte[] bytes(float[] f) {
    ByteBuffer b = ByteBuffer.allocate(f.length * 4).order(ByteOrder.LITTLE_ENDIAN);
    b.asFloatBuffer().put(f);
    return b.array();
  }

  static float[] floats(byte[] b) {
    float[] f = new float[b.length / 4];
    ByteBuffer.wrap(b).order(ByteOrder.LITTLE_ENDIAN).asFloatBuffer().get(f);
    return f;
  }

  static byte[] bytes(int[] v) {
    ByteBuffer b = ByteBuffer.allocate(v.length * 4).order(ByteOrder.LITTLE_ENDIAN);
    b.asIntBuffer().put(v);
    return b.array();
  }

  static int[] ints(byte[] b) {
    int[] v = new int[b.length / 4];
    ByteBuffer.wrap(b).order(ByteOrder.LITTLE_ENDIAN).asIntBuffer().get(v);
    return v;
  }
}
