package io.longctx.kernels;

import java.util.List;
import java.util.Objects;

/**
 * The partial result of attention over some set of keys: for each (row, head) a normalized output
 * vector {@code o} and the natural-log log-sum-exp {@code lse} of the scores (docs/CONVENTIONS.md).
 *
 * <p>Layout, float32: {@code o[(row * heads + head) * dim + d]} and {@code lse[row * heads + head]}.
 * A row is one query token (for batched kernels, row = b * Tq + t). An empty set of keys is
 * {@code (o = 0, lse = -inf)}, the identity of {@link #merge}.
 *
 * <p>Merge is associative and commutative up to rounding, exactly commutative bit for bit, and
 * computed with {@link StrictMath} in float64 so every JVM produces the same bits. Merging many
 * states uses a balanced tree over the list order, so a fixed order gives fixed bits.
 *
 * <p>This class is the only implementation of the merge in longctx: every entry point ({@link
 * #merge}, {@link #mergeAll}, both {@code mergeInto}s, {@code mergeAllWideLse}) runs the one
 * per-entry merge, {@code mergeEntry}, in float64.
 */
public final class AttentionState {

  private final int rows;
  private final int heads;
  private final int dim;
  private final float[] o;
  private final float[] lse;

  private AttentionState(int rows, int heads, int dim, float[] o, float[] lse) {
    this.rows = rows;
    this.heads = heads;
    this.dim = dim;
    this.o = o;
    this.lse = lse;
  }

  /** The identity: every (row, head) has seen no key. */
  public static AttentionState empty(int rows, int heads, int dim) {
    checkShape(rows, heads, dim);
    float[] lse = new float[Math.multiplyExact(rows, heads)];
    java.util.Arrays.fill(lse, Float.NEGATIVE_INFINITY);
    return new AttentionState(rows, heads, dim, new float[Math.multiplyExact(lse.length, dim)], lse);
  }

  /**
   * Wraps arrays in our own convention (natural-log lse, -inf and o = 0 for no keys) without copying.
   * NaN anywhere, an infinite o, an lse of +inf or a non-zero o beside an lse of -inf is rejected
   * with the row and head named; use {@link #fromForeign} for producers that write +inf for empty
   * rows or base-2 lse.
   */
  public static AttentionState of(float[] o, float[] lse, int rows, int heads, int dim) {
    AttentionState s = wrap(o, lse, rows, heads, dim);
    s.validate();
    return s;
  }

  /**
   * Wraps the output of a kernel that wrote every entry itself and checked each one as it did
   * ({@link TileWorker}: finite o, finite or -inf lse): no second scan.
   */
  static AttentionState ofWritten(float[] o, float[] lse, int rows, int heads, int dim) {
    return wrap(o, lse, rows, heads, dim);
  }

  /** Base of the lse a foreign producer wrote. */
  public enum LseBase {
    /** natural log: ours, PyTorch, FlashAttention. */
    E,
    /** log2: FlashInfer. */
    TWO
  }

  /**
   * Converts a state written by another producer into ours, copying: base-2 lse is rescaled to
   * natural log, and +inf or -inf lse (FlashAttention-2 writes +inf for rows that saw no key)
   * becomes the empty state (o = 0, lse = -inf). NaN is rejected with the row and head named.
   */
  public static AttentionState fromForeign(float[] o, float[] lse, int rows, int heads, int dim, LseBase base) {
    java.util.Objects.requireNonNull(base, "base (LseBase.E or LseBase.TWO)");
    AttentionState in = wrap(o, lse, rows, heads, dim);
    float[] outO = o.clone();
    float[] outL = new float[lse.length];
    for (int i = 0; i < lse.length; i++) {
      float l = lse[i];
      if (Float.isNaN(l)) {
        throw in.nanError(i, "lse");
      }
      if (Float.isInfinite(l)) {
        outL[i] = Float.NEGATIVE_INFINITY;
        java.util.Arrays.fill(outO, i * dim, (i + 1) * dim, 0f);
      } else {
        outL[i] = base == LseBase.TWO ? (float) (l * Math.log(2.0)) : l;
      }
    }
    return of(outO, outL, rows, heads, dim);
  }

