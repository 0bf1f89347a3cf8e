"""Helpers that several built-in plugins share, public, documented and tested in one place
(``tests/plugins/test_kit.py``): ``attacks`` (foolbox, step size, best candidate), ``detectors`` (pytorch-ood, BPDA,
the classifier head), ``networks`` (the network's input normalisation), ``paired`` (paired comparisons of
detectors). A plugin imports shared code from here, never a
private name of another plugin. The kit registers no plugin.
"""
