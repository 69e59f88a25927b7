"""Per-GPU compute and memory test: each GPU's matmul TFLOPS and device-copy GB/s, judged
against the same model's GPUs in the job (`judge`, pure) after being measured (`measure`)."""
