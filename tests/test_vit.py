"""Tests for paws_tf.nets.vit: timm's VisionTransformer in PyTorch
(tests/helpers/timm_vit.py) is the reference, its architectures (`TIMM`)
written here from timm's source, not read from `vit.ARCHITECTURES`.

Bugs tried (each test's docstring names the ones it catches): post-norm
blocks; no position embedding on the class token; resampling without
antialiasing; LayerNorm epsilon 1e-5; heads split from the wrong axis of
qkv; attention scale 1 / sqrt(D); resampled embeddings cut from the
gradient; tanh GELU; TruncatedNormal kernels; the class token drawn like
the position embeddings; tf.image.resize in the resampling (no XLA
kernel); the grid size left out of the tokens layer's config; float16
attention logits; vit_small with 8 heads and vit_base 6 blocks deep in
`vit.ARCHITECTURES`.
"""

import gin
import numpy as np
import pytest
import tensorflow as tf
import tf_keras
import torch
import torch.nn.functional as F

from paws_tf import checks
from paws_tf.nets import backbones
from paws_tf.nets import vit
from paws_tf.nets import vit_positions
from paws_tf.runner import building
from tests.helpers import timm_vit

# Small-contrast images keep LayerNorm's inputs of small variance, where
# its epsilon (1e-6 against 1e-5) shows in the features.
IMAGE_STD = 0.05
RELATIVE_TOLERANCE = 1e-4
# (embed_dim, depth, num_heads, patch_size) of timm's ViT-Ti/16, -S/16 and
# -B/16, written from huggingface/pytorch-image-models at
# aa4b5850c1543fa488abf260f18390eda46cf85d, timm/models/vision_transformer.py
# lines 3108, 3144 and 3192 (`vit_{tiny,small,base}_patch16_224`'s
# `model_args`); timm's `VisionTransformer` defaults to mlp_ratio 4 (line
# 729), as tests/helpers/timm_vit.py does.
TIMM = {'vit_tiny': (192, 12, 3, 16), 'vit_small': (384, 12, 6, 16),
        'vit_base': (768, 12, 12, 16)}


def _images(shape, seed):
    """[B, H, W, C] float32 N(0, IMAGE_STD^2) images."""
    return (IMAGE_STD * np.random.default_rng(seed).standard_normal(shape)
            ).astype(np.float32)


def _timm_features(reference, images):
    with torch.no_grad():
        return reference(torch.from_numpy(images).permute(0, 3, 1, 2)
                         ).numpy()


def _relative_error(actual, expected):
    """max |actual - expected| / max |expected|."""
    actual = np.asarray(actual, np.float64)
    return np.abs(actual - expected).max() / np.abs(expected).max()


def _pair(name, patch_size, image_size, depth, seed):
    """timm's model with random weights (no 0 or 1) and the paws_tf one
    with the same weights."""
    width, _, heads, _ = TIMM[name]
    torch.manual_seed(seed)
    reference = timm_vit.VisionTransformer(
        img_size=image_size, patch_size=patch_size, embed_dim=width,
        depth=depth, num_heads=heads).eval()
    timm_vit.randomize(reference, seed)
    model = vit.build_vit(name, patch_size=patch_size, image_size=image_size,
                          depth=depth)
    timm_vit.copy_to_keras(reference, model)
    return reference, model


@pytest.fixture(scope='module')
def small_pair():
    """vit_tiny, 2 blocks, patch 8, built for 32 px (a 4 x 4 grid)."""
    return _pair('vit_tiny', patch_size=8, image_size=32, depth=2, seed=0)


@pytest.mark.parametrize('old, new', [((14, 14), (6, 6)),
                                      ((6, 6), (14, 14)),
                                      ((4, 4), (2, 7))])
