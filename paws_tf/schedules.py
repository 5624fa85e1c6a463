"""Warm-up + cosine decay: the learning rate's, and AdamW's weight decay's."""

import math

import gin
import tensorflow as tf
import tf_keras

from paws_tf import checks


@tf_keras.saving.register_keras_serializable(package='paws_tf')
@gin.configurable(denylist=['steps_per_epoch', 'num_epochs'])
class WarmupCosineDecay(tf_keras.optimizers.schedules.LearningRateSchedule):
    """Linear warm-up from `start_lr` to `ref_lr`, then cosine decay.

    PAWS (arXiv 2104.13963) Sec. 5 "Implementation Details": "We linearly
    warm-up the learning-rate from 0.3 to 6.4 during the first 10 epochs of
    pre-training, and decay it following a cosine schedule thereafter." As a
    function of the number of optimizer updates already applied (tf_keras
    passes `optimizer.iterations`):

    * `step < warmup_steps`: linear, `start_lr -> ref_lr`;
    * `warmup_steps <= step <= total_steps`: half a cosine, `ref_lr ->
      final_lr`;
    * `step > total_steps`: constant `final_lr`.

    Without warm-up it is DINO's `utils.cosine_scheduler(base_value,
    final_value, epochs, niter_per_ep)` (facebookresearch/dino), whose table
    ends at step `total_steps - 1`: `adamw.AdamW` schedules its weight decay
    with it, as DINO and the ViT recipe of PAWS do.

    A warm-up that fills the run is refused: the learning rate would end at
    `ref_lr`, never decayed. (Rounding to steps can still make
    `warmup_steps == total_steps` on a run of very few steps; then
    `lr(total_steps) = ref_lr`, a step never used for an update.)

    `steps_per_epoch` and `num_epochs` are injected by the training code (gin
    must not bind them); gin binds the learning rates and the warm-up, as
    `warmup_epochs` or as `warmup_fraction` of the run (which follows
    `train.num_epochs`, so that a one-epoch trial needs no other binding).

    Args:
        steps_per_epoch: int > 0, optimizer updates per epoch.
        num_epochs: int > 0, length of training in epochs.
        start_lr: float >= 0, learning rate at step 0.
        ref_lr: float >= 0, peak learning rate, reached at the end of warm-up.
        final_lr: float >= 0, learning rate at and after `total_steps`.
        warmup_epochs: float >= 0, warm-up length in epochs (may be
            fractional); 0 or less than `num_epochs`. None with
            `warmup_fraction`.
        warmup_fraction: float in [0, 1), warm-up length as a share of
            `num_epochs`; None (the default) uses `warmup_epochs`.

    Raises:
        checks.ConfigError: a step count that is not positive, a warm-up that
            is negative, fills the run or is given twice, or a negative
            learning rate.

    Attributes:
        warmup_steps: int, `round(warmup_epochs * steps_per_epoch)`.
        total_steps: int, `num_epochs * steps_per_epoch`.
    """

    def __init__(self, steps_per_epoch, num_epochs, start_lr, ref_lr,
                 final_lr=0.0, warmup_epochs=10, warmup_fraction=None):
        super().__init__()
        checks.integer('steps_per_epoch', steps_per_epoch)
        warmup_epochs = self.check_arguments(
            num_epochs=num_epochs, start_lr=start_lr, ref_lr=ref_lr,
            final_lr=final_lr, warmup_epochs=warmup_epochs,
            warmup_fraction=warmup_fraction)
        self.steps_per_epoch = int(steps_per_epoch)
        self.num_epochs = int(num_epochs)
        self.start_lr = float(start_lr)
        self.ref_lr = float(ref_lr)
        self.final_lr = float(final_lr)
        self.warmup_epochs = warmup_epochs
        self.warmup_steps = round(warmup_epochs * self.steps_per_epoch)
        self.total_steps = self.num_epochs * self.steps_per_epoch

    @staticmethod
    def check_arguments(*, num_epochs, start_lr, ref_lr, final_lr,
                        warmup_epochs, warmup_fraction, names=None):
        """As `lars.LARS.check_arguments` (default names
        `WarmupCosineDecay.<name>`); returns the warm-up in epochs."""
        name = checks.namer(names, 'WarmupCosineDecay.')
        checks.integer(name('num_epochs'), num_epochs)
        for key, value in (('start_lr', start_lr), ('ref_lr', ref_lr),
                           ('final_lr', final_lr)):
            checks.number(name(key), value, low=0)
        warmup, fraction = name('warmup_epochs'), name('warmup_fraction')
        if warmup_fraction is not None:
            if warmup_epochs is not None:
                raise checks.ConfigError(
                    f'{warmup} = {warmup_epochs!r} and {fraction} = '
                    f'{warmup_fraction!r} both set the warm-up: bind '
                    f'{warmup} = None to use the fraction.')
            if checks.number(fraction, warmup_fraction, low=0) >= 1:
                raise checks.ConfigError(
                    f'{fraction} must be a number in [0, 1) (a share of '
                    'the run, which must leave the decay some of it), got '
                    f'{warmup_fraction!r}.')
            return warmup_fraction * num_epochs
        if checks.number(warmup, warmup_epochs, low=0) >= num_epochs:
            # Equal too: the run would end at ref_lr, undecayed (a run
            # shortened to its config's warm-up epochs).
            raise checks.ConfigError(
                f'The warm-up fills the run, so the learning rate never '
                f'decays: {warmup} = {warmup_epochs!r} >= '
                f'{name("num_epochs")} = {num_epochs}. Bind {warmup} = '
                f'{num_epochs / 10:g} (a tenth of the run), or {warmup} = '
                f'None with {fraction} = 0.1 so that it follows the epochs.')
        return warmup_epochs

    def __call__(self, step):
        """Returns the learning rate (float32 scalar) after `step` (a number
        or scalar tensor) updates."""
        step = tf.cast(step, tf.float32)
        warmup_steps = float(self.warmup_steps)
        # max(., 1) only guards the branch of tf.where not selected: the
        # warm-up's with warmup_steps = 0; with warmup_steps = total_steps,
        # the cosine's but at step total_steps (progress 0/1, lr = ref_lr).
        warmup_progress = step / max(warmup_steps, 1.0)
        warmup_lr = self.start_lr + (self.ref_lr - self.start_lr) * (
            warmup_progress)
        decay_progress = (step - warmup_steps) / max(
            self.total_steps - warmup_steps, 1.0)
        cosine_lr = self.final_lr + (self.ref_lr - self.final_lr) * 0.5 * (
            1.0 + tf.cos(math.pi * decay_progress))
        lr = tf.where(step < warmup_steps, warmup_lr, cosine_lr)
        return tf.where(step > float(self.total_steps),
                        tf.constant(self.final_lr, tf.float32), lr)

    def get_config(self):
        """Returns the constructor arguments, for `from_config`."""
        return {key: getattr(self, key) for key in (
            'steps_per_epoch', 'num_epochs', 'start_lr', 'ref_lr',
            'final_lr', 'warmup_epochs')}


def cosine_decay(steps_per_epoch, num_epochs, start, end):
    """`start` cosine-decayed to `end` over the run, without warm-up
    (`WarmupCosineDecay`, DINO's `cosine_scheduler`). Every argument is
    given: none may come from the gin bindings of the learning rate's
    schedule (its final rate, a warm-up fraction)."""
    return WarmupCosineDecay(steps_per_epoch, num_epochs, start, start,
                             final_lr=end, warmup_epochs=0,
                             warmup_fraction=None)
