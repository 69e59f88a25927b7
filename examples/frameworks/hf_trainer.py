"""A Hugging Face Transformers program as its docs show one (a model from its config, Trainer,
TrainingArguments, `train(resume_from_checkpoint=...)`), on CPU with gloo, plus the one line for
trainctl: `TrainctlCallback()` in the callbacks. Under trainctl it runs as it is: the Trainer reads
torch.distributed's env:// variables (RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR, MASTER_PORT),
which trainctl sets for every rank.

    trainctl submit --nodes 2 -- .venv/bin/python examples/frameworks/hf_trainer.py

The model is a 1-layer GPT-2 built from its config (no download). Tests:
tests/test_integrations.py, tests/test_frameworks_cluster.py.
"""

import argparse
import glob
import os

import torch
from transformers import GPT2Config, GPT2LMHeadModel, Trainer, TrainingArguments

from trainctl.integrations.transformers import TrainctlCallback


class Tokens(torch.utils.data.Dataset):
    def __init__(self, count: int, length: int, vocab: int):
        self.ids = torch.randint(0, vocab, (count, length), generator=torch.Generator().manual_seed(0))

    def __len__(self):
        return len(self.ids)

    def __getitem__(self, index):
        return {"input_ids": self.ids[index], "labels": self.ids[index]}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--dir", default="hf-output")
    args = parser.parse_args()

    config = GPT2Config(vocab_size=256, n_positions=64, n_embd=32, n_layer=1, n_head=2)
    model = GPT2LMHeadModel(config)
    training = TrainingArguments(output_dir=args.dir, max_steps=args.steps, per_device_train_batch_size=8,
                                 save_steps=20, logging_steps=10, use_cpu=True,
                                 report_to=[], dataloader_num_workers=0)
    trainer = Trainer(model=model, args=training, train_dataset=Tokens(1024, 32, config.vocab_size),
                      callbacks=[TrainctlCallback()])
    resume = bool(glob.glob(os.path.join(args.dir, "checkpoint-*")))
    trainer.train(resume_from_checkpoint=resume or None)


if __name__ == "__main__":
    main()
