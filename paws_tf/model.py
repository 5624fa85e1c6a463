"""PAWSModel: the PAWS encoder with its multi-crop train_step and test_step."""

import gin
import tensorflow as tf
import tf_keras

from paws_tf import checks
from paws_tf import cluster
from paws_tf import dist
from paws_tf import losses
from paws_tf import nets
from paws_tf.nets import backbones
from paws_tf.nets import heads

# What PAWS-NN may compare: the projection h or the prediction head's output.
NN_EMBEDDINGS = ('projection', 'prediction')
# The objectives `PAWSModel.objective` selects: PAWS, or RoPAWS's targets.
OBJECTIVES = ('paws', 'ropaws')
# `train_step`'s per-step values are its means' names with this prefix.
STEP_PREFIX = 'step_'
# LARS's trust ratios (`LARS.trust_ratio_stats`), logged with LARS only.
TRUST_RATIOS = ('trust_ratio_mean', 'trust_ratio_min', 'trust_ratio_max')
# PAWS Fig. 4b's diagnostics, in the step's logs with `diagnostics_every`.
DIAGNOSTICS = ('nt_xent', 'suncet')


@gin.configurable(denylist=['backbone', 'projection_head', 'prediction_head'])
class PAWSModel(tf_keras.Model):
    """Encoder f (backbone + projection head) and optional prediction head g.

    `train_step` consumes the per-replica batches that
    `pipeline.PretrainInput` describes; each support row carries its own
    column (`support_one_hot`) and view (`support_view_index`, by which
    RoPAWS counts the images per class), gathered over replicas with the
    row, so the model holds no layout: a restored model needs only its
    weights. `call` maps images to inference embeddings.

    Args:
        backbone: `[B, H, W, C] -> [B, F]` features model.
        projection_head: `[B, F] -> [B, D]`, its output is h.
        prediction_head: optional `[B, D] -> [B, D']`, its output is z (z = h
            without it).
        tau: similarity temperature (paper: 0.1).
        sharpen_temperature: target sharpening temperature T (0.25).
        me_max_weight: weight of the me-max term (1 in the paper, 0 in the
            small-batch setting of Table 7).
        label_smoothing: support label smoothing (0.1).
        diagnostics_every: compute the NT-Xent and SuNCEt diagnostics every
            this many steps (0: never).
        nn_embedding: what `call` returns as `embeddings`, the representation
            PAWS-NN compares: 'projection' (h) or 'prediction' (the prediction
            head's output, which the official ImageNet PAWS-NN figures used).
        objective: 'paws', or 'ropaws' (RoPAWS's targets and weights,
            `losses.ropaws_loss`, for unlabeled images that may hold other
            classes).
        ropaws_prior_tau: RoPAWS's in-domain prior temperature (> 0; official:
            0.1 on CIFAR-10, 3.0 on ImageNet).
        ropaws_prior_pow: exponent of p_in weighting each view's loss (>= 0; 0
            leaves the views unweighted; official: 1).
        ropaws_label_ratio: RoPAWS's label_ratio (> 0; official: 5): the
            supports weigh `label_ratio * B / n` times an unlabeled target, B
            the unlabeled images and n the support images of a class on one
            replica, as the official code's per-GPU sizes (both read from the
            batch).
        **kwargs: passed to `tf_keras.Model`.

    Raises:
        checks.ConfigError: a value out of range, or `nn_embedding`
            'prediction' without a prediction head.
    """

    def __init__(self, backbone, projection_head, prediction_head=None, *,
                 tau=0.1, sharpen_temperature=0.25, me_max_weight=1.0,
                 label_smoothing=0.1, diagnostics_every=10,
                 nn_embedding='projection', objective='paws',
                 ropaws_prior_tau=3.0, ropaws_prior_pow=1.0,
                 ropaws_label_ratio=5.0, **kwargs):
        super().__init__(**kwargs)
        self.check_arguments(
            tau=tau, sharpen_temperature=sharpen_temperature,
            me_max_weight=me_max_weight, label_smoothing=label_smoothing,
            diagnostics_every=diagnostics_every, nn_embedding=nn_embedding,
            objective=objective, ropaws_prior_tau=ropaws_prior_tau,
            ropaws_prior_pow=ropaws_prior_pow,
            ropaws_label_ratio=ropaws_label_ratio)
        self.objective = objective
        self.ropaws_settings = dict(prior_tau=ropaws_prior_tau,
                                    prior_pow=ropaws_prior_pow,
                                    label_ratio=ropaws_label_ratio)
        if nn_embedding == 'prediction' and prediction_head is None:
            raise checks.ConfigError(
                "PAWSModel.nn_embedding = 'prediction' needs a prediction "
                'head: bind build_model.prediction_head = True, or '
                "PAWSModel.nn_embedding = 'projection'.")
        self.nn_embedding = nn_embedding
        self.backbone = backbone
        self.projection_head = projection_head
        self.prediction_head = prediction_head
        self.tau = tau
        self.sharpen_temperature = sharpen_temperature
        self.me_max_weight = me_max_weight
        self.label_smoothing = label_smoothing
        self.diagnostics_every = diagnostics_every
        self._create_metrics()
        cluster.report_results_once(self)

    @staticmethod
    def check_arguments(*, tau, sharpen_temperature, me_max_weight,
                        label_smoothing, diagnostics_every, nn_embedding,
                        objective, ropaws_prior_tau, ropaws_prior_pow,
                        ropaws_label_ratio, names=None):
        """As `lars.LARS.check_arguments` (default names
        `PAWSModel.<argument>`); the RoPAWS settings are checked only with
        `objective = 'ropaws'` (PAWS does not read them)."""
        name = checks.namer(names, 'PAWSModel.')
        checks.number(name('tau'), tau, positive=True)
        checks.number(name('sharpen_temperature'), sharpen_temperature,
                      positive=True)
        checks.number(name('me_max_weight'), me_max_weight, low=0.0)
        checks.number(name('label_smoothing'), label_smoothing, low=0.0,
                      high=1.0)
        checks.integer(name('diagnostics_every'), diagnostics_every,
                       minimum=0)
        checks.one_of(name('nn_embedding'), nn_embedding, NN_EMBEDDINGS)
        checks.one_of(name('objective'), objective, OBJECTIVES)
        if objective == 'ropaws':
            checks.number(name('ropaws_prior_tau'), ropaws_prior_tau,
                          positive=True)
            checks.number(name('ropaws_label_ratio'), ropaws_label_ratio,
                          positive=True)
            checks.number(name('ropaws_prior_pow'), ropaws_prior_pow,
                          low=0.0)

    @tf.__internal__.tracking.no_automatic_dependency_tracking
    def _create_metrics(self):
        """Metric trackers, kept out of `weights` and checkpoints."""
        names = ['loss', 'cross_entropy', 'me_max', 'target_confidence']
        if self.objective == 'ropaws':
            names.append('in_domain')  # Mean p_in: RoPAWS's in-class share.
        self._means = {name: tf_keras.metrics.Mean(name=name)
                       for name in names}
        # The same values of the last step alone (TensorBoard's per-step
        # points; the means above run over the epoch).
        self._steps = {name: dist.LastValue(name=STEP_PREFIX + name)
                       for name in names}
        # The diagnostics read NaN until this process computes them.
        self._last = {name: dist.LastValue(
            name, float('nan') if name in DIAGNOSTICS else 0.0) for name in (
                'learning_rate', *TRUST_RATIOS, 'weight_decay', *DIAGNOSTICS)}

    @property
    def metrics(self):
        return [*self._means.values(), *self._steps.values(),
                *self._last.values()]

    def call(self, images, training=False):
        """Inference embeddings.

        Args:
            images: `[N, H, W, C]` preprocessed images.
            training: batch-norm mode.

        Returns:
            dict of float32 tensors: `features` `[N, F]` (backbone output),
            `projection` `[N, D]` (h), `prediction` `[N, D']` (z, with a
            prediction head) and `embeddings`, the one of the two that
            PAWS-NN compares (`nn_embedding`).
        """
        features = self.backbone(images, training=training)
        shape = getattr(features, 'shape', None)
        if shape is None or tf.TensorShape(shape).rank != 2:
            raise ValueError(
                'The backbone must return [N, F] features, got '
                f'{type(features).__name__ if shape is None else shape}: '
                'end it with a pooling layer (tf_keras.layers.'
                'GlobalAveragePooling2D()).')
        outputs = {'features': features,
                   'projection': self.projection_head(features,
                                                      training=training)}
        if self.prediction_head is not None:
            outputs['prediction'] = self.prediction_head(
                outputs['projection'], training=training)
        outputs = {key: tf.cast(value, tf.float32)
                   for key, value in outputs.items()}
        outputs['embeddings'] = tf.identity(outputs[self.nn_embedding])
        return outputs

    def _encode(self, images, training):
        """Returns (h, z) in float32: projection and prediction outputs."""
        outputs = self.call(images, training)
        return outputs['projection'], outputs.get('prediction',
                                                  outputs['projection'])

    def _forward(self, data, training):
        """Encodes a step's views and evaluates the objective: `(loss, terms,
        z_global, z_support, labels)`, `labels` those of `z_support`."""
        _check_step_input(data)
        supports = data['support_views']  # [V K n, Hs, Ws, C]
        global_views = data['global_views']  # [2B, Hg, Wg, C]
        num_support = tf.shape(supports)[0]
        # Same-resolution views share one forward pass (and its BN moments),
        # as in the official code; other resolutions get their own.
        if supports.shape[1:] == global_views.shape[1:]:
            h, z = self._encode(tf.concat([supports, global_views], 0),
                                training)
            h_support, h_global = h[:num_support], h[num_support:]
            z_support, z_global = z[:num_support], z[num_support:]
        else:
            h_support, z_support = self._encode(supports, training)
            h_global, z_global = self._encode(global_views, training)
        anchors = z_global  # [2B, D]
        multicrop = _num_local(global_views, data.get('local_views'))
        if not isinstance(multicrop, int) or multicrop > 0:
            _, z_local = self._encode(data['local_views'], training)
            anchors = tf.concat([z_global, z_local], 0)  # [(2 + m) B, D]
        # The supports of all replicas, replica-major, with their columns.
        one_hot = data['support_one_hot']  # [V K n, C]
        z_support = dist.all_gather(z_support)  # [R V K n, D]
        if self.prediction_head is None:  # h = z: one collective, not two.
            h_support = tf.stop_gradient(z_support)
        else:
            h_support = dist.all_gather(tf.stop_gradient(h_support))
        labels = losses.label_matrix(  # [R V K n, C]
            dist.all_gather(tf.argmax(one_hot, axis=1, output_type=tf.int32)),
            one_hot.shape[-1], self.label_smoothing)
        view_1, view_2 = tf.split(h_global, 2, axis=0)
        targets = tf.concat([view_2, view_1], 0)  # Swapped: view 1 <- 2.
        objective, settings = losses.paws_loss, {}
        if self.objective == 'ropaws':
            # RoPAWS all-gathers the unlabeled targets and takes back this
            # replica's rows: the batch must be static (else the rows are
            # wrong).
            if dist.num_replicas() > 1 and targets.shape[0] is None:
                raise ValueError(
                    "PAWSModel.objective = 'ropaws' on several replicas "
                    'needs a static unlabeled batch to gather the targets of '
                    'every replica: batch the unlabeled views with '
                    'drop_remainder=True (make_pretrain_dataset_fn does).')
            objective = losses.ropaws_loss
            settings = dict(self.ropaws_settings,
                            images_per_class=_images_per_class(
                                one_hot, data['support_view_index']))
        terms = objective(
            anchors, z_support, labels, targets, h_support, labels,
            multicrop=multicrop, tau=self.tau,
            sharpen_temperature=self.sharpen_temperature,
            me_max=self.me_max_weight > 0, **settings)
        loss = terms.cross_entropy + self.me_max_weight * terms.me_max
        return loss, terms, z_global, z_support, labels

    def _update_means(self, loss, terms, num_global, steps=None):
        """Adds a step's loss terms to the epoch means, and makes them the
        per-step values of `steps` when given (`self._steps`)."""
        values = dict(
            loss=loss, cross_entropy=terms.cross_entropy,
            me_max=terms.me_max, target_confidence=losses.target_confidence(
                terms.targets[:num_global]))
        if terms.in_domain is not None:
            values['in_domain'] = tf.reduce_mean(terms.in_domain)
        for group in (self._means,) + ((steps,) if steps else ()):
            for name, value in values.items():
                group[name].update_state(value)

    def fit(self, x=None, *args, **kwargs):
        """`tf_keras.Model.fit`; raises ValueError for a `tf.data.Dataset`
        under a strategy of several replicas, which Keras would split: each
        element is one replica's, its rows ordered by view, so the halves
        would pair each image with another."""
        replicas = self.distribute_strategy.num_replicas_in_sync
        if replicas > 1 and isinstance(x, tf.data.Dataset):
            raise ValueError(
                f'fit was given a tf.data.Dataset under a strategy of '
                f'{replicas} replicas, which would split each replica\'s '
                'element between them: give it tf_keras.utils.experimental.'
                'DatasetCreator(pretrain.dataset_fn), pretrain made by '
                f'make_pretrain_dataset_fn(..., num_replicas={replicas}).')
        return super().fit(x, *args, **kwargs)

    def train_step(self, data):
        optimizer = self.optimizer
        with tf.GradientTape() as tape:
            loss, terms, z_global, z_support, labels = self._forward(
                data, True)
            # The optimizer sums replica gradients, so divide by
            # num_replicas: the sum is then the global-batch loss gradient.
            scaled_loss = loss / dist.num_replicas()
        optimizer.minimize(scaled_loss, self.trainable_variables, tape=tape)
        # With a schedule, `learning_rate` is the value computed for the
        # update just applied (read before `minimize`, the previous one's).
        self._last['learning_rate'].update_state(optimizer.learning_rate)

        self._update_means(loss, terms, tf.shape(z_global)[0], self._steps)
        not_reported = self._update_optimizer_values(
            getattr(optimizer, 'inner_optimizer', optimizer))
        if self.diagnostics_every:
            step = optimizer.iterations - 1  # This step's index, from 0.
            tf.cond(
                step % self.diagnostics_every == 0,
                lambda: self._update_diagnostics(z_global, z_support, labels),
                lambda: None)
        return {m.name: m.result() for m in self.metrics
                if m.name not in not_reported and (
                    self.diagnostics_every or m.name not in DIAGNOSTICS)}

    def _update_optimizer_values(self, optimizer):
        """Records what `optimizer` (unwrapped) has beside the learning
        rate: LARS's trust ratios (`trust_ratio_stats`), AdamW's weight
        decay (`applied_weight_decay`). Returns the names of those it has
        not, which the step leaves out of its logs."""
        values = {}
        if hasattr(optimizer, 'trust_ratio_stats'):
            for name, value in optimizer.trust_ratio_stats().items():
                values['trust_ratio_' + name] = value
        if hasattr(optimizer, 'applied_weight_decay'):
            values['weight_decay'] = optimizer.applied_weight_decay()
        for name, value in values.items():
            self._last[name].update_state(value)
        return {*TRUST_RATIOS, 'weight_decay'} - values.keys()

    def _update_diagnostics(self, z_global, z_support, labels):
        """PAWS Fig. 4b: NT-Xent of the two global views, SuNCEt of the
        supports; logged only, no gradient."""
        view_1, view_2 = tf.split(tf.stop_gradient(z_global), 2, axis=0)
        self._last['nt_xent'].update_state(
            losses.nt_xent_loss(view_1, view_2, self.tau))
        self._last['suncet'].update_state(losses.suncet_loss(
            tf.stop_gradient(z_support), labels, self.tau))

    def test_step(self, data):
        """The PAWS loss on held-out data, without updating anything."""
        loss, terms, z_global, _, _ = self._forward(data, training=False)
        self._update_means(loss, terms, tf.shape(z_global)[0])
        return {name: self._means[name].result() for name in self._means}


