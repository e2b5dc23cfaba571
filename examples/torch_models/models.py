"""The unmodified PyTorch models the graphs of this folder replace a region of under torch.compile
(cudnn_dsl.patterns.install): tests/test_patterns.py, tests/gpu/test_patterns_gpu.py and bench/patterns.py
run them."""

import torch
import torch.nn.functional as F


class ConvBnRelu(torch.nn.Module):
    """nn.Conv2d(bias=False) -> nn.BatchNorm2d -> nn.ReLU, with statistics and an affine of its own (a fresh
    BatchNorm's are the identity): conv_bn_relu.cdg in eval mode, conv_bn_relu_half.cdg after `.half()`."""

    def __init__(self, channels: int = 4, features: int = 8):
        super().__init__()
        self.conv = torch.nn.Conv2d(channels, features, 3, padding=1, bias=False)
        self.bn = torch.nn.BatchNorm2d(features)
        self.relu = torch.nn.ReLU()
        with torch.no_grad():
            self.bn.running_mean.uniform_(-1, 1)
            self.bn.running_var.uniform_(0.5, 2)
            self.bn.weight.uniform_(0.5, 1.5)
            self.bn.bias.uniform_(-0.5, 0.5)

    def forward(self, x):
        return self.relu(self.bn(self.conv(x)))


class Attention(torch.nn.Module):
    """Self-attention with its projections viewed as heads: attention.cdg is its F.scaled_dot_product_attention."""

    def __init__(self, heads: int = 4, dim: int = 64):
        super().__init__()
        self.heads = heads
        self.q, self.k, self.v = (torch.nn.Linear(dim, dim) for _ in range(3))
        self.out = torch.nn.Linear(dim, dim)

    def forward(self, x):
        b, s, d = x.shape
        q, k, v = (p(x).view(b, s, self.heads, d // self.heads).transpose(1, 2) for p in (self.q, self.k, self.v))
        o = F.scaled_dot_product_attention(q, k, v)
        return self.out(o.transpose(1, 2).reshape(b, s, d))
