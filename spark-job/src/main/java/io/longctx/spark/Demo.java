package io.longctx.spark;

import io.longctx.kernels.AttentionOptions;
import io.longctx.kernels.ReferenceAttention;
import io.longctx.kernels.Tensor;
import java.io.PrintStream;
import java.nio.file.Files;
import java.nio.file.Path;
import java.util.ArrayList;
import java.util.Comparator;
import java.util.List;
import org.apache.spark.sql.Row;
import org.apache.spark.sql.SparkSession;

/**
 * {@code longctx demo}: generates a small corpus (3 documents of 100,000, 60,000 and 20,000
 * tokens, 8 query heads over 2 kv heads, dim 64, causal), scores it, checks a sample of queries
 * against the float64 reference computed in this process from the regenerated keys, and prints a
 * results table and the summary. Returns false when a checked query is off.
 */
public final class Demo {
  private Demo() {}

  public static boolean run(SparkSession spark, Path dir, int longest, int sample, PrintStream out) throws Exception {
    Generator g = new Generator();
    g.docs = 3;
    g.tokens = longest;
    g.minTokens = (long) Math.max(1, longest / 5);
    g.heads = 8;
    g.kvHeads = 2;
    g.dim = 64;
    g.queriesPerDoc = 4;
    g.seed = 20261122L;
    Files.createDirectories(dir);
    out.printf("longctx demo: step 1/3, generating %d documents (%d..%d tokens, heads %d, kv heads %d, dim %d) in %s%n",
        g.docs, g.docLength(g.docs - 1), g.docLength(0), g.heads, g.kvHeads, g.dim, dir);
    g.write(spark, dir.toString(), true);

    ScoreOptions o = new ScoreOptions();
    o.keys = dir.resolve(g.keysName()).toString();
    o.queries = dir.resolve(g.queriesName()).toString();
    o.output = dir.resolve("scores.parquet").toString();
    o.overwrite = true;
    o.causal = true;
    o.dim = g.dim;
    o.chunkLen = 8192;
    out.printf("longctx demo: step 2/3, scoring %d queries causally on Spark (chunks of %d tokens; Spark's stage bars"
        + " show below)%n", (long) g.docs * g.queriesPerDoc, o.chunkLen);
    ScoreJob.Summary summary = ScoreJob.run(spark, o);
    // the same bound the check below applies
    out.printf("longctx demo: step 3/3, checking %d of the %d queries against a float64 reference computed here"
        + " (pass: o relative L2 error and lse error / (1 + |lse|) both <= 1e-5)%n",
        Math.min(sample, g.docs * g.queriesPerDoc), (long) g.docs * g.queriesPerDoc);

    List<Row> rows = new ArrayList<>(spark.read().parquet(o.output).collectAsList());
    rows.sort(Comparator.comparing((Row r) -> r.<String>getAs("query_id")));
    AttentionOptions attn = o.attention();
    out.printf("%n%-20s %8s %8s %12s %12s %12s  %s%n", "query_id", "pos", "n_keys", "lse[head 0]", "o rel err",
        "lse abs err", "check");
    boolean ok = true;
    int checked = 0, index = 0;
    int every = Math.max(1, rows.size() / Math.max(1, sample)); // spread the sample over the documents
    for (Row r : rows) {
      String qid = r.getAs("query_id");
      int doc = Integer.parseInt(qid.substring(4, 9));
      int j = Integer.parseInt(qid.substring(qid.indexOf("/q-") + 3));
      Token q = g.query(doc, j);
      float[] o1 = toFloats(r.getList(r.fieldIndex("o")));
      float[] l1 = toFloats(r.getList(r.fieldIndex("lse")));
      long nKeys = r.getAs("n_keys");
      String oErr = "", lErr = "", verdict = "(not checked)";
      if (checked < sample && index++ % every == 0) {
        checked++;
        double[] err = check(g, doc, q, o1, l1, attn);
        boolean good = err[0] <= 1e-5 && err[1] <= 1e-5;
        ok &= good;
        oErr = String.format("%.2e", err[0]);
        lErr = String.format("%.2e", err[1]);
        verdict = good ? "ok (float64 reference)" : "MISMATCH";
      }
      out.printf("%-20s %8s %8d %12.5f %12s %12s  %s%n", qid, q.getPos() == null ? "-" : q.getPos(), nKeys, l1[0], oErr,
          lErr, verdict);
    }
    out.println();
    out.print(summary);
    out.println(!ok ? "demo: MISMATCH against the reference" : checked == 0 ? "demo: no query checked (--sample 0)"
        : "demo: all " + checked + " checked queries match the float64 reference");
    return ok;
  }