def test_resampling_is_pytorch_antialiased_bicubic(old, new):
    """The position grid resampled as F.interpolate(mode='bicubic',
    antialias=True) does it, down (14 -> 6), up (6 -> 14) and each axis
    its own way (4 x 4 -> 2 x 7). Fails if the cubic's a is PyTorch's
    plain bicubic's -0.75, if the cubic is not stretched when shrinking
    (no antialiasing), or if the rows and columns are swapped."""
    grid = np.random.default_rng(1).standard_normal(old + (5,)).astype(
        np.float32)
    expected = F.interpolate(
        torch.from_numpy(grid).permute(2, 0, 1)[None], size=new,
        mode='bicubic', antialias=True)[0].permute(1, 2, 0).numpy()
    actual = vit_positions.resample_positions(tf.constant(grid), new).numpy()
    np.testing.assert_allclose(actual, expected, rtol=0, atol=1e-5)


def test_resampling_at_the_built_size_is_the_identity():
    """At the built grid the embeddings pass unchanged, as timm returns
    them. Fails if the output samples sit at i * old / new (no half-pixel
    centres)."""
    grid = tf.random.stateless_normal([4, 4, 3], [0, 1])
    assert np.array_equal(vit_positions.resample_positions(grid, (4, 4)), grid)


@pytest.mark.parametrize('size', [(32, 32), (16, 16), (48, 48), (24, 40)])
def test_features_equal_timm(small_pair, size):
    """The class token's features equal timm's at the built size (32), a
    local-view size (16), a larger one (48) and a non-square one, within
    1e-4 of the largest. Fails if a block is post-norm (norm(x + f(x))),
    if the class token gets no position embedding, if the resampling does
    not antialias, if LayerNorm's epsilon is 1e-5, if the heads are split
    from the wrong axis of qkv ([B, N, heads, 3, d]), or if the attention
    scale is 1 / sqrt(D) instead of 1 / sqrt(D / heads)."""
    reference, model = small_pair
    images = _images((2,) + size + (3,), seed=2)
    error = _relative_error(model(images), _timm_features(reference, images))
    assert error < RELATIVE_TOLERANCE, error


def test_gradients_equal_timm_at_a_local_view(small_pair):
    """At a local-view size (16 px, the 4 x 4 position grid resampled to
    2 x 2) the gradients of every variable equal timm's parameter
    gradients, the position embeddings' through the resampling included,
    within 1e-4 of the largest of each. Fails if the resampled embeddings
    are cut from the gradient (tf.stop_gradient)."""
    reference, model = small_pair
    images = _images((2, 16, 16, 3), seed=9)
    weights = np.random.default_rng(10).standard_normal(
        (2, model.output_dim)).astype(np.float32)
    with tf.GradientTape() as tape:
        loss = tf.reduce_sum(model(images) * weights)
    gradients = tape.gradient(loss, model.weights)
    reference.zero_grad()
    loss = (reference(torch.from_numpy(images).permute(0, 3, 1, 2))
            * torch.from_numpy(weights)).sum()
    loss.backward()
    expected = timm_vit.as_keras_arrays(
        reference, {name: parameter.grad for name, parameter
                    in reference.named_parameters()})
    for variable, gradient in zip(model.weights, gradients):
        name = variable.name.split(':')[0]
        error = _relative_error(gradient, expected[name])
        assert error < RELATIVE_TOLERANCE, (name, error)


@pytest.mark.parametrize('name', sorted(TIMM))
def test_each_architecture_is_timms(name):
    """Each name builds timm's model of that name: one block equals timm's
    built from `TIMM` (its width and heads), and unset, the depth is
    timm's, each block with timm's head count and MLP width.

    Fails if a width, depth or head count in `vit.ARCHITECTURES` is not
    timm's (tried: vit_small with 8 heads, vit_base with depth 6)."""
    width, depth, heads, patch = TIMM[name]
    reference, model = _pair(name, patch_size=patch, image_size=2 * patch,
                             depth=1, seed=11)
    images = _images((2, 2 * patch, 2 * patch, 3), seed=12)
    error = _relative_error(model(images), _timm_features(reference, images))
    assert error < RELATIVE_TOLERANCE, error
    full = vit.build_vit(name, patch_size=patch, image_size=2 * patch)
    blocks = [layer for layer in full.layers
              if layer.name.startswith('blocks_')]
    assert (full.output_dim, len(blocks)) == (width, depth)
    for block in blocks:
        assert block.num_heads == heads
        assert block.fc1.kernel.shape == (width, 4 * width)


