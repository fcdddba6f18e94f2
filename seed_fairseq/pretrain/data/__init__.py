"""The datasets of the pre-training pipeline and the batch iterator that counts the units of an update."""
