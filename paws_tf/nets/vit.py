"""Vision Transformer feature extractors: images [B, H, W, C] -> the class
token's features [B, D]."""

import gin
import tensorflow as tf
import tf_keras

from paws_tf import bindings
from paws_tf import checks
from paws_tf import nets
from paws_tf.nets import layer_scale as layer_scale_module
from paws_tf.nets import vit_positions

# (width D, depth, heads) of timm's, DeiT's, DINO's, MSN's and DINOv2's
# ViT-Ti, -S, -B and -L.
ARCHITECTURES = {
    'vit_tiny': (192, 12, 3),
    'vit_small': (384, 12, 6),
    'vit_base': (768, 12, 12),
    'vit_large': (1024, 24, 16),
}
MLP_RATIO = 4
LAYER_NORM_EPSILON = 1e-6
# timm's `trunc_normal_(std=.02)` cuts at +-2 absolute, i.e. 100 standard
# deviations: a plain normal draws the same (tf_keras' TruncatedNormal
# cuts at 2 standard deviations, which shrinks the spread to 0.88 of it).
WEIGHT_STD = 0.02
CLASS_TOKEN_STD = 1e-6


def _weight_init():
    # A fresh instance per variable: an unseeded one repeats its values.
    return tf_keras.initializers.RandomNormal(stddev=WEIGHT_STD)


def _dense(units, name, activation=None):
    """timm's `nn.Linear` of a ViT: N(0, 0.02) kernel, zero bias."""
    return tf_keras.layers.Dense(units, activation=activation, name=name,
                                 kernel_initializer=_weight_init())


def _layer_norm(name):
    return tf_keras.layers.LayerNormalization(epsilon=LAYER_NORM_EPSILON,
                                              name=name)


def scaled_dot_product_attention(queries, keys, values,
                                 logits_dtype=tf.float32):
    """softmax(q k^T / sqrt(d)) v, the logits and softmax in `logits_dtype`.

    Under mixed precision, float16 logits overflow to inf past 65504 (a
    softmax over them gives NaN) and bfloat16 ones keep 8 bits: the
    logits and the softmax are computed in float32 and the attention
    weights cast back to the dtype of `values`. `logits_dtype` is there to
    show what breaks without it.

    Args:
        queries, keys, values: [B, heads, N, d] of one float dtype.
        logits_dtype: dtype of the logits and the softmax.

    Returns:
        [B, heads, N, d] in the dtype of `values`.
    """
    scale = queries.shape[-1] ** -0.5
    logits = tf.matmul(tf.cast(queries, logits_dtype) * scale,
                       tf.cast(keys, logits_dtype),
                       transpose_b=True)  # [B, heads, N, N]
    weights = tf.nn.softmax(logits, axis=-1)
    return tf.matmul(tf.cast(weights, values.dtype), values)


@tf_keras.saving.register_keras_serializable(package='paws_tf')
class PatchEmbedding(tf_keras.layers.Layer):
    """Non-overlapping p x p patches projected to D by a stride-p
    convolution `proj` (timm `PatchEmbed`): [B, H, W, C] -> [B, H/p, W/p, D].

    The convolution keeps PyTorch's default `nn.Conv2d` initialisation,
    which timm's and DINO's ViT initialisation leaves untouched: kernel and
    bias U(+-1/sqrt(fan_in)) (`nets.torch_default_init`).

    Raises:
        InvalidArgumentError (ValueError for static sizes): H or W is not
            a multiple of p.
    """

    def __init__(self, dim, patch_size, **kwargs):
        super().__init__(**kwargs)
        self.dim = dim
        self.patch_size = patch_size
        self.proj = None

    def build(self, input_shape):
        self.proj = tf_keras.layers.Conv2D(
            self.dim, self.patch_size, strides=self.patch_size,
            padding='valid', name='proj', **nets.torch_default_init(
                self.patch_size * self.patch_size * int(input_shape[-1])))
        nets.build_in_scope(self.proj, input_shape)
        super().build(input_shape)

    def call(self, images):
        p = self.patch_size
        for axis, side in ((1, 'height'), (2, 'width')):
            size = images.shape[axis]
            if size is not None and size % p:
                raise ValueError(f'Image {side} {size} is not a multiple of '
                                 f'the patch size {p}.')
            if size is None:
                tf.debugging.assert_equal(
                    tf.shape(images)[axis] % p, 0,
                    message=f'Image {side} is not a multiple of the patch '
                            f'size {p}.')
        return self.proj(images)  # [B, H/p, W/p, D]

    def get_config(self):
        return {**super().get_config(), 'dim': self.dim,
                'patch_size': self.patch_size}


