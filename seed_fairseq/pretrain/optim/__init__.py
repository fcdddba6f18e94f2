"""The plugin's fairseq optimizers (``seed_fairseq.plugin`` imports every module here; fairseq does not
import a user dir's optimizers itself)."""
