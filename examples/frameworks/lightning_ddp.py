"""A Lightning program as Lightning's docs show one (LightningModule, Trainer(strategy="ddp"),
ModelCheckpoint(save_last=True), fit(ckpt_path="last")), on CPU with gloo, plus the one line for
trainctl: `TrainctlCallback()` in the callbacks. Under trainctl it runs as it is: Lightning picks
SLURMEnvironment from srun's variables, one process per task.

    trainctl submit --nodes 2 --spare 1 -- .venv/bin/python examples/frameworks/lightning_ddp.py --nodes 2

`--step-time` stands for a real model's compute (each step sleeps that long), so a CPU demo runs
long enough for the watch to see it; `--width`, the hidden layer's size, sets what each step sends
over the network (4 bytes a parameter: about 2 MiB at 16384). Tests: tests/test_integrations.py, tests/test_frameworks_cluster.py.
"""

import argparse
import time

import lightning as L
import torch
from lightning.pytorch.callbacks import ModelCheckpoint
from torch.utils.data import DataLoader, TensorDataset

from trainctl.integrations.lightning import TrainctlCallback


class Regression(L.LightningModule):
    def __init__(self, step_time: float, width: int = 64):
        super().__init__()
        self.step_time = step_time
        self.layer = torch.nn.Sequential(torch.nn.Linear(32, width), torch.nn.ReLU(), torch.nn.Linear(width, 1))

    def training_step(self, batch, batch_idx):
        x, y = batch
        time.sleep(self.step_time)
        loss = torch.nn.functional.mse_loss(self.layer(x), y)
        self.log("loss", loss)
        return loss

    def on_train_start(self):
        print(f"rank {self.global_rank}: training from step {self.trainer.global_step}", flush=True)

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.01)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--nodes", type=int, default=1)
    parser.add_argument("--steps", type=int, default=100)
    parser.add_argument("--step-time", type=float, default=0.0)
    parser.add_argument("--width", type=int, default=64)
    parser.add_argument("--dir", default="checkpoints")
    args = parser.parse_args()

    data = TensorDataset(torch.randn(4096, 32), torch.randn(4096, 1))
    trainer = L.Trainer(
        accelerator="cpu", devices=1, num_nodes=args.nodes, strategy="ddp", max_steps=args.steps,
        callbacks=[ModelCheckpoint(dirpath=args.dir, save_last=True, every_n_train_steps=20),
                   TrainctlCallback()],
        enable_progress_bar=False, logger=False)
    trainer.fit(Regression(args.step_time, args.width), DataLoader(data, batch_size=32), ckpt_path="last")


if __name__ == "__main__":
    main()
