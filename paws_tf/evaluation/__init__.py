"""Evaluation of a pre-trained model: PAWS-NN, the fine-tuning protocols and
the SavedModel exports."""
