"""The official PAWS networks in PyTorch, written for the tests from the
definitions of facebookresearch/suncet (src/resnet.py, src/wide_resnet.py,
the heads of src/paws_train.py and src/fine_tune.py init_model), their
checkpoints in the official layout, and their evaluation preprocessing."""

import collections

import numpy as np
from PIL import Image
import torch
from torch import nn


class Bottleneck(nn.Module):
    """ResNet v1.5 bottleneck: 1x1, 3x3 (strided), 1x1 x4, projection."""

    def __init__(self, inplanes, planes, stride):
        super().__init__()
        out = planes * 4
        self.conv1 = nn.Conv2d(inplanes, planes, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(planes)
        self.conv2 = nn.Conv2d(planes, planes, 3, stride, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(planes)
        self.conv3 = nn.Conv2d(planes, out, 1, bias=False)
        self.bn3 = nn.BatchNorm2d(out)
        self.downsample = None
        if stride != 1 or inplanes != out:
            self.downsample = nn.Sequential(
                nn.Conv2d(inplanes, out, 1, stride, bias=False),
                nn.BatchNorm2d(out))

    def forward(self, x):
        y = torch.relu(self.bn1(self.conv1(x)))
        y = torch.relu(self.bn2(self.conv2(y)))
        y = self.bn3(self.conv3(y))
        shortcut = x if self.downsample is None else self.downsample(x)
        return torch.relu(y + shortcut)


class ResNet50(nn.Module):
    """Stem conv 7x7/2, BN, ReLU, max pool 3/2; stages of 3, 4, 6, 3."""

    def __init__(self, widen=1):
        super().__init__()
        width = 64 * widen
        self.conv1 = nn.Conv2d(3, width, 7, 2, 3, bias=False)
        self.bn1 = nn.BatchNorm2d(width)
        self.maxpool = nn.MaxPool2d(3, 2, 1)
        inplanes = width
        for stage, blocks in enumerate((3, 4, 6, 3), start=1):
            planes = width * 2 ** (stage - 1)
            layer = []
            for block in range(blocks):
                stride = 2 if stage > 1 and block == 0 else 1
                layer.append(Bottleneck(inplanes, planes, stride))
                inplanes = planes * 4
            setattr(self, f'layer{stage}', nn.Sequential(*layer))
        self.num_features = inplanes
        self.fc = None
        self.pred = None

    def features(self, x):
        x = self.maxpool(torch.relu(self.bn1(self.conv1(x))))
        for stage in range(1, 5):
            x = getattr(self, f'layer{stage}')(x)
        return x.mean(dim=(2, 3))


class WideBlock(nn.Module):
    """Pre-activation wide block; the shortcut projects the raw input."""

    def __init__(self, in_planes, planes, stride):
        super().__init__()
        self.bn1 = nn.BatchNorm2d(in_planes)
        self.conv1 = nn.Conv2d(in_planes, planes, 3, padding=1)
        self.bn2 = nn.BatchNorm2d(planes)
        self.conv2 = nn.Conv2d(planes, planes, 3, stride, 1)
        self.shortcut = nn.Sequential()
        if stride != 1 or in_planes != planes:
            self.shortcut = nn.Sequential(
                nn.Conv2d(in_planes, planes, 1, stride))

    def forward(self, x):
        y = self.conv1(torch.relu(self.bn1(x)))
        y = self.conv2(torch.relu(self.bn2(y)))
        return y + self.shortcut(x)


class WideResNet(nn.Module):
    """WideResNet-depth-k without dropout, final BN + ReLU, average pool."""

    def __init__(self, depth=28, k=2):
        super().__init__()
        n = (depth - 4) // 6
        self.conv1 = nn.Conv2d(3, 16, 3, padding=1)
        in_planes = 16
        for group, stride in enumerate((1, 2, 2), start=1):
            planes = 16 * 2 ** (group - 1) * k
            blocks = []
            for block in range(n):
                blocks.append(WideBlock(in_planes, planes,
                                        stride if block == 0 else 1))
                in_planes = planes
            setattr(self, f'layer{group}', nn.Sequential(*blocks))
        self.bn1 = nn.BatchNorm2d(in_planes, momentum=0.99)
        self.num_features = in_planes
        self.fc = None
        self.pred = None

    def features(self, x):
        x = self.conv1(x)
        for group in range(1, 4):
            x = getattr(self, f'layer{group}')(x)
        return torch.relu(self.bn1(x)).mean(dim=(2, 3))


def add_pretraining_heads(encoder, output_dim, use_pred):
    """paws_train.py init_model: `fc` 3-layer projection, hidden width F;
    `pred` bn-fc(D/4)-bn-relu-fc(D)."""
    hidden = encoder.num_features
    encoder.fc = nn.Sequential(collections.OrderedDict([
        ('fc1', nn.Linear(hidden, hidden)), ('bn1', nn.BatchNorm1d(hidden)),
        ('relu1', nn.ReLU()),
        ('fc2', nn.Linear(hidden, hidden)), ('bn2', nn.BatchNorm1d(hidden)),
        ('relu2', nn.ReLU()),
        ('fc3', nn.Linear(hidden, output_dim))]))
    if use_pred:
        encoder.pred = nn.Sequential(collections.OrderedDict([
            ('bn1', nn.BatchNorm1d(output_dim)),
            ('fc1', nn.Linear(output_dim, output_dim // 4)),
            ('bn2', nn.BatchNorm1d(output_dim // 4)), ('relu', nn.ReLU()),
            ('fc2', nn.Linear(output_dim // 4, output_dim))]))
    return encoder


def add_fine_tuned_head(encoder, num_classes):
    """fine_tune.py init_model: `fc` = fc1, bn1, relu1, fc2 (classes)."""
    hidden = encoder.num_features
    encoder.fc = nn.Sequential(collections.OrderedDict([
        ('fc1', nn.Linear(hidden, hidden)), ('bn1', nn.BatchNorm1d(hidden)),
        ('relu1', nn.ReLU()), ('fc2', nn.Linear(hidden, num_classes))]))
    return encoder


def randomize(encoder, seed):
    """Random weights everywhere, batch-norm running statistics, gammas and
    betas included (their defaults 0, 1, 1, 0 would hide mapping errors).

    Convolution and linear weights keep PyTorch's initialisation scale,
    so activations stay of order one through ResNet-50's 16 blocks."""
    generator = torch.Generator().manual_seed(seed)

    def uniform(tensor, low, high):
        tensor.copy_(low + (high - low) * torch.rand(
            tensor.shape, generator=generator))

    with torch.no_grad():
        for module in encoder.modules():
            if isinstance(module, (nn.Conv2d, nn.Linear)):
                bound = 1 / np.sqrt(module.weight[0].numel())
                uniform(module.weight, -bound, bound)
                if module.bias is not None:
                    uniform(module.bias, -bound, bound)
            elif isinstance(module, (nn.BatchNorm1d, nn.BatchNorm2d)):
                uniform(module.weight, 0.5, 1.5)
                uniform(module.bias, -0.2, 0.2)
                uniform(module.running_mean, -0.2, 0.2)
                uniform(module.running_var, 0.5, 1.5)
                module.num_batches_tracked.fill_(1000)
    return encoder.eval()


def save_official(encoder, path, epoch=300):
    """`torch.save` of the official layout: the DDP state dict under
    'encoder', as suncet's training scripts write it."""
    torch.save({'encoder': {f'module.{key}': value for key, value in
                            encoder.state_dict().items()},
                'epoch': epoch, 'lr': 0.1, 'world_size': 64}, path)


@torch.no_grad()
def outputs(encoder, images):
    """`features`, `projection` (fc) and `prediction` (pred) as NumPy, or
    `logits` for a fine-tuned encoder (`num_classes` outputs of fc)."""
    features = encoder.features(images)
    result = {'features': features}
    if encoder.fc is not None:
        result['projection'] = encoder.fc(features)
    if encoder.pred is not None:
        result['prediction'] = encoder.pred(result['projection'])
    return {key: value.numpy() for key, value in result.items()}


def eval_transform(image, resize, crop, mean, std):
    """torchvision Resize(resize) + CenterCrop(crop) + ToTensor +
    Normalize, on a uint8 [H, W, 3] array through PIL.

    Returns:
        float32 [3, crop, crop].
    """
    pil = Image.fromarray(image)
    width, height = pil.size
    if width <= height:
        size = (resize, int(resize * height / width))
    else:
        size = (int(resize * width / height), resize)
    if size != pil.size:
        pil = pil.resize(size, Image.BILINEAR)
    width, height = pil.size
    top = int(round((height - crop) / 2.0))
    left = int(round((width - crop) / 2.0))
    pil = pil.crop((left, top, left + crop, top + crop))
    array = np.asarray(pil, np.float32) / 255.0
    array = (array - np.asarray(mean, np.float32)) / np.asarray(std,
                                                                np.float32)
    return array.transpose(2, 0, 1)