@gin.configurable(denylist=['input_channels', 'sync_bn'])
def build_model(*, input_channels, sync_bn, sync_bn_impl=nets.KERAS,
                prediction_head=True):
    """The PAWS model from gin-configured parts (`build_backbone`, the
    heads, `PAWSModel`), its batch norms synchronised alike.

    Args:
        input_channels: image channels (3 RGB, 1 grayscale).
        sync_bn: synchronise batch norm across replicas (global BN).
        sync_bn_impl: with `sync_bn`, every batch norm's implementation:
            'keras' (default) or 'custom', which the CPU configs select
            (`sync_batch_norm.batch_norm`'s `impl`; the same variables and
            values, so checkpoints move between them).
        prediction_head: add the prediction head (the paper's ImageNet
            default; CIFAR-10 runs without).

    Returns:
        An unbuilt `PAWSModel`.

    Raises:
        ValueError: `sync_bn_impl` is not 'keras' or 'custom'.
    """
    norms = dict(sync_bn=sync_bn, sync_bn_impl=checks.one_of(
        'build_model.sync_bn_impl', sync_bn_impl, nets.IMPLEMENTATIONS))
    backbone = backbones.build_backbone(input_channels=input_channels,
                                        **norms)
    projection = heads.ProjectionHead(**norms)
    prediction = (heads.PredictionHead(output_dim=projection.output_dim,
                                       **norms)
                  if prediction_head else None)
    return PAWSModel(backbone, projection, prediction)


def _check_step_input(data):
    """Raises ValueError unless `data` is a pre-training element."""
    if not isinstance(data, dict) or 'support_views' not in data:
        raise ValueError(
            'PAWSModel trains on the elements of make_pretrain_dataset_fn'
            '(...).dataset_fn (dicts of global views, supports and their '
            f'labels), got {type(data).__name__}: fit '
            'pretrain.dataset_fn(), not an evaluation dataset or arrays.')


def _num_local(global_views, local_views):
    """m, the local views per image: a Python int when the batch's shapes
    are static, else an int32 scalar tensor."""
    if local_views is None:
        return 0
    rows, images = local_views.shape[0], global_views.shape[0]
    if rows is not None and images is not None:
        return rows // (images // 2)
    return tf.shape(local_views)[0] // (tf.shape(global_views)[0] // 2)


def _images_per_class(support_one_hot, support_view_index):
    """n, the support images of each class on this replica: the rows of
    view 0 in a column (float32 scalar)."""
    first_view = tf.cast(tf.equal(support_view_index, 0), tf.float32)
    return tf.reduce_max(tf.reduce_sum(
        tf.cast(support_one_hot, tf.float32) * first_view[:, None], axis=0))