def test_mlp_activation_is_exact_gelu():
    """The blocks' MLP activation is PyTorch's nn.GELU() (erf) on [-6, 6]
    to float32 rounding. Fails if it is the tanh approximation (4e-4 off
    near -2.5, where the features above change by about 1e-4 only)."""
    model = vit.build_vit('vit_tiny', patch_size=8, image_size=32, depth=1)
    fc1 = model.get_layer('blocks_0').fc1
    kernel = np.zeros(fc1.kernel.shape, np.float32)  # [192, 768]
    grid = np.linspace(-6, 6, kernel.shape[1], dtype=np.float32)
    kernel[0] = grid
    fc1.kernel.assign(kernel)
    hidden = fc1(np.eye(1, kernel.shape[0], dtype=np.float32))[0]
    expected = F.gelu(torch.from_numpy(grid)).numpy()
    np.testing.assert_allclose(hidden, expected, rtol=0, atol=1e-6)


def test_vit_tiny_224_and_96_equal_timm():
    """A 2-block vit_tiny/16 built for 224 px equals timm's at 224 and at
    the local views' 96 px (a 14 x 14 grid resampled to 6 x 6). Fails if
    the attention scale is 1 / sqrt(D) instead of 1 / sqrt(D / heads)."""
    reference, model = _pair('vit_tiny', patch_size=16, image_size=224,
                             depth=2, seed=3)
    for size in (224, 96):
        images = _images((2, size, size, 3), seed=size)
        error = _relative_error(model(images),
                                _timm_features(reference, images))
        assert error < RELATIVE_TOLERANCE, (size, error)


def test_initialisation_is_timms():
    """Weights are drawn as timm's default initialisation: linear kernels
    N(0, 0.02), position embeddings N(0, 0.02), the class token
    N(0, 1e-6), zero biases, LayerNorm ones and zeros, the patch
    convolution U(+-1/sqrt(fan_in)). Fails if the kernels are tf_keras'
    TruncatedNormal(stddev=0.02) (cut at 2 sigma: std 0.0176), or if the
    class token is drawn like the position embeddings."""
    tf_keras.utils.set_random_seed(0)
    model = vit.build_vit('vit_small', patch_size=16, image_size=224,
                          depth=1)
    values = {v.name.split(':')[0]: v.numpy() for v in model.weights}
    for name in ('blocks_0/attn/qkv/kernel', 'blocks_0/mlp/fc1/kernel',
                 'tokens/pos_embed'):
        np.testing.assert_allclose(values[name].std(), 0.02, rtol=0.02)
        assert abs(values[name].mean()) < 1e-3
    np.testing.assert_allclose(values['tokens/cls_token'].std(), 1e-6,
                               rtol=0.15)
    fan_in = 16 * 16 * 3
    for name in ('patch_embed/proj/kernel', 'patch_embed/proj/bias'):
        assert np.abs(values[name]).max() <= 1 / np.sqrt(fan_in)
    np.testing.assert_allclose(values['patch_embed/proj/kernel'].std(),
                               1 / np.sqrt(3 * fan_in), rtol=0.02)
    for name, value in values.items():
        if name.endswith(('/bias', '/beta')) and 'patch_embed' not in name:
            assert not value.any(), name
        if name.endswith('/gamma'):
            assert (value == 1).all(), name


