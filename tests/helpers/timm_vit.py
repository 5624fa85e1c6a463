"""timm's `VisionTransformer` in PyTorch, written for the tests from the
source of huggingface/pytorch-image-models at
aa4b5850c1543fa488abf260f18390eda46cf85d (timm 1.0.29.dev0):
`timm/models/vision_transformer.py` (`VisionTransformer` with
`global_pool='token'`, `num_classes=0`, `dynamic_img_size=True`; `Block`;
`init_weights_vit_timm`), `timm/layers/attention.py` (`Attention`),
`timm/layers/mlp.py` (`Mlp`), `timm/layers/patch_embed.py` (`PatchEmbed`
with `strict_img_size=False`, `output_fmt='NHWC'`), `timm/layers/norm.py`
(`LayerNorm`: `nn.LayerNorm` with epsilon 1e-6 when its fast-norm option
is off, the default) and `timm/layers/pos_embed.py`
(`resample_abs_pos_embed`), with timm's parameter names; and the copy of
its weights into `paws_tf.nets.vit` by name.

Left out, as inactive at timm's defaults or unused by the ViT-Ti/S/B
layout: dropout (head, position, attention, projection), patch dropout,
drop path, layer scale, register tokens, `no_embed_class`, `pre_norm`,
`fc_norm` and the pooling types other than the class token, qk-norm, the
gated attention, attention masks, dynamic padding, gradient checkpointing,
the classifier head and the other weight-initialisation modes.
"""

import math
import re

import numpy as np
import torch
from torch import nn
import torch.nn.functional as F


def resample_abs_pos_embed(posemb, new_size, old_size, num_prefix_tokens=1,
                           interpolation='bicubic', antialias=True):
    """`timm.layers.pos_embed.resample_abs_pos_embed`."""
    num_pos_tokens = posemb.shape[1]
    num_new_tokens = new_size[0] * new_size[1] + num_prefix_tokens
    if num_new_tokens == num_pos_tokens and new_size[0] == new_size[1]:
        return posemb
    posemb_prefix, posemb = (posemb[:, :num_prefix_tokens],
                             posemb[:, num_prefix_tokens:])
    embed_dim = posemb.shape[-1]
    orig_dtype = posemb.dtype
    posemb = posemb.float()
    posemb = posemb.reshape(1, old_size[0], old_size[1], -1).permute(
        0, 3, 1, 2)
    posemb = F.interpolate(posemb, size=new_size, mode=interpolation,
                           antialias=antialias)
    posemb = posemb.permute(0, 2, 3, 1).reshape(1, -1, embed_dim)
    posemb = posemb.to(orig_dtype)
    return torch.cat([posemb_prefix, posemb], dim=1)


