"""A small image classifier: two conv blocks, global pooling and an MLP head.

Mirrors the LeNet / VGG-style CNNs of tutorials and KernelBench level 3:
Conv2d -> BatchNorm2d -> ReLU -> MaxPool2d twice, AdaptiveAvgPool2d to 1x1,
flatten, then Linear -> ReLU -> Linear. Convolution, batch norm and pooling
stay in PyTorch by design; only the classifier head is FlyDSL work, so this
model checks that the translator hands back the image part untouched and
reports why.
"""

import torch
import torch.nn as nn

batch_size = 2
in_channels = 3
image_size = 16
num_classes = 10


class Model(nn.Module):
    def __init__(self, in_channels, num_classes, width=16, hidden=64):
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv2d(in_channels, width, kernel_size=3, padding=1),
            nn.BatchNorm2d(width),
            nn.ReLU(inplace=True),
            nn.MaxPool2d(kernel_size=2, stride=2),
            nn.Conv2d(width, 2 * width, kernel_size=3, padding=1),
            nn.BatchNorm2d(2 * width),
            nn.ReLU(inplace=True),
            nn.MaxPool2d(kernel_size=2, stride=2),
        )
        self.avgpool = nn.AdaptiveAvgPool2d((1, 1))
        self.classifier = nn.Sequential(
            nn.Linear(2 * width, hidden),
            nn.ReLU(inplace=True),
            nn.Linear(hidden, num_classes),
        )

    def forward(self, x):
        x = self.features(x)
        x = self.avgpool(x)
        x = torch.flatten(x, 1)
        return self.classifier(x)


def get_inputs():
    return [torch.randn(batch_size, in_channels, image_size, image_size)]


def get_init_inputs():
    return [in_channels, num_classes]
