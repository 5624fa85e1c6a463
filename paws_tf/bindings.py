"""What the parsed gin config binds, read before anything is called."""

import inspect

import gin


def _through_macros(value, name):
    """`(value, name)` of a bound value: a `%NAME` reference (a macro or a
    gin constant) is called for its value and named NAME, the last macro
    the value came through (what a user rebinds)."""
    while (isinstance(value, gin.config.ConfigurableReference)
           and str(value).startswith('%')):
        name = str(value)[1:]
        value = value.scoped_configurable_fn()
    return value, name


def binding(selector, default=None):
    """`(value, name)` of the gin parameter `selector`
    (`'scope/configurable.parameter'`), `default` when unbound: `name` is
    the last macro the value came through (what a user rebinds), else
    `selector`."""
    name = selector
    try:
        value = gin.query_parameter(selector)
    except ValueError:
        return default, name
    return _through_macros(value, name)


def gin_name(configurable):
    """The name gin knows `configurable` (a decorated function or class)
    by: what a binding of it starts with."""
    # gin has no public lookup of a configurable's name from the object.
    return gin.config._inverse_lookup(  # pylint: disable=protected-access
        configurable).name


def arguments(configurable, scope=None):
    """`{parameter: (value, name)}` of what gin calls `configurable` (the
    decorated function or class itself, not its name) with in `scope`:
    each parameter's bound value, else its default (None for a parameter
    without one), and what gin binds to its `**kwargs`; `name` is the last
    macro the value came through, else `[scope/]configurable.parameter`.
    A check that reads `arguments(f)['x']` fails loudly (KeyError) once
    `x` is renamed, where a selector string would read nothing."""
    prefix = f'{scope}/' if scope else ''
    with gin.config_scope(scope):
        bound_values = gin.get_bindings(configurable,
                                        resolve_references=False)
    parameters = inspect.signature(configurable).parameters
    values = {key: None if parameter.default is parameter.empty
              else parameter.default for key, parameter in parameters.items()
              if parameter.kind != parameter.VAR_KEYWORD}
    values.update(bound_values)
    return {key: _through_macros(value,
                                 f'{prefix}{gin_name(configurable)}.{key}')
            for key, value in values.items()}


def bound(selector, default=None):
    """The value of `binding(selector, default)`."""
    return binding(selector, default)[0]


def reference(selector):
    """The gin reference bound to `selector` (`@name`, `@name()`), or None."""
    value = bound(selector)
    return (value if isinstance(value, gin.config.ConfigurableReference)
            else None)


def referenced_binding(selector, parameter):
    """`binding` of `parameter` of the configurable that `selector`
    references (`load_data.test = @test/image_folder` and `'root'`), or
    `(None, None)` when `selector` binds no reference."""
    bound_reference = reference(selector)
    if bound_reference is None:
        return None, None
    return binding(f'{bound_reference.scoped_selector}.{parameter}')


def configured(selector, default):
    """`(class or function, selector)` of the configurable that `selector`
    binds uncalled (`train.optimizer_cls = @LARS`), the selector scoped as
    bound; `default` and its name when `selector` is unbound."""
    bound_reference = reference(selector)
    if bound_reference is None:
        return default, default.__name__
    return (bound_reference.configurable.wrapped,
            bound_reference.scoped_selector)


def check_bound(check, configurable, selector, **given):
    """Runs `check`, the argument check of `configurable`, on the values
    the config binds to `selector`, each named by the binding or macro it
    came through, before any data is read. An unbound argument takes its
    default; a required one skips the check (gin names it at the call).

    Args:
        check: takes keyword arguments named as `configurable`'s and
            `names`, what a message calls each.
        configurable: the class or function gin configures.
        selector: its gin selector, scoped as called (`'fine_tune/LARS'`).
        **given: `(value, name)` of arguments not bound under `selector`
            (a schedule's `num_epochs` is `train`'s).
    """
    defaults = inspect.signature(configurable).parameters
    values, names = {}, {}
    for key in inspect.signature(check).parameters:
        if key == 'names':
            continue
        values[key], names[key] = given.get(key) or binding(
            f'{selector}.{key}', defaults[key].default)
        if values[key] is gin.REQUIRED:
            return
    check(names=names, **values)
