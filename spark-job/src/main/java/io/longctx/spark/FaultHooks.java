package io.longctx.spark;

import java.io.IOException;
import java.io.UncheckedIOException;
import java.nio.file.FileAlreadyExistsException;
import java.nio.file.Files;
import java.nio.file.Path;
import java.nio.file.StandardCopyOption;
import org.apache.spark.SparkConf;
import org.apache.spark.SparkEnv;
import org.apache.spark.TaskContext;

/**
 * TEST-ONLY fault injection for the fault tests (docs/RELIABILITY.md). Off unless the JVM that runs
 * the task has the system property {@value #ENABLE_PROPERTY}{@code =true} (a Spark {@code --conf}
 * alone cannot switch it on) and one of the {@code spark.longctx.test.*} Spark properties below is
 * set; otherwise {@link #at} is one property lookup and returns. Never enable it in production: it
 * makes tasks fail or stall on purpose.
 *
 * <p>{@link #at} is called once per group in the two stages of the job that do the work:
 * {@link #MAP} in the stage that runs the kernel on (query block, key chunk) pairs and writes the
 * partial states to the shuffle, {@link #REDUCE} in {@link LseMerge#finish}, which runs after the
 * shuffle in the final aggregation (and therefore in the stage that writes the output). Split
 * {@code ppl} calls it per chunk with {@link #layerStage} names: {@code layerL-map} where a chunk's
 * keys and values are made, {@code layerL-reduce} where a block runs layer L. The one-task path of
 * {@code ppl} calls it after each chunk of a document, as {@link #PPL_CHUNK}.
 *
 * <ul>
 *   <li>{@code spark.longctx.test.failFirstAttempts=N} (with {@code spark.longctx.test.failStage},
 *       a comma list of stage names: {@code map}, {@code reduce}, split ppl's {@code layerL-map},
 *       {@code layerL-reduce}, ppl's {@code ppl-chunk}; default {@code map,reduce}, score's two, so
 *       ppl's stages fail only where named): every task of those stages
 *       throws in its attempts 0..N-1. With {@code spark.task.maxFailures > N} the job succeeds
 *       through Spark's retries; otherwise it fails.
 *   <li>{@code spark.longctx.test.pauseDir=DIR} (with {@code spark.longctx.test.pauseStage}, a comma list of
 *       stage names as above, default map, and {@code spark.longctx.test.pauseMillis}, default 120000): the first task of
 *       each listed stage in the whole job (first attempt of the first stage attempt; claimed by creating
 *       {@code DIR/STAGE.claim}) writes {@code DIR/STAGE.pid} holding its JVM's pid, the stage and
 *       the task, then sleeps (until {@code DIR/STAGE.release} exists, at most the pause), so that a test
 *       can SIGKILL that executor (or the driver) mid-stage, or watch the job while the task runs.
 *       Later tasks and re-runs find the claim and go on.
 * </ul>
 */
public final class FaultHooks {
  /** The JVM system property that arms the hooks. */
  public static final String ENABLE_PROPERTY = "longctx.test.faultHooks";

  public static final String MAP = "map";
  public static final String REDUCE = "reduce";
  public static final String PPL_CHUNK = "ppl-chunk";

  public static final String FAIL_FIRST_ATTEMPTS = "spark.longctx.test.failFirstAttempts";
  public static final String FAIL_STAGE = "spark.longctx.test.failStage";
  public static final String PAUSE_DIR = "spark.longctx.test.pauseDir";
  public static final String PAUSE_STAGE = "spark.longctx.test.pauseStage";
  public static final String PAUSE_MILLIS = "spark.longctx.test.pauseMillis";

  private FaultHooks() {}

  /**
   * The stage name of layer {@code layer}'s step in split {@code ppl}: {@code layerL-map} where a
   * chunk's keys and values are made and sent, {@code layerL-reduce} where a block runs the layer.
   */
  public static String layerStage(int layer, String step) {
    return "layer" + layer + "-" + step;
  }

  /** The hook: a no-op unless a test property is set (see the class comment). */
  public static void at(String stage) {
    if (!Boolean.getBoolean(ENABLE_PROPERTY)) {
      return;
    }
    TaskContext tc = TaskContext.get();
    SparkEnv env = SparkEnv.get();
    if (tc == null || env == null) {
      return;
    }
    SparkConf conf = env.conf();
    int fail = conf.getInt(FAIL_FIRST_ATTEMPTS, 0);
    if (fail > 0 && tc.attemptNumber() < fail && listed(conf.get(FAIL_STAGE, MAP + "," + REDUCE), stage)) {
      throw new IllegalStateException("injected test failure (" + FAIL_FIRST_ATTEMPTS + "=" + fail + ") in the "
          + stage + " stage: stage " + tc.stageId() + "." + tc.stageAttemptNumber() + ", partition "
          + tc.partitionId() + ", attempt " + tc.attemptNumber());
    }
    String dir = conf.get(PAUSE_DIR, null);
    if (dir != null && listed(conf.get(PAUSE_STAGE, MAP), stage) && tc.attemptNumber() == 0
        && tc.stageAttemptNumber() == 0) {
      pauseOnce(Path.of(dir), stage, tc, conf.getLong(PAUSE_MILLIS, 120_000));
    }
  }

  private static boolean listed(String list, String stage) {
    for (String s : list.split(",")) {
      if (s.strip().equals(stage)) {
        return true;
      }
    }
    return false;
  }

  private static void pauseOnce(Path dir, String stage, TaskContext tc, long millis) {
    try {
      Files.createFile(dir.resolve(stage + ".claim"));
    } catch (FileAlreadyExistsException e) {
      return; // another task (or an earlier run of this one) already paused
    } catch (IOException e) {
      throw new UncheckedIOException(e);
    }
    try {
      Path tmp = dir.resolve(stage + ".pid.tmp");
      Files.writeString(tmp, ProcessHandle.current().pid() + "\n" + stage + "\nstage " + tc.stageId() + " partition "
          + tc.partitionId() + "\n");
      Files.move(tmp, dir.resolve(stage + ".pid"), StandardCopyOption.ATOMIC_MOVE);
    } catch (IOException e) {
      throw new UncheckedIOException(e);
    }
    Path release = dir.resolve(stage + ".release");
    long end = System.nanoTime() + millis * 1_000_000L;
    try {
      while (System.nanoTime() < end && !Files.exists(release)) {
        Thread.sleep(50);
      }
    } catch (InterruptedException e) {
      Thread.currentThread().interrupt(); // the task was killed: let Spark end it
    }
  }
}
