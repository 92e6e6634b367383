package io.longctx.kernels;

/** float32 to and from IEEE half and bfloat16 bit patterns, rounding to nearest even (JDK 17 has neither). */
public final class HalfFloats {

  private HalfFloats() {}

  public static short floatToBf16(float f) {
    int bits = Float.floatToRawIntBits(f);
    if (Float.isNaN(f)) {
      return (short) ((bits >>> 16) | 0x40);
    }
    int rounding = 0x7FFF + ((bits >>> 16) & 1);
    return (short) ((bits + rounding) >>> 16);
  }

  public static float bf16ToFloat(short h) {
    return Float.intBitsToFloat((h & 0xFFFF) << 16);
  }

  public static short floatToHalf(float f) {
    int bits = Float.floatToRawIntBits(f);
    int sign = (bits >>> 16) & 0x8000;
    int exp = (bits >>> 23) & 0xFF;
    int mant = bits & 0x7FFFFF;
    if (exp == 0xFF) { // inf or NaN
      return (short) (sign | 0x7C00 | (mant != 0 ? 0x200 : 0));
    }
    int e = exp - 127 + 15;
    if (e >= 0x1F) { // overflow: inf
      return (short) (sign | 0x7C00);
    }
    if (e <= 0) { // subnormal half or zero
      if (e < -10) {
        return (short) sign;
      }
      mant |= 0x800000;
      int shift = 14 - e;
      int half = mant >>> shift;
      int rest = mant & ((1 << shift) - 1);
      int mid = 1 << (shift - 1);
      if (rest > mid || (rest == mid && (half & 1) == 1)) {
        half++;
      }
      return (short) (sign | half);
    }
    int half = (e << 10) | (mant >>> 13);
    int rest = mant & 0x1FFF;
    if (rest > 0x1000 || (rest == 0x1000 && (half & 1) == 1)) {
      half++; // may carry into the exponent, which is still right (up to inf)
    }
    return (short) (sign | half);
  }

  public static float halfToFloat(short h) {
    int bits = h & 0xFFFF;
    int sign = (bits & 0x8000) << 16;
    int exp = (bits >>> 10) & 0x1F;
    int mant = bits & 0x3FF;
    if (exp == 0x1F) {
      return Float.intBitsToFloat(sign | 0x7F800000 | (mant << 13));
    }
    if (exp == 0) {
      float magnitude = mant * 0x1p-24f;
      return sign != 0 ? -magnitude : magnitude;
    }
    return Float.intBitsToFloat(sign | ((exp - 15 + 127) << 23) | (mant << 13));
  }
}
