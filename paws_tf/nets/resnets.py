"""ResNet feature extractors: images [B, H, W, C] -> features [B, F]."""

import functools
import math

import gin
import tf_keras

from paws_tf import bindings
from paws_tf import checks
from paws_tf import nets
from paws_tf.nets import onednn
from paws_tf.nets import recompute
from paws_tf.nets import sync_batch_norm

RESNET50_STAGE_BLOCKS = (3, 4, 6, 3)
RESNET50_WIDTH_MULTIPLIERS = (1, 2, 4)
BOTTLENECK_EXPANSION = 4
WIDE_RESNET_STEM_WIDTH = 16
# Keras decay of the official WideResNet's last BN (PyTorch momentum 0.99).
WIDE_RESNET_FINAL_BN_MOMENTUM = 0.01


class _Layers:
    """Makes a ResNet's convolutions and batch norms with the
    `build_backbone` switches between paws_tf's layers and tf_keras'; the
    architecture builders receive it as `make`."""

    def __init__(self, *, recompute_bn_relu, **batch_norm_args):
        self.recompute_bn_relu = recompute_bn_relu
        self.batch_norm_args = batch_norm_args

    def norm(self, name, zero_init=False, **overrides):
        """A batch norm; `overrides` (`momentum`) replace the backbone's."""
        return sync_batch_norm.batch_norm(
            name, zero_init=zero_init, **{**self.batch_norm_args, **overrides})

    def conv_layers(self, x, filters, kernel_size, stride, name,
                    torch_default=False):
        """(padding or None, Conv2D) for input `x`, with PyTorch's symmetric
        `kernel_size // 2` padding; without bias, initialised as the
        torchvision and official PAWS ResNets (kaiming_normal_, fan_out), or
        with `torch_default` as the official WideResNet leaves its
        convolutions (a bias, `nets.torch_default_init`)."""
        onednn.check_conv_safe(x, kernel_size, stride, name)
        if torch_default:
            init = nets.torch_default_init(
                kernel_size * kernel_size * x.shape[-1])
        else:
            # A fresh instance per layer: an unseeded one repeats its values.
            init = dict(
                kernel_initializer=tf_keras.initializers.VarianceScaling(
                    scale=2.0, mode='fan_out',
                    distribution='untruncated_normal'))
        padding = None
        if stride > 1 and kernel_size > 1:
            # Keras 'same' pads strided convs asymmetrically on even sizes;
            # explicit padding keeps torchvision's output grid and sizes.
            padding = tf_keras.layers.ZeroPadding2D(kernel_size // 2,
                                                    name=f'{name}_pad')
        # 'valid' where strided: padded above, or 1x1 (no padding).
        return padding, tf_keras.layers.Conv2D(
            filters, kernel_size, strides=stride,
            padding='same' if stride == 1 else 'valid',
            use_bias=torch_default, name=name, **init)

    def conv(self, x, *args, **kwargs):
        """`conv_layers(x, ...)` applied to `x`."""
        padding, conv = self.conv_layers(x, *args, **kwargs)
        return conv(x if padding is None else padding(x))

    def norm_relu_then(self, x, bn_name, layers, name):
        """`layer(padding(relu(batch norm bn_name(x))))` as one
        `NormReLUThen`, `layers` being (padding or None, layer)."""
        padding, layer = layers
        return recompute.NormReLUThen(
            self.norm(bn_name), layer, recompute=self.recompute_bn_relu,
            padding=padding, name=name)(x)

    def norm_relu_conv(self, x, block, bn, conv, *args, **kwargs):
        """Applies `NormReLUThen` named `{block}_{bn}_{conv}` to `x`; its
        batch norm and convolution are named `{block}_{bn}` and
        `{block}_{conv}`. `*args, **kwargs`: the `conv_layers` arguments
        after `x`, but `name`."""
        conv_layers = self.conv_layers(x, *args, name=f'{block}_{conv}',
                                       **kwargs)
        return self.norm_relu_then(x, f'{block}_{bn}', conv_layers,
                                   name=f'{block}_{bn}_{conv}')


def _features_model(inputs, x, name):
    """Pools [B, h, w, F] to [B, F] and wraps the graph into a Model."""
    features = tf_keras.layers.GlobalAveragePooling2D(name='avg_pool')(x)
    model = tf_keras.Model(inputs, features, name=name)  # [B, F]
    model.output_dim = int(features.shape[-1])
    model.side_multiple = 1  # Any image side goes through.
    return model