class PatchEmbed(nn.Module):
    """Stride-p convolution; NHWC output, any size divisible by p."""

    def __init__(self, img_size, patch_size, in_chans, embed_dim):
        super().__init__()
        self.patch_size = (patch_size, patch_size)
        self.grid_size = (img_size // patch_size, img_size // patch_size)
        self.num_patches = self.grid_size[0] * self.grid_size[1]
        self.proj = nn.Conv2d(in_chans, embed_dim, kernel_size=patch_size,
                              stride=patch_size, bias=True)

    def forward(self, x):
        _, _, H, W = x.shape
        assert H % self.patch_size[0] == 0 and W % self.patch_size[1] == 0
        x = self.proj(x)
        return x.permute(0, 2, 3, 1)  # NCHW -> NHWC


class Attention(nn.Module):
    """Multi-head self-attention; `fused_attn` as timm's default."""

    def __init__(self, dim, num_heads, qkv_bias=True):
        super().__init__()
        self.num_heads = num_heads
        self.head_dim = dim // num_heads
        self.attn_dim = num_heads * self.head_dim
        self.scale = self.head_dim ** -0.5
        self.fused_attn = True
        self.qkv = nn.Linear(dim, self.attn_dim * 3, bias=qkv_bias)
        self.proj = nn.Linear(self.attn_dim, dim, bias=True)

    def forward(self, x):
        B, N, C = x.shape
        qkv = self.qkv(x).reshape(B, N, 3, self.num_heads,
                                  self.head_dim).permute(2, 0, 3, 1, 4)
        q, k, v = qkv.unbind(0)
        if self.fused_attn:
            x = F.scaled_dot_product_attention(q, k, v)
        else:
            q = q * self.scale
            attn = q @ k.transpose(-2, -1)
            attn = attn.softmax(dim=-1)
            x = attn @ v
        x = x.transpose(1, 2).reshape(B, N, self.attn_dim)
        return self.proj(x)


class Mlp(nn.Module):
    def __init__(self, in_features, hidden_features):
        super().__init__()
        self.fc1 = nn.Linear(in_features, hidden_features)
        self.act = nn.GELU()
        self.fc2 = nn.Linear(hidden_features, in_features)

    def forward(self, x):
        return self.fc2(self.act(self.fc1(x)))


class Block(nn.Module):
    """Transformer block with pre-normalization."""

    def __init__(self, dim, num_heads, mlp_ratio=4.):
        super().__init__()
        self.norm1 = nn.LayerNorm(dim, eps=1e-6)
        self.attn = Attention(dim, num_heads)
        self.norm2 = nn.LayerNorm(dim, eps=1e-6)
        self.mlp = Mlp(dim, int(dim * mlp_ratio))

    def forward(self, x):
        x = x + self.attn(self.norm1(x))
        x = x + self.mlp(self.norm2(x))
        return x


class VisionTransformer(nn.Module):
    """`forward` gives the class token's features [B, D] of NCHW images."""

    def __init__(self, img_size=224, patch_size=16, in_chans=3,
                 embed_dim=768, depth=12, num_heads=12, mlp_ratio=4.):
        super().__init__()
        self.num_prefix_tokens = 1
        self.patch_embed = PatchEmbed(img_size, patch_size, in_chans,
                                      embed_dim)
        num_patches = self.patch_embed.num_patches
        self.cls_token = nn.Parameter(torch.empty(1, 1, embed_dim))
        self.pos_embed = nn.Parameter(
            torch.empty(1, num_patches + self.num_prefix_tokens, embed_dim))
        self.blocks = nn.Sequential(*[
            Block(embed_dim, num_heads, mlp_ratio) for _ in range(depth)])
        self.norm = nn.LayerNorm(embed_dim, eps=1e-6)
        self.init_weights()

    def init_weights(self):
        """`init_weights` with mode '' (`init_weights_vit_timm`): the
        convolution and the norms keep PyTorch's initialisation."""
        nn.init.trunc_normal_(self.pos_embed, std=.02, a=-2., b=2.)
        nn.init.normal_(self.cls_token, std=1e-6)
        for module in self.modules():
            if isinstance(module, nn.Linear):
                nn.init.trunc_normal_(module.weight, std=.02, a=-2., b=2.)
                if module.bias is not None:
                    nn.init.zeros_(module.bias)

    def _pos_embed(self, x):
        B, H, W, C = x.shape
        pos_embed = resample_abs_pos_embed(
            self.pos_embed, new_size=(H, W),
            old_size=self.patch_embed.grid_size,
            num_prefix_tokens=self.num_prefix_tokens)
        x = x.view(B, -1, C)
        x = torch.cat([self.cls_token.expand(x.shape[0], -1, -1), x], dim=1)
        return x + pos_embed

    def forward_features(self, x):
        x = self.patch_embed(x)
        x = self._pos_embed(x)
        x = self.blocks(x)
        return self.norm(x)

    def forward(self, x):
        return self.forward_features(x)[:, 0]  # global_pool='token'


def randomize(model, seed, linear_gain=2.0, norm_std=0.1, std=0.02):
    """Draws every parameter anew so that none is 0 or 1 (biases, norms,
    the class token): linear weights N(0, linear_gain^2 / fan_in), so that
    the GELU inputs spread over +-2 * linear_gain, where its tanh
    approximation departs from it; LayerNorm weights and LayerScale
    gammas 1 + N(0, norm_std);
    the patch convolution's weight U(+-1/sqrt(fan_in)) (its PyTorch
    initialisation); everything else N(0, std)."""
    generator = torch.Generator().manual_seed(seed)
    linear_weights = {f'{name}.weight' for name, module
                      in model.named_modules()
                      if isinstance(module, nn.Linear)}
    with torch.no_grad():
        for name, parameter in model.named_parameters():
            noise = torch.randn(parameter.shape, generator=generator)
            fan_in = parameter[0].numel()
            if name == 'patch_embed.proj.weight':
                uniform = torch.rand(parameter.shape, generator=generator)
                parameter.copy_((2 * uniform - 1) / math.sqrt(fan_in))
            elif name in linear_weights:
                parameter.copy_(linear_gain / math.sqrt(fan_in) * noise)
            elif re.search(r'norm\d?\.weight$|\.gamma$', name):
                parameter.copy_(1 + norm_std * noise)
            else:
                parameter.copy_(std * noise)
    return model


def keras_name(timm_name, is_norm):
    """The `paws_tf.nets.vit` variable name (without `:0`) of timm
    parameter `timm_name` (`blocks.0.attn.qkv.weight` ->
    `blocks_0/attn/qkv/kernel`)."""
    if timm_name in ('cls_token', 'pos_embed'):
        return 'tokens/' + timm_name
    path, kind = timm_name.rsplit('.', 1)
    path = re.sub(r'^blocks\.(\d+)', r'blocks_\1', path).replace('.', '/')
    kinds = ({'weight': 'gamma', 'bias': 'beta'} if is_norm
             else {'weight': 'kernel', 'bias': 'bias'})
    return f'{path}/{kinds[kind]}'


def as_keras_arrays(torch_model, tensors):
    """`tensors` (timm parameter name -> tensor of a parameter's shape, the
    parameters or their gradients) as {variable name without `:0`: array}
    of `paws_tf.nets.vit`: linear weights [out, in] become kernels
    [in, out], the patch convolution's [D, C, p, p] a kernel [p, p, C, D].
    """
    norms = {name for name, module in torch_model.named_modules()
             if isinstance(module, nn.LayerNorm)}
    arrays = {}
    for name, tensor in tensors.items():
        array = tensor.detach().numpy()
        if name == 'patch_embed.proj.weight':
            array = array.transpose(2, 3, 1, 0)
        elif array.ndim == 2:
            array = array.T
        arrays[keras_name(name, name.rsplit('.', 1)[0] in norms)] = array
    return arrays


def copy_to_keras(torch_model, keras_model):
    """Assigns the parameters of timm-named `torch_model` to the variables
    of `keras_model` (a `paws_tf.nets.vit.build_vit` model) by name:
    every variable receives exactly one parameter and every parameter is
    used."""
    values = as_keras_arrays(torch_model, torch_model.state_dict())
    variables = {v.name.rsplit(':', 1)[0]: v for v in keras_model.weights}
    assert sorted(variables) == sorted(values), (
        sorted(set(variables) ^ set(values)))
    for name, variable in variables.items():
        variable.assign(values[name].astype(np.float32))