  private static AttentionState wrap(float[] o, float[] lse, int rows, int heads, int dim) {
    Objects.requireNonNull(o, "o");
    Objects.requireNonNull(lse, "lse");
    checkShape(rows, heads, dim);
    long pairs = (long) rows * heads;
    if (lse.length != pairs || o.length != pairs * dim) {
      throw new IllegalArgumentException("attention state [rows=" + rows + ", heads=" + heads + ", dim=" + dim
          + "] needs o of " + pairs * dim + " and lse of " + pairs + " floats, got " + o.length + " and " + lse.length);
    }
    return new AttentionState(rows, heads, dim, o, lse);
  }

  private static void checkShape(int rows, int heads, int dim) {
    if (rows < 0 || heads < 1 || dim < 1) {
      throw new IllegalArgumentException(
          "attention state needs rows >= 0, heads >= 1, dim >= 1, got rows=" + rows + " heads=" + heads + " dim=" + dim);
    }
  }

  private void validate() {
    for (int i = 0; i < lse.length; i++) {
      float l = lse[i];
      if (Float.isNaN(l)) {
        throw nanError(i, "lse");
      }
      if (l == Float.POSITIVE_INFINITY) {
        throw new IllegalArgumentException("lse is +Infinity at row " + i / heads + ", head " + i % heads
            + ": our states use -Infinity for 'no keys'; convert foreign states with AttentionState.fromForeign");
      }
      for (int d = i * dim, end = d + dim; d < end; d++) {
        if (!Float.isFinite(o[d])) { // an output is a weighted mean of values: finite, or the producer overflowed
          throw new IllegalArgumentException(o[d] + " in attention state o at row " + i / heads + ", head " + i % heads
              + ", dim " + (d - i * dim));
        }
        if (l == Float.NEGATIVE_INFINITY && o[d] != 0) { // kept as it is by a merge of one state, so caught here
          throw new IllegalArgumentException("attention state o is " + o[d] + " at row " + i / heads + ", head " + i % heads
              + ", dim " + (d - i * dim) + ", where lse is -Infinity: a row that saw no key is (o = 0, lse = -inf)");
        }
      }
    }
  }

  private IllegalArgumentException nanError(int pair, String what) {
    return new IllegalArgumentException(
        "NaN in attention state " + what + " at row " + pair / heads + ", head " + pair % heads);
  }

  /** The merge of this state and {@code other} (same shape), as a new state. */
  public AttentionState merge(AttentionState other) {
    java.util.Objects.requireNonNull(other, "other");
    requireSameShape(other);
    float[] outO = new float[o.length];
    float[] outL = new float[lse.length];
    mergeInto(o, lse, 0, other.o, other.lse, 0, outO, outL, 0, lse.length, dim);
    return new AttentionState(rows, heads, dim, outO, outL);
  }

  /**
   * Merges states in list order as a balanced tree: ((s0 s1) (s2 s3)) ... The same list always
   * gives the same bits; an empty list is not allowed (the shape would be unknown).
   */
  public static AttentionState mergeAll(List<AttentionState> states) {
    if (states.isEmpty()) {
      throw new IllegalArgumentException("mergeAll needs at least one state");
    }
    return mergeAll(states.size(), states.iterator());
  }

  /**
   * {@link #mergeAll(List)} of the next {@code n} states of {@code states}, taken in order as they are
   * needed: the same tree and bits, while at most about log2(n) merged states are held at a time
   * (a caller can compute each state just before it is taken).
   */
  public static AttentionState mergeAll(int n, java.util.Iterator<AttentionState> states) {
    TreeMerge m = new TreeMerge(n);
    for (int i = 0; i < n; i++) {
      if (!states.hasNext()) {
        throw new IllegalArgumentException("mergeAll: fewer states than the n given (" + i + " of " + n + ")");
      }
      m.add(states.next());
    }
    return m.result();
  }