  static float[] toFloats(List<Object> l) {
    float[] x = new float[l.size()];
    for (int i = 0; i < x.length; i++) {
      x[i] = ((Number) l.get(i)).floatValue();
    }
    return x;
  }

  /** {relative L2 error of o, max |lse err| / (1 + |lse|)} against the float64 reference. */
  static double[] check(Generator g, int doc, Token q, float[] o, float[] lse, AttentionOptions attn) {
    int n = (int) g.docLength(doc), d = g.dim, hk = g.kvHeads, h = g.heads;
    float[] k = new float[hk * n * d];
    float[] v = new float[k.length];
    long[] kPos = new long[n];
    for (int t = 0; t < n; t++) {
      Token key = g.key(doc, t);
      kPos[t] = t;
      for (int x = 0; x < hk; x++) {
        System.arraycopy(key.getK(), x * d, k, (x * n + t) * d, d);
        System.arraycopy(key.getV(), x * d, v, (x * n + t) * d, d);
      }
    }
    float[] qq = new float[h * d];
    System.arraycopy(q.getQ(), 0, qq, 0, qq.length); // [H, 1, D] == [H*D]
    AttentionOptions a = q.getPos() == null ? attn.withCausal(false).withWindow(0) : attn;
    ReferenceAttention.Result ref = ReferenceAttention.compute(new Tensor(qq, 1, h, 1, d), new Tensor(k, 1, hk, n, d),
        new Tensor(v, 1, hk, n, d), new long[] {q.getPos() == null ? 0 : q.getPos()}, kPos, a);
    return errors(o, lse, ref.o(), ref.lse());
  }

  /** {relative L2 error of o, max |lse err| / (1 + |lse|)}; -inf lse must match exactly (and o = 0). */
  public static double[] errors(float[] o, float[] lse, double[] refO, double[] refL) {
    double num = 0, den = 0;
    for (int i = 0; i < o.length; i++) {
      num += (o[i] - refO[i]) * (o[i] - refO[i]);
      den += refO[i] * refO[i];
    }
    double le = 0;
    for (int i = 0; i < lse.length; i++) {
      if (refL[i] == Double.NEGATIVE_INFINITY || lse[i] == Float.NEGATIVE_INFINITY) {
        le = Math.max(le, refL[i] == lse[i] ? 0 : Double.POSITIVE_INFINITY);
      } else {
        le = Math.max(le, Math.abs(lse[i] - refL[i]) / (1 + Math.abs(refL[i])));
      }
    }
    double oe = den == 0 ? Math.sqrt(num) : Math.sqrt(num / den);
    return new double[] {oe, le};
  }

  // ---------------------------------------------------------------------------------------------
  // The ppl part: a generated checkpoint, a long generated text scored by PplJob on Spark, checked
  // against LlamaModel run in this process.

  /** Words of the generated document (plain ASCII, so the JSON and the byte count stay simple). */
  private static final String[] PPL_WORDS = ("the of and to in a is that for it as was with be by on not he this are "
      + "or his from at which but have an they you were her she there been one all we their has would when if so no "
      + "will more can out other into some time could them than then only its new two may first any these like over "
      + "long context attention model document token chunk merge state score exact memory cache layer head").split(" ");

  /** The second chunk length of the ppl check: not a multiple of the job's. */
  private static final int OTHER_CHUNK = 1000;

