"""Registers every gin configurable of paws_tf (run.py imports it), so gin
files need no `import` lines."""

# pylint: disable=unused-import
from paws_tf.data import augment  # noqa: F401
from paws_tf.data import folders  # noqa: F401
from paws_tf.data import pipeline  # noqa: F401
from paws_tf.data import sources  # noqa: F401
from paws_tf.data import tfds_sources  # noqa: F401
from paws_tf.demo import fashion_mnist  # noqa: F401
from paws_tf.demo import supervised  # noqa: F401
from paws_tf import dist  # noqa: F401
from paws_tf.evaluation import evaluate  # noqa: F401
from paws_tf.evaluation import export  # noqa: F401
from paws_tf.evaluation import fine_tune  # noqa: F401
from paws_tf import lars  # noqa: F401
from paws_tf import model  # noqa: F401
from paws_tf import progress  # noqa: F401
from paws_tf.nets import backbones  # noqa: F401
from paws_tf.nets import heads  # noqa: F401
from paws_tf.runner import experiment  # noqa: F401
from paws_tf.runner import train  # noqa: F401
from paws_tf import schedules  # noqa: F401

import gin  # noqa: E402

# Normalisation statistics, so gin files write %IMAGENET_MEAN instead of
# copying numbers.
for _name in augment.GIN_CONSTANTS:
    gin.constant(_name, getattr(augment, _name))
