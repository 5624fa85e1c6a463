"""Evaluation of a pre-trained model: PAWS-NN, fine-tuning, SavedModels."""
