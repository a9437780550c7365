"""Training over several processes: `torchrun --nproc_per_node N -m model.train ...` starts N
ranks (torch.distributed: gloo on CPU, NCCL on CUDA, one GPU per rank), each of which reads
its own share of every update's batches; DistributedDataParallel sums their gradients, and rank
0 alone writes the tokenizer, checkpoints, metrics, validation and the final model.
Without torchrun (no WORLD_SIZE in the environment, or 1) everything runs in this process."""

from __future__ import annotations

import gc
import os
from dataclasses import dataclass, field
from datetime import timedelta

import torch
import torch.distributed as dist


@dataclass(frozen=True)
class World:
    """This process's place among the training processes."""

    rank: int = 0
    size: int = 1
    # Where the collectives' tensors live.
    device: torch.device = field(default_factory=lambda: torch.device("cpu"))

    @property
    def main(self) -> bool:
        """Whether this process writes (rank 0)."""
        return self.rank == 0

    def sum(self, value: float) -> float:
        """`value` summed over the processes (every process must call it, in the same order)."""
        if self.size == 1:
            return value
        total = torch.tensor([value], dtype=torch.float64, device=self.device)
        dist.all_reduce(total, op=dist.ReduceOp.SUM)
        return float(total.item())

    def barrier(self) -> None:
        """Wait until every process gets here."""
        if self.size > 1:
            dist.barrier()


def join(device: torch.device) -> tuple[World, torch.device]:
    """The world torchrun's environment describes (WORLD_SIZE, RANK, LOCAL_RANK), its process
    group started (gloo on CPU, NCCL on CUDA), and the device this rank trains on (on CUDA the
    GPU of its LOCAL_RANK). Without torchrun: one process on `device`."""
    size = int(os.environ.get("WORLD_SIZE", "1"))
    if size == 1:
        return World(device=device), device
    rank = int(os.environ["RANK"])
    if device.type == "cuda":
        device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0")))
        torch.cuda.set_device(device)
    # The other ranks wait at a collective while rank 0 trains the BPE or validates: an hour,
    # not NCCL's default 10 minutes, before a wait counts as a failure.
    dist.init_process_group(
        backend="nccl" if device.type == "cuda" else "gloo", timeout=timedelta(hours=1)
    )
    return World(rank=rank, size=size, device=device), device


def leave(world: World) -> None:
    """End this process's part in the group (after the last collective; `Trainer.leave` first
    drops what of it the trainer holds), all of them together: the others wait for rank 0's last
    checkpoint and validation, so that no process tears its connections down while another still
    holds them (a rank that left first aborted once in CI, "terminate called without an active
    exception", as rank 0 was still validating). What still holds the group is collected first:
    an object of gloo's freed only at the interpreter's exit stops its threads then, and a thread
    that reaches for the GIL during the exit is ended inside C++ code that may not be, which
    aborts the process the same way (CI again, a rank after its last barrier)."""
    if world.size > 1:
        gc.collect()
        dist.barrier()
        dist.destroy_process_group()
