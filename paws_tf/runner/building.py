"""The PAWS model and its optimizer under a strategy and a precision policy."""

import math

import tensorflow as tf
import tf_keras

from paws_tf import model as model_lib

PRECISIONS = ('float32', 'mixed_bfloat16', 'mixed_float16')


def build_model(strategy, *, input_channels):
    """The PAWS model, built in the strategy's scope; its batch norm is
    synchronised across replicas when there are several (global BN, PAWS
    Sec. 5), else fused."""
    with strategy.scope():
        model = model_lib.build_model(
            input_channels=input_channels,
            sync_bn=strategy.num_replicas_in_sync > 1)
        # `model(...)` sets Keras' `built` and builds every head, on
        # images of a side the backbone takes (a ViT's: patch multiples).
        side = math.lcm(8, model.backbone.side_multiple)
        model(tf.zeros([1, side, side, input_channels]))
    return model


def in_float32(build, *args, **kwargs):
    """`build(*args, **kwargs)` under the float32 policy whatever the
    training precision: what is imported, exported or evaluated holds
    float32 weights (portable exports)."""
    tf_keras.mixed_precision.set_global_policy('float32')
    return build(*args, **kwargs)


def build_local_model(*, input_channels):
    """The PAWS model with plain variables (RuntimeError inside a
    strategy's scope), for what one process runs alone under
    MultiWorkerMirroredStrategy (evaluation, export): the distributed model
    reads its batch-norm moving statistics through an all-reduce the other
    workers never join, and a SavedModel cannot hold its distributed
    variables."""
    if tf.distribute.has_strategy():
        raise RuntimeError('build_local_model must be called outside any '
                           'tf.distribute strategy scope.')
    return build_model(tf.distribute.get_strategy(),
                       input_channels=input_channels)


def build_compiled_model(strategy, *, input_channels, steps_per_epoch,
                         num_epochs, optimizer_cls, schedule_cls, precision,
                         jit_compile, steps_per_execution):
    """The PAWS model, compiled with its optimizer and built in the
    strategy's scope."""
    if (jit_compile and strategy.num_replicas_in_sync > 1 and
            not tf.config.list_physical_devices('GPU')):
        raise ValueError(
            'jit_compile=True with several replicas on CPU devices fails in '
            'TensorFlow 2.21 (XLA cannot read the mirrored variables of the '
            'other CPU devices); use XLA with GPUs or with one replica.')
    tf_keras.mixed_precision.set_global_policy(precision)
    model = build_model(strategy, input_channels=input_channels)
    with strategy.scope():
        schedule = schedule_cls(steps_per_epoch=steps_per_epoch,
                                num_epochs=num_epochs)
        optimizer = optimizer_cls(learning_rate=schedule)
        if precision == 'mixed_float16':
            optimizer = tf_keras.mixed_precision.LossScaleOptimizer(optimizer)
        model.compile(optimizer=optimizer, jit_compile=jit_compile,
                      steps_per_execution=steps_per_execution)
        optimizer.build(model.trainable_variables)
    return model