  /**
   * {@link #mergeAll(List)} fed one state at a time: after {@code n} calls of {@link #add}, {@link
   * #result} holds the bits of mergeAll over the states in the order added, and each subtree is
   * merged as soon as its states are in, so at most about log2(n) states are held. For callers
   * that build several trees from one stream (a task computing two query blocks against the same
   * key chunks as they arrive).
   */
  public static final class TreeMerge {
    private final int n;
    private int added;
    /** The path from the root to the next leaf: each subtree's leaf count and the half being filled (1, 2). */
    private final int[] size = new int[34], half = new int[34];
    private int depth;
    private final java.util.ArrayDeque<AttentionState> held = new java.util.ArrayDeque<>();

    public TreeMerge(int n) {
      if (n < 1) {
        throw new IllegalArgumentException("mergeAll needs at least one state, got n=" + n);
      }
      this.n = n;
      size[0] = n;
      depth = 1;
    }

    public void add(AttentionState s) {
      if (added == n) {
        throw new IllegalStateException("TreeMerge: more than the " + n + " states given");
      }
      while (size[depth - 1] > 1) { // down to the leaf: the first half is the smaller one, as in ((s0 s1) (s2 s3 s4))
        int m = size[depth - 1];
        int h = ++half[depth - 1];
        size[depth] = h == 1 ? m / 2 : m - m / 2;
        half[depth] = 0;
        depth++;
      }
      depth--;
      held.push(s);
      added++;
      while (depth > 0 && half[depth - 1] == 2) { // both halves done: merge them (left, right)
        AttentionState right = held.pop();
        held.push(held.pop().merge(right));
        depth--;
      }
    }

    public AttentionState result() {
      if (added != n) {
        throw new IllegalStateException("TreeMerge: " + added + " of " + n + " states given");
      }
      return held.peek();
    }
  }

  /**
   * The merge on raw arrays, for callers that keep states in their own buffers (the Spark
   * aggregator): merges {@code pairs} consecutive (row, head) entries of a (starting at entry
   * {@code aAt}) with those of b (at {@code bAt}) into out (at {@code outAt}). out may be a or b at
   * the same entry (in place); any other overlap, and ranges past an array's end, are rejected.
   * Rejects NaN and +inf lse, naming the entry. The lse is rounded to float32 once per merge.
   */
  public static void mergeInto(float[] aO, float[] aL, int aAt, float[] bO, float[] bL, int bAt,
      float[] outO, float[] outL, int outAt, int pairs, int dim) {
    checkRanges(aO, aL, aL.length, aAt, bO, bL, bL.length, bAt, outO, outL, outL.length, outAt, pairs, dim);
    for (int p = 0; p < pairs; p++) {
      outL[outAt + p] = (float) mergeEntry(aO, aL[aAt + p], (aAt + p) * dim, bO, bL[bAt + p], (bAt + p) * dim,
          outO, (outAt + p) * dim, dim, aAt + p, bAt + p);
    }
  }

  /**
   * The same merge with float64 lse in and out, for producers that hold a wider lse than the state
   * stores (split-K decoding: a float32 lse near 100 has an ulp of 8e-6, which the merge weights
   * would inherit). Round to float32 once, at the end, with {@link #ofWideLse}. For a, b and out
   * lse that are floats widened to double, the results are the bits of the float32 entry point
   * before its final rounding.
   */
  static void mergeInto(float[] aO, double[] aL, int aAt, float[] bO, double[] bL, int bAt,
      float[] outO, double[] outL, int outAt, int pairs, int dim) {
    checkRanges(aO, aL, aL.length, aAt, bO, bL, bL.length, bAt, outO, outL, outL.length, outAt, pairs, dim);
    for (int p = 0; p < pairs; p++) {
      outL[outAt + p] = mergeEntry(aO, aL[aAt + p], (aAt + p) * dim, bO, bL[bAt + p], (bAt + p) * dim,
          outO, (outAt + p) * dim, dim, aAt + p, bAt + p);
    }
  }

