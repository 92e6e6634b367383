package io.longctx.spark;

import io.longctx.kernels.AttentionOptions;
import java.io.Serializable;
import java.util.ArrayList;
import java.util.Arrays;
import java.util.Comparator;
import java.util.HashMap;
import java.util.List;
import java.util.Map;
import java.util.PriorityQueue;

/**
 * The (query block, key chunk) pair plan, made on the driver from one small row per chunk and per
 * block ({@link RangeMeta}): which chunks each block sees (pairs invisible by position are skipped)
 * and, for prefill, the pairs of blocks computed together, which of them see each chunk and the
 * partition of each ({@link #forPrefill}). Plain functions over plain data, tested without Spark
 * ({@code PairPlanTest}); the job broadcasts the plan.
 */
final class PairPlan implements Serializable {
  private static final long serialVersionUID = 1L;

  /** A document's chunk or query block by index: the typed key of the plan (and the job's groups). */
  record Key(String doc, long index) implements Serializable {}

  /** Block -> the chunk indices it sees, ascending (may be empty). */
  final Map<Key, long[]> chunksOf;
  /**
   * Chunk -> the prefill groups that see it, each named by its first query block, ascending (absent:
   * none). Each block is its own group until {@link #forPrefill}.
   */
  final Map<Key, long[]> seenBy;
  /** Prefill: block -> the blocks of its group, ascending (absent: alone); see {@link #forPrefill}. */
  final Map<Key, long[]> groups;
  /** Prefill: a group, by its first block -> its partition of the pair stage (of {@link #partitions}). */
  final Map<Key, Integer> partitionOf;
  final int partitions;
  final long documents, tokens, chunks, queries, computed, skipped;

  private PairPlan(Map<Key, long[]> chunksOf, Map<Key, long[]> seenBy, Map<Key, long[]> groups,
      Map<Key, Integer> partitionOf, int partitions, long documents, long tokens, long chunks, long queries,
      long computed, long skipped) {
    this.chunksOf = chunksOf;
    this.seenBy = seenBy;
    this.groups = groups;
    this.partitionOf = partitionOf;
    this.partitions = partitions;
    this.documents = documents;
    this.tokens = tokens;
    this.chunks = chunks;
    this.queries = queries;
    this.computed = computed;
    this.skipped = skipped;
  }

  /**
   * Plans every block against the chunks of its document. A block of a document without keys is bad
   * input (named by a sample query and the two paths); no chunk at all is bad input too.
   */
  static PairPlan make(List<RangeMeta> chunkMeta, List<RangeMeta> blockMeta, AttentionOptions attn, String keysPath,
      String queriesPath) {
    if (chunkMeta.isEmpty()) {
      throw new InputError("KEYS " + keysPath + ": no key rows");
    }
    Map<String, List<RangeMeta>> chunksByDoc = new HashMap<>();
    long tokens = 0;
    for (RangeMeta c : chunkMeta) {
      chunksByDoc.computeIfAbsent(c.getDocId(), d -> new ArrayList<>()).add(c);
      tokens += c.getCount();
    }
    Map<Key, long[]> chunksOf = new HashMap<>();
    Map<Key, List<Long>> seen = new HashMap<>();
    long computed = 0, skipped = 0, queries = 0;
    for (RangeMeta b : blockMeta) {
      queries += b.getCount();
      List<RangeMeta> cs = chunksByDoc.get(b.getDocId());
      if (cs == null) {
        throw new InputError("QUERIES " + queriesPath + ": query '" + b.getSample() + "' refers to document '"
            + b.getDocId() + "', which has no keys in KEYS " + keysPath);
      }
      long[] visible = cs.stream().filter(c -> visible(b, c, attn)).mapToLong(RangeMeta::getIndex).sorted().toArray();
      computed += visible.length;
      skipped += cs.size() - visible.length;
      chunksOf.put(new Key(b.getDocId(), b.getIndex()), visible);
      for (long c : visible) {
        seen.computeIfAbsent(new Key(b.getDocId(), c), k -> new ArrayList<>()).add(b.getIndex());
      }
    }
    Map<Key, long[]> seenBy = new HashMap<>();
    seen.forEach((k, v) -> seenBy.put(k, v.stream().mapToLong(Long::longValue).sorted().toArray()));
    return new PairPlan(chunksOf, seenBy, Map.of(), Map.of(), 0, chunksByDoc.size(), tokens, chunkMeta.size(), queries,
        computed, skipped);
  }

