import torch

DEVICES = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])
