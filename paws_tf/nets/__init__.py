"""Networks: the backbones (ResNet, WideResNet, the demo's small ResNet) and
the projection and prediction heads."""
