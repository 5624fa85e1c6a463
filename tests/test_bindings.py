"""What the parsed gin config binds, read through the configurables'
own functions."""

import gin
import pytest

from paws_tf import bindings
from paws_tf import configurables  # noqa: F401  (registers the configurables)
from paws_tf.data import augment
from paws_tf.nets import vit


def test_arguments_read_a_configurable_through_its_function(clean_gin):
    """Bound values over the defaults, each named by the macro it came
    through or by its binding, in a scope, with what a factory's
    `**kwargs` take; a parameter the function does not have is a
    KeyError, not an unbound default. Fails if a renamed parameter reads
    as unbound (a check on it would stop silently)."""
    del clean_gin
    gin.parse_config("""
        PATCH = 8
        vit.patch_size = %PATCH
        eval/vit.depth = 3
        cifar10_multicrop.global_size = 20
    """)
    arguments = bindings.arguments(vit.build_vit)
    assert arguments['patch_size'] == (8, 'PATCH')
    assert arguments['image_size'] == (224, 'vit.image_size')
    assert arguments['depth'] == (None, 'vit.depth')
    assert arguments['name'] == (None, 'vit.name')  # No default.
    assert bindings.arguments(vit.build_vit, 'eval')['depth'] == (
        3, 'eval/vit.depth')
    assert bindings.arguments(augment.cifar10_multicrop) == {
        'global_size': (20, 'cifar10_multicrop.global_size')}
    with pytest.raises(KeyError):
        bindings.arguments(vit.build_vit)['patch_side']
