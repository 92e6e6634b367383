package io.longctx.kernels;

import static org.junit.jupiter.api.Assertions.assertEquals;

import java.util.SplittableRandom;
import org.junit.jupiter.api.Test;

/** The fp16/bf16 conversions the GPU check feeds the kernels with. */
class HalfFloatsTest {

  @Test
  void halfRoundTripsEveryHalfValueAndRoundsToNearest() {
    for (int bits = 0; bits < 0x10000; bits++) {
      short h = (short) bits;
      float f = HalfFloats.halfToFloat(h);
      if (!Float.isNaN(f)) {
        assertEquals(bits, HalfFloats.floatToHalf(f) & 0xFFFF, "half bits " + Integer.toHexString(bits));
      }
    }
    long seed = Seeds.forTest();
    SplittableRandom rng = new SplittableRandom(seed);
    for (int i = 0; i < 100_000; i++) {
      float f = (float) (rng.nextGaussian() * Math.pow(10, rng.nextInt(-6, 5)));
      float r = HalfFloats.halfToFloat(HalfFloats.floatToHalf(f));
      // nearest: no other half value is closer
      short h = HalfFloats.floatToHalf(f);
      float up = HalfFloats.halfToFloat((short) (h + 1)), down = HalfFloats.halfToFloat((short) (h - 1));
      double err = Math.abs((double) r - f);
      if (Float.isFinite(up) && Float.isFinite(r) && Math.abs(f) > 1e-7 && Math.abs(f) < 6e4) {
        assertEquals(true, err <= Math.abs((double) up - f) && err <= Math.abs((double) down - f) + 0.0,
            "seed " + seed + " (replay: -Dlongctx.seed=" + seed + "): " + f + " -> " + r);
      }
    }
  }

  @Test
  void bf16KeepsTheTopSixteenBitsRoundedToNearestEven() {
    assertEquals(1.0f, HalfFloats.bf16ToFloat(HalfFloats.floatToBf16(1.0f)));
    assertEquals(1.0078125f, HalfFloats.bf16ToFloat(HalfFloats.floatToBf16(1.0078125f))); // exact
    assertEquals(1.0f, HalfFloats.bf16ToFloat(HalfFloats.floatToBf16(1.00390625f))); // tie to even
    assertEquals(1.015625f, HalfFloats.bf16ToFloat(HalfFloats.floatToBf16(1.01171875f))); // tie to even, up
    assertEquals(Float.POSITIVE_INFINITY, HalfFloats.bf16ToFloat(HalfFloats.floatToBf16(Float.POSITIVE_INFINITY)));
    assertEquals(true, Float.isNaN(HalfFloats.bf16ToFloat(HalfFloats.floatToBf16(Float.NaN))));
  }
}
