package io.longctx.djl;

import ai.djl.Device;
import ai.djl.MalformedModelException;
import ai.djl.Model;
import ai.djl.engine.Engine;
import ai.djl.ndarray.NDArray;
import ai.djl.ndarray.NDList;
import ai.djl.ndarray.NDManager;
import ai.djl.ndarray.types.Shape;
import ai.djl.nn.Block;
import ai.djl.training.ParameterStore;
import io.longctx.kernels.Tensor;
import java.io.ByteArrayInputStream;
import java.io.ByteArrayOutputStream;
import java.io.IOException;
import java.io.UncheckedIOException;
import java.nio.ByteBuffer;
import java.nio.ByteOrder;
import java.nio.charset.StandardCharsets;
import java.util.Arrays;
import java.util.zip.CRC32;
import java.util.zip.ZipEntry;
import java.util.zip.ZipOutputStream;

/**
 * libtorch's own fused CPU attention, {@code aten::_scaled_dot_product_flash_attention_for_cpu},
 * reached through DJL: the anchor our CPU kernels are measured against in the same JVM run.
 *
 * <p>DJL exposes no fused attention op, so this class writes two tiny TorchScript modules (one per
 * causal flag, since a bool argument must be a literal in TorchScript code) and loads them with
 * the PyTorch engine. Each returns the normalized output {@code o [B, H, Tq, D]} and the natural-log
 * {@code lse [B, H, Tq]}, with the default scale {@code 1/sqrt(D)}, no dropout, no softcap.
 *
 * <p>Causal is libtorch's top-left aligned mask: query row t sees keys {@code 0..t}, also when
 * {@code Tq != Tk} ({@link AttentionOp} passes such calls only where that is its positions' mask). GQA/MQA ({@code k.heads < q.heads}) is expanded inside the
 * TorchScript code with {@code repeat_interleave} on the head axis, so query head h reads kv head
 * {@code h / (H / Hkv)} (contiguous groups, as docs/CONVENTIONS.md); with {@code Hkv == H} nothing is copied.
 *
 * <p>The PyTorch engine is loaded offline: if neither {@code ai.djl.offline} nor {@code DJL_OFFLINE}
 * is set, {@link #open()} sets {@code ai.djl.offline=true}. The natives come from the
 * {@code pytorch-native-cpu} jar on the class path and are extracted to {@code ~/.djl.ai}.
 */
public final class LibtorchSdpa implements AutoCloseable {

  /** Attention output {@code o [B, H, Tq, D]} and natural-log {@code lse [B, H, Tq]}, float32. */
  public record Result(float[] o, float[] lse) {}

  private static final String ENGINE = "PyTorch";

  private final NDManager manager;
  private final Model causalModel;
  private final Model fullModel;
  private final ParameterStore params;

  private LibtorchSdpa(NDManager manager, Model causalModel, Model fullModel) {
    this.manager = manager;
    this.causalModel = causalModel;
    this.fullModel = fullModel;
    this.params = new ParameterStore(manager, false);
  }

  /**
   * Loads the PyTorch engine (offline) and the two attention modules.
   *
   * @throws IllegalStateException when the engine or its natives cannot be loaded
   */
  public static LibtorchSdpa open() {
    if (System.getProperty("ai.djl.offline") == null && System.getenv("DJL_OFFLINE") == null) {
      System.setProperty("ai.djl.offline", "true");
    }
    try {
      Engine.getEngine(ENGINE);
    } catch (RuntimeException | LinkageError e) {
      throw new IllegalStateException(
          "cannot load DJL's PyTorch engine offline: ai.djl.pytorch:pytorch-engine, pytorch-jni and "
              + "pytorch-native-cpu (classifier linux-x86_64) must be on the class path, and ~/.djl.ai "
              + "writable for the natives (" + e + ")", e);
    }
    LibtorchWarmup.ensure();
    NDManager manager = NDManager.newBaseManager(Device.cpu(), ENGINE);
    Model causal = null;
    try {
      causal = load("LongctxSdpaCausal", true);
      Model full = load("LongctxSdpaFull", false);
      return new LibtorchSdpa(manager, causal, full);
    } catch (IOException | MalformedModelException | RuntimeException e) {
      if (causal != null) {
        causal.close();
      }
      manager.close();
      throw new IllegalStateException("libtorch rejected the generated TorchScript attention module: " + e, e);
    }
  }

  /** The manager to create inputs in for {@link #forward(NDArray, NDArray, NDArray, boolean)}. */
  public NDManager manager() {
    return manager;
  }

