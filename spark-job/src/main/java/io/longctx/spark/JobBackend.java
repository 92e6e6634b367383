package io.longctx.spark;

import io.longctx.kernels.AttentionBackend;
import io.longctx.kernels.AttentionBackends;
import java.io.Serializable;
import org.apache.spark.SparkEnv;
import org.apache.spark.TaskContext;
import org.apache.spark.resource.ResourceInformation;
import org.apache.spark.sql.SparkSession;

/**
 * The one attention backend of a job: chosen on the driver from the one selector
 * ({@link AttentionBackends}: {@code --backend}, else {@code -Dlongctx.backend}, else auto), opened
 * in every task on the GPU Spark assigned to it. A job never mixes backends: an executor that cannot
 * run the chosen one fails its tasks with the reason, and the job fails rather than change bits.
 */
final class JobBackend implements Serializable {
  private static final long serialVersionUID = 1L;

  /** Spark's task GPU resource name (spark.task.resource.gpu.amount, TaskContext.resources()). */
  static final String GPU = "gpu";

  final String name;

  JobBackend(String name) { // package-private for the test of a task that cannot open it
    this.name = name;
  }

  /**
   * Resolves a choice on the driver. {@code auto} is {@code cuda} when Spark schedules GPUs for the
   * tasks ({@code spark.task.resource.gpu.amount > 0}), else {@code cpu}: the driver cannot see the
   * executors' devices, and a job must not find out per task. An unknown name is bad input.
   */
  static JobBackend resolve(SparkSession spark, String choice) {
    String c = choice != null ? choice : AttentionBackends.choice();
    String source = choice != null ? "--backend" : "-D" + AttentionBackends.PROPERTY;
    if (c.equals("auto")) {
      source = "auto, as spark.task.resource.gpu.amount > 0,";
      double gpus = spark.sparkContext().getConf().getDouble("spark.task.resource." + GPU + ".amount", 0);
      c = gpus > 0 ? "cuda" : "cpu";
    }
    io.longctx.kernels.AttentionBackendProvider p;
    try {
      p = AttentionBackends.provider(c);
    } catch (IllegalArgumentException e) { // the option's name, or the property's
      throw new InputError(choice != null ? "--backend must be auto or one of " + AttentionBackends.names() + ", got '"
          + choice + "'" : "-D" + e.getMessage());
    }
    // With local or local[N] the tasks run in this JVM: a backend it cannot run, no task can. Said here,
    // before any work, instead of by the first task's failure. (local-cluster's executors are other JVMs,
    // with their own class path and environment: their tasks decide, as on a cluster.)
    String why = spark.sparkContext().isLocal() ? p.unavailableReason() : null; // local, local[N]: not local-cluster
    if (why != null) {
      throw new InputError(source + " (" + p.name() + "): not usable in this JVM, where the tasks of master "
          + spark.sparkContext().master() + " run: " + why);
    }
    return new JobBackend(p.name());
  }

  /** The backend in this task: on the task's assigned GPU address where Spark gave one, else device 0. */
  AttentionBackend open() {
    int device = 0;
    TaskContext tc = TaskContext.get();
    if (tc != null) {
      ResourceInformation gpu = tc.resourcesJMap().get(GPU);
      if (gpu != null && gpu.addresses().length > 0) {
        device = Integer.parseInt(gpu.addresses()[0].strip());
      }
    }
    try {
      return AttentionBackends.open(name, device); // providers keep their own instances (CUDA: one per device)
    } catch (IllegalStateException e) {
      SparkEnv env = SparkEnv.get();
      String where = env == null ? "this JVM" : "executor " + env.executorId();
      throw new IllegalStateException("this job runs on the '" + name + "' backend (chosen on the driver), which "
          + where + " cannot run: " + e.getMessage() + ". One job never mixes backends: give every executor what the "
          + "backend needs (for cuda: spark.executor.resource.gpu.amount and the discovery script conf/gpu-discovery.sh)"
          + " or choose another with --backend", e);
    }
  }
}
