"""Helpers that several built-in plugins share, public, documented and tested in one place
(``tests/plugins/test_kit.py``): ``attacks`` (foolbox, step size, best candidate), ``detectors`` (pytorch-ood, BPDA,
the classifier head), ``networks`` (the network's input normalisation), ``paired`` (paired comparisons of
detectors), the tables several evaluators read and their products (``robust``: the robust-AUROC table,
``ROBUST_TABLE``; ``ood``: a cell of ``ood.csv`` and the natural sets' groups, ``SET_GROUPS``; ``worstcase``: the
worst case over attacks) and the checkers several verify hooks share (``verify``, ``verify_robust``,
``verify_worstcase``). A plugin imports shared code from here, never a private name of another plugin, and no
evaluator package imports another. The kit registers no plugin.
"""
