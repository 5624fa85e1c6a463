"""DINOv2's `DinoVisionTransformer` in PyTorch, written for the tests from
its official source, with its parameter names: facebookresearch/dinov2 at
b8931f7bf91576930313be2c6d6af376033b35f0,

- dinov2/layers/layer_scale.py `LayerScale` (lines 15-34);
- dinov2/layers/attention.py `Attention` (36-79: qkv and proj with bias,
  `F.scaled_dot_product_attention`), which `MemEffAttention` (82-...) is
  without xFormers;
- dinov2/layers/block.py `Block` (43-114: ls1 and ls2 on the two
  residual branches, the evaluation branch of `forward`);
- dinov2/layers/patch_embed.py `PatchEmbed` (25-81, `norm_layer` None);
- dinov2/layers/mlp.py `Mlp` (16-40: fc1, GELU, fc2, timm's);
- dinov2/models/vision_transformer.py `DinoVisionTransformer` (45-330:
  `cls_token`, `pos_embed`, `register_tokens`, `mask_token` (line 169),
  `interpolate_pos_encoding` (180-212), `prepare_tokens_with_masks`
  (214-233), `forward_features`'s `x_norm_clstoken` (255-271),
  `forward` (325-330));
- dinov2/hub/backbones.py `_make_dinov2_model` (18-61: img_size 518,
  patch 14, init_values 1.0, ffn_layer 'mlp', block_chunks 0) and the
  `_reg` models (98-140: 4 registers, interpolate_antialias True,
  interpolate_offset 0.0; the others keep False and 0.1).

Left out, as they are the identity at evaluation or unused by the
features: dropout, drop path, the masked forward, the list (nested
tensor) forwards, block chunking (`block_chunks=0` in the hub), SwiGLU
(ViT-g/14 only), the weight initialisation (the tests draw every
parameter).
"""

import math
from functools import partial

import torch
from torch import nn

from tests.helpers import timm_vit

# hub/backbones.py `_make_dinov2_model` defaults and the `_reg` models.
IMG_SIZE, PATCH_SIZE, INIT_VALUES = 518, 14, 1.0
REGISTERS = 4

# dinov2 layers/mlp.py `Mlp` is timm's (fc1, GELU, fc2).
Mlp = timm_vit.Mlp


class LayerScale(nn.Module):
    def __init__(self, dim, init_values=1e-5):
        super().__init__()
        self.gamma = nn.Parameter(init_values * torch.ones(dim))

    def forward(self, x):
        return x * self.gamma