def test_compiled_local_view_equals_eager(small_pair):
    """A local view (16 px for a 32-px network) runs in an XLA-compiled
    function with the values of the eager call. Fails if the position
    embeddings are resampled with tf.image.resize(antialias=True), whose
    ScaleAndTranslate op has no XLA kernel."""
    _, model = small_pair
    images = _images((2, 16, 16, 3), seed=4)
    compiled = tf.function(model, jit_compile=True)
    np.testing.assert_allclose(compiled(images), model(images), rtol=0,
                               atol=1e-5)


def test_clone_from_config_computes_the_same(small_pair):
    """A clone from the layers' configs (as fine-tuning copies the
    backbone), with the weights, gives the same features at another size.
    Fails if the tokens layer leaves its grid size out of its config."""
    _, model = small_pair
    clone = tf_keras.models.clone_model(model)
    clone.set_weights(model.get_weights())
    images = _images((1, 24, 24, 3), seed=5)
    np.testing.assert_array_equal(clone(images), model(images))


def test_sides_must_be_multiples_of_the_patch_size(small_pair):
    """A side that is not a multiple of the patch size is refused, at trace
    time when known, at run time when not. Fails if the patch embedding
    lets the strided convolution drop the border."""
    _, model = small_pair
    with pytest.raises(ValueError, match='height 20 is not a multiple'):
        model(np.zeros([1, 20, 16, 3], np.float32))
    unknown = tf.function(model, input_signature=[
        tf.TensorSpec([None, None, None, 3], tf.float32)])
    with pytest.raises(tf.errors.InvalidArgumentError,
                       match='width is not a multiple'):
        unknown(np.zeros([1, 16, 20, 3], np.float32))


def test_float16_logits_overflow_without_float32_softmax():
    """float16 queries and keys whose logits pass 65504: computed in
    float16 they overflow to inf and the softmax gives NaN; computed in
    float32 (the default) the attention equals NumPy's in float64 on the
    same float16 inputs. Fails if the default logits dtype is the inputs'."""
    rng = np.random.default_rng(6)
    # [B, heads, N, d] with logits q.k / sqrt(d) near +-2e5.
    queries, keys, values = (
        (scale * rng.standard_normal([1, 2, 5, 16])).astype(np.float16)
        for scale in (300.0, 300.0, 1.0))
    q, k, v = (x.astype(np.float64) for x in (queries, keys, values))
    logits = q @ k.transpose(0, 1, 3, 2) / 4.0
    assert np.abs(logits).max() > 65504
    weights = np.exp(logits - logits.max(-1, keepdims=True))
    expected = (weights / weights.sum(-1, keepdims=True)) @ v
    in_float16 = vit.scaled_dot_product_attention(
        queries, keys, values, logits_dtype=tf.float16)
    assert np.isnan(in_float16.numpy()).any()
    actual = vit.scaled_dot_product_attention(queries, keys, values)
    assert actual.dtype == tf.float16
    np.testing.assert_allclose(actual.numpy().astype(np.float64), expected,
                               rtol=0, atol=2e-3)


def _first_block_logits(model, images):
    """Largest |attention logit| of the first block, in float32."""
    tokens = model.get_layer('tokens')(model.get_layer('patch_embed')(images))
    block = model.get_layer('blocks_0')
    qkv = block.attn.qkv(block.norm1(tokens)).numpy()
    heads = block.num_heads
    qkv = qkv.reshape(qkv.shape[:2] + (3, heads, -1)).transpose(2, 0, 3, 1, 4)
    q, k = qkv[0], qkv[1]
    return np.abs(q @ k.transpose(0, 1, 3, 2)).max() / np.sqrt(q.shape[-1])


@pytest.mark.parametrize('policy, tolerance', [('mixed_float16', 5e-3),
                                               ('mixed_bfloat16', 2e-2)])
