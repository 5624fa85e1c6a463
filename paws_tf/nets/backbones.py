"""The backbones, by name: images [B, H, W, C] -> features [B, F]. Each
family is a module that declares itself (`nets.Family`) and has a line in
`FAMILIES`."""

import difflib
import inspect

import gin

from paws_tf import bindings
from paws_tf import checks
from paws_tf import nets
from paws_tf.nets import resnets
from paws_tf.nets import vit

# What `model.build_model` sets for the backbone and the heads alike (how
# batch norm is synchronised): gin may not bind them on these builders.
SET_BY_BUILD_MODEL = ['sync_bn', 'sync_bn_impl']
# The backbone families, by the names they build: one line a family.
FAMILIES = {name: each for each in (
    resnets.RESNET50,
    resnets.WIDE_RESNET,
    resnets.SMALL_RESNET,
    vit.FAMILY,
) for name in each.names}


def family(name, binding='build_backbone.name'):
    """The `nets.Family` that builds backbone `name`, bound to `binding`.

    Raises:
        checks.ConfigError: `name` is not a backbone.
    """
    if name not in FAMILIES:
        raise checks.ConfigError(
            f'{binding} = {name!r} is not a backbone; valid choices: '
            f'{sorted(FAMILIES)}.')
    return FAMILIES[name]


@gin.config.register_finalize_hook
def _refuse_family_arguments(config):
    """Raises ConfigError naming a binding of `build_backbone` that is not
    one of its parameters (gin lets any name through to its `**kwargs`):
    a family's arguments are bound under the family's gin name, and the
    message names it (`small_resnet.widths`), else the closest name."""
    explicit = [key for key in inspect.signature(build_backbone).parameters
                if key != 'kwargs']
    for (scope, selector), values in config.items():
        if (selector == 'gin.macro' or
                gin.config.get_configurable(selector) is not build_backbone):
            continue
        for argument in sorted(set(values) - set(explicit)):
            name = (f'{scope}/' if scope else '') + 'build_backbone'
            owners = [f'{bindings.gin_name(each.configurable)}.{argument}'
                      for each in dict.fromkeys(FAMILIES.values())
                      if argument in each.arguments()]
            close = difflib.get_close_matches(argument, explicit, n=1)
            hint = (f'a backbone family takes it under its own name: bind '
                    f'{" or ".join(owners)}.' if owners else
                    f'did you mean {name}.{close[0]}?' if close else
                    f'its parameters: {explicit}.')
            raise checks.ConfigError(
                f'{name}.{argument} is bound, but build_backbone has no '
                f'parameter {argument!r}: {hint}')
    return None


def check_arguments(name, arguments):
    """Raises ConfigError naming every one of `arguments` (names given to
    `build_backbone` in Python) that is not an architecture argument of
    backbone `name`, with the family it belongs to, or the closest
    argument."""
    valid = family(name).arguments()
    unknown = sorted(set(arguments) - set(valid))
    if not unknown:
        return
    named = []
    for argument in unknown:
        owner = next((other for other in FAMILIES
                      if argument in FAMILIES[other].arguments()), None)
        close = difflib.get_close_matches(argument, valid, n=1)
        named.append(f'build_backbone.{argument}' + (
            f' (an argument of {owner!r})' if owner else
            f' (did you mean build_backbone.{close[0]}?)' if close else ''))
    raise checks.ConfigError(
        f'{", ".join(named)} '
        + ('is not an argument' if len(unknown) == 1 else 'are not arguments')
        + f' of backbone {name!r}. Its arguments: {valid}.')


def check_image_sizes(sizes):
    """Refuses image sides the configured backbone cannot take: smaller
    than its downsampling (its last stages would see a single pixel), or,
    for a family that cuts patches, not a multiple of the patch side.

    Args:
        sizes: `(name, side)` of each image size the config feeds the
            backbone, `name` the binding or macro that gives it.

    Raises:
        checks.ConfigError: naming the size's binding, the backbone's and
            the fix; or `build_backbone.name` is not a backbone.
    """
    backbone, backbone_name = bindings.arguments(build_backbone)['name']
    if not isinstance(backbone, str):
        return
    chosen = family(backbone, backbone_name)
    minimum = chosen.downsampling(backbone)
    for size_name, size in sizes:
        if checks.integer(size_name, size) < minimum:
            raise checks.ConfigError(
                f'{size_name} = {size} is smaller than {minimum} px, the '
                f'downsampling of {backbone_name} = {backbone!r}: its last '
                'stages would see a single pixel padded with zeros. Bind '
                f'{size_name} = {minimum} or more, or {chosen.small_images}.')
        if chosen.patch_size is not None and size % minimum:
            raise checks.ConfigError(
                f'{size_name} = {size} is not a multiple of '
                f'{chosen.patch_size()[1]} = {minimum}: {backbone_name} = '
                f'{backbone!r} cuts images into patches of that side.')


@gin.configurable(denylist=SET_BY_BUILD_MODEL + ['input_channels'])
def build_backbone(name, *, input_channels=3, sync_bn=False, bn_momentum=0.9,
                   bn_epsilon=1e-5, sync_bn_impl=nets.KERAS,
                   recompute_bn_relu=False, **kwargs):
    """Builds a channels-last feature extractor that accepts any image size.

    `sync_bn_impl` and `recompute_bn_relu` choose between tf_keras' layers
    (the defaults) and paws_tf's CPU-tuned ones, with the same variables,
    values and gradients (docs/performance.md). `model.build_model` passes
    `sync_bn` and `sync_bn_impl` (gin binds them there).

    Args:
        name: a backbone of `FAMILIES` (a family without batch norm, as
            the ViTs, ignores the batch-norm arguments).
        input_channels: C of the [B, H, W, C] input images.
        sync_bn: synchronise batch-norm statistics across replicas (global
            BN, PAWS Sec. 5); use False with a single replica (fusable BN).
        bn_momentum: batch-norm moving-average decay (Keras convention).
        bn_epsilon: batch-norm epsilon.
        sync_bn_impl: with `sync_bn`, 'keras' (default) or 'custom'
            (`sync_batch_norm.batch_norm`'s `impl`). Only 'custom' is
            recomputed (`recompute_bn_relu`).
        recompute_bn_relu: where a batch norm and ReLU feed a convolution or
            max pool alone, recompute the ReLU output in the backward pass
            instead of holding it (`recompute.NormReLUThen`); False
            (default) composes the tf_keras layers, which hold it.
        **kwargs: architecture arguments of the chosen backbone, over
            what gin binds to its family (`small_resnet.widths`,
            `vit.patch_size`); gin binds none here.

    Returns:
        A `tf_keras.Model` mapping [B, H, W, C] float images to [B, F]
        features (in the compute dtype of the global mixed-precision
        policy), with the int attributes `output_dim` = F and
        `side_multiple`, of which every image side must be a multiple (1
        for the ResNets, the patch size for the ViTs).

    Raises:
        ValueError: unknown `name` or architecture argument, or a bad value.
    """
    check_arguments(name, kwargs)
    return family(name).build(
        name, input_channels=input_channels, batch_norm=dict(
            recompute_bn_relu=recompute_bn_relu, sync_bn=sync_bn,
            impl=sync_bn_impl, momentum=bn_momentum, epsilon=bn_epsilon),
        **kwargs)