@tf_keras.saving.register_keras_serializable(package='paws_tf')
class ClassTokenAndPositions(tf_keras.layers.Layer):
    """Prepends the class token to the patch tokens and adds the learned
    position embeddings, the class token's included (timm `_pos_embed` with
    `no_embed_class=False`, as DeiT and DINO).

    The embeddings `pos_embed` [1, 1 + g*g, D] belong to the g x g grid of
    the size the network is built for; another grid gets the patches'
    embeddings resampled as the source of the weights does
    (`vit_positions.resample_positions` with `interpolation`: 'timm' as
    timm with `dynamic_img_size=True`, 'dino' or 'msn'), the class
    token's kept. Variables are read in
    float32 and resampled in float32 (as timm does) under any mixed
    precision policy, then cast to the compute dtype.

    `registers` > 0 register tokens `register_tokens` [1, R, D] go between
    the class token and the patches after the positions are added, without
    a position of their own (dinov2 vision_transformer.py
    `prepare_tokens_with_masks`).
    """

    def __init__(self, grid_size, interpolation=vit_positions.TIMM,
                 registers=0, **kwargs):
        super().__init__(**kwargs)
        self.grid_size = grid_size
        self.interpolation = interpolation
        self.registers = registers
        self.cls_token = None
        self.pos_embed = None
        self.register_tokens = None

    def build(self, input_shape):
        dim = int(input_shape[-1])
        self.cls_token = self.add_weight(
            'cls_token', shape=[1, 1, dim], autocast=False,
            initializer=tf_keras.initializers.RandomNormal(
                stddev=CLASS_TOKEN_STD))
        self.pos_embed = self.add_weight(
            'pos_embed', shape=[1, 1 + self.grid_size ** 2, dim],
            initializer=_weight_init(), autocast=False)
        if self.registers:
            # dinov2 `init_weights`: normal_(register_tokens, std=1e-6).
            self.register_tokens = self.add_weight(
                'register_tokens', shape=[1, self.registers, dim],
                autocast=False, initializer=tf_keras.initializers.RandomNormal(
                    stddev=CLASS_TOKEN_STD))
        super().build(input_shape)

    def call(self, patches):
        shape = tf.shape(patches)
        batch, height, width = shape[0], shape[1], shape[2]
        dim = self.pos_embed.shape[-1]
        grid = tf.reshape(self.pos_embed[0, 1:],
                          [self.grid_size, self.grid_size, dim])
        grid = vit_positions.resample_positions(grid, (height, width),
                                                self.interpolation)
        positions = tf.concat(
            [self.pos_embed[0, :1], tf.reshape(grid, [-1, dim])], axis=0)
        dtype = patches.dtype  # The compute dtype.
        tokens = tf.reshape(patches, [batch, -1, dim])
        cls_tokens = tf.broadcast_to(tf.cast(self.cls_token, dtype),
                                     [batch, 1, dim])
        tokens = tf.concat([cls_tokens, tokens], axis=1)  # [B, 1 + h*w, D]
        tokens += tf.cast(positions, dtype)
        if not self.registers:
            return tokens
        registers = tf.broadcast_to(tf.cast(self.register_tokens, dtype),
                                    [batch, self.registers, dim])
        return tf.concat([tokens[:, :1], registers, tokens[:, 1:]],
                         axis=1)  # [B, 1 + R + h*w, D]

    def get_config(self):
        return {**super().get_config(), 'grid_size': self.grid_size,
                'interpolation': self.interpolation,
                'registers': self.registers}