def _bottleneck_block(x, planes, stride, name, make, zero_init_residual):
    """ResNet v1.5 bottleneck: stride on the 3x3 conv, expansion 4."""
    out_channels = planes * BOTTLENECK_EXPANSION
    shortcut = x
    if stride != 1 or x.shape[-1] != out_channels:
        shortcut = make.conv(x, out_channels, 1, stride, name + '_proj_conv')
        shortcut = make.norm(name + '_proj_bn')(shortcut)
    y = make.conv(x, planes, 1, 1, name + '_conv1')
    # BN1 -> ReLU -> conv2 (strided): [B, h/s, w/s, P].
    y = make.norm_relu_conv(y, name, 'bn1', 'conv2', planes, 3, stride)
    y = make.norm_relu_conv(y, name, 'bn2', 'conv3', out_channels, 1, 1)
    y = make.norm(name + '_bn3', zero_init=zero_init_residual)(y)
    y = tf_keras.layers.Add(name=name + '_add')([y, shortcut])
    return tf_keras.layers.ReLU(name=name + '_out')(y)  # [B, h/s, w/s, 4P]


@gin.configurable(denylist=['inputs', 'make'])
def resnet50(inputs, make, width_multiplier=1, zero_init_residual=False):
    """ResNet-50 (torchvision v1.5 / SimCLR layout), F = 2048 *
    width_multiplier; gin binds its arguments as `resnet50.*`.

    Args:
        inputs: the [B, H, W, C] input.
        make: the `_Layers` of its convolutions and batch norms.
        width_multiplier: w in {1, 2, 4} (PAWS Table 2).
        zero_init_residual: zero gamma in the last BN of each block; False
            because the official PAWS code (and torchvision) leave it off;
            SimCLR's TF code turns it on.
    """
    if width_multiplier not in RESNET50_WIDTH_MULTIPLIERS:
        raise ValueError(
            f'resnet50 width_multiplier must be one of '
            f'{RESNET50_WIDTH_MULTIPLIERS}, got {width_multiplier!r}')
    width = 64 * width_multiplier
    x = make.conv(inputs, width, 7, 2, 'stem_conv')  # [B, H/2, W/2, 64w]
    # torchvision's stem: batch norm, ReLU, MaxPool2d(3, 2, 1). Zeros give
    # the values and gradients of its -inf padding on ReLU outputs: a window
    # holds a real value >= 0, and a real 0 that ties with the padding
    # passes no gradient back through its ReLU.
    pool = (tf_keras.layers.ZeroPadding2D(1, name='stem_pool_pad'),
            tf_keras.layers.MaxPool2D(3, 2, padding='valid',
                                      name='stem_pool'))
    x = make.norm_relu_then(x, 'stem_bn', pool,
                            'stem_bn_pool')  # [B, H/4, W/4, 64w]
    for stage, num_blocks in enumerate(RESNET50_STAGE_BLOCKS, start=1):
        planes = width * 2 ** (stage - 1)
        for block in range(1, num_blocks + 1):
            stride = 2 if stage > 1 and block == 1 else 1
            x = _bottleneck_block(x, planes, stride,
                                  f'stage{stage}_block{block}', make,
                                  zero_init_residual)
    return _features_model(inputs, x, f'resnet50_{width_multiplier}x')


def _wide_block(x, filters, stride, name, make):
    """Pre-activation wide block of the official PAWS WideResNet."""
    shortcut = x
    if stride != 1 or x.shape[-1] != filters:
        # The official code projects the raw block input, not the
        # pre-activated one (suncet src/wide_resnet.py).
        shortcut = make.conv(x, filters, 1, stride, name + '_proj_conv',
                             torch_default=True)
    y = make.norm_relu_conv(x, name, 'bn1', 'conv1', filters, 3, 1,
                            torch_default=True)
    y = make.norm_relu_conv(y, name, 'bn2', 'conv2', filters, 3, stride,
                            torch_default=True)
    return tf_keras.layers.Add(name=name + '_add')([y, shortcut])