  /**
   * The raw merge's preconditions: entries in range in every array, and out either apart from a and
   * b or on them entry for entry (an entry is read whole before it is written, so in place works;
   * shifted, out would overwrite entries not yet read).
   */
  private static void checkRanges(float[] aO, Object aL, int aLen, int aAt, float[] bO, Object bL, int bLen, int bAt,
      float[] outO, Object outL, int outLen, int outAt, int pairs, int dim) {
    if (pairs < 0 || dim < 1) {
      throw new IllegalArgumentException("mergeInto needs pairs >= 0 and dim >= 1, got pairs=" + pairs + " dim=" + dim);
    }
    checkRange("a", aO.length, aLen, aAt, pairs, dim);
    checkRange("b", bO.length, bLen, bAt, pairs, dim);
    checkRange("out", outO.length, outLen, outAt, pairs, dim);
    for (int i = 0; i < 2; i++) {
      Object xO = i == 0 ? aO : bO, xL = i == 0 ? aL : bL;
      int xAt = i == 0 ? aAt : bAt;
      if ((xO == outO || xL == outL) && xAt != outAt && Math.abs((long) xAt - outAt) < pairs) {
        throw new IllegalArgumentException("mergeInto: out (entries " + outAt + ".." + ((long) outAt + pairs)
            + ") overlaps " + (i == 0 ? "a" : "b") + " (entries " + xAt + ".." + ((long) xAt + pairs)
            + ") at another entry; in place it must start at the same entry");
      }
    }
  }

  private static void checkRange(String name, int oLength, int lseLength, int at, int pairs, int dim) {
    long end = (long) at + pairs;
    if (at < 0 || end > lseLength || end * dim > oLength) {
      throw new IllegalArgumentException("mergeInto: entries " + at + ".." + end + " of " + name + " (dim " + dim
          + ") do not fit its arrays: lse of " + lseLength + ", o of " + oLength + " floats");
    }
  }

  /**
   * Merges states held as (float32 o, float64 lse) in list order as a balanced tree, the same tree
   * as {@link #mergeAll}, and rounds the lse to float32 once at the end. Works in place: the
   * arrays of the first list entry (and others) are overwritten. NaN in the result is rejected.
   */
  static AttentionState mergeAllWideLse(List<float[]> o, List<double[]> lse, int rows, int heads, int dim) {
    if (o.isEmpty() || o.size() != lse.size()) {
      throw new IllegalArgumentException("mergeAllWideLse needs as many o as lse arrays, at least one, got "
          + o.size() + " and " + lse.size());
    }
    int pairs = Math.multiplyExact(rows, heads);
    mergeRangeInPlace(o, lse, 0, o.size(), pairs, dim);
    return ofWideLse(o.get(0), lse.get(0), rows, heads, dim);
  }

  /** Merges entries [from, to) as a balanced tree into entry {@code from}'s arrays. */
  private static void mergeRangeInPlace(List<float[]> o, List<double[]> lse, int from, int to, int pairs, int dim) {
    if (to - from == 1) {
      return;
    }
    int mid = (from + to) >>> 1;
    mergeRangeInPlace(o, lse, from, mid, pairs, dim);
    mergeRangeInPlace(o, lse, mid, to, pairs, dim);
    mergeInto(o.get(from), lse.get(from), 0, o.get(mid), lse.get(mid), 0, o.get(from), lse.get(from), 0, pairs, dim);
  }

  /** A state from float32 o and float64 lse: lse rounded to float32 once, then {@link #of}'s checks. */
  static AttentionState ofWideLse(float[] o, double[] lse, int rows, int heads, int dim) {
    float[] l = new float[lse.length];
    for (int i = 0; i < l.length; i++) {
      l[i] = (float) lse[i];
    }
    return of(o, l, rows, heads, dim);
  }