@tf_keras.saving.register_keras_serializable(package='paws_tf')
class SelfAttention(tf_keras.layers.Layer):
    """Multi-head self-attention with one `qkv` projection and an output
    projection `proj` (timm `Attention`): [B, N, D] -> [B, N, D]."""

    def __init__(self, num_heads, **kwargs):
        super().__init__(**kwargs)
        self.num_heads = num_heads
        self.qkv = None
        self.proj = None

    def build(self, input_shape):
        dim = int(input_shape[-1])
        if dim % self.num_heads:
            raise ValueError(f'Width {dim} is not a multiple of '
                             f'{self.num_heads} heads.')
        self.qkv = _dense(3 * dim, 'qkv')
        self.proj = _dense(dim, 'proj')
        nets.build_in_scope(self.qkv, input_shape)
        nets.build_in_scope(self.proj, input_shape)
        super().build(input_shape)

    def call(self, x):
        shape = tf.shape(x)
        batch, length, dim = shape[0], shape[1], x.shape[-1]
        heads = self.num_heads
        qkv = tf.reshape(self.qkv(x), [batch, length, 3, heads, dim // heads])
        qkv = tf.transpose(qkv, [2, 0, 3, 1, 4])  # [3, B, heads, N, d]
        queries, keys, values = tf.unstack(qkv)
        x = scaled_dot_product_attention(queries, keys, values)
        x = tf.reshape(tf.transpose(x, [0, 2, 1, 3]), [batch, length, dim])
        return self.proj(x)

    def get_config(self):
        return {**super().get_config(), 'num_heads': self.num_heads}


@tf_keras.saving.register_keras_serializable(package='paws_tf')
class Block(tf_keras.layers.Layer):
    """Pre-norm transformer block (timm `Block`): x + attn(norm1(x)), then
    x + mlp(norm2(x)); the MLP is fc1 (D -> 4D), exact (erf) GELU, fc2.
    With `layer_scale`, each branch is scaled by its LayerScale, `ls1` and
    `ls2` (dinov2 layers/block.py `Block`)."""

    def __init__(self, num_heads, layer_scale=False, **kwargs):
        super().__init__(**kwargs)
        self.num_heads = num_heads
        self.layer_scale = layer_scale
        self.norm1 = _layer_norm('norm1')
        self.attn = SelfAttention(num_heads, name='attn')
        self.norm2 = _layer_norm('norm2')
        self.ls1 = self.ls2 = None
        if layer_scale:
            self.ls1 = layer_scale_module.LayerScale(name='ls1')
            self.ls2 = layer_scale_module.LayerScale(name='ls2')
        self.fc1 = None
        self.fc2 = None

    def build(self, input_shape):
        dim = int(input_shape[-1])
        # tf_keras' 'gelu' is the exact one, as PyTorch's nn.GELU().
        self.fc1 = _dense(MLP_RATIO * dim, 'fc1', activation='gelu')
        self.fc2 = _dense(dim, 'fc2')
        for layer in (self.norm1, self.attn, self.norm2, self.ls1,
                      self.ls2):
            if layer is not None:
                nets.build_in_scope(layer, input_shape)
        hidden_shape = tf.TensorShape(input_shape)[:-1] + [MLP_RATIO * dim]
        with tf.name_scope('mlp'):  # timm's names: mlp.fc1, mlp.fc2.
            nets.build_in_scope(self.fc1, input_shape)
            nets.build_in_scope(self.fc2, hidden_shape)
        super().build(input_shape)

    def call(self, x):
        attended = self.attn(self.norm1(x))
        if self.layer_scale:
            attended = self.ls1(attended)
        x = x + attended
        transformed = self.fc2(self.fc1(self.norm2(x)))
        if self.layer_scale:
            transformed = self.ls2(transformed)
        return x + transformed

    def get_config(self):
        return {**super().get_config(), 'num_heads': self.num_heads,
                'layer_scale': self.layer_scale}


@gin.configurable('vit', denylist=['name', 'input_channels'])
def build_vit(name, *, patch_size=16, image_size=224, input_channels=3,
              depth=None, position_interpolation=vit_positions.TIMM,
              layer_scale=False, registers=0):
    """Builds a ViT in the layout of timm's `VisionTransformer`, DeiT,
    DINO and DINOv2: patch embedding, class token, learned position
    embeddings (the class token's too), register tokens (DINOv2's), pre-norm
    blocks (with DINOv2's LayerScale), final LayerNorm (epsilon 1e-6), the
    class token's output as the features.

    Images of any size whose sides are multiples of `patch_size` go
    through: PAWS's local views (96 px beside 224-px global views) get the
    position embeddings resampled as timm does (`ClassTokenAndPositions`),
    or as DINO, MSN or DINOv2 do for the weights imported from them.
    Weights are initialised as timm's default (`WEIGHT_STD`,
    `CLASS_TOKEN_STD`, each layer's docstring).

    gin binds its arguments as `vit.patch_size`, ..., for every ViT name.

    Args:
        name: a ViT of `ARCHITECTURES` ('vit_tiny', 'vit_small',
            'vit_base', 'vit_large').
        patch_size: side p of the square patches.
        image_size: side of the square images the position embeddings are
            learned for, a multiple of `patch_size`.
        input_channels: C of the [B, H, W, C] input images.
        depth: number of blocks, or None for the architecture's.
        position_interpolation: how another grid's position embeddings
            are resampled, one of `vit_positions.INTERPOLATIONS`: 'timm',
            or 'dino' and 'msn' as their `interpolate_pos_encoding`.
        layer_scale: each block's branches scaled by a LayerScale, as
            DINOv2's blocks.
        registers: number of register tokens, as DINOv2's `_reg` ViTs.

    Returns:
        A `tf_keras.Model` mapping [B, H, W, C] float images (H and W
        multiples of p) to [B, D] features (in the compute dtype of the
        global mixed-precision policy), with the int attributes
        `output_dim` = D and `side_multiple` = p.

    Raises:
        ValueError: unknown `name`, or a bad size.
    """
    dim, depth, num_heads, patch_size, image_size = _checked_architecture(
        name, depth, patch_size, image_size, input_channels, registers,
        position_interpolation)
    inputs = tf_keras.Input(shape=(None, None, input_channels), name='images')
    x = PatchEmbedding(dim, patch_size, name='patch_embed')(inputs)
    x = ClassTokenAndPositions(image_size // patch_size,
                               position_interpolation, registers,
                               name='tokens')(x)
    for index in range(depth):
        x = Block(num_heads, bool(layer_scale),
                  name=f'blocks_{index}')(x)  # [B, 1 + R + h*w, D]
    # LayerNorm is per token: normalising the class token alone gives
    # timm's features, norm(x)[:, 0].
    features = _layer_norm('norm')(x[:, 0])  # [B, D]
    model = tf_keras.Model(inputs, features, name=name)
    model.output_dim = dim
    model.side_multiple = patch_size
    return model


def _checked_architecture(name, depth, patch_size, image_size,
                          input_channels, registers, position_interpolation):
    """`(width, depth, heads, patch_size, image_size)` of `build_vit`'s
    arguments, checked; `depth` None is the architecture's."""
    checks.one_of('ViT name', name, sorted(ARCHITECTURES))
    dim, default_depth, num_heads = ARCHITECTURES[name]
    depth = checks.integer('depth', default_depth if depth is None else depth)
    patch_size = checks.integer('patch_size', patch_size)
    image_size = checks.integer('image_size', image_size)
    checks.integer('input_channels', input_channels)
    checks.integer('vit.registers', registers, minimum=0)
    checks.one_of('vit.position_interpolation', position_interpolation,
                  vit_positions.INTERPOLATIONS)
    if image_size % patch_size:
        raise ValueError(f'image_size {image_size} is not a multiple of '
                         f'patch_size {patch_size}.')
    return dim, depth, num_heads, patch_size, image_size


def _build(name, *, input_channels, batch_norm, **arguments):
    """`build_vit` as `backbones.build_backbone` calls a family: a ViT has
    no batch norm (`batch_norm` does not apply)."""
    del batch_norm
    return build_vit(name, input_channels=input_channels, **arguments)


def _patch_size():
    """`(value, binding)` of the patch side the config binds."""
    return bindings.arguments(build_vit)['patch_size']


FAMILY = nets.Family(
    names=tuple(ARCHITECTURES), configurable=build_vit, build=_build,
    downsampling=lambda name: _patch_size()[0], patch_size=_patch_size,
    batch_norm=False)