  /**
   * Generates a small Llama-family checkpoint (2 layers, hidden 64, 4 heads over 2 kv heads, byte-level
   * BPE vocabulary of 512) and two text documents (about {@code tokens} tokens and a short one),
   * scores them with {@link PplJob} on {@code spark}, and checks every document against {@link
   * io.longctx.djl.LlamaModel#score} run in this process on its own copy of the model: the same sum_logprob exactly
   * at the job's chunk length, and within 1e-5 relative at another chunk length ({@link #OTHER_CHUNK};
   * the chunking changes nothing but float32 rounding); ppl and bits_per_byte from the sum. Returns
   * false on a mismatch.
   */
  public static boolean runPpl(SparkSession spark, Path dir, int tokens, PrintStream out) throws Exception {
    Files.createDirectories(dir);
    // The checkpoint and the documents go into a fresh directory of ours, deleted at the end: nothing
    // of the user's in DIR is written over (the documents were once written onto DIR/ppl-docs.parquet). Deleted on
    // Ctrl-C or SIGTERM too (a finally block does not run then: each interrupted run left one in DIR).
    Path work = Files.createTempDirectory(dir, ".ppl-demo-");
    try (io.longctx.djl.MadeFolders.Temporary ignored = new io.longctx.djl.MadeFolders.Temporary(work, false)) {
      return runPpl(spark, dir, work, tokens, out);
    }
  }

  private static boolean runPpl(SparkSession spark, Path dir, Path work, int tokens, PrintStream out)
      throws Exception {
    long t0 = System.nanoTime();
    Path model = work.resolve("model");
    io.longctx.djl.ModelGenerator.Spec spec = new io.longctx.djl.ModelGenerator.Spec();
    spec.layers = 2;
    spec.hidden = 64;
    spec.heads = 4;
    spec.kvHeads = 2;
    spec.vocab = 512;
    spec.seed = 20261123L;
    io.longctx.djl.ModelGenerator.generate(spec, model);
    String[] ids = {"ppl-long", "ppl-short"};
    // ~1.9 UTF-8 bytes per token with this vocabulary and these words (measured): aim near the asked length.
    String[] texts = {pplText(new java.util.SplittableRandom(7), 2L * tokens), "Exact attention over a long context."};
    out.printf("%nlongctx demo (ppl): a temporary checkpoint %s (2 layers, hidden 64, heads 4/2, vocab 512, bf16), "
        + "documents of %d and %d characters%n", model, texts[0].length(), texts[1].length());
    List<Row> rows = new ArrayList<>();
    for (int i = 0; i < ids.length; i++) {
      rows.add(org.apache.spark.sql.RowFactory.create(ids[i], texts[i]));
    }
    org.apache.spark.sql.types.StructType schema = new org.apache.spark.sql.types.StructType()
        .add("doc_id", org.apache.spark.sql.types.DataTypes.StringType)
        .add("text", org.apache.spark.sql.types.DataTypes.StringType);
    String input = work.resolve("docs.parquet").toString();
    spark.createDataFrame(rows, schema).write().parquet(input);

    PplJob.Options o = new PplJob.Options();
    o.model = model.toString();
    o.input = input;
    o.output = dir.resolve("ppl-scores.parquet").toString();
    o.overwrite = true;
    o.chunkLen = 512;
    o.perToken = true; // a mismatch then names the positions that differ
    PplJob.Summary summary = PplJob.run(spark, o, out);
    List<Row> got = new ArrayList<>(spark.read().parquet(o.output).collectAsList());
    got.sort(Comparator.comparing((Row r) -> r.<String>getAs("doc_id")));

    boolean ok = got.size() == ids.length;
    out.printf("%n%-10s %8s %16s %10s %8s  %-34s %s%n", "doc_id", "n_tokens", "sum_logprob", "ppl", "bits/B",
        "vs LlamaModel, same chunk (512)", "vs chunk " + OTHER_CHUNK + " (rel)");
    try (ai.djl.ndarray.NDManager nm = ai.djl.ndarray.NDManager.newBaseManager("PyTorch");
        io.longctx.djl.LlamaModel ref = io.longctx.djl.LlamaModel.load(model, nm);
        ai.djl.huggingface.tokenizers.HuggingFaceTokenizer tok = io.longctx.djl.LlamaTranslator.openTokenizer(model)) {
      for (Row r : got) {
        String id = r.getAs("doc_id");
        String text = texts[java.util.Arrays.asList(ids).indexOf(id)];
        int[] doc = io.longctx.djl.LlamaTranslator.encode(tok, text);
        io.longctx.djl.DocumentScore same = ref.score(doc, o.chunkLen, true);
        io.longctx.djl.DocumentScore other = ref.score(doc, OTHER_CHUNK, false);
        long n = r.getAs("n_tokens");
        double sum = r.getAs("sum_logprob");
        double ppl = r.getAs("ppl");
        double bpb = r.getAs("bits_per_byte");
        double rel = Math.abs(other.sumLogprob() - sum) / Math.max(1e-30, Math.abs(sum));
        boolean exact = n == doc.length && sum == same.sumLogprob();
        boolean derived = Math.abs(ppl - same.perplexity()) <= 1e-12 * ppl
            && Math.abs(bpb - same.bitsPerByte(text.getBytes(java.nio.charset.StandardCharsets.UTF_8).length))
            <= 1e-12 * bpb;
        boolean good = exact && derived && rel <= 1e-5;
        ok &= good;
        out.printf("%-10s %8d %16.6f %10.3f %8.4f  %-34s %.1e %s%n", id, n, sum, ppl, bpb,
            exact ? "identical" : "DIFFERENT (" + same.sumLogprob() + ")", rel,
            good ? "ok" : derived ? "MISMATCH" : "MISMATCH (ppl or bits_per_byte)");
        if (!exact) {
          printDifferences(out, id, r.getList(r.fieldIndex("logprobs")), same.logprobs(),
              ref.score(doc, o.chunkLen, true).logprobs());
        }
      }
    }
    out.println();
    out.print(summary);
    out.printf("demo (ppl): %s (%.1f s)%n", ok ? "every document matches LlamaModel in this process"
        : "MISMATCH against LlamaModel", (System.nanoTime() - t0) / 1e9);
    return ok;
  }

