"""Networks: the backbones, the heads, the CPU-tuned layers the CPU configs
select and the official PyTorch names of their layers."""

import inspect
import math
import typing

import tensorflow as tf
import tf_keras

from paws_tf import as_written  # noqa: F401  (AutoGraph leaves paws_tf)

# The implementations of synchronised batch norm: the CPU-tuned layer or
# tf_keras' (the same values and variables).
CUSTOM = 'custom'
KERAS = 'keras'
IMPLEMENTATIONS = (CUSTOM, KERAS)


def build_in_scope(layer, input_shape):
    """Builds sublayer `layer` with variables named `<outer>/<layer>/...`,
    as its own call would name them, before the outer layer calls it."""
    with tf.name_scope(layer.name):
        layer.build(input_shape)


def torch_default_init(fan_in):
    """`kernel_initializer` and `bias_initializer` of PyTorch's default
    `nn.Conv2d` / `nn.Linear` of `fan_in` inputs per output unit (kernel
    area x input channels): `reset_parameters` draws the weights with
    `kaiming_uniform_(a=sqrt(5))`, i.e. U(+-1/sqrt(fan_in)), and the bias
    from the same range. Fresh instances: an unseeded initializer instance
    repeats its values."""
    bound = 1 / math.sqrt(fan_in)
    return dict(
        kernel_initializer=tf_keras.initializers.VarianceScaling(
            scale=1 / 3, mode='fan_in', distribution='uniform'),
        bias_initializer=tf_keras.initializers.RandomUniform(-bound, bound))


class Family(typing.NamedTuple):
    """A backbone family, as its module declares it to
    `backbones.FAMILIES`.

    Attributes:
        names: the backbone names it builds (`build_backbone.name`).
        configurable: its gin-configurable builder, whose parameters with
            a default (but `input_channels`) are the family's arguments,
            bound under its own gin name (`small_resnet.widths`): bindings
            of a family that is not named are not used.
        build: `build(name, *, input_channels, batch_norm, **arguments)`
            -> the model; `batch_norm` holds `build_backbone`'s batch-norm
            switches (`_Layers`' arguments), `arguments` those given in
            Python over the gin bindings.
        downsampling: `downsampling(name)`: how many times backbone `name`
            shrinks an image side under the config's bindings.
        patch_size: `patch_size()`: `(side, binding)` of the patches the
            family cuts images into, every image side a multiple of it;
            None for a family that takes any side.
        small_images: what lets the family's config take images smaller
            than its downsampling, for the message that refuses them.
        settings: the arguments that set how the backbone trains (an
            initialisation, a batch norm's momentum), not what it computes
            from its weights.
        batch_norm: whether its backbones have batch norms, whose
            `build_backbone` arguments (`bn_epsilon`) apply to them.
    """

    names: tuple
    configurable: typing.Callable
    build: typing.Callable
    downsampling: typing.Callable
    patch_size: typing.Optional[typing.Callable] = None
    small_images: str = ("a backbone for small images (build_backbone.name"
                         " = 'small_resnet', as the recipe "
                         "gin_configs/image_folders_small.gin)")
    settings: tuple = ()
    batch_norm: bool = True

    def arguments(self):
        """The family's arguments, in order."""
        return [key for key, parameter in inspect.signature(
            self.configurable).parameters.items()
            if parameter.default is not parameter.empty
            and key != 'input_channels']

    def architecture(self):
        """The arguments that make what the backbone computes from its
        weights: `arguments` but the `settings`."""
        return [key for key in self.arguments() if key not in self.settings]