def test_mixed_precision_features_close_to_float32(policy, tolerance):
    """Under a mixed policy, with query and key weights that put the first
    block's attention logits past float16's 65504, the features are
    finite, in the compute dtype, and close to the float32 network's.
    Fails (NaN under mixed_float16) if the attention's logits are computed
    in the compute dtype."""
    tf_keras.utils.set_random_seed(7)
    model = vit.build_vit('vit_tiny', patch_size=8, image_size=32, depth=2)
    qkv = model.get_layer('blocks_0').attn.qkv.kernel
    kernel = qkv.numpy()
    dim = kernel.shape[0]
    # Queries equal to keys, so each token attends to itself with a
    # margin far above float16's rounding of the logits.
    kernel[:, dim:2 * dim] = kernel[:, :dim] = 500 * kernel[:, :dim]
    qkv.assign(kernel)
    images = _images((2, 32, 32, 3), seed=8) / IMAGE_STD
    assert _first_block_logits(model, images) > 65504
    expected = model(images).numpy()
    weights = model.get_weights()
    tf_keras.mixed_precision.set_global_policy(policy)
    try:
        mixed = vit.build_vit('vit_tiny', patch_size=8, image_size=32,
                              depth=2)
    finally:
        tf_keras.mixed_precision.set_global_policy('float32')
    mixed.set_weights(weights)
    features = mixed(images)
    assert features.dtype == policy.split('_')[1]
    features = features.numpy().astype(np.float32)
    assert np.isfinite(features).all()
    assert _relative_error(features, expected) < tolerance


def test_build_backbone_builds_the_vits_by_name(clean_gin):
    """`build_backbone` names the ViTs beside the ResNets, with their own
    arguments: gin binds them as `vit.*`, and a ResNet's given in Python
    is refused naming the ViT's.

    Fails if `build_backbone` passes batch-norm arguments to the ViT, or
    the bound patch size is not the ViT's downsampling."""
    model = backbones.build_backbone(
        'vit_small', input_channels=1, sync_bn=True, patch_size=8,
        image_size=16, depth=1)
    assert model.output_dim == 384
    assert model(tf.zeros([2, 24, 24, 1])).shape == (2, 384)
    gin.bind_parameter('vit.patch_size', 8)
    assert backbones.FAMILIES['vit_small'].downsampling('vit_small') == 8
    with pytest.raises(checks.ConfigError, match=(
            r"^build_backbone.stage_strides \(an argument of "
            r"'small_resnet'\), build_backbone.widths \(an argument of "
            r"'small_resnet'\) are not "
            r"arguments of backbone 'vit_tiny'\. Its arguments: "
            r"\['patch_size', 'image_size', 'depth', "
            r"'position_interpolation', 'layer_scale', 'registers'\]\.$")):
        backbones.check_arguments('vit_tiny', ['widths', 'stage_strides'])


def test_the_paws_model_builds_around_a_vit(clean_gin):
    """`building.build_model` builds every layer of a PAWS model whose ViT
    takes 16-px patches, with the parameters counted by hand.

    Fails if the model is built on images whose side is not a multiple of
    the patch size (8 px: `patch_embed` raises ValueError)."""
    gin.bind_parameter('build_backbone.name', 'vit_tiny')
    for name, value in (('patch_size', 16), ('image_size', 32), ('depth', 1)):
        gin.bind_parameter(f'vit.{name}', value)
    model = building.build_model(tf.distribute.get_strategy(),
                                 input_channels=3)
    assert model.built and model.prediction_head.built
    d, c, p, grid = 192, 3, 16, (32 // 16) ** 2
    block = (2 * d + (d * 3 * d + 3 * d) + (d * d + d) + 2 * d +
             (d * 4 * d + 4 * d) + (4 * d * d + d))
    expected = (p * p * c * d + d) + (d + (1 + grid) * d) + block + 2 * d
    assert sum(int(np.prod(v.shape))
               for v in model.backbone.trainable_variables) == expected
