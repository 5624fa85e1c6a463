"""What the parsed gin config binds, read before anything is called."""

import inspect

import gin
from gin import config_parser


def _through_macros(value, name):
    """`(value, name)` of a bound value: a `%NAME` reference (a macro or a
    gin constant) is called for its value and named NAME, the last macro
    the value came through (what a user rebinds)."""
    while (isinstance(value, gin.config.ConfigurableReference)
           and str(value).startswith('%')):
        name = str(value)[1:]
        value = value.scoped_configurable_fn()
    return value, name


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


def is_bound(configurable, parameter):
    """Whether the config binds `parameter` of `configurable` (unscoped)."""
    return parameter in gin.get_bindings(configurable,
                                         resolve_references=False)


def reference(configurable, parameter, scope=None):
    """The gin reference (`@scope/name`, `@name()`) bound to `parameter` of
    `configurable`, or None."""
    value = arguments(configurable, scope)[parameter][0]
    return (value if isinstance(value, gin.config.ConfigurableReference)
            else None)


def target(bound_reference):
    """`(configurable, scope)` that `bound_reference` calls: the object
    `arguments` reads, and the scope it is called in."""
    return (bound_reference.configurable.wrapper,
            '/'.join(bound_reference.scopes) or None)


def configured(configurable, parameter):
    """`(class or function, scope)` that `parameter` of `configurable`
    binds uncalled (`train.optimizer_cls = @LARS`); its default and no
    scope when unbound."""
    bound_reference = reference(configurable, parameter)
    if bound_reference is None:
        return arguments(configurable)[parameter][0], None
    return target(bound_reference)


def check_bound(check, configurable, scope=None, **given):
    """Runs `check`, the argument check of `configurable`, on the values
    the config binds to it in `scope`, each named by the binding or macro
    it came through, before any data is read. An unbound argument takes
    its default; a required one skips the check (gin names it at the
    call).

    Args:
        check: takes keyword arguments named as `configurable`'s and
            `names`, what a message calls each.
        configurable: the class or function gin configures.
        scope: the scope it is called in (`'fine_tune'`), or None.
        **given: `(value, name)` of arguments not bound to `configurable`
            (a schedule's `num_epochs` is `train`'s).
    """
    bound_arguments = arguments(configurable, scope)
    values, names = {}, {}
    for key in inspect.signature(check).parameters.keys() - {'names'}:
        values[key], names[key] = given.get(key) or bound_arguments[key]
        if values[key] is gin.REQUIRED:
            return
    check(names=names, **values)


class _Unevaluated(config_parser.ParserDelegate):
    """Parses a saved config without calling or importing anything: a
    `%MACRO` or a `@reference` is kept as its `Name`."""

    class Name(str):
        """The name of a macro or a configurable reference."""

    def configurable_reference(self, scoped_name, evaluate):
        return self.Name('@' + scoped_name)

    def macro(self, macro_name):
        return self.Name('%' + macro_name)


def saved_arguments(text, configurable):
    """`{parameter: value}` of `configurable` in a saved gin config (the
    text of `gin.config_str()` or `gin.operative_config_str()`, a run's
    config.gin or operative_config.gin): the defaults of its parameters in
    this code, then the values the text binds to them without a scope, a
    `%MACRO` read from the macro's own binding; a parameter bound to a
    configurable reference is left out. Only an operative config gives
    the defaults the run itself used."""
    statements = [statement for statement in config_parser.ConfigParser(
        text, _Unevaluated()) if isinstance(
            statement, config_parser.BindingStatement)
        and not statement.scope]
    macros = {statement.selector: statement.value
              for statement in statements if not statement.arg_name}
    name = gin_name(configurable)
    values = {key: parameter.default for key, parameter in
              inspect.signature(configurable).parameters.items()
              if parameter.default is not parameter.empty}
    for statement in statements:
        if statement.arg_name and name in (
                statement.selector, statement.selector.split('.')[-1]):
            value = statement.value
            while (isinstance(value, _Unevaluated.Name)
                   and value.startswith('%') and value[1:] in macros):
                value = macros[value[1:]]
            if isinstance(value, _Unevaluated.Name):
                values.pop(statement.arg_name, None)
            else:
                values[statement.arg_name] = value
    return values
