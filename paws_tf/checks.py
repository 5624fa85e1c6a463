"""Argument checks that name the bad value (gin does not check types), and
the values gin binds, with macros followed."""

import numbers
import os

import gin


class UserError(ValueError):
    """A mistake of the user's, said in words they act on: the program
    prints `message` alone and exits with `EXIT_CODE`."""

    EXIT_CODE = os.EX_USAGE  # run.py's exit code.

    def __init__(self, message):
        super().__init__(message)
        # gin re-raises an error of a configurable as a proxy whose str()
        # appends 'In call to configurable ...' lines; the proxy reads
        # attributes it lacks from the error, so `message` stays the
        # message.
        self.message = message


class ConfigError(UserError):
    """A mistake in the flags or the gin config. Its message names the
    flag or binding and the fix."""

    EXIT_CODE = os.EX_CONFIG  # run.py's exit code.


class DataError(UserError):
    """A mistake in the data: a folder, file or label set that cannot be
    used as it is. Its message names the folder or file (and the binding)
    and the fix."""

    EXIT_CODE = os.EX_DATAERR  # run.py's exit code.


def integer(name, value, minimum=1):
    """Returns `value` as an int, or raises if it is not an integer >=
    `minimum` (`'ten'`, 32.5, True and 0 for a positive size all fail)."""
    if (isinstance(value, bool) or not isinstance(value, numbers.Integral)
            or value < minimum):
        kind = ('a positive integer' if minimum == 1 else
                'a non-negative integer' if minimum == 0 else
                f'an integer >= {minimum}')
        raise ConfigError(f'{name} must be {kind}, got {value!r}.')
    return int(value)


def number(name, value, *, positive=False, low=None, high=None):
    """Returns `value` as a float, or raises if it is not a real number in
    range: > 0 with `positive`, >= `low`, < `high`."""
    bad = (isinstance(value, bool) or not isinstance(value, numbers.Real) or
           (positive and not value > 0) or
           (low is not None and not value >= low) or
           (high is not None and not value < high))
    if bad:
        if positive:
            kind = 'positive'
        else:
            kind = 'a number' + (f' >= {low}' if low is not None else '') + (
                f' and < {high}' if high is not None else '')
        raise ConfigError(f'{name} must be {kind}, got {value!r}.')
    return float(value)


def binding(selector, default=None):
    """A gin parameter's value with macros followed, and what to bind.

    Args:
        selector: `'configurable.parameter'`, optionally scoped.
        default: the value when `selector` is unbound.

    Returns:
        `(value, name)`: `name` is the last macro the value came through
        (what a user rebinds), else `selector`.
    """
    name = selector
    try:
        value = gin.query_parameter(selector)
    except ValueError:
        return default, name
    # `%NAME` is a reference to a macro or a gin constant; calling it gives
    # its value.
    while (isinstance(value, gin.config.ConfigurableReference)
           and str(value).startswith('%')):
        name = str(value)[1:]
        value = value.scoped_configurable_fn()
    return value, name


def bound(selector, default=None):
    """The value gin binds to `selector` with macros resolved, else
    `default`."""
    return binding(selector, default)[0]


def referenced_binding(selector, parameter):
    """`(value, name)` of `parameter` of the configurable that `selector`
    references (`load_data.test = @test/image_folder` and `'root'` give
    the test folder and `'TEST_DIR'`), with `binding`'s `name`; `(None,
    None)` when `selector` binds no reference."""
    reference = bound(selector)
    if not isinstance(reference, gin.config.ConfigurableReference):
        return None, None
    return binding(f'{reference.scoped_selector}.{parameter}')
