"""SavedModel export: the embedder and a ready PAWS-NN classifier."""

import json
import os

import numpy as np
import tensorflow as tf

from paws_tf import cluster
from paws_tf.data import augment
from paws_tf.data import normalization
from paws_tf import losses

# Beside each export (`RunDir.embedder`, `RunDir.classifier`).
PREPROCESSING_FILENAME = 'preprocessing.json'
# Dtypes a caller may pass by mistake. `__call__` gets a trace for each that
# fails with our message: without one, the loaded function casts NumPy
# floats to uint8 silently (0.7 -> 0, 300.7 -> 44).
_REJECTED_DTYPES = (tf.float16, tf.float32, tf.float64, tf.int32, tf.int64)


def _checked_images(images, expected, description):
    """`images` with static shape `[None, *expected]` (None: any size), or
    a failure with `description`. Through a `tf.cond`, whose output shape
    is fixed when traced: a loaded function called with a static shape of
    another rank would otherwise fail shape inference before the check."""
    shape = tf.shape(images)
    padded = tf.concat([shape, tf.zeros([4], tf.int32)], 0)
    conditions = [tf.equal(tf.rank(images), 4)] + [
        tf.equal(padded[1 + axis], size)
        for axis, size in enumerate(expected) if size is not None]

    def fail():
        failure = tf.debugging.Assert(
            False, [f'{description}; got shape', shape], summarize=8)
        with tf.control_dependencies([failure]):
            return tf.identity(images)

    images = tf.cond(tf.reduce_all(tf.stack(conditions)),
                     lambda: tf.identity(images), fail)
    return tf.ensure_shape(images, [None] + list(expected))


class _SNNHead(tf.Module):
    """PAWS-NN over bundled supports (PAWS Appendix A, no label smoothing)."""

    def __init__(self, support_embeddings, support_labels, class_names, tau):
        super().__init__(name='snn_head')
        self.support_embeddings = tf.Variable(  # [M, D]
            support_embeddings, trainable=False, name='support_embeddings')
        self.support_labels = tf.Variable(
            support_labels, trainable=False, name='support_labels')  # [M]
        self.class_names = tf.Variable(list(class_names), trainable=False,
                                       name='class_names')  # [K]
        self.tau = tf.Variable(float(tau), trainable=False, name='tau')
        self._num_classes = len(class_names)

    def __call__(self, model_outputs):
        label_matrix = tf.one_hot(self.support_labels,
                                  self._num_classes)  # [M, K]
        probabilities = losses.snn(model_outputs['embeddings'],
                                   self.support_embeddings, label_matrix,
                                   self.tau)  # [N, K]
        top = tf.math.top_k(probabilities, k=min(5, self._num_classes))
        class_ids = top.indices[:, 0]
        return {'probabilities': probabilities, 'class_ids': class_ids,
                'class_names': tf.gather(self.class_names, class_ids),
                'top5_class_ids': top.indices,
                'top5_probabilities': top.values}


def _logits_head(logits):
    """Class scores of a classifier's logits."""
    logits = tf.cast(logits, tf.float32)  # [N, K]
    top = tf.math.top_k(logits, k=min(5, logits.shape[-1]))
    return {'logits': logits, 'probabilities': tf.nn.softmax(logits),
            'class_ids': top.indices[:, 0], 'top5_class_ids': top.indices}


