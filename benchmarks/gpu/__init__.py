"""Running the checks of a GPU host on an offline, lent GPU machine (stage.sh, run.sh)."""
