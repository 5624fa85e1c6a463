"""Normalisation computed from the data: statistics against NumPy, recorded
once in model_dir, used by the input pipeline and the evaluation."""

import json

import numpy as np
from PIL import Image
import pytest

from paws_tf import checks
from paws_tf.data import augment
from paws_tf.data import folders
from paws_tf.data import normalization as normalization_lib
from paws_tf.data import pipeline
from paws_tf import run_dir
from paws_tf.runner import experiment


def write_folder(root, channels):
    """Two classes of PNGs of different sizes; returns their pixels as the
    decoder gives them (grayscale files repeated into RGB when asked)."""
    rng = np.random.default_rng(channels)
    pixels = []
    for i, size in enumerate([(12, 9), (7, 15), (10, 10), (5, 6)]):
        image = rng.integers(0, 256, size=size + (3,), dtype=np.uint8)
        path = root / f'class{i % 2}' / f'{i}.png'
        path.parent.mkdir(parents=True, exist_ok=True)
        if channels == 1 or i == 3:  # A grayscale file in the RGB case.
            image = image[..., 0]
            Image.fromarray(image, 'L').save(path)
            image = np.repeat(image[..., None], channels, axis=-1)
        else:
            Image.fromarray(image, 'RGB').save(path)
        pixels.append(image.reshape(-1, channels) / 255.0)
    return np.concatenate(pixels)  # [all pixels, C]


@pytest.mark.parametrize('channels', [1, 3])
def test_statistics_weigh_every_pixel_once(tmp_path, channels):
    pixels = write_folder(tmp_path / 'labeled', channels)
    labeled = folders.image_folder(tmp_path / 'labeled', channels=channels)
    mean, std = normalization_lib.channel_statistics(labeled)
    np.testing.assert_allclose(mean, pixels.mean(axis=0), rtol=1e-12)
    np.testing.assert_allclose(std, pixels.std(axis=0), rtol=1e-9)


def test_computed_once_and_recorded(tmp_path):
    pixels = write_folder(tmp_path / 'labeled', 3)
    labeled = folders.image_folder(tmp_path / 'labeled')
    run = run_dir.RunDir(tmp_path / 'run')
    mean, std = experiment.resolve_normalization('data', run, labeled)
    recorded = json.loads(open(run.normalization).read())
    np.testing.assert_allclose(recorded['mean'], pixels.mean(axis=0),
                               rtol=1e-12)
    np.testing.assert_allclose(recorded['std'], pixels.std(axis=0),
                               rtol=1e-9)
    assert recorded['channels'] == 3 and recorded['images'] == 4
    # A resumed run, export or evaluation reads the record, even if the
    # folder has changed since.
    write_folder(tmp_path / 'other', 3)
    other = folders.image_folder(tmp_path / 'other')
    assert experiment.resolve_normalization('data', run, other) == (mean,
                                                                     std)
    gray = folders.image_folder(tmp_path / 'labeled', channels=1)
    with pytest.raises(ValueError, match='normalisation of 3-channel images '
                       'but the images are now decoded to 1 channels'):
        experiment.resolve_normalization('data', run, gray)


def test_a_subset_of_the_images_when_there_are_many(tmp_path):
    write_folder(tmp_path / 'labeled', 1)
    labeled = folders.image_folder(tmp_path / 'labeled', channels=1)
    positions = np.sort(np.random.default_rng(7).choice(4, 2, replace=False))
    images = [np.asarray(labeled.read(p)).reshape(-1) / 255.0
              for p in positions]
    mean, std = normalization_lib.channel_statistics(labeled, max_images=2,
                                                     seed=7)
    np.testing.assert_allclose(mean, [np.concatenate(images).mean()],
                               rtol=1e-12)


def test_or_from_a_sample_of_the_unlabeled_images(tmp_path):
    write_folder(tmp_path / 'labeled', 3)
    pixels = []
    for i in range(6):
        image = np.full((3, 5, 3), 20 * i, np.uint8) + np.arange(
            3, dtype=np.uint8)
        pixels.append(image)
        path = tmp_path / 'unlabeled' / f'{i}.png'
        path.parent.mkdir(parents=True, exist_ok=True)
        Image.fromarray(image, 'RGB').save(path)
    chosen = np.sort(np.random.default_rng(3).choice(6, 4, replace=False))
    sample = np.concatenate([pixels[i].reshape(-1, 3) for i in chosen]) / 255
    bundle = experiment.load_data(
        run_dir.RunDir(tmp_path / 'run'), train=lambda: experiment.image_folders(
            str(tmp_path / 'labeled'), str(tmp_path / 'unlabeled'),
            include_labeled_in_unlabeled=False),
        normalization='data', normalization_from='unlabeled',
        normalization_images=4, seed=3)
    np.testing.assert_allclose(bundle.normalization[0], sample.mean(axis=0),
                               rtol=1e-12)
    np.testing.assert_allclose(bundle.normalization[1], sample.std(axis=0),
                               rtol=1e-9)
    recorded = json.loads(
        open(run_dir.RunDir(tmp_path / 'run').normalization).read())
    assert (recorded['source'], recorded['images'], recorded['of']) == (
        'unlabeled', 4, 6)
    with pytest.raises(ValueError, match="normalization_from must be one of "
                       r"\('labeled', 'unlabeled'\), got 'test'"):
        experiment.load_data(run_dir.RunDir(tmp_path / 'run'), train=None,
                             normalization='data', normalization_from='test')