class _Servable(tf.Module):
    """The model with its evaluation preprocessing and an optional head:
    `__call__` takes raw uint8 images, `call_preprocessed` float32 images
    preprocessed as `pipeline.make_eval_dataset` does. A model that
    `embeds` returns a dict with `embeddings` (else ValueError when
    saved); the others, what `head` takes."""

    def __init__(self, model, head, *, image_size, crop_fraction, mean, std,
                 channels, embeds=True):
        super().__init__(name='paws_servable')
        mean, std = normalization.checked_values(
            'The export\'s preprocessing', mean, std, channels)
        if not 0 < crop_fraction <= 1:
            raise ValueError(f'crop_fraction must be in (0, 1], got '
                             f'{crop_fraction}.')
        self._set_untracked(model=model, preprocessing=dict(
            image_size=int(image_size), crop_fraction=float(crop_fraction),
            mean=[float(m) for m in mean], std=[float(s) for s in std],
            channels=int(channels)))
        # Only the variables are saved: tracking the Keras model would make
        # the save trace and store every layer's Keras call functions too.
        self.model_variables = list(model.variables)
        self.head, self._embeds = head, embeds
        # Saved with the model, readable as `loaded.image_size` etc.
        for key, value in self.preprocessing.items():
            setattr(self, key, tf.Variable(value, trainable=False, name=key))
        self._raw_description = (
            f'images must be uint8 [N, H, W, C={channels}]: a batch of raw '
            f'images with pixel values 0-255')
        self._preprocessed_description = (
            f'images must be float32 [N, {image_size}, {image_size}, '
            f'C={channels}], preprocessed like pipeline.make_eval_dataset')
        self.__call__ = tf.function(self._serve_raw, autograph=False)
        self.call_preprocessed = tf.function(
            self._serve_preprocessed, autograph=False,
            input_signature=[tf.TensorSpec(None, tf.float32, name='images')])

    @tf.__internal__.tracking.no_automatic_dependency_tracking
    def _set_untracked(self, *, model, preprocessing):
        """Attributes kept out of the SavedModel's object graph."""
        self.model = model
        self.preprocessing = preprocessing

    def _outputs(self, images):
        outputs = self.model(images, training=False)
        if self._embeds and not (isinstance(outputs, dict) and
                                 'embeddings' in outputs):
            returned = (f'a dict of {sorted(outputs)}'
                        if isinstance(outputs, dict) else 'a tensor')
            raise ValueError(
                "The exported model must return a dict with 'embeddings', "
                f'as model.PAWSModel does; {type(self.model).__name__} '
                f'returns {returned}: export the PAWSModel that holds the '
                'backbone.')
        return outputs if self.head is None else self.head(outputs)

    def _serve_raw(self, images):
        if images.dtype != tf.uint8:
            failure = tf.debugging.Assert(
                False, [f'{self._raw_description}; got {images.dtype.name}'])
            with tf.control_dependencies([failure]):
                return {'error': tf.constant('unreachable')}
        p = self.preprocessing
        images = _checked_images(images, [None, None, p['channels']],
                                 self._raw_description)
        # augment.center_view takes one [H, W, C] image.
        views = tf.map_fn(
            lambda image: augment.center_view(
                image, p['image_size'], crop_fraction=p['crop_fraction'],
                mean=p['mean'], std=p['std']),
            images, fn_output_signature=tf.TensorSpec(
                [p['image_size'], p['image_size'], p['channels']],
                tf.float32))
        # The preprocessed signature's function: the model traced once.
        return self.call_preprocessed(views)

    def _serve_preprocessed(self, images):
        p = self.preprocessing
        return self._outputs(_checked_images(
            images, [p['image_size'], p['image_size'], p['channels']],
            self._preprocessed_description))

    def save(self, export_dir, preprocessed_signature, strategy, extra_info):
        """Saves the module and preprocessing.json (the chief's copy)."""
        # Traced first, so that `_outputs`' error is raised outside the
        # raw signature's `tf.map_fn`.
        preprocessed = self.call_preprocessed.get_concrete_function()
        raw = self.__call__.get_concrete_function(
            tf.TensorSpec(None, tf.uint8, name='images'))
        for dtype in _REJECTED_DTYPES:
            self.__call__.get_concrete_function(
                tf.TensorSpec(None, dtype, name='images'))
        signatures = {'serving_default': raw,
                      preprocessed_signature: preprocessed}
        info = dict(self.preprocessing, input='uint8 [N, H, W, C]',
                    signatures=sorted(signatures),
                    embedding=getattr(self.model, 'nn_embedding', None),
                    **extra_info)
        with cluster.save_dir(strategy or tf.distribute.get_strategy(),
                           export_dir) as target:
            tf.saved_model.save(self, target, signatures=signatures)
            with tf.io.gfile.GFile(
                    os.path.join(target, PREPROCESSING_FILENAME), 'w') as f:
                json.dump(info, f, indent=2)


def read_preprocessing(export_dir):
    """The preprocessing parameters stored beside an export; raises
    FileNotFoundError if `export_dir` holds no preprocessing.json."""
    path = os.path.join(export_dir, PREPROCESSING_FILENAME)
    if not tf.io.gfile.exists(path):
        raise FileNotFoundError(
            f'{path} does not exist: {export_dir} is not a paws_tf export.')
    with tf.io.gfile.GFile(path) as f:
        return json.load(f)


class LoadedEmbedder(tf.Module):
    """An `export_embedder` SavedModel as a model (of PAWS-NN, of another
    export): float32 preprocessed images -> `{'embeddings': [N, D]}`.

    Raises:
        FileNotFoundError: `export_dir` is not a paws_tf export.
        ValueError: it has no `embed_preprocessed` signature.
    """

    def __init__(self, export_dir):
        super().__init__(name='loaded_embedder')
        self.nn_embedding = read_preprocessing(export_dir).get('embedding')
        self._loaded = tf.saved_model.load(export_dir)
        if 'embed_preprocessed' not in self._loaded.signatures:
            raise ValueError(
                f'{export_dir} has signatures '
                f'{sorted(self._loaded.signatures)}, not embed_preprocessed: '
                'it was not written by export_embedder.')

    @property
    def variables(self):
        return list(self._loaded.model_variables)

    def __call__(self, images, training=False):
        del training  # Inference mode only.
        return {'embeddings': self._loaded.call_preprocessed(images)[
            'embeddings']}


