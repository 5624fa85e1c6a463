"""AdamW as PyTorch's, with DINO's cosine weight-decay schedule."""

import gin
import tensorflow as tf
import tf_keras

from paws_tf import checks
from paws_tf import lars
from paws_tf import schedules

# Last name components of the ViT's class token and position embeddings,
# e.g. `vit/tokens/cls_token:0` (timm's `no_weight_decay()`).
TOKEN_NAMES = ('cls_token', 'pos_embed')


def is_excluded_from_decay(variable):
    """Whether `variable` gets no weight decay: it has rank 1 or less (the
    biases, and the LayerNorms' and BatchNorms' gammas and betas), or is
    the class token or position embeddings (`TOKEN_NAMES`, the last
    component of its name).

    DINO's `utils.get_params_groups` leaves out "bias or ndim == 1" (every
    bias has ndim 1); timm's `VisionTransformer.no_weight_decay()` adds
    `cls_token` and `pos_embed`, as the ViT recipe of PAWS asks. This is the
    default exclusion of `AdamW`; compose it in your own to extend it.
    """
    name = variable.name.split('/')[-1].split(':')[0]
    return variable.shape.rank <= 1 or name in TOKEN_NAMES


@tf_keras.saving.register_keras_serializable(package='paws_tf')
@gin.configurable(denylist=['learning_rate'])
class AdamW(lars.DenseOptimizer):
    """Adam with decoupled weight decay, as `torch.optim.AdamW`.

    For a variable `theta` with gradient `g` (already summed over replicas by
    `apply_gradients`), learning rate `lr_t` and weight decay `wd_t` at
    update `t = 1, 2, ...`:

        decayed:  theta <- theta * (1 - lr_t * wd_t)
        excluded: theta unchanged here (no weight decay)
        m <- beta_1 * m + (1 - beta_1) * g
        v <- beta_2 * v + (1 - beta_2) * g^2
        theta <- theta - lr_t / (1 - beta_1^t) * m
                 / (sqrt(v) / sqrt(1 - beta_2^t) + epsilon)

    `epsilon` is added after the bias correction of `v`, as in PyTorch;
    `tf_keras.optimizers.AdamW` adds it before (`sqrt(v) + epsilon`), which
    amounts to PyTorch's with `epsilon * sqrt(1 - beta_2^t)`, and decays
    every variable not excluded by name.

    With `final_weight_decay`, `wd_t` follows DINO's cosine schedule
    (`schedules.cosine_decay`) from `weight_decay` to `final_weight_decay`
    over the learning-rate schedule's run (its `steps_per_epoch` and
    `num_epochs`, which the training code sets): DINO schedules both over
    the same epochs and steps. Both are evaluated at the number of updates
    already applied.

    The weight decay's schedule is `self.weight_decay_schedule`
    (`lars.DenseOptimizer`: the base class's decay is off).

    Args:
        learning_rate: float, or a
            `tf_keras.optimizers.schedules.LearningRateSchedule` called with
            the number of updates already applied; with `final_weight_decay`,
            one with `steps_per_epoch` and `num_epochs` attributes
            (`schedules.WarmupCosineDecay`).
        weight_decay: float >= 0, the weight decay, or its value at the
            first update with `final_weight_decay`.
        final_weight_decay: None (a constant weight decay) or float >= 0,
            the end of the cosine (0.4 in DINO and the ViT recipe, from 0.04).
        beta_1: float in [0, 1), decay of the first moment.
        beta_2: float in [0, 1), decay of the second moment.
        epsilon: float >= 0, added to the bias-corrected sqrt(v).
        exclude_from_weight_decay: None (use `is_excluded_from_decay`), a
            regex string searched in the variable name, or a callable
            `tf.Variable -> bool`. Excluded variables get the Adam step
            only.
        name, **kwargs: as `lars.LARS`'s.

    Raises:
        checks.ConfigError: if a hyperparameter is out of range, or
            `final_weight_decay` comes with a learning rate that does not
            know the run's length.
        TypeError: if `exclude_from_weight_decay` has the wrong type.
    """

    ARGUMENTS = {'weight_decay': 'decoupled_weight_decay',
                 'final_weight_decay': 'final_weight_decay',
                 'beta_1': 'beta_1', 'beta_2': 'beta_2', 'epsilon': 'epsilon',
                 'exclude_from_weight_decay': '_exclude_from_weight_decay_arg'}

    def __init__(self, learning_rate, weight_decay=0.04,
                 final_weight_decay=None, beta_1=0.9, beta_2=0.999,
                 epsilon=1e-8, exclude_from_weight_decay=None, name='AdamW',
                 **kwargs):
        super().__init__(learning_rate, name, **kwargs)
        self.check_arguments(weight_decay=weight_decay,
                             final_weight_decay=final_weight_decay,
                             beta_1=beta_1, beta_2=beta_2, epsilon=epsilon)
        self.decoupled_weight_decay = weight_decay
        self.final_weight_decay = final_weight_decay
        self.beta_1 = beta_1
        self.beta_2 = beta_2
        self.epsilon = epsilon
        self._exclude_from_weight_decay_arg = exclude_from_weight_decay
        self.exclude_from_weight_decay = lars.as_predicate(
            exclude_from_weight_decay, is_excluded_from_decay,
            'exclude_from_weight_decay', takes='tf.Variable')
        self.weight_decay_schedule = lambda step: weight_decay
        if final_weight_decay is not None:
            if not all(hasattr(learning_rate, key) for key in (
                    'steps_per_epoch', 'num_epochs')):
                raise checks.ConfigError(
                    'AdamW.final_weight_decay schedules the weight decay '
                    'over the run, which needs a learning-rate schedule '
                    'with steps_per_epoch and num_epochs '
                    f'(WarmupCosineDecay), got {learning_rate!r}.')
            self.weight_decay_schedule = schedules.cosine_decay(
                learning_rate.steps_per_epoch, learning_rate.num_epochs,
                weight_decay, final_weight_decay)

    @staticmethod
    def check_arguments(*, weight_decay, final_weight_decay, beta_1, beta_2,
                        epsilon, names=None):
        """As `lars.LARS.check_arguments` (default `AdamW.<argument>`)."""
        name = checks.namer(names, 'AdamW.')
        checks.number(name('weight_decay'), weight_decay, low=0.0)
        if final_weight_decay is not None:
            checks.number(name('final_weight_decay'), final_weight_decay,
                          low=0.0)
        checks.number(name('beta_1'), beta_1, low=0.0, high=1.0)
        checks.number(name('beta_2'), beta_2, low=0.0, high=1.0)
        checks.number(name('epsilon'), epsilon, low=0.0)

    def build_slots(self, var_list):
        """Creates the second moments; which variables are decayed."""
        self.velocities = [
            self.add_variable_from_reference(var, 'v') for var in var_list]
        self._decayed = self._no_dependency(  # Aligned with var_list.
            [not self.exclude_from_weight_decay(var) for var in var_list])

    def update(self, gradient, variable, index, lr):
        """One AdamW update of `variable`, its `index` in `var_list`."""
        dtype = variable.dtype
        if self._decayed[index]:
            weight_decay = tf.cast(
                self.weight_decay_schedule(self.iterations), dtype)
            # Only once the gradient exists: a decayed copy computed at the
            # start of the step would be held through the backward pass.
            with tf.control_dependencies([gradient]):
                variable.assign(variable * (1.0 - lr * weight_decay))
        # As torch.optim.AdamW, the constants (1 - beta, the bias
        # corrections) are computed in float64: 1 - beta_2 from a float32
        # beta_2 (as tf.raw_ops.ResourceApplyAdam takes it) is off by
        # 1.3e-5 relative, and so is every step.
        step = tf.cast(self.iterations + 1, tf.float64)
        correction_1 = 1.0 - tf.pow(tf.constant(self.beta_1, tf.float64),
                                    step)
        sqrt_correction_2 = tf.sqrt(1.0 - tf.pow(
            tf.constant(self.beta_2, tf.float64), step))
        m = self.momentums[index]
        v = self.velocities[index]
        m.assign_add((gradient - m) * tf.cast(1.0 - self.beta_1, dtype))
        v.assign_add((tf.square(gradient) - v) * tf.cast(1.0 - self.beta_2,
                                                         dtype))
        denominator = (tf.sqrt(v) / tf.cast(sqrt_correction_2, dtype)
                       + tf.cast(self.epsilon, dtype))
        variable.assign_sub(lr / tf.cast(correction_1, dtype) * m
                            / denominator)

    def applied_weight_decay(self):
        """The weight decay of the latest update, as `update_step` computed
        it (the schedule after the updates before it): a float32 scalar,
        the first update's before any."""
        return tf.cast(self.weight_decay_schedule(
            tf.maximum(self.iterations - 1, 0)), tf.float32)
