package io.longctx.spark;

/** A key token's document, position and vectors: what {@link ScoreJob#chunkOf} assembles a chunk from. */
interface KeyVectors {
  String getDocId();

  Long getPos();

  float[] getK();

  float[] getV();

  float[] getQ();
}
