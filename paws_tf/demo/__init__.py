"""The Fashion-MNIST demo (`make demo`): the supervised-only baseline, the
demo mode and its report. Not part of the library a Keras user imports."""
