"""PyTorch backend (torchao PT2E). The class is :class:`resnet8ptq.backends.torch.backend.TorchBackend`; this
package imports nothing heavy, so that registering its config schema does not import torch."""
