"""LARS optimizer with classical (heavy-ball) momentum."""

import re

import gin
import tensorflow as tf
import tf_keras

from paws_tf import checks

# Last name components of tf_keras Dense/Conv biases and Batch/Layer-norm
# scale and offset, e.g. `encoder/conv1/bias:0`, `bn/gamma:0`.
BIAS_AND_NORM_NAMES = ('bias', 'beta', 'gamma')


def is_bias_or_norm(name):
    """Whether variable `name` (e.g. `encoder/conv1/bias:0`) is a bias or a
    normalisation-layer parameter: its last component is one of
    `BIAS_AND_NORM_NAMES`.

    PAWS (arXiv 2104.13963) Sec. 5 excludes "the bias and batch-norm
    parameters from weight decay and LARS adaptation". This is the default
    exclusion predicate of `LARS`; compose it in your own to extend it.
    """
    return name.split('/')[-1].split(':')[0] in BIAS_AND_NORM_NAMES


def _norm(x):
    """Euclidean norm of all of `x` from `L2Loss` (sum of squares / 2), which
    reduces in one pass: `tf.norm` would allocate a variable-sized square."""
    return tf.sqrt(2.0 * tf.nn.l2_loss(x))


def as_predicate(value, default, parameter, takes='str'):
    """An optimizer's exclusion argument `value` as a predicate on what
    `takes` names (`'str'`, a variable name, or `'tf.Variable'`): None is
    `default`, a regex string is searched in the name, a callable is
    itself; `parameter` names the argument in the TypeError."""
    if value is None:
        return default
    if isinstance(value, str):
        pattern = re.compile(value)
        if takes == 'str':
            return lambda name: pattern.search(name) is not None
        return lambda variable: pattern.search(variable.name) is not None
    if callable(value):
        return value
    raise TypeError(f'{parameter} must be None, a regex string or a callable '
                    f'{takes} -> bool, got {value!r}.')


class DenseOptimizer(tf_keras.optimizers.Optimizer):
    """What `LARS` and `adamw.AdamW` share: a learning rate (or schedule)
    and a weight decay of their own (the base class's decoupled decay is
    off: `self.weight_decay` stays None), a momentum `m` per variable,
    updates of the whole variable (a sparse `tf.IndexedSlices` gradient
    becomes dense: LARS's trust ratio needs the whole gradient's norm and
    both decay the whole variable, so a sparse update would not be
    cheaper), and `get_config` from `ARGUMENTS` (constructor
    argument -> attribute; a callable exclusion as is, not
    JSON-serialisable: use None or a regex string for a config written
    out). Subclasses implement `build_slots` and `update`."""

    ARGUMENTS = {}

    def __init__(self, learning_rate, name, **kwargs):
        super().__init__(name=name, weight_decay=None, **kwargs)
        self._learning_rate = self._build_learning_rate(learning_rate)

    def build(self, var_list):
        """Creates the momentums and `build_slots(var_list)` once."""
        super().build(var_list)
        if getattr(self, '_built', False):
            return
        self.momentums = [
            self.add_variable_from_reference(var, 'm') for var in var_list]
        # Exclusions are decided there, on the variables themselves: in
        # update_step, MirroredStrategy passes per-device components named
        # like `dense/bias/replica_1:0`.
        self.build_slots(var_list)
        self._built = True

    def update_step(self, gradient, variable):
        """Updates `variable` (its per-device component under a
        distribution strategy) from `gradient`, a dense tensor or
        `tf.IndexedSlices` already aggregated across replicas."""
        self.update(tf.convert_to_tensor(gradient), variable,
                    self._index_dict[self._var_key(variable)],
                    tf.cast(self.learning_rate, variable.dtype))

    def get_config(self):
        return {**super().get_config(),
                'learning_rate': self._serialize_hyperparameter(
                    self._learning_rate),
                **{key: getattr(self, attribute)
                   for key, attribute in self.ARGUMENTS.items()}}


