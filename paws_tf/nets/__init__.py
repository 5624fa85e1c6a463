"""Networks: the backbones (ResNet, WideResNet, the demo's small ResNet), the
projection and prediction heads, the CPU-tuned layers the backbones build
when the CPU configs select them (sync_batch_norm, padded_layers, recompute;
onednn guards a CPU kernel) and the loading of pretrained backbone
weights."""