  /**
   * Attention on arrays already in the engine: q [B, H, Tq, D], k and v [B, Hkv, Tk, D] (float32,
   * or another type libtorch's CPU flash attention takes). Returns {@code NDList(o [B, H, Tq, D],
   * lse [B, H, Tq])}, attached to q's manager; both may be strided views (reading them copies to
   * contiguous). No shape checks here beyond libtorch's own: this is the call benchmarks time.
   */
  public NDList forward(NDArray q, NDArray k, NDArray v, boolean causal) {
    Block block = (causal ? causalModel : fullModel).getBlock();
    // training = true runs the module outside libtorch's inference mode (the module has no training-only
    // behavior): inference-mode outputs would be inference tensors, which a later op recording gradients
    // (a Block's Linear on a thread with grad mode on) refuses, and copying them cost a pass over o (ThreadsTest).
    return block.forward(params, new NDList(q, k, v), true);
  }

  /**
   * Attention of q [B, H, Tq, D] over k, v [B, Hkv, Tk, D] (our {@link Tensor} layout), copied in
   * and out of the engine. Query head h reads kv head {@code h / (H / Hkv)}; causal needs
   * {@code Tq == Tk}. A row with no keys ({@code Tk == 0}) gets o = 0, lse = -inf.
   */
  public Result forward(Tensor q, Tensor k, Tensor v, boolean causal) {
    int batch = q.batch(), heads = q.heads(), tq = q.tokens(), dim = q.dim();
    int kvHeads = k.heads(), tk = k.tokens();
    if (k.batch() != batch || v.batch() != batch || v.heads() != kvHeads || v.tokens() != tk
        || k.dim() != dim || v.dim() != dim) {
      throw new IllegalArgumentException("q " + q.shape() + ", k " + k.shape() + ", v " + v.shape()
          + " do not agree: need k, v [B, Hkv, Tk, D] for q [B, H, Tq, D]");
    }
    if (heads % kvHeads != 0) {
      throw new IllegalArgumentException("query heads " + heads + " not a multiple of kv heads " + kvHeads);
    }
    if (causal && tq != tk) {
      throw new IllegalArgumentException("causal attention here is square (top-left): Tq " + tq + " != Tk " + tk);
    }
    float[] o = new float[batch * heads * tq * dim];
    float[] lse = new float[batch * heads * tq];
    if (tq == 0) {
      return new Result(o, lse);
    }
    if (tk == 0) {
      Arrays.fill(lse, Float.NEGATIVE_INFINITY);
      return new Result(o, lse);
    }
    try (NDManager scope = manager.newSubManager()) {
      NDArray qa = scope.create(q.data(), new Shape(batch, heads, tq, dim));
      NDArray ka = scope.create(k.data(), new Shape(batch, kvHeads, tk, dim));
      NDArray va = scope.create(v.data(), new Shape(batch, kvHeads, tk, dim));
      NDList out = forward(qa, ka, va, causal);
      out.attach(scope);
      read(out.get(0), o);
      read(out.get(1), lse);
    }
    return new Result(o, lse);
  }

  @Override
  public void close() {
    causalModel.close();
    fullModel.close();
    manager.close();
  }

  private static void read(NDArray a, float[] into) {
    ByteBuffer bytes = a.toByteBuffer();
    bytes.order(ByteOrder.nativeOrder()).asFloatBuffer().get(into);
  }

  private static Model load(String className, boolean causal) throws IOException, MalformedModelException {
    Model model = Model.newInstance(className, Device.cpu(), ENGINE);
    try {
      model.load(new ByteArrayInputStream(torchScriptArchive(className, causal)));
      return model;
    } catch (IOException | MalformedModelException | RuntimeException e) {
      model.close();
      throw e;
    }
  }