class Attention(nn.Module):
    def __init__(self, dim, num_heads=8, qkv_bias=False, proj_bias=True):
        super().__init__()
        self.num_heads = num_heads
        self.qkv = nn.Linear(dim, dim * 3, bias=qkv_bias)
        self.proj = nn.Linear(dim, dim, bias=proj_bias)

    def forward(self, x):
        B, N, C = x.shape
        qkv = self.qkv(x).reshape(B, N, 3, self.num_heads,
                                  C // self.num_heads)
        q, k, v = torch.unbind(qkv, 2)
        q, k, v = [t.transpose(1, 2) for t in [q, k, v]]
        x = nn.functional.scaled_dot_product_attention(q, k, v)
        x = x.transpose(1, 2).contiguous().view(B, N, C)
        return self.proj(x)


class Block(nn.Module):
    def __init__(self, dim, num_heads, mlp_ratio=4.0, qkv_bias=False,
                 init_values=None, norm_layer=nn.LayerNorm):
        super().__init__()
        self.norm1 = norm_layer(dim)
        self.attn = Attention(dim, num_heads=num_heads, qkv_bias=qkv_bias)
        self.ls1 = (LayerScale(dim, init_values=init_values) if init_values
                    else nn.Identity())
        self.norm2 = norm_layer(dim)
        self.mlp = Mlp(dim, int(dim * mlp_ratio))
        self.ls2 = (LayerScale(dim, init_values=init_values) if init_values
                    else nn.Identity())

    def forward(self, x):
        x = x + self.ls1(self.attn(self.norm1(x)))
        x = x + self.ls2(self.mlp(self.norm2(x)))
        return x


class PatchEmbed(nn.Module):
    def __init__(self, img_size=224, patch_size=16, in_chans=3,
                 embed_dim=768):
        super().__init__()
        self.patch_size = (patch_size, patch_size)
        self.num_patches = (img_size // patch_size) ** 2
        self.proj = nn.Conv2d(in_chans, embed_dim, kernel_size=patch_size,
                              stride=patch_size)

    def forward(self, x):
        _, _, H, W = x.shape
        assert H % self.patch_size[0] == 0 and W % self.patch_size[1] == 0
        return self.proj(x).flatten(2).transpose(1, 2)  # B HW C


class DinoVisionTransformer(nn.Module):
    """`forward` gives `x_norm_clstoken` [B, D] of NCHW images."""

    def __init__(self, img_size=224, patch_size=16, in_chans=3,
                 embed_dim=768, depth=12, num_heads=12, mlp_ratio=4.0,
                 qkv_bias=True, init_values=None, num_register_tokens=0,
                 interpolate_antialias=False, interpolate_offset=0.1):
        super().__init__()
        norm_layer = partial(nn.LayerNorm, eps=1e-6)
        self.num_features = self.embed_dim = embed_dim
        self.num_tokens = 1
        self.patch_size = patch_size
        self.num_register_tokens = num_register_tokens
        self.interpolate_antialias = interpolate_antialias
        self.interpolate_offset = interpolate_offset
        self.patch_embed = PatchEmbed(img_size=img_size,
                                      patch_size=patch_size,
                                      in_chans=in_chans, embed_dim=embed_dim)
        num_patches = self.patch_embed.num_patches
        self.cls_token = nn.Parameter(torch.zeros(1, 1, embed_dim))
        self.pos_embed = nn.Parameter(
            torch.zeros(1, num_patches + self.num_tokens, embed_dim))
        self.register_tokens = (
            nn.Parameter(torch.zeros(1, num_register_tokens, embed_dim))
            if num_register_tokens else None)
        self.blocks = nn.ModuleList([
            Block(dim=embed_dim, num_heads=num_heads, mlp_ratio=mlp_ratio,
                  qkv_bias=qkv_bias, norm_layer=norm_layer,
                  init_values=init_values)
            for _ in range(depth)])
        self.norm = norm_layer(embed_dim)
        self.head = nn.Identity()
        self.mask_token = nn.Parameter(torch.zeros(1, embed_dim))

    def interpolate_pos_encoding(self, x, w, h):
        previous_dtype = x.dtype
        npatch = x.shape[1] - 1
        N = self.pos_embed.shape[1] - 1
        if npatch == N and w == h:
            return self.pos_embed
        pos_embed = self.pos_embed.float()
        class_pos_embed = pos_embed[:, 0]
        patch_pos_embed = pos_embed[:, 1:]
        dim = x.shape[-1]
        w0 = w // self.patch_size
        h0 = h // self.patch_size
        M = int(math.sqrt(N))
        assert N == M * M
        kwargs = {}
        if self.interpolate_offset:
            sx = float(w0 + self.interpolate_offset) / M
            sy = float(h0 + self.interpolate_offset) / M
            kwargs["scale_factor"] = (sx, sy)
        else:
            kwargs["size"] = (w0, h0)
        patch_pos_embed = nn.functional.interpolate(
            patch_pos_embed.reshape(1, M, M, dim).permute(0, 3, 1, 2),
            mode="bicubic",
            antialias=self.interpolate_antialias,
            **kwargs,
        )
        assert (w0, h0) == patch_pos_embed.shape[-2:]
        patch_pos_embed = patch_pos_embed.permute(0, 2, 3, 1).view(1, -1, dim)
        return torch.cat((class_pos_embed.unsqueeze(0), patch_pos_embed),
                         dim=1).to(previous_dtype)

    def prepare_tokens_with_masks(self, x):
        B, nc, w, h = x.shape
        x = self.patch_embed(x)
        x = torch.cat((self.cls_token.expand(x.shape[0], -1, -1), x), dim=1)
        x = x + self.interpolate_pos_encoding(x, w, h)
        if self.register_tokens is not None:
            x = torch.cat((x[:, :1],
                           self.register_tokens.expand(x.shape[0], -1, -1),
                           x[:, 1:]), dim=1)
        return x

    def forward(self, x):
        x = self.prepare_tokens_with_masks(x)
        for blk in self.blocks:
            x = blk(x)
        x_norm = self.norm(x)
        return self.head(x_norm[:, 0])  # x_norm_clstoken


def build(embed_dim, depth, num_heads, registers=0, img_size=IMG_SIZE):
    """The hub's `dinov2_vit{s,b,l}14` (`registers` 0) or
    `dinov2_vit{s,b,l}14_reg` (`registers` 4): vision_transformer.py's
    `vit_small`/`vit_base`/`vit_large` (mlp_ratio 4, qkv bias) with the
    hub's patch 14, init_values 1.0 and interpolation settings."""
    return DinoVisionTransformer(
        img_size=img_size, patch_size=PATCH_SIZE, embed_dim=embed_dim,
        depth=depth, num_heads=num_heads, mlp_ratio=4,
        init_values=INIT_VALUES, num_register_tokens=registers,
        interpolate_antialias=bool(registers),
        interpolate_offset=0.0 if registers else 0.1).eval()


def file_name(name, registers):
    """The hub's file name (hub/utils.py `_make_dinov2_model_name`):
    'vit_small' -> dinov2_vits14_pretrain.pth, with registers
    dinov2_vits14_reg4_pretrain.pth."""
    compact = name.replace('_', '')[:4]
    suffix = f'_reg{registers}' if registers else ''
    return f'dinov2_{compact}{PATCH_SIZE}{suffix}_pretrain.pth'
