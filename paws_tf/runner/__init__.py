"""Running an experiment: the data an experiment names, the training loop
with its callbacks and run lock, and the modes run.py dispatches to."""