def test_fixed_values_and_presets(tmp_path):
    write_folder(tmp_path / 'labeled', 3)
    labeled = folders.image_folder(tmp_path / 'labeled')
    assert experiment.resolve_normalization(
        'imagenet', run_dir.RunDir(tmp_path / 'a'), labeled) == (
            augment.IMAGENET_MEAN, augment.IMAGENET_STD)
    assert experiment.resolve_normalization(
        ((0.5,) * 3, (0.25,) * 3), run_dir.RunDir(tmp_path), labeled) == (
            (0.5,) * 3, (0.25,) * 3)
    with pytest.raises(ValueError, match='gives 1 channel'):
        experiment.resolve_normalization(
            ((0.5,), (0.25,)), run_dir.RunDir(tmp_path / 'other'), labeled)
    # The run recorded ((0.5,) * 3, (0.25,) * 3): exporting or evaluating
    # it with another normalisation is refused.
    for spec in ('data', 'imagenet'):
        with pytest.raises(ValueError, match=r"trained with, NORMALIZATION "
                           r"= \[\[0\.5, 0\.5, 0\.5\].*not '"):
            experiment.resolve_normalization(
                spec, run_dir.RunDir(tmp_path), labeled)


def test_constant_images_cannot_be_normalised(tmp_path):
    for i in range(2):
        path = tmp_path / 'labeled' / 'flat' / f'{i}.png'
        path.parent.mkdir(parents=True, exist_ok=True)
        Image.fromarray(np.full((4, 4), 9, np.uint8), 'L').save(path)
    labeled = folders.image_folder(tmp_path / 'labeled', channels=1)
    with pytest.raises(ValueError, match="constant value.*bind "
                       "NORMALIZATION = 'imagenet'"):
        experiment.resolve_normalization(
            'data', run_dir.RunDir(tmp_path), labeled)


def test_pipeline_and_evaluation_use_the_runs_normalisation():
    labeled = experiment.synthetic_source(num_images=32, channels=1)
    bundle = experiment.DataBundle(labeled, labeled, None,
                                   ((0.3,), (0.2,)))
    multicrop = augment.MultiCropConfig(
        global_size=8, global_scale=(1.0, 1.0), local_size=8,
        local_scale=(1.0, 1.0), num_local=0, color_strength=0.0,
        blur_prob=0.0)

    def first_batch(normalization):
        pretrain = pipeline.make_pretrain_dataset_fn(
            labeled, labeled, num_replicas=1, global_batch_size=4,
            classes_per_step=2, images_per_class=2, multicrop=multicrop,
            normalization=normalization)
        batch = next(iter(pretrain.dataset_fn(None)))
        return np.concatenate([batch['global_views'].numpy().ravel(),
                               batch['support_views'].numpy().ravel()])

    # The same views with mean 0 and std 1 are the pixels in [0, 1].
    pixels = first_batch(((0.0,), (1.0,)))
    assert 0 <= pixels.min() and pixels.max() <= 1 and pixels.std() > 0.05
    np.testing.assert_allclose(first_batch(bundle.normalization),
                               (pixels - 0.3) / 0.2, atol=1e-5)
    assert experiment.eval_preprocessing(
        bundle, image_size=8)['mean'] == (0.3,)
    with pytest.raises(checks.ConfigError, match='eval_preprocessing.mean '
                       '/ eval_preprocessing.std are bound'):
        experiment.eval_preprocessing(bundle, image_size=8, mean=(0.5,),
                                      std=(0.5,))
    with pytest.raises(ValueError, match=r'NORMALIZATION '
                       r'\(load_data.normalization\) gives 3 channel\(s\)'):
        pipeline.make_pretrain_dataset_fn(
            labeled, labeled, num_replicas=1, global_batch_size=4,
            classes_per_step=2, images_per_class=2,
            multicrop=augment.IMAGENET_MULTICROP,
            normalization=augment.NORMALIZATIONS['imagenet'])


@pytest.mark.parametrize('mean,std', [((127.5,) * 3, (64.0,) * 3),
                                      ((0.5,) * 3, (2.0,) * 3),
                                      ((-0.1,) * 3, (0.2,) * 3)])
def test_values_off_the_pixels_scale_are_refused(mean, std):
    """Images are normalised as pixels in [0, 1], whose means lie there
    and stds at or below 0.5. Fails if 0-255 values are taken (tried:
    mean 127.5 and std 64 went through, and the views averaged -2)."""
    with pytest.raises(ValueError, match=(
            r"are not on the pixels' 0-1 scale, .*divide 0-255 values by "
            r"255 \(ImageNet's: \(0\.485")):
        normalization_lib.normalization((mean, std), 3)
    crops = augment.MultiCropConfig(8, (0.5, 1.0), 4, (0.2, 0.5),
                                    num_local=2, color_strength=0.5,
                                    blur_prob=0.0, mean=mean, std=std)
    with pytest.raises(ValueError, match="pixels' 0-1 scale"):
        normalization_lib.normalized_multicrop(crops, None, 3)
