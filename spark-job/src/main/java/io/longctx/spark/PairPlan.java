package io.longctx.spark;

import io.longctx.kernels.AttentionOptions;
import java.io.Serializable;
import java.util.ArrayList;
import java.util.Arrays;
import java.util.HashMap;
import java.util.List;
import java.util.Map;

/**
 * The (query block, key chunk) pair plan, made on the driver from one small row per chunk and per
 * block ({@link RangeMeta}): which chunks each block sees (pairs invisible by position are skipped)
 * and, for prefill's routing, which blocks see each chunk. Plain functions over plain data, tested
 * without Spark ({@code PairPlanTest}); the job broadcasts the two maps.
 */
final class PairPlan implements Serializable {
  private static final long serialVersionUID = 1L;

  /** A document's chunk or query block by index: the typed key of the plan (and the job's groups). */
  record Key(String doc, long index) implements Serializable {}

  /** Block -> the chunk indices it sees, ascending (may be empty). */
  final Map<Key, long[]> chunksOf;
  /** Chunk -> the block indices that see it, ascending (prefill routing; absent: none). */
  final Map<Key, long[]> blocksOf;
  final long documents, tokens, chunks, queries, computed, skipped;

  private PairPlan(Map<Key, long[]> chunksOf, Map<Key, long[]> blocksOf, long documents, long tokens, long chunks,
      long queries, long computed, long skipped) {
    this.chunksOf = chunksOf;
    this.blocksOf = blocksOf;
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
    Map<Key, long[]> blocksOf = new HashMap<>();
    seen.forEach((k, v) -> {
      long[] a = v.stream().mapToLong(Long::longValue).toArray();
      Arrays.sort(a);
      blocksOf.put(k, a);
    });
    return new PairPlan(chunksOf, blocksOf, chunksByDoc.size(), tokens, chunkMeta.size(), queries, computed, skipped);
  }

  /** Whether any query of the block may see any key of the chunk (by position ranges). */
  static boolean visible(RangeMeta block, RangeMeta chunk, AttentionOptions attn) {
    return !block.getHasPos() || attn.anyVisible(block.getMin(), block.getMax(), chunk.getMin(), chunk.getMax());
  }

  /** The chunks a block sees (empty when none). */
  long[] chunksOf(String doc, long block) {
    return chunksOf.getOrDefault(new Key(doc, block), new long[0]);
  }

  /** The blocks that see a chunk (empty when none). */
  long[] blocksOf(String doc, long chunk) {
    return blocksOf.getOrDefault(new Key(doc, chunk), new long[0]);
  }
}
