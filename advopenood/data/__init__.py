"""Datasets: readers for .npz, IDX, OpenOOD image lists, torchvision sets and the demo; OpenOOD v1.5 benchmark layouts."""