  /**
   * The merge of one (row, head) entry, the only copy of the merge arithmetic: o of a at
   * {@code ao} with lse {@code la}, o of b at {@code bo} with lse {@code lb}, into out at
   * {@code oo}; returns the merged lse in float64 (callers round or keep it). Reads both inputs
   * of a dim before writing it, so out may alias a or b. {@code aEntry} and {@code bEntry} (row * heads
   * + head in a and in b) name the entries in errors.
   */
  private static double mergeEntry(float[] aO, double la, int ao, float[] bO, double lb, int bo,
      float[] outO, int oo, int dim, int aEntry, int bEntry) {
    if (!(la < Double.POSITIVE_INFINITY) || !(lb < Double.POSITIVE_INFINITY)) {
      throw new IllegalArgumentException("cannot merge attention state entry " + (aEntry == bEntry ? aEntry
          : aEntry + " of a with entry " + bEntry + " of b") + " (row * heads + head): lse is "
          + (Double.isNaN(la) || Double.isNaN(lb) ? "NaN" : "+Infinity (convert foreign states with fromForeign)")
          + " (a=" + la + ", b=" + lb + ")");
    }
    double m = Math.max(la, lb);
    if (m == Double.NEGATIVE_INFINITY) {
      // Both empty: the identity. The naive formula would give 0/0 = NaN here.
      java.util.Arrays.fill(outO, oo, oo + dim, 0f);
      return Double.NEGATIVE_INFINITY;
    }
    // The larger side's weight is exp(0), exactly 1: no call for it (same bits; StrictMath.exp is a
    // native call on JDK 17, and in-place merges ran 1.8x faster without it, docs/BENCHMARKS.md).
    double wa = la == m ? 1.0 : StrictMath.exp(la - m);
    double wb = lb == m ? 1.0 : StrictMath.exp(lb - m);
    double inv = 1.0 / (wa + wb);
    wa *= inv;
    wb *= inv;
    // Scalar on purpose (docs/BENCHMARKS.md, "Vector API profile pollution"): a Vector API form of this
    // loop (float-to-double shape changes) made C2 compile the kernel's exp without its intrinsics in a
    // JVM where merges ran before the kernel was compiled: the kernel ran 18x slower there.
    for (int d = 0; d < dim; d++) {
      float x = aO[ao + d];
      float y = bO[bo + d];
      // Infinite o is refused as NaN is: a weight of 0 (lse far below the other's) times inf, or +inf
      // beside -inf, would write NaN without a word.
      if (!Float.isFinite(x) || !Float.isFinite(y)) {
        boolean inA = !Float.isFinite(x);
        throw new IllegalArgumentException("cannot merge attention state entry " + (inA ? aEntry + " of a" : bEntry
            + " of b") + " (row * heads + head): " + (inA ? x : y) + " in o at dim " + d);
      }
      outO[oo + d] = (float) (wa * x + wb * y);
    }
    // One weight is exactly 1, so log(wa + wb) = log1p(the other one).
    return m + StrictMath.log1p(Math.min(wa, wb) / Math.max(wa, wb));
  }

  private void requireSameShape(AttentionState other) {
    if (other.rows != rows || other.heads != heads || other.dim != dim) {
      throw new IllegalArgumentException("cannot merge attention states of different shapes: [rows=" + rows
          + ", heads=" + heads + ", dim=" + dim + "] and [rows=" + other.rows + ", heads=" + other.heads
          + ", dim=" + other.dim + "]");
    }
  }

  public int rows() {
    return rows;
  }

  public int heads() {
    return heads;
  }

  public int dim() {
    return dim;
  }

  /** The output array, [rows, heads, dim]; shared, not copied. */
  public float[] o() {
    return o;
  }

  /** The lse array, [rows, heads]; shared, not copied. */
  public float[] lse() {
    return lse;
  }

  public float lse(int row, int head) {
    return lse[entry(row, head)];
  }

  public float o(int row, int head, int d) {
    return o[entry(row, head) * dim + java.util.Objects.checkIndex(d, dim)];
  }

  /** Index of (row, head); an index out of the shape is an error, not a neighbour's entry. */
  private int entry(int row, int head) {
    return java.util.Objects.checkIndex(row, rows) * heads + java.util.Objects.checkIndex(head, heads);
  }
}
