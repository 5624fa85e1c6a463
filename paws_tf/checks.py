"""The errors of a user's mistakes, and argument checks that name the bad
value (gin does not check types)."""

import numbers
import os


class UserError(ValueError):
    """A mistake of the user's, said in words they act on: the program
    prints `message` alone and exits with `EXIT_CODE`."""

    EXIT_CODE = os.EX_USAGE  # run.py's exit code.

    def __init__(self, message):
        super().__init__(message)
        # gin re-raises an error of a configurable as a proxy whose str()
        # appends 'In call to configurable ...' lines; the proxy reads
        # attributes it lacks from the error, so `message` stays as it is.
        self.message = message


class ConfigError(UserError):
    """A mistake in the flags or the gin config. Its message names the
    flag or binding and the fix."""

    EXIT_CODE = os.EX_CONFIG  # run.py's exit code.


class DataError(UserError):
    """A mistake in the data (a folder, file or label set): its message
    names the folder or file (and the binding) and the fix."""

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
        kind = ('positive' if positive else 'a number' +
                (f' >= {low}' if low is not None else '') +
                (f' and < {high}' if high is not None else ''))
        raise ConfigError(f'{name} must be {kind}, got {value!r}.')
    return float(value)


def one_of(name, value, choices):
    """Returns `value`, or raises naming `name` if it is not in `choices`."""
    if value not in choices:
        raise ConfigError(f'{name} must be one of {choices}, got {value!r}.')
    return value


def per_replica(name, value, num_replicas):
    """Returns `value // num_replicas`, what each replica takes of a global
    count, or raises naming `name` when the replicas do not divide it."""
    if value % num_replicas:
        raise ConfigError(
            f'{name}={value} is not divisible by the {num_replicas} '
            f'replicas: use a multiple of {num_replicas}.')
    return value // num_replicas


def listing(names, limit):
    """The first `limit` of `names` joined for a message, then how many
    more there are."""
    more = len(names) - limit
    return ', '.join(names[:limit]) + (f' and {more} more' if more > 0
                                       else '')


def namer(names, prefix):
    """`name(argument)`: what an argument check's message calls an
    argument: `names[argument]` (run.py gives the binding it read the value
    from, `bindings.check_bound`), else `prefix + argument`."""
    return lambda argument: (names or {}).get(argument, prefix + argument)