  /**
   * The positions whose log-probability the job gave otherwise than LlamaModel, and whether LlamaModel
   * gives itself the same on a second call: where a mismatch starts tells which layer piece to suspect.
   */
  private static void printDifferences(PrintStream out, String id, List<Float> job, float[] model, float[] again) {
    out.printf("  %s: LlamaModel %s on a second call%n", id,
        java.util.Arrays.equals(model, again) ? "gives the same logprobs" : "gives OTHER logprobs");
    if (job.size() != model.length) {
      out.printf("  %s: the job gave %d logprobs, LlamaModel %d%n", id, job.size(), model.length);
      return;
    }
    int shown = 0;
    for (int i = 0; i < model.length && shown < 8; i++) {
      if (Float.floatToRawIntBits(job.get(i)) != Float.floatToRawIntBits(model[i])) {
        out.printf("  %s: logprob of token %d: job %.9g, LlamaModel %.9g%n", id, i + 1, job.get(i), model[i]);
        shown++;
      }
    }
  }

  /** Seeded sentences of {@link #PPL_WORDS} of at least {@code chars} characters. */
  static String pplText(java.util.SplittableRandom r, long chars) {
    StringBuilder b = new StringBuilder();
    while (b.length() < chars) {
      int words = 5 + r.nextInt(12);
      for (int i = 0; i < words; i++) {
        String w = PPL_WORDS[r.nextInt(PPL_WORDS.length)];
        b.append(i == 0 ? Character.toUpperCase(w.charAt(0)) + w.substring(1) : w);
        b.append(i + 1 < words ? " " : ". ");
      }
    }
    return b.toString().trim();
  }
}
