"""The input side: image sources (arrays, folders, TFDS), the multi-crop
augmentations, class-balanced support sampling and the `tf.data` pipelines
that feed a training step or an evaluation."""
