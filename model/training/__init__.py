"""Training, one concern per module; model/train.py is the command line that wires them.

- recipe.py: the training recipe (TrainConfig) and the model's fields, from a config file, a
  preset, --init-from and the flags, checked before anything is written;
- loop.py: the Trainer: optimizer, learning-rate schedule, loss (with R-Drop), the updates
  (with gradient accumulation), and when to log, save and validate;
- distributed.py: several processes under torchrun (which rank, the sums between them);
- checkpoints.py: the files: atomic writes, the resumable state's tensors, the average of the
  last checkpoints;
- validation.py: validation loss and greedy BLEU during training;
- history.py: metrics.jsonl and training_curve.png.
"""