  /**
   * TorchScript source of the module. Serialized TorchScript spells operators {@code ops.aten.NAME}
   * and the causal flag must be a literal. The CPU flash kernel returns (output, logsumexp); both are
   * strided views ([B, T, H, *] storage) of shape [B, H, T, D] and [B, H, T]. It reads any strides
   * on the first three axes but takes the head-dim axis as dense without checking (a transposed K
   * cache, a broadcast v or a stepped slice gave finite garbage), so an input whose D axis is not
   * is made contiguous first, as torch's own scaled_dot_product_attention does before this kernel.
   */
  static String torchScriptSource(String className, boolean causal) {
    return "class " + className + "(Module):\n"
        + "  __parameters__ = []\n"
        + "  __buffers__ = []\n"
        + "  training : bool\n"
        + "  def forward(self: __torch__." + className + ",\n"
        + "    q: Tensor,\n"
        + "    k: Tensor,\n"
        + "    v: Tensor) -> Tuple[Tensor, Tensor]:\n"
        + denseHeadDim("q") + denseHeadDim("k") + denseHeadDim("v")
        + "    group = ops.aten.floordiv(ops.aten.size(q, 1), ops.aten.size(k, 1))\n"
        + "    if ops.aten.gt(group, 1):\n"
        + "      k1 = ops.aten.repeat_interleave(k, group, 1)\n"
        + "      v1 = ops.aten.repeat_interleave(v, group, 1)\n"
        + "    else:\n"
        + "      k1 = k\n"
        + "      v1 = v\n"
        + "    o, lse = ops.aten._scaled_dot_product_flash_attention_for_cpu(q, k1, v1, 0., "
        + (causal ? "True" : "False") + ")\n"
        + "    return (o, lse)\n";
  }

  private static String denseHeadDim(String x) {
    return "    if ops.aten.ne(ops.aten.stride(" + x + ", 3), 1):\n"
        + "      " + x + " = ops.aten.contiguous(" + x + ")\n";
  }

  /**
   * A TorchScript archive as {@code torch.jit.save} writes one for a module with no parameters: a
   * zip whose entries all sit under one top-level folder ({@code <name>/}), stored uncompressed:
   *
   * <pre>
   *   name/version            file format version, ASCII "3"
   *   name/code/__torch__.py  the class source; class __torch__.X lives in code/__torch__.py
   *   name/data.pkl           pickle of the module object: an X with state {training: False}
   *   name/constants.pkl      pickle of the tuple of tensor constants the code uses: ()
   * </pre>
   *
   * torch.jit.load unpickles data.pkl, which names class {@code __torch__.X}; the loader then
   * compiles X from {@code code/__torch__.py}.
   */
  static byte[] torchScriptArchive(String className, boolean causal) {
    String dir = className.toLowerCase(java.util.Locale.ROOT) + "/";
    ByteArrayOutputStream zip = new ByteArrayOutputStream();
    try (ZipOutputStream out = new ZipOutputStream(zip)) {
      store(out, dir + "version", "3\n".getBytes(StandardCharsets.US_ASCII));
      store(out, dir + "code/__torch__.py", torchScriptSource(className, causal).getBytes(StandardCharsets.UTF_8));
      store(out, dir + "data.pkl", modulePickle(className));
      store(out, dir + "constants.pkl", new byte[] {(byte) 0x80, 2, ')', '.'}); // PROTO 2, EMPTY_TUPLE, STOP
    } catch (IOException e) {
      throw new UncheckedIOException(e); // in memory: cannot happen
    }
    return zip.toByteArray();
  }

  /** Pickle (protocol 2) of {@code __torch__.<className>()} with its state {"training": False}. */
  private static byte[] modulePickle(String className) {
    ByteArrayOutputStream p = new ByteArrayOutputStream();
    p.write(0x80); // PROTO
    p.write(2);
    p.writeBytes(("c__torch__\n" + className + "\n").getBytes(StandardCharsets.US_ASCII)); // GLOBAL module\nname\n
    p.write(')'); // EMPTY_TUPLE: no constructor arguments
    p.write(0x81); // NEWOBJ: cls.__new__(cls)
    p.write('}'); // EMPTY_DICT: the object's state
    byte[] key = "training".getBytes(StandardCharsets.UTF_8);
    p.write('X'); // BINUNICODE: u32 little-endian length, UTF-8 bytes
    p.writeBytes(ByteBuffer.allocate(4).order(ByteOrder.LITTLE_ENDIAN).putInt(key.length).array());
    p.writeBytes(key);
    p.write(0x89); // NEWFALSE
    p.write('s'); // SETITEM: state["training"] = False
    p.write('b'); // BUILD: apply the state to the object
    p.write('.'); // STOP
    return p.toByteArray();
  }

  private static void store(ZipOutputStream out, String name, byte[] bytes) throws IOException {
    ZipEntry e = new ZipEntry(name);
    e.setMethod(ZipEntry.STORED);
    e.setSize(bytes.length);
    e.setCompressedSize(bytes.length);
    CRC32 crc = new CRC32();
    crc.update(bytes);
    e.setCrc(crc.getValue());
    out.putNextEntry(e);
    out.write(bytes);
    out.closeEntry();
  }
}
