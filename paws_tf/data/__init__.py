"""The input side: sources, augmentations, sampling, `tf.data` pipelines."""
