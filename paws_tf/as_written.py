"""AutoGraph leaves paws_tf's functions as written.

The package's TensorFlow code branches and loops on Python values only
(what depends on a tensor is written with TensorFlow ops), so AutoGraph's
rewrite of each of its functions that Keras or `tf.data` trace changes
nothing but the time a trace takes: seconds of CPU in every process that
builds and trains a model. A user's own functions keep AutoGraph, and so
does a user's Keras layer that paws_tf calls (a backbone: Keras rewrites a
layer's `call` itself); a plain function that paws_tf calls runs as
written. (`tf.function` rewrites the function it is given whatever its
module; the package's own pass `autograph=False`.)

Imported for this effect by the modules that Keras models, metrics and
input pipelines come from (`dist`, `nets`, `data.augment`).
"""

from tensorflow.python.autograph.core import config

# TensorFlow lists its own modules, Keras' and NumPy's here; it has no
# public API for a package's rule.
config.CONVERSION_RULES = ((config.DoNotConvert('paws_tf'),) +
                           config.CONVERSION_RULES)