def export_embedder(model, export_dir, *, image_size, crop_fraction, mean,
                    std, channels, step=0, strategy=None):
    """Writes the encoder as a SavedModel that takes raw images.

    `serving_default` (also `loaded(images)`): `images` uint8
    `[N, H, W, C]` (any N, H, W), preprocessed by `augment.center_view`, ->
    float32 `features` `[N, F]` (backbone), `projection` `[N, D]`,
    `prediction` `[N, D']` (with a prediction head) and `embeddings`: the
    one of the last two that PAWS-NN compares (`model.nn_embedding`).
    `embed_preprocessed` (also `loaded.call_preprocessed`) takes float32
    `[N, S, S, C]` images preprocessed as `pipeline.make_eval_dataset`
    does. The preprocessing is stored as variables (`loaded.image_size`,
    ...) and in `preprocessing.json`, with the weights' `step` (PAWS-NN of
    the export reads it there, not from a checkpoint). Loading needs only
    TensorFlow.

    Under MultiWorkerMirroredStrategy, export a plain-variable copy of the
    model on the chief (`modes.export_and_evaluate` does): a SavedModel
    cannot hold that strategy's distributed variables.

    Args:
        model: built `model.PAWSModel` (or any model returning a dict
            with `embeddings`).
        export_dir: output directory.
        image_size, crop_fraction, mean, std, channels: S, the centre
            crop's fraction of the resized image, the C channel means and
            standard deviations, C.
        step: the global step of the model's weights.
        strategy: the running strategy (default: the current one).

    Raises:
        ValueError: on inconsistent preprocessing parameters.
    """
    module = _Servable(model, None, image_size=image_size,
                       crop_fraction=crop_fraction, mean=mean, std=std,
                       channels=channels)
    module.save(export_dir, 'embed_preprocessed', strategy,
                dict(step=int(step)))


def checked_labels(what, labels, num_classes):
    """`labels` as a NumPy array; ValueError unless integer class ids in
    `[0, num_classes)` (`tf.one_hot` gives a row of zeros to any other)."""
    labels = np.asarray(labels)
    if not np.issubdtype(labels.dtype, np.integer):
        raise ValueError(f'{what} labels must be integer class ids, got '
                         f'{labels.dtype}.')
    if labels.min() < 0 or labels.max() >= num_classes:
        raise ValueError(f'{what} labels must be in [0, {num_classes}), '
                         f'got [{labels.min()}, {labels.max()}].')
    return labels


def export_classifier(model, export_dir, *, support_embeddings,
                      support_labels, class_names, tau, image_size,
                      crop_fraction, mean, std, channels, strategy=None):
    """Writes a self-contained PAWS-NN classifier SavedModel.

    The supports are stored inside, so `serving_default` (raw images, as
    for `export_embedder`) returns `probabilities` float32 `[N, K]` (as
    `evaluate.classify` ranks them), `class_ids` int32 `[N]` (the argmax),
    `class_names` string `[N]`, `top5_class_ids` int32 `[N, min(5, K)]` and
    `top5_probabilities`. `classify_preprocessed` takes float32
    `[N, S, S, C]` preprocessed images.

    Args:
        model, export_dir, image_size, crop_fraction, mean, std, channels,
            strategy: as for `export_embedder`.
        support_embeddings, support_labels: `[M, D]` embeddings of every
            labeled image, int `[M]` class ids in `[0, K)`.
        class_names, tau: K names indexed by class id, the temperature.

    Raises:
        ValueError: on inconsistent supports, labels or class names.
    """
    support_embeddings = tf.convert_to_tensor(support_embeddings, tf.float32)
    support_labels = tf.convert_to_tensor(support_labels, tf.int32)
    if support_embeddings.shape.rank != 2 or not support_embeddings.shape[0]:
        raise ValueError(f'support_embeddings must be a non-empty [M, D] '
                         f'matrix, got shape {support_embeddings.shape}.')
    num_support = int(support_embeddings.shape[0])
    if support_labels.shape != [num_support]:
        raise ValueError(f'support_labels has shape {support_labels.shape} '
                         f'for {num_support} support embeddings.')
    checked_labels('Support', support_labels.numpy(), len(class_names))
    head = _SNNHead(support_embeddings, support_labels, class_names, tau)
    module = _Servable(model, head, image_size=image_size,
                       crop_fraction=crop_fraction, mean=mean, std=std,
                       channels=channels)
    module.save(export_dir, 'classify_preprocessed', strategy,
                dict(num_support=num_support, num_classes=len(class_names),
                     tau=float(tau)))


def export_fine_tuned(classifier, export_dir, *, image_size, crop_fraction,
                      mean, std, channels, strategy=None):
    """Writes a fine-tuned classifier as a SavedModel that takes raw images.

    `serving_default` (raw images, as for `export_embedder`) and
    `classify_preprocessed` return `logits` float32 `[N, K]`,
    `probabilities` (their softmax), `class_ids` int32 `[N]` and
    `top5_class_ids` `[N, min(5, K)]`.

    Args:
        classifier: built `tf_keras.Model`, images -> `[N, K]` logits.
        export_dir, image_size, crop_fraction, mean, std, channels,
            strategy: as for `export_embedder`.
    """
    module = _Servable(classifier, _logits_head, image_size=image_size,
                       crop_fraction=crop_fraction, mean=mean, std=std,
                       channels=channels, embeds=False)
    module.save(export_dir, 'classify_preprocessed', strategy,
                dict(num_classes=int(classifier.output_shape[-1])))