@tf_keras.saving.register_keras_serializable(package='paws_tf')
@gin.configurable(denylist=['learning_rate'])
class LARS(DenseOptimizer):
    """Layer-wise adaptive rate scaling with classical momentum.

    For a variable `theta` with gradient `g` (already summed over replicas by
    `apply_gradients`) and learning rate `lr_t`:

        adapted:  d = g + weight_decay * theta
                  lambda = trust_coefficient * |theta|
                           / (|g| + weight_decay * |theta| + eps)
                  (unless |theta| > 0 and |g| > 0: d = g, lambda = 1)
        excluded: d = g, lambda = 1 (no weight decay either)
        v <- momentum * v - lr_t * lambda * d
        theta <- theta + v

    The learning rate enters the velocity (PAWS Appendix A, Eq. (mom)), unlike
    `v <- momentum * v + g; theta <- theta - lr_t * v` (Eq. (pytorch-mom):
    PyTorch SGD, TF1 `MomentumOptimizer`), which amounts to a momentum of
    `momentum * lr_t / lr_{t-1}` while the learning rate changes.

    Weight decay is the L2 term inside `d` above, `self.l2_weight_decay`
    (`DenseOptimizer`: the base class's is off).

    Args:
        learning_rate: float, or a
            `tf_keras.optimizers.schedules.LearningRateSchedule` called with
            the number of updates already applied.
        momentum: float in [0, 1), the heavy-ball coefficient beta.
        weight_decay: float >= 0, L2 coefficient for adapted variables.
        trust_coefficient: float > 0, eta of the trust ratio (0.001 in the
            official PAWS code).
        eps: float >= 0, added to the trust-ratio denominator.
        exclude_from_adaptation: None (use `is_bias_or_norm`), a regex string
            searched in the variable name, or a callable `str -> bool` on the
            variable name. Excluded variables get neither adaptation nor weight
            decay.
        name: str, name scope of the optimizer's variables.
        **kwargs: passed to `tf_keras.optimizers.Optimizer` (`clipnorm`,
            `global_clipnorm`, `jit_compile`, ...), except `weight_decay`,
            which is ours.

    Raises:
        checks.ConfigError: if a hyperparameter is out of range.
        TypeError: if `exclude_from_adaptation` has the wrong type.
    """

    ARGUMENTS = {'momentum': 'momentum', 'weight_decay': 'l2_weight_decay',
                 'trust_coefficient': 'trust_coefficient', 'eps': 'eps',
                 'exclude_from_adaptation': '_exclude_from_adaptation_arg'}

    def __init__(self, learning_rate, momentum=0.9, weight_decay=1e-6,
                 trust_coefficient=0.001, eps=1e-8,
                 exclude_from_adaptation=None, name='LARS', **kwargs):
        super().__init__(learning_rate, name, **kwargs)
        self.check_arguments(momentum=momentum, weight_decay=weight_decay,
                             trust_coefficient=trust_coefficient, eps=eps)
        self.momentum = momentum
        self.l2_weight_decay = weight_decay
        self.trust_coefficient = trust_coefficient
        self.eps = eps
        self._exclude_from_adaptation_arg = exclude_from_adaptation
        self.exclude_from_adaptation = as_predicate(
            exclude_from_adaptation, is_bias_or_norm, 'exclude_from_adaptation')

    @staticmethod
    def check_arguments(*, momentum, weight_decay, trust_coefficient, eps,
                        names=None):
        """Raises `checks.ConfigError` naming a hyperparameter out of range
        (`names`: what to call each, default `LARS.<argument>`); run.py
        runs it on the bound values before any data is read."""
        name = checks.namer(names, 'LARS.')
        checks.number(name('momentum'), momentum, low=0.0, high=1.0)
        checks.number(name('weight_decay'), weight_decay, low=0.0)
        checks.number(name('eps'), eps, low=0.0)
        checks.number(name('trust_coefficient'), trust_coefficient,
                      positive=True)

    def build_slots(self, var_list):
        """Creates the trust-ratio variables of the adapted variables."""
        slots = [None if self.exclude_from_adaptation(var.name) else
                 self.add_variable_from_reference(
                     var, 'trust_ratio', initial_value=tf.ones(
                         [], getattr(var, 'true_dtype', var.dtype)))
                 for var in var_list]
        # Aligned with var_list (None = excluded); not tracked twice.
        self._trust_ratio_slots = self._no_dependency(slots)
        self.trust_ratios = [slot for slot in slots if slot is not None]

    def _adaptation(self, gradient, variable):
        """Returns the scalar trust ratio and weight decay of one adapted
        variable."""
        # Local learning rate of You et al. (arXiv 1708.03888), Algorithm 1.
        # When a norm is zero the variable is neither adapted nor decayed
        # (ratio 1, decay 0), as the official code's src/lars.py skips it: a
        # zero-initialised variable would otherwise get ratio 0 and never
        # move, and one without gradient would shrink.
        param_norm = _norm(variable)
        grad_norm = _norm(gradient)
        weight_decay = tf.cast(self.l2_weight_decay, variable.dtype)
        ratio = self.trust_coefficient * param_norm / (
            grad_norm + weight_decay * param_norm + self.eps)
        adapted = (param_norm > 0.0) & (grad_norm > 0.0)
        return (tf.where(adapted, ratio, tf.ones_like(ratio)),
                tf.where(adapted, weight_decay, tf.zeros_like(weight_decay)))

    def update(self, gradient, variable, index, lr):
        """One LARS update of `variable`, its `index` in `var_list`."""
        trust_ratio_slot = self._trust_ratio_slots[index]
        if trust_ratio_slot is None:
            direction = gradient
        else:
            trust_ratio, weight_decay = self._adaptation(gradient, variable)
            trust_ratio_slot.assign(trust_ratio)
            # The decay's coefficient depends on the gradient's norm, so the
            # term is computed once the gradient exists, not at the start of
            # the step and held through the backward pass.
            direction = gradient + weight_decay * variable
            lr = lr * trust_ratio
        # Eq. (mom) of the class docstring, fused: the op updates v and
        # theta in place, where a step of ResNet-50 would otherwise hold
        # several variable-sized temporaries per variable at once.
        tf.raw_ops.ResourceApplyKerasMomentum(
            var=variable.handle, accum=self.momentums[index].handle, lr=lr,
            grad=direction,
            momentum=tf.cast(self.momentum, variable.dtype),
            use_locking=False, use_nesterov=False)

    def trust_ratio_stats(self):
        """A dict of the `mean`, `min` and `max` (float32 scalars) of the
        trust ratios the latest `update_step` wrote, all 1.0 before the
        optimizer is built or when every variable is excluded. In a
        `tf.function`, call it after `apply_gradients`, so that the
        optimizer is built when it is traced."""
        ratios = tf.ones([1])
        if getattr(self, '_built', False) and self.trust_ratios:
            ratios = tf.stack([tf.cast(slot, tf.float32)
                               for slot in self.trust_ratios])  # [adapted]
        return {'mean': tf.reduce_mean(ratios),
                'min': tf.reduce_min(ratios),
                'max': tf.reduce_max(ratios)}