@gin.configurable(denylist=['inputs', 'make'])
def wide_resnet(inputs, make, depth=28, width=2,
                 final_bn_momentum=WIDE_RESNET_FINAL_BN_MOMENTUM):
    """WideResNet-depth-width without dropout, F = 64 * width: the official
    PAWS code's pre-activation network, convolutions with biases and
    PyTorch's default initialisation; gin binds its arguments as
    `wide_resnet.*` (depth 6n + 4; width 2: App. C, 1.47M params).

    The official network (suncet src/wide_resnet.py) gives its last batch
    norm `momentum=0.99` in PyTorch's convention, where momentum is the
    weight of the new batch: its moving statistics are almost the last
    batch's. `final_bn_momentum` is Keras' decay, 1 - 0.99.
    """
    if depth < 10 or (depth - 4) % 6:
        raise ValueError(f'wide_resnet depth must be 6n + 4 with n >= 1, '
                         f'got {depth!r}')
    if width < 1:
        raise ValueError(f'wide_resnet width must be >= 1, got {width!r}')
    x = make.conv(inputs, WIDE_RESNET_STEM_WIDTH, 3, 1, 'stem_conv',
                  torch_default=True)
    for group, stride in enumerate((1, 2, 2), start=1):
        filters = WIDE_RESNET_STEM_WIDTH * 2 ** (group - 1) * width
        for block in range(1, (depth - 4) // 6 + 1):
            x = _wide_block(x, filters, stride if block == 1 else 1,
                            f'group{group}_block{block}', make)
    x = make.norm('final_bn', momentum=final_bn_momentum)(x)
    x = tf_keras.layers.ReLU(name='final_relu')(x)  # [B, H/4, W/4, 64k]
    return _features_model(inputs, x, f'wide_resnet{depth}_{width}')


def _basic_block(x, filters, stride, name, make):
    """Post-activation basic block: two 3x3 convs."""
    shortcut = x
    if stride != 1 or x.shape[-1] != filters:
        shortcut = make.conv(x, filters, 1, stride, name + '_proj_conv')
        shortcut = make.norm(name + '_proj_bn')(shortcut)
    y = make.conv(x, filters, 3, stride, name + '_conv1')
    y = make.norm_relu_conv(y, name, 'bn1', 'conv2', filters, 3, 1)
    y = make.norm(name + '_bn2')(y)
    y = tf_keras.layers.Add(name=name + '_add')([y, shortcut])
    return tf_keras.layers.ReLU(name=name + '_out')(y)


@gin.configurable(denylist=['inputs', 'make'])
def small_resnet(inputs, make, widths=(32, 64, 128),
                  blocks_per_stage=(1, 1, 1), stem_stride=1,
                  stage_strides=(2, 2, 2)):
    """Small basic-block ResNet for CPU runs, F = widths[-1]; the first
    stage may already downsample. gin binds its arguments as
    `small_resnet.*`: `widths`, `blocks_per_stage` and `stage_strides`
    are tuples of equal length, `stem_stride` an int."""
    widths, blocks_per_stage = tuple(widths), tuple(blocks_per_stage)
    stage_strides = tuple(stage_strides)
    if not (len(widths) == len(blocks_per_stage) == len(stage_strides) > 0):
        raise ValueError(
            f'small_resnet widths, blocks_per_stage and stage_strides must be '
            f'non-empty and of equal length, got {widths!r}, '
            f'{blocks_per_stage!r}, {stage_strides!r}')
    if stem_stride < 1 or min(widths + blocks_per_stage + stage_strides) < 1:
        raise ValueError(
            f'small_resnet sizes and strides must be >= 1, got widths='
            f'{widths!r}, blocks_per_stage={blocks_per_stage!r}, '
            f'stem_stride={stem_stride!r}, stage_strides={stage_strides!r}')
    x = make.conv(inputs, widths[0], 3, stem_stride, 'stem_conv')
    x = tf_keras.layers.ReLU(name='stem_relu')(make.norm('stem_bn')(x))
    stages = zip(widths, blocks_per_stage, stage_strides)
    for stage, (filters, num_blocks, stride) in enumerate(stages, start=1):
        for block in range(1, num_blocks + 1):
            x = _basic_block(x, filters, stride if block == 1 else 1,
                             f'stage{stage}_block{block}', make)
    return _features_model(inputs, x, 'small_resnet')  # F = widths[-1]


def _build(configurable, name, *, input_channels, batch_norm,
           **arguments):
    """The ResNet `configurable` builds on [B, H, W, `input_channels`]
    images, its batch norms made with `batch_norm` (`_Layers`' arguments);
    `name` is its own."""
    del name  # One name a builder.
    checks.integer('input_channels', input_channels)
    checks.number('bn_momentum', batch_norm['momentum'], low=0.0, high=1.0)
    checks.one_of('sync_bn_impl', batch_norm['impl'], nets.IMPLEMENTATIONS)
    make = _Layers(**batch_norm)
    inputs = tf_keras.Input(shape=(None, None, input_channels), name='images')
    return configurable(inputs, make, **arguments)


def _small_resnet_downsampling(name):
    """The product of small_resnet's bound strides."""
    del name  # One name.
    arguments = bindings.arguments(small_resnet)
    return arguments['stem_stride'][0] * math.prod(
        arguments['stage_strides'][0])


RESNET50 = nets.Family(
    names=('resnet50',), configurable=resnet50,
    build=functools.partial(_build, resnet50),
    settings=('zero_init_residual',),
    # The stem conv and max pool, stages 2-4: five strides of 2.
    downsampling=lambda name: 32)
WIDE_RESNET = nets.Family(
    names=('wide_resnet',), configurable=wide_resnet,
    build=functools.partial(_build, wide_resnet),
    settings=('final_bn_momentum',),
    # Its second and third groups.
    downsampling=lambda name: 4)
SMALL_RESNET = nets.Family(
    names=('small_resnet',), configurable=small_resnet,
    build=functools.partial(_build, small_resnet),
    downsampling=_small_resnet_downsampling,
    small_images='fewer small_resnet.stage_strides')
