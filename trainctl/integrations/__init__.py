"""Framework callbacks that report a training program's steps and saves to trainctl's watch, and
save when the watch asks for a checkpoint, through the framework's own save path:

    from trainctl.integrations.lightning import TrainctlCallback        # Lightning
    from trainctl.integrations.transformers import TrainctlCallback     # Hugging Face Trainer

Each module imports its framework only when it is imported itself; nothing here raises into the
training program. Outside a job run by trainctl they do nothing.
"""
