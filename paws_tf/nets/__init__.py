"""Networks: the backbones, the heads, the CPU-tuned layers the CPU configs
select and the official PyTorch names of their layers."""
