"""Classifiers: backbones (CIFAR ResNets, torchvision, timm), the normalising wrapper, training and the demo model."""
