"""Networks: the backbones, the heads, the CPU-tuned layers the CPU configs
select and the official PyTorch names of their layers."""

# The implementations of synchronised batch norm: the CPU-tuned layer or
# tf_keras' (the same values and variables).
CUSTOM = 'custom'
KERAS = 'keras'
IMPLEMENTATIONS = (CUSTOM, KERAS)


def check_impl(impl, name='impl'):
    """Raises ValueError naming `name` (the argument or gin binding that
    gave it) unless `impl` is one of `IMPLEMENTATIONS`."""
    if impl not in IMPLEMENTATIONS:
        raise ValueError(f'{name} must be one of {IMPLEMENTATIONS}, got '
                         f'{impl!r}.')