  /**
   * This plan made ready for prefill's pair stage: query blocks paired into groups, each group computed
   * whole by one task, and the groups placed in at most {@code maxPartitions} partitions.
   *
   * <p>Pairs: a causal document's blocks see 1, 2, ..., n chunks; block b with block n-1-b receives each
   * chunk the two see once (about a quarter fewer K/V rows shuffled on a long document) and makes groups
   * of equal work. Within each document the heaviest block left is paired with the lightest while the two
   * see at most a quarter more chunks than the document's heaviest block alone, so the longest group
   * grows by at most that much (blocks that each see about as many chunks, as with a window much shorter
   * than the document, mostly stay alone). The bits do not change: each block's state is the same merge
   * of the same pairs.
   *
   * <p>Placement: heaviest group first, each to the partition with the least work so far (ties: the
   * lower index), so partition 0 holds the heaviest and Spark, launching tasks in partition order, starts
   * the long ones first instead of finding one at the end (hashing put two groups in one task by chance).
   */
  PairPlan forPrefill(int maxPartitions) {
    if (maxPartitions < 1) {
      throw new IllegalArgumentException("partitions must be at least 1, got " + maxPartitions);
    }
    Map<String, List<long[]>> byDoc = new HashMap<>(); // doc -> {block, chunks it sees}
    chunksOf.forEach((k, cs) -> byDoc.computeIfAbsent(k.doc(), d -> new ArrayList<>()).add(new long[] {k.index(),
        cs.length}));
    Map<Key, long[]> paired = new HashMap<>();
    List<Object[]> work = new ArrayList<>(); // {doc, first block, chunks its blocks see}
    byDoc.forEach((doc, bs) -> {
      bs.sort((a, b) -> a[1] != b[1] ? Long.compare(b[1], a[1]) : Long.compare(a[0], b[0]));
      long limit = bs.get(0)[1] + bs.get(0)[1] / 4;
      int j = bs.size() - 1;
      for (int i = 0; i <= j; i++) {
        long x = bs.get(i)[0], w = bs.get(i)[1];
        if (i < j && w + bs.get(j)[1] <= limit) {
          long y = bs.get(j)[0];
          w += bs.get(j--)[1];
          long[] g = {Math.min(x, y), Math.max(x, y)};
          paired.put(new Key(doc, x), g);
          paired.put(new Key(doc, y), g);
          x = g[0];
        }
        work.add(new Object[] {doc, x, w});
      }
    });
    work.sort(Comparator.comparingLong((Object[] g) -> -(long) g[2]).thenComparing(g -> (String) g[0])
        .thenComparingLong(g -> (long) g[1]));
    int parts = Math.min(maxPartitions, work.size());
    PriorityQueue<long[]> load = new PriorityQueue<>((a, b) -> a[0] != b[0] ? Long.compare(a[0], b[0])
        : Long.compare(a[1], b[1])); // {work so far, partition}
    for (int i = 0; i < parts; i++) {
      load.add(new long[] {0, i});
    }
    Map<Key, Integer> partitionOf = new HashMap<>();
    for (Object[] g : work) {
      long[] least = load.poll();
      partitionOf.put(new Key((String) g[0], (long) g[1]), (int) least[1]);
      least[0] += (long) g[2];
      load.add(least);
    }
    Map<Key, long[]> seenByGroups = new HashMap<>();
    seenBy.forEach((k, bs) -> seenByGroups.put(k, Arrays.stream(bs).map(b -> {
      long[] g = paired.get(new Key(k.doc(), b));
      return g != null ? g[0] : b;
    }).distinct().sorted().toArray()));
    return new PairPlan(chunksOf, seenByGroups, paired, partitionOf, parts, documents, tokens, chunks, queries,
        computed, skipped);
  }

  /** Whether any query of the block may see any key of the chunk (by position ranges). */
  static boolean visible(RangeMeta block, RangeMeta chunk, AttentionOptions attn) {
    return !block.getHasPos() || attn.anyVisible(block.getMin(), block.getMax(), chunk.getMin(), chunk.getMax());
  }

  /** The chunks a block sees (empty when none). */
  long[] chunksOf(String doc, long block) {
    return chunksOf.getOrDefault(new Key(doc, block), new long[0]);
  }

  /** Prefill: the blocks of block b's group, ascending (b alone when it is not paired). */
  long[] groupOf(String doc, long block) {
    long[] g = groups.get(new Key(doc, block));
    return g != null ? g : new long[] {block};
  }

  /** Prefill: the pair stage's partition of the group whose first block is {@code first}. */
  int partitionOf(String doc, long first) {
    Integer p = partitionOf.get(new Key(doc, first));
    if (p == null) {
      throw new IllegalStateException("doc '" + doc + "': no partition planned for the group of block " + first);
    }
    return p;
  }

  /** Prefill: the groups that see a chunk, by their first blocks (empty when none). */
  long[] seenBy(String doc, long chunk) {
    return seenBy.getOrDefault(new Key(doc, chunk), new long[0]);
  }
}
