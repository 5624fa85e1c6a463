"""The official PAWS ImageNet input path, for bench_input.py to race against.

Written from facebookresearch/suncet `src/data_manager.py` (ImageNet): the
unlabeled set yields 2 global views and `num_local` local views of each image
(`TransImageNet`), the support set one view of each image, drawn by a
class-stratified batch sampler (`ClassStratifiedSampler`: classes per batch x
images per class), both through torchvision transforms on PIL images with the
official `GaussianBlur` rule, in DataLoaders of `num_workers` processes.

Needs the `torch` extra (`pip install .[torch]`: torch and torchvision).
This module imports no TensorFlow, so that DataLoader workers stay light.
"""

import random
import sys
import types

import numpy as np
import PIL.ImageFilter
import torch

# The torchvision wheel that pip pairs with the CPU torch wheel may fail to
# load its compiled operators ("operator torchvision::nms does not exist"),
# and its fake-kernel registrations for them then stop the import. The
# transforms used here need none of those operators: skip the registrations.
sys.modules.setdefault('torchvision._meta_registrations',
                       types.ModuleType('torchvision._meta_registrations'))
import torchvision.datasets  # noqa: E402
import torchvision.transforms as transforms  # noqa: E402

IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)


class GaussianBlur:
    """suncet's GaussianBlur: PIL's blur, sigma ~ U(0.1, 2), probability p."""

    def __init__(self, p=0.5, radius_min=0.1, radius_max=2.0):
        self.prob = p
        self.radius_min = radius_min
        self.radius_max = radius_max

    def __call__(self, img):
        if torch.bernoulli(torch.tensor(self.prob)) == 0:
            return img
        radius = self.radius_min + torch.rand(1) * (
            self.radius_max - self.radius_min)
        # Pillow 13 takes a number or a pair, not the 1-element tensor.
        return img.filter(PIL.ImageFilter.GaussianBlur(radius=radius.item()))


def view_transform(size, scale, color_strength):
    """suncet `_make_imgnt_transforms` / `_make_multicrop_imgnt_transforms`
    with normalize=True."""
    s = color_strength
    color_distortion = transforms.Compose([
        transforms.RandomApply(
            [transforms.ColorJitter(0.8 * s, 0.8 * s, 0.8 * s, 0.2 * s)],
            p=0.8),
        transforms.RandomGrayscale(p=0.2)])
    return transforms.Compose([
        transforms.RandomResizedCrop(size=size, scale=scale),
        transforms.RandomHorizontalFlip(),
        color_distortion,
        GaussianBlur(p=0.5),
        transforms.ToTensor(),
        transforms.Normalize(IMAGENET_MEAN, IMAGENET_STD)])


class _Views(torch.utils.data.Dataset):
    """`TransImageNet`: `transform` views, then `num_local` local views."""

    def __init__(self, folder, transform, num_global, num_local=0,
                 local_transform=None):
        self.folder = folder
        self.transform = transform
        self.num_global = num_global
        self.num_local = num_local
        self.local_transform = local_transform

    def __len__(self):
        return len(self.folder.samples)

    def __getitem__(self, index):
        path, target = self.folder.samples[index]
        img = self.folder.loader(path)
        views = [self.transform(img) for _ in range(self.num_global)]
        views += [self.local_transform(img) for _ in range(self.num_local)]
        return (*views, target)


class _ClassStratifiedBatches(torch.utils.data.Sampler):
    """Batches of `classes_per_batch` classes x `images_per_class` images,
    classes from a permutation renewed when exhausted, images drawn per
    class (suncet's `ClassStratifiedSampler` on one rank)."""

    def __init__(self, targets, classes_per_batch, images_per_class, seed=0):
        super().__init__()
        self.by_class = [np.flatnonzero(np.asarray(targets) == c)
                         for c in range(max(targets) + 1)]
        self.classes_per_batch = classes_per_batch
        self.images_per_class = images_per_class
        self.rng = random.Random(seed)

    def __iter__(self):
        while True:
            classes = self.rng.sample(range(len(self.by_class)),
                                      self.classes_per_batch)
            draws = [self.rng.sample(list(self.by_class[c]),
                                     self.images_per_class) for c in classes]
            # suncet interleaves: [a, b, c], [a, b, c], ...
            yield [int(i) for row in zip(*draws) for i in row]


def make_loaders(root, *, batch_size, classes_per_batch, images_per_class,
                 num_local, num_workers, global_scale=(0.14, 1.0),
                 local_scale=(0.05, 0.14), color_strength=1.0):
    """The unlabeled and the support DataLoader over an image folder.

    Returns:
        An endless iterator of (unlabeled batch, support batch) pairs.
    """
    folder = torchvision.datasets.ImageFolder(root)
    global_transform = view_transform(224, global_scale, color_strength)
    local_transform = view_transform(96, local_scale, color_strength)
    # pin_memory (True in suncet) only matters with a GPU to copy to.
    common = dict(num_workers=num_workers,
                  persistent_workers=num_workers > 0)
    unlabeled = torch.utils.data.DataLoader(
        _Views(folder, global_transform, 2, num_local, local_transform),
        batch_size=batch_size, shuffle=True, drop_last=True, **common)
    support = torch.utils.data.DataLoader(
        _Views(folder, global_transform, 1),
        batch_sampler=_ClassStratifiedBatches(
            folder.targets, classes_per_batch, images_per_class), **common)
    return zip(_epochs(unlabeled), support)


def _epochs(loader):
    while True:
        yield from loader
