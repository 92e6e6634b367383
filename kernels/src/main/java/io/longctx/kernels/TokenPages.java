package io.longctx.kernels;

import java.util.List;

/**
 * Keys (or values) read in place from buffers ({@link BufferTensor}) laid end to end along the token
 * axis: a KV cache held as pages or chunks is one K (one V) to the kernels, so its result is the one
 * a single array of the same keys gives, bit for bit, however the cache is cut. One page is the plain
 * in-place case. Each page keeps its own memory order; a tile that crosses a page boundary is read
 * from both pages ({@link #readRows}).
 */
final class TokenPages {
  private final BufferTensor[] pages;
  /** starts[i]: the token index of page i's first row; starts[pages.length]: the token count. */
  private final int[] starts;
  final int batch, heads, tokens, dim;

  private TokenPages(BufferTensor[] pages, int[] starts) {
    this.pages = pages;
    this.starts = starts;
    this.batch = pages[0].batch();
    this.heads = pages[0].heads();
    this.tokens = starts[pages.length];
    this.dim = pages[0].dim();
  }

  static TokenPages of(BufferTensor page) {
    return new TokenPages(new BufferTensor[] {page}, new int[] {0, page.tokens()});
  }

  /**
   * Pages of one batch, head count and head dim, in token order.
   *
   * @param name what the pages hold ("k", "v"), for the errors
   * @throws IllegalArgumentException on no pages, pages of differing shapes, or more than
   *     Integer.MAX_VALUE tokens in all
   */
  static TokenPages of(List<BufferTensor> pages, String name) {
    java.util.Objects.requireNonNull(pages, name + " pages");
    if (pages.isEmpty()) {
      throw new IllegalArgumentException("need one or more " + name + " pages");
    }
    BufferTensor[] p = pages.toArray(new BufferTensor[0]);
    int[] starts = new int[p.length + 1];
    for (int i = 0; i < p.length; i++) {
      java.util.Objects.requireNonNull(p[i], name + " page " + i);
      if (p[i].batch() != p[0].batch() || p[i].heads() != p[0].heads() || p[i].dim() != p[0].dim()) {
        throw new IllegalArgumentException(name + " page " + i + " has shape " + p[i].shape() + ", page 0 has "
            + p[0].shape() + ": pages may differ in tokens only");
      }
      long end = (long) starts[i] + p[i].tokens();
      if (end > Integer.MAX_VALUE) {
        throw new IllegalArgumentException(name + " pages hold more than " + Integer.MAX_VALUE + " tokens");
      }
      starts[i + 1] = (int) end;
    }
    return new TokenPages(p, starts);
  }

  /** The single buffer, where this is one page; else null. */
  BufferTensor single() {
    return pages.length == 1 ? pages[0] : null;
  }

  int pageCount() {
    return pages.length;
  }

  /** Tokens of page i. */
  int pageTokens(int i) {
    return pages[i].tokens();
  }

  /** The page holding token t (0 <= t < tokens). */
  private int pageOf(int t) {
    if (pages.length == 1) {
      return 0;
    }
    int i = java.util.Arrays.binarySearch(starts, t);
    // An exact hit may be the start of empty pages too: the last page starting at t holds it.
    if (i >= 0) {
      while (i + 1 < pages.length && starts[i + 1] == t) {
        i++;
      }
      return i;
    }
    return -i - 2;
  }

  /** Copies rows (b, h, t0 .. t0 + n - 1) into dst from {@code dstOff}, one after another. */
  void readRows(int b, int h, int t0, int n, float[] dst, int dstOff) {
    if (pages.length == 1) {
      pages[0].readRows(b, h, t0, n, dst, dstOff);
      return;
    }
    java.util.Objects.checkFromIndexSize(t0, n, tokens);
    for (int i = n == 0 ? 0 : pageOf(t0); n > 0; i++) {
      int m = Math.min(n, starts[i + 1] - t0);
      pages[i].readRows(b, h, t0 - starts[i], m, dst, dstOff);
      t0 += m;
      n -= m;
      dstOff += m * dim;
    }
  }

  /** Element (b, h, t, c). */
  float get(int b, int h, int t, int c) {
    java.util.Objects.checkIndex(t, tokens);
    int i = pageOf(t);
    BufferTensor p = pages[i];
    return p.data().get(p.offset(b, h, t - starts[i]) + c);
  }

  /** Throws, naming the first NaN or infinity by (batch, head, token, dim) over all pages. */
  void requireFinite(String name) {
    for (int i = 0; i < pages.length; i++) {
      try {
        pages[i].requireFinite(name);
      } catch (IllegalArgumentException e) {
        if (pages.length == 1) {
          throw e;
        }
        throw new IllegalArgumentException(name + " page " + i + " (tokens from " + starts[i] + "): " + e.getMessage(),
            e);
      }
    }
  }

  /** The logical shape, and the pages' when there are several. */
  String shape() {
    return pages.length == 1 ? pages[0].shape()
        : Tensor.shape(batch, heads, tokens, dim) + " in " + pages.length + " pages";
  }
}
