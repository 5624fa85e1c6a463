"""Argument checks."""

import numpy as np
import pytest

from paws_tf import checks


@pytest.mark.parametrize('value', [1, 7, np.int64(3)])
def test_integer_accepts(value):
    assert checks.integer('n', value) == int(value)


@pytest.mark.parametrize('value,minimum,kind', [
    ('ten', 1, 'a positive integer'), (32.5, 1, 'a positive integer'),
    (True, 1, 'a positive integer'), (0, 1, 'a positive integer'),
    (-1, 0, 'a non-negative integer'), (1, 2, 'an integer >= 2'),
    (None, 1, 'a positive integer')])
def test_integer_rejects_with_the_value(value, minimum, kind):
    with pytest.raises(ValueError, match=f'n must be {kind}, got'):
        checks.integer('n', value, minimum=minimum)


def test_number():
    assert checks.number('tau', 0.1, positive=True) == 0.1
    assert checks.number('s', 0, low=0.0, high=1.0) == 0.0
    with pytest.raises(ValueError, match="tau must be positive, got -0.1"):
        checks.number('tau', -0.1, positive=True)
    with pytest.raises(ValueError, match=r"s must be a number >= 0.0 and "
                       r"< 1.0, got 1.0"):
        checks.number('s', 1.0, low=0.0, high=1.0)
    with pytest.raises(ValueError, match="x must be a number, got '3'"):
        checks.number('x', '3')
