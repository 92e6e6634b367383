package io.longctx.djl;

import static org.junit.jupiter.api.Assertions.assertNull;
import static org.junit.jupiter.api.Assertions.assertTrue;

import ai.djl.ndarray.NDArray;
import ai.djl.ndarray.NDList;
import ai.djl.ndarray.NDManager;
import ai.djl.ndarray.types.DataType;
import ai.djl.ndarray.types.Shape;
import ai.djl.training.ParameterStore;
import io.longctx.kernels.AttentionOptions;
import java.util.concurrent.atomic.AtomicReference;
import org.junit.jupiter.api.Test;

/**
 * Serving from several threads: libtorch's attention on one thread, then a Block's inference
 * forward on another. libtorch runs the TorchScript attention in inference mode, and its outputs
 * used to be inference tensors, which a later Linear on a thread with gradients recorded refused
 * ("Inference tensors cannot be saved for backward").
 */
class ThreadsTest {

  @Test
  void aBlockOnAnotherThreadAfterLibtorchAttentionOnThisOne() throws Exception {
    try (NDManager m = NDManager.newBaseManager("PyTorch")) {
      NDArray q = m.randomNormal(new Shape(1, 4, 64, 16));
      NDList r = AttentionOp.cpu().forward(q, q, q, null, null, AttentionOptions.DEFAULT, AttentionOp.Layout.BHTD,
          AttentionOp.Path.LIBTORCH);
      assertTrue(r.get(0).toFloatArray().length > 0);
    }
    AtomicReference<Throwable> error = new AtomicReference<>();
    Thread t = new Thread(() -> {
      try (NDManager m = NDManager.newBaseManager("PyTorch")) {
        MultiHeadAttentionBlock b = MultiHeadAttentionBlock.builder().setEmbeddingSize(64).setHeadCount(4).build();
        b.initialize(m, DataType.FLOAT32, new Shape(1, 128, 64));
        NDArray x = m.randomNormal(new Shape(1, 128, 64));
        NDArray y = b.forward(new ParameterStore(m, false), new NDList(x), false).singletonOrThrow();
        assertTrue(y.getShape().equals(new Shape(1, 128, 64)));
      } catch (Throwable e) {
        error.set(e);
      }
    }, "other-thread");
    t.start();
    t.join(120_000);
    assertNull(error.get(), () -> "a Block forward on another thread failed: " + error.get());
  }
}
