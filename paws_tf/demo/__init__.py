"""The Fashion-MNIST demo (`make demo`), which the library never imports."""
