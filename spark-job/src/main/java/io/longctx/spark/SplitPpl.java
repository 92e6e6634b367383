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
 *       queries, one attention state per group of consecutive chunks merged with the one LSE tree, output projection, MLP).
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

  /** Chunk {@code index}'s tokens and next-token targets, before the embedding. */
  record ChunkTokens(long doc, long index, long start, int[] tokens, int[] targets) implements Serializable {}

  /** Chunk {@code index}'s hidden rows (float32 little-endian bytes, len x hidden) and next-token targets. */
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
      return String.format(Locale.ROOT, "%d document%s split into %d chunks over %d task%s per layer, %d layer%s; "
          + "shuffle %.0f bytes/token/layer; planned work of the busiest task %.2fx the mean; per layer the "
          + "slowest task takes %.3f s, %.2fx the mean task (medians over layers)", documents,
          documents == 1 ? "" : "s", chunks, partitions, partitions == 1 ? "" : "s", layers, layers == 1 ? "" : "s", shuffleBytesPerTokenLayer(), plannedSpread, slowestTaskSeconds(), taskSpread());
    }
  }

  /** How chunks are placed in tasks: by estimated cost (default) or in contiguous runs (for comparison). */
  enum Balance {
    COST, CONTIGUOUS
  }

  /** Result rows per long document: (index, sum, per-token log-probabilities in position order). */
  record Scored(long index, double sum, float[] logprobs) implements Serializable {}

  /**
   * The split documents' scores (computed when read, from the last layer's checkpoint) and the run's
   * figures; {@link #close} drops the last layer's cached rows once the scores are written.
   */
  static final class Result implements AutoCloseable {
    final JavaRDD<Scored> scored;
    final Stats stats;
    private final JavaPairRDD<BlockKey, Hidden> last;

    Result(JavaRDD<Scored> scored, Stats stats, JavaPairRDD<BlockKey, Hidden> last) {
      this.scored = scored;
      this.stats = stats;
      this.last = last;
    }

    @Override
    public void close() {
      last.unpersist(false);
    }
  }

  /**
   * Runs the layers over the long documents of {@code docs} (every element is one), one Spark job
   * per layer, checkpointing into {@code checkpointDir}, which this creates and the caller deletes.
   * Sets the SparkContext's checkpoint directory (Spark has one per context) as it marks the first
   * layer, and again only for a layer after another run set it; leaves it set there.
   */
  static Result score(SparkSession spark, JavaRDD<Doc> docs, List<long[]> lengths, Map<Long, String> docIds,
      String model, LlamaConfig cfg, int chunkLen, int partitions, Balance balance, Path checkpointDir,
      PrintStream progress) throws IOException {
    HashMap<Long, String> ids = new HashMap<>(docIds); // serializable, into the tasks: errors name documents
    AttentionOptions attn = cfg.attention();
    Plan plan = Plan.make(lengths, chunkLen, attn, cfg, partitions, balance);
    FileSystem fs = checkpointDir.getFileSystem(spark.sparkContext().hadoopConfiguration());
    if (!fs.mkdirs(checkpointDir)) {
      throw new IOException("cannot create the checkpoint directory " + checkpointDir);
    }
    CollectionAccumulator<double[]> taskSeconds = spark.sparkContext().collectionAccumulator("longctx ppl layer tasks");
    ShuffleBytes shuffle = new ShuffleBytes();
    long t0 = System.nanoTime();
    final int len = chunkLen;
    // Chunks of tokens to their blocks' tasks, sorted by (document, block): the order of every layer.
    Sessions.label(spark, "longctx ppl: long documents, chunks and embeddings");
    JavaPairRDD<BlockKey, Hidden> hidden = docs.flatMapToPair(d -> chunks(d, len).iterator())
        .repartitionAndSortWithinPartitions(plan, BLOCK_ORDER)
        .mapPartitionsToPair(it -> embedded(model, it), true);
    spark.sparkContext().addSparkListener(shuffle);
    try {
      for (int l = 0; l < cfg.layers; l++) {
        final int layer = l;
        Sessions.label(spark, "longctx ppl: long documents, layer " + (l + 1) + "/" + cfg.layers);
        JavaPairRDD<RouteKey, Kv> routed = hidden.flatMapToPair(h -> named(ids, h._2().doc(),
                () -> route(model, layer, h._2(), plan)).iterator())
            .repartitionAndSortWithinPartitions(plan, ROUTE_ORDER);
        JavaPairRDD<BlockKey, Hidden> next = JavaPairRDD.fromJavaRDD(hidden.zipPartitions(routed,
            (hs, kvs) -> new LayerIterator(model, layer, hs, kvs, plan, ids, taskSeconds)));
        // Persisted so that writing the checkpoint reads the layer instead of computing it again; on
        // disk, streamed: a task never holds its partition's rows in memory (a 2 GiB heap is enough).
        next.persist(StorageLevel.DISK_ONLY());
        markForCheckpoint(spark, next, checkpointDir);
        next.count();
        hidden.unpersist(false);
        deleteCheckpoint(fs, hidden); // the layer before: no longer needed for recovery
        hidden = next;
        if (progress != null) {
          double sec = (System.nanoTime() - t0) / 1e9;
          progress.printf(Locale.ROOT, "longctx ppl: layer %d/%d done for %d long document%s (%d tokens), %.0f s%n",
              l + 1, cfg.layers, plan.documents, plan.documents == 1 ? "" : "s", plan.tokens, sec);
          progress.flush();
        }
      }
      try {
        spark.sparkContext().listenerBus().waitUntilEmpty(); // the shuffle metrics arrive late
      } catch (java.util.concurrent.TimeoutException e) {
        // a busy listener bus: the shuffle figure may miss the last tasks; the scores are unaffected
      }
    } catch (RuntimeException e) {
      hidden.unpersist(false); // a failed layer: nothing of the run stays cached (the files go with the directory)
      throw e;
    } finally {
      spark.sparkContext().removeSparkListener(shuffle);
    }
    Sessions.label(spark, "longctx ppl: long documents, log-probabilities");
    JavaRDD<Scored> scored = hidden.mapToPair(h -> {
      Hidden c = h._2();
      double[] lp = named(ids, c.doc(), () -> PplJob.Loaded.get(model).model.logprobs(floats(c.x()), c.start(),
          c.targets()));
      return new Tuple2<>(c.doc(), new Tuple2<>(c.index(), lp));
    }).groupByKey().map(g -> sumInOrder(g._1(), g._2()));
    double[][] secs = new double[cfg.layers][];
    for (int l = 0; l < cfg.layers; l++) {
      final int layer = l;
      secs[l] = taskSeconds.value().stream().filter(t -> t[0] == layer).mapToDouble(t -> t[1]).toArray();
    }
    return new Result(scored, new Stats(plan.documents, plan.tokens, plan.chunks, cfg.layers, plan.numPartitions(),
        shuffle.bytes(), secs, plan.spread()), hidden);
  }

  /**
   * Held while setting the context's checkpoint directory and marking an RDD ({@link #markForCheckpoint});
   * package-private for the test that sets the directory from another thread as a second run would.
   */
  static final Object CHECKPOINT_DIR = new Object();

  /**
   * Marks rdd for checkpointing into dir. Spark keeps one checkpoint directory per context and an RDD
   * takes it when marked, so the two happen under one lock: two runs in one context (two threads of
   * one application) each checkpoint into their own directory. With the directory set once per run,
   * the second run's setting took the first run's later layers into the second's directory, which
   * the second deleted when done (and a layer after that was written to a directory no one deleted).
   */
  static void markForCheckpoint(SparkSession spark, JavaPairRDD<?, ?> rdd, Path dir) {
    synchronized (CHECKPOINT_DIR) {
      // Set only when the context holds another directory than this run last set: each setting makes
      // a new subdirectory and, on a non-local master, logs Spark's warning about a local path (once
      // per layer before; a shared mount is a fine place on a cluster).
      scala.Option<String> now = spark.sparkContext().getCheckpointDir();
      if (!(dir.equals(lastDir) && now.isDefined() && now.get().equals(lastSet))) {
        spark.sparkContext().setCheckpointDir(dir.toString());
        lastDir = dir;
        lastSet = spark.sparkContext().getCheckpointDir().get();
      }
      rdd.checkpoint();
    }
  }

  /** The directory {@link #markForCheckpoint} last set, and what the context then held; guarded by CHECKPOINT_DIR. */
  private static Path lastDir;
  private static String lastSet;

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

  /** Deletes an RDD's checkpoint files, if it was checkpointed. */
  private static void deleteCheckpoint(FileSystem fs, JavaPairRDD<?, ?> rdd) throws IOException {
    if (rdd.getCheckpointFile().isPresent()) {
      fs.delete(new Path(rdd.getCheckpointFile().get()), true);
    }
  }

  // ------------------------------------------------------------------ tasks

  static List<Tuple2<BlockKey, ChunkTokens>> chunks(Doc d, int chunkLen) {
    int[] t = d.tokens();
    int m1 = t.length - 1; // the last token predicts nothing
    List<Tuple2<BlockKey, ChunkTokens>> out = new ArrayList<>();
    for (int s = 0, c = 0; s < m1; s += chunkLen, c++) {
      int len = Math.min(chunkLen, m1 - s);
      out.add(new Tuple2<>(new BlockKey(d.index(), c), new ChunkTokens(d.index(), c, s,
          Arrays.copyOfRange(t, s, s + len), Arrays.copyOfRange(t, s + 1, s + len + 1))));
    }
    return out;
  }

  private static Iterator<Tuple2<BlockKey, Hidden>> embedded(String model,
      Iterator<Tuple2<BlockKey, ChunkTokens>> it) {
    LlamaModel m = PplJob.Loaded.get(model).model;
    return new Iterator<>() {
      @Override
      public boolean hasNext() {
        return it.hasNext();
      }

      @Override
      public Tuple2<BlockKey, Hidden> next() {
        Tuple2<BlockKey, ChunkTokens> e = it.next();
        ChunkTokens c = e._2();
        return new Tuple2<>(e._1(), new Hidden(c.doc(), c.index(), c.start(), c.tokens().length,
            bytes(m.embed(c.tokens())), c.targets()));
      }
    };
  }

  /** A model step on document {@code doc}; where its values leave float32, bad input naming the document. */
  private static <T> T named(Map<Long, String> docIds, long doc, java.util.function.Supplier<T> step) {
    try {
      return step.get();
    } catch (LlamaModel.NumericOverflowException e) {
      throw new InputError("doc '" + docIds.get(doc) + "', " + e.getMessage());
    }
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
    private final Map<Long, String> docIds;
    private final CollectionAccumulator<double[]> taskSeconds;
    private long nanos;
    private boolean reported;

    LayerIterator(String model, int layer, Iterator<Tuple2<BlockKey, Hidden>> blocks,
        Iterator<Tuple2<RouteKey, Kv>> kvs, Plan plan, Map<Long, String> docIds,
        CollectionAccumulator<double[]> taskSeconds) {
      this.taskSeconds = taskSeconds;
      this.docIds = docIds;
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
      float[] x = named(docIds, h.doc(), () -> model.layer(layer, floats(h.x()), h.start(), h.len(), n, visible));
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
   * documents' lengths; the partitioner of every shuffle of the split path, so it travels with each
   * stage: a few arrays, 4 bytes per block.
   */
  static final class Plan extends Partitioner {
    private static final long serialVersionUID = 1L;
    final long documents, tokens, chunks;
    private final int partitions;
    private final int chunkLen;
    private final AttentionOptions attn;
    /** The long documents' indices, ascending, and their token counts. */
    private final long[] docs, lengths;
    /** Global number of each document's block 0 (running sum of chunk counts). */
    private final int[] base;
    /** The task of each block, by global number. */
    private final int[] task;
    /** Estimated work per task (FLOPs of a layer), for the record. */
    final double[] load;

    private Plan(long[] docs, long[] lengths, int chunkLen, AttentionOptions attn, int partitions) {
      this.docs = docs;
      this.lengths = lengths;
      this.chunkLen = chunkLen;
      this.attn = attn;
      this.partitions = partitions;
      this.base = new int[docs.length];
      long blocks = 0, t = 0;
      for (int i = 0; i < docs.length; i++) {
        base[i] = Math.toIntExact(blocks);
        blocks += chunkCount(docs[i]);
        t += lengths[i];
      }
      this.task = new int[Math.toIntExact(blocks)];
      this.load = new double[partitions];
      this.documents = docs.length;
      this.tokens = t;
      this.chunks = blocks;
    }

    /**
     * lengths: (doc index, token count) of each long document. Cost of a block per layer: its rows
     * times (the dense work per token + the attention work per visible key); {@link Balance#COST}
     * gives blocks, heaviest first, to the least loaded task (ties: the lower task), so early causal
     * blocks fill in around late ones instead of one task holding the whole tail.
     */
    static Plan make(List<long[]> lengths, int chunkLen, AttentionOptions attn, LlamaConfig cfg, int partitions,
        Balance balance) {
      List<long[]> sorted = new ArrayList<>(lengths);
      sorted.sort(Comparator.comparingLong(l -> l[0]));
      Plan p = new Plan(sorted.stream().mapToLong(l -> l[0]).toArray(), sorted.stream().mapToLong(l -> l[1]).toArray(),
          chunkLen, attn, Math.max(1, partitions));
      double dense = cfg.denseFlopsPerToken();
      double perPair = 4.0 * cfg.heads * cfg.headDim;
      double[] cost = new double[p.task.length];
      for (int i = 0; i < p.docs.length; i++) {
        long n = p.chunkCount(p.docs[i]);
        for (long b = 0; b < n; b++) {
          long keys = 0;
          for (long c = p.firstChunkSeen(p.docs[i], b); c <= b; c++) {
            keys += p.rows(p.docs[i], c);
          }
          cost[p.base[i] + (int) b] = p.rows(p.docs[i], b) * (dense + perPair * keys);
        }
      }
      if (balance == Balance.CONTIGUOUS) {
        for (int g = 0; g < cost.length; g++) {
          p.task[g] = (int) ((long) g * p.partitions / cost.length);
          p.load[p.task[g]] += cost[g];
        }
      } else {
        Integer[] byCost = new Integer[cost.length];
        for (int g = 0; g < cost.length; g++) {
          byCost[g] = g;
        }
        Arrays.sort(byCost, (x, y) -> Double.compare(cost[y], cost[x])); // stable: ties keep block order
        PriorityQueue<Integer> free = new PriorityQueue<>((x, y) -> p.load[x] != p.load[y]
            ? Double.compare(p.load[x], p.load[y]) : Integer.compare(x, y));
        for (int t = 0; t < p.partitions; t++) {
          free.add(t);
        }
        for (int g : byCost) {
          int t = free.poll();
          p.task[g] = t;
          p.load[t] += cost[g];
          free.add(t);
        }
      }
      return p;
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

    private int position(long doc) {
      int i = Arrays.binarySearch(docs, doc);
      if (i < 0) {
        throw new IllegalStateException("document " + doc + " is not in the split plan");
      }
      return i;
    }

    long chunkCount(long doc) {
      long m1 = lengths[position(doc)] - 1; // the last token predicts nothing
      return (m1 + chunkLen - 1) / chunkLen;
    }

    long rows(long doc, long c) {
      long m1 = lengths[position(doc)] - 1;
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
      long doc, block;
      if (key instanceof RouteKey r) {
        doc = r.doc();
        block = r.block();
      } else {
        BlockKey k = (BlockKey) key;
        doc = k.doc();
        block = k.block();
      }
      int i = position(doc);
      if (block < 0 || block >= chunkCount(doc)) {
        throw new IllegalStateException("document " + doc + " has no block " + block);
      }
      return task[base[i] + (int) block];
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
}
